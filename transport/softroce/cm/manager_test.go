package cm

import (
	"bytes"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
)

const (
	guidA = 0x505400fffe770002 // initiator (as in the captures)
	guidB = 0x505400fffe770001 // target
	port  = 5555
)

func pair(t *testing.T) (*simnet, *node, *node) {
	s := newNet(t)
	a := s.addNode("A", "10.77.0.2", guidA, 1, nil)
	b := s.addNode("B", "10.77.0.1", guidB, 2, nil)
	if err := b.m.Listen(netip.Addr{}, port); err != nil {
		t.Fatal(err)
	}
	return s, a, b
}

func login(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i + 1)
	}
	return b
}

func TestConnectAccept(t *testing.T) {
	s, a, b := pair(t)
	repPD := []byte("SRP_LOGIN_RSP")
	b.ulp = acceptAll(0x11, repPD, transport.ConnParam{ResponderResources: 4, RNRRetryCount: 7, FlowControl: true})
	id := a.dial(b, port, 0x11, login(56), srpParam)
	s.runFor(time.Second)

	if got := kinds(a.events); !slices.Equal(got, []EventKind{EventEstablished}) {
		t.Fatalf("A events %v", got)
	}
	if got := kinds(b.events); !slices.Equal(got, []EventKind{EventRequest, EventEstablished}) {
		t.Fatalf("B events %v", got)
	}
	req := b.events[0]
	if !bytes.Equal(req.PrivateData, login(56)) {
		t.Errorf("request private data %x", req.PrivateData)
	}
	ri := req.Request
	if ri.RemoteAddr.Addr() != a.addr || ri.LocalAddr != netip.AddrPortFrom(b.addr, port) ||
		ri.ServiceID != 0x00000000010615B3 || ri.RemoteCAGUID != guidA || ri.RemoteQPN != 0x11 ||
		ri.PathMTU != transport.MTU1024 || ri.InitiatorDepth != 4 || ri.ResponderResources != 0 {
		t.Errorf("request info %+v", ri)
	}
	if est := a.events[0]; len(est.PrivateData) != REPPrivateDataSize || !bytes.HasPrefix(est.PrivateData, repPD) {
		t.Errorf("REP private data %q", est.PrivateData)
	}
	if a.sent[AttrREQ] != 1 || b.sent[AttrREP] != 1 || a.sent[AttrRTU] != 1 {
		t.Errorf("sent A %v B %v", a.sent, b.sent)
	}

	// QPs: both RTS, PSNs and QPNs crossed, resources mapped.
	qa, qb := a.qps[0x11], b.qps[0x11]
	if qa.state != transport.QPSRTS || qb.state != transport.QPSRTS {
		t.Fatalf("QP states %v %v", qa.state, qb.state)
	}
	ai, _ := a.m.Conn(id)
	bi, _ := b.m.Conn(b.events[0].Conn)
	if qa.attr.RQPSN != qb.attr.SQPSN || qb.attr.RQPSN != qa.attr.SQPSN {
		t.Errorf("PSNs: A rq %#x sq %#x, B rq %#x sq %#x", qa.attr.RQPSN, qa.attr.SQPSN, qb.attr.RQPSN, qb.attr.SQPSN)
	}
	if ai.RemoteCommID != uint32(bi.ID) || bi.RemoteCommID != uint32(ai.ID) {
		t.Errorf("comm IDs %+v %+v", ai, bi)
	}
	// ib_srp offers responder resources 4, initiator depth 0; the target's REP initiator
	// depth defaults to the offer (4), responder resources 4 as ib_srpt.
	if qb.attr.MaxRdAtomic != 4 || qa.attr.MaxDestRdAtomic != 4 ||
		qb.attr.AccessFlags&transport.AccessRemoteRead == 0 || qa.attr.AccessFlags&transport.AccessRemoteRead == 0 {
		t.Errorf("resources: B max_rd_atomic %d, A max_dest_rd_atomic %d, access %v / %v",
			qb.attr.MaxRdAtomic, qa.attr.MaxDestRdAtomic, qa.attr.AccessFlags, qb.attr.AccessFlags)
	}
	if qa.attr.MaxRdAtomic != 4 || qb.attr.MaxDestRdAtomic != 4 {
		t.Errorf("A max_rd_atomic %d B max_dest_rd_atomic %d", qa.attr.MaxRdAtomic, qb.attr.MaxDestRdAtomic)
	}
	if qa.attr.PathMTU != transport.MTU1024 || qb.attr.PathMTU != transport.MTU1024 ||
		qa.attr.DestQPN != 0x11 || qb.attr.DestQPN != 0x11 ||
		qa.attr.RetryCnt != 7 || qb.attr.RetryCnt != 7 || qa.attr.RNRRetry != 7 || qb.attr.RNRRetry != 7 {
		t.Errorf("attrs A %+v B %+v", qa.attr, qb.attr)
	}
	// ACK timeouts: passive = REQ Local ACK Timeout (19), active = cm_ack_timeout(15, 18).
	if qa.attr.Timeout != 19 || qb.attr.Timeout != 19 {
		t.Errorf("timeouts %d %d", qa.attr.Timeout, qb.attr.Timeout)
	}
	if qa.attr.AV.DstAddr != b.addr || qb.attr.AV.DstAddr != a.addr || qa.attr.AV.HopLimit != 64 ||
		qa.attr.AV.FlowLabel != qb.attr.AV.FlowLabel {
		t.Errorf("AVs %+v %+v", qa.attr.AV, qb.attr.AV)
	}
	if a.m.NumConns() != 1 || b.m.NumConns() != 1 {
		t.Errorf("conns %d %d", a.m.NumConns(), b.m.NumConns())
	}
}

