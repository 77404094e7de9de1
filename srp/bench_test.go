package srp

import "testing"

// A READ whose data-in buffer is an indirect descriptor with 16
// descriptors, all in the IU (ib_srp's usual shape without an external
// table).
func benchIndirectCmd() []byte {
	list := make(DescList, 16*DirectDescLen)
	for i := 0; i < 16; i++ {
		list.Set(i, DirectDesc{VA: 0x7f0000000000 + uint64(i)<<16, Key: 0x1000 + uint32(i), Len: 4096})
	}
	f := CmdFields{
		Tag: Tag{0x18},
		CDB: []byte{0x28, 0, 0, 0, 0, 0, 0, 0, 0x80, 0},
		DataIn: DataBuf{Format: DescIndirect, Table: DirectDesc{VA: 0xdead0000, Key: 0x77, Len: 256},
			Total: 16 * 4096, List: list},
	}
	b := make([]byte, 8260)
	n, err := Cmd(b).Encode(&f)
	if err != nil {
		panic(err)
	}
	return b[:n]
}

var sinkU64 uint64

func decodeIndirect(b []byte) error {
	c, err := ParseCmd(b, DefaultImmDataOffset)
	if err != nil {
		return err
	}
	d := c.DataIn()
	s := uint64(d.Total) + uint64(c.CDB()[0])
	for i := 0; i < d.NumDescs(); i++ {
		x := d.Desc(i)
		s += x.VA + uint64(x.Key) + uint64(x.Len)
	}
	sinkU64 += s + uint64(c.Tag()[0])
	return nil
}

func encodeSenseRsp(buf []byte, f *RspFields) error {
	_, err := Rsp(buf).Encode(f, 8260)
	return err
}

var benchRsp = RspFields{ReqLimDelta: 1, Tag: Tag{0x1b}, Status: 2, Flags: DIUnder, DataInResid: 512,
	Sense: capRspSense[RspHdrLen:]}

// BenchmarkParseCmdIndirect decodes an SRP_CMD with an indirect table of
// 16 descriptors and reads every descriptor.
func BenchmarkParseCmdIndirect(b *testing.B) {
	iu := benchIndirectCmd()
	b.SetBytes(int64(len(iu)))
	b.ReportAllocs()
	for b.Loop() {
		if err := decodeIndirect(iu); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodeRspSense encodes an SRP_RSP with 96 bytes of sense data.
func BenchmarkEncodeRspSense(b *testing.B) {
	buf := make([]byte, 256)
	b.ReportAllocs()
	for b.Loop() {
		if err := encodeSenseRsp(buf, &benchRsp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseRsp decodes the sense-carrying SRP_RSP of the capture.
func BenchmarkParseRsp(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		r, err := ParseRsp(capRspSense)
		if err != nil {
			b.Fatal(err)
		}
		sinkU64 += uint64(len(r.Sense())) + uint64(r.Status())
	}
}

// BenchmarkEncodeCmdDirect encodes a READ(10) with one direct descriptor.
func BenchmarkEncodeCmdDirect(b *testing.B) {
	f := CmdFields{Tag: Tag{0x18}, CDB: []byte{0x28, 0, 0, 0, 0, 0x80, 0, 0, 0x60, 0},
		DataIn: DataBuf{Format: DescDirect, Direct: DirectDesc{VA: 0xff2a84fe02eee000, Key: 0x489, Len: 0xc000}}}
	buf := make([]byte, 128)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Cmd(buf).Encode(&f); err != nil {
			b.Fatal(err)
		}
	}
}

// TestZeroAlloc enforces what the benchmarks show: decoding an SRP_CMD
// with an indirect table and encoding an SRP_RSP with sense data do not
// allocate.
func TestZeroAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	iu := benchIndirectCmd()
	buf := make([]byte, 256)
	checks := []struct {
		name string
		fn   func()
	}{
		{"ParseCmd indirect", func() {
			if err := decodeIndirect(iu); err != nil {
				t.Fatal(err)
			}
		}},
		{"Cmd.Fields", func() {
			c, _ := ParseCmd(iu, 0)
			f := c.Fields(0)
			sinkU64 += uint64(f.DataIn.List.Len())
		}},
		{"Rsp.Encode sense", func() {
			if err := encodeSenseRsp(buf, &benchRsp); err != nil {
				t.Fatal(err)
			}
		}},
		{"ParseRsp + Fields", func() {
			r, _ := ParseRsp(capRspSense)
			f := r.Fields()
			sinkU64 += uint64(len(f.Sense))
		}},
		{"DecodeLoginReqRDMA", func() {
			r, _ := DecodeLoginReqRDMA(capLoginReqRDMA)
			sinkU64 += uint64(r.ReqITIULen)
		}},
	}
	for _, c := range checks {
		if a := testing.AllocsPerRun(200, c.fn); a != 0 {
			t.Errorf("%s: %v allocs/op", c.name, a)
		}
	}
}
