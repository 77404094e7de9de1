package target

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/fuzzbound"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
)

// fuzzLimits keep a fuzz iteration small.
var fuzzLimits = Limits{QueueDepth: 4, MaxTransfer: 64 << 10, MaxDescriptors: 16, MaxITIULen: 4096, LUNWorkers: 2}

// fuzzIU is one IU of a fuzz input and whether the channel runs until idle after it (else the
// next IU arrives while it is still busy).
type fuzzIU struct {
	b     []byte
	drive bool
}

// splitIUs cuts fuzz input into IUs: each is a 2-byte big-endian header (bit 15: drive after
// it; bits 0-14: length, mod 600) then that many bytes.
func splitIUs(data []byte) []fuzzIU {
	var out []fuzzIU
	for len(data) >= 2 {
		h := binary.BigEndian.Uint16(data)
		n := int(h&0x7fff) % 600
		data = data[2:]
		n = min(n, len(data))
		out = append(out, fuzzIU{b: data[:n], drive: h&0x8000 != 0})
		data = data[n:]
	}
	return out
}

// joinIUs builds a fuzz input; every IU is driven to idle.
func joinIUs(ius ...[]byte) []byte { return joinBatch(true, ius...) }

func joinBatch(drive bool, ius ...[]byte) []byte {
	var b []byte
	for _, iu := range ius {
		h := uint16(len(iu))
		if drive {
			h |= 0x8000
		}
		b = binary.BigEndian.AppendUint16(b, h)
		b = append(b, iu...)
	}
	return b
}

func seedCmd(f srp.CmdFields) []byte {
	b := make([]byte, 600+len(f.DataOut.Imm))
	n, err := srp.Cmd(b).Encode(&f)
	if err != nil {
		panic(err)
	}
	return b[:n]
}

// FuzzChannelIU feeds arbitrary IUs into a channel's receive handler (over the fake
// transport) and checks that nothing panics, that every IU the target sends is well formed,
// and that every credit is accounted for: the credits the responses return add up, and
// reqLim + outstanding + pending == queue depth once the channel is idle.
func FuzzChannelIU(f *testing.F) {
	tur := seedCmd(srp.CmdFields{Tag: srp.Tag{1}, CDB: []byte{scsi.OpTestUnitReady}})
	read := seedCmd(srp.CmdFields{Tag: srp.Tag{2}, CDB: rw16(false, 8, 8),
		DataIn: srp.DataBuf{Format: srp.DescDirect, Direct: srp.DirectDesc{VA: 0x1000, Key: 5, Len: 4096}}})
	list := make(srp.DescList, 3*16)
	list.Set(0, srp.DirectDesc{VA: 0x2000, Key: 5, Len: 1000})
	list.Set(1, srp.DirectDesc{VA: 0x3000, Key: 5, Len: 24})
	list.Set(2, srp.DirectDesc{VA: 0x4000, Key: 5, Len: 3072})
	write := seedCmd(srp.CmdFields{Tag: srp.Tag{3}, CDB: rw16(true, 0, 8),
		DataOut: srp.DataBuf{Format: srp.DescIndirect, Table: srp.DirectDesc{VA: 0x9000, Key: 5, Len: 48}, Total: 4096, List: list}})
	ext := seedCmd(srp.CmdFields{Tag: srp.Tag{4}, CDB: rw16(false, 0, 8),
		DataIn: srp.DataBuf{Format: srp.DescIndirect, Table: srp.DirectDesc{VA: 0x9000, Key: 5, Len: 48}, Total: 4096, List: list.Prefix(1)}})
	imm := seedCmd(srp.CmdFields{Tag: srp.Tag{5}, CDB: rw16(true, 0, 1), ImmDataOffset: srp.DefaultImmDataOffset,
		DataOut: srp.DataBuf{Format: srp.DescImmediate, Total: 512, Imm: make([]byte, 512)}})
	var tm [srp.TskMgmtLen]byte
	srp.TskMgmt(tm[:]).Encode(&srp.TskMgmtFields{Tag: srp.Tag{9}, Func: srp.TMAbortTask, TaskTag: srp.Tag{2}})
	var reset [srp.TskMgmtLen]byte
	srp.TskMgmt(reset[:]).Encode(&srp.TskMgmtFields{Tag: srp.Tag{10}, Func: srp.TMLUNReset})
	var lo [srp.ILogoutLen]byte
	srp.ILogout(lo[:]).Encode(&srp.ILogoutFields{})
	var cr [srp.CredRspLen]byte
	srp.CredRsp(cr[:]).Encode(&srp.CredRspFields{})
	f.Add(joinIUs(tur, read, write, ext, imm))
	f.Add(joinIUs(read, tm[:], write, reset[:], tur))
	f.Add(joinBatch(false, read, write, ext, imm, tur, tur)) // overrun: six requests, four credits
	f.Add(append(joinBatch(false, read, write, ext), joinIUs(reset[:], tur)...))
	f.Add(joinIUs(read, lo[:]))
	f.Add(joinIUs(cr[:]))
	f.Add(joinIUs([]byte{0x02}, []byte{}, []byte{0x77, 1, 2}))
	f.Add(joinIUs(ext[:60]))
	fuzzbound.Fuzz(f, checkChannelIU)
}

