package wire

import (
	"errors"
	"testing"
	"time"
)

func TestPSN(t *testing.T) {
	for _, tc := range []struct {
		a, b PSN
		cmp  int
		sub  int32
	}{
		{0, 0, 0, 0},
		{1, 0, 1, 1},
		{0, 1, -1, -1},
		{0, PSNMask, 1, 1},           // wrap: 0 is after 0xFFFFFF
		{PSNMask, 0, -1, -1},         // and 0xFFFFFF before 0
		{0x7FFFFF, 0, 1, 0x7FFFFF},   // half window
		{0x800000, 0, -1, -0x800000}, // exactly half: rxe treats as "before"
		{10, 0xFFFFF0, 1, 26},
	} {
		if got := tc.a.Compare(tc.b); got != tc.cmp {
			t.Errorf("Compare(%#x,%#x) = %d want %d", tc.a, tc.b, got, tc.cmp)
		}
		if got := tc.a.Sub(tc.b); got != tc.sub {
			t.Errorf("Sub(%#x,%#x) = %d want %d", tc.a, tc.b, got, tc.sub)
		}
		if tc.a.Less(tc.b) != (tc.cmp < 0) || tc.a.LessEq(tc.b) != (tc.cmp <= 0) {
			t.Errorf("Less/LessEq(%#x,%#x)", tc.a, tc.b)
		}
	}
	if PSN(PSNMask).Add(1) != 0 || PSN(PSNMask).Inc() != 0 || PSN(5).Add(PSNMask) != 4 {
		t.Error("Add wrap")
	}
	if !PSN(PSNMask).Valid() || PSN(PSNMask+1).Valid() {
		t.Error("Valid")
	}
	// Add/Sub are inverse within the window.
	for _, p := range []PSN{0, 1, 0x123456, PSNMask} {
		for _, n := range []uint32{0, 1, 1000, 0x7FFFFF} {
			if q := p.Add(n); q.Sub(p) != int32(n) || !p.LessEq(q) {
				t.Errorf("%#x + %d", p, n)
			}
		}
	}
}

func TestBTH(t *testing.T) {
	for _, tc := range []struct {
		f    BTHFields
		want string
	}{
		{BTHFields{Opcode: RCAcknowledge, PKey: 0xFFFF, DestQP: 0x11, PSN: 0x100}, "1100ffff0000001100000100"},
		{BTHFields{Opcode: UCSendOnly, MigReq: true, PadCount: 2, PKey: 0xFFFF, DestQP: 211, PSN: 13571856}, "2460ffff000000d300cf1710"},
		{BTHFields{Opcode: CNP, PKey: 0xFFFF, BECN: true, DestQP: 0x118}, "8100ffff40000118" + "00000000"},
		{BTHFields{Opcode: RCSendOnly, SolicitedEvent: true, PadCount: 3, TVer: 0, PKey: 0x8001, FECN: true, BECN: true,
			DestQP: 0xFFFFFF, AckReq: true, PSN: PSNMask}, "04b08001c0ffffff80ffffff"},
	} {
		b := make(BTH, BTHLen)
		b.Encode(&tc.f)
		if got := hexs(b); got != tc.want {
			t.Errorf("Encode(%+v) = %s want %s", tc.f, got, tc.want)
		}
		if got := b.Fields(); got != tc.f {
			t.Errorf("Fields = %+v want %+v", got, tc.f)
		}
		// Setters reproduce Encode.
		c := make(BTH, BTHLen)
		c.SetOpcode(tc.f.Opcode)
		c.SetSolicitedEvent(tc.f.SolicitedEvent)
		c.SetMigReq(tc.f.MigReq)
		c.SetPadCount(int(tc.f.PadCount))
		c.SetTVer(tc.f.TVer)
		c.SetPKey(tc.f.PKey)
		c.SetFECN(tc.f.FECN)
		c.SetBECN(tc.f.BECN)
		c.SetDestQP(tc.f.DestQP)
		c.SetAckReq(tc.f.AckReq)
		c.SetPSN(tc.f.PSN)
		if string(c) != string(b) {
			t.Errorf("setters %x != Encode %x", []byte(c), []byte(b))
		}
	}
	// Setters clear bits too and mask values.
	b := BTH(unhex(t, "ffffffffffffffffffffffff"))
	b.SetSolicitedEvent(false)
	b.SetMigReq(false)
	b.SetPadCount(0)
	b.SetTVer(0)
	b.SetFECN(false)
	b.SetBECN(false)
	b.SetAckReq(false)
	b.SetDestQP(0x1000001)
	b.SetPSN(0x1000002)
	if got := hexs(b); got != "ff00ffff3f000001"+"7f000002" {
		t.Errorf("clear: %s", got)
	}
}

