package srp

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func isEncErr(err error, sentinel error) bool {
	var e *EncodeError
	return errors.As(err, &e) && errors.Is(err, sentinel)
}

// mod returns a copy of b with bytes at off replaced by hex s.
func mod(b []byte, off int, s string) []byte {
	c := append([]byte{}, b...)
	copy(c[off:], h(s))
	return c
}

func parseCmdAt(immOff int) func([]byte) error {
	return func(b []byte) error { _, err := ParseCmd(b, immOff); return err }
}

func TestParseErrors(t *testing.T) {
	pLoginReq := func(b []byte) error { _, err := DecodeLoginReq(b); return err }
	pLoginReqRDMA := func(b []byte) error { _, err := DecodeLoginReqRDMA(b); return err }
	pLoginRsp := func(b []byte) error { _, err := ParseLoginRsp(b); return err }
	pLoginRej := func(b []byte) error { _, err := ParseLoginRej(b); return err }
	pILogout := func(b []byte) error { _, err := ParseILogout(b); return err }
	pTLogout := func(b []byte) error { _, err := ParseTLogout(b); return err }
	pTsk := func(b []byte) error { _, err := ParseTskMgmt(b); return err }
	pCredReq := func(b []byte) error { _, err := ParseCredReq(b); return err }
	pCredRsp := func(b []byte) error { _, err := ParseCredRsp(b); return err }
	pAerReq := func(b []byte) error { _, err := ParseAerReq(b); return err }
	pAerRsp := func(b []byte) error { _, err := ParseAerRsp(b); return err }
	pRsp := func(b []byte) error { _, err := ParseRsp(b); return err }
	pCmd := parseCmdAt(0)
	pCmd68 := parseCmdAt(DefaultImmDataOffset)
	pDescList := func(b []byte) error { _, err := ParseDescList(b); return err }

	tests := []struct {
		name  string
		parse func([]byte) error
		in    []byte
		want  error
		field string // if set, the ParseError's Field
		off   int    // checked when field is set
	}{
		// Truncation and opcode, every decoder.
		{"login req truncated", pLoginReq, kLoginReq[:63], ErrTruncated, "length", 63},
		{"login req opcode", pLoginReq, mod(kLoginReq, 0, "02"), ErrBadOpcode, "opcode", 0},
		{"login req rdma truncated", pLoginReqRDMA, capLoginReqRDMA[:55], ErrTruncated, "length", 55},
		{"login req rdma opcode", pLoginReqRDMA, mod(capLoginReqRDMA, 11, "c0"), ErrBadOpcode, "opcode", 11},
		{"login rsp truncated", pLoginRsp, capLoginRsp[:51], ErrTruncated, "", 0},
		{"login rsp opcode", pLoginRsp, mod(capLoginRsp, 0, "c2"), ErrBadOpcode, "opcode", 0},
		{"login rej truncated", pLoginRej, capLoginRej[:31], ErrTruncated, "", 0},
		{"login rej opcode", pLoginRej, mod(capLoginRej, 0, "c0"), ErrBadOpcode, "", 0},
		{"i_logout truncated", pILogout, kILogout[:15], ErrTruncated, "", 0},
		{"i_logout opcode", pILogout, kTLogout, ErrBadOpcode, "", 0},
		{"t_logout truncated", pTLogout, kTLogout[:8], ErrTruncated, "", 0},
		{"t_logout opcode", pTLogout, kILogout, ErrBadOpcode, "", 0},
		{"tsk_mgmt truncated", pTsk, kTskAbort[:47], ErrTruncated, "", 0},
		{"tsk_mgmt opcode", pTsk, capCmdTUR, ErrBadOpcode, "", 0},
		{"cred_req truncated", pCredReq, kCredReq[:0], ErrTruncated, "", 0},
		{"cred_req opcode", pCredReq, kCredRsp, ErrBadOpcode, "", 0},
		{"cred_rsp truncated", pCredRsp, kCredRsp[:15], ErrTruncated, "", 0},
		{"cred_rsp opcode", pCredRsp, kCredReq, ErrBadOpcode, "", 0},
		{"aer_req truncated header", pAerReq, kAerReq[:35], ErrTruncated, "length", 35},
		{"aer_req sense truncated", pAerReq, kAerReq[:53], ErrTruncated, "sense_data_len", 28},
		{"aer_req opcode", pAerReq, mod(kAerReq, 0, "42"), ErrBadOpcode, "", 0},
		{"aer_rsp truncated", pAerRsp, kAerRsp[:1], ErrTruncated, "", 0},
		{"aer_rsp opcode", pAerRsp, kCredRsp, ErrBadOpcode, "", 0},
		{"rsp truncated header", pRsp, capRspGood[:35], ErrTruncated, "length", 35},
		{"rsp empty", pRsp, nil, ErrTruncated, "length", 0},
		{"rsp bad opcode", pRsp, mod(capRspGood, 0, "c0"), ErrBadOpcode, "opcode", 0},
		{"cmd truncated", pCmd, capCmdTUR[:47], ErrTruncated, "length", 47},
		{"cmd opcode", pCmd, mod(capCmdTUR, 0, "01"), ErrBadOpcode, "opcode", 0},

		// SRP_RSP lengths and flags.
		{"rsp sense truncated", pRsp, capRspSense[:131], ErrTruncated, "sense_data_len", 28},
		{"rsp resp data truncated", pRsp, kRspTM[:39], ErrTruncated, "resp_data_len", 32},
		{"rsp lengths overflow", pRsp, mod(kRspBoth, 28, "ffffffff ffffffff"), ErrLengthOverflow, "sense_data_len", 28},
		{"rsp DOOVER and DOUNDER", pRsp, mod(capRspGood, 18, "0c"), ErrConflictingFlags, "flags", 18},
		{"rsp DIOVER and DIUNDER", pRsp, mod(capRspGood, 18, "30"), ErrConflictingFlags, "flags", 18},
		{"rsp resp data without RSPVALID", pRsp, mod(kRspTM, 18, "00"), ErrConflictingFlags, "resp_data_len", 32},
		{"rsp sense without SNSVALID", pRsp, mod(capRspSense, 18, "00"), ErrConflictingFlags, "sense_data_len", 28},

		// SRP_CMD.
		{"cmd additional CDB truncated", pCmd, kCmdAddCDB[:60], ErrTruncated, "add_cdb_len", 31},
		{"cmd data-out format reserved", pCmd, mod(capCmdTUR, 5, "40"), ErrUnsupportedFormat, "buf_fmt", 5},
		{"cmd data-in immediate", pCmd68, mod(kCmdImm, 5, "03"), ErrUnsupportedFormat, "buf_fmt", 5},
		{"cmd data-in format reserved", pCmd, mod(capCmdTUR, 5, "0f"), ErrUnsupportedFormat, "buf_fmt", 5},
		{"cmd immediate not negotiated", pCmd, kCmdImm, ErrUnsupportedFormat, "buf_fmt", 5},
		{"cmd direct descriptor overrun", pCmd, capCmdRead10[:63], ErrDescriptorOverrun, "data_in_desc", 48},
		{"cmd data-in after data-out overrun", pCmd, kCmdBidi[:79], ErrDescriptorOverrun, "data_in_desc", 64},
		{"cmd direct descriptor missing", pCmd, mod(capCmdTUR, 5, "01"), ErrDescriptorOverrun, "data_in_desc", 48},
		{"cmd indirect header overrun", pCmd, kCmdIndirectIn[:67], ErrDescriptorOverrun, "data_in_desc", 48},
		{"cmd indirect count overruns IU", pCmd, kCmdIndirectIn[:115], ErrDescriptorOverrun, "data_in_desc_cnt", 7},
		{"cmd indirect count overruns IU (external)", pCmd, mod(kCmdIndirectExt, 6, "03"), ErrDescriptorOverrun, "data_out_desc_cnt", 6},
		{"cmd indirect table len not multiple of 16", pCmd, mod(kCmdIndirectIn, 60, "00000031"), ErrTableLenMismatch, "data_in_desc.table_desc.len", 60},
		{"cmd indirect count exceeds table", pCmd, mod(kCmdIndirectIn, 60, "00000020"), ErrTableLenMismatch, "data_in_desc_cnt", 7},
		{"cmd indirect empty table with count", pCmd, mod(kCmdIndirectExt, 60, "00000000"), ErrTableLenMismatch, "data_out_desc_cnt", 6},
		{"cmd indirect total length mismatch", pCmd, mod(kCmdIndirectIn, 64, "00003001"), ErrTotalLenMismatch, "data_in_desc.len", 64},
		{"cmd immediate descriptor overrun", pCmd68, kCmdImm[:51], ErrDescriptorOverrun, "data_out_desc", 48},
		{"cmd immediate offset before descriptor end", parseCmdAt(50), kCmdImm, ErrImmOffset, "imm_data_offset", 48},
		{"cmd immediate offset past IU", parseCmdAt(200), kCmdImm, ErrImmOffset, "imm_data_offset", 48},
		{"cmd immediate offset before data-in descriptor end", parseCmdAt(64),
			append(mod(kCmdImm, 5, "31")[:68], make([]byte, 16)...), ErrImmOffset, "imm_data_offset", 48},
		{"cmd immediate length overflow", pCmd68, mod(kCmdImm, 48, "ffffffff"), ErrLengthOverflow, "imm_buf.len", 48},
		{"cmd immediate offset past IU (large)", parseCmdAt(0xffff), append(mod(capCmdTUR, 5, "30"), h("fffeffff")...), ErrImmOffset, "imm_data_offset", 48},
		{"cmd immediate data truncated", pCmd68, kCmdImm[:75], ErrTruncated, "imm_buf.len", 48},

		{"desc list length", pDescList, make([]byte, 17), ErrTableLenMismatch, "desc_list", 16},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.parse(tc.in)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("%T is not a *ParseError", err)
			}
			if tc.field != "" && (pe.Field != tc.field || pe.Off != tc.off) {
				t.Fatalf("field %q off %d, want %q %d (%v)", pe.Field, pe.Off, tc.field, tc.off, err)
			}
			if !strings.HasPrefix(err.Error(), "srp: parse ") {
				t.Fatalf("message %q", err)
			}
		})
	}
}