// checkChannelIU is one FuzzChannelIU input.
func checkChannelIU(t *testing.T, data []byte) {
	start := time.Now()
	defer func() {
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("iteration took %v", d)
		}
	}()
	fc := newFakeChan(t, fuzzLimits, true)
	ch := fc.ch
	depth := int32(ch.depth)
	ius := splitIUs(data)
	for i, iu := range ius {
		if !fc.qp.deliver(iu.b) {
			break // no receive posted: the initiator would get an RNR NAK
		}
		if !iu.drive && i+1 < len(ius) {
			continue
		}
		fc.drive(t)
		if ch.st() == chLive && ch.owed != 0 {
			t.Fatalf("idle channel owes %d responses", ch.owed)
		}
		if ch.cr.reqLim+int32(ch.owed)+ch.cr.pending != depth {
			t.Fatalf("credits: reqLim %d + owed %d + pending %d != %d", ch.cr.reqLim, ch.owed, ch.cr.pending, depth)
		}
	}
	var given int64
	for _, b := range fc.qp.sent {
		op, err := srp.PeekOpcode(b)
		if err != nil {
			t.Fatalf("empty IU sent")
		}
		switch op {
		case srp.OpRsp:
			r, err := srp.ParseRsp(b)
			if err != nil {
				t.Fatalf("bad SRP_RSP %x: %v", b, err)
			}
			if r.ReqLimDelta() < 1 {
				t.Fatalf("SRP_RSP with delta %d", r.ReqLimDelta())
			}
			if r.Flags()&srp.RspValid != 0 && len(r.RespData()) != 4 {
				t.Fatalf("TM response data %x", r.RespData())
			}
			if len(b) > ch.tiLen {
				t.Fatalf("IU of %d bytes > max TI IU %d", len(b), ch.tiLen)
			}
			given += int64(r.ReqLimDelta())
		case srp.OpCredReq:
			r, err := srp.ParseCredReq(b)
			if err != nil || r.ReqLimDelta() < 1 {
				t.Fatalf("bad SRP_CRED_REQ %x", b)
			}
			given += int64(r.ReqLimDelta())
		case srp.OpTLogout:
			if _, err := srp.ParseTLogout(b); err != nil {
				t.Fatalf("bad SRP_T_LOGOUT %x", b)
			}
		default:
			t.Fatalf("target sent %v", op)
		}
	}
	if uint64(given) != ch.cr.returned || int64(ch.cr.reqLim) != int64(depth)-int64(ch.cr.consumed)+given {
		t.Fatalf("credits: given %d, returned %d, consumed %d, reqLim %d", given, ch.cr.returned, ch.cr.consumed, ch.cr.reqLim)
	}
	fc.close(t)
	if s := fc.t.Stats(); s.Channels != 0 || s.MRs != 0 || s.MemoryBytes != 0 || s.Sessions != 0 {
		t.Fatalf("after close: %+v", s)
	}
}