func TestExtHeaders(t *testing.T) {
	r := make(RETH, RETHLen)
	rf := RETHFields{VA: 0x0102030405060708, RKey: 0xA1B2C3D4, DMALen: 0x10000}
	r.Encode(&rf)
	if hexs(r) != "0102030405060708a1b2c3d400010000" || r.Fields() != rf {
		t.Errorf("RETH %s", hexs(r))
	}
	a := make(AETH, AETHLen)
	af := AETHFields{Syndrome: SyndromeACKUnlimited, MSN: 0x123456}
	a.Encode(&af)
	if hexs(a) != "1f123456" || a.Fields() != af {
		t.Errorf("AETH %s", hexs(a))
	}
	a.SetMSN(0x1ABCDEF)
	if a.MSN() != 0xABCDEF {
		t.Error("MSN mask")
	}
	d := make(DETH, DETHLen)
	df := DETHFields{QKey: GSIQKey, SrcQP: 1}
	d.Encode(&df)
	if hexs(d) != "8001000000000001" || d.Fields() != df {
		t.Errorf("DETH %s", hexs(d))
	}
	i := make(IETH, IETHLen)
	i.SetRKey(0xDEADBEEF)
	im := make(ImmDt, ImmDtLen)
	im.SetImm(0xCAFEF00D)
	if hexs(i) != "deadbeef" || i.RKey() != 0xDEADBEEF || hexs(im) != "cafef00d" || im.Imm() != 0xCAFEF00D {
		t.Error("IETH/ImmDt")
	}
	at := AtomicETH(unhex(t, "0000000000001000 00000abc 0000000000000005 0000000000000007"))
	if at.VA() != 0x1000 || at.RKey() != 0xABC || at.SwapAdd() != 5 || at.Compare() != 7 {
		t.Error("AtomicETH")
	}
	if AtomicAckETH(unhex(t, "1122334455667788")).OrigData() != 0x1122334455667788 {
		t.Error("AtomicAckETH")
	}
	if RDETH(unhex(t, "00abcdef")).EEContext() != 0xABCDEF {
		t.Error("RDETH")
	}
	f := FETH(unhex(t, "00000023"))
	if f.SelectivityLevel() != 2 || f.PlacementType() != 3 {
		t.Error("FETH")
	}
}

