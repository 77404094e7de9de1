package scsi

import (
	"bytes"
	"context"
	"encoding/binary"
	"sync"
	"testing"
)

// memPRStore is a PRStore in memory shared by the LUNs of a test (the gateways): a
// compare-and-swap calls the other LUNs' watchers before it returns, as the RBD store's
// notify waits for the other gateways' acknowledgements.
type memPRStore struct {
	mu       sync.Mutex
	data     []byte
	ver      uint64
	watchers []func()
	swaps    int
}

func (s *memPRStore) Load(context.Context) ([]byte, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.data), s.ver, nil
}

func (s *memPRStore) CompareAndSwap(_ context.Context, ver uint64, data []byte) error {
	s.mu.Lock()
	if ver != s.ver {
		s.mu.Unlock()
		return ErrPRStoreConflict
	}
	s.data, s.ver = bytes.Clone(data), s.ver+1
	s.swaps++
	ws := append([]func(){}, s.watchers...)
	s.mu.Unlock()
	for _, w := range ws {
		w()
	}
	return nil
}

func (s *memPRStore) Watch(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watchers = append(s.watchers, f)
}

// twoGateways returns a shared PR store and two LUNs over it, one unit through target ports 1
// and 2 (two gateways).
func twoGateways(t *testing.T) (*memPRStore, *LUN, *LUN) {
	t.Helper()
	store := &memPRStore{}
	a, _ := newTestLUN(t, LUNConfig{Serial: "S1", ALUA: gatewayALUA(1), PRStore: store})
	b, _ := newTestLUN(t, LUNConfig{Serial: "S1", ALUA: gatewayALUA(2), PRStore: store})
	return store, a, b
}

// gatewayALUA: groups 1 (relative port 1) and 2 (relative port 2), both active/optimized; the
// LUN's own port is port {p} with relative port p.
func gatewayALUA(p byte) *ALUAConfig {
	return &ALUAConfig{
		Groups: []PortGroup{{ID: 1, State: ALUAActiveOptimized, RelativePorts: []uint16{1}},
			{ID: 2, State: ALUAActiveOptimized, RelativePorts: []uint16{2}}},
		Ports: []TargetPort{{ID: [16]byte{p}, RelativeID: uint16(p)}},
	}
}