func TestRejectWithPrivateData(t *testing.T) {
	s, a, b := pair(t)
	rejPD := []byte{0xc2, 0, 0, 0, 0, 1, 0, 6}
	b.ulp = func(n *node, e Event) {
		if e.Kind == EventRequest {
			if err := n.m.Reject(n.net.now, e.Conn, transport.RejectConsumerDefined, rejPD, &n.out); err != nil {
				t.Fatal(err)
			}
			n.flush()
		}
	}
	a.dial(b, port, 0x11, login(56), srpParam)
	s.runFor(time.Second)
	if len(a.events) != 1 || a.events[0].Kind != EventRejected {
		t.Fatalf("A events %v", kinds(a.events))
	}
	e := a.events[0]
	if e.Reason != 28 || !bytes.HasPrefix(e.PrivateData, rejPD) || len(e.PrivateData) != REJPrivateDataSize {
		t.Errorf("reject %+v", e)
	}
	if a.qps[0x11].state != transport.QPSErr {
		t.Errorf("A QP %v", a.qps[0x11].state)
	}
	if a.m.NumConns() != 0 || b.m.NumConns() != 0 {
		t.Errorf("conns %d %d", a.m.NumConns(), b.m.NumConns())
	}
	if _, ok := a.m.NextDeadline(); ok {
		t.Error("A still has a timer")
	}
	if got := kinds(b.events); !slices.Equal(got, []EventKind{EventRequest}) {
		t.Errorf("B events %v", got)
	}
}

func TestDialNoListener(t *testing.T) {
	s, a, b := pair(t)
	a.dial(b, 4444, 0x11, nil, srpParam)
	s.runFor(10 * time.Millisecond)
	if len(a.events) != 1 || a.events[0].Kind != EventRejected || a.events[0].Reason != transport.RejectInvalidServiceID {
		t.Fatalf("A events %+v", a.events)
	}
	if a.m.NumConns() != 0 || b.m.NumConns() != 0 {
		t.Error("connections left")
	}
	// Listener on the port but for another address: consumer-defined REJ (cma).
	if err := b.m.Listen(netip.MustParseAddr("10.77.0.9"), 4444); err != nil {
		t.Fatal(err)
	}
	a.dial(b, 4444, 0x12, nil, srpParam)
	s.runFor(10 * time.Millisecond)
	if len(a.events) != 2 || a.events[1].Reason != transport.RejectConsumerDefined {
		t.Fatalf("A events %+v", a.events)
	}
	if err := b.m.Listen(netip.MustParseAddr("10.77.0.9"), 4444); !errors.Is(err, ErrAddrInUse) {
		t.Errorf("double listen: %v", err)
	}
	if err := b.m.Unlisten(netip.MustParseAddr("10.77.0.9"), 4444); err != nil {
		t.Error(err)
	}
	if err := b.m.Unlisten(netip.MustParseAddr("10.77.0.9"), 4444); !errors.Is(err, ErrNotListening) {
		t.Error(err)
	}
}

func connected(t *testing.T) (*simnet, *node, *node, ConnID, ConnID) {
	s, a, b := pair(t)
	b.ulp = acceptAll(0x11, nil, transport.ConnParam{ResponderResources: 4})
	ida := a.dial(b, port, 0x11, login(56), srpParam)
	s.runFor(time.Second)
	if len(b.events) != 2 || b.events[1].Kind != EventEstablished || len(a.events) != 1 || a.events[0].Kind != EventEstablished {
		t.Fatalf("not connected: A %v B %v", kinds(a.events), kinds(b.events))
	}
	return s, a, b, ida, b.events[0].Conn
}

