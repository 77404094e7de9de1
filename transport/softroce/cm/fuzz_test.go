package cm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/fuzzbound"
	"github.com/srpd/srpd/transport"
)

func seedCorpus(f *testing.F) {
	for _, p := range []string{pcapLogin, pcapReject} {
		for _, c := range loadMADs(f, p) {
			f.Add(c.mad)
		}
	}
	f.Add([]byte{})
	f.Add(make([]byte, 255))
	f.Add(make([]byte, 300))
}

// fieldsRoundTrip encodes m's fields into out (a MAD of the same kind) and reports whether
// out reads back the same fields.
func fieldsRoundTrip[F comparable, V ~[]byte](m, out []byte, fields func(V) F, encode func(V, *F)) bool {
	f := fields(V(m))
	encode(V(out), &f)
	return fields(V(out)) == f
}

// FuzzParse: the codecs never panic, and decode → encode → decode is stable.
func FuzzParse(f *testing.F) {
	seedCorpus(f)
	fuzzbound.Fuzz(f, func(t *testing.T, b []byte) {
		m, err := Check(b)
		for _, p := range []func([]byte) error{
			func(b []byte) error { _, err := ParseREQ(b); return err },
			func(b []byte) error { _, err := ParseREP(b); return err },
			func(b []byte) error { _, err := ParseRTU(b); return err },
			func(b []byte) error { _, err := ParseREJ(b); return err },
			func(b []byte) error { _, err := ParseMRA(b); return err },
			func(b []byte) error { _, err := ParseDREQ(b); return err },
			func(b []byte) error { _, err := ParseDREP(b); return err },
			func(b []byte) error { _, err := ParseLAP(b); return err },
			func(b []byte) error { _, err := ParseAPR(b); return err },
			func(b []byte) error { _, err := ParseSIDRREQ(b); return err },
			func(b []byte) error { _, err := ParseSIDRREP(b); return err },
		} {
			if e := p(b); e != nil && err == nil && e != ErrWrongAttribute {
				t.Errorf("typed parse %v but Check ok", e)
				return
			}
		}
		if len(b) >= CMAHeaderLen {
			if h, err := ParseCMAHeader(b); err == nil {
				_, _, _ = h.SrcAddr(), h.DstAddr(), h.SrcPort()
			}
		}
		_, _, _ = ParseServiceID(binary.BigEndian.Uint64(append(bytes.Clone(b), make([]byte, 8)...)))
		// Steer: only a MAD that Check accepts; a REQ by its local QPN.
		if key, byQPN, ok := Steer(b); ok && err != nil {
			t.Errorf("Steer ok on a MAD Check refuses (%v)", err)
			return
		} else if ok && byQPN != (m.AttributeID() == AttrREQ) || ok && byQPN && key != REQ(m).LocalQPN() {
			t.Errorf("Steer %#x byQPN %v for %s", key, byQPN, AttrName(m.AttributeID()))
			return
		}
		if err != nil {
			return
		}
		out := make([]byte, MADLen)
		copy(out, m[:HeaderLen])
		// Each message's fields encode back to the same fields; RTU and DREP, which have no
		// reserved bits, to the same bytes.
		var ok bool
		switch m.AttributeID() {
		case AttrREQ:
			ok = fieldsRoundTrip(m, out, REQ.Fields, REQ.Encode)
			_ = REQ(m).PrimaryPath().LocalAddr()
			_ = REQ(m).HasAlternatePath()
		case AttrREP:
			ok = fieldsRoundTrip(m, out, REP.Fields, REP.Encode)
		case AttrREJ:
			ok = fieldsRoundTrip(m, out, REJ.Fields, REJ.Encode)
			_ = REJ(m).ARI()
		case AttrMRA:
			ok = fieldsRoundTrip(m, out, MRA.Fields, MRA.Encode)
		case AttrDREQ:
			ok = fieldsRoundTrip(m, out, DREQ.Fields, DREQ.Encode)
		case AttrRTU:
			fieldsRoundTrip(m, out, RTU.Fields, RTU.Encode)
			ok = bytes.Equal(out, m)
		case AttrDREP:
			fieldsRoundTrip(m, out, DREP.Fields, DREP.Encode)
			ok = bytes.Equal(out, m)
		default:
			ok = true
		}
		if !ok {
			t.Errorf("attribute %#x: round trip", m.AttributeID())
			return
		}
	})
}

