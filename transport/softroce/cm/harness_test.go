package cm

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"github.com/srpd/srpd/transport"
)

// A simulated network of Managers with a fake clock: MADs travel through a queue with a fixed
// delay and an optional loss/duplication policy; timers fire through NextDeadline/Expire.
// Every QP update is validated with transport.ValidateModify against a per-QP state, so the
// Modify sequences the CM produces are legal for the verbs API.

// tb is the subset of testing.TB the harness needs (also met by *rapid.T).
type tb interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
}

type packet struct {
	at       time.Duration
	seq      uint64
	from, to netip.Addr
	mad      [MADLen]byte
}

type qpState struct {
	state transport.QPState
	attr  transport.QPAttr // accumulated
}

type node struct {
	t      tb
	net    *simnet
	name   string
	addr   netip.Addr
	m      *Manager
	out    Outputs
	events []Event // deep copies
	qps    map[uint32]*qpState
	sent   map[uint16]int // MADs sent per attribute
	// ulp is called for every event (after it is recorded); it may call the Manager.
	ulp func(n *node, e Event)
}

type simnet struct {
	t     tb
	now   time.Duration
	delay time.Duration
	seq   uint64
	queue []packet
	nodes map[netip.Addr]*node
	// drop decides the fate of a MAD: drop it, or deliver it dup+1 times.
	drop func(p *packet) bool
	dup  func(p *packet) int
	// trace of every MAD delivered / dropped
	trace []string
	// tap, if set, sees every MAD before its receiver handles it.
	tap func(p *packet, to *node)
}

func newNet(t tb) *simnet {
	return &simnet{t: t, delay: time.Millisecond, nodes: map[netip.Addr]*node{}}
}

func (s *simnet) addNode(name, addr string, guid uint64, seed uint64, mut func(*Config)) *node {
	cfg := Config{GUID: guid, Rand: rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)}
	if mut != nil {
		mut(&cfg)
	}
	m, err := NewManager(cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	n := &node{t: s.t, net: s, name: name, addr: netip.MustParseAddr(addr), m: m,
		qps: map[uint32]*qpState{}, sent: map[uint16]int{}}
	s.nodes[n.addr] = n
	return n
}

// flush processes n.out: QP updates (validated), MADs (queued), events (recorded, ULP).
func (n *node) flush() {
	o := &n.out
	qp := slices.Clone(o.QP)
	mads := slices.Clone(o.MADs)
	evs := make([]Event, len(o.Events))
	for i, e := range o.Events {
		e.PrivateData = bytes.Clone(e.PrivateData)
		e.ARI = bytes.Clone(e.ARI)
		evs[i] = e
	}
	// Timer records must be consistent with NextDeadline.
	o.Reset()
	for _, u := range qp {
		n.applyQP(u)
	}
	for i := range mads {
		om := &mads[i]
		if om.Src != n.addr {
			n.t.Fatalf("%s: MAD from %v, node address %v", n.name, om.Src, n.addr)
		}
		if _, err := Check(om.MAD[:]); err != nil {
			n.t.Fatalf("%s: we produced an invalid MAD: %v", n.name, err)
		}
		n.sent[om.Attr()]++
		n.net.send(n.addr, om.Dst, &om.MAD)
	}
	for _, e := range evs {
		n.events = append(n.events, e)
		if n.ulp != nil {
			n.ulp(n, e)
		}
	}
}

func (n *node) applyQP(u QPUpdate) {
	q := n.qps[u.QPN]
	if q == nil {
		q = &qpState{}
		n.qps[u.QPN] = q
	}
	next, err := transport.ValidateModify(q.state, &u.Attr, u.Mask, transport.ModifyLimits{
		MaxQPRdAtom: 16, MaxQPInitRdAtom: 16, MaxMTU: transport.MTU4096,
		LocalAddr: func(a netip.Addr) bool { return a == n.addr },
	})
	if err != nil {
		n.t.Fatalf("%s: QP %#x: illegal modify %v: %v", n.name, u.QPN, u.Mask, err)
	}
	if next == transport.QPSReset || next == transport.QPSErr {
		q.state = next
		return
	}
	q.attr.Set(&u.Attr, u.Mask)
	q.state = next
}

func (s *simnet) send(from, to netip.Addr, mad *[MADLen]byte) {
	s.seq++
	p := packet{at: s.now + s.delay, seq: s.seq, from: from, to: to, mad: *mad}
	name := AttrName(be16(mad[16:]))
	if s.drop != nil && s.drop(&p) {
		s.trace = append(s.trace, fmt.Sprintf("%v %v->%v %s DROPPED", s.now, from, to, name))
		return
	}
	k := 1
	if s.dup != nil {
		k += s.dup(&p)
	}
	for i := 0; i < k; i++ {
		s.queue = append(s.queue, p)
		s.seq++
		p.seq = s.seq
	}
}

// keepLast makes s keep a copy of the last MAD of attribute attr it carries (it drops none).
func (s *simnet) keepLast(attr uint16) *[MADLen]byte {
	var mad [MADLen]byte
	s.drop = func(p *packet) bool {
		if be16(p.mad[16:]) == attr {
			mad = p.mad
		}
		return false
	}
	return &mad
}

