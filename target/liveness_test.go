package target

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport/softroce/link"
)

var tur6 = []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}

// TestKeepAliveIdleChannel: an idle channel whose peer is alive is probed (zero-length RDMA
// WRITEs the peer's transport acknowledges) and stays up; I/O works afterwards.
func TestKeepAliveIdleChannel(t *testing.T) {
	e := newEnv(t, envOpts{limits: Limits{KeepAliveInterval: 200 * time.Millisecond}})
	in := e.mustLogin(defaultLogin())
	in.clearUA(0)
	time.Sleep(1200 * time.Millisecond)
	st := in.ch.Stats()
	if st.State != chLive.String() || st.KeepAlives < 2 {
		t.Fatalf("after 1.2 s idle: state %s, %d keep-alives (want live, ≥ 2)", st.State, st.KeepAlives)
	}
	if r, _ := in.simple(0, tur6, 0); r.Status() != 0 {
		t.Fatalf("TEST UNIT READY after idling: %#x", r.Status())
	}
	if n := e.tgt.Stats().KeepAliveTimeouts; n != 0 {
		t.Fatalf("%d keep-alive timeouts with a live peer", n)
	}
}

// TestKeepAliveReapsVanishedPeer is the dead-channel finding: a peer that disappears without
// a DREQ (every packet lost from then on) is found by the keep-alive and its channel torn
// down within the interval (plus a tick), with its registered memory released.
func TestKeepAliveReapsVanishedPeer(t *testing.T) {
	const interval = 400 * time.Millisecond
	e := newEnv(t, envOpts{limits: Limits{KeepAliveInterval: interval}})
	in := e.mustLogin(defaultLogin())
	in.clearUA(0)
	if e.tgt.Stats().MemoryBytes == 0 {
		t.Fatal("no registered memory to release")
	}
	gone := time.Now()
	e.la.SetFaults(link.Faults{Drop: 1})
	e.lb.SetFaults(link.Faults{Drop: 1})
	select {
	case <-in.ch.Done():
	case <-time.After(10 * interval):
		t.Fatalf("channel of a vanished peer still up after %v", 10*interval)
	}
	took := time.Since(gone)
	if took > interval+interval/4 { // 3/4 of it by design; the rest is slack for the drain and a loaded -race run
		t.Errorf("reaped after %v, want within the interval %v", took, interval)
	}
	waitFor(t, func() bool { s := e.tgt.Stats(); return s.MemoryBytes == 0 && s.MRs == 0 && s.Sessions == 0 })
	if u := e.tgt.budget.Usage(); u.Memory != 0 || u.Sessions != 0 {
		t.Fatalf("budget still holds %+v", u)
	}
	if n := e.tgt.Stats().KeepAliveTimeouts; n != 1 {
		t.Fatalf("%d keep-alive timeouts, want 1", n)
	}
	t.Logf("vanished peer reaped after %v (interval %v)", took, interval)
}

// loginNoRecv logs in like loginDirect, but the initiator posts no receive buffer: every SEND
// of the target meets RNR NAKs, retried forever (rnr_retry 7) — a hostile or broken initiator.
func (e *env) loginNoRecv(req srp.LoginReq) *tini {
	e.t.Helper()
	in := e.newIni()
	in.login = req
	pc, d, err := e.tgt.Login(e.tdev, req, ConnInfo{})
	if !d.Accepted {
		e.t.Fatalf("login: %v %v", d.Cause, err)
	}
	in.pc, in.rsp, in.reqLim = pc, d.Rsp, d.Rsp.ReqLimDelta
	tq := pc.QP()
	tpsn := rand.Uint32N(1 << 24)
	taddr := e.tdev.Addrs()[0]
	if err := modifyToRTS(in.qp, in.addr, taddr, tq.QPN(), tpsn, in.psn, e.opts.mtu); err != nil {
		e.t.Fatal(err)
	}
	if err := modifyToRTS(tq, taddr, in.addr, in.qp.QPN(), in.psn, tpsn, e.opts.mtu); err != nil {
		e.t.Fatal(err)
	}
	if in.ch, err = pc.Establish(nil); err != nil {
		e.t.Fatal(err)
	}
	return in
}

// TestStallDetection: a command whose response SEND can never be delivered (the initiator
// posts no receives) is a stall: with the default action the channel is torn down within the
// stall timeout (plus a tick) and the initiator's other sessions are untouched; with
// StallLog it is only counted.
func TestStallDetection(t *testing.T) {
	const st = 400 * time.Millisecond
	for _, action := range []StallAction{StallClose, StallLog} {
		t.Run(action.String(), func(t *testing.T) {
			e := newEnv(t, envOpts{limits: Limits{StallTimeout: st, StallAction: action, KeepAliveInterval: -1}, defACL: anyACL})
			good := e.mustLogin(loginAs(1))
			good.clearUA(0)
			bad := e.loginNoRecv(loginAs(2))
			n, _ := srp.Cmd(make([]byte, 64)).Encode(&srp.CmdFields{Tag: srp.Tag{7}, CDB: tur6})
			b := make([]byte, 64)
			srp.Cmd(b).Encode(&srp.CmdFields{Tag: srp.Tag{7}, CDB: tur6})
			bad.sendIU(b[:n])
			t0 := time.Now()
			if action == StallClose {
				select {
				case <-bad.ch.Done():
				case <-time.After(10 * st):
					t.Fatal("stalled channel not closed")
				}
				if d := time.Since(t0); d > st+st/2+300*time.Millisecond {
					t.Errorf("closed after %v, want within %v (+ a tick)", d, st)
				}
			} else {
				time.Sleep(3 * st)
				if s := bad.ch.Stats().State; s != chLive.String() {
					t.Fatalf("StallLog closed the channel (%s)", s)
				}
			}
			if n := e.tgt.Stats().Stalls; n == 0 {
				t.Fatal("no stall counted")
			}
			if r, _ := good.simple(0, tur6, 0); r.Status() != 0 {
				t.Fatalf("another initiator's session hurt by the stall: %#x", r.Status())
			}
			if n := good.ch.Stats().Stalls; n != 0 {
				t.Fatalf("the healthy channel counted %d stalls", n)
			}
		})
	}
}
