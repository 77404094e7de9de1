package srp

import (
	"bytes"
	"testing"
)

// Real IUs from /work/shared/reference/captures/srp-rdma-cm-login-io.pcap
// (Linux 6.1 ib_srp -> ib_srpt over rdma_rxe, login over RDMA CM) and
// srp-login-rejected-no-acl.pcap. Packet numbers are 1-based frame numbers.
// Login IUs are CM private data (REQ: MAD offset 200 after the 36-byte RDMA
// CM header, frame offset 262; REP: MAD offset 60, frame offset 122; REJ:
// MAD offset 108, frame offset 170); SRP_CMD / SRP_RSP are RC SEND_ONLY
// payloads at frame offset 54. Linux's tags are host-order (little-endian)
// u64s: tag 0x18 appears as 18 00 00 00 00 00 00 00.
var (
	// Frame 1, CM REQ: struct srp_login_req_rdma. REQUESTED MAX IT IU LEN
	// 8260, buffer formats direct|indirect, IMMED_REQUESTED, imm_data_offset
	// 68.
	capLoginReqRDMA = h(`0000000000000000 | 0006 | 80 | 00 | 00002044 |
		0000000000000000505400fffe770002 | 505400fffe770001505400fffe770001 |
		0044 | 000000000000`)
	// Frame 2, CM REP: struct srp_login_rsp: 128 credits, MAX IT IU LEN 8276
	// (ib_srpt srp_max_req_size), MAX TI IU LEN 8260 (the request's it_iu_len
	// echoed), IMMED_SUPP.
	capLoginRsp = h(`c0 000000 | 00000080 | 0000000000000000 | 00002054 | 00002044 |
		0006 | 80 | 00000000000000000000000000000000000000000000000000`)
	// srp-login-rejected-no-acl.pcap frame 2, CM REJ (reason 28, consumer
	// defined): struct srp_login_rej with reason 0x00010006, which ib_srpt
	// uses when no ACL matches (target_setup_session fails).
	capLoginRej = h(`c2 000000 | 00010006 | 0000000000000000 | 0000000000000000 | 0006 | 000000000000`)

	// Frame 6: INQUIRY (allocation length 36), data-in direct descriptor.
	capCmdInquiry = h(`02 00 000000 | 01 | 00 | 00 | 1800000000000000 | 00000000 | 0000000000000000 |
		00 | 00 | 00 | 00 | 12000000240000000000000000000000 |
		ff2a84fe1bc8b900 | 000003d3 | 00000024`)
	// Frame 132: TEST UNIT READY, no data.
	capCmdTUR = h(`02 00 000000 | 00 | 00 | 00 | 1d00000000000000 | 00000000 | 0000000000000000 |
		00 | 00 | 00 | 00 | 00000000000000000000000000000000`)
	// Frame 177: SERVICE ACTION IN(16) / READ CAPACITY(16), data-in direct.
	capCmdReadCap16 = h(`02 00 000000 | 01 | 00 | 00 | 1d00000000000000 | 00000000 | 0000000000000000 |
		00 | 00 | 00 | 00 | 9e100000000000000000000000200000 |
		ff2a84fe1a34b400 | 000003ed | 00000020`)
	// Frame 604: READ(10) of 48 KiB, data-in direct descriptor.
	capCmdRead10 = h(`02 00 000000 | 01 | 00 | 00 | 1800000000000000 | 00000000 | 0000000000000000 |
		00 | 00 | 00 | 00 | 28000000008000006000000000000000 |
		ff2a84fe02eee000 | 00000489 | 0000c000`)
	// Frame 234: WRITE(10) of 48 KiB, data-out direct descriptor (the target
	// fetches the data with RDMA READ; 64 KiB writes exceed ib_srp's
	// max_imm_data, so the capture has no immediate data).
	capCmdWrite10 = h(`02 00 000000 | 10 | 00 | 00 | 1e00000000000000 | 00000000 | 0000000000000000 |
		00 | 00 | 00 | 00 | 2a000000000000006000000000000000 |
		ff2a84fe02eee000 | 000003f5 | 0000c000`)

	// Frame 9: GOOD, one credit returned.
	capRspGood = h(`c1 00 0000 | 00000001 | 1800000000000000 | 0000 | 00 | 00 |
		00000000 | 00000000 | 00000000 | 00000000`)
	// Frame 45: GOOD with DIUNDER, data-in residual 24 (INQUIRY answer
	// shorter than the allocation length).
	capRspDIUnder = h(`c1 00 0000 | 00000001 | 1e00000000000000 | 0000 | 20 | 00 |
		00000000 | 00000018 | 00000000 | 00000000`)
	// Frame 171: CHECK CONDITION with 96 bytes of sense data (ILLEGAL
	// REQUEST, INVALID COMMAND OPERATION CODE), answering frame 169's
	// REPORT SUPPORTED OPERATION CODES.
	capRspSense = h(`c1 00 0000 | 00000001 | 1b00000000000000 | 0000 | 02 | 02 |
		00000000 | 00000000 | 00000060 | 00000000 |
		700005000000000a000000002000000000000000000000000000000000000000
		0000000000000000000000000000000000000000000000000000000000000000
		0000000000000000000000000000000000000000000000000000000000000000`)
)