// TestSharedPR: two gateways (two LUNs over one shared PR store, target ports 1 and 2) of one
// unit: REGISTER through one, RESERVE through the other, a WRITE from an unregistered nexus
// through the first gets RESERVATION CONFLICT, READ FULL STATUS through either lists both
// nexuses with their relative target ports; RELEASE frees the unit; registrations racing
// through both gateways all land.
func TestSharedPR(t *testing.T) {
	_, a, b := twoGateways(t)
	i1a := Nexus{InitiatorPortID: [16]byte{0xA1}, TargetPortID: [16]byte{1}}
	i1b := Nexus{InitiatorPortID: [16]byte{0xA1}, TargetPortID: [16]byte{2}}
	i2a := Nexus{InitiatorPortID: [16]byte{0xB2}, TargetPortID: [16]byte{1}}
	for _, x := range []struct {
		l *LUN
		n Nexus
	}{{a, i1a}, {b, i1b}, {a, i2a}} {
		clearUA(t, x.l, x.n)
	}
	runSteps(t, a, []prStep{register(i1a, 0, 0x11)})
	runSteps(t, b, []prStep{register(i1b, 0, 0x11), reserve(i1b, 0x11, prTypeWriteExclusiveRegs, good())})
	// Through gateway A: I2 is not registered; the reservation was made through B.
	if r, _ := do(a, i2a, cdbWrite16(0, 1), make([]byte, 512), 0); r.Status != StatusReservationConflict {
		t.Fatalf("WRITE from an unregistered nexus through the other gateway: %v %v", r.Status, r.Sense)
	}
	if r, _ := do(a, i2a, cdbRW16(OpRead16, 0, 1, false), nil, 512); r.Status != StatusGood {
		t.Fatalf("READ under Write Exclusive - Registrants Only: %v %v", r.Status, r.Sense)
	}
	if r, _ := do(a, i1a, cdbWrite16(0, 1), make([]byte, 512), 0); r.Status != StatusGood {
		t.Fatalf("WRITE from a registrant through A: %v %v", r.Status, r.Sense)
	}
	for name, gw := range map[string]struct {
		l *LUN
		n Nexus
	}{"A": {a, i1a}, "B": {b, i1b}} {
		r, d := do(gw.l, gw.n, cdbPRIn(PRInReadFullStatus, 1024), nil, 1024)
		if r.Status != StatusGood || len(d) != 8+2*48 || binary.BigEndian.Uint32(d[4:]) != 96 {
			t.Fatalf("READ FULL STATUS through %s: %v, % x", name, r.Status, d)
		}
		for k, want := range []struct {
			ini    byte
			rtp    uint16
			holder bool
		}{{0xA1, 1, false}, {0xA1, 2, true}} { // the holder is the nexus that reserved, through B
			e := d[8+48*k:]
			if binary.BigEndian.Uint64(e) != 0x11 || binary.BigEndian.Uint16(e[18:]) != want.rtp || e[32] != want.ini ||
				(e[12]&1 == 1) != want.holder || (want.holder && e[13] != prTypeWriteExclusiveRegs) {
				t.Fatalf("READ FULL STATUS through %s, descriptor %d: % x", name, k, e[:48])
			}
		}
	}
	runSteps(t, b, []prStep{{n: i1b, cdb: cdbPROut(PROutRelease, prTypeWriteExclusiveRegs), out: prParams(0x11, 0), want: good()}})
	if r, _ := do(a, i2a, cdbWrite16(0, 1), make([]byte, 512), 0); r.Status != StatusGood {
		t.Fatalf("WRITE after the release through the other gateway: %v %v", r.Status, r.Sense)
	}
	// Registrations through both gateways at once: none lost.
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, port := a, byte(1)
			if i%2 == 1 {
				l, port = b, 2
			}
			n := Nexus{InitiatorPortID: [16]byte{0xC0, byte(i)}, TargetPortID: [16]byte{port}}
			if err := clearUAErr(l, n); err != nil {
				t.Error(err)
				return
			}
			if r, _ := do(l, n, cdbPROut(PROutRegister, 0), prParams(0, uint64(0x100+i)), 0); r.Status != StatusGood {
				t.Errorf("racing REGISTER %d: %v %v", i, r.Status, r.Sense)
			}
		}()
	}
	wg.Wait()
	r, d := do(b, i1b, cdbPRIn(PRInReadKeys, 4096), nil, 4096)
	if r.Status != StatusGood || binary.BigEndian.Uint32(d[4:]) != 8*(2+16) {
		t.Fatalf("READ KEYS after the race: %v, % x", r.Status, d[:8])
	}
}