func TestDisconnect(t *testing.T) {
	for _, side := range []string{"active", "passive"} {
		t.Run(side, func(t *testing.T) {
			s, a, b, ida, idb := connected(t)
			from, to, id := a, b, ida
			if side == "passive" {
				from, to, id = b, a, idb
			}
			start := s.now
			if err := from.m.Disconnect(s.now, id, []byte("bye"), &from.out); err != nil {
				t.Fatal(err)
			}
			from.flush()
			if err := from.m.Disconnect(s.now, id, nil, &from.out); err != nil { // idempotent
				t.Fatal(err)
			}
			from.flush()
			if from.sent[AttrDREQ] != 1 {
				t.Fatalf("DREQs %d", from.sent[AttrDREQ])
			}
			s.run(start + time.Hour)
			for _, n := range []*node{a, b} {
				ks := kinds(n.events)
				if !slices.Equal(ks[len(ks)-2:], []EventKind{EventDisconnected, EventTimewaitExit}) {
					t.Errorf("%s events %v", n.name, ks)
				}
				if n.m.NumConns() != 0 {
					t.Errorf("%s conns %d", n.name, n.m.NumConns())
				}
				if n.qps[0x11].state != transport.QPSErr {
					t.Errorf("%s QP %v", n.name, n.qps[0x11].state)
				}
				checkEventInvariants(t, n)
			}
			// The receiver of the DREQ sees its private data.
			if e := to.events[len(to.events)-2]; !bytes.HasPrefix(e.PrivateData, []byte("bye")) {
				t.Errorf("DREQ private data %q", e.PrivateData)
			}
			if to.sent[AttrDREP] != 1 {
				t.Errorf("DREPs %d", to.sent[AttrDREP])
			}
		})
	}
}

func TestSimultaneousDisconnect(t *testing.T) {
	s, a, b, ida, idb := connected(t)
	if err := a.m.Disconnect(s.now, ida, nil, &a.out); err != nil {
		t.Fatal(err)
	}
	if err := b.m.Disconnect(s.now, idb, nil, &b.out); err != nil {
		t.Fatal(err)
	}
	a.flush()
	b.flush()
	s.run(s.now + time.Hour)
	for _, n := range []*node{a, b} {
		ks := kinds(n.events)
		if !slices.Equal(ks[len(ks)-2:], []EventKind{EventDisconnected, EventTimewaitExit}) {
			t.Errorf("%s events %v", n.name, ks)
		}
		if n.m.NumConns() != 0 || n.sent[AttrDREQ] != 1 || n.sent[AttrDREP] != 1 {
			t.Errorf("%s conns %d sent %v", n.name, n.m.NumConns(), n.sent)
		}
		checkEventInvariants(t, n)
	}
}

// dropNth drops the n-th (1-based) MAD of an attribute.
func dropNth(attr uint16, nth ...int) func(*packet) bool {
	count := 0
	return func(p *packet) bool {
		if be16(p.mad[16:]) != attr {
			return false
		}
		count++
		return slices.Contains(nth, count)
	}
}

