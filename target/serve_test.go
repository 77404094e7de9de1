package target

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// A fake CM: the listener hands out requests whose Accept connects the target's QP to a test
// initiator's QP out of band (until softroce implements transport.ConnManager).

type fakeListener struct {
	reqs chan transport.ConnRequest
}

func (l *fakeListener) Accept(ctx context.Context) (transport.ConnRequest, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *fakeListener) Addr() netip.AddrPort { return netip.MustParseAddrPort("127.0.0.1:5555") }
func (l *fakeListener) Close() error         { return nil }

type fakeOutcome struct {
	accepted bool
	priv     []byte
	reason   transport.RejectReason
	param    transport.ConnParam
	conn     *fakeConn
}

type fakeReq struct {
	e      *env
	in     *tini
	pd     []byte
	info   transport.ConnRequestInfo
	result chan fakeOutcome
}

func (r *fakeReq) PrivateData() []byte             { return r.pd }
func (r *fakeReq) Info() transport.ConnRequestInfo { return r.info }
func (r *fakeReq) MRA(uint8, []byte) error         { return nil }

func (r *fakeReq) Reject(priv []byte, reason transport.RejectReason) error {
	r.result <- fakeOutcome{priv: append([]byte(nil), priv...), reason: reason}
	return nil
}

func (r *fakeReq) Accept(ctx context.Context, qp transport.QP, priv []byte, param transport.ConnParam) (transport.CMConn, error) {
	in := r.in
	taddr := r.e.tdev.Addrs()[0]
	tpsn := rand.Uint32N(1 << 24)
	if err := modifyToRTS(in.qp, in.addr, taddr, qp.QPN(), tpsn, in.psn, r.e.opts.mtu); err != nil {
		return nil, err
	}
	for i := 0; i < in.nRecv; i++ {
		in.postRecv(i)
	}
	if err := modifyToRTS(qp, taddr, in.addr, in.qp.QPN(), in.psn, tpsn, r.e.opts.mtu); err != nil {
		return nil, err
	}
	c := &fakeConn{qp: qp, events: make(chan transport.CMEvent, 2)}
	r.result <- fakeOutcome{accepted: true, priv: append([]byte(nil), priv...), param: param, conn: c}
	return c, nil
}

type fakeConn struct {
	qp     transport.QP
	events chan transport.CMEvent
	mu     sync.Mutex
	disc   int
}

func (c *fakeConn) QP() transport.QP                 { return c.qp }
func (c *fakeConn) LocalAddr() netip.AddrPort        { return netip.AddrPort{} }
func (c *fakeConn) RemoteAddr() netip.AddrPort       { return netip.AddrPort{} }
func (c *fakeConn) PrivateData() []byte              { return nil }
func (c *fakeConn) Events() <-chan transport.CMEvent { return c.events }
func (c *fakeConn) Disconnect([]byte) error {
	c.mu.Lock()
	c.disc++
	c.mu.Unlock()
	_ = c.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState)
	return nil
}

func (c *fakeConn) disconnects() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.disc
}

// serveLogin runs one login through Serve with private data pd.
func (e *env) serveLogin(ln *fakeListener, pd []byte, depth uint8) (*tini, fakeOutcome) {
	e.t.Helper()
	in := e.newIni()
	r := &fakeReq{e: e, in: in, pd: pd, result: make(chan fakeOutcome, 1),
		info: transport.ConnRequestInfo{RemoteAddr: netip.MustParseAddrPort("127.0.0.2:40000"),
			InitiatorDepth: depth, ResponderResources: 0, RNRRetryCount: 7, FlowControl: true}}
	ln.reqs <- r
	select {
	case o := <-r.result:
		return in, o
	case <-time.After(waitLong):
		e.t.Fatal("no answer to the connection request")
	}
	return nil, fakeOutcome{}
}

