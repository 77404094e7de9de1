package scsi

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
)

type prStep struct {
	n     Nexus
	cdb   []byte
	out   []byte
	in    int
	want  want
	check func(t *testing.T, d []byte)
}

func runSteps(t *testing.T, l *LUN, steps []prStep) {
	t.Helper()
	for i, s := range steps {
		r, d := do(l, s.n, s.cdb, s.out, s.in)
		t.Run(fmt.Sprintf("step%02d", i), func(t *testing.T) {
			s.want.verify(t, r)
			if s.check != nil {
				s.check(t, d)
			}
		})
	}
}

func rc() want { return want{status: StatusReservationConflict} }

func register(n Nexus, old, new uint64) prStep {
	return prStep{n: n, cdb: cdbPROut(PROutRegister, 0), out: prParams(old, new), want: good()}
}

func reserve(n Nexus, key uint64, typ uint8, w want) prStep {
	return prStep{n: n, cdb: cdbPROut(PROutReserve, typ), out: prParams(key, 0), want: w}
}

func readKeys(gen uint32, keys ...uint64) prStep {
	return prStep{n: nexO, cdb: cdbPRIn(PRInReadKeys, 1024), in: 1024, want: good(),
		check: func(t *testing.T, d []byte) {
			w := make([]byte, 8+8*len(keys))
			binary.BigEndian.PutUint32(w, gen)
			binary.BigEndian.PutUint32(w[4:], uint32(8*len(keys)))
			for i, k := range keys {
				binary.BigEndian.PutUint64(w[8+8*i:], k)
			}
			if !bytes.Equal(d, w) {
				t.Fatalf("READ KEYS % x; want % x", d, w)
			}
		}}
}

// readResv checks READ RESERVATION: typ 0 means no reservation.
func readResv(key uint64, typ uint8) prStep {
	return prStep{n: nexO, cdb: cdbPRIn(PRInReadReservation, 1024), in: 1024, want: good(),
		check: func(t *testing.T, d []byte) {
			if typ == 0 {
				if len(d) != 8 || binary.BigEndian.Uint32(d[4:]) != 0 {
					t.Fatalf("reservation present: % x", d)
				}
				return
			}
			if len(d) != 24 || binary.BigEndian.Uint32(d[4:]) != 16 || binary.BigEndian.Uint64(d[8:]) != key || d[21] != typ {
				t.Fatalf("READ RESERVATION % x; want key %#x type %d", d, key, typ)
			}
		}}
}

func access(n Nexus, cdb []byte, w want) prStep {
	var out []byte
	in := 0
	pl := &LUN{blockSize: 512, maxXfer: 256, maxWriteSame: 64, maxCAW: 8, canUnmap: true}
	pl.blocks.Store(testBlocks)
	if i, err := pl.ParseCDB(cdb); err == nil {
		if i.Dir == DirOut {
			out = make([]byte, i.Length)
		} else {
			in = int(i.Length)
		}
	}
	return prStep{n: n, cdb: cdb, out: out, in: in, want: w}
}

func ua(n Nexus, asc, ascq uint8) prStep {
	return prStep{n: n, cdb: cdbTUR(), want: sk(UnitAttention, asc, ascq)}
}

func prLUN(t *testing.T) *LUN {
	l, _ := newTestLUN(t, testConfig())
	clearUA(t, l, nexC)
	clearUA(t, l, nexO)
	return l
}

// nexO observes (READ KEYS, READ RESERVATION) and never registers.
var nexO = Nexus{InitiatorPortID: [16]byte{0x0F}, TargetPortID: [16]byte{0x1}}

var (
	rd    = cdbRead16(0, 1)
	wr    = cdbWrite16(0, 1)
	msens = cdbModeSense6(true, 0, 0x08, 0, 255)
)