func TestLossAndRetransmission(t *testing.T) {
	reqTimeout := 2*TimeoutDuration(DefaultPacketLifeTime) + TimeoutDuration(DefaultCMResponseTimeout)
	cases := []struct {
		name     string
		attr     uint16
		nth      []int
		wantA    map[uint16]int // MADs A sent
		wantB    map[uint16]int
		minTime  time.Duration // time to get both established
		maxTime  time.Duration
		disc     bool // also disconnect (for DREQ/DREP loss)
		discFrom string
	}{
		{name: "REQ lost", attr: AttrREQ, nth: []int{1},
			wantA: map[uint16]int{AttrREQ: 2, AttrRTU: 1}, wantB: map[uint16]int{AttrREP: 1},
			minTime: reqTimeout, maxTime: reqTimeout + time.Second},
		{name: "REQ lost twice", attr: AttrREQ, nth: []int{1, 2},
			wantA: map[uint16]int{AttrREQ: 3, AttrRTU: 1}, wantB: map[uint16]int{AttrREP: 1},
			minTime: 2 * reqTimeout, maxTime: 2*reqTimeout + time.Second},
		// REP lost: A's REQ retransmission (6.1 s) makes B send the REP again at once, before
		// B's own REP timeout (4.1 s... B retransmits first with the default 20).
		{name: "REP lost", attr: AttrREP, nth: []int{1},
			wantA: map[uint16]int{AttrREQ: 1, AttrRTU: 1}, wantB: map[uint16]int{AttrREP: 2},
			minTime: TimeoutDuration(20), maxTime: TimeoutDuration(20) + time.Second},
		// RTU lost: B's REP retransmission reaches the established A, which answers with the
		// RTU again (cm_dup_rep_handler).
		{name: "RTU lost", attr: AttrRTU, nth: []int{1},
			wantA: map[uint16]int{AttrREQ: 1, AttrRTU: 2}, wantB: map[uint16]int{AttrREP: 2},
			minTime: TimeoutDuration(20), maxTime: TimeoutDuration(20) + time.Second},
		{name: "DREQ lost", attr: AttrDREQ, nth: []int{1}, disc: true, discFrom: "A",
			wantA: map[uint16]int{AttrDREQ: 2}, wantB: map[uint16]int{AttrDREP: 1}},
		// DREP lost: A retransmits the DREQ; B, in timewait, sends the DREP again.
		{name: "DREP lost", attr: AttrDREP, nth: []int{1}, disc: true, discFrom: "A",
			wantA: map[uint16]int{AttrDREQ: 2}, wantB: map[uint16]int{AttrDREP: 2}},
		{name: "passive DREQ lost", attr: AttrDREQ, nth: []int{1}, disc: true, discFrom: "B",
			wantA: map[uint16]int{AttrDREP: 1}, wantB: map[uint16]int{AttrDREQ: 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, a, b := pair(t)
			s.drop = dropNth(tc.attr, tc.nth...)
			b.ulp = acceptAll(0x11, nil, transport.ConnParam{})
			id := a.dial(b, port, 0x11, nil, srpParam)
			s.runFor(time.Minute)
			estA, estB := findEvent(a, EventEstablished), findEvent(b, EventEstablished)
			if estA < 0 || estB < 0 {
				t.Fatalf("not established: A %v B %v\n%v", kinds(a.events), kinds(b.events), s.trace)
			}
			if !tc.disc {
				for attr, n := range tc.wantA {
					if a.sent[attr] != n {
						t.Errorf("A sent %d %s, want %d", a.sent[attr], AttrName(attr), n)
					}
				}
				for attr, n := range tc.wantB {
					if b.sent[attr] != n {
						t.Errorf("B sent %d %s, want %d", b.sent[attr], AttrName(attr), n)
					}
				}
				return
			}
			from, fid := a, id
			if tc.discFrom == "B" {
				from, fid = b, b.events[0].Conn
			}
			if err := from.m.Disconnect(s.now, fid, nil, &from.out); err != nil {
				t.Fatal(err)
			}
			from.flush()
			s.run(s.now + time.Hour)
			for attr, n := range tc.wantA {
				if a.sent[attr] != n {
					t.Errorf("A sent %d %s, want %d\n%v", a.sent[attr], AttrName(attr), n, s.trace)
				}
			}
			for attr, n := range tc.wantB {
				if b.sent[attr] != n {
					t.Errorf("B sent %d %s, want %d\n%v", b.sent[attr], AttrName(attr), n, s.trace)
				}
			}
			for _, n := range []*node{a, b} {
				if n.m.NumConns() != 0 || findEvent(n, EventTimewaitExit) < 0 {
					t.Errorf("%s: conns %d events %v", n.name, n.m.NumConns(), kinds(n.events))
				}
				checkEventInvariants(t, n)
			}
		})
	}
}

// TestEstablishTiming checks when the REQ retransmission happens: 2×ms(18) + ms(20) = 6.144 s
// after the first (plus the simulated 1 ms link delay).
func TestEstablishTiming(t *testing.T) {
	s, a, b := pair(t)
	s.drop = dropNth(AttrREQ, 1)
	b.ulp = acceptAll(0x11, nil, transport.ConnParam{})
	a.dial(b, port, 0x11, nil, srpParam)
	s.runFor(time.Minute)
	var reqs []string
	for _, l := range s.trace {
		if strings.HasSuffix(l, " REQ") || strings.HasSuffix(l, " REQ DROPPED") {
			reqs = append(reqs, l)
		}
	}
	if len(reqs) != 2 || reqs[0] != "0s 10.77.0.2->10.77.0.1 REQ DROPPED" ||
		reqs[1] != "6.145s 10.77.0.2->10.77.0.1 REQ" {
		t.Errorf("REQ trace %q", reqs)
	}
}

func findEvent(n *node, k EventKind) int {
	for i, e := range n.events {
		if e.Kind == k {
			return i
		}
	}
	return -1
}