// TestServe runs logins through Serve: every reject reason comes back as a CM REJ (consumer
// defined) carrying SRP_LOGIN_REJ; an accepted login gets a REP with SRP_LOGIN_RSP and a
// connection parameter set that lets the target RDMA READ; I/O works; a DREQ closes the
// channel; Target.Close sends T_LOGOUT and disconnects.
func TestServe(t *testing.T) {
	e := newEnv(t, envOpts{limits: Limits{MaxChannels: 2}})
	ln := &fakeListener{reqs: make(chan transport.ConnRequest)}
	serveErr := make(chan error, 1)
	go func() { serveErr <- e.tgt.Serve(e.ctx, ln, e.tdev) }()

	rdma := func(mod func(r *srp.LoginReq)) []byte {
		r := defaultLogin()
		if mod != nil {
			mod(&r)
		}
		b := make([]byte, srp.LoginReqRDMALen)
		r.EncodeRDMA(b)
		return b
	}
	rejects := []struct {
		name   string
		pd     []byte
		depth  uint8
		reason srp.RejectReason
	}{
		{"garbage", []byte{1, 2, 3}, 4, srp.RejUnableEstablishChannel},
		{"wrong opcode", func() []byte { b := rdma(nil); b[11] = 0x02; return b }(), 4, srp.RejUnableEstablishChannel},
		{"IU too small", rdma(func(r *srp.LoginReq) { r.ReqITIULen = 32 }), 4, srp.RejITIULenTooLarge},
		{"IU too large", rdma(func(r *srp.LoginReq) { r.ReqITIULen = 1 << 20 }), 4, srp.RejITIULenTooLarge},
		{"target port", rdma(func(r *srp.LoginReq) { r.TargetPortID = strange }), 4, srp.RejUnableAssociateChannel},
		{"buffer format", rdma(func(r *srp.LoginReq) { r.BufFmt = 0x10 }), 4, srp.RejUnsupportedDescFormat},
		{"no ACL", rdma(func(r *srp.LoginReq) { r.InitiatorPortID = strange }), 4, srp.RejChannelLimitReached},
		{"no RDMA READ", rdma(nil), 0, srp.RejInsufficientResources},
	}
	for _, tc := range rejects {
		_, o := e.serveLogin(ln, tc.pd, tc.depth)
		if o.accepted || o.reason != transport.RejectConsumerDefined {
			t.Fatalf("%s: accepted %v, CM reason %v", tc.name, o.accepted, o.reason)
		}
		rej, err := srp.ParseLoginRej(o.priv)
		if err != nil || rej.Reason() != tc.reason || rej.BufFmt() != SupportedBufFormats {
			t.Fatalf("%s: LOGIN_REJ %x (%v), want reason %#x", tc.name, o.priv, err, uint32(tc.reason))
		}
		// Only the wrong-port reject names the port; the others stay 32 bytes, as ib_srpt's.
		if _, hinted := srp.ParsePortHint(o.priv); hinted != (tc.reason == srp.RejUnableAssociateChannel) {
			t.Fatalf("%s: port hint present %v in %x", tc.name, hinted, o.priv)
		}
	}

	in, o := e.serveLogin(ln, rdma(nil), 4)
	if !o.accepted {
		t.Fatalf("rejected: %x", o.priv)
	}
	rsp, err := srp.ParseLoginRsp(o.priv)
	if err != nil || rsp.ReqLimDelta() != 16 || rsp.Flags() != srp.ImmedSupported || rsp.MaxITIULen() != 8260 {
		t.Fatalf("LOGIN_RSP %x: %v", o.priv, err)
	}
	if o.param.InitiatorDepth < 1 || o.param.InitiatorDepth > 4 {
		t.Fatalf("connection parameters %+v: initiator depth must be 1..4", o.param)
	}
	in.rsp = rsp.Fields()
	in.reqLim = rsp.ReqLimDelta()
	// Wait for the channel to be established, then run I/O.
	waitFor(t, func() bool { return e.tgt.Stats().Channels == 1 })
	in.clearUA(0)
	rng := rand.New(rand.NewPCG(9, 10))
	w := &xfer{write: true, lba: 3, blocks: 40, mode: modeIndirect}
	in.issue(w, 4, rng)
	in.complete(w)

	// A second channel (MULTI) and its DREQ.
	in2, o2 := e.serveLogin(ln, rdma(func(r *srp.LoginReq) { r.Flags = srp.MultiChanMulti }), 4)
	if !o2.accepted {
		t.Fatalf("MULTI rejected: %x", o2.priv)
	}
	if r2, _ := srp.ParseLoginRsp(o2.priv); r2.Flags()&srp.MultiChanResultMask != srp.MultiChanMaintained {
		t.Fatalf("MULTI result %#x", r2.Flags())
	}
	_ = in2
	waitFor(t, func() bool { return e.tgt.Stats().Channels == 2 })
	// Third: channel limit.
	_, o3 := e.serveLogin(ln, rdma(func(r *srp.LoginReq) { r.Flags = srp.MultiChanMulti }), 4)
	if rej, _ := srp.ParseLoginRej(o3.priv); o3.accepted || rej.Reason() != srp.RejChannelLimitReached {
		t.Fatalf("third channel: %+v", o3)
	}
	o2.conn.events <- transport.CMEvent{Type: transport.CMEventDisconnected}
	waitFor(t, func() bool { return e.tgt.Stats().Channels == 1 })
	if o2.conn.disconnects() == 0 {
		t.Fatal("the channel did not disconnect its CM connection")
	}

	// Target shutdown: T_LOGOUT (no reason) before the disconnect, and Serve returns.
	cctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := e.tgt.Close(cctx); err != nil {
		t.Fatal(err)
	}
	lo, err := srp.ParseTLogout(in.awaitOther(srp.OpTLogout, waitLong))
	if err != nil || lo.Reason() != srp.TLogoutNoReason {
		t.Fatalf("T_LOGOUT %v %v", lo, err)
	}
	if o.conn.disconnects() == 0 {
		t.Fatal("no disconnect after T_LOGOUT")
	}
	awaitNil(t, serveErr, "Serve did not return after Close")
	// Logins after Close are not accepted.
	if _, d := e.loginDirect(defaultLogin()); d.Accepted || d.Cause != CauseShuttingDown {
		t.Fatalf("login after close: %+v", d)
	}
	if !errors.Is(ErrClosed, ErrClosed) {
		t.Fatal()
	}
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestServeRacesClose: Serve started as the target closes (srpd's StartTarget runs Serve on
// goroutines a Close can overtake) either serves until Close or returns at once; Close never
// waits for a Serve it could not see (found by -race in the daemon's tests: Serve's Add on
// the serving WaitGroup raced with Close's Wait). A Serve after Close returns nil at once.
func TestServeRacesClose(t *testing.T) {
	for i := range 50 {
		tgt, err := New(Config{Name: "t", PortID: srp.MakePortID(1, uint64(i+1)), Limits: Limits{QueueDepth: 4, MaxTransfer: 64 << 10}})
		if err != nil {
			t.Fatal(err)
		}
		ln := &fakeListener{reqs: make(chan transport.ConnRequest)}
		served := make(chan error, 1)
		go func() { served <- tgt.Serve(context.Background(), ln, nil) }()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := tgt.Close(ctx); err != nil {
			t.Fatalf("round %d: Close: %v", i, err)
		}
		cancel()
		select {
		case err := <-served:
			if err != nil {
				t.Fatalf("round %d: Serve: %v", i, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: Serve did not return after Close", i)
		}
	}
}