// fuzzWorld is a Manager with a listener, one established connection (made through a peer
// Manager) and a record of its events, for feeding arbitrary MAD/API sequences.
type fuzzWorld struct {
	t        *testing.T
	m        *Manager
	out      Outputs
	now      time.Duration
	ids      []uint32 // comm IDs worth aiming at (ours and the peer's)
	qpns     []uint32
	events   []Event
	released map[ConnID]bool
	est      ConnID // the established connection
	peerID   uint32 // its peer's comm ID
}

func (w *fuzzWorld) collect() {
	for _, e := range w.out.Events {
		w.events = append(w.events, Event{Kind: e.Kind, Conn: e.Conn, Reason: e.Reason})
		if e.Kind == EventRequest {
			w.ids = append(w.ids, uint32(e.Conn))
			if ci, ok := w.m.Conn(e.Conn); ok {
				w.ids = append(w.ids, ci.RemoteCommID)
			}
		}
	}
	for i := range w.out.MADs {
		if _, err := Check(w.out.MADs[i].MAD[:]); err != nil {
			w.t.Errorf("produced an invalid MAD: %v", err)
			return
		}
	}
	w.out.Reset()
	w.checkNoStuck()
}

// checkNoStuck: every connection that is not established has a timer (so it is released
// eventually without outside help), and the heap is consistent.
func (w *fuzzWorld) checkNoStuck() {
	for id, c := range w.m.conns {
		if c.id != id || c.state == StateIdle {
			w.t.Errorf("conn table corrupt: %#x %v", id, c.state)
			return
		}
		if c.state != StateEstablished && c.heapIdx < 0 {
			w.t.Errorf("conn %#x in %v without a timer", id, c.state)
			return
		}
		if c.heapIdx >= 0 && w.m.timers.items[c.heapIdx] != c {
			w.t.Error("timer heap index corrupt")
			return
		}
	}
	for i, c := range w.m.timers.items {
		if c.heapIdx != i || w.m.conns[c.id] != c {
			w.t.Error("timer heap holds a released connection")
			return
		}
		if i > 0 && w.m.timers.less(i, (i-1)/2) {
			w.t.Error("heap order")
			return
		}
	}
}

var (
	fzLocal  = netip.MustParseAddr("10.0.0.1")
	fzRemote = netip.MustParseAddr("10.0.0.2")
)