func TestImmOverflow(t *testing.T) {
	// The ib_srpt bug fixed by check_add_overflow (imm_data_offset + len
	// wrapping in u32): here offset+len is computed in 64 bits and rejected.
	b := mod(kCmdImm, 48, "ffffffbc") // 68 + 0xffffffbc == 1<<32
	if _, err := ParseCmd(b, 68); !errors.Is(err, ErrLengthOverflow) {
		t.Fatal(err)
	}
	b = mod(kCmdImm, 48, "ffffffbb") // fits in 32 bits, but not in the IU
	if _, err := ParseCmd(b, 68); !errors.Is(err, ErrTruncated) {
		t.Fatal(err)
	}
}

func TestEncodeErrors(t *testing.T) {
	direct := DataBuf{Format: DescDirect, Direct: DirectDesc{1, 2, 3}}
	list2 := descs(DirectDesc{1, 2, 0x100}, DirectDesc{3, 4, 0x100})
	tests := []struct {
		name string
		f    CmdFields
		buf  int
		want error
	}{
		{"short buffer", CmdFields{DataIn: direct}, 63, ErrShortBuffer},
		{"CDB too long", CmdFields{CDB: make([]byte, 16+MaxAddCDBLen+1)}, 512, ErrInvalidField},
		{"data-in immediate", CmdFields{DataIn: DataBuf{Format: DescImmediate}}, 512, ErrUnsupportedFormat},
		{"reserved format", CmdFields{DataOut: DataBuf{Format: 7}}, 512, ErrUnsupportedFormat},
		{"table len not multiple of 16", CmdFields{DataIn: DataBuf{Format: DescIndirect,
			Table: DirectDesc{Len: 33}, Total: 0x200, List: list2}}, 512, ErrTableLenMismatch},
		{"list longer than table", CmdFields{DataIn: DataBuf{Format: DescIndirect,
			Table: DirectDesc{Len: 16}, Total: 0x200, List: list2}}, 512, ErrTableLenMismatch},
		{"total mismatch", CmdFields{DataIn: DataBuf{Format: DescIndirect,
			Table: DirectDesc{Len: 32}, Total: 0x201, List: list2}}, 512, ErrTotalLenMismatch},
		{"list not multiple of 16", CmdFields{DataIn: DataBuf{Format: DescIndirect,
			Table: DirectDesc{Len: 32}, List: make(DescList, 17)}}, 512, ErrInvalidField},
		{"list longer than 255", CmdFields{DataIn: DataBuf{Format: DescIndirect,
			Table: DirectDesc{Len: 256 * 16}, List: make(DescList, 256*16)}}, 8192, ErrInvalidField},
		{"immediate offset inside descriptors", CmdFields{DataOut: DataBuf{Format: DescImmediate, Total: 1},
			ImmDataOffset: 51}, 512, ErrImmOffset},
		{"immediate offset inside data-in descriptor", CmdFields{DataOut: DataBuf{Format: DescImmediate, Total: 1},
			DataIn: direct, ImmDataOffset: 60}, 512, ErrImmOffset},
		{"immediate length mismatch", CmdFields{DataOut: DataBuf{Format: DescImmediate, Total: 2, Imm: []byte{1}},
			ImmDataOffset: 68}, 512, ErrInvalidField},
		{"immediate length overflow", CmdFields{DataOut: DataBuf{Format: DescImmediate, Total: 0xffffffff},
			ImmDataOffset: 68}, 512, ErrLengthOverflow},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			buf := make([]byte, tc.buf)
			if _, err := Cmd(buf).Encode(&tc.f); !isEncErr(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			} else if !strings.HasPrefix(err.Error(), "srp: encode SRP_CMD: ") {
				t.Fatalf("message %q", err)
			}
		})
	}

	buf := make([]byte, 256)
	if _, err := Rsp(buf).Encode(&RspFields{Flags: DIOver | DIUnder}, 0); !isEncErr(err, ErrConflictingFlags) {
		t.Fatal(err)
	}
	if _, err := Rsp(buf[:40]).Encode(&RspFields{Sense: make([]byte, 8)}, 0); !isEncErr(err, ErrShortBuffer) {
		t.Fatal(err)
	}
	if _, err := AerReq(buf[:40]).Encode(&AerReqFields{Sense: make([]byte, 8)}); !isEncErr(err, ErrShortBuffer) {
		t.Fatal(err)
	}
	var r LoginReq
	if _, err := r.Encode(buf[:63]); !isEncErr(err, ErrShortBuffer) {
		t.Fatal(err)
	}
	if _, err := r.EncodeRDMA(buf[:55]); !isEncErr(err, ErrShortBuffer) {
		t.Fatal(err)
	}
	if _, err := LoginRsp(buf[:51]).Encode(&LoginRspFields{}); !isEncErr(err, ErrShortBuffer) {
		t.Fatal(err)
	}
	if _, err := LoginRej(buf[:31]).Encode(&LoginRejFields{}); !isEncErr(err, ErrShortBuffer) {
		t.Fatal(err)
	}
}

