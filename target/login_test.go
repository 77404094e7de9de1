package target

import (
	"testing"

	"github.com/srpd/srpd/internal/fuzzbound"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
)

var (
	tPort   = srp.MakePortID(0x1122334455667788, 0x0002c90300a0b0c0)
	iPort   = srp.MakePortID(0, 0x5054_00ff_fe77_0002)
	iPort2  = srp.MakePortID(1, 0x5054_00ff_fe77_0002)
	strange = srp.MakePortID(0xdead, 0xbeef)
)

func testPolicy() *loginPolicy {
	lim := Limits{QueueDepth: 32, MaxChannels: 2}.withDefaults()
	return &loginPolicy{
		portID: tPort,
		lim:    lim,
		acls: map[srp.PortID]*view{
			iPort:  {name: "ini", set: scsi.NewLUNSet()},
			iPort2: {name: "single", set: scsi.NewLUNSet(), maxChannels: 1},
		},
	}
}

// linuxLogin is what ib_srp sends by default (RDMA CM): IT IU 8260, direct|indirect,
// immediate data at offset 68.
func linuxLogin() srp.LoginReq {
	return srp.LoginReq{
		Tag:             srp.Tag{1, 2, 3, 4, 5, 6, 7, 8},
		ReqITIULen:      8260,
		BufFmt:          srp.BufFormatDirect | srp.BufFormatIndirect,
		Flags:           srp.MultiChanSingle | srp.ImmedRequested,
		ImmDataOffset:   srp.DefaultImmDataOffset,
		InitiatorPortID: iPort,
		TargetPortID:    tPort,
	}
}

