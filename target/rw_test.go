package target

import (
	"encoding/binary"
	"testing"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
)

// TestDataPathRWContexts checks that the target moves data only through frpool's RW contexts:
// every send work request reaches the QP through the channel's pool (its ID carries
// frpool.WRIDTag), and the pool completes one RW transfer per external table fetch, per
// data-out fetch and per data-in transfer — none for immediate data or commands without data.
func TestDataPathRWContexts(t *testing.T) {
	fc := newFakeChan(t, Limits{QueueDepth: 8, MaxTransfer: 1 << 20}, true)
	tag := uint64(0)
	cmd := func(f srp.CmdFields) []byte {
		tag++
		binary.LittleEndian.PutUint64(f.Tag[:], tag)
		return seedCmd(f)
	}
	run := func(iu []byte) srp.Rsp {
		t.Helper()
		n := len(fc.qp.sent)
		if !fc.qp.deliver(iu) {
			t.Fatal("no receive posted")
		}
		fc.drive(t)
		if len(fc.qp.sent) != n+1 {
			t.Fatalf("%d IUs sent, want 1", len(fc.qp.sent)-n)
		}
		r, err := srp.ParseRsp(fc.qp.sent[n])
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Consume the POWER ON unit attention.
	run(cmd(srp.CmdFields{CDB: []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}}))

	direct := func(len uint32) srp.DataBuf {
		return srp.DataBuf{Format: srp.DescDirect, Direct: srp.DirectDesc{VA: 0x10000, Key: 5, Len: len}}
	}
	list4 := make(srp.DescList, 4*srp.DirectDescLen)
	for i := 0; i < 4; i++ {
		list4.Set(i, srp.DirectDesc{VA: uint64(0x100000 * (i + 1)), Key: 5, Len: 4096})
	}
	indirect := srp.DataBuf{Format: srp.DescIndirect, Table: srp.DirectDesc{VA: 0x7000, Key: 9, Len: uint32(len(list4))},
		Total: 16384, List: list4}
	// External table: the IU carries one descriptor of four, the fake initiator's memory at
	// the table's address the whole list.
	fc.qp.peer = map[uint64][]byte{0x7000: list4}
	external := indirect
	external.List = list4.Prefix(1)

	type step struct {
		name       string
		iu         []byte
		reads      int // RDMA READ work requests
		writes     int // RDMA WRITE work requests
		transfers  uint64
		tables     uint64
		status     scsi.Status
		bytesIn    uint64
		bytesOut   uint64
		immediates uint64
	}
	steps := []step{
		{name: "read direct", iu: cmd(srp.CmdFields{CDB: rw16(false, 0, 8), DataIn: direct(4096)}),
			writes: 1, transfers: 1, bytesIn: 4096},
		{name: "write direct", iu: cmd(srp.CmdFields{CDB: rw16(true, 0, 8), DataOut: direct(4096)}),
			reads: 1, transfers: 1, bytesOut: 4096},
		{name: "read indirect", iu: cmd(srp.CmdFields{CDB: rw16(false, 0, 32), DataIn: indirect}),
			writes: 4, transfers: 1, bytesIn: 16384},
		{name: "write indirect", iu: cmd(srp.CmdFields{CDB: rw16(true, 0, 32), DataOut: indirect}),
			reads: 4, transfers: 1, bytesOut: 16384},
		{name: "read external", iu: cmd(srp.CmdFields{CDB: rw16(false, 0, 32), DataIn: external}),
			reads: 1, writes: 4, transfers: 2, tables: 1, bytesIn: 16384},
		{name: "write external", iu: cmd(srp.CmdFields{CDB: rw16(true, 0, 32), DataOut: external}),
			reads: 1 + 4, transfers: 2, tables: 1, bytesOut: 16384},
		{name: "write immediate", iu: cmd(srp.CmdFields{CDB: rw16(true, 0, 8), ImmDataOffset: srp.DefaultImmDataOffset,
			DataOut: srp.DataBuf{Format: srp.DescImmediate, Total: 4096, Imm: make([]byte, 4096)}}),
			bytesOut: 4096, immediates: 1},
		{name: "test unit ready", iu: cmd(srp.CmdFields{CDB: []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}})},
		{name: "read, short buffer", iu: cmd(srp.CmdFields{CDB: rw16(false, 0, 8), DataIn: direct(1000)}),
			writes: 1, transfers: 1, bytesIn: 1000},
		{name: "write, bad LBA", iu: cmd(srp.CmdFields{CDB: rw16(true, 1<<40, 8), DataOut: direct(4096)}),
			status: scsi.StatusCheckCondition}, // refused before any data moves
	}
	var want step
	for _, s := range steps {
		before := fc.ch.snapshot()
		r0, w0 := fc.qp.reads, fc.qp.writes
		r := run(s.iu)
		if r.Status() != uint8(s.status) {
			t.Fatalf("%s: status %#x, want %#x (sense %x)", s.name, r.Status(), s.status, r.Sense())
		}
		st := fc.ch.snapshot()
		if got := fc.qp.reads - r0; got != s.reads {
			t.Errorf("%s: %d RDMA READs, want %d", s.name, got, s.reads)
		}
		if got := fc.qp.writes - w0; got != s.writes {
			t.Errorf("%s: %d RDMA WRITEs, want %d", s.name, got, s.writes)
		}
		if got := st.RWTransfers - before.RWTransfers; got != s.transfers {
			t.Errorf("%s: %d RW transfers, want %d", s.name, got, s.transfers)
		}
		if got := st.ExtTables - before.ExtTables; got != s.tables {
			t.Errorf("%s: %d external tables, want %d", s.name, got, s.tables)
		}
		if got := st.BytesIn - before.BytesIn; got != s.bytesIn {
			t.Errorf("%s: %d bytes in, want %d", s.name, got, s.bytesIn)
		}
		if got := st.BytesOut - before.BytesOut; got != s.bytesOut {
			t.Errorf("%s: %d bytes out, want %d", s.name, got, s.bytesOut)
		}
		want.transfers += s.transfers
		want.immediates += s.immediates
	}
	if fc.qp.foreign != 0 {
		t.Errorf("%d send work requests were posted around the pool", fc.qp.foreign)
	}
	ps := fc.ch.pool.Stats()
	if ps.RWTransfers != want.transfers || ps.SQOutstanding != 0 || ps.Registrations != 0 || ps.Errors != 0 {
		t.Errorf("pool stats %+v, want %d RW transfers", ps, want.transfers)
	}
	if st := fc.ch.snapshot(); st.ImmCommands != want.immediates || st.Errors != 0 {
		t.Errorf("channel stats %+v", st)
	}
	fc.close(t)
}

