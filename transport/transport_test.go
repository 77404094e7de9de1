package transport

import (
	"errors"
	"net/netip"
	"testing"

	"pgregory.net/rapid"
)

func TestWCStatusIBValues(t *testing.T) {
	// enum ib_wc_status, torvalds/linux include/rdma/ib_verbs.h.
	want := map[WCStatus]string{
		0: "SUCCESS", 1: "LOC_LEN_ERR", 2: "LOC_QP_OP_ERR", 3: "LOC_EEC_OP_ERR", 4: "LOC_PROT_ERR",
		5: "WR_FLUSH_ERR", 6: "MW_BIND_ERR", 7: "BAD_RESP_ERR", 8: "LOC_ACCESS_ERR", 9: "REM_INV_REQ_ERR",
		10: "REM_ACCESS_ERR", 11: "REM_OP_ERR", 12: "RETRY_EXC_ERR", 13: "RNR_RETRY_EXC_ERR",
		21: "GENERAL_ERR",
	}
	for v, name := range want {
		if v.String() != name {
			t.Errorf("%d: %q, want %q", v, v.String(), name)
		}
	}
	if WCRecv != 128 || WCRecvRDMAWithImm != 129 || WCRegMR != 7 || WCLocalInv != 6 {
		t.Error("ib_wc_opcode values")
	}
	if WRRegMR != 11 || WRLocalInv != 10 || WRSendWithInv != 8 || WRRDMARead != 4 {
		t.Error("ib_wr_opcode values")
	}
}

func TestMTU(t *testing.T) {
	for m, n := range map[MTU]int{MTU256: 256, MTU512: 512, MTU1024: 1024, MTU2048: 2048, MTU4096: 4096, 0: 0, 6: 0} {
		if m.Bytes() != n {
			t.Errorf("%d: %d", m, m.Bytes())
		}
		if n != 0 && MTUFromBytes(n) != m {
			t.Errorf("from %d", n)
		}
	}
}

var lim = ModifyLimits{MaxQPRdAtom: 16, MaxQPInitRdAtom: 16, MaxMTU: MTU4096,
	LocalAddr: func(a netip.Addr) bool { return a == netip.MustParseAddr("127.0.0.1") }}

func goodAttr() *QPAttr {
	return &QPAttr{Port: 1, PathMTU: MTU1024, DestQPN: 5, RQPSN: 7, SQPSN: 9, Timeout: 14, RetryCnt: 7,
		RNRRetry: 7, MaxRdAtomic: 4, MaxDestRdAtomic: 4, MinRNRTimer: 12,
		AV: AddressVector{SrcAddr: netip.MustParseAddr("127.0.0.1"), DstAddr: netip.MustParseAddr("127.0.0.2")}}
}

const (
	initReq = AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags
	rtrReq  = AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer
	rtsReq  = AttrState | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrSQPSN | AttrMaxQPRdAtomic
)