func TestDecideLoginRejects(t *testing.T) {
	type mod func(p *loginPolicy, r *srp.LoginReq, info *ConnInfo, existing *int)
	cases := []struct {
		name   string
		mod    mod
		reason srp.RejectReason
		cause  RejectCause
	}{
		{"closing", func(p *loginPolicy, _ *srp.LoginReq, _ *ConnInfo, _ *int) { p.closing = true },
			srp.RejInsufficientResources, CauseShuttingDown},
		{"it iu 63", func(_ *loginPolicy, r *srp.LoginReq, _ *ConnInfo, _ *int) { r.ReqITIULen = 63 },
			srp.RejITIULenTooLarge, CauseITIUTooSmall},
		{"it iu 0", func(_ *loginPolicy, r *srp.LoginReq, _ *ConnInfo, _ *int) { r.ReqITIULen = 0 },
			srp.RejITIULenTooLarge, CauseITIUTooSmall},
		{"it iu too large", func(_ *loginPolicy, r *srp.LoginReq, _ *ConnInfo, _ *int) { r.ReqITIULen = DefaultMaxITIULen + 1 },
			srp.RejITIULenTooLarge, CauseITIUTooLarge},
		{"it iu huge", func(_ *loginPolicy, r *srp.LoginReq, _ *ConnInfo, _ *int) { r.ReqITIULen = 1<<32 - 1 },
			srp.RejITIULenTooLarge, CauseITIUTooLarge},
		{"target port id", func(_ *loginPolicy, r *srp.LoginReq, _ *ConnInfo, _ *int) { r.TargetPortID = strange },
			srp.RejUnableAssociateChannel, CauseTargetPortID},
		{"target port id halves swapped (rev10)", func(_ *loginPolicy, r *srp.LoginReq, _ *ConnInfo, _ *int) {
			r.TargetPortID = srp.MakePortID(tPort.GUID(), tPort.IDExt())
		}, srp.RejUnableAssociateChannel, CauseTargetPortID},
		{"unknown buffer format", func(_ *loginPolicy, r *srp.LoginReq, _ *ConnInfo, _ *int) { r.BufFmt |= 0x8 },
			srp.RejUnsupportedDescFormat, CauseBufFormat},
		{"indirect not offered", func(p *loginPolicy, _ *srp.LoginReq, _ *ConnInfo, _ *int) { p.lim.BufFormats = srp.BufFormatDirect },
			srp.RejUnsupportedDescFormat, CauseBufFormat},
		{"no ACL", func(_ *loginPolicy, r *srp.LoginReq, _ *ConnInfo, _ *int) { r.InitiatorPortID = strange },
			srp.RejChannelLimitReached, CauseNoACL},
		{"channel limit", func(_ *loginPolicy, r *srp.LoginReq, _ *ConnInfo, e *int) { r.Flags = srp.MultiChanMulti; *e = 2 },
			srp.RejChannelLimitReached, CauseChannelLimit},
		{"multichannel unsupported", func(_ *loginPolicy, r *srp.LoginReq, _ *ConnInfo, e *int) {
			r.InitiatorPortID = iPort2
			r.Flags = srp.MultiChanMulti
			*e = 1
		}, srp.RejMultiChannelUnsupported, CauseMultiChannel},
		{"no RDMA READ", func(_ *loginPolicy, _ *srp.LoginReq, i *ConnInfo, _ *int) { i.DepthKnown = true },
			srp.RejInsufficientResources, CauseNoRDMARead},
		// Order: IU length before port ID before ACL (ib_srpt's order).
		{"order: iu before port", func(_ *loginPolicy, r *srp.LoginReq, _ *ConnInfo, _ *int) {
			r.ReqITIULen = 10
			r.TargetPortID = strange
			r.InitiatorPortID = strange
		}, srp.RejITIULenTooLarge, CauseITIUTooSmall},
		{"order: port before ACL", func(_ *loginPolicy, r *srp.LoginReq, _ *ConnInfo, _ *int) {
			r.TargetPortID = strange
			r.InitiatorPortID = strange
		}, srp.RejUnableAssociateChannel, CauseTargetPortID},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := testPolicy()
			r := linuxLogin()
			var info ConnInfo
			existing := 0
			tc.mod(p, &r, &info, &existing)
			d := decideLogin(p, &r, info, existing)
			if d.Accepted {
				t.Fatalf("accepted: %+v", d.Rsp)
			}
			if d.Rej.Reason != tc.reason || d.Cause != tc.cause {
				t.Fatalf("reason %#x (%v), cause %v; want %#x, %v", uint32(d.Rej.Reason), d.Rej.Reason, d.Cause, uint32(tc.reason), tc.cause)
			}
			if d.Rej.Tag != r.Tag || d.Rej.BufFmt != p.lim.BufFormats {
				t.Fatalf("LOGIN_REJ tag %v buf fmt %#x", d.Rej.Tag, d.Rej.BufFmt)
			}
			// The encoded reject is what goes into the CM REJ.
			var b [srp.LoginRejLen]byte
			if _, err := srp.LoginRej(b[:]).Encode(&d.Rej); err != nil {
				t.Fatal(err)
			}
			if rej, err := srp.ParseLoginRej(b[:]); err != nil || rej.Reason() != tc.reason {
				t.Fatalf("round trip: %v %v", rej, err)
			}
		})
	}
}