func TestSyndrome(t *testing.T) {
	for _, tc := range []struct {
		s       Syndrome
		typ     SyndromeType
		credits int
		valid   bool
		str     string
	}{
		{0x00, SyndromeACK, 0, true, "ACK(credits=0)"},
		{0x1E, SyndromeACK, 30, true, "ACK(credits=30)"},
		{0x1F, SyndromeACK, 0, false, "ACK"},
		{0x20, SyndromeRNRNAK, 0, false, "RNR_NAK(timer=0)"},
		{0x2E, SyndromeRNRNAK, 0, false, "RNR_NAK(timer=14)"},
		{0x40, SyndromeReserved, 0, false, "Syndrome(0x40)"},
		{0x60, SyndromeNAK, 0, false, "NAK(PSN_SEQUENCE_ERROR)"},
		{0x61, SyndromeNAK, 0, false, "NAK(INVALID_REQUEST)"},
		{0x62, SyndromeNAK, 0, false, "NAK(REMOTE_ACCESS_ERROR)"},
		{0x63, SyndromeNAK, 0, false, "NAK(REMOTE_OPERATIONAL_ERROR)"},
		{0x64, SyndromeNAK, 0, false, "NAK(INVALID_RD_REQUEST)"},
		{0x65, SyndromeNAK, 0, false, "NAK(NakCode(0x65))"},
		{0x9F, SyndromeReserved, 0, false, "Syndrome(0x9f)"},
	} {
		if tc.s.Type() != tc.typ {
			t.Errorf("%#x type %v", uint8(tc.s), tc.s.Type())
		}
		n, ok := tc.s.Credits()
		if n != tc.credits || ok != tc.valid {
			t.Errorf("%#x credits %d %v", uint8(tc.s), n, ok)
		}
		if tc.s.String() != tc.str {
			t.Errorf("%#x String %q want %q", uint8(tc.s), tc.s.String(), tc.str)
		}
	}
	if ACKSyndrome(5) != 5 || ACKSyndrome(31) != SyndromeACKUnlimited || ACKSyndrome(-1) != SyndromeACKUnlimited {
		t.Error("ACKSyndrome")
	}
	if RNRNAKSyndrome(14) != 0x2E || Syndrome(0x2E).RNRTimer() != 14 {
		t.Error("RNR")
	}
	for c := NakPSNSequenceError; c <= NakRemoteOperational; c++ {
		if !c.Known() || c.Syndrome().NakCode() != c || c.Syndrome().Type() != SyndromeNAK {
			t.Errorf("nak %v", c)
		}
	}
	if NakInvalidRDRequest.Known() {
		t.Error("0x64 is not an rxe NAK code")
	}
	if RNRTimer(0).Duration() != 655360*time.Microsecond || RNRTimer(1).Duration() != 10*time.Microsecond ||
		RNRTimer(25).Duration() != 61440*time.Microsecond || RNRTimer(31).Duration() != 491520*time.Microsecond {
		t.Error("RNR durations")
	}
}

func TestMAD(t *testing.T) {
	m := make(MAD, MADLen)
	f := MADFields{BaseVersion: MADBaseVersion, MgmtClass: MgmtClassCM, ClassVersion: CMClassVersion,
		Method: MADMethodSend, Status: 0x1234, ClassSpecific: 0x5678, TransactionID: 0x0102030405060708,
		AttributeID: CMAttrREQ, AttributeModifier: 0xA0B0C0D0}
	m.Encode(&f)
	if hexs(m[:MADHeaderLen]) != "01070203123456780102030405060708"+"00100000a0b0c0d0" || m.Fields() != f {
		t.Errorf("MAD %s", hexs(m[:MADHeaderLen]))
	}
	m.SetTransactionID(9)
	m.SetAttributeID(CMAttrREP)
	m.SetAttributeModifier(7)
	m.SetStatus(0)
	if m.TransactionID() != 9 || m.AttributeID() != CMAttrREP || m.AttributeModifier() != 7 || m.Status() != 0 || len(m.Data()) != MADLen-MADHeaderLen {
		t.Error("MAD setters")
	}
	if _, err := ParseMAD(make([]byte, 23)); !errors.Is(err, ErrMADTooShort) {
		t.Error(err)
	}
}