// Vectors built from the struct layouts of torvalds/linux:include/scsi/srp.h
// (field boundaries marked with '|').
var (
	// The frame-1 login in the 64-byte struct srp_login_req form.
	kLoginReq = h(`00 00000000000000 | 0000000000000000 | 00002044 | 00000000 | 0006 | 80 | 00 |
		0044 | 0000 | 0000000000000000505400fffe770002 | 505400fffe770001505400fffe770001`)
	// MULTI channel action with all three *SOLNT bits, a 2116-byte IU
	// (old ib_srpt default), direct descriptors only, no immediate data.
	kLoginReqMulti = h(`00 00000000000000 | 0102030405060708 | 00000844 | 00000000 | 0002 | 71 | 00 |
		0000 | 0000 | 000000000000000100000000000000aa | 00000000000000bb00000000000000cc`)
	kLoginRspMaint = h(`c0 000000 | 00000040 | 0102030405060708 | 00002054 | 00000104 | 0006 | 82 |
		00000000000000000000000000000000000000000000000000`)
	kILogout = h(`03 00000000000000 | a1a2a3a4a5a6a7a8`)
	kTLogout = h(`80 01 0000 | 00000004 | b1b2b3b4b5b6b7b8`)
	// ABORT TASK of tag 0x18 with an ib_srp TM tag (bit 31 set).
	kTskAbort = h(`01 02 000000000000 | 0100008000000000 | 00000000 | 0001000000000000 | 0000 | 01 | 00 |
		1800000000000000 | 0000000000000000`)
	// LOGICAL UNIT RESET; ib_srp puts SRP_TAG_NO_REQ (~0U, a u32) in the
	// u64 task tag.
	kTskLUNReset = h(`01 00 000000000000 | 0200008000000000 | 00000000 | 0000000000000000 | 0000 | 08 | 00 |
		ffffffff00000000 | 0000000000000000`)
	// READ(16) of 12 KiB, data-in indirect, complete table (3) in the IU.
	kCmdIndirectIn = h(`02 00 000000 | 02 | 00 | 03 | 2000000000000000 | 00000000 | 0000000000000000 |
		00 | 00 | 00 | 00 | 88000000000000001000000000180000 |
		00000000deadb000 00001234 00000030 | 00003000 |
		0000000010000000 00000101 00001000 |
		0000000010002000 00000102 00001000 |
		0000000010005000 00000103 00001000`)
	// WRITE(10), ORDERED, data-out indirect with an external table: 2 of
	// the 4 descriptors in the IU.
	kCmdIndirectExt = h(`02 00 000000 | 20 | 02 | 00 | 2100000000000000 | 00000000 | 0001000000000000 |
		00 | 02 | 00 | 00 | 2a000000080000002000000000000000 |
		00000000cafe0000 00005678 00000040 | 00004000 |
		0000000020000000 00000201 00001000 |
		0000000020003000 00000202 00001000`)
	// WRITE(10) of 8 bytes as immediate data at ib_srp's offset 68: the
	// srp_imm_buf at 48, bytes 52..67 unused, the data at 68.
	kCmdImm = h(`02 00 000000 | 30 | 00 | 00 | 2200000000000000 | 00000000 | 0000000000000000 |
		00 | 00 | 00 | 00 | 2a000000001000000100000000000000 |
		00000008 | 00000000000000000000000000000000 | 0102030405060708`)
	// READ(32): a 32-byte CDB, so 16 additional CDB bytes (add_cdb_len 16)
	// before the data-in direct descriptor.
	kCmdAddCDB = h(`02 00 000000 | 01 | 00 | 00 | 2300000000000000 | 00000000 | 0000000000000000 |
		00 | 00 | 00 | 10 | 7f00000000000018000900000000000000000400000000000000000000000008 |
		0000000030000000 00000301 00001000`)
	// Bidirectional XDWRITEREAD(10): data-out direct then data-in direct;
	// SCSOLNT|UCSOLNT.
	kCmdBidi = h(`02 06 000000 | 11 | 00 | 00 | 2400000000000000 | 00000000 | 0000000000000000 |
		00 | 00 | 00 | 00 | 53000000000000000100000000000000 |
		0000000040000000 00000401 00000200 | 0000000040001000 00000402 00000200`)
	// Task management answer as recent ib_srpt builds it: RSPVALID,
	// 4 bytes of response data, code in byte 3 (FAILED).
	kRspTM = h(`c1 00 0000 | 00000001 | 0100008000000000 | 0000 | 01 | 00 |
		00000000 | 00000000 | 00000000 | 00000004 | 00000005`)
	// DOOVER with a data-out residual of 512, SOLNT.
	kRspDOOver = h(`c1 01 0000 | 00000002 | 2500000000000000 | 0000 | 04 | 00 |
		00000200 | 00000000 | 00000000 | 00000000`)
	// Response data and sense data together: response data first.
	kRspBoth = h(`c1 00 0000 | 00000001 | 2600000000000000 | 0000 | 03 | 02 |
		00000000 | 00000000 | 00000012 | 00000004 | 00000000 |
		700006000000000a00000000290000000000`)
	kCredReq = h(`81 01 0000 | 00000010 | c1c2c3c4c5c6c7c8`)
	kCredRsp = h(`41 00000000000000 | c1c2c3c4c5c6c7c8`)
	// UNIT ATTENTION, REPORTED LUNS DATA HAS CHANGED.
	kAerReq = h(`82 00 0000 | 00000001 | d1d2d3d4d5d6d7d8 | 00000000 | 0000000000000000 | 00000012 | 00000000 |
		70000600000000 0a00000000 3f0e00000000`)
	kAerRsp = h(`42 00000000000000 | d1d2d3d4d5d6d7d8`)
)