func TestDecideLoginAccept(t *testing.T) {
	cases := []struct {
		name     string
		mod      func(p *loginPolicy, r *srp.LoginReq)
		existing int
		flags    srp.LoginRspFlags
		imm      int
		itLen    uint32
	}{
		{"linux default", nil, 0, srp.MultiChanNoChan | srp.ImmedSupported, 68, 8260},
		{"smaller IU negotiated down", func(_ *loginPolicy, r *srp.LoginReq) { r.ReqITIULen = 64; r.Flags = 0 }, 0, 0, 0, 64},
		{"max IU", func(_ *loginPolicy, r *srp.LoginReq) { r.ReqITIULen = DefaultMaxITIULen }, 0, srp.ImmedSupported, 68, DefaultMaxITIULen},
		{"single terminates", nil, 1, srp.MultiChanTerminated | srp.ImmedSupported, 68, 8260},
		{"multi maintains", func(_ *loginPolicy, r *srp.LoginReq) { r.Flags |= srp.MultiChanMulti }, 1,
			srp.MultiChanMaintained | srp.ImmedSupported, 68, 8260},
		{"multi first channel: no existing", func(_ *loginPolicy, r *srp.LoginReq) { r.Flags |= srp.MultiChanMulti }, 0,
			srp.MultiChanNoChan | srp.ImmedSupported, 68, 8260},
		{"reserved multichannel action is multi", func(_ *loginPolicy, r *srp.LoginReq) { r.Flags |= 3 }, 1,
			srp.MultiChanMaintained | srp.ImmedSupported, 68, 8260},
		{"single at the channel limit", nil, 2, srp.MultiChanTerminated | srp.ImmedSupported, 68, 8260},
		{"immediate disabled", func(p *loginPolicy, _ *srp.LoginReq) { p.lim.DisableImmediateData = true }, 0, 0, 0, 8260},
		{"immediate not requested", func(_ *loginPolicy, r *srp.LoginReq) { r.Flags = 0 }, 0, 0, 0, 8260},
		{"immediate offset below 48", func(_ *loginPolicy, r *srp.LoginReq) { r.ImmDataOffset = 47 }, 0, 0, 0, 8260},
		{"immediate offset 48", func(_ *loginPolicy, r *srp.LoginReq) { r.ImmDataOffset = 48 }, 0, srp.ImmedSupported, 48, 8260},
		// 8212 bytes of immediate data possible at offset 48: more than 8192.
		{"immediate offset 48, limit 8192", func(p *loginPolicy, r *srp.LoginReq) {
			r.ImmDataOffset = 48
			p.lim.MaxImmediateData = 8192
		}, 0, 0, 0, 8260},
		{"immediate exactly the limit", func(p *loginPolicy, _ *srp.LoginReq) { p.lim.MaxImmediateData = 8192 }, 0,
			srp.ImmedSupported, 68, 8260},
		{"immediate offset 80", func(_ *loginPolicy, r *srp.LoginReq) { r.ImmDataOffset = 80; r.ReqITIULen = 80 + 8192 }, 0,
			srp.ImmedSupported, 80, 80 + 8192},
		{"immediate offset outside IU", func(_ *loginPolicy, r *srp.LoginReq) { r.ImmDataOffset = 8260 }, 0, 0, 0, 8260},
		{"immediate more than allowed", func(p *loginPolicy, _ *srp.LoginReq) { p.lim.MaxImmediateData = 4096 }, 0, 0, 0, 8260},
		{"default ACL", func(p *loginPolicy, r *srp.LoginReq) {
			p.defaultView = &view{name: "default", set: scsi.NewLUNSet()}
			r.InitiatorPortID = strange
		}, 0, srp.ImmedSupported, 68, 8260},
		{"no buffer format required", func(_ *loginPolicy, r *srp.LoginReq) { r.BufFmt = 0 }, 0, srp.ImmedSupported, 68, 8260},
		{"direct only required", func(_ *loginPolicy, r *srp.LoginReq) { r.BufFmt = srp.BufFormatDirect }, 0, srp.ImmedSupported, 68, 8260},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := testPolicy()
			r := linuxLogin()
			if tc.mod != nil {
				tc.mod(p, &r)
			}
			d := decideLogin(p, &r, ConnInfo{InitiatorDepth: 4, DepthKnown: true}, tc.existing)
			if !d.Accepted {
				t.Fatalf("rejected: %v (%v)", d.Rej.Reason, d.Cause)
			}
			want := srp.LoginRspFields{
				ReqLimDelta: 32, Tag: r.Tag, MaxITIULen: tc.itLen, MaxTIIULen: DefaultMaxTIIULen,
				BufFmt: p.lim.BufFormats, Flags: tc.flags,
			}
			if d.Rsp != want {
				t.Fatalf("LOGIN_RSP %+v\nwant      %+v", d.Rsp, want)
			}
			if d.ImmDataOffset != tc.imm {
				t.Fatalf("imm offset %d, want %d", d.ImmDataOffset, tc.imm)
			}
			wantTerm := 0
			if r.MultiChannel() == srp.MultiChanSingle {
				wantTerm = tc.existing
			}
			if d.Terminate != wantTerm {
				t.Fatalf("terminate %d, want %d", d.Terminate, wantTerm)
			}
			var b [srp.LoginRspLen]byte
			if _, err := srp.LoginRsp(b[:]).Encode(&d.Rsp); err != nil {
				t.Fatal(err)
			}
			if rsp, err := srp.ParseLoginRsp(b[:]); err != nil || rsp.Fields() != want {
				t.Fatalf("round trip: %v", err)
			}
		})
	}
}