func TestOpcodeTable(t *testing.T) {
	for _, tc := range []struct {
		op    Opcode
		name  string
		hlen  int
		flags OpFlags
	}{
		{RCSendFirst, "RC_SEND_FIRST", 12, Send | HasPayload | Request | First | ConsumesRecvWQE},
		{RCSendOnlyWithImmediate, "RC_SEND_ONLY_WITH_IMMEDIATE", 16, Send | HasImmDt | First | Last | Completes},
		{RCRDMAWriteFirst, "RC_RDMA_WRITE_FIRST", 28, Write | HasRETH | First},
		{RCRDMAWriteMiddle, "RC_RDMA_WRITE_MIDDLE", 12, Write | Middle},
		{RCRDMAWriteOnlyWithImmediate, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 32, Write | HasRETH | HasImmDt | ConsumesRecvWQE},
		{RCRDMAReadRequest, "RC_RDMA_READ_REQUEST", 28, Read | HasRETH | First | Last},
		{RCRDMAReadResponseFirst, "RC_RDMA_READ_RESPONSE_FIRST", 16, ReadResp | Response | HasAETH | First},
		{RCRDMAReadResponseMiddle, "RC_RDMA_READ_RESPONSE_MIDDLE", 12, ReadResp | Middle},
		{RCAcknowledge, "RC_ACKNOWLEDGE", 16, Ack | HasAETH},
		{RCAtomicAcknowledge, "RC_ATOMIC_ACKNOWLEDGE", 24, Ack | HasAETH | HasAtomicAckETH},
		{RCCompareSwap, "RC_COMPARE_SWAP", 40, Atomic | HasAtomicETH},
		{RCSendOnlyWithInvalidate, "RC_SEND_ONLY_WITH_INVALIDATE", 16, Send | HasIETH | First | Last},
		{RCFlush, "RC_FLUSH", 32, FlushOp | HasFETH | HasRETH},
		{RCAtomicWrite, "RC_ATOMIC_WRITE", 28, AtomicWrite | HasRETH | HasPayload},
		{UCRDMAWriteOnly, "UC_RDMA_WRITE_ONLY", 28, Write | HasRETH},
		{RDSendOnly, "RD_SEND_ONLY", 24, Send | HasRDETH | HasDETH},
		{RDCompareSwap, "RD_COMPARE_SWAP", 52, Atomic | HasRDETH | HasDETH | HasAtomicETH},
		{RDAcknowledge, "RD_ACKNOWLEDGE", 20, Ack | HasRDETH | HasAETH},
		{UDSendOnly, "UD_SEND_ONLY", 20, Send | HasDETH | HasPayload},
		{UDSendOnlyWithImmediate, "UD_SEND_ONLY_WITH_IMMEDIATE", 24, Send | HasDETH | HasImmDt},
		{CNP, "CNP", 12, Congestion | HasPayload},
	} {
		if !tc.op.Valid() || tc.op.String() != tc.name || tc.op.HeaderLen() != tc.hlen || !tc.op.Is(tc.flags) {
			t.Errorf("%#x: valid %v name %q hlen %d flags %#x", uint8(tc.op), tc.op.Valid(), tc.op, tc.op.HeaderLen(), tc.op.Flags())
		}
	}
	// Counts: RC 25 (0x00-0x14, 0x16, 0x17, 0x1C, 0x1D), UC 12, RD 21, UD 2, CNP 1.
	n := map[Transport]int{}
	for i := range 256 {
		if op := Opcode(i); op.Valid() {
			n[op.Transport()]++
			if op.HeaderLen() > MaxHeaderLen || op.HeaderLen()%4 != 0 {
				t.Errorf("%v header len %d", op, op.HeaderLen())
			}
			if op.Flags()&(Request|Response|Congestion) == 0 {
				t.Errorf("%v neither request nor response", op)
			}
		} else if op.String() == "" || op.HeaderLen() != 0 || op.Flags() != 0 || op.Is(Send) {
			t.Errorf("invalid opcode %#x has properties", i)
		}
	}
	if n[TransportRC] != 25 || n[TransportUC] != 12 || n[TransportRD] != 21 || n[TransportUD] != 2 || n[TransportCNP] != 1 {
		t.Errorf("opcode counts %v", n)
	}
	if Opcode(0x15).Valid() || Opcode(0x66).Valid() || Opcode(0x80).Valid() || Opcode(0x2C).Valid() {
		t.Error("unexpected opcode valid")
	}
	if TransportUD.String() != "UD" || Transport(0xE0).String() != "Transport(0xe0)" {
		t.Error("transport names")
	}
}