func TestGoldenLoginReq(t *testing.T) {
	capWant := LoginReq{
		ReqITIULen:      8260,
		BufFmt:          BufFormatDirect | BufFormatIndirect,
		Flags:           ImmedRequested | MultiChanSingle,
		ImmDataOffset:   DefaultImmDataOffset,
		InitiatorPortID: pid("0x0000000000000000505400fffe770002"),
		TargetPortID:    MakePortID(0x505400fffe770001, 0x505400fffe770001),
	}
	tests := []struct {
		name string
		wire []byte
		rdma bool
		want LoginReq
	}{
		{"capture frame 1 RDMA CM form", capLoginReqRDMA, true, capWant},
		{"capture login in IB CM form", kLoginReq, false, capWant},
		{"multi channel, solnt bits", kLoginReqMulti, false, LoginReq{
			Tag:             tagOf("0102030405060708"),
			ReqITIULen:      2116,
			BufFmt:          BufFormatDirect,
			Flags:           MultiChanMulti | LoginLOSOLNT | LoginCRSOLNT | LoginAESOLNT,
			InitiatorPortID: MakePortID(1, 0xaa),
			TargetPortID:    MakePortID(0xbb, 0xcc),
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dec, enc := DecodeLoginReq, (*LoginReq).Encode
			if tc.rdma {
				dec, enc = DecodeLoginReqRDMA, (*LoginReq).EncodeRDMA
			}
			got, err := dec(tc.wire)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("decoded %+v\nwant %+v", got, tc.want)
			}
			buf := bytes.Repeat([]byte{0xee}, len(tc.wire)+8) // stale bytes must be cleared
			n, err := enc(&tc.want, buf)
			if err != nil || !bytes.Equal(buf[:n], tc.wire) {
				t.Fatalf("encoded %x (%v)\nwant    %x", buf[:n], err, tc.wire)
			}
			// The other form carries the same value.
			other := make([]byte, LoginReqLen)
			if tc.rdma {
				n, _ = got.Encode(other)
				got2, err := DecodeLoginReq(other[:n])
				if err != nil || got2 != got {
					t.Fatalf("IB form round trip: %+v %v", got2, err)
				}
			} else {
				n, _ = got.EncodeRDMA(other)
				got2, err := DecodeLoginReqRDMA(other[:n])
				if err != nil || got2 != got {
					t.Fatalf("RDMA form round trip: %+v %v", got2, err)
				}
			}
		})
	}
	// The capture's RDMA form converted to the IB form is the kernel
	// layout vector byte for byte (what ib_srpt's srpt_rdma_cm_req_recv
	// does).
	r, _ := DecodeLoginReqRDMA(capLoginReqRDMA)
	b := make([]byte, LoginReqLen)
	r.Encode(b)
	if !bytes.Equal(b, kLoginReq) {
		t.Fatalf("RDMA->IB conversion %x", b)
	}
	if r.MultiChannel() != MultiChanSingle {
		t.Fatal("MultiChannel")
	}
}