func TestREQRetriesExhausted(t *testing.T) {
	s, a, b := pair(t)
	s.drop = func(p *packet) bool { return p.to == b.addr }
	id := a.dial(b, port, 0x11, nil, srpParam)
	s.run(time.Hour)
	if len(a.events) != 1 || a.events[0].Kind != EventUnreachable || !errors.Is(a.events[0].Err, ErrTimeout) {
		t.Fatalf("A events %+v", a.events)
	}
	if a.sent[AttrREQ] != 16 { // 1 + Max CM Retries
		t.Errorf("REQs sent %d", a.sent[AttrREQ])
	}
	want := 16 * (2*TimeoutDuration(DefaultPacketLifeTime) + TimeoutDuration(DefaultCMResponseTimeout))
	if s.now != want {
		t.Errorf("unreachable after %v, want %v", s.now, want)
	}
	if _, ok := a.m.Conn(id); ok || a.m.NumConns() != 0 {
		t.Error("connection not released")
	}
	if a.qps[0x11].state != transport.QPSErr {
		t.Errorf("QP %v", a.qps[0x11].state)
	}
}

func TestREPRetriesExhausted(t *testing.T) {
	s, a, b := pair(t)
	b.ulp = acceptAll(0x11, nil, transport.ConnParam{})
	// A's REQ gets through once, then A goes silent (everything to B dropped after the REQ).
	s.drop = func(p *packet) bool { return p.to == b.addr && be16(p.mad[16:]) != AttrREQ }
	a.dial(b, port, 0x11, nil, srpParam)
	// Stop A after its REQ: destroy without telling B (drop the REJ).
	s.runFor(10 * time.Millisecond)
	s.drop = func(p *packet) bool { return true }
	s.run(time.Hour)
	if got := kinds(b.events); !slices.Equal(got, []EventKind{EventRequest, EventUnreachable}) {
		t.Fatalf("B events %v", got)
	}
	if b.sent[AttrREP] != 16 || b.m.NumConns() != 0 {
		t.Errorf("REPs %d conns %d", b.sent[AttrREP], b.m.NumConns())
	}
}

// TestDuplicateREQWhileDeciding: the ULP takes longer than A's REQ timeout; the duplicate REQ
// gets an MRA (service timeout 24), A waits longer, then the accept goes through.
func TestDuplicateREQWhileDeciding(t *testing.T) {
	s, a, b := pair(t)
	var pendingID ConnID
	b.ulp = func(n *node, e Event) {
		if e.Kind == EventRequest {
			pendingID = e.Conn
		}
	}
	ida := a.dial(b, port, 0x11, nil, srpParam)
	s.runFor(7 * time.Second) // one REQ retransmission at 6.144 s
	if b.sent[AttrMRA] != 1 || len(b.events) != 1 {
		t.Fatalf("B sent %v, events %v", b.sent, kinds(b.events))
	}
	if st, _ := a.m.Conn(ida); st.State != StateMRAReqRcvd {
		t.Fatalf("A state %v", st.State)
	}
	if st, _ := b.m.Conn(pendingID); st.State != StateMRAReqSent {
		t.Fatalf("B state %v", st.State)
	}
	// A now waits ms(24) + ms(19) = 65.536 + 2.048 s before its next REQ; the ULP answers
	// within 50 s (the decision timeout, ms(24) from the first REQ, is not reached).
	s.runFor(50 * time.Second)
	if a.sent[AttrREQ] != 2 {
		t.Fatalf("REQs %d", a.sent[AttrREQ])
	}
	if err := b.m.Accept(s.now, pendingID, &AcceptParams{QPN: 0x22}, &b.out); err != nil {
		t.Fatal(err)
	}
	b.flush()
	s.runFor(time.Second)
	if findEvent(a, EventEstablished) < 0 || findEvent(b, EventEstablished) < 0 {
		t.Fatalf("A %v B %v", kinds(a.events), kinds(b.events))
	}
}

func TestExplicitMRAAndDecisionTimeout(t *testing.T) {
	s, a, b := pair(t)
	var pending ConnID
	b.ulp = func(n *node, e Event) {
		if e.Kind == EventRequest {
			pending = e.Conn
			if err := n.m.MRA(n.net.now, e.Conn, 22, []byte("wait"), &n.out); err != nil {
				t.Fatal(err)
			}
			n.flush()
		}
	}
	ida := a.dial(b, port, 0x11, nil, srpParam)
	s.runFor(10 * time.Millisecond)
	if st, _ := a.m.Conn(ida); st.State != StateMRAReqRcvd {
		t.Fatalf("A state %v", st.State)
	}
	if err := b.m.MRA(s.now, pending, 22, nil, &b.out); !errors.Is(err, ErrState) {
		t.Errorf("second MRA: %v", err)
	}
	// The ULP never answers: the decision timeout rejects (28) and reports UNREACHABLE.
	s.run(time.Hour)
	if got := kinds(b.events); !slices.Equal(got, []EventKind{EventRequest, EventUnreachable}) ||
		!errors.Is(b.events[1].Err, ErrDecisionTimeout) {
		t.Fatalf("B events %+v", b.events)
	}
	if len(a.events) != 1 || a.events[0].Kind != EventRejected || a.events[0].Reason != 28 {
		t.Fatalf("A events %+v", a.events)
	}
	if a.m.NumConns() != 0 || b.m.NumConns() != 0 {
		t.Error("connections left")
	}
}

