package softroce

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/cm"
	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// Connection management over QP1 between two devices.

// fastCM shortens the CM timers (the kernel's are seconds long): REQ retry every 2×2 ms + 64 ms,
// REP/DREQ retry every 64 ms, timewait and QP ACK timeout ≈ 33 ms.
var fastCM = cm.Config{
	PacketLifeTime:    9,  // 2 ms
	CMResponseTimeout: 14, // 64 ms
	AckDelay:          12, // ACK timeout exponent 13: 32 ms
	MaxCMRetries:      4,
}

const cmPort = 5555

type cmPair struct {
	a, b   *node
	la, lb *link.MemLink // nil over UDP
	mtu    transport.MTU // the path MTU the REQ must offer; 0: 4096
}

func newCMPipe(t *testing.T, pc link.PipeConfig, o nodeOpts) *cmPair {
	t.Helper()
	a, b, la, lb := newPipePair(t, pc, o)
	p := &cmPair{a: a, b: b, la: la, lb: lb}
	p.configure(t, fastCM)
	t.Cleanup(p.close)
	return p
}

func newCMUDP(t *testing.T, o nodeOpts) *cmPair {
	t.Helper()
	ctx := context.Background()
	la, err := link.ListenUDP(ctx, netip.MustParseAddrPort("127.0.0.1:0"), link.UDPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lb, err := link.ListenUDP(ctx, netip.MustParseAddrPort("127.0.0.2:0"), link.UDPOptions{})
	if err != nil {
		t.Skipf("127.0.0.2: %v", err)
	}
	p := &cmPair{a: newNode(t, la, o), b: newNode(t, lb, o)}
	p.configure(t, fastCM)
	// a dials b: a must know b's port; b answers at the port a's MADs come from.
	p.a.dev.SetPeerUDPPort(p.b.addr.Addr(), p.b.addr.Port())
	t.Cleanup(p.close)
	return p
}

func (p *cmPair) configure(t *testing.T, cfg cm.Config) {
	t.Helper()
	for _, n := range []*node{p.a, p.b} {
		if err := n.dev.ConfigureCM(cfg); err != nil {
			t.Fatal(err)
		}
	}
}

func (p *cmPair) close() {
	p.a.close()
	p.b.close()
}

// newQP creates another RC QP on n (its CQs).
func (n *node) newQP(t testing.TB, depth int) transport.QP {
	t.Helper()
	q, err := n.pd.CreateQP(transport.QPInitAttr{SendCQ: n.scq, RecvCQ: n.rcq,
		Cap: transport.QPCap{MaxSendWR: depth, MaxRecvWR: depth, MaxSendSGE: 2, MaxRecvSGE: 2}})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

var rdParam = transport.ConnParam{ResponderResources: 4, InitiatorDepth: 4, FlowControl: true}

// listenCM listens on n's device at addr (the zero Addr: every address) and port, closing the
// listener when t ends.
func listenCM(t *testing.T, n *node, addr netip.Addr, port uint16) transport.Listener {
	t.Helper()
	l, err := n.dev.Listen(addr, port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

type dialRes struct {
	conn transport.CMConn
	err  error
}

func goDial(ctx context.Context, n *node, to netip.Addr, port uint16, qp transport.QP, pd []byte, prm transport.ConnParam) chan dialRes {
	ch := make(chan dialRes, 1)
	go func() {
		c, err := n.dev.Dial(ctx, netip.AddrPortFrom(to, port), qp, pd, prm)
		ch <- dialRes{c, err}
	}()
	return ch
}

// connectCM connects a.qp to b.qp through the CM (b listens, a dials) and returns both ends.
func connectCM(t *testing.T, p *cmPair, dialPD, acceptPD []byte) (ca, cb transport.CMConn) {
	t.Helper()
	l := listenCM(t, p.b, netip.Addr{}, cmPort)
	ctx := ctxT(t, 10*time.Second)
	dch := goDial(ctx, p.a, p.b.addr.Addr(), cmPort, p.a.qp, dialPD, rdParam)
	req, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(req.PrivateData(), dialPD) || len(req.PrivateData()) != transport.MaxDialPrivateData {
		t.Fatalf("request private data %x; want %x + zeros", req.PrivateData(), dialPD)
	}
	info := req.Info()
	// Loopback's 65536-byte MTU: the kernel would offer 4096 as well (iboe_get_mtu).
	if info.RemoteQPN != p.a.qp.QPN() || info.PathMTU != cmp.Or(p.mtu, transport.MTU4096) || info.PacketSrc != p.a.addr.Addr() ||
		info.PacketDst != p.b.addr.Addr() || info.RemoteAddr.Addr() != p.a.addr.Addr() || info.LocalAddr != netip.AddrPortFrom(p.b.addr.Addr(), cmPort) ||
		info.ResponderResources != 4 || info.InitiatorDepth != 4 || !info.FlowControl {
		t.Fatalf("request info %+v", info)
	}
	cb, err = req.Accept(ctx, p.b.qp, acceptPD, rdParam)
	if err != nil {
		t.Fatal(err)
	}
	r := <-dch
	if r.err != nil {
		t.Fatal(r.err)
	}
	ca = r.conn
	if !bytes.HasPrefix(ca.PrivateData(), acceptPD) || len(ca.PrivateData()) != transport.MaxAcceptPrivateData {
		t.Fatalf("REP private data %x", ca.PrivateData())
	}
	if ca.QP() != p.a.qp || cb.QP() != p.b.qp || p.a.qp.State() != transport.QPSRTS || p.b.qp.State() != transport.QPSRTS {
		t.Fatalf("QPs %v %v", p.a.qp.State(), p.b.qp.State())
	}
	if ca.RemoteAddr() != cb.LocalAddr() || ca.LocalAddr() != cb.RemoteAddr() || ca.LocalAddr().Port() == 0 {
		t.Fatalf("endpoints: dialler %v→%v, acceptor %v←%v", ca.LocalAddr(), ca.RemoteAddr(), cb.LocalAddr(), cb.RemoteAddr())
	}
	// PSN direction: a's first send PSN is b's expected PSN and vice versa.
	qa, qb := p.a.qp.Query(), p.b.qp.Query()
	if qa.SQPSN != qb.RQPSN || qb.SQPSN != qa.RQPSN || qa.DestQPN != p.b.qp.QPN() || qb.DestQPN != p.a.qp.QPN() {
		t.Fatalf("PSNs/QPNs: a sq %#x rq %#x dest %#x; b sq %#x rq %#x dest %#x", qa.SQPSN, qa.RQPSN, qa.DestQPN, qb.SQPSN, qb.RQPSN, qb.DestQPN)
	}
	return ca, cb
}

// rcTraffic moves data both ways over connected QPs: SEND/RECV, RDMA WRITE and RDMA READ.
func rcTraffic(t *testing.T, x, y *node, xqp, yqp transport.QP) {
	t.Helper()
	const n = 5000 // several 1024-byte packets
	for _, dir := range [][2]*node{{x, y}, {y, x}} {
		s, r := dir[0], dir[1]
		sq, rq := xqp, yqp
		if s == y {
			sq, rq = yqp, xqp
		}
		fill(s.bytes(0, n), uint64(s.qp.QPN()))
		if err := rq.PostRecv([]transport.RecvWR{{ID: 10, SGL: []transport.SGE{r.sge(1<<16, 8192)}}}); err != nil {
			t.Fatal(err)
		}
		if err := sq.PostSend([]transport.SendWR{
			{ID: 1, Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: []transport.SGE{s.sge(0, n)}},
			{ID: 2, Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled, SGL: []transport.SGE{s.sge(0, n)},
				RemoteAddr: r.mem.Addr() + 2<<16, RKey: r.mr.RKey()},
			{ID: 3, Opcode: transport.WRRDMARead, Flags: transport.SendSignaled, SGL: []transport.SGE{s.sge(3<<16, n)},
				RemoteAddr: r.mem.Addr() + 2<<16, RKey: r.mr.RKey()},
		}); err != nil {
			t.Fatal(err)
		}
		wantWC(t, waitWC(t, s.scq, 5*time.Second), 1, transport.WCSuccess, transport.WCSend)
		wantWC(t, waitWC(t, s.scq, 5*time.Second), 2, transport.WCSuccess, transport.WCRDMAWrite)
		wantWC(t, waitWC(t, s.scq, 5*time.Second), 3, transport.WCSuccess, transport.WCRDMARead)
		wc := waitWC(t, r.rcq, 5*time.Second)
		wantWC(t, wc, 10, transport.WCSuccess, transport.WCRecv)
		if wc.ByteLen != n {
			t.Fatalf("recv %d bytes", wc.ByteLen)
		}
		equal(t, "send", r.bytes(1<<16, n), s.bytes(0, n))
		equal(t, "write", r.bytes(2<<16, n), s.bytes(0, n))
		equal(t, "read", s.bytes(3<<16, n), s.bytes(0, n))
	}
}

func nextEvent(t *testing.T, c transport.CMConn, want transport.CMEventType) transport.CMEvent {
	t.Helper()
	select {
	case e, ok := <-c.Events():
		if !ok {
			t.Fatalf("events closed; want %v", want)
		}
		if e.Type != want {
			t.Fatalf("event %v (%+v); want %v", e.Type, e, want)
		}
		return e
	case <-time.After(5 * time.Second):
		t.Fatalf("no %v event", want)
	}
	return transport.CMEvent{}
}

func expectClosed(t *testing.T, c transport.CMConn) {
	t.Helper()
	select {
	case e, ok := <-c.Events():
		if ok {
			t.Fatalf("event %v after timewait exit", e.Type)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("events not closed after timewait exit")
	}
}

func TestCMConnectTrafficDisconnect(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mk       func(t *testing.T) *cmPair
		fromPeer bool
	}{
		{"pipe/active-disconnects", func(t *testing.T) *cmPair { return newCMPipe(t, link.PipeConfig{}, nodeOpts{}) }, false},
		{"pipe/passive-disconnects", func(t *testing.T) *cmPair { return newCMPipe(t, link.PipeConfig{}, nodeOpts{}) }, true},
		{"udp/active-disconnects", func(t *testing.T) *cmPair { return newCMUDP(t, nodeOpts{}) }, false},
		{"udp/passive-disconnects", func(t *testing.T) *cmPair { return newCMUDP(t, nodeOpts{}) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.mk(t)
			ca, cb := connectCM(t, p, []byte("login request"), []byte("login response"))
			rcTraffic(t, p.a, p.b, p.a.qp, p.b.qp)
			x, y := ca, cb
			if tc.fromPeer {
				x, y = cb, ca
			}
			if err := x.Disconnect([]byte("bye")); err != nil {
				t.Fatal(err)
			}
			if err := x.Disconnect(nil); err != nil { // idempotent
				t.Fatal(err)
			}
			if st := x.QP().State(); st != transport.QPSErr {
				t.Fatalf("disconnecting QP in %v", st)
			}
			e := nextEvent(t, y, transport.CMEventDisconnected)
			if !bytes.HasPrefix(e.PrivateData, []byte("bye")) {
				t.Fatalf("DREQ private data %x", e.PrivateData)
			}
			nextEvent(t, x, transport.CMEventDisconnected) // DREP
			if st := y.QP().State(); st != transport.QPSErr {
				t.Fatalf("disconnected QP in %v", st)
			}
			nextEvent(t, x, transport.CMEventTimewaitExit)
			nextEvent(t, y, transport.CMEventTimewaitExit)
			expectClosed(t, x)
			expectClosed(t, y)
			if err := y.Disconnect(nil); err != nil { // after timewait: no-op
				t.Fatal(err)
			}
			for _, n := range []*node{p.a, p.b} {
				n.dev.mu.Lock()
				nc, nr := n.dev.cm.mgr.NumConns(), len(n.dev.cm.conns)
				n.dev.mu.Unlock()
				if nc != 0 || nr != 0 {
					t.Fatalf("%s: %d CM connections, %d records left", n.dev.Name(), nc, nr)
				}
			}
		})
	}
}

func TestCMRejectWithPrivateData(t *testing.T) {
	p := newCMPipe(t, link.PipeConfig{}, nodeOpts{})
	l := listenCM(t, p.b, p.b.addr.Addr(), cmPort)
	ctx := ctxT(t, 10*time.Second)
	dch := goDial(ctx, p.a, p.b.addr.Addr(), cmPort, p.a.qp, []byte("please"), transport.ConnParam{})
	req, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rej := bytes.Repeat([]byte{0xA5}, transport.MaxRejectPrivateData)
	if err := req.Reject(rej, transport.RejectConsumerDefined); err != nil {
		t.Fatal(err)
	}
	if err := req.Reject(nil, 0); !errors.Is(err, errAnswered) {
		t.Fatalf("second reject: %v", err)
	}
	r := <-dch
	var re *transport.RejectError
	if !errors.As(r.err, &re) || !errors.Is(r.err, transport.ErrConnRejected) || re.Reason != transport.RejectConsumerDefined ||
		!bytes.Equal(re.PrivateData, rej) {
		t.Fatalf("dial: %v", r.err)
	}
	if st := p.a.qp.State(); st != transport.QPSErr {
		t.Fatalf("rejected QP in %v", st)
	}
}

func TestCMNoListenerRejects(t *testing.T) {
	p := newCMPipe(t, link.PipeConfig{}, nodeOpts{})
	start := time.Now()
	_, err := p.a.dev.Dial(ctxT(t, 10*time.Second), netip.AddrPortFrom(p.b.addr.Addr(), 4242), p.a.qp, nil, transport.ConnParam{})
	var re *transport.RejectError
	if !errors.As(err, &re) || re.Reason != transport.RejectInvalidServiceID {
		t.Fatalf("dial to a port nobody listens on: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("REJ took %v", d)
	}
	// Listeners: a device address or the wildcard (both at once is fine); not twice, not on a
	// foreign address.
	listenCM(t, p.b, p.b.addr.Addr(), 4242)
	if _, err := p.b.dev.Listen(netip.Addr{}, 4242); err != nil { // wildcard besides: fine
		t.Fatal(err)
	}
	if _, err := p.b.dev.Listen(p.b.addr.Addr(), 4242); !errors.Is(err, transport.ErrBusy) {
		t.Fatalf("second listen: %v", err)
	}
	if _, err := p.b.dev.Listen(netip.MustParseAddr("192.0.2.1"), 4242); !errors.Is(err, transport.ErrInvalidArgument) {
		t.Fatalf("listen on a foreign address: %v", err)
	}
}

func TestCMDialUnreachableAndCancel(t *testing.T) {
	p := newCMPipe(t, link.PipeConfig{}, nodeOpts{})
	var reqs atomic.Int32
	p.la.SetFilter(func(pk *link.Packet) link.Action {
		reqs.Add(1)
		return link.Drop // everything a sends is lost
	})
	start := time.Now()
	_, err := p.a.dev.Dial(ctxT(t, 10*time.Second), netip.AddrPortFrom(p.b.addr.Addr(), cmPort), p.a.qp, nil, transport.ConnParam{})
	if !errors.Is(err, transport.ErrConnUnreachable) {
		t.Fatalf("dial into the void: %v", err)
	}
	// 1 + MaxCMRetries REQs, 68 ms apart.
	if n := reqs.Load(); n != 1+int32(fastCM.MaxCMRetries) {
		t.Fatalf("%d REQs sent; want %d", n, 1+fastCM.MaxCMRetries)
	}
	if d := time.Since(start); d < 5*68*time.Millisecond || d > 5*time.Second {
		t.Fatalf("unreachable after %v", d)
	}

	// Cancellation: the attempt is aborted with a REJ (reason timeout, ARI = our GUID) that
	// kills the request on the listener's side.
	p.la.SetFilter(nil)
	l := listenCM(t, p.b, netip.Addr{}, cmPort)
	q := p.a.newQP(t, 8)
	ctx, cancel := context.WithCancel(context.Background())
	dch := goDial(ctx, p.a, p.b.addr.Addr(), cmPort, q, nil, transport.ConnParam{})
	req, err := l.Accept(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if r := <-dch; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled dial: %v", r.err)
	}
	// The REJ arrives shortly: Accept must then fail.
	var aerr error
	for i := 0; i < 100; i++ {
		p.b.dev.mu.Lock()
		dead := req.(*connRequest).dead
		p.b.dev.mu.Unlock()
		if dead {
			_, aerr = req.Accept(ctxT(t, time.Second), p.b.qp, nil, transport.ConnParam{})
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var re *transport.RejectError
	if !errors.As(aerr, &re) || re.Reason != transport.RejectTimeout {
		t.Fatalf("accept of an abandoned request: %v", aerr)
	}
}

// REQ loss (retransmission), REP loss (duplicate REQ answered with the REP again), duplicates of
// every packet (one request only, one connection).
func TestCMLossAndDuplicates(t *testing.T) {
	attrOf := func(pk *link.Packet) uint16 {
		p, err := wire.Parse(pk.Buf)
		if err != nil || p.MAD() == nil {
			return 0
		}
		return p.MAD().AttributeID()
	}
	for _, tc := range []struct {
		name    string
		dropA   uint16 // attribute whose first copies a drops
		dropB   uint16
		n       int
		pc      link.PipeConfig
		minTime time.Duration
		maxTime time.Duration
		slowREP bool // the dialler asks for a 4 s CM response timeout: the acceptor's REP retry is 4 s
	}{
		{name: "REQ-lost-twice", dropA: cm.AttrREQ, n: 2, minTime: 2 * 68 * time.Millisecond},
		{name: "REP-lost-twice", dropB: cm.AttrREP, n: 2, minTime: 64 * time.Millisecond},
		{name: "RTU-lost", dropA: cm.AttrRTU, n: 1, slowREP: true, maxTime: 3 * time.Second},
		{name: "all-duplicated", pc: link.PipeConfig{AtoB: link.Faults{Duplicate: 1}, BtoA: link.Faults{Duplicate: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newCMPipe(t, tc.pc, nodeOpts{})
			if tc.slowREP {
				cfg := fastCM
				cfg.CMResponseTimeout = 20
				if err := p.a.dev.ConfigureCM(cfg); err != nil {
					t.Fatal(err)
				}
			}
			var droppedA, droppedB atomic.Int32
			filter := func(attr uint16, ctr *atomic.Int32) link.Filter {
				return func(pk *link.Packet) link.Action {
					if attr != 0 && attrOf(pk) == attr && int(ctr.Load()) < tc.n {
						ctr.Add(1)
						return link.Drop
					}
					return link.Pass
				}
			}
			p.la.SetFilter(filter(tc.dropA, &droppedA))
			p.lb.SetFilter(filter(tc.dropB, &droppedB))
			// The acceptor posts a receive before accepting, so the dialler's first SEND (which
			// establishes the connection when the RTU is lost) is not RNR-NAKed.
			if err := p.b.qp.Modify(&transport.QPAttr{State: transport.QPSInit, Port: 1}, transport.AttrState|transport.AttrPort|transport.AttrPKeyIndex|transport.AttrAccessFlags); err != nil {
				t.Fatal(err)
			}
			if err := p.b.qp.PostRecv([]transport.RecvWR{{ID: 99, SGL: []transport.SGE{p.b.sge(0, 4096)}}}); err != nil {
				t.Fatal(err)
			}
			l := listenCM(t, p.b, netip.Addr{}, cmPort)
			ctx := ctxT(t, 10*time.Second)
			start := time.Now()
			dch := goDial(ctx, p.a, p.b.addr.Addr(), cmPort, p.a.qp, []byte{1}, rdParam)
			req, err := l.Accept(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ach := make(chan dialRes, 1)
			go func() {
				c, err := req.Accept(ctx, p.b.qp, []byte{2}, rdParam)
				ach <- dialRes{c, err}
			}()
			r := <-dch
			if r.err != nil {
				t.Fatal(r.err)
			}
			{
				// With the RTU lost, the first RC packet (COMM_EST) establishes the connection,
				// long before the first REP retransmission (4 s) would provoke a second RTU.
				if err := p.a.qp.PostSend([]transport.SendWR{{ID: 5, Opcode: transport.WRSend, SGL: []transport.SGE{p.a.sge(0, 16)}}}); err != nil {
					t.Fatal(err)
				}
			}
			ar := <-ach
			if ar.err != nil {
				t.Fatal(ar.err)
			}
			el := time.Since(start)
			if el < tc.minTime || (tc.maxTime > 0 && el > tc.maxTime) {
				t.Fatalf("connected after %v; want %v..%v", el, tc.minTime, tc.maxTime)
			}
			wantWC(t, waitWC(t, p.b.rcq, 5*time.Second), 99, transport.WCSuccess, transport.WCRecv)
			if int(droppedA.Load()) != tc.n*b2i(tc.dropA != 0) || int(droppedB.Load()) != tc.n*b2i(tc.dropB != 0) {
				t.Fatalf("dropped %d/%d", droppedA.Load(), droppedB.Load())
			}
			// No second request for the duplicates / retransmissions.
			sctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			defer cancel()
			if extra, err := l.Accept(sctx); err == nil {
				t.Fatalf("second request %+v", extra.Info())
			}
			rcTraffic(t, p.a, p.b, p.a.qp, p.b.qp)
			if err := r.conn.Disconnect(nil); err != nil {
				t.Fatal(err)
			}
			nextEvent(t, ar.conn, transport.CMEventDisconnected)
			nextEvent(t, r.conn, transport.CMEventDisconnected)
			nextEvent(t, ar.conn, transport.CMEventTimewaitExit)
			nextEvent(t, r.conn, transport.CMEventTimewaitExit)
		})
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestCMSimultaneousDisconnect(t *testing.T) {
	p := newCMPipe(t, link.PipeConfig{}, nodeOpts{})
	ca, cb := connectCM(t, p, nil, nil)
	var wg sync.WaitGroup
	for _, c := range []transport.CMConn{ca, cb} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Disconnect(nil); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for _, c := range []transport.CMConn{ca, cb} {
		nextEvent(t, c, transport.CMEventDisconnected)
		nextEvent(t, c, transport.CMEventTimewaitExit)
		expectClosed(t, c)
	}
}

func TestCMListenerCloseRejectsPending(t *testing.T) {
	p := newCMPipe(t, link.PipeConfig{}, nodeOpts{})
	l, err := p.b.dev.Listen(netip.Addr{}, cmPort)
	if err != nil {
		t.Fatal(err)
	}
	dch := goDial(ctxT(t, 10*time.Second), p.a, p.b.addr.Addr(), cmPort, p.a.qp, nil, transport.ConnParam{})
	// Wait until the request is queued, then close without accepting.
	for i := 0; len(l.(*listener).ch) == 0; i++ {
		if i > 500 {
			t.Fatal("no request queued")
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Accept(context.Background()); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("accept after close: %v", err)
	}
	var re *transport.RejectError
	if r := <-dch; !errors.As(r.err, &re) || re.Reason != transport.RejectConsumerDefined {
		t.Fatalf("dial: %v", r.err)
	}
	// The port is free again; dialling now gets REJ 8.
	_, err = p.a.dev.Dial(ctxT(t, 5*time.Second), netip.AddrPortFrom(p.b.addr.Addr(), cmPort), p.a.newQP(t, 4), nil, transport.ConnParam{})
	if !errors.As(err, &re) || re.Reason != transport.RejectInvalidServiceID {
		t.Fatalf("dial after close: %v", err)
	}
}

// 256 connections dialled at once to one listener: each gets its own QPN and comm ID, each
// carries a SEND.
func TestCMManyConcurrent(t *testing.T) {
	const n = 256
	p := newCMPipe(t, link.PipeConfig{QueueLen: 4096}, nodeOpts{cqDepth: 8 * n})
	// Generous retries: 256 handshakes at once under the race detector on 2 cores.
	cfg := fastCM
	cfg.CMResponseTimeout, cfg.MaxCMRetries = 17, 8 // 512 ms
	p.configure(t, cfg)
	l := listenCM(t, p.b, netip.Addr{}, cmPort)
	ctx := ctxT(t, 30*time.Second)
	aq, bq := make([]transport.QP, n), make([]transport.QP, n)
	for i := range aq {
		aq[i], bq[i] = p.a.newQP(t, 4), p.b.newQP(t, 4)
	}
	accepted := make(chan transport.CMConn, n)
	go func() {
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			req, err := l.Accept(ctx)
			if err != nil {
				t.Error(err)
				break
			}
			wg.Add(1)
			go func(q transport.QP) {
				defer wg.Done()
				// Post a receive first (INIT), as a target does.
				if err := q.Modify(&transport.QPAttr{State: transport.QPSInit, Port: 1}, transport.AttrState|transport.AttrPort|transport.AttrPKeyIndex|transport.AttrAccessFlags); err != nil {
					t.Error(err)
					return
				}
				if err := q.PostRecv([]transport.RecvWR{{ID: uint64(q.QPN()), SGL: []transport.SGE{p.b.sge(0, 64)}}}); err != nil {
					t.Error(err)
					return
				}
				c, err := req.Accept(ctx, q, req.PrivateData()[:4], transport.ConnParam{})
				if err != nil {
					t.Error(err)
					return
				}
				accepted <- c
			}(bq[i])
		}
		wg.Wait()
	}()
	var wg sync.WaitGroup
	conns := make([]transport.CMConn, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			pd := []byte{byte(i >> 8), byte(i), 0xC0, 0xDE}
			c, err := p.a.dev.Dial(ctx, netip.AddrPortFrom(p.b.addr.Addr(), cmPort), aq[i], pd, transport.ConnParam{})
			if err != nil {
				t.Error(err)
				return
			}
			if !bytes.HasPrefix(c.PrivateData(), pd) {
				t.Errorf("conn %d: REP private data %x", i, c.PrivateData()[:4])
			}
			conns[i] = c
			if err := aq[i].PostSend([]transport.SendWR{{ID: uint64(i), Opcode: transport.WRSend, Flags: transport.SendSignaled,
				SGL: []transport.SGE{p.a.sge(0, 64)}}}); err != nil {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	qpns := map[uint32]bool{}
	for i := 0; i < n; i++ {
		c := <-accepted
		if qpns[c.QP().QPN()] {
			t.Fatalf("QPN %#x twice", c.QP().QPN())
		}
		qpns[c.QP().QPN()] = true
	}
	// Distinct comm IDs on both sides.
	for _, nd := range []*node{p.a, p.b} {
		nd.dev.mu.Lock()
		if got := len(nd.dev.cm.conns); got != n {
			nd.dev.mu.Unlock()
			t.Fatalf("%s: %d connection records; want %d", nd.dev.Name(), got, n)
		}
		nd.dev.mu.Unlock()
	}
	for i := 0; i < n; i++ {
		wc := waitWC(t, p.a.scq, 10*time.Second)
		if wc.Status != transport.WCSuccess {
			t.Fatalf("send completion %+v", wc)
		}
		if wc := waitWC(t, p.b.rcq, 10*time.Second); wc.Status != transport.WCSuccess || wc.ByteLen != 64 {
			t.Fatalf("recv completion %+v", wc)
		}
	}
	for _, c := range conns {
		if err := c.Disconnect(nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		nextEvent(t, c, transport.CMEventDisconnected)
		nextEvent(t, c, transport.CMEventTimewaitExit)
	}
}

// The REQ we send looks like the kernel's RoCE REQ (cma_resolve_iboe_route + cm_format_req) and
// travels as a UD SEND_ONLY to QP1.
func TestCMDialREQFormat(t *testing.T) {
	p := newCMPipe(t, link.PipeConfig{}, nodeOpts{})
	type seen struct {
		pkt  link.Packet
		data []byte
	}
	got := make(chan seen, 16)
	p.la.SetFilter(func(pk *link.Packet) link.Action {
		got <- seen{*pk, append([]byte(nil), pk.Buf...)}
		return link.Drop
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dch := goDial(ctx, p.a, p.b.addr.Addr(), 0x15B3, p.a.qp, []byte("srp"), transport.ConnParam{
		ResponderResources: 4, InitiatorDepth: 0, RetryCount: 7, RNRRetryCount: 7, FlowControl: true})
	s := <-got
	cancel()
	<-dch
	if s.pkt.Dst.Port() != 4791 || s.pkt.Dst.Addr() != p.b.addr.Addr() || s.pkt.Src.Addr() != p.a.addr.Addr() {
		t.Fatalf("REQ %v → %v", s.pkt.Src, s.pkt.Dst)
	}
	pk, err := wire.Parse(s.data)
	if err != nil {
		t.Fatal(err)
	}
	bth := pk.BTH()
	if pk.Opcode() != wire.UDSendOnly || bth.PKey() != 0xFFFF || bth.DestQP() != 1 || !bth.AckReq() ||
		pk.DETH().QKey() != wire.GSIQKey || pk.DETH().SrcQP() != 1 || pk.PayloadLen() != 256 || bth.PadCount() != 0 {
		t.Fatalf("UD packet: %+v %+v len %d", bth.Fields(), pk.DETH().Fields(), pk.PayloadLen())
	}
	r, err := cm.ParseREQ(pk.Payload())
	if err != nil {
		t.Fatal(err)
	}
	f := r.Fields()
	pp := r.PrimaryPath()
	mapped := func(a netip.Addr) [16]byte { return netip.AddrFrom16(a.As16()).As16() }
	if f.ServiceID != 0x00000000010615B3 || f.LocalQPN != p.a.qp.QPN() || f.ResponderResources != 4 ||
		f.InitiatorDepth != 0 || f.RetryCount != 7 || f.RNRRetryCount != 7 || !f.EndToEndFlowControl ||
		f.PartitionKey != 0xFFFF || f.PathMTU != uint8(transport.MTU4096) || f.TransportServiceType != 0 ||
		f.MaxCMRetries != fastCM.MaxCMRetries || f.LocalCMResponseTimeout != fastCM.CMResponseTimeout ||
		f.RemoteCMResponseTimeout != fastCM.CMResponseTimeout || f.LocalCommID == 0 {
		t.Fatalf("REQ fields %+v", f)
	}
	lg, rg := pp.LocalGID(), pp.RemoteGID()
	if lg != mapped(p.a.addr.Addr()) || rg != mapped(p.b.addr.Addr()) || lg[10] != 0xFF || lg[11] != 0xFF ||
		pp.LocalLID() != 0xFFFF || pp.RemoteLID() != 0xFFFF || pp.SubnetLocal() || pp.HopLimit() != 64 {
		t.Fatalf("path: GIDs %x %x LIDs %#x %#x hop %d", lg, rg, pp.LocalLID(), pp.RemoteLID(), pp.HopLimit())
	}
	h, err := cm.ParseCMAHeader(r.PrivateData())
	if err != nil {
		t.Fatal(err)
	}
	if h.IPVersion() != 4 || h.SrcAddr() != p.a.addr.Addr() || h.DstAddr() != p.b.addr.Addr() || h.SrcPort() < 32768 ||
		pp.FlowLabel() != cm.FlowLabel(h.SrcPort(), 0x15B3) || !bytes.HasPrefix(r.PrivateData()[cm.CMAHeaderLen:], []byte("srp")) {
		t.Fatalf("RDMA CM header %x (flow label %#x)", []byte(h), pp.FlowLabel())
	}
}

// QP1 drops what rxe drops, counts it, and survives garbage.
func TestCMQP1Filtering(t *testing.T) {
	p := newCMPipe(t, link.PipeConfig{}, nodeOpts{})
	mk := func(op wire.Opcode, qpn, qkey uint32, pkey uint16, n int, mad func([]byte)) link.Packet {
		buf := make([]byte, link.MaxPacket)
		pk, err := wire.Layout(buf, op, n)
		if err != nil {
			t.Fatal(err)
		}
		pk.BTH().SetDestQP(qpn)
		pk.BTH().SetPKey(pkey)
		if d := pk.DETH(); d != nil {
			d.SetQKey(qkey)
			d.SetSrcQP(1)
		}
		if mad != nil {
			mad(pk.Payload())
		}
		return link.Packet{Buf: pk.Bytes()}
	}
	valid := func(b []byte) { cm.InitMAD(b, cm.AttrDREQ, 1) }
	before := p.b.dev.CMStats()
	if _, err := p.lb.Inject(false,
		mk(wire.UDSendOnly, 1, 0x12345678, 0xFFFF, 256, valid),                         // bad Q_Key
		mk(wire.UDSendOnly, 1, wire.GSIQKey, 0x1234, 256, valid),                       // bad P_Key
		mk(wire.UDSendOnly, 7, wire.GSIQKey, 0xFFFF, 256, valid),                       // no UD QP 7
		mk(wire.UDSendOnlyWithImmediate, 1, wire.GSIQKey, 0xFFFF, 256, valid),          // not SEND_ONLY
		mk(wire.UDSendOnly, 1, wire.GSIQKey, 0xFFFF, 128, nil),                         // short
		mk(wire.UDSendOnly, 1, wire.GSIQKey, 0xFFFF, 256, func(b []byte) { b[0] = 9 }), // malformed MAD
		mk(wire.UDSendOnly, 1, wire.GSIQKey, 0x7FFF, 256, valid),                       // limited-member P_Key matches; DREQ for nobody → DREP
	); err != nil {
		t.Fatal(err)
	}
	want := CMStats{RxBadQKey: 1, RxBadPKey: 1, RxDropped: 3, RxMalformed: 1, RxMADs: 1, TxMADs: 1}
	var st CMStats
	for i := 0; i < 200; i++ {
		st = p.b.dev.CMStats()
		st.RxBadQKey -= before.RxBadQKey
		st.RxBadPKey -= before.RxBadPKey
		st.RxDropped -= before.RxDropped
		st.RxMalformed -= before.RxMalformed
		st.RxMADs -= before.RxMADs
		st.TxMADs -= before.TxMADs
		if st == want {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("QP1 counters %+v; want %+v", st, want)
}

// QPNs are not reused soon: the stale-connection guard of the peer's CM keys on them.
func TestCMFreshQPNs(t *testing.T) {
	p := newCMPipe(t, link.PipeConfig{}, nodeOpts{})
	seen := map[uint32]bool{p.a.qp.QPN(): true}
	for i := 0; i < 100; i++ {
		q := p.a.newQP(t, 2)
		if seen[q.QPN()] {
			t.Fatalf("QPN %#x reused", q.QPN())
		}
		seen[q.QPN()] = true
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// A reconnect after a disconnect uses a new QP and a new comm ID and is accepted while the old
// connection may still be in timewait.
func TestCMReconnect(t *testing.T) {
	p := newCMPipe(t, link.PipeConfig{}, nodeOpts{})
	l := listenCM(t, p.b, netip.Addr{}, cmPort)
	ctx := ctxT(t, 10*time.Second)
	var ids []uint32
	for i := 0; i < 3; i++ {
		aq, bq := p.a.newQP(t, 4), p.b.newQP(t, 4)
		dch := goDial(ctx, p.a, p.b.addr.Addr(), cmPort, aq, nil, rdParam)
		req, err := l.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cb, err := req.Accept(ctx, bq, nil, rdParam)
		if err != nil {
			t.Fatal(err)
		}
		r := <-dch
		if r.err != nil {
			t.Fatal(r.err)
		}
		ids = append(ids, uint32(r.conn.(*cmConn).id))
		rcTraffic(t, p.a, p.b, aq, bq)
		if err := r.conn.Disconnect(nil); err != nil {
			t.Fatal(err)
		}
		nextEvent(t, cb, transport.CMEventDisconnected)
	}
	if ids[0] == ids[1] || ids[1] == ids[2] || ids[0] == ids[2] {
		t.Fatalf("comm IDs %x", ids)
	}
}

// An MRA makes the dialler wait longer than its REQ retries would (68 ms × 5 here).
func TestCMMRAExtendsTimeout(t *testing.T) {
	p := newCMPipe(t, link.PipeConfig{}, nodeOpts{})
	l := listenCM(t, p.b, netip.Addr{}, cmPort)
	ctx := ctxT(t, 10*time.Second)
	dch := goDial(ctx, p.a, p.b.addr.Addr(), cmPort, p.a.qp, nil, transport.ConnParam{})
	req, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := req.MRA(20, []byte("wait")); err != nil { // 4.096 s more
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond)
	select {
	case r := <-dch:
		t.Fatalf("dial ended during the MRA's grace: %v", r.err)
	default:
	}
	cb, err := req.Accept(ctx, p.b.qp, nil, transport.ConnParam{})
	if err != nil {
		t.Fatal(err)
	}
	r := <-dch
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := cb.Disconnect(nil); err != nil {
		t.Fatal(err)
	}
	nextEvent(t, r.conn, transport.CMEventDisconnected)
}

// Device.Close releases everything waiting on the CM.
func TestCMDeviceCloseUnblocks(t *testing.T) {
	a, b := pipeAddrs()
	la, lb := link.NewPipe(a, b, link.PipeConfig{})
	na, nb := newNode(t, la, nodeOpts{}), newNode(t, lb, nodeOpts{})
	defer nb.close()
	l, err := na.dev.Listen(netip.Addr{}, cmPort)
	if err != nil {
		t.Fatal(err)
	}
	lb.SetFilter(func(*link.Packet) link.Action { return link.Drop })
	dch := goDial(context.Background(), na, b, cmPort, na.qp, nil, transport.ConnParam{}) // REQ into the void
	ach := make(chan error, 1)
	go func() { _, err := l.Accept(context.Background()); ach <- err }()
	time.Sleep(20 * time.Millisecond)
	na.close()
	if r := <-dch; !errors.Is(r.err, transport.ErrClosed) {
		t.Fatalf("dial: %v", r.err)
	}
	if err := <-ach; !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("listener accept: %v", err)
	}
	if _, err := na.dev.Listen(netip.Addr{}, 1); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("listen after close: %v", err)
	}
}

// TestCMDisconnectThenDeviceClose: a DREQ sent right before Device.Close still goes out (Close
// drains the queued MADs), so the peer learns of the disconnect (a target that logs its
// channels out on shutdown).
func TestCMDisconnectThenDeviceClose(t *testing.T) {
	for i := 0; i < 20; i++ {
		p := newCMUDP(t, nodeOpts{})
		ca, cb := connectCM(t, p, nil, nil)
		if err := cb.Disconnect(nil); err != nil {
			t.Fatal(err)
		}
		p.b.close()
		nextEvent(t, ca, transport.CMEventDisconnected)
		p.a.close()
	}
}

// TestIboeMTU: the path MTU offered for an interface MTU follows the kernel's iboe_get_mtu
// (interface MTU less 96 bytes of headers, rounded down to an IB MTU).
func TestIboeMTU(t *testing.T) {
	for _, tc := range []struct {
		ifMTU int
		want  transport.MTU
	}{
		{65536, transport.MTU4096}, // lo
		{9000, transport.MTU4096},
		{4192, transport.MTU4096},
		{4191, transport.MTU2048},
		{1500, transport.MTU1024}, // Ethernet: what rxe uses
		{1119, transport.MTU512},
		{608, transport.MTU512},
		{607, transport.MTU256},
		{300, transport.MTU256},
	} {
		if got := iboeMTU(tc.ifMTU); got != tc.want {
			t.Errorf("iboeMTU(%d) = %v, want %v", tc.ifMTU, got, tc.want)
		}
	}
	if got := ifaceMTU(netip.MustParseAddr("127.0.0.1")); got != transport.MTU4096 {
		t.Errorf("ifaceMTU(127.0.0.1) = %v, want 4096 (lo's MTU is 65536)", got)
	}
	if got := ifaceMTU(netip.MustParseAddr("192.0.2.77")); got != transport.MTU1024 {
		t.Errorf("ifaceMTU of an address on no interface = %v, want 1024", got)
	}
}