func TestParseErrors(t *testing.T) {
	ack := "1100ffff0000001100000100" + "1f000005" + "00000000"
	for _, tc := range []struct {
		name string
		pkt  string
		err  error
	}{
		{"empty", "", ErrTooShort},
		{"short", "1100ffff00000011000001", ErrTooShort},
		{"tver", "1101ffff0000001100000100" + "1f000005" + "00000000", ErrBadTVer},
		{"unknown", "1500ffff0000001100000100" + "00000000", ErrUnknownOpcode},
		{"cnp-less", "8000ffff000000110000010000000000", ErrUnknownOpcode},
		{"ack no icrc", "1100ffff0000001100000100" + "1f000005", ErrTruncated},
		{"ack ok", ack, nil},
		{"ack payload", "1100ffff0000001100000100" + "1f000005" + "aabbccdd" + "00000000", ErrUnexpectedPayload},
		{"ack pad", "1110ffff0000001100000100" + "1f000005" + "aabbccdd" + "00000000", ErrBadPad},
		{"send pad > data", "0430ffff0000001100000100" + "aabb" + "00000000", ErrTruncated},
		{"send unaligned", "0400ffff0000001100000100" + "aabbcc" + "00000000", ErrBadPad},
		{"send ok pad1", "0410ffff0000001100000100" + "aabbcc00" + "00000000", nil},
		{"send empty", "0400ffff0000001100000100" + "00000000", nil},
		{"write only short reth", "0a00ffff0000001100000100" + "000000000000" + "00000000", ErrTruncated},
	} {
		p, err := Parse(unhex(t, tc.pkt))
		if !errors.Is(err, tc.err) {
			t.Errorf("%s: err %v want %v", tc.name, err, tc.err)
		}
		if err != nil && (p.Bytes() != nil || p.BTH() != nil || p.Payload() != nil || p.RETH() != nil || p.ICRC() != 0 || p.Opcode() != 0) {
			t.Errorf("%s: non-zero packet on error", tc.name)
		}
		if err != nil && err.Error() == "" {
			t.Error("empty message")
		}
	}
	if Error(200).Error() != "wire: unknown error" {
		t.Error("unknown error text")
	}
}

func TestParseViews(t *testing.T) {
	// RC RDMA WRITE ONLY WITH IMMEDIATE, 5-byte payload, pad 3.
	b := unhex(t, "0bb0ffff00000011800000ff"+"00000000deadbeef0000abcd00000005"+"01020304"+"aabbccddee000000"+"11223344")
	p, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if p.Opcode() != RCRDMAWriteOnlyWithImmediate || p.HeaderLen() != 32 || p.Len() != len(b) {
		t.Fatal(p.Opcode(), p.HeaderLen())
	}
	if r := p.RETH(); r == nil || r.VA() != 0xDEADBEEF || r.RKey() != 0xABCD || r.DMALen() != 5 {
		t.Fatal("RETH")
	}
	if p.ImmDt().Imm() != 0x01020304 || p.AETH() != nil || p.DETH() != nil || p.IETH() != nil || p.AtomicETH() != nil ||
		p.AtomicAckETH() != nil || p.RDETH() != nil || p.FETH() != nil || p.MAD() != nil {
		t.Fatal("views")
	}
	if hexs(p.Payload()) != "aabbccddee" || p.PayloadLen() != 5 || hexs(p.Pad()) != "000000" || p.ICRC() != 0x44332211 {
		t.Fatalf("payload %x pad %x icrc %#x", p.Payload(), p.Pad(), p.ICRC())
	}
	if cap(p.Payload()) != 5 || cap(p.RETH()) != RETHLen {
		t.Fatal("views must not extend past their part")
	}
	if !p.BTH().SolicitedEvent() || !p.BTH().AckReq() || p.BTH().PSN() != 0xFF || p.BTH().PadCount() != 3 {
		t.Fatal("BTH")
	}
	var z Packet
	if z.Bytes() != nil || z.BTH() != nil || z.RETH() != nil || z.Payload() != nil || z.Pad() != nil || z.PayloadLen() != 0 || z.ICRC() != 0 || z.MAD() != nil {
		t.Fatal("zero Packet")
	}
}