func TestGoldenLoginRsp(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		wire []byte
		want LoginRspFields
	}{
		{"capture frame 2", capLoginRsp, capLoginRsp, LoginRspFields{
			ReqLimDelta: 128, MaxITIULen: 8276, MaxTIIULen: 8260,
			BufFmt: BufFormatDirect | BufFormatIndirect, Flags: ImmedSupported | MultiChanNoChan,
		}},
		// REP private data is 196 bytes; the rest is zero padding.
		{"capture frame 2, whole REP private data", append(append([]byte{}, capLoginRsp...), make([]byte, 196-52)...), capLoginRsp, LoginRspFields{
			ReqLimDelta: 128, MaxITIULen: 8276, MaxTIIULen: 8260,
			BufFmt: BufFormatDirect | BufFormatIndirect, Flags: ImmedSupported,
		}},
		{"multichannel maintained", kLoginRspMaint, kLoginRspMaint, LoginRspFields{
			ReqLimDelta: 64, Tag: tagOf("0102030405060708"), MaxITIULen: 8276, MaxTIIULen: 260,
			BufFmt: BufFormatDirect | BufFormatIndirect, Flags: ImmedSupported | MultiChanMaintained,
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := ParseLoginRsp(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if len(v) != LoginRspLen {
				t.Fatalf("view length %d", len(v))
			}
			if got := v.Fields(); got != tc.want {
				t.Fatalf("decoded %+v\nwant %+v", got, tc.want)
			}
			if v.Flags()&MultiChanResultMask != tc.want.Flags&MultiChanResultMask {
				t.Fatal("multichannel result")
			}
			buf := bytes.Repeat([]byte{0xee}, 64)
			n, err := LoginRsp(buf).Encode(&tc.want)
			if err != nil || !bytes.Equal(buf[:n], tc.wire) {
				t.Fatalf("encoded %x (%v)", buf[:n], err)
			}
		})
	}
}

func TestGoldenLoginRej(t *testing.T) {
	v, err := ParseLoginRej(capLoginRej)
	if err != nil {
		t.Fatal(err)
	}
	want := LoginRejFields{Reason: RejChannelLimitReached, BufFmt: BufFormatDirect | BufFormatIndirect}
	if v.Fields() != want {
		t.Fatalf("capture: %+v", v.Fields())
	}
	// Every reason code of enum srp_login_rej_reason.
	reasons := []struct {
		r    RejectReason
		code string
	}{
		{RejUnableEstablishChannel, "00010000"},
		{RejInsufficientResources, "00010001"},
		{RejITIULenTooLarge, "00010002"},
		{RejUnableAssociateChannel, "00010003"},
		{RejUnsupportedDescFormat, "00010004"},
		{RejMultiChannelUnsupported, "00010005"},
		{RejChannelLimitReached, "00010006"},
	}
	seen := map[string]bool{}
	for _, tc := range reasons {
		wire := h("c2 000000 |" + tc.code + "| 0102030405060708 | 0000000000000000 | 0002 | 000000000000")
		f := LoginRejFields{Reason: tc.r, Tag: tagOf("0102030405060708"), BufFmt: BufFormatDirect}
		buf := make([]byte, LoginRejLen)
		if n, err := LoginRej(buf).Encode(&f); err != nil || !bytes.Equal(buf[:n], wire) {
			t.Fatalf("%v: encoded %x %v", tc.r, buf[:n], err)
		}
		v, err := ParseLoginRej(wire)
		if err != nil || v.Fields() != f || v.Reason() != tc.r {
			t.Fatalf("%v: decoded %+v %v", tc.r, v, err)
		}
		s := tc.r.String()
		if s == "" || seen[s] || s[:5] == "Rejec" {
			t.Fatalf("String %q", s)
		}
		seen[s] = true
	}
	if s := RejectReason(0x10007).String(); s != "RejectReason(0x10007)" {
		t.Fatal(s)
	}
}