// TestRWReadWaves checks data-out with more remote descriptors than the QP's max_rd_atomic: the
// pool posts the RDMA READs in waves and the command executes once, after the last wave.
func TestRWReadWaves(t *testing.T) {
	fc := newFakeChan(t, Limits{QueueDepth: 4, MaxTransfer: 1 << 20}, true)
	fc.qp.maxRdAtomic = 2
	var tg srp.Tag
	tur := seedCmd(srp.CmdFields{Tag: tg, CDB: []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}})
	fc.qp.deliver(tur)
	fc.drive(t)
	const n = 7
	list := make(srp.DescList, n*srp.DirectDescLen)
	for i := 0; i < n; i++ {
		list.Set(i, srp.DirectDesc{VA: uint64(0x100000 * (i + 1)), Key: 5, Len: 512})
	}
	tg[0] = 1
	iu := seedCmd(srp.CmdFields{Tag: tg, CDB: rw16(true, 0, n),
		DataOut: srp.DataBuf{Format: srp.DescIndirect, Table: srp.DirectDesc{Len: uint32(len(list))}, Total: n * 512, List: list}})
	before := fc.ch.snapshot()
	sent := len(fc.qp.sent)
	fc.qp.deliver(iu)
	fc.drive(t)
	r, err := srp.ParseRsp(fc.qp.sent[sent])
	if err != nil || r.Status() != 0 {
		t.Fatalf("response %v %v", r, err)
	}
	st := fc.ch.snapshot()
	if fc.qp.maxReadBatch > 2 || fc.qp.reads != n || st.RWTransfers-before.RWTransfers != 1 || st.BytesOut-before.BytesOut != n*512 {
		t.Fatalf("reads %d (largest post %d), stats %+v", fc.qp.reads, fc.qp.maxReadBatch, st)
	}
	// The data landed in the LUN: the fake initiator's memory holds a pattern of the address.
	got := make([]byte, 512)
	if _, err := fc.lun.Backend().ReadAt(got, 6*512); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != byte(i) { // byte(0x700000) + i
			t.Fatalf("byte %d of the last descriptor: %#x", i, got[i])
		}
	}
	fc.close(t)
}