// TestStaleREQInTimewait: a REQ matching a connection in timewait gets REJ 10 (stale), and so
// does a REQ from a new comm ID reusing a (CA GUID, QPN) still held.
func TestStaleREQInTimewait(t *testing.T) {
	s, a, b := pair(t)
	reqMAD := s.keepLast(AttrREQ)
	b.ulp = acceptAll(0x11, nil, transport.ConnParam{})
	ida := a.dial(b, port, 0x11, nil, srpParam)
	s.runFor(time.Second)
	if err := a.m.Disconnect(s.now, ida, nil, &a.out); err != nil {
		t.Fatal(err)
	}
	a.flush()
	s.runFor(10 * time.Millisecond)
	idb := b.events[0].Conn
	if st, _ := b.m.Conn(idb); st.State != StateTimewait {
		t.Fatalf("B state %v", st.State)
	}
	if err := b.m.HandleMAD(s.now, a.addr, b.addr, reqMAD[:], &b.out); err != nil {
		t.Fatal(err)
	}
	if len(b.out.MADs) != 1 || b.out.MADs[0].Attr() != AttrREJ {
		t.Fatalf("answer to the stale REQ: %+v", b.out.MADs)
	}
	rej := REJ(b.out.MADs[0].MAD[:])
	if rej.Reason() != 10 || rej.LocalCommID() != uint32(idb) || rej.RemoteCommID() != uint32(ida) ||
		rej.MessageRejected() != MsgResponseOther {
		t.Fatalf("REJ %x", rej[:40])
	}
	b.out.Reset()
	REQ(reqMAD[:]).SetLocalCommID(0x12345678)
	if err := b.m.HandleMAD(s.now, a.addr, b.addr, reqMAD[:], &b.out); err != nil {
		t.Fatal(err)
	}
	rej = REJ(b.out.MADs[0].MAD[:])
	if len(b.out.MADs) != 1 || rej.Reason() != 10 || rej.RemoteCommID() != 0x12345678 ||
		rej.MessageRejected() != MsgResponseREQ {
		t.Fatalf("answer to the REQ reusing a QPN: %+v", b.out.MADs)
	}
	b.out.Reset()
	// After timewait both are forgotten: the same REQ is a new request.
	s.runFor(time.Minute)
	if b.m.NumConns() != 0 {
		t.Fatal("B still holds the connection")
	}
	if err := b.m.HandleMAD(s.now, a.addr, b.addr, reqMAD[:], &b.out); err != nil {
		t.Fatal(err)
	}
	if len(b.out.Events) != 1 || b.out.Events[0].Kind != EventRequest {
		t.Fatalf("after timewait: %+v", b.out)
	}
}

func TestDREQEdgeCases(t *testing.T) {
	s, a, b, ida, idb := connected(t)
	// DREQ for an unknown connection: DREP anyway (cm_issue_drep), TID echoed.
	buf := make([]byte, MADLen)
	InitMAD(buf, AttrDREQ, 0xabcdef)
	d := DREQ(buf)
	d.SetLocalCommID(0x1111)
	d.SetRemoteCommID(0x2222)
	if err := b.m.HandleMAD(s.now, a.addr, b.addr, buf, &b.out); err != nil {
		t.Fatal(err)
	}
	if len(b.out.MADs) != 1 {
		t.Fatalf("%d MADs", len(b.out.MADs))
	}
	rep := DREP(b.out.MADs[0].MAD[:])
	if b.out.MADs[0].Attr() != AttrDREP || rep.LocalCommID() != 0x2222 || rep.RemoteCommID() != 0x1111 ||
		be64(rep[8:]) != 0xabcdef || b.out.MADs[0].Dst != a.addr {
		t.Fatalf("DREP %x", rep[:40])
	}
	b.out.Reset()
	// DREQ for our connection but naming another QPN: ignored.
	d.SetLocalCommID(uint32(ida))
	d.SetRemoteCommID(uint32(idb))
	d.SetRemoteQPN(0x99)
	if err := b.m.HandleMAD(s.now, a.addr, b.addr, buf, &b.out); err != nil {
		t.Fatal(err)
	}
	if !b.out.Empty() {
		t.Fatalf("DREQ with wrong QPN answered: %+v", b.out)
	}
	if st, _ := b.m.Conn(idb); st.State != StateEstablished {
		t.Fatalf("state %v", st.State)
	}
}