func TestGoldenSmallIUs(t *testing.T) {
	// Each: wire, parse+Fields, want, encode.
	type tc struct {
		name   string
		wire   []byte
		decode func([]byte) (any, error)
		want   any
		encode func(b []byte, f any) (int, error)
	}
	tests := []tc{
		{"I_LOGOUT", kILogout,
			func(b []byte) (any, error) { v, err := ParseILogout(b); return fieldsOr(v, err, ILogout.Fields) },
			ILogoutFields{Tag: tagOf("a1a2a3a4a5a6a7a8")},
			func(b []byte, f any) (int, error) { x := f.(ILogoutFields); return ILogout(b).Encode(&x) }},
		{"T_LOGOUT", kTLogout,
			func(b []byte) (any, error) { v, err := ParseTLogout(b); return fieldsOr(v, err, TLogout.Fields) },
			TLogoutFields{SolNot: SOLNT, Reason: TLogoutMultiChannelAction, Tag: tagOf("b1b2b3b4b5b6b7b8")},
			func(b []byte, f any) (int, error) { x := f.(TLogoutFields); return TLogout(b).Encode(&x) }},
		{"TSK_MGMT abort task", kTskAbort,
			func(b []byte) (any, error) { v, err := ParseTskMgmt(b); return fieldsOr(v, err, TskMgmt.Fields) },
			TskMgmtFields{SolNot: SCSOLNT, Tag: tagOf("0100008000000000"), LUN: lunOf("0001000000000000"),
				Func: TMAbortTask, TaskTag: tagOf("1800000000000000")},
			func(b []byte, f any) (int, error) { x := f.(TskMgmtFields); return TskMgmt(b).Encode(&x) }},
		{"TSK_MGMT LUN reset", kTskLUNReset,
			func(b []byte) (any, error) { v, err := ParseTskMgmt(b); return fieldsOr(v, err, TskMgmt.Fields) },
			TskMgmtFields{Tag: tagOf("0200008000000000"), Func: TMLUNReset, TaskTag: tagOf("ffffffff00000000")},
			func(b []byte, f any) (int, error) { x := f.(TskMgmtFields); return TskMgmt(b).Encode(&x) }},
		{"CRED_REQ", kCredReq,
			func(b []byte) (any, error) { v, err := ParseCredReq(b); return fieldsOr(v, err, CredReq.Fields) },
			CredReqFields{SolNot: SOLNT, ReqLimDelta: 16, Tag: tagOf("c1c2c3c4c5c6c7c8")},
			func(b []byte, f any) (int, error) { x := f.(CredReqFields); return CredReq(b).Encode(&x) }},
		{"CRED_RSP", kCredRsp,
			func(b []byte) (any, error) { v, err := ParseCredRsp(b); return fieldsOr(v, err, CredRsp.Fields) },
			CredRspFields{Tag: tagOf("c1c2c3c4c5c6c7c8")},
			func(b []byte, f any) (int, error) { x := f.(CredRspFields); return CredRsp(b).Encode(&x) }},
		{"AER_RSP", kAerRsp,
			func(b []byte) (any, error) { v, err := ParseAerRsp(b); return fieldsOr(v, err, AerRsp.Fields) },
			AerRspFields{Tag: tagOf("d1d2d3d4d5d6d7d8")},
			func(b []byte, f any) (int, error) { x := f.(AerRspFields); return AerRsp(b).Encode(&x) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Trailing bytes after the IU are ignored.
			got, err := tc.decode(append(append([]byte{}, tc.wire...), 0xff, 0xff))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("decoded %+v\nwant %+v", got, tc.want)
			}
			buf := bytes.Repeat([]byte{0xee}, len(tc.wire)+4)
			n, err := tc.encode(buf, tc.want)
			if err != nil || !bytes.Equal(buf[:n], tc.wire) {
				t.Fatalf("encoded %x (%v)\nwant    %x", buf[:n], err, tc.wire)
			}
			if _, err := tc.encode(buf[:len(tc.wire)-1], tc.want); !isEncErr(err, ErrShortBuffer) {
				t.Fatalf("short buffer: %v", err)
			}
		})
	}
}

func fieldsOr[V any, F any](v V, err error, fields func(V) F) (any, error) {
	if err != nil {
		return nil, err
	}
	return fields(v), nil
}

func TestGoldenAerReq(t *testing.T) {
	v, err := ParseAerReq(kAerReq)
	if err != nil {
		t.Fatal(err)
	}
	want := AerReqFields{ReqLimDelta: 1, Tag: tagOf("d1d2d3d4d5d6d7d8"),
		Sense: h("70000600000000 0a00000000 3f0e00000000")}
	got := v.Fields()
	if !eqAer(&got, &want) {
		t.Fatalf("decoded %+v", got)
	}
	buf := bytes.Repeat([]byte{0xee}, 80)
	n, err := AerReq(buf).Encode(&want)
	if err != nil || !bytes.Equal(buf[:n], kAerReq) {
		t.Fatalf("encoded %x %v", buf[:n], err)
	}
}