func TestLayout(t *testing.T) {
	for _, tc := range []struct {
		op  Opcode
		n   int
		err error
	}{
		{RCSendOnly, 0, nil}, {RCSendOnly, 1, nil}, {RCSendOnly, 4093, nil}, {RCRDMAWriteFirst, 4096, nil},
		{RCAcknowledge, 0, nil}, {RCAcknowledge, 4, ErrUnexpectedPayload}, {Opcode(0x15), 0, ErrUnknownOpcode},
		{UDSendOnly, MADLen, nil}, {RCSendOnly, -1, ErrPayloadTooLarge}, {RCSendOnly, 70000, ErrPayloadTooLarge},
		{RCRDMAWriteOnlyWithImmediate, 9000, ErrBufferTooSmall},
	} {
		buf := make([]byte, 8000)
		for i := range buf {
			buf[i] = 0xEE
		}
		p, err := Layout(buf[:0], tc.op, tc.n)
		if !errors.Is(err, tc.err) {
			t.Errorf("%v/%d: %v want %v", tc.op, tc.n, err, tc.err)
			continue
		}
		if err != nil {
			continue
		}
		if p.Len() != PacketLen(tc.op, tc.n) || p.PayloadLen() != tc.n || p.BTH().PadCount() != PadCount(tc.n) {
			t.Errorf("%v/%d: len %d payload %d", tc.op, tc.n, p.Len(), p.PayloadLen())
		}
		q, err := Parse(p.Bytes())
		if err != nil || q.Opcode() != tc.op || q.BTH().PKey() != DefaultPKey {
			t.Errorf("%v/%d: reparse %v", tc.op, tc.n, err)
		}
		for _, c := range p.Pad() {
			if c != 0 {
				t.Error("pad not zero")
			}
		}
		for _, c := range p.Bytes()[1:p.HeaderLen()] {
			if c != 0 && c != 0xFF && c != byte(PadCount(tc.n))<<4 {
				t.Errorf("%v: header not cleared", tc.op)
			}
		}
	}
	if PacketLen(Opcode(0x15), 3) != 0 {
		t.Error("PacketLen unknown")
	}
}

// TestParseNoAlloc: the hot-path functions never allocate.
func TestNoAllocs(t *testing.T) {
	pkts := loadCapture(t, "srp-rdma-cm-login-io.pcap")
	e := pkts[0].encap
	n := testing.AllocsPerRun(100, func() {
		for _, c := range pkts[:50] {
			p, _ := Parse(c.pkt)
			_ = p.RETH()
			_ = p.Payload()
			e := c.encap
			e.VerifyICRC(c.pkt)
			e.RecoverIPv4ID(c.pkt)
		}
		e.PutICRC(pkts[5].pkt[:0:0])
	})
	if n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

func hexs(b []byte) string {
	const d = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, d[c>>4], d[c&15])
	}
	return string(out)
}

func TestPayloadLenOK(t *testing.T) {
	const mtu = 1024
	for _, tc := range []struct {
		op Opcode
		n  int
		ok bool
	}{
		{RCSendFirst, mtu, true}, {RCSendFirst, mtu - 1, false}, {RCSendMiddle, mtu, true}, {RCSendMiddle, 0, false},
		{RCSendLast, 0, false}, {RCSendLast, 1, true}, {RCSendLast, mtu, true}, {RCSendLast, mtu + 1, false},
		{RCSendOnly, 0, true}, {RCSendOnly, mtu, true}, {RCSendOnly, mtu + 1, false},
		{RCRDMAWriteFirst, mtu, true}, {RCRDMAWriteLastWithImmediate, 0, false},
		{RCRDMAReadResponseMiddle, mtu, true}, {RCRDMAReadResponseOnly, 0, true},
		{RCRDMAReadRequest, 0, true}, {RCRDMAReadRequest, 4, false}, {RCAcknowledge, 0, true},
		{UDSendOnly, 256, true}, {UDSendOnly, mtu + 1, false}, {RCAtomicWrite, 8, true}, {RCAtomicWrite, 4, false},
		{CNP, 16, true}, {Opcode(0x15), 0, false}, {RCSendOnly, -1, false},
	} {
		if got := tc.op.PayloadLenOK(tc.n, mtu); got != tc.ok {
			t.Errorf("%v(%d) = %v", tc.op, tc.n, got)
		}
	}
}