func TestValidateModifyTable(t *testing.T) {
	type tc struct {
		cur   QPState
		next  QPState
		mask  QPAttrMask
		tweak func(*QPAttr)
		err   error
		attrs QPAttrMask
	}
	for i, c := range []tc{
		{QPSReset, QPSInit, initReq, nil, nil, 0},
		{QPSReset, QPSInit, AttrState | AttrPort | AttrAccessFlags, nil, ErrMissingAttr, AttrPKeyIndex},
		{QPSReset, QPSRTR, rtrReq, nil, ErrInvalidTransition, 0},
		{QPSInit, QPSRTR, rtrReq, nil, nil, 0},
		{QPSInit, QPSRTR, rtrReq &^ AttrDestQPN, nil, ErrMissingAttr, AttrDestQPN},
		{QPSInit, QPSRTR, rtrReq | AttrSQPSN, nil, ErrInvalidAttr, AttrSQPSN},
		{QPSInit, QPSRTR, rtrReq, func(a *QPAttr) { a.PathMTU = 6 }, ErrInvalidAttr, AttrPathMTU},
		{QPSInit, QPSRTR, rtrReq, func(a *QPAttr) { a.RQPSN = 1 << 24 }, ErrInvalidAttr, AttrRQPSN},
		{QPSInit, QPSRTR, rtrReq, func(a *QPAttr) { a.MaxDestRdAtomic = 17 }, ErrInvalidAttr, AttrMaxDestRdAtomic},
		{QPSInit, QPSRTR, rtrReq, func(a *QPAttr) { a.AV.SrcAddr = netip.MustParseAddr("127.0.0.9") }, ErrInvalidAttr, AttrAV},
		{QPSInit, QPSRTR, rtrReq, func(a *QPAttr) { a.AV.DstAddr = netip.MustParseAddr("::1") }, ErrInvalidAttr, AttrAV},
		{QPSRTR, QPSRTS, rtsReq, nil, nil, 0},
		{QPSRTR, QPSRTS, rtsReq, func(a *QPAttr) { a.RetryCnt = 8 }, ErrInvalidAttr, AttrRetryCnt},
		{QPSRTR, QPSRTS, rtsReq, func(a *QPAttr) { a.Timeout = 32 }, ErrInvalidAttr, AttrTimeout},
		{QPSRTR, QPSRTS, rtsReq &^ AttrSQPSN, nil, ErrMissingAttr, AttrSQPSN},
		{QPSRTS, QPSRTS, AttrMinRNRTimer, nil, nil, 0},
		{QPSRTS, QPSRTS, AttrPathMTU, nil, ErrInvalidAttr, AttrPathMTU},
		{QPSRTS, QPSSQD, AttrState, nil, nil, 0},
		{QPSSQD, QPSRTS, AttrState, nil, nil, 0},
		{QPSRTS, QPSInit, AttrState, nil, ErrInvalidTransition, 0},
		{QPSRTS, QPSErr, AttrState, nil, nil, 0},
		{QPSErr, QPSReset, AttrState, nil, nil, 0},
		{QPSErr, QPSRTS, rtsReq, nil, ErrInvalidTransition, 0},
		{QPSRTS, QPSErr, AttrState | AttrTimeout, nil, ErrInvalidAttr, AttrTimeout},
		{QPSRTS, QPSSQE, AttrState, nil, ErrInvalidTransition, 0},
		{QPSInit, QPSInit, AttrCurState, func(a *QPAttr) { a.CurState = QPSRTR }, ErrInvalidAttr, AttrCurState},
		{QPSInit, QPSInit, 1 << 30, nil, ErrInvalidAttr, 1 << 30},
	} {
		a := goodAttr()
		a.State = c.next
		if c.tweak != nil {
			c.tweak(a)
		}
		got, err := ValidateModify(c.cur, a, c.mask, lim)
		if c.err == nil {
			if err != nil || got != c.next {
				t.Errorf("%d %v->%v: %v, %v", i, c.cur, c.next, got, err)
			}
			continue
		}
		var me *ModifyError
		if !errors.Is(err, c.err) || !errors.As(err, &me) || me.Attrs != c.attrs || got != c.cur {
			t.Errorf("%d %v->%v: got %v, %v; want %v [%v]", i, c.cur, c.next, got, err, c.err, c.attrs)
		}
	}
}

// The state machine as a property: from any reachable state, a random Modify either fails
// leaving the state, or lands exactly where the IBA table says, with every required attribute
// in the mask; RESET→INIT→RTR→RTS is always reachable.
func TestValidateModifyProperty(t *testing.T) {
	legal := map[[2]QPState]QPAttrMask{ // required attributes
		{QPSReset, QPSReset}: 0, {QPSReset, QPSInit}: initReq &^ AttrState, {QPSInit, QPSInit}: 0,
		{QPSInit, QPSRTR}: rtrReq &^ AttrState, {QPSRTR, QPSRTS}: rtsReq &^ AttrState,
		{QPSRTS, QPSRTS}: 0, {QPSRTS, QPSSQD}: 0, {QPSSQD, QPSRTS}: 0, {QPSSQD, QPSSQD}: 0,
	}
	rapid.Check(t, func(t *rapid.T) {
		cur := QPSReset
		for step := 0; step < 30; step++ {
			a := goodAttr()
			a.State = QPState(rapid.IntRange(0, 7).Draw(t, "state"))
			a.CurState = QPState(rapid.IntRange(0, 6).Draw(t, "cur"))
			a.RetryCnt = uint8(rapid.IntRange(0, 8).Draw(t, "retry"))
			a.PathMTU = MTU(rapid.IntRange(0, 6).Draw(t, "mtu"))
			mask := QPAttrMask(rapid.Uint32Range(0, uint32(attrAll)).Draw(t, "mask")) & attrAll
			if rapid.Bool().Draw(t, "state-bit") {
				mask |= AttrState
			}
			next, err := ValidateModify(cur, a, mask, lim)
			if err != nil {
				if next != cur {
					t.Fatalf("failed modify moved %v to %v", cur, next)
				}
				var me *ModifyError
				if !errors.As(err, &me) {
					t.Fatalf("untyped error %v", err)
				}
				continue
			}
			want := cur
			if mask&AttrState != 0 {
				want = a.State
			}
			if next != want {
				t.Fatalf("%v -> %v, want %v", cur, next, want)
			}
			if want != QPSErr && want != QPSReset {
				req, ok := legal[[2]QPState{cur, want}]
				if !ok {
					t.Fatalf("illegal transition %v -> %v accepted (mask %v)", cur, want, mask)
				}
				if mask&req != req {
					t.Fatalf("%v -> %v accepted without %v", cur, want, req&^mask)
				}
				if mask&AttrPathMTU != 0 && a.PathMTU.Bytes() == 0 {
					t.Fatalf("bad MTU accepted")
				}
				if mask&AttrRetryCnt != 0 && a.RetryCnt > 7 {
					t.Fatalf("bad retry count accepted")
				}
			}
			cur = next
		}
		// The normal bring-up path always works from RESET.
		for _, s := range []struct {
			st   QPState
			mask QPAttrMask
		}{{QPSReset, AttrState}, {QPSInit, initReq}, {QPSRTR, rtrReq}, {QPSRTS, rtsReq}} {
			a := goodAttr()
			a.State = s.st
			var err error
			if cur, err = ValidateModify(cur, a, s.mask, lim); err != nil || cur != s.st {
				t.Fatalf("bring-up to %v: %v", s.st, err)
			}
		}
	})
}

