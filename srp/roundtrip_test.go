package srp

import (
	"bytes"
	"errors"
	"testing"

	"pgregory.net/rapid"
)

func drawTag(t *rapid.T, name string) (g Tag) {
	copy(g[:], rapid.SliceOfN(rapid.Byte(), 8, 8).Draw(t, name))
	return
}

func drawLUN(t *rapid.T, name string) (l LUN) {
	copy(l[:], rapid.SliceOfN(rapid.Byte(), 8, 8).Draw(t, name))
	return
}

func drawPortID(t *rapid.T, name string) (p PortID) {
	copy(p[:], rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, name))
	return
}

func drawDesc(t *rapid.T, name string) DirectDesc {
	return DirectDesc{
		VA:  rapid.Uint64().Draw(t, name+".va"),
		Key: rapid.Uint32().Draw(t, name+".key"),
		// Keep the sum of up to 255 lengths inside 32 bits so that a
		// complete table can carry a consistent TOTAL LENGTH.
		Len: rapid.Uint32Range(0, 1<<24).Draw(t, name+".len"),
	}
}

func drawDataBuf(t *rapid.T, name string, allowImm bool) DataBuf {
	formats := []DescFormat{DescNone, DescDirect, DescIndirect}
	if allowImm {
		formats = append(formats, DescImmediate)
	}
	d := DataBuf{Format: rapid.SampledFrom(formats).Draw(t, name+".format")}
	switch d.Format {
	case DescDirect:
		d.Direct = drawDesc(t, name+".direct")
	case DescIndirect:
		n := rapid.IntRange(0, 255).Draw(t, name+".count")
		for i := 0; i < n; i++ {
			d.List = DescList(drawDesc(t, name+".desc").Append(d.List))
		}
		extra := rapid.IntRange(0, 16).Draw(t, name+".external")
		d.Table = drawDesc(t, name+".table")
		d.Table.Len = uint32(DirectDescLen * (n + extra))
		if extra == 0 {
			d.Total = uint32(d.List.TotalLen())
		} else {
			d.Total = rapid.Uint32().Draw(t, name+".total")
		}
	case DescImmediate:
		d.Imm = rapid.SliceOfN(rapid.Byte(), 0, 64).Draw(t, name+".imm")
		d.Total = uint32(len(d.Imm))
	}
	return d
}

func drawCmd(t *rapid.T) CmdFields {
	f := CmdFields{
		SolNot:   SolNot(rapid.Byte().Draw(t, "solnot")),
		Tag:      drawTag(t, "tag"),
		LUN:      drawLUN(t, "lun"),
		TaskAttr: TaskAttr(rapid.Byte().Draw(t, "attr")),
		CDB:      rapid.SliceOfN(rapid.Byte(), 0, 16+MaxAddCDBLen).Draw(t, "cdb"),
		DataOut:  drawDataBuf(t, "out", true),
		DataIn:   drawDataBuf(t, "in", false),
	}
	if f.DataOut.Format == DescImmediate {
		end := CmdHdrLen + padAdd(len(f.CDB)) + f.DataOut.descLen() + f.DataIn.descLen()
		f.ImmDataOffset = end + rapid.IntRange(0, 64).Draw(t, "immgap")
	}
	return f
}

func padAdd(n int) int {
	if n <= 16 {
		return 0
	}
	return (n - 16 + 3) &^ 3
}

func (d DataBuf) descLen() int {
	switch d.Format {
	case DescDirect:
		return DirectDescLen
	case DescIndirect:
		return IndirectHdrLen + len(d.List)
	case DescImmediate:
		return ImmBufLen
	}
	return 0
}

// normCmd is what decoding an encoded f yields: the CDB padded.
func normCmd(f CmdFields) CmdFields {
	cdb := make([]byte, 16+padAdd(len(f.CDB)))
	copy(cdb, f.CDB)
	f.CDB = cdb
	return f
}

