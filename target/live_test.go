package target

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
)

var tur = []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}

func wantGoodTUR(t *testing.T, in *tini, lun uint16) {
	t.Helper()
	if r, _ := in.simple(lun, tur, 0); r.Status() != 0 {
		t.Fatalf("TEST UNIT READY to LUN %d: %v, want GOOD", lun, senseOf(t, r))
	}
}

func sessionIDs(tg *Target) map[srp.PortID]uint64 {
	m := map[srp.PortID]uint64{}
	for _, s := range tg.Sessions() {
		m[s.Initiator] = s.ID
	}
	return m
}

// TestReconfigureLive changes the views of a running target with two sessions whose views
// share a LUN: each change reaches only the sessions of the view it changes, as unit
// attentions, and only a removed ACL logs anybody out.
func TestReconfigureLive(t *testing.T) {
	other := srp.MakePortID(7, 0x5054_00ff_fe77_0009)
	aclsOf := func(l []*scsi.LUN, a, b []LUNMapping, extra ...ACL) []ACL {
		return append([]ACL{{Name: "a", Initiator: iPort, LUNs: a}, {Name: "b", Initiator: iPort2, LUNs: b}}, extra...)
	}
	var luns []*scsi.LUN
	e := newEnv(t, envOpts{nLUNs: 3, plainRAM: true, acls: func(l []*scsi.LUN) []ACL {
		luns = l
		return aclsOf(l, []LUNMapping{{Number: 0, LUN: l[0]}}, []LUNMapping{{Number: 0, LUN: l[0]}, {Number: 1, LUN: l[1]}})
	}})
	cfg := func(a, b []LUNMapping, extra ...ACL) Config {
		return Config{Name: "t0", PortID: tPort, ACLs: aclsOf(luns, a, b, extra...)}
	}
	a := e.mustLogin(defaultLogin())
	b := e.mustLogin(func() srp.LoginReq { r := defaultLogin(); r.InitiatorPortID = iPort2; return r }())
	a.clearUA(0)
	b.clearUA(0, 1)
	ids := sessionIDs(e.tgt)
	if len(ids) != 2 {
		t.Fatalf("sessions %v", ids)
	}

	// 1. LUN 1 (the third LUN) mapped into a's view: a is told, b (same shared LUN 0) is not.
	aMap := []LUNMapping{{Number: 0, LUN: luns[0]}, {Number: 1, LUN: luns[2]}}
	bMap := []LUNMapping{{Number: 0, LUN: luns[0]}, {Number: 1, LUN: luns[1]}}
	res, err := e.tgt.Reconfigure(cfg(aMap, bMap))
	if err != nil || len(res.LoggedOut) != 0 || len(res.RemovedLUNs) != 0 {
		t.Fatalf("Reconfigure (LUN added): %+v %v", res, err)
	}
	wantGoodTUR(t, b, 0)
	r, _ := a.simple(0, tur, 0)
	wantCheck(t, r, scsi.UnitAttention, 0x3F, 0x0E)
	if got := reportLUNs(a, 0); !slices.Equal(got, []uint16{0, 1}) {
		t.Fatalf("REPORT LUNS of a after the addition: %v", got)
	}
	a.clearUA(1) // POWER ON of a LUN new to a
	wantGoodTUR(t, a, 1)

	// 2. LUN 1 unmapped from b's view: b is told on LUN 0, a is not; b's LUN 1 is gone
	// and that LUN is no longer mapped anywhere.
	bMap = bMap[:1]
	res, err = e.tgt.Reconfigure(cfg(aMap, bMap))
	if err != nil || len(res.LoggedOut) != 0 || len(res.RemovedLUNs) != 1 || res.RemovedLUNs[0] != luns[1] {
		t.Fatalf("Reconfigure (LUN removed): %+v %v", res, err)
	}
	wantGoodTUR(t, a, 0)
	r, _ = b.simple(0, tur, 0)
	wantCheck(t, r, scsi.UnitAttention, 0x3F, 0x0E)
	r, _ = b.simple(1, tur, 0)
	wantCheck(t, r, scsi.IllegalRequest, 0x25, 0x00)
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := e.tgt.DrainLUN(ctx, luns[1]); err != nil {
		t.Fatal(err)
	}

	// 3. a's LUN 1 write-protected: MODE PARAMETERS CHANGED to a, then WRITE PROTECTED.
	aMap[1].ReadOnly = true
	if _, err := e.tgt.Reconfigure(cfg(aMap, bMap)); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	r, _ = a.simple(1, tur, 0)
	wantCheck(t, r, scsi.UnitAttention, 0x2A, 0x01)
	w := &xfer{lun: 1, write: true, lba: 0, blocks: 8}
	a.lunModel = map[uint16]int{1: 2}
	a.issue(w, 1, rng)
	wantCheck(t, a.await(w.tag), scsi.DataProtect, 0x27, 0x00)
	wantGoodTUR(t, b, 0)
	// ...and writable again.
	aMap[1].ReadOnly = false
	if _, err := e.tgt.Reconfigure(cfg(aMap, bMap)); err != nil {
		t.Fatal(err)
	}
	a.clearUA(1)
	w = &xfer{lun: 1, write: true, lba: 0, blocks: 8}
	a.issue(w, 1, rng)
	a.complete(w)

	// 4. An ACL for another initiator added, then removed: nobody logged in is touched.
	res, err = e.tgt.Reconfigure(cfg(aMap, bMap, ACL{Initiator: other, LUNs: []LUNMapping{{Number: 0, LUN: luns[0]}}}))
	if err != nil || len(res.LoggedOut) != 0 {
		t.Fatalf("Reconfigure (ACL added): %+v %v", res, err)
	}
	res, err = e.tgt.Reconfigure(cfg(aMap, bMap))
	if err != nil || len(res.LoggedOut) != 0 {
		t.Fatalf("Reconfigure (ACL removed): %+v %v", res, err)
	}
	wantGoodTUR(t, a, 0)
	wantGoodTUR(t, b, 0)

	// 5. b's ACL removed: b is logged out (SRP_T_LOGOUT), a keeps its session.
	res, err = e.tgt.Reconfigure(Config{Name: "t0", PortID: tPort, ACLs: []ACL{{Name: "a", Initiator: iPort, LUNs: aMap}}})
	if err != nil || len(res.LoggedOut) != 1 || res.LoggedOut[0] != iPort2 {
		t.Fatalf("Reconfigure (b's ACL removed): %+v %v", res, err)
	}
	if lo, err := srp.ParseTLogout(b.awaitOther(srp.OpTLogout, waitLong)); err != nil || lo.Reason() != srp.TLogoutNoReason {
		t.Fatalf("b's SRP_T_LOGOUT: %v", err)
	}
	waitDone(t, b.ch)
	wantGoodTUR(t, a, 0)
	if now := sessionIDs(e.tgt); len(now) != 1 || now[iPort] != ids[iPort] {
		t.Fatalf("sessions after b's ACL went: %v (before %v)", now, ids)
	}
	// b may not log in any more.
	if _, d := e.loginDirect(func() srp.LoginReq { r := defaultLogin(); r.InitiatorPortID = iPort2; return r }()); d.Accepted || d.Cause != CauseNoACL {
		t.Fatalf("b's login after its ACL went: %+v", d)
	}

	// 6. Not live: a new port ID. Invalid ACLs change nothing.
	if _, err := e.tgt.Reconfigure(Config{PortID: iPort}); !errors.Is(err, ErrNeedsRestart) {
		t.Fatalf("port ID change: %v", err)
	}
	bad := Config{PortID: tPort, ACLs: []ACL{{Initiator: iPort, LUNs: []LUNMapping{{Number: 0, LUN: luns[0]}, {Number: 0, LUN: luns[2]}}}}}
	if _, err := e.tgt.Reconfigure(bad); err == nil {
		t.Fatal("an ACL mapping one number twice was accepted")
	}
	if got := reportLUNs(a, 0); !slices.Equal(got, []uint16{0, 1}) {
		t.Fatalf("REPORT LUNS of a after a refused change: %v", got)
	}
}