func TestGoldenCmd(t *testing.T) {
	inq := h("120000002400") // INQUIRY, as the SCSI layer hands it (6 bytes)
	tests := []struct {
		name   string
		wire   []byte
		immOff int
		want   CmdFields
		// enc, if set, is what the encoder is given instead of want
		// (for instance a CDB shorter than 16 bytes).
		enc      *CmdFields
		external bool
	}{
		{name: "capture INQUIRY", wire: capCmdInquiry, want: CmdFields{
			Tag: tagOf("1800000000000000"), CDB: h("12000000240000000000000000000000"),
			DataIn: DataBuf{Format: DescDirect, Direct: DirectDesc{VA: 0xff2a84fe1bc8b900, Key: 0x3d3, Len: 36}},
		}, enc: &CmdFields{
			Tag: tagOf("1800000000000000"), CDB: inq,
			DataIn: DataBuf{Format: DescDirect, Direct: DirectDesc{VA: 0xff2a84fe1bc8b900, Key: 0x3d3, Len: 36}},
		}},
		{name: "capture TEST UNIT READY", wire: capCmdTUR, want: CmdFields{
			Tag: tagOf("1d00000000000000"), CDB: make([]byte, 16),
		}},
		{name: "capture READ CAPACITY(16)", wire: capCmdReadCap16, want: CmdFields{
			Tag: tagOf("1d00000000000000"), CDB: h("9e100000000000000000000000200000"),
			DataIn: DataBuf{Format: DescDirect, Direct: DirectDesc{VA: 0xff2a84fe1a34b400, Key: 0x3ed, Len: 32}},
		}},
		{name: "capture READ(10)", wire: capCmdRead10, want: CmdFields{
			Tag: tagOf("1800000000000000"), CDB: h("28000000008000006000000000000000"),
			DataIn: DataBuf{Format: DescDirect, Direct: DirectDesc{VA: 0xff2a84fe02eee000, Key: 0x489, Len: 0xc000}},
		}},
		{name: "capture WRITE(10)", wire: capCmdWrite10, want: CmdFields{
			Tag: tagOf("1e00000000000000"), CDB: h("2a000000000000006000000000000000"),
			DataOut: DataBuf{Format: DescDirect, Direct: DirectDesc{VA: 0xff2a84fe02eee000, Key: 0x3f5, Len: 0xc000}},
		}},
		{name: "indirect data-in, complete table", wire: kCmdIndirectIn, want: CmdFields{
			Tag: tagOf("2000000000000000"), CDB: h("88000000000000001000000000180000"),
			DataIn: DataBuf{Format: DescIndirect,
				Table: DirectDesc{VA: 0xdeadb000, Key: 0x1234, Len: 48}, Total: 0x3000,
				List: descs(DirectDesc{0x10000000, 0x101, 0x1000}, DirectDesc{0x10002000, 0x102, 0x1000},
					DirectDesc{0x10005000, 0x103, 0x1000})},
		}},
		{name: "indirect data-out, external table", wire: kCmdIndirectExt, external: true, want: CmdFields{
			Tag: tagOf("2100000000000000"), LUN: lunOf("0001000000000000"), TaskAttr: TaskOrdered,
			CDB: h("2a000000080000002000000000000000"),
			DataOut: DataBuf{Format: DescIndirect,
				Table: DirectDesc{VA: 0xcafe0000, Key: 0x5678, Len: 64}, Total: 0x4000,
				List: descs(DirectDesc{0x20000000, 0x201, 0x1000}, DirectDesc{0x20003000, 0x202, 0x1000})},
		}},
		{name: "immediate data at 68", wire: kCmdImm, immOff: 68, want: CmdFields{
			Tag: tagOf("2200000000000000"), CDB: h("2a000000001000000100000000000000"),
			DataOut:       DataBuf{Format: DescImmediate, Total: 8, Imm: h("0102030405060708")},
			ImmDataOffset: 68,
		}},
		{name: "additional CDB (READ(32))", wire: kCmdAddCDB, want: CmdFields{
			Tag:    tagOf("2300000000000000"),
			CDB:    h("7f00000000000018000900000000000000000400000000000000000000000008"),
			DataIn: DataBuf{Format: DescDirect, Direct: DirectDesc{VA: 0x30000000, Key: 0x301, Len: 0x1000}},
		}},
		{name: "bidirectional", wire: kCmdBidi, want: CmdFields{
			SolNot: SCSOLNT | UCSOLNT, Tag: tagOf("2400000000000000"), CDB: h("53000000000000000100000000000000"),
			DataOut: DataBuf{Format: DescDirect, Direct: DirectDesc{VA: 0x40000000, Key: 0x401, Len: 0x200}},
			DataIn:  DataBuf{Format: DescDirect, Direct: DirectDesc{VA: 0x40001000, Key: 0x402, Len: 0x200}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := append(append([]byte{}, tc.wire...), 0xaa, 0xbb) // trailing bytes are cut off
			c, err := ParseCmd(in, tc.immOff)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(c, tc.wire) {
				t.Fatalf("view %x", []byte(c))
			}
			got := c.Fields(tc.immOff)
			if !eqCmd(&got, &tc.want) {
				t.Fatalf("decoded %+v\nwant    %+v", got, tc.want)
			}
			for _, d := range []DataBuf{c.DataOut(), c.DataIn()} {
				if d.External() != (tc.external && d.Format == DescIndirect) {
					t.Fatalf("External() = %v", d.External())
				}
			}
			enc := tc.enc
			if enc == nil {
				enc = &tc.want
			}
			buf := bytes.Repeat([]byte{0xee}, len(tc.wire)+32)
			n, err := Cmd(buf).Encode(enc)
			if err != nil || !bytes.Equal(buf[:n], tc.wire) {
				t.Fatalf("encoded %x (%v)\nwant    %x", buf[:n], err, tc.wire)
			}
		})
	}
}

func TestCmdAccessors(t *testing.T) {
	c, err := ParseCmd(kCmdIndirectExt, 0)
	if err != nil {
		t.Fatal(err)
	}
	if c.DataOutFormat() != DescIndirect || c.DataInFormat() != DescNone {
		t.Fatal("formats")
	}
	d := c.DataOut()
	if !d.External() || d.TableCount() != 4 || d.NumDescs() != 2 || d.DataLen() != 0x4000 {
		t.Fatalf("indirect %+v", d)
	}
	if d.Desc(1) != (DirectDesc{0x20003000, 0x202, 0x1000}) {
		t.Fatal("Desc(1)")
	}
	if c.ImmData(68) != nil || c.AddCDBLen() != 0 || c.TaskAttr() != TaskOrdered {
		t.Fatal("accessors")
	}

	c, _ = ParseCmd(kCmdIndirectIn, 0)
	if d := c.DataIn(); d.External() || d.NumDescs() != 3 || d.List.TotalLen() != 0x3000 {
		t.Fatalf("complete table %+v", d)
	}
	c, _ = ParseCmd(kCmdAddCDB, 0)
	if c.AddCDBLen() != 16 || len(c.CDB()) != 32 || c.DataIn().Desc(0).VA != 0x30000000 {
		t.Fatal("additional CDB")
	}
	c, _ = ParseCmd(kCmdImm, DefaultImmDataOffset)
	if d := c.DataOut(); d.DataLen() != 8 || d.NumDescs() != 0 || !bytes.Equal(c.ImmData(68), h("0102030405060708")) {
		t.Fatal("immediate")
	}
	// ib_srp sends the immediate data as further SGEs: Encode with a nil
	// Imm writes the 68-byte header only.
	f := c.Fields(68)
	f.DataOut.Imm = nil
	buf := make([]byte, 68)
	if n, err := Cmd(buf).Encode(&f); err != nil || n != 68 || !bytes.Equal(buf, kCmdImm[:68]) {
		t.Fatalf("header-only encode: %d %v", n, err)
	}
	// The ib_srp layout in general: a direct descriptor after the
	// additional CDB; here a 6-byte CDB is zero-padded.
	c, _ = ParseCmd(capCmdInquiry, 0)
	if c.DataIn().Desc(0) != (DirectDesc{0xff2a84fe1bc8b900, 0x3d3, 36}) || c.Tag() != tagOf("1800000000000000") {
		t.Fatal("capture accessors")
	}
}

func TestGoldenRsp(t *testing.T) {
	sense := capRspSense[36:]
	tests := []struct {
		name string
		wire []byte
		want RspFields
		tm   int // expected TM response code, -1 if none
	}{
		{"capture GOOD", capRspGood, RspFields{ReqLimDelta: 1, Tag: tagOf("1800000000000000")}, -1},
		{"capture DIUNDER", capRspDIUnder, RspFields{ReqLimDelta: 1, Tag: tagOf("1e00000000000000"),
			Flags: DIUnder, DataInResid: 24}, -1},
		{"capture CHECK CONDITION with sense", capRspSense, RspFields{ReqLimDelta: 1, Tag: tagOf("1b00000000000000"),
			Flags: SnsValid, Status: 0x02, Sense: sense}, -1},
		{"task management response", kRspTM, RspFields{ReqLimDelta: 1, Tag: tagOf("0100008000000000"),
			Flags: RspValid, RespData: h("00000005")}, int(TMFailed)},
		{"DOOVER", kRspDOOver, RspFields{SolNot: SOLNT, ReqLimDelta: 2, Tag: tagOf("2500000000000000"),
			Flags: DOOver, DataOutResid: 512}, -1},
		{"response and sense data", kRspBoth, RspFields{ReqLimDelta: 1, Tag: tagOf("2600000000000000"),
			Flags: RspValid | SnsValid, Status: 2, RespData: h("00000000"),
			Sense: h("700006000000000a00000000290000000000")}, int(TMSuccess)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseRsp(append(append([]byte{}, tc.wire...), 0x77))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(r, tc.wire) {
				t.Fatalf("view %x", []byte(r))
			}
			got := r.Fields()
			if !eqRsp(&got, &tc.want) {
				t.Fatalf("decoded %+v\nwant    %+v", got, tc.want)
			}
			code, ok := r.TMResponse()
			if ok != (tc.tm >= 0) || (ok && int(code) != tc.tm) {
				t.Fatalf("TMResponse %v %v", code, ok)
			}
			buf := bytes.Repeat([]byte{0xee}, len(tc.wire)+8)
			n, err := Rsp(buf).Encode(&tc.want, 8260)
			if err != nil || !bytes.Equal(buf[:n], tc.wire) {
				t.Fatalf("encoded %x (%v)\nwant    %x", buf[:n], err, tc.wire)
			}
		})
	}
}