// newFuzzWorld builds the world or fails t (for tests on the test goroutine).
func newFuzzWorld(t *testing.T) *fuzzWorld {
	t.Helper()
	w, err := buildFuzzWorld(t)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// buildFuzzWorld builds the world; it reports errors instead of failing t, so that it can run
// under fuzzbound.Run.
func buildFuzzWorld(t *testing.T) (*fuzzWorld, error) {
	mk := func(guid uint64, seed uint64) (*Manager, error) {
		return NewManager(Config{GUID: guid, Rand: rand.NewPCG(seed, seed)})
	}
	m, err := mk(0x1111, 1)
	if err != nil {
		return nil, err
	}
	w := &fuzzWorld{t: t, m: m, released: map[ConnID]bool{}}
	if err := w.m.Listen(netip.Addr{}, 5555); err != nil {
		return nil, err
	}
	// Establish one connection from a peer, by hand.
	peer, err := mk(0x2222, 2)
	if err != nil {
		return nil, err
	}
	var po Outputs
	pid, err := peer.Dial(0, &DialParams{LocalAddr: fzRemote, RemoteAddr: fzLocal, DstPort: 5555, QPN: 0x77}, &po)
	if err != nil {
		return nil, err
	}
	if err := w.m.HandleMAD(0, fzRemote, fzLocal, po.MADs[0].MAD[:], &w.out); err != nil {
		return nil, err
	}
	id := w.out.Events[0].Conn
	if w.collect(); t.Failed() {
		return nil, errors.New("fixture produced bad state")
	}
	if err := w.m.Accept(0, id, &AcceptParams{QPN: 0x88}, &w.out); err != nil {
		return nil, err
	}
	rep := w.out.MADs[0].MAD
	if w.collect(); t.Failed() {
		return nil, errors.New("fixture produced bad state")
	}
	po.Reset()
	if err := peer.HandleMAD(0, fzLocal, fzRemote, rep[:], &po); err != nil {
		return nil, err
	}
	if err := w.m.HandleMAD(0, fzRemote, fzLocal, po.MADs[0].MAD[:], &w.out); err != nil {
		return nil, err
	}
	if w.collect(); t.Failed() {
		return nil, errors.New("fixture produced bad state")
	}
	w.ids = append(w.ids, uint32(pid))
	w.est, w.peerID = id, uint32(pid)
	w.qpns = []uint32{0x77, 0x88}
	return w, nil
}

// FuzzManager feeds a Manager arbitrary sequences of MADs (valid headers, fields from the
// fuzzer, comm IDs and QPNs often aimed at live connections), API calls and time steps.
// Properties: no panic; only valid MADs produced; no connection without a way out (non-
// established connections always have a timer); at most one ESTABLISHED and DISCONNECTED per
// connection life and nothing after its final event; after destroying everything and letting
// the timers run out, nothing is left.
func FuzzManager(f *testing.F) {
	f.Add([]byte{0, 0, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Add([]byte{5, 1, 0, 5, 2, 6, 0, 7, 3, 2, 1, 0, 0, 0, 0, 9, 9, 9})
	f.Add(bytes.Repeat([]byte{0x15, 0x01, 0x00, 0x02}, 20))
	for _, c := range loadMADs(f, pcapLogin) {
		f.Add(append([]byte{0}, c.mad[24:80]...))
	}
	fuzzbound.Fuzz(f, fuzzManagerBody)
}

// fuzzManagerBody runs one input under fuzzbound.Run: failures are t.Error + return.
func fuzzManagerBody(t *testing.T, data []byte) {
	{
		w, err := buildFuzzWorld(t)
		if err != nil {
			t.Error(err)
			return
		}
		attrs := []uint16{AttrREQ, AttrMRA, AttrREJ, AttrREP, AttrRTU, AttrDREQ, AttrDREP, AttrSIDRREQ, AttrSIDRREP, AttrLAP, AttrAPR}
		rd := bytes.NewReader(data)
		next := func() byte { b, _ := rd.ReadByte(); return b }
		pick := func(b byte) uint32 {
			if int(b) < len(w.ids)*8 {
				return w.ids[int(b)%len(w.ids)]
			}
			return uint32(b) * 0x01010101
		}
		var buf [MADLen]byte
		for rd.Len() > 0 {
			op := next()
			switch op % 8 {
			case 0, 1, 2, 3: // a MAD
				attr := attrs[int(next())%len(attrs)]
				InitMAD(buf[:], attr, uint64(next()))
				n, _ := rd.Read(buf[24 : 24+int(next())%(MADLen-24)])
				_ = n
				commIDs(buf[:]).SetLocalCommID(pick(next()))
				commIDs(buf[:]).SetRemoteCommID(pick(next()))
				switch attr {
				case AttrREQ:
					r := REQ(buf[:])
					if next()&1 == 0 {
						r.SetServiceID(ServiceID(PortSpaceTCP, 5555))
						CMAHeader(r.PrivateData()).Encode(fzRemote, 1, fzLocal)
					}
					r.SetLocalQPN(w.qpns[int(next())%len(w.qpns)])
					r.SetLocalCAGUID(uint64(0x2222 + int(next()%2)))
				case AttrREP:
					REP(buf[:]).SetLocalCAGUID(0x2222)
				case AttrDREQ:
					DREQ(buf[:]).SetRemoteQPN(w.qpns[int(next())%len(w.qpns)])
				case AttrREJ:
					if next()&1 == 0 {
						putBE64(REJ(buf[:]).ARIField(), 0x2222)
					}
				}
				src := fzRemote
				if next()&7 == 0 {
					src = netip.MustParseAddr("10.0.0.9")
				}
				if err := w.m.HandleMAD(w.now, src, fzLocal, buf[:], &w.out); err != nil {
					t.Errorf("valid-header MAD refused: %v", err)
					return
				}
			case 4: // raw garbage
				n := int(next())
				b := make([]byte, n)
				_, _ = rd.Read(b)
				_ = w.m.HandleMAD(w.now, fzRemote, fzLocal, b, &w.out)
			case 5: // time passes
				w.now += time.Duration(next()) * time.Duration(next()) * 10 * time.Millisecond
				w.m.Expire(w.now, &w.out)
			case 6: // an API call on some connection
				id := ConnID(pick(next()))
				switch next() % 7 {
				case 0:
					_ = w.m.Accept(w.now, id, &AcceptParams{QPN: uint32(next()) + 2}, &w.out)
				case 1:
					_ = w.m.Reject(w.now, id, transport.RejectReason(next()), nil, &w.out)
				case 2:
					_ = w.m.MRA(w.now, id, next(), nil, &w.out)
				case 3:
					_ = w.m.Disconnect(w.now, id, nil, &w.out)
				case 4:
					_ = w.m.Destroy(w.now, id, &w.out)
				case 5:
					_ = w.m.CommEstablished(w.now, id, &w.out)
				case 6:
					if id, err := w.m.Dial(w.now, &DialParams{LocalAddr: fzLocal, RemoteAddr: fzRemote, DstPort: 5555, QPN: uint32(next()) + 2}, &w.out); err == nil {
						w.ids = append(w.ids, uint32(id))
					}
				}
			case 7:
				_ = w.m.Listen(netip.Addr{}, uint16(next()))
			}
			if w.collect(); t.Failed() {
				return
			}
		}
		// Invariants over the event history.
		type life struct{ est, disc, done bool }
		lives := map[ConnID]*life{}
		for _, e := range w.events {
			l := lives[e.Conn]
			if l == nil || (l.done && e.Kind == EventRequest) {
				l = &life{}
				lives[e.Conn] = l
			}
			if l.done {
				t.Errorf("event %v for %#x after its final event", e.Kind, e.Conn)
				return
			}
			switch e.Kind {
			case EventEstablished:
				if l.est || l.disc {
					t.Errorf("%#x: ESTABLISHED twice or after DISCONNECTED", e.Conn)
					return
				}
				l.est = true
			case EventDisconnected:
				if l.disc {
					t.Errorf("%#x: DISCONNECTED twice", e.Conn)
					return
				}
				l.disc = true
			case EventTimewaitExit, EventUnreachable:
				l.done = true
			case EventRejected:
				l.done = e.Reason != transport.RejectStaleConn
			}
		}
		// Everything is released once destroyed and timers run out.
		for id := range w.m.conns {
			_ = w.m.Destroy(w.now, id, &w.out)
		}
		w.collect()
		w.m.Expire(w.now+100*time.Hour, &w.out)
		w.collect()
		if w.m.NumConns() != 0 || len(w.m.byRemoteID) != 0 || len(w.m.byRemoteQPN) != 0 {
			t.Errorf("left: %d conns, %d/%d index entries", w.m.NumConns(), len(w.m.byRemoteID), len(w.m.byRemoteQPN))
			return
		}
		if _, ok := w.m.NextDeadline(); ok {
			t.Error("timer left")
			return
		}
	}
}

// TestSteadyStateAllocations: answering MADs of established connections does not allocate.
func TestSteadyStateAllocations(t *testing.T) {
	w := newFuzzWorld(t)
	id, pid := w.est, w.peerID
	if ci, ok := w.m.Conn(id); !ok || ci.State != StateEstablished || ci.RemoteCommID != pid {
		t.Fatalf("fixture: %+v", ci)
	}
	// A duplicate RTU (dropped), a DREQ for an unknown connection (DREP), a LAP (APR), a
	// SIDR_REQ (SIDR_REP) and a duplicate REQ-while-established (dropped).
	var rtu, dreq, lap, sidr [MADLen]byte
	InitMAD(rtu[:], AttrRTU, 1)
	RTU(rtu[:]).SetLocalCommID(pid)
	RTU(rtu[:]).SetRemoteCommID(uint32(id))
	InitMAD(dreq[:], AttrDREQ, 2)
	DREQ(dreq[:]).SetLocalCommID(99)
	DREQ(dreq[:]).SetRemoteCommID(98)
	InitMAD(lap[:], AttrLAP, 3)
	commIDs(lap[:]).SetLocalCommID(pid)
	commIDs(lap[:]).SetRemoteCommID(uint32(id))
	InitMAD(sidr[:], AttrSIDRREQ, 4)
	var out Outputs
	run := func() {
		out.Reset()
		for _, b := range [][]byte{rtu[:], dreq[:], lap[:], sidr[:]} {
			if err := w.m.HandleMAD(5, fzRemote, fzLocal, b, &out); err != nil {
				t.Fatal(err)
			}
		}
		w.m.Expire(6, &out)
		_, _ = w.m.NextDeadline()
	}
	run()
	if len(out.MADs) != 3 {
		t.Fatalf("%d answers", len(out.MADs))
	}
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Errorf("%v allocations per round of MADs", n)
	}
}