func TestPortID(t *testing.T) {
	p := MakePortID(0x505400fffe770001, 0x505400fffe770002)
	if s := p.String(); s != "0x505400fffe770001505400fffe770002" {
		t.Fatal(s)
	}
	if p.IDExt() != 0x505400fffe770001 || p.GUID() != 0x505400fffe770002 {
		t.Fatal("halves")
	}
	for _, s := range []string{
		"0x505400fffe770001505400fffe770002",
		"505400fffe770001505400fffe770002",
		"5054:00ff:fe77:0001:5054:00ff:fe77:0002",
		"0X505400FFFE770001505400FFFE770002",
	} {
		q, err := ParsePortID(s)
		if err != nil || q != p {
			t.Fatalf("%q: %v %v", s, q, err)
		}
	}
	for _, s := range []string{"", "0x1234", "505400fffe770001505400fffe77000g", "505400fffe770001505400fffe77000200"} {
		if _, err := ParsePortID(s); err == nil {
			t.Fatalf("%q accepted", s)
		}
	}
}

func TestStrings(t *testing.T) {
	checks := []struct{ got, want string }{
		{OpCmd.String(), "SRP_CMD"},
		{OpLoginRej.String(), "SRP_LOGIN_REJ"},
		{Opcode(0x99).String(), "SRP_OPCODE(0x99)"},
		{DescIndirect.String(), "indirect"},
		{DescFormat(9).String(), "DescFormat(9)"},
		{TMLUNReset.String(), "LOGICAL UNIT RESET"},
		{TaskMgmtFunc(3).String(), "TaskMgmtFunc(0x3)"},
		{TMFuncNotSupported.String(), "function not supported"},
		{TaskACA.String(), "ACA"},
		{TLogoutInvalidIULength.String(), "invalid IU length"},
		{TLogoutReason(7).String(), "TLogoutReason(7)"},
		{Tag{1, 2}.String(), "0102000000000000"},
		{LUN{0, 1}.String(), "0001000000000000"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("got %q want %q", c.got, c.want)
		}
	}
	for _, op := range []Opcode{OpLoginReq, OpTskMgmt, OpCmd, OpILogout, OpCredRsp, OpAerRsp,
		OpTLogout, OpCredReq, OpAerReq, OpLoginRsp, OpRsp, OpLoginRej} {
		if strings.HasPrefix(op.String(), "SRP_OPCODE") {
			t.Errorf("%#x unnamed", uint8(op))
		}
	}
	op, err := PeekOpcode(capRspGood)
	if err != nil || op != OpRsp {
		t.Fatal(op, err)
	}
	if _, err := PeekOpcode(nil); !errors.Is(err, ErrTruncated) {
		t.Fatal(err)
	}
}

func TestDescList(t *testing.T) {
	l := make(DescList, 3*DirectDescLen)
	for i := 0; i < 3; i++ {
		l.Set(i, DirectDesc{VA: uint64(i) << 32, Key: uint32(i), Len: 0x1000})
	}
	p, err := ParseDescList(l)
	if err != nil || p.Len() != 3 || p.At(2).VA != 2<<32 || p.TotalLen() != 0x3000 || p.Prefix(2).Len() != 2 {
		t.Fatal(p, err)
	}
	if !bytes.Equal(descs(l.At(0), l.At(1), l.At(2)), l) {
		t.Fatal("Append")
	}
}