func TestRspSenseTruncation(t *testing.T) {
	f := RspFields{ReqLimDelta: 1, Status: 2, Sense: capRspSense[36:]}
	buf := make([]byte, 256)
	// ib_srpt: sense truncated to max_ti_iu_len - 36.
	n, err := Rsp(buf).Encode(&f, 100)
	if err != nil || n != 100 {
		t.Fatalf("n=%d err=%v", n, err)
	}
	r, err := ParseRsp(buf[:n])
	if err != nil || len(r.Sense()) != 64 || !bytes.Equal(r.Sense(), f.Sense[:64]) || r.Flags() != SnsValid {
		t.Fatalf("truncated rsp %x %v", buf[:n], err)
	}
	// No room for any sense: SNSVALID clear.
	n, err = Rsp(buf).Encode(&f, RspHdrLen)
	if err != nil || n != RspHdrLen || Rsp(buf).Flags() != 0 {
		t.Fatalf("n=%d err=%v flags=%v", n, err, Rsp(buf).Flags())
	}
	// Response data is never truncated.
	f.RespData = []byte{0, 0, 0, 0}
	if _, err := Rsp(buf).Encode(&f, 38); !isEncErr(err, ErrShortBuffer) {
		t.Fatal(err)
	}
	// No limit.
	if n, err := Rsp(buf).Encode(&f, 0); err != nil || n != 36+4+96 {
		t.Fatal(n, err)
	}
}