func TestPRRegister(t *testing.T) {
	runSteps(t, prLUN(t), []prStep{
		readKeys(0),
		register(nexA, 0, 0x1111),
		readKeys(1, 0x1111),
		{n: nexB, cdb: cdbPROut(PROutRegister, 0), out: prParams(5, 0x2222), want: rc()}, // unregistered, key != 0
		register(nexB, 0, 0x2222),
		{n: nexA, cdb: cdbPROut(PROutRegister, 0), out: prParams(0x9999, 0x3333), want: rc()}, // wrong key
		{n: nexA, cdb: cdbPROut(PROutRegisterAndIgnore, 0), out: prParams(0x9999, 0x3333), want: good()},
		readKeys(3, 0x3333, 0x2222),
		register(nexB, 0x2222, 0), // unregister
		readKeys(4, 0x3333),
		register(nexC, 0, 0), // unregistered, zero key: nothing happens
		readKeys(4, 0x3333),
		{n: nexC, cdb: cdbPROut(PROutRegisterAndIgnore, 0), out: prParams(0, 0x4444), want: good()},
		readKeys(5, 0x3333, 0x4444),
		{n: nexC, cdb: cdbPRIn(PRInReadKeys, 12), in: 1024, want: good(), check: func(t *testing.T, d []byte) {
			if len(d) != 12 || binary.BigEndian.Uint32(d[4:]) != 16 { // truncated, length says all
				t.Fatalf("% x", d)
			}
		}},
	})
}

func TestPRWriteExclusive(t *testing.T) {
	runSteps(t, prLUN(t), []prStep{
		register(nexA, 0, 0xA),
		register(nexB, 0, 0xB),
		reserve(nexA, 0xA, prTypeWriteExclusive, good()),
		readResv(0xA, prTypeWriteExclusive),
		access(nexB, rd, good()),
		access(nexB, wr, rc()),
		access(nexA, wr, good()),
		access(nexC, rd, good()),
		access(nexC, wr, rc()),
		access(nexC, cdbRW6(OpWrite6, 0, 1), rc()),
		access(nexC, cdbCAW(0, 1), rc()),
		access(nexC, cdbWriteSame16(0, 1, false, false), rc()),
		access(nexC, cdbUnmap(24), rc()),
		access(nexC, cdbSync16(0, 0), rc()),
		access(nexC, cdbModeSelect6(0), rc()),
		access(nexC, cdbStartStop(false, false), rc()),
		access(nexC, cdbStartStop(true, false), good()),
		access(nexC, cdbVerify16(0, 1, 0), good()),
		access(nexB, msens, good()),
		access(nexC, msens, good()),
		access(nexC, cdbTUR(), good()),
		access(nexC, cdbInquiry(false, 0, 96), good()),
		access(nexC, cdbReadCap16(32), good()),
		access(nexC, cdbReadCap10(), good()),
		access(nexC, cdbRSOC(false, 0, 0, 0, 64), good()),
		access(nexC, cdbRequestSense(false, 18), good()),
		access(nexC, cdbReportLUNs(0, 64), good()),
		reserve(nexB, 0xB, prTypeWriteExclusive, rc()),
		reserve(nexC, 0, prTypeWriteExclusive, rc()),     // not registered
		reserve(nexA, 0xA, prTypeExclusiveAccess, rc()),  // other type
		reserve(nexA, 0xB, prTypeWriteExclusive, rc()),   // wrong key
		reserve(nexA, 0xA, prTypeWriteExclusive, good()), // same again
		{n: nexB, cdb: cdbPROut(PROutRelease, prTypeWriteExclusive), out: prParams(0xB, 0), want: good()}, // not holder: no-op
		readResv(0xA, prTypeWriteExclusive),
		{n: nexC, cdb: cdbPROut(PROutRelease, prTypeWriteExclusive), out: prParams(0, 0), want: rc()},
		{n: nexA, cdb: cdbPROut(PROutRelease, prTypeExclusiveAccess), out: prParams(0xA, 0),
			want: sk(IllegalRequest, 0x26, 0x04)},
		{n: nexA, cdb: cdbPROut(PROutRelease, prTypeWriteExclusive), out: prParams(0xA, 0), want: good()},
		readResv(0, 0),
		access(nexB, wr, good()),
		access(nexC, wr, good()),
		{n: nexA, cdb: cdbPROut(PROutRelease, prTypeWriteExclusive), out: prParams(0xA, 0), want: good()}, // nothing held
	})
}