// next returns the time of the next packet arrival or timer, or false when idle.
func (s *simnet) next() (time.Duration, bool) {
	var t time.Duration
	ok := false
	for _, p := range s.queue {
		if !ok || p.at < t {
			t, ok = p.at, true
		}
	}
	for _, n := range s.sortedNodes() {
		if d, armed := n.m.NextDeadline(); armed && (!ok || d < t) {
			t, ok = d, true
		}
	}
	return t, ok
}

func (s *simnet) sortedNodes() []*node {
	ns := make([]*node, 0, len(s.nodes))
	for _, n := range s.nodes {
		ns = append(ns, n)
	}
	slices.SortFunc(ns, func(a, b *node) int { return a.addr.Compare(b.addr) })
	return ns
}

// step advances to the next event and processes everything due; false when idle or past
// limit.
func (s *simnet) step(limit time.Duration) bool {
	t, ok := s.next()
	if !ok || t > limit {
		return false
	}
	if t > s.now {
		s.now = t
	}
	// Deliver packets due, in send order.
	slices.SortStableFunc(s.queue, func(a, b packet) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return int(a.seq - b.seq)
	})
	for len(s.queue) > 0 && s.queue[0].at <= s.now {
		p := s.queue[0]
		s.queue = s.queue[1:]
		n := s.nodes[p.to]
		s.trace = append(s.trace, fmt.Sprintf("%v %v->%v %s", s.now, p.from, p.to, AttrName(be16(p.mad[16:]))))
		if n == nil {
			continue
		}
		if s.tap != nil {
			s.tap(&p, n)
		}
		if err := n.m.HandleMAD(s.now, p.from, p.to, p.mad[:], &n.out); err != nil {
			s.t.Fatalf("%s: HandleMAD: %v", n.name, err)
		}
		n.flush()
	}
	for _, n := range s.sortedNodes() {
		if d, ok := n.m.NextDeadline(); ok && d <= s.now {
			n.m.Expire(s.now, &n.out)
			n.flush()
		}
	}
	return true
}

// run processes until idle or until limit (absolute time).
func (s *simnet) run(limit time.Duration) {
	for i := 0; s.step(limit); i++ {
		if i > 1_000_000 {
			s.t.Fatal("simulation does not converge")
		}
	}
}

func (s *simnet) runFor(d time.Duration) { s.run(s.now + d) }

// helpers

func (n *node) eventsOf(id ConnID) []Event {
	var r []Event
	for _, e := range n.events {
		if e.Conn == id {
			r = append(r, e)
		}
	}
	return r
}

func kinds(evs []Event) []EventKind {
	r := make([]EventKind, len(evs))
	for i, e := range evs {
		r[i] = e.Kind
	}
	return r
}

func (n *node) dial(to *node, port uint16, qpn uint32, pd []byte, p transport.ConnParam) ConnID {
	id, err := n.m.Dial(n.net.now, &DialParams{
		LocalAddr: n.addr, RemoteAddr: to.addr, DstPort: port, QPN: qpn, PrivateData: pd, Param: p,
	}, &n.out)
	if err != nil {
		n.t.Fatalf("%s: Dial: %v", n.name, err)
	}
	n.flush()
	return id
}

// srpParam is what ib_srp (RDMA CM mode) passes to rdma_connect.
var srpParam = transport.ConnParam{ResponderResources: 4, InitiatorDepth: 0, RetryCount: 7,
	RNRRetryCount: 7, FlowControl: true}

// acceptAll returns a ULP that accepts every request with QPNs from base upwards.
func acceptAll(base uint32, pd []byte, p transport.ConnParam) func(*node, Event) {
	next := base
	return func(n *node, e Event) {
		if e.Kind != EventRequest {
			return
		}
		err := n.m.Accept(n.net.now, e.Conn, &AcceptParams{QPN: next, PrivateData: pd, Param: p}, &n.out)
		if err != nil {
			n.t.Fatalf("%s: Accept: %v", n.name, err)
		}
		next++
		n.flush()
	}
}

// checkEventInvariants: per connection, at most one Established and one Disconnected, nothing
// after a terminal event (Rejected/Unreachable releasing it, TimewaitExit), Established only
// before Disconnected.
func checkEventInvariants(t tb, n *node) {
	t.Helper()
	type st struct{ est, disc, done bool }
	m := map[ConnID]*st{}
	for _, e := range n.events {
		s := m[e.Conn]
		if s == nil {
			s = &st{}
			m[e.Conn] = s
		}
		if s.done {
			// A released connection's ID may be reused by a later REQ only after release;
			// a new Request starts a new life.
			if e.Kind == EventRequest {
				*s = st{}
			} else {
				t.Fatalf("%s: event %v for conn %#x after its final event", n.name, e.Kind, e.Conn)
			}
		}
		switch e.Kind {
		case EventEstablished:
			if s.est || s.disc {
				t.Fatalf("%s: conn %#x: second ESTABLISHED or after DISCONNECTED", n.name, e.Conn)
			}
			s.est = true
		case EventDisconnected:
			if s.disc {
				t.Fatalf("%s: conn %#x: second DISCONNECTED", n.name, e.Conn)
			}
			s.disc = true
		case EventTimewaitExit, EventUnreachable:
			s.done = true
		case EventRejected:
			// Released at once, except reason 10 (stale): timewait, then TIMEWAIT_EXIT.
			if e.Reason != transport.RejectStaleConn {
				s.done = true
			}
		}
	}
}