func TestPRStateEncoding(t *testing.T) {
	var p prState
	p.gen = 7
	p.regs = []prReg{{nexus: Nexus{InitiatorPortID: [16]byte{1}, TargetPortID: [16]byte{2}}, key: 9, rtp: 2}}
	p.setReservation(&p.regs[0].nexus, prTypeExclusiveAccess)
	p.log = []prUA{{seq: 4, nexus: Nexus{InitiatorPortID: [16]byte{3}, TargetPortID: [16]byte{4}}, code: uaRegistrationsPreem},
		{seq: 5, nexus: Nexus{InitiatorPortID: [16]byte{5}}, code: uaReservationsRel}}
	b := p.encode()
	var q prState
	if err := q.decode(b); err != nil || q.gen != 7 || len(q.regs) != 1 || q.regs[0] != p.regs[0] || !q.resv ||
		q.holder != p.holder || q.typ != prTypeExclusiveAccess || !q.active.Load() ||
		len(q.log) != 2 || q.log[0] != p.log[0] || q.log[1] != p.log[1] {
		t.Fatalf("decode(encode) = %+v %+v, %v", q.regs, q.log, err)
	}
	// Version 1 (no log), as gateways before the log wrote it: read, with an empty log.
	v1 := bytes.Clone(b[:prEncHeader+prEncReg])
	v1[0] = prEncVersion1
	if err := q.decode(v1); err != nil || len(q.regs) != 1 || len(q.log) != 0 || !q.resv {
		t.Fatalf("version 1: %+v %+v, %v", q.regs, q.log, err)
	}
	logAt := prEncHeader + prEncReg + 2 // the first log entry
	for name, bad := range map[string][]byte{
		"short":         b[:10],
		"version":       append([]byte{3}, b[1:]...),
		"count":         append(bytes.Clone(b), 0),
		"type":          func() []byte { c := bytes.Clone(b); c[6] = 9; return c }(),
		"resv flag":     func() []byte { c := bytes.Clone(b); c[5] = 2; return c }(),
		"too many":      func() []byte { c := bytes.Clone(b[:prEncHeader]); binary.BigEndian.PutUint16(c[39:], 5000); return c }(),
		"no log":        b[:prEncHeader+prEncReg],
		"v1 with a log": func() []byte { c := bytes.Clone(b); c[0] = prEncVersion1; return c }(),
		"log count":     func() []byte { c := bytes.Clone(b); binary.BigEndian.PutUint16(c[logAt-2:], 3); return c }(),
		"log code":      func() []byte { c := bytes.Clone(b); binary.BigEndian.PutUint16(c[logAt+40:], 0x2900); return c }(),
		"log order":     func() []byte { c := bytes.Clone(b); binary.BigEndian.PutUint64(c[logAt:], 6); return c }(),
		"log seq 0":     func() []byte { c := bytes.Clone(b); binary.BigEndian.PutUint64(c[logAt:], 0); return c }(),
	} {
		if err := q.decode(bad); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

func FuzzDecodePRState(f *testing.F) {
	var p prState
	p.gen = 3
	p.regs = []prReg{{nexus: Nexus{InitiatorPortID: [16]byte{1}}, key: 5, rtp: 1}}
	p.setReservation(&p.regs[0].nexus, prTypeWriteExclusive)
	f.Add(p.encode())
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0})
	p.log = []prUA{{seq: 1, nexus: p.regs[0].nexus, code: uaReservationsPreemp}}
	f.Add(p.encode())
	v1 := p.encode()[:prEncHeader+prEncReg]
	v1[0] = prEncVersion1
	f.Add(v1)
	f.Fuzz(func(t *testing.T, b []byte) {
		var q prState
		if err := q.decode(b); err != nil {
			return
		}
		enc := q.encode()
		if len(b) > 0 && b[0] == prEncVersion && !bytes.Equal(enc, b) {
			t.Fatalf("decode/encode does not round-trip % x", b)
		}
		// A version 1 state is written back as version 2 with an empty log, and that reads back.
		var r prState
		if err := r.decode(enc); err != nil || !bytes.Equal(r.encode(), enc) {
			t.Fatalf("re-encoded state % x does not round-trip: %v", enc, err)
		}
	})
}

// TestSharedPRUnitAttentions: the unit attentions a PR change owes to nexuses of another
// gateway reach them there: a PREEMPT through gateway 2 removes a registration made through
// gateway 1, whose nexus then gets REGISTRATIONS PREEMPTED on its next command through gateway
// 1; a RELEASE of a registrants-only reservation through gateway 2 gives the registrants of
// gateway 1 RESERVATIONS RELEASED. A gateway that starts later does not replay the log.
func TestSharedPRUnitAttentions(t *testing.T) {
	store, a, b := twoGateways(t)
	i1a := Nexus{InitiatorPortID: [16]byte{0xA1}, TargetPortID: [16]byte{1}}
	i3a := Nexus{InitiatorPortID: [16]byte{0xA3}, TargetPortID: [16]byte{1}}
	i2b := Nexus{InitiatorPortID: [16]byte{0xA2}, TargetPortID: [16]byte{2}}
	clearUA(t, a, i1a)
	clearUA(t, a, i3a)
	clearUA(t, b, i2b)
	tur := func(l *LUN, n Nexus) Result { r, _ := do(l, n, cdbTUR(), nil, 0); return r }
	runSteps(t, a, []prStep{
		{n: i1a, cdb: cdbPROut(PROutRegister, 0), out: prParams(0, 0x11), want: good()},
		{n: i3a, cdb: cdbPROut(PROutRegister, 0), out: prParams(0, 0x33), want: good()},
	})
	runSteps(t, b, []prStep{
		{n: i2b, cdb: cdbPROut(PROutRegister, 0), out: prParams(0, 0x22), want: good()},
		{n: i2b, cdb: cdbPROut(PROutReserve, prTypeWriteExclusiveRegs), out: prParams(0x22, 0), want: good()},
		{n: i2b, cdb: cdbPROut(PROutPreempt, prTypeWriteExclusiveRegs), out: prParams(0x22, 0x11), want: good()},
	})
	wantSense(t, tur(a, i1a), UnitAttention, 0x2A, 0x05) // REGISTRATIONS PREEMPTED
	wantGood(t, tur(a, i1a))
	wantGood(t, tur(a, i3a))
	wantGood(t, tur(b, i2b))
	runSteps(t, b, []prStep{
		{n: i2b, cdb: cdbPROut(PROutRelease, prTypeWriteExclusiveRegs), out: prParams(0x22, 0), want: good()},
	})
	wantSense(t, tur(a, i3a), UnitAttention, 0x2A, 0x04) // RESERVATIONS RELEASED
	wantGood(t, tur(a, i3a))
	wantGood(t, tur(a, i1a)) // no longer registered: nothing owed
	wantGood(t, tur(b, i2b))
	// A third gateway: the log's entries happened before it; its nexuses get the power-on
	// condition and nothing else.
	c, _ := newTestLUN(t, LUNConfig{Serial: "S1", ALUA: gatewayALUA(1), PRStore: store})
	clearUA(t, c, i1a)
	wantGood(t, tur(c, i1a))
	if n := len(store.data); n == 0 {
		t.Fatal("nothing stored")
	}
	var st prState
	if err := st.decode(store.data); err != nil || len(st.log) != 2 || st.log[0].nexus != i1a || st.log[1].nexus != i3a {
		t.Fatalf("stored log %+v, %v", st.log, err)
	}
}