func TestPRExclusiveAccess(t *testing.T) {
	runSteps(t, prLUN(t), []prStep{
		register(nexA, 0, 0xA),
		register(nexB, 0, 0xB),
		reserve(nexA, 0xA, prTypeExclusiveAccess, good()),
		access(nexA, rd, good()),
		access(nexB, rd, rc()),
		access(nexC, rd, rc()),
		access(nexC, cdbVerify16(0, 1, 0), rc()),
		access(nexB, wr, rc()),
		access(nexB, msens, good()), // registered
		access(nexC, msens, rc()),
		access(nexC, cdbRSOC(false, 0, 0, 0, 64), rc()),
		access(nexC, cdbTUR(), good()),
		access(nexC, cdbInquiry(true, 0x83, 255), good()),
		access(nexC, cdbPRIn(PRInReadKeys, 64), good()),
		access(nexB, cdbStartStop(true, false), good()),
		access(nexB, cdbStartStop(false, false), rc()),
	})
}

func TestPRRegistrantsOnly(t *testing.T) {
	l := prLUN(t)
	runSteps(t, l, []prStep{
		register(nexA, 0, 0xA),
		register(nexB, 0, 0xB),
		reserve(nexA, 0xA, prTypeWriteExclusiveRegs, good()),
		access(nexB, wr, good()),
		access(nexC, wr, rc()),
		access(nexC, rd, good()),
		reserve(nexB, 0xB, prTypeWriteExclusiveRegs, rc()), // holder is A alone
		register(nexA, 0xA, 0),                             // the holder unregisters: released
		readResv(0, 0),
		ua(nexB, 0x2A, 0x04), // RESERVATIONS RELEASED to the other registrants
		access(nexC, wr, good()),
		register(nexC, 0, 0xC),
		reserve(nexC, 0xC, prTypeExclusiveAccessRegs, good()),
		access(nexB, rd, good()),
		access(nexA, rd, rc()),
		{n: nexC, cdb: cdbPROut(PROutRelease, prTypeExclusiveAccessRegs), out: prParams(0xC, 0), want: good()},
		ua(nexB, 0x2A, 0x04),
		access(nexA, rd, good()),
	})
}

func TestPRAllRegistrants(t *testing.T) {
	runSteps(t, prLUN(t), []prStep{
		register(nexA, 0, 0xA),
		register(nexB, 0, 0xB),
		reserve(nexA, 0xA, prTypeExclusiveAccessAll, good()),
		readResv(0, prTypeExclusiveAccessAll), // key 0 for all-registrants
		access(nexB, wr, good()),
		access(nexC, rd, rc()),
		reserve(nexB, 0xB, prTypeExclusiveAccessAll, good()), // B holds it too
		reserve(nexB, 0xB, prTypeWriteExclusiveAll, rc()),
		register(nexA, 0xA, 0), // A leaves; B still holds it
		readResv(0, prTypeExclusiveAccessAll),
		access(nexC, rd, rc()),
		access(nexA, rd, rc()),
		register(nexB, 0xB, 0), // the last registrant leaves: gone
		readResv(0, 0),
		access(nexC, rd, good()),
		register(nexA, 0, 0xA),
		register(nexB, 0, 0xB),
		reserve(nexA, 0xA, prTypeWriteExclusiveAll, good()),
		access(nexC, rd, good()),
		access(nexC, wr, rc()),
		{n: nexB, cdb: cdbPROut(PROutRelease, prTypeWriteExclusiveAll), out: prParams(0xB, 0), want: good()},
		readResv(0, 0),
		ua(nexA, 0x2A, 0x04),
	})
}