func TestRoundTripCmd(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := drawCmd(t)
		buf := bytes.Repeat([]byte{0xa5}, 16*1024)
		n, err := Cmd(buf).Encode(&f)
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		c, err := ParseCmd(buf[:n], f.ImmDataOffset)
		if err != nil {
			t.Fatalf("parse: %v", err)
		}
		if len(c) != n {
			t.Fatalf("view %d bytes, encoded %d", len(c), n)
		}
		got := c.Fields(f.ImmDataOffset)
		want := normCmd(f)
		if !eqCmd(&got, &want) {
			t.Fatalf("decoded %+v\nwant    %+v", got, want)
		}
		for _, d := range []DataBuf{c.DataOut(), c.DataIn()} {
			if d.External() != (d.Format == DescIndirect && d.List.Len() < d.TableCount()) {
				t.Fatal("External")
			}
			for i := 0; i < d.NumDescs(); i++ {
				_ = d.Desc(i)
			}
		}
		// Re-encoding the decoded value gives the same bytes.
		buf2 := make([]byte, n)
		if n2, err := Cmd(buf2).Encode(&got); err != nil || !bytes.Equal(buf2[:n2], buf[:n]) {
			t.Fatalf("re-encode %v", err)
		}
		// A buffer one byte short is refused.
		if _, err := Cmd(buf[:n-1]).Encode(&f); !errors.Is(err, ErrShortBuffer) {
			t.Fatalf("short buffer: %v", err)
		}
	})
}

func TestRoundTripRsp(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := RspFields{
			SolNot:      SolNot(rapid.Byte().Draw(t, "solnot")),
			ReqLimDelta: rapid.Int32().Draw(t, "delta"),
			Tag:         drawTag(t, "tag"),
			Flags: rapid.SampledFrom([]RspFlags{0, DOOver, DOUnder}).Draw(t, "do") |
				rapid.SampledFrom([]RspFlags{0, DIOver, DIUnder}).Draw(t, "di") |
				RspFlags(rapid.IntRange(0, 3).Draw(t, "valid")), // ignored by Encode
			Status:       rapid.Byte().Draw(t, "status"),
			DataOutResid: rapid.Uint32().Draw(t, "dores"),
			DataInResid:  rapid.Uint32().Draw(t, "dires"),
			RespData:     rapid.SliceOfN(rapid.Byte(), 0, 8).Draw(t, "resp"),
			Sense:        rapid.SliceOfN(rapid.Byte(), 0, 300).Draw(t, "sense"),
		}
		maxLen := rapid.IntRange(0, 400).Draw(t, "max")
		buf := make([]byte, 512)
		n, err := Rsp(buf).Encode(&f, maxLen)
		rl := len(f.RespData)
		if maxLen > 0 && maxLen < RspHdrLen+rl {
			if !errors.Is(err, ErrShortBuffer) {
				t.Fatalf("want ErrShortBuffer, got %v", err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		sl := len(f.Sense)
		if maxLen > 0 && RspHdrLen+rl+sl > maxLen {
			sl = maxLen - RspHdrLen - rl
		}
		if n != RspHdrLen+rl+sl || (maxLen > 0 && n > maxLen) {
			t.Fatalf("n=%d", n)
		}
		want := f
		want.Sense = f.Sense[:sl]
		want.Flags &= ResidFlags
		if rl > 0 {
			want.Flags |= RspValid
		}
		if sl > 0 {
			want.Flags |= SnsValid
		}
		r, err := ParseRsp(buf[:n])
		if err != nil {
			t.Fatal(err)
		}
		got := r.Fields()
		if !eqRsp(&got, &want) {
			t.Fatalf("decoded %+v\nwant    %+v", got, want)
		}
		buf2 := make([]byte, n)
		if n2, err := Rsp(buf2).Encode(&got, 0); err != nil || !bytes.Equal(buf2[:n2], buf[:n]) {
			t.Fatalf("re-encode %v", err)
		}
	})
}

func TestRoundTripLoginReq(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := LoginReq{
			Tag:             drawTag(t, "tag"),
			ReqITIULen:      rapid.Uint32().Draw(t, "itiu"),
			BufFmt:          BufFormats(rapid.Uint16().Draw(t, "fmt")),
			Flags:           LoginFlags(rapid.Byte().Draw(t, "flags")),
			ImmDataOffset:   rapid.Uint16().Draw(t, "imm"),
			InitiatorPortID: drawPortID(t, "iport"),
			TargetPortID:    drawPortID(t, "tport"),
			Ext:             Ext(rapid.Byte().Draw(t, "ext")),
		}
		var ib [LoginReqLen]byte
		var rd [LoginReqRDMALen]byte
		if _, err := r.Encode(ib[:]); err != nil {
			t.Fatal(err)
		}
		if _, err := r.EncodeRDMA(rd[:]); err != nil {
			t.Fatal(err)
		}
		if got, err := DecodeLoginReq(ib[:]); err != nil || got != r {
			t.Fatalf("IB form: %+v %v", got, err)
		}
		if got, err := DecodeLoginReqRDMA(rd[:]); err != nil || got != r {
			t.Fatalf("RDMA form: %+v %v", got, err)
		}
		if s := r.InitiatorPortID.String(); s[:2] != "0x" {
			t.Fatal(s)
		} else if p, err := ParsePortID(s); err != nil || p != r.InitiatorPortID {
			t.Fatalf("PortID %s: %v", s, err)
		}
	})
}