// TestRWLargeTransfers sends more commands with many descriptors (more than a request slot's
// own RW context holds) than the channel has large RW contexts, all at once: the excess waits
// in send-queue order and every command completes, reads and writes alike.
func TestRWLargeTransfers(t *testing.T) {
	fc := newFakeChan(t, Limits{QueueDepth: 16, MaxTransfer: 1 << 20}, true)
	var tg srp.Tag
	fc.qp.deliver(seedCmd(srp.CmdFields{Tag: tg, CDB: []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}}))
	fc.drive(t)
	const descs = 3 * rwSmall
	list := make(srp.DescList, descs*srp.DirectDescLen)
	for i := 0; i < descs; i++ {
		list.Set(i, srp.DirectDesc{VA: uint64(0x100000 * (i + 1)), Key: 5, Len: 512})
	}
	buf := srp.DataBuf{Format: srp.DescIndirect, Table: srp.DirectDesc{Len: uint32(len(list))}, Total: descs * 512, List: list}
	const cmds = 3 * rwBig
	before := fc.ch.snapshot()
	sent := len(fc.qp.sent)
	r0, w0 := fc.qp.reads, fc.qp.writes
	for i := 1; i <= cmds; i++ {
		binary.LittleEndian.PutUint64(tg[:], uint64(i))
		f := srp.CmdFields{Tag: tg, CDB: rw16(i%2 == 0, uint64(i*descs), descs)}
		if i%2 == 0 {
			f.DataOut = buf
		} else {
			f.DataIn = buf
		}
		iu := make([]byte, 4096)
		n, err := srp.Cmd(iu).Encode(&f)
		if err != nil {
			t.Fatal(err)
		}
		if !fc.qp.deliver(iu[:n]) {
			t.Fatal("no receive posted")
		}
	}
	fc.drive(t)
	if got := len(fc.qp.sent) - sent; got != cmds {
		t.Fatalf("%d responses, want %d", got, cmds)
	}
	for _, b := range fc.qp.sent[sent:] {
		if r, err := srp.ParseRsp(b); err != nil || r.Status() != 0 || r.Flags()&srp.ResidFlags != 0 {
			t.Fatalf("response %x: %v", b, err)
		}
	}
	st := fc.ch.snapshot()
	if st.BigTransfers-before.BigTransfers != cmds || st.RWTransfers-before.RWTransfers != cmds ||
		fc.qp.reads-r0 != cmds/2*descs || fc.qp.writes-w0 != cmds/2*descs {
		t.Fatalf("stats %+v, %d READs, %d WRITEs", st, fc.qp.reads-r0, fc.qp.writes-w0)
	}
	if st.SQWaits == before.SQWaits {
		t.Error("no command waited for a large RW context")
	}
	if len(fc.ch.bigRW) != rwBig || fc.ch.bigOut != 0 {
		t.Fatalf("%d large RW contexts free, %d out", len(fc.ch.bigRW), fc.ch.bigOut)
	}
	fc.close(t)
}