func TestCommEstablished(t *testing.T) {
	s, a, b := pair(t)
	s.drop = dropNth(AttrRTU, 1)
	b.ulp = acceptAll(0x11, nil, transport.ConnParam{})
	a.dial(b, port, 0x11, nil, srpParam)
	s.runFor(100 * time.Millisecond)
	idb := b.events[0].Conn
	if st, _ := b.m.Conn(idb); st.State != StateRepSent {
		t.Fatalf("B state %v", st.State)
	}
	// The first RC packet arrives: the engine reports COMM_EST.
	if err := b.m.CommEstablished(s.now, idb, &b.out); err != nil {
		t.Fatal(err)
	}
	b.flush()
	if st, _ := b.m.Conn(idb); st.State != StateEstablished || findEvent(b, EventEstablished) < 0 {
		t.Fatalf("B state %v events %v", st.State, kinds(b.events))
	}
	if _, ok := b.m.NextDeadline(); ok {
		t.Error("REP timer still armed")
	}
}

// TestDestroyPendingDial: aborting a dial sends REJ "timeout" with our GUID as ARI; the passive
// side finds its connection through the ARI and reports REJECTED.
func TestDestroyPendingDial(t *testing.T) {
	s, a, b := pair(t)
	b.ulp = func(*node, Event) {} // never answers
	id := a.dial(b, port, 0x11, nil, srpParam)
	s.runFor(10 * time.Millisecond)
	if err := a.m.Destroy(s.now, id, &a.out); err != nil {
		t.Fatal(err)
	}
	a.flush()
	s.runFor(10 * time.Millisecond)
	if a.sent[AttrREJ] != 1 || len(a.events) != 0 || a.m.NumConns() != 0 {
		t.Fatalf("A sent %v events %v conns %d", a.sent, kinds(a.events), a.m.NumConns())
	}
	if got := kinds(b.events); !slices.Equal(got, []EventKind{EventRequest, EventRejected}) ||
		b.events[1].Reason != transport.RejectTimeout || be64(b.events[1].ARI) != guidA {
		t.Fatalf("B events %+v", b.events)
	}
	if b.m.NumConns() != 0 {
		t.Error("B connection left")
	}
}

// TestManyConnections: 256 concurrent connections on one listener, then all disconnected.
func TestManyConnections(t *testing.T) {
	s, a, b := pair(t)
	b.ulp = acceptAll(0x1000, nil, transport.ConnParam{ResponderResources: 1})
	ids := map[ConnID]bool{}
	for i := 0; i < 256; i++ {
		id := a.dial(b, port, uint32(0x100+i), []byte{byte(i)}, srpParam)
		if ids[id] || id == 0 {
			t.Fatalf("comm ID %#x reused", id)
		}
		ids[id] = true
	}
	s.runFor(time.Second)
	if b.m.NumConns() != 256 || a.m.NumConns() != 256 {
		t.Fatalf("conns %d %d", a.m.NumConns(), b.m.NumConns())
	}
	est := 0
	for _, e := range a.events {
		if e.Kind == EventEstablished {
			est++
		}
	}
	if est != 256 || a.sent[AttrREQ] != 256 || b.sent[AttrREP] != 256 {
		t.Fatalf("established %d, sent %v / %v", est, a.sent, b.sent)
	}
	seen := map[byte]bool{}
	for _, e := range b.events {
		if e.Kind == EventRequest {
			seen[e.PrivateData[0]] = true
		}
	}
	if len(seen) != 256 {
		t.Fatalf("%d distinct request payloads", len(seen))
	}
	for id := range ids {
		if err := a.m.Disconnect(s.now, id, nil, &a.out); err != nil {
			t.Fatal(err)
		}
		a.flush()
	}
	s.run(s.now + time.Hour)
	if a.m.NumConns() != 0 || b.m.NumConns() != 0 {
		t.Fatalf("conns %d %d", a.m.NumConns(), b.m.NumConns())
	}
	checkEventInvariants(t, a)
	checkEventInvariants(t, b)
}