// TestReconfigureDefaultACL: an initiator admitted by the default ACL that gets an ACL of its
// own is logged out (to log in again under it); removing the default ACL logs out the rest.
func TestReconfigureDefaultACL(t *testing.T) {
	var luns []*scsi.LUN
	e := newEnv(t, envOpts{nLUNs: 2, plainRAM: true,
		acls: func(l []*scsi.LUN) []ACL { luns = l; return nil },
		defACL: func(l []*scsi.LUN) *ACL {
			return &ACL{LUNs: []LUNMapping{{Number: 0, LUN: l[0]}}}
		},
	})
	a := e.mustLogin(defaultLogin())
	b := e.mustLogin(func() srp.LoginReq { r := defaultLogin(); r.InitiatorPortID = iPort2; return r }())
	a.clearUA(0)
	b.clearUA(0)
	def := &ACL{LUNs: []LUNMapping{{Number: 0, LUN: luns[0]}, {Number: 1, LUN: luns[1]}}}
	res, err := e.tgt.Reconfigure(Config{PortID: tPort, DefaultACL: def,
		ACLs: []ACL{{Initiator: iPort, LUNs: []LUNMapping{{Number: 0, LUN: luns[1]}}}}})
	if err != nil || len(res.LoggedOut) != 1 || res.LoggedOut[0] != iPort {
		t.Fatalf("Reconfigure: %+v %v", res, err)
	}
	if _, err := srp.ParseTLogout(a.awaitOther(srp.OpTLogout, waitLong)); err != nil {
		t.Fatal(err)
	}
	// b stays, and the default view's new LUN is announced to it.
	r, _ := b.simple(0, tur, 0)
	wantCheck(t, r, scsi.UnitAttention, 0x3F, 0x0E)
	if got := reportLUNs(b, 0); !slices.Equal(got, []uint16{0, 1}) {
		t.Fatalf("REPORT LUNS of b: %v", got)
	}
	// a logs in again, under its own ACL.
	a2 := e.mustLogin(defaultLogin())
	if got := reportLUNs(a2, 0); !slices.Equal(got, []uint16{0}) {
		t.Fatalf("REPORT LUNS of a under its ACL: %v", got)
	}
	res, err = e.tgt.Reconfigure(Config{PortID: tPort, ACLs: []ACL{{Initiator: iPort, LUNs: []LUNMapping{{Number: 0, LUN: luns[1]}}}}})
	if err != nil || len(res.LoggedOut) != 1 || res.LoggedOut[0] != iPort2 {
		t.Fatalf("Reconfigure (default ACL removed): %+v %v", res, err)
	}
	if _, err := srp.ParseTLogout(b.awaitOther(srp.OpTLogout, waitLong)); err != nil {
		t.Fatal(err)
	}
	a2.clearUA(0)
	wantGoodTUR(t, a2, 0)
}