// TestGoldenLoginExt: srpd's extension byte sits in bytes SRP reserves (LOGIN_REQ 27, the RDMA
// CM form's 50, LOGIN_RSP 27), and the kernel's own login (the capture) carries none.
func TestGoldenLoginExt(t *testing.T) {
	if r, err := DecodeLoginReqRDMA(capLoginReqRDMA); err != nil || r.Ext != 0 {
		t.Fatalf("kernel REQ: ext %#x, %v", r.Ext, err)
	}
	if r, err := ParseLoginRsp(capLoginRsp); err != nil || r.Ext() != 0 {
		t.Fatalf("kernel RSP: %v", err)
	}
	rd := append([]byte(nil), capLoginReqRDMA...)
	rd[50] = byte(ExtRemoteInvalidate)
	if r, err := DecodeLoginReqRDMA(rd); err != nil || r.Ext != ExtRemoteInvalidate {
		t.Fatalf("RDMA form byte 50: ext %#x, %v", r.Ext, err)
	}
	ib := append([]byte(nil), kLoginReq...)
	ib[27] = byte(ExtRemoteInvalidate)
	if r, err := DecodeLoginReq(ib); err != nil || r.Ext != ExtRemoteInvalidate {
		t.Fatalf("IB form byte 27: ext %#x, %v", r.Ext, err)
	}
	rsp := make([]byte, LoginRspLen)
	if _, err := LoginRsp(rsp).Encode(&LoginRspFields{Ext: ExtRemoteInvalidate}); err != nil {
		t.Fatal(err)
	}
	for i, b := range rsp {
		want := byte(0)
		switch i {
		case 0:
			want = byte(OpLoginRsp)
		case 27:
			want = byte(ExtRemoteInvalidate)
		}
		if b != want {
			t.Fatalf("LOGIN_RSP byte %d = %#x, want %#x", i, b, want)
		}
	}
}