func TestAPIErrors(t *testing.T) {
	s, a, b, ida, idb := connected(t)
	now := s.now
	o := &a.out
	if _, err := a.m.Dial(now, &DialParams{LocalAddr: a.addr, RemoteAddr: b.addr, QPN: 0}, o); !errors.Is(err, ErrInvalidArgument) {
		t.Error(err)
	}
	if _, err := a.m.Dial(now, &DialParams{LocalAddr: a.addr, RemoteAddr: netip.MustParseAddr("::1"), QPN: 3}, o); !errors.Is(err, ErrInvalidArgument) {
		t.Error(err)
	}
	if _, err := a.m.Dial(now, &DialParams{LocalAddr: a.addr, RemoteAddr: b.addr, QPN: 3, PrivateData: make([]byte, 57)}, o); !errors.Is(err, ErrPrivateDataTooLong) {
		t.Error(err)
	}
	if err := a.m.Accept(now, ida, &AcceptParams{QPN: 3}, o); !errors.Is(err, ErrState) {
		t.Error(err)
	}
	if err := a.m.Accept(now, 12345, &AcceptParams{QPN: 3}, o); !errors.Is(err, ErrUnknownConn) {
		t.Error(err)
	}
	if err := b.m.Reject(now, idb, 0, nil, &b.out); !errors.Is(err, ErrState) {
		t.Error(err)
	}
	if err := b.m.Disconnect(now, idb, make([]byte, 221), &b.out); !errors.Is(err, ErrPrivateDataTooLong) {
		t.Error(err)
	}
	if _, err := NewManager(Config{}); !errors.Is(err, ErrInvalidArgument) {
		t.Error(err)
	}
	if err := a.m.HandleMAD(now, netip.Addr{}, b.addr, make([]byte, 256), o); !errors.Is(err, ErrInvalidArgument) {
		t.Error(err)
	}
	if !o.Empty() {
		t.Error("outputs after failed calls")
	}
	var e Error = ErrTimeout
	if e.Error() == "" || Error(200).Error() == "" {
		t.Error("error text")
	}
}

// TestSIDRAndLAP: SIDR_REQ gets SIDR_REP "unsupported"; LAP for a connection gets APR
// "unsupported"; SIDR_REP and APR are dropped.
func TestSIDRAndLAP(t *testing.T) {
	s, a, b, ida, idb := connected(t)
	buf := make([]byte, MADLen)
	InitMAD(buf, AttrSIDRREQ, 77)
	SIDRREQ(buf).SetRequestID(0x42)
	SIDRREQ(buf).SetServiceID(ServiceID(PortSpaceUDP, 7))
	if err := b.m.HandleMAD(s.now, a.addr, b.addr, buf, &b.out); err != nil {
		t.Fatal(err)
	}
	r := SIDRREP(b.out.MADs[0].MAD[:])
	if b.out.MADs[0].Attr() != AttrSIDRREP || r.RequestID() != 0x42 || r.Status() != SIDRUnsupported ||
		r.ServiceID() != ServiceID(PortSpaceUDP, 7) || be64(r[8:]) != 77 {
		t.Fatalf("SIDR_REP %x", r[:48])
	}
	b.out.Reset()
	InitMAD(buf, AttrLAP, 78)
	commIDs(buf).SetLocalCommID(uint32(ida))
	commIDs(buf).SetRemoteCommID(uint32(idb))
	if err := b.m.HandleMAD(s.now, a.addr, b.addr, buf, &b.out); err != nil {
		t.Fatal(err)
	}
	ap := APR(b.out.MADs[0].MAD[:])
	if b.out.MADs[0].Attr() != AttrAPR || ap.APStatus() != APRUnsupported || ap.LocalCommID() != uint32(idb) ||
		ap.RemoteCommID() != uint32(ida) {
		t.Fatalf("APR %x", ap[:40])
	}
	b.out.Reset()
	for _, attr := range []uint16{AttrSIDRREP, AttrAPR} {
		InitMAD(buf, attr, 1)
		if err := b.m.HandleMAD(s.now, a.addr, b.addr, buf, &b.out); err != nil || !b.out.Empty() {
			t.Fatalf("%s: %v %+v", AttrName(attr), err, b.out)
		}
	}
}

func TestDuplicateREPResendsRTU(t *testing.T) {
	s, a, b := pair(t)
	rep := s.keepLast(AttrREP)
	b.ulp = acceptAll(0x11, nil, transport.ConnParam{})
	a.dial(b, port, 0x11, nil, srpParam)
	s.runFor(time.Second)
	if err := a.m.HandleMAD(s.now, b.addr, a.addr, rep[:], &a.out); err != nil {
		t.Fatal(err)
	}
	if len(a.out.MADs) != 1 || a.out.MADs[0].Attr() != AttrRTU || a.out.MADs[0].Dst != b.addr {
		t.Fatalf("answer to duplicate REP: %+v", a.out.MADs)
	}
	if len(a.out.Events) != 0 {
		t.Fatal("second ESTABLISHED")
	}
}
