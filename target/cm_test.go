package target

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

const srpCMPort = 5555 // blktests' rdma_cm_port

// ibSRPParam is what ib_srp asks for: the target may keep 4 RDMA READs outstanding.
var ibSRPParam = transport.ConnParam{ResponderResources: 4, RetryCount: 7, RNRRetryCount: 7, FlowControl: true}

// dialLogin logs in over softroce's RDMA CM: Dial with the 56-byte login request as private data.
func (e *env) dialLogin(req srp.LoginReq) (*tini, transport.CMConn, error) {
	e.t.Helper()
	in := e.newIni()
	in.login = req
	pd := make([]byte, srp.LoginReqRDMALen)
	req.EncodeRDMA(pd)
	ctx, cancel := context.WithTimeout(e.ctx, waitLong)
	defer cancel()
	conn, err := e.idev.Dial(ctx, netip.AddrPortFrom(e.tdev.Addrs()[0].Addr(), srpCMPort), in.qp, pd, ibSRPParam)
	if err != nil {
		return in, nil, err
	}
	rsp, err := srp.ParseLoginRsp(conn.PrivateData())
	if err != nil {
		e.t.Fatalf("REP private data %x: %v", conn.PrivateData(), err)
	}
	in.rsp = rsp.Fields()
	in.reqLim = rsp.ReqLimDelta()
	for i := 0; i < in.nRecv; i++ {
		in.postRecv(i)
	}
	return in, conn, nil
}

// TestServeCM runs logins end to end over softroce's connection manager (CM REQ/REP/RTU and
// REJ over QP1 MADs on the in-memory link): a rejected login comes back as a consumer-defined
// REJ carrying SRP_LOGIN_REJ, an accepted one carries SRP_LOGIN_RSP in the REP, I/O runs, the
// initiator's DREQ closes the channel, and Target.Close sends T_LOGOUT then a DREQ.
func TestServeCM(t *testing.T) {
	e := newEnv(t, envOpts{})
	ln, err := e.tdev.Listen(netip.Addr{}, srpCMPort)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() { served <- e.tgt.Serve(e.ctx, ln, e.tdev) }()

	bad := defaultLogin()
	bad.TargetPortID = strange
	_, _, err = e.dialLogin(bad)
	var rej *transport.RejectError
	if !errors.As(err, &rej) || rej.Reason != transport.RejectConsumerDefined {
		t.Fatalf("dial with a wrong target port id: %v", err)
	}
	if lr, perr := srp.ParseLoginRej(rej.PrivateData); perr != nil || lr.Reason() != srp.RejUnableAssociateChannel {
		t.Fatalf("REJ private data %x: %v", rej.PrivateData, perr)
	}
	// The reject names our port ID (srp/porthint.go), which is how srpctl discover learns it.
	if hint, ok := srp.ParsePortHint(rej.PrivateData); !ok || hint != e.tgt.portID {
		t.Fatalf("REJ private data %x: port hint %v %v, want %v", rej.PrivateData, hint, ok, e.tgt.portID)
	}

	in, conn, err := e.dialLogin(defaultLogin())
	if err != nil {
		t.Fatal(err)
	}
	if in.rsp.ReqLimDelta != 16 || in.rsp.Flags != srp.ImmedSupported {
		t.Fatalf("LOGIN_RSP %+v", in.rsp)
	}
	waitFor(t, func() bool { return e.tgt.Stats().Channels == 1 })
	in.clearUA(0)
	rng := rand.New(rand.NewPCG(31, 32))
	for _, mode := range []descMode{modeDirect, modeIndirect, modeExternal, modeImmediate} {
		w := &xfer{write: true, lba: 64, blocks: 8, mode: mode}
		in.issue(w, 3, rng)
		in.complete(w)
		r := &xfer{lba: 64, blocks: 8, mode: mode % modeImmediate}
		in.issue(r, 2, rng)
		in.complete(r)
	}
	// The initiator disconnects (what ib_srp does instead of SRP_I_LOGOUT). The receives that
	// the DREQ flushes are no transport error.
	errsBefore := e.tgt.Stats().Errors
	if err := conn.Disconnect(nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { s := e.tgt.Stats(); return s.Channels == 0 && s.MRs == 0 })
	if n := e.tgt.Stats().Errors; n != errsBefore {
		t.Fatalf("errors %d after the initiator's DREQ, %d before", n, errsBefore)
	}

	// Shutdown: T_LOGOUT, then the target's DREQ.
	in2, conn2, err := e.dialLogin(defaultLogin())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return e.tgt.Stats().Channels == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := e.tgt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if lo, err := srp.ParseTLogout(in2.awaitOther(srp.OpTLogout, waitLong)); err != nil || lo.Reason() != srp.TLogoutNoReason {
		t.Fatalf("T_LOGOUT %v %v", lo, err)
	}
	select {
	case ev := <-conn2.Events():
		if ev.Type != transport.CMEventDisconnected {
			t.Fatalf("event %v", ev.Type)
		}
	case <-time.After(waitLong):
		t.Fatal("no DREQ from the target")
	}
	awaitNil(t, served, "Serve did not return")
}