// TestDecideLoginExt: srpd's extensions are granted only as offered (a kernel initiator offers
// none and gets none), only the ones the target knows, and not when the target disables them.
func TestDecideLoginExt(t *testing.T) {
	for _, tc := range []struct {
		name    string
		offer   srp.Ext
		disable bool
		want    srp.Ext
	}{
		{"linux: none offered", 0, false, 0},
		{"srpd offers remote invalidation", srp.ExtRemoteInvalidate, false, srp.ExtRemoteInvalidate},
		{"unknown bits are not granted", 0xFF, false, srp.ExtRemoteInvalidate},
		{"unknown bits alone", 0xFE, false, 0},
		{"disabled", srp.ExtRemoteInvalidate, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testPolicy()
			p.lim.DisableRemoteInvalidate = tc.disable
			r := linuxLogin()
			r.Ext = tc.offer
			d := decideLogin(p, &r, ConnInfo{InitiatorDepth: 4, DepthKnown: true}, 0)
			if !d.Accepted || d.Rsp.Ext != tc.want {
				t.Fatalf("accepted %v, ext %#x; want %#x", d.Accepted, d.Rsp.Ext, tc.want)
			}
		})
	}
}

func TestParseLoginReqForms(t *testing.T) {
	r := linuxLogin()
	var rdma [srp.LoginReqRDMALen]byte
	if _, err := r.EncodeRDMA(rdma[:]); err != nil {
		t.Fatal(err)
	}
	var ib [92]byte // IB CM REQ private data: the 64-byte form, zero padded
	if _, err := r.Encode(ib[:]); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"rdma": rdma[:], "ib": ib[:], "ib64": ib[:64]} {
		got, err := ParseLoginReq(b)
		if err != nil || got != r {
			t.Fatalf("%s: %+v, %v", name, got, err)
		}
	}
	// Linux's RDMA CM login has a zero tag: still the RDMA form.
	r.Tag = srp.Tag{}
	if _, err := r.EncodeRDMA(rdma[:]); err != nil {
		t.Fatal(err)
	}
	if got, err := ParseLoginReq(rdma[:]); err != nil || got != r {
		t.Fatalf("zero tag: %+v, %v", got, err)
	}
	for _, b := range [][]byte{nil, make([]byte, 55), {0xff}} {
		if _, err := ParseLoginReq(b); err == nil {
			t.Fatalf("%x: no error", b)
		}
	}
	bad := rdma
	bad[11] = 0xc0
	if _, err := ParseLoginReq(bad[:]); err == nil {
		t.Fatal("wrong opcode accepted")
	}
}

// FuzzDecideLogin: no input crashes the decision, and an accepted login always gets sane,
// encodable values.
func FuzzDecideLogin(f *testing.F) {
	var b [srp.LoginReqRDMALen]byte
	r := linuxLogin()
	r.EncodeRDMA(b[:])
	f.Add(b[:], 0)
	var ib [srp.LoginReqLen]byte
	r.Encode(ib[:])
	f.Add(ib[:], 1)
	f.Fuzz(func(t *testing.T, data []byte, existing int) {
		fuzzbound.Run(t, func() { checkDecideLogin(t, data, existing) })
	})
}

// checkDecideLogin is one FuzzDecideLogin input.
func checkDecideLogin(t *testing.T, data []byte, existing int) {
	req, err := ParseLoginReq(data)
	if err != nil {
		return
	}
	p := testPolicy()
	existing &= 7
	d := decideLogin(p, &req, ConnInfo{}, existing)
	if !d.Accepted {
		if d.Cause == CauseNone || d.Rej.Reason < srp.RejUnableEstablishChannel || d.Rej.Reason > srp.RejChannelLimitReached {
			t.Fatalf("reject without cause: %+v", d)
		}
		return
	}
	if d.Rsp.MaxITIULen < minITIULen || d.Rsp.MaxITIULen > p.lim.MaxITIULen || d.Rsp.ReqLimDelta != int32(p.lim.QueueDepth) {
		t.Fatalf("bad response %+v", d.Rsp)
	}
	if d.ImmDataOffset != 0 && (d.ImmDataOffset < srp.CmdHdrLen || d.ImmDataOffset >= int(d.Rsp.MaxITIULen)) {
		t.Fatalf("bad immediate offset %d", d.ImmDataOffset)
	}
}