// TestSharedPRPreemptAndAbort: PREEMPT AND ABORT through one gateway aborts the preempted
// nexus's tasks on the other gateway too (the log's abort entry), once, when that gateway next
// reads the shared state (its next command).
func TestSharedPRPreemptAndAbort(t *testing.T) {
	_, a, b := twoGateways(t)
	i1a := Nexus{InitiatorPortID: [16]byte{0xA1}, TargetPortID: [16]byte{1}}
	i2b := Nexus{InitiatorPortID: [16]byte{0xA2}, TargetPortID: [16]byte{2}}
	i3b := Nexus{InitiatorPortID: [16]byte{0xA3}, TargetPortID: [16]byte{2}}
	logA := &abortLog{probe: []Nexus{i1a, i2b, i3b}}
	logB := &abortLog{probe: []Nexus{i1a, i2b, i3b}}
	a.SetTaskAborter(logA, logA.aborter)
	b.SetTaskAborter(logB, logB.aborter)
	clearUA(t, a, i1a)
	clearUA(t, b, i2b)
	clearUA(t, b, i3b)
	runSteps(t, b, []prStep{
		{n: i2b, cdb: cdbPROut(PROutRegister, 0), out: prParams(0, 0x22), want: good()},
		{n: i2b, cdb: cdbPROut(PROutReserve, prTypeWriteExclusive), out: prParams(0x22, 0), want: good()},
	})
	runSteps(t, a, []prStep{
		{n: i1a, cdb: cdbPROut(PROutRegister, 0), out: prParams(0, 0x11), want: good()},
		{n: i1a, cdb: cdbPROut(PROutPreemptAndAbort, prTypeWriteExclusive), out: prParams(0x11, 0x22), want: good()},
	})
	if c := logA.take(); len(c) != 1 || len(c[0]) != 1 || c[0][0] != i2b {
		t.Fatalf("gateway 1's aborter: %v, want one call matching i2b", c)
	}
	if c := logB.take(); len(c) != 0 {
		t.Fatalf("gateway 2 aborted before reading the state: %v", c)
	}
	// The preempted nexus's next command through gateway 2 makes it read the state: the
	// commands it has there are aborted, but not this one, which came after the preemption
	// and reports it.
	cmd := &Command{CDB: cdbTUR(), Nexus: i2b, Sense: make([]byte, MaxSenseLen)}
	wantSense(t, b.Execute(context.Background(), cmd), UnitAttention, 0x2A, 0x05)
	if c := logB.take(); len(c) != 1 || len(c[0]) != 1 || c[0][0] != i2b {
		t.Fatalf("gateway 2's aborter: %v, want one call matching i2b", c)
	}
	logB.mu.Lock()
	if len(logB.excepts) != 1 || logB.excepts[0] != cmd {
		t.Errorf("gateway 2's abort spared %v, want the command that read it", logB.excepts)
	}
	logB.mu.Unlock()
	r, _ := do(b, i3b, cdbTUR(), nil, 0)
	wantGood(t, r)
	r, _ = do(b, i3b, cdbTUR(), nil, 0)
	wantGood(t, r)
	if c := logB.take(); len(c) != 0 {
		t.Fatalf("gateway 2 aborted again: %v", c)
	}
}