func TestPRClear(t *testing.T) {
	runSteps(t, prLUN(t), []prStep{
		register(nexA, 0, 0xA),
		register(nexB, 0, 0xB),
		reserve(nexA, 0xA, prTypeWriteExclusive, good()),
		{n: nexC, cdb: cdbPROut(PROutClear, 0), out: prParams(0, 0), want: rc()},
		{n: nexB, cdb: cdbPROut(PROutClear, 0), out: prParams(0xA, 0), want: rc()}, // wrong key
		{n: nexB, cdb: cdbPROut(PROutClear, 0), out: prParams(0xB, 0), want: good()},
		readKeys(3),
		readResv(0, 0),
		ua(nexA, 0x2A, 0x03),
		access(nexA, cdbTUR(), good()),
		access(nexB, cdbTUR(), good()), // the issuer gets no unit attention
		access(nexC, wr, good()),
	})
}

func TestPRPreempt(t *testing.T) {
	t.Run("holder", func(t *testing.T) {
		runSteps(t, prLUN(t), []prStep{
			register(nexA, 0, 0xA),
			register(nexB, 0, 0xB),
			reserve(nexA, 0xA, prTypeWriteExclusive, good()),
			{n: nexB, cdb: cdbPROut(PROutPreempt, prTypeExclusiveAccess), out: prParams(0xB, 0xA), want: good()},
			readKeys(3, 0xB),
			readResv(0xB, prTypeExclusiveAccess),
			ua(nexA, 0x2A, 0x05),
			access(nexA, rd, rc()),
			access(nexB, wr, good()),
		})
	})
	t.Run("no reservation", func(t *testing.T) {
		runSteps(t, prLUN(t), []prStep{
			register(nexA, 0, 0xA),
			register(nexB, 0, 0xB),
			{n: nexA, cdb: cdbPROut(PROutPreempt, prTypeWriteExclusive), out: prParams(0xA, 0x77), want: rc()},
			{n: nexA, cdb: cdbPROut(PROutPreempt, prTypeWriteExclusive), out: prParams(0xA, 0), want: badParam(8, 7)},
			{n: nexA, cdb: cdbPROut(PROutPreemptAndAbort, prTypeWriteExclusive), out: prParams(0xA, 0xB), want: good()},
			readKeys(3, 0xA),
			readResv(0, 0),
			ua(nexB, 0x2A, 0x05),
			{n: nexB, cdb: cdbPROut(PROutPreempt, prTypeWriteExclusive), out: prParams(0xB, 0xA), want: rc()},
		})
	})
	t.Run("non-holder key", func(t *testing.T) {
		runSteps(t, prLUN(t), []prStep{
			register(nexA, 0, 0xA),
			register(nexB, 0, 0xB),
			register(nexC, 0, 0xC),
			reserve(nexA, 0xA, prTypeWriteExclusive, good()),
			{n: nexB, cdb: cdbPROut(PROutPreempt, prTypeExclusiveAccess), out: prParams(0xB, 0xC), want: good()},
			readKeys(4, 0xA, 0xB),
			readResv(0xA, prTypeWriteExclusive),
			{n: nexB, cdb: cdbPROut(PROutPreempt, prTypeExclusiveAccess), out: prParams(0xB, 0xC), want: rc()},
			{n: nexB, cdb: cdbPROut(PROutPreempt, prTypeExclusiveAccess), out: prParams(0xB, 0), want: badParam(8, 7)},
		})
	})
	t.Run("own reservation, new type", func(t *testing.T) {
		runSteps(t, prLUN(t), []prStep{
			register(nexA, 0, 0xA),
			register(nexB, 0, 0xB),
			reserve(nexA, 0xA, prTypeWriteExclusive, good()),
			{n: nexA, cdb: cdbPROut(PROutPreempt, prTypeExclusiveAccess), out: prParams(0xA, 0xA), want: good()},
			readKeys(3, 0xA, 0xB),
			readResv(0xA, prTypeExclusiveAccess),
			ua(nexB, 0x2A, 0x04),
		})
	})
	t.Run("all registrants", func(t *testing.T) {
		runSteps(t, prLUN(t), []prStep{
			register(nexA, 0, 0xA),
			register(nexB, 0, 0xB),
			register(nexC, 0, 0xC),
			reserve(nexA, 0xA, prTypeWriteExclusiveAll, good()),
			{n: nexB, cdb: cdbPROut(PROutPreempt, prTypeWriteExclusive), out: prParams(0xB, 0xC), want: good()},
			readKeys(4, 0xA, 0xB),
			readResv(0, prTypeWriteExclusiveAll),
			{n: nexB, cdb: cdbPROut(PROutPreempt, prTypeWriteExclusive), out: prParams(0xB, 0x99), want: rc()},
			{n: nexB, cdb: cdbPROut(PROutPreempt, prTypeWriteExclusive), out: prParams(0xB, 0), want: good()},
			readKeys(5, 0xB),
			readResv(0xB, prTypeWriteExclusive),
			ua(nexA, 0x2A, 0x05),
		})
	})
}