// TestSetLimitsLive: new limits while a session is logged in: the next login negotiates them
// (its request limit is the new queue depth), the session logged in keeps working with what it
// negotiated and is not logged out, and invalid limits change nothing.
func TestSetLimitsLive(t *testing.T) {
	e := newEnv(t, envOpts{nLUNs: 1, plainRAM: true,
		acls:   func([]*scsi.LUN) []ACL { return nil },
		defACL: func(l []*scsi.LUN) *ACL { return &ACL{LUNs: []LUNMapping{{Number: 0, LUN: l[0]}}} },
	})
	a := e.mustLogin(defaultLogin())
	a.clearUA(0)
	before := e.tgt.Limits()
	if int(a.reqLim) != before.QueueDepth {
		t.Fatalf("first login: request limit %d, queue depth %d", a.reqLim, before.QueueDepth)
	}
	l := before
	l.QueueDepth = before.QueueDepth / 2
	if err := e.tgt.SetLimits(l); err != nil {
		t.Fatal(err)
	}
	bad := l
	bad.QueueDepth = 5000
	if err := e.tgt.SetLimits(bad); err == nil {
		t.Fatal("invalid limits accepted")
	}
	if got := e.tgt.Limits().QueueDepth; got != l.QueueDepth {
		t.Fatalf("queue depth %d after a refused change, want %d", got, l.QueueDepth)
	}
	b := e.mustLogin(func() srp.LoginReq { r := defaultLogin(); r.InitiatorPortID = iPort2; return r }())
	if int(b.reqLim) != l.QueueDepth {
		t.Fatalf("login after the change: request limit %d, want the new queue depth %d", b.reqLim, l.QueueDepth)
	}
	if r, _ := a.simple(0, tur, 0); r.Status() != 0 {
		t.Fatalf("the session logged in before the change: TEST UNIT READY status %#x", r.Status())
	}
	if ids := sessionIDs(e.tgt); len(ids) != 2 {
		t.Fatalf("sessions %v: the change logged someone out", ids)
	}
}