func TestAccessValidate(t *testing.T) {
	if AccessRemoteWrite.Validate() == nil || AccessRemoteAtomic.Validate() == nil || Access(1<<7).Validate() == nil {
		t.Error("invalid access accepted")
	}
	if (AccessLocalWrite|AccessRemote).Validate() != nil || AccessRemoteRead.Validate() != nil || Access(0).Validate() != nil {
		t.Error("valid access refused")
	}
}

func TestGID(t *testing.T) {
	a := netip.MustParseAddr("192.0.2.7")
	g := GIDFromAddr(a)
	if g.Addr() != a || g.String() != "::ffff:192.0.2.7" || g[10] != 0xff || g[11] != 0xff {
		t.Errorf("%v", g)
	}
	av := AddressVector{DstAddr: a}
	if av.Dst().Port() != RoCEv2Port {
		t.Error("default port")
	}
}

// TestQPAttrSet: Set copies exactly the fields its mask selects, one attribute at a time, and
// never State, CurState, Cap or SQSigAll.
func TestQPAttrSet(t *testing.T) {
	from := QPAttr{
		State: QPSRTS, CurState: QPSRTR, AccessFlags: AccessRemoteRead, PKeyIndex: 3, Port: 2,
		AV:      AddressVector{DstAddr: netip.MustParseAddr("10.0.0.2"), SrcAddr: netip.MustParseAddr("10.0.0.1")},
		PathMTU: MTU2048, Timeout: 14, RetryCnt: 6, RNRRetry: 5, RQPSN: 0x123, SQPSN: 0x456,
		MaxRdAtomic: 4, MaxDestRdAtomic: 8, MinRNRTimer: 12, DestQPN: 0x77,
		Cap: QPCap{MaxSendWR: 9}, SQSigAll: true,
	}
	field := map[QPAttrMask]func(a *QPAttr) any{
		AttrAccessFlags: func(a *QPAttr) any { return a.AccessFlags }, AttrPKeyIndex: func(a *QPAttr) any { return a.PKeyIndex },
		AttrPort: func(a *QPAttr) any { return a.Port }, AttrAV: func(a *QPAttr) any { return a.AV },
		AttrPathMTU: func(a *QPAttr) any { return a.PathMTU }, AttrTimeout: func(a *QPAttr) any { return a.Timeout },
		AttrRetryCnt: func(a *QPAttr) any { return a.RetryCnt }, AttrRNRRetry: func(a *QPAttr) any { return a.RNRRetry },
		AttrRQPSN: func(a *QPAttr) any { return a.RQPSN }, AttrSQPSN: func(a *QPAttr) any { return a.SQPSN },
		AttrMaxQPRdAtomic: func(a *QPAttr) any { return a.MaxRdAtomic }, AttrMaxDestRdAtomic: func(a *QPAttr) any { return a.MaxDestRdAtomic },
		AttrMinRNRTimer: func(a *QPAttr) any { return a.MinRNRTimer }, AttrDestQPN: func(a *QPAttr) any { return a.DestQPN },
	}
	for bit, get := range field {
		var a QPAttr
		a.Set(&from, bit)
		want := QPAttr{}
		if get(&a) != get(&from) {
			t.Errorf("Set(%v): field not copied: %v, want %v", bit, get(&a), get(&from))
		}
		for other, g := range field {
			if other != bit && g(&a) != g(&want) {
				t.Errorf("Set(%v) also changed the field of %v to %v", bit, other, g(&a))
			}
		}
	}
	var a QPAttr
	a.Set(&from, attrAll)
	keep := from
	keep.State, keep.CurState, keep.Cap, keep.SQSigAll = 0, 0, QPCap{}, false
	if a != keep {
		t.Errorf("Set(all) = %+v, want %+v", a, keep)
	}
}