func TestPRErrors(t *testing.T) {
	p := prParams(0, 0xA)
	withFlag := func(f byte) []byte { q := prParams(0, 0xA); q[20] = f; return q }
	runSteps(t, prLUN(t), []prStep{
		{n: nexA, cdb: func() []byte { c := cdbPROut(PROutRegister, 0); c[8] = 23; return c }(), out: p,
			want: sk(IllegalRequest, 0x1A, 0)},
		{n: nexA, cdb: func() []byte { c := cdbPROut(PROutRegister, 0); c[8] = 28; return c }(), out: append(p, 0, 0, 0, 0),
			want: sk(IllegalRequest, 0x1A, 0)},
		{n: nexA, cdb: cdbPROut(PROutRegister, 0), out: p[:20], want: sk(IllegalRequest, 0x1A, 0)},
		{n: nexA, cdb: cdbPROut(PROutRegister, 0), out: withFlag(0x01), want: badParam(20, 0)},
		{n: nexA, cdb: cdbPROut(PROutRegister, 0), out: withFlag(0x04), want: badParam(20, 2)},
		{n: nexA, cdb: cdbPROut(PROutRegister, 0), out: withFlag(0x08), want: badParam(20, 3)},
		{n: nexA, cdb: cdbPROut(PROutRegisterAndMove, 0), out: p, want: badCDB(1, 4)},
		{n: nexA, cdb: cdbPROut(0x1F, 0), out: p, want: badCDB(1, 4)},
		{n: nexA, cdb: cdbPROut(PROutReserve, 0x11), out: p, want: badCDB(2, 7)},
		{n: nexA, cdb: cdbPROut(PROutReserve, 0x02), out: p, want: badCDB(2, 3)},
		{n: nexA, cdb: cdbPROut(PROutPreempt, 0x00), out: p, want: badCDB(2, 3)},
		{n: nexA, cdb: cdbPRIn(4, 64), want: badCDB(1, 4)},
		reserve(nexA, 0, prTypeWriteExclusive, rc()),
		{n: nexA, cdb: cdbPRIn(PRInReportCapabilites, 64), in: 64, want: good(), check: func(t *testing.T, d []byte) {
			if !bytes.Equal(d, []byte{0, 8, 0, 0x80, 0xEA, 0x01, 0, 0}) {
				t.Fatalf("% x", d)
			}
		}},
	})
}