// BenchmarkCommandPath measures the target's command path (receive → parse → admit → data
// transfer → execute on a RAM LUN → SRP_RSP) over the fake transport, one command at a time:
// executed inline, and (-workers) with Limits.NoInline.
func BenchmarkCommandPath(b *testing.B) {
	for _, bc := range []struct {
		name string
		iu   func(tag uint64) []byte
	}{
		{"read4k-direct", func(tag uint64) []byte {
			var tg srp.Tag
			binary.LittleEndian.PutUint64(tg[:], tag)
			return seedCmd(srp.CmdFields{Tag: tg, CDB: rw16(false, tag%1000*8, 8),
				DataIn: srp.DataBuf{Format: srp.DescDirect, Direct: srp.DirectDesc{VA: 0x1000, Key: 5, Len: 4096}}})
		}},
		{"write4k-direct", func(tag uint64) []byte {
			var tg srp.Tag
			binary.LittleEndian.PutUint64(tg[:], tag)
			return seedCmd(srp.CmdFields{Tag: tg, CDB: rw16(true, tag%1000*8, 8),
				DataOut: srp.DataBuf{Format: srp.DescDirect, Direct: srp.DirectDesc{VA: 0x1000, Key: 5, Len: 4096}}})
		}},
		{"write4k-immediate", func(tag uint64) []byte {
			var tg srp.Tag
			binary.LittleEndian.PutUint64(tg[:], tag)
			return seedCmd(srp.CmdFields{Tag: tg, CDB: rw16(true, tag%1000*8, 8), ImmDataOffset: srp.DefaultImmDataOffset,
				DataOut: srp.DataBuf{Format: srp.DescImmediate, Total: 4096, Imm: make([]byte, 4096)}})
		}},
		{"read64k-indirect4", func(tag uint64) []byte {
			var tg srp.Tag
			binary.LittleEndian.PutUint64(tg[:], tag)
			l := make(srp.DescList, 4*16)
			for i := 0; i < 4; i++ {
				l.Set(i, srp.DirectDesc{VA: uint64(0x100000 * i), Key: 5, Len: 16384})
			}
			return seedCmd(srp.CmdFields{Tag: tg, CDB: rw16(false, tag%100*128, 128),
				DataIn: srp.DataBuf{Format: srp.DescIndirect, Table: srp.DirectDesc{Len: 64}, Total: 65536, List: l}})
		}},
	} {
		for _, noInline := range []bool{false, true} {
			name := bc.name
			if noInline {
				name += "-workers" // Limits.NoInline: through a LUN worker and back
			}
			b.Run(name, func(b *testing.B) {
				fc := newFakeChan(b, Limits{QueueDepth: 16, MaxTransfer: 1 << 20, NoInline: noInline}, true)
				fc.qp.discard = true
				// Consume the POWER ON unit attention and warm up.
				for i := 0; i < 64; i++ {
					fc.qp.deliver(bc.iu(uint64(i)))
					fc.drive(b)
				}
				ius := make([][]byte, 256)
				for i := range ius {
					ius[i] = bc.iu(uint64(i + 1000))
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if !fc.qp.deliver(ius[i%len(ius)]) {
						b.Fatal("no receive posted")
					}
					fc.drive(b)
				}
				b.StopTimer()
				if st := fc.ch.snapshot(); st.CmdErrors > 1 || st.Errors != 0 {
					b.Fatalf("stats %+v", st)
				}
				fc.close(b)
			})
		}
	}
}