// roundTrip checks encode -> parse -> Fields for a fixed-size IU.
func roundTrip[F comparable, V ~[]byte](t *rapid.T, f F, size int, enc func(V, *F) (int, error),
	parse func([]byte) (V, error), fields func(V) F) {
	buf := make([]byte, size+3)
	n, err := enc(V(buf), &f)
	if err != nil || n != size {
		t.Fatalf("encode: %d %v", n, err)
	}
	v, err := parse(buf[:n])
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if got := fields(v); got != f {
		t.Fatalf("decoded %+v\nwant    %+v", got, f)
	}
}

func TestRoundTripFixed(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		roundTrip(t, LoginRspFields{
			ReqLimDelta: rapid.Int32().Draw(t, "delta"), Tag: drawTag(t, "tag"),
			MaxITIULen: rapid.Uint32().Draw(t, "it"), MaxTIIULen: rapid.Uint32().Draw(t, "ti"),
			BufFmt: BufFormats(rapid.Uint16().Draw(t, "fmt")), Flags: LoginRspFlags(rapid.Byte().Draw(t, "fl")),
			Ext: Ext(rapid.Byte().Draw(t, "ext")),
		}, LoginRspLen, LoginRsp.Encode, ParseLoginRsp, LoginRsp.Fields)
		roundTrip(t, LoginRejFields{
			Reason: RejectReason(rapid.Uint32().Draw(t, "reason")), Tag: drawTag(t, "tag"),
			BufFmt: BufFormats(rapid.Uint16().Draw(t, "fmt")),
		}, LoginRejLen, LoginRej.Encode, ParseLoginRej, LoginRej.Fields)
		roundTrip(t, ILogoutFields{Tag: drawTag(t, "tag")}, ILogoutLen, ILogout.Encode, ParseILogout, ILogout.Fields)
		roundTrip(t, TLogoutFields{
			SolNot: SolNot(rapid.Byte().Draw(t, "sn")), Reason: TLogoutReason(rapid.Uint32().Draw(t, "r")),
			Tag: drawTag(t, "tag"),
		}, TLogoutLen, TLogout.Encode, ParseTLogout, TLogout.Fields)
		roundTrip(t, TskMgmtFields{
			SolNot: SolNot(rapid.Byte().Draw(t, "sn")), Tag: drawTag(t, "tag"), LUN: drawLUN(t, "lun"),
			Func: TaskMgmtFunc(rapid.Byte().Draw(t, "fn")), TaskTag: drawTag(t, "ttag"),
		}, TskMgmtLen, TskMgmt.Encode, ParseTskMgmt, TskMgmt.Fields)
		roundTrip(t, CredReqFields{
			SolNot: SolNot(rapid.Byte().Draw(t, "sn")), ReqLimDelta: rapid.Int32().Draw(t, "d"), Tag: drawTag(t, "tag"),
		}, CredReqLen, CredReq.Encode, ParseCredReq, CredReq.Fields)
		roundTrip(t, CredRspFields{Tag: drawTag(t, "tag")}, CredRspLen, CredRsp.Encode, ParseCredRsp, CredRsp.Fields)
		roundTrip(t, AerRspFields{Tag: drawTag(t, "tag")}, AerRspLen, AerRsp.Encode, ParseAerRsp, AerRsp.Fields)
	})
}

func TestRoundTripAerReq(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := AerReqFields{
			SolNot:      SolNot(rapid.Byte().Draw(t, "sn")),
			ReqLimDelta: rapid.Int32().Draw(t, "d"),
			Tag:         drawTag(t, "tag"),
			LUN:         drawLUN(t, "lun"),
			Sense:       rapid.SliceOfN(rapid.Byte(), 0, 255).Draw(t, "sense"),
		}
		buf := make([]byte, 300)
		n, err := AerReq(buf).Encode(&f)
		if err != nil || n != AerReqHdrLen+len(f.Sense) {
			t.Fatal(n, err)
		}
		a, err := ParseAerReq(buf[:n])
		if err != nil {
			t.Fatal(err)
		}
		if got := a.Fields(); !eqAer(&got, &f) {
			t.Fatalf("decoded %+v", got)
		}
	})
}