func TestPRReadFullStatus(t *testing.T) {
	runSteps(t, prLUN(t), []prStep{
		register(nexA, 0, 0xA),
		register(nexB, 0, 0xB),
		reserve(nexB, 0xB, prTypeExclusiveAccess, good()),
		{n: nexC, cdb: cdbPRIn(PRInReadFullStatus, 1024), in: 1024, want: good(), check: func(t *testing.T, d []byte) {
			if len(d) != 8+2*48 || binary.BigEndian.Uint32(d) != 2 || binary.BigEndian.Uint32(d[4:]) != 96 {
				t.Fatalf("header % x", d[:8])
			}
			a, b := d[8:56], d[56:104]
			if binary.BigEndian.Uint64(a) != 0xA || a[12] != 0 || binary.BigEndian.Uint32(a[20:]) != 24 ||
				a[24] != 0x04 || !bytes.Equal(a[32:48], nexA.InitiatorPortID[:]) {
				t.Fatalf("A % x", a)
			}
			if binary.BigEndian.Uint64(b) != 0xB || b[12] != 1 || b[13] != prTypeExclusiveAccess ||
				!bytes.Equal(b[32:48], nexB.InitiatorPortID[:]) {
				t.Fatalf("B % x", b)
			}
		}},
	})
}

// TestPRSurvivesReset: a LUN reset leaves registrations and the reservation alone.
func TestPRSurvivesReset(t *testing.T) {
	l := prLUN(t)
	runSteps(t, l, []prStep{register(nexA, 0, 0xA), reserve(nexA, 0xA, prTypeExclusiveAccess, good())})
	l.Reset()
	clearUA(t, l, nexA)
	clearUA(t, l, nexC)
	clearUA(t, l, nexO)
	runSteps(t, l, []prStep{readResv(0xA, prTypeExclusiveAccess), access(nexC, rd, rc())})
}

// abortLog records what a LUN's task aborter was asked to abort.
type abortLog struct {
	mu      sync.Mutex
	calls   [][]Nexus // per call, which of the probed nexuses matched
	excepts []*Command
	probe   []Nexus
}

func (a *abortLog) aborter(match func(*Nexus) bool, except *Command) {
	a.mu.Lock()
	a.excepts = append(a.excepts, except)
	a.mu.Unlock()
	var hit []Nexus
	for i := range a.probe {
		if match(&a.probe[i]) {
			hit = append(hit, a.probe[i])
		}
	}
	a.mu.Lock()
	a.calls = append(a.calls, hit)
	a.mu.Unlock()
}

func (a *abortLog) take() [][]Nexus {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.calls
	a.calls = nil
	return c
}

// TestPRPreemptAndAbort: PREEMPT AND ABORT has the transport abort every task of the
// preempted nexuses (SPC-4 5.9.11.5), and only theirs; PREEMPT aborts nothing; an aborter
// removed is not called.
func TestPRPreemptAndAbort(t *testing.T) {
	l := prLUN(t)
	log := &abortLog{probe: []Nexus{nexA, nexB, nexC}}
	l.SetTaskAborter(log, log.aborter)
	runSteps(t, l, []prStep{
		register(nexA, 0, 0xA),
		register(nexB, 0, 0xB),
		register(nexC, 0, 0xC),
		reserve(nexB, 0xB, prTypeWriteExclusive, good()),
		{n: nexA, cdb: cdbPROut(PROutPreempt, prTypeWriteExclusive), out: prParams(0xA, 0xC), want: good()},
	})
	if c := log.take(); len(c) != 0 {
		t.Fatalf("PREEMPT aborted tasks: %v", c)
	}
	runSteps(t, l, []prStep{
		{n: nexA, cdb: cdbPROut(PROutPreemptAndAbort, prTypeExclusiveAccess), out: prParams(0xA, 0xB), want: good()},
		readResv(0xA, prTypeExclusiveAccess),
		ua(nexB, 0x2A, 0x05),
	})
	if c := log.take(); len(c) != 1 || len(c[0]) != 1 || c[0][0] != nexB {
		t.Fatalf("PREEMPT AND ABORT of B's key: aborter calls %v, want one matching B only", c)
	}
	l.SetTaskAborter(log, nil)
	runSteps(t, l, []prStep{
		register(nexB, 0, 0xB),
		{n: nexA, cdb: cdbPROut(PROutPreemptAndAbort, prTypeExclusiveAccess), out: prParams(0xA, 0xB), want: good()},
	})
	if c := log.take(); len(c) != 0 {
		t.Fatalf("a removed aborter was called: %v", c)
	}
}
