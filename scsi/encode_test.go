package scsi

import (
	"bytes"
	"encoding/binary"
	"testing"

	"pgregory.net/rapid"
)

// TestEncodersRoundTrip: every encoder's CDB parses (ParseCDB) back to what was encoded, and
// is byte for byte what the tests' own hand-written builders produce.
func TestEncodersRoundTrip(t *testing.T) {
	l, _ := newTestLUN(t, testConfig())
	bs := uint32(l.BlockSize())
	for _, tc := range []struct {
		cdb  []byte
		same []byte // the independent builder's CDB
		want CDBInfo
		// the parser's private flags: IMMED/UNMAP/DESC/EVPD/LLBAA, NDOB/DBD
		flag, flag2 bool
	}{
		{AppendTestUnitReady(nil), cdbTUR(), CDBInfo{Opcode: OpTestUnitReady}, false, false},
		{AppendRequestSense(nil, true, 252), cdbRequestSense(true, 252),
			CDBInfo{Opcode: OpRequestSense, Dir: DirIn, Length: 252}, true, false},
		{AppendRequestSense(nil, false, 18), cdbRequestSense(false, 18),
			CDBInfo{Opcode: OpRequestSense, Dir: DirIn, Length: 18}, false, false},
		{AppendInquiry(nil, false, 0, 96), cdbInquiry(false, 0, 96),
			CDBInfo{Opcode: OpInquiry, Dir: DirIn, Length: 96}, false, false},
		{AppendInquiry(nil, true, 0x83, 1024), cdbInquiry(true, 0x83, 1024),
			CDBInfo{Opcode: OpInquiry, Dir: DirIn, Length: 1024}, true, false},
		{AppendReadCapacity10(nil), cdbReadCap10(), CDBInfo{Opcode: OpReadCapacity10, Dir: DirIn, Length: 8}, false, false},
		{AppendReadCapacity16(nil, 32), cdbReadCap16(32),
			CDBInfo{Opcode: OpServiceActionIn16, ServiceAction: SAReadCapacity16, Dir: DirIn, Length: 32}, false, false},
		{AppendRead16(nil, 100, 8, false), cdbRead16(100, 8),
			CDBInfo{Opcode: OpRead16, Dir: DirIn, Length: 8 * bs, LBA: 100, Blocks: 8}, false, false},
		{AppendRead16(nil, 7, 1, true), cdbRW16(OpRead16, 7, 1, true),
			CDBInfo{Opcode: OpRead16, Dir: DirIn, Length: bs, LBA: 7, Blocks: 1, FUA: true}, false, false},
		{AppendWrite16(nil, testBlocks-256, 256, true), cdbRW16(OpWrite16, testBlocks-256, 256, true),
			CDBInfo{Opcode: OpWrite16, Dir: DirOut, Length: 256 * bs, LBA: testBlocks - 256, Blocks: 256, FUA: true}, false, false},
		{AppendSynchronizeCache16(nil, 0, 0, false), cdbSync16(0, 0),
			CDBInfo{Opcode: OpSynchronizeCache16}, false, false},
		{AppendSynchronizeCache16(nil, 10, 20, true), func() []byte { c := cdbSync16(10, 20); c[1] = 0x02; return c }(),
			CDBInfo{Opcode: OpSynchronizeCache16, LBA: 10, Blocks: 20}, true, false},
		{AppendWriteSame16(nil, 3, 1024, true, false), cdbWriteSame16(3, 1024, true, false),
			CDBInfo{Opcode: OpWriteSame16, Dir: DirOut, Length: bs, LBA: 3, Blocks: 1024}, true, false},
		{AppendWriteSame16(nil, 0, 8, false, true), cdbWriteSame16(0, 8, false, true),
			CDBInfo{Opcode: OpWriteSame16, Blocks: 8}, false, true},
		{AppendUnmap(nil, 24), cdbUnmap(24), CDBInfo{Opcode: OpUnmap, Dir: DirOut, Length: 24}, false, false},
		{AppendModeSense10(nil, true, false, 0, 0x08, 0, 64), cdbModeSense10(true, false, 0, 0x08, 0, 64),
			CDBInfo{Opcode: OpModeSense10, Dir: DirIn, Length: 64}, false, true},
		{AppendModeSense10(nil, false, true, 2, 0x3F, 0xFF, 512), cdbModeSense10(false, true, 2, 0x3F, 0xFF, 512),
			CDBInfo{Opcode: OpModeSense10, Dir: DirIn, Length: 512}, true, false},
		{AppendReportLUNs(nil, 0, 4096), cdbReportLUNs(0, 4096), CDBInfo{Opcode: OpReportLUNs, Dir: DirIn, Length: 4096}, false, false},
		{AppendReportLUNs(nil, 2, 16), cdbReportLUNs(2, 16), CDBInfo{Opcode: OpReportLUNs, Dir: DirIn, Length: 16}, false, false},
		{AppendGetLBAStatus(nil, 100, 255), cdbGetLBAStatus(100, 255),
			CDBInfo{Opcode: OpServiceActionIn16, ServiceAction: SAGetLBAStatus, Dir: DirIn, Length: 255, LBA: 100}, false, false},
	} {
		if !bytes.Equal(tc.cdb, tc.same) {
			t.Errorf("% x: the test builder gives % x", tc.cdb, tc.same)
			continue
		}
		got, err := l.ParseCDB(tc.cdb)
		if err != nil {
			t.Errorf("% x: %v", tc.cdb, err)
			continue
		}
		if got.flag != tc.flag || got.flag2 != tc.flag2 {
			t.Errorf("% x (%s): flags %v %v; want %v %v", tc.cdb, got.Name(), got.flag, got.flag2, tc.flag, tc.flag2)
		}
		got.cmd, got.flag, got.flag2, got.bytchk = nil, false, false, 0
		if got != tc.want {
			t.Errorf("% x: parsed %+v; want %+v", tc.cdb, got, tc.want)
		}
		if len(tc.cdb) != cdbLen(tc.cdb[0]) {
			t.Errorf("% x: %d bytes; the opcode's group has %d", tc.cdb, len(tc.cdb), cdbLen(tc.cdb[0]))
		}
	}
}

// TestEncodersAppend: an encoder appends after what dst holds, and into an array's capacity
// without allocating (the initiator's per-I/O use).
func TestEncodersAppend(t *testing.T) {
	pre := []byte{0xEE, 0xEE}
	got := AppendRead16(pre, 1, 2, false)
	if !bytes.Equal(got[:2], []byte{0xEE, 0xEE}) || !bytes.Equal(got[2:], cdbRead16(1, 2)) {
		t.Fatalf("% x", got)
	}
	var a [16]byte
	for i := range a {
		a[i] = 0xFF // stale bytes of a previous CDB must not show through
	}
	if c := AppendReportLUNs(a[:0], 0, 64); !bytes.Equal(c, cdbReportLUNs(0, 64)) {
		t.Fatalf("REPORT LUNS over stale bytes: % x", c)
	}
	var params [8 + 16*2]byte
	descs := [2]UnmapDescriptor{{LBA: 1, Blocks: 2}, {LBA: 10, Blocks: 20}}
	n := testing.AllocsPerRun(100, func() {
		_ = AppendWrite16(a[:0], 1, 2, true)
		_ = AppendWriteSame16(a[:0], 1, 2, true, false)
		_ = AppendUnmap(a[:0], 24)
		_ = AppendInquiry(a[:0], true, 0xB0, 64)
		_ = AppendUnmapParams(params[:0], descs[:])
	})
	if n != 0 {
		t.Fatalf("%v allocs", n)
	}
}

// TestReadWrite16RoundTrip: any in-range READ(16)/WRITE(16) round-trips through ParseCDB.
func TestReadWrite16RoundTrip(t *testing.T) {
	l, _ := newTestLUN(t, testConfig())
	maxXfer := testConfig().MaxTransferLength
	rapid.Check(t, func(rt *rapid.T) {
		lba := rapid.Uint64Range(0, testBlocks-1).Draw(rt, "lba")
		n := rapid.Uint32Range(0, min(maxXfer, uint32(testBlocks-lba))).Draw(rt, "blocks")
		fua := rapid.Bool().Draw(rt, "fua")
		write := rapid.Bool().Draw(rt, "write")
		var a [16]byte
		cdb, op, dir := AppendRead16(a[:0], lba, n, fua), uint8(OpRead16), DirIn
		if write {
			cdb, op, dir = AppendWrite16(a[:0], lba, n, fua), OpWrite16, DirOut
		}
		i, err := l.ParseCDB(cdb)
		if n == 0 {
			dir = DirNone
		}
		if err != nil || i.Opcode != op || i.LBA != lba || i.Blocks != n || i.FUA != fua || i.Dir != dir ||
			i.Length != n*uint32(l.BlockSize()) {
			rt.Fatalf("% x: %+v, %v", cdb, i, err)
		}
	})
}

// TestUnmapParamsRoundTrip: AppendUnmapParams gives the bytes of the tests' own builder
// (unmapParams), and the LUN's UNMAP, reading the list with AppendUnmap's CDB, unmaps exactly
// the blocks the descriptors name: every other block keeps its data.
func TestUnmapParamsRoundTrip(t *testing.T) {
	cfg := testConfig()
	l, m := newTestLUN(t, cfg)
	bs := l.BlockSize()
	rapid.Check(t, func(rt *rapid.T) {
		nd := rapid.IntRange(0, int(cfg.MaxUnmapDescriptors)).Draw(rt, "descriptors")
		descs := make([]UnmapDescriptor, nd)
		ranges := make([][2]uint64, nd)
		left := uint64(cfg.MaxUnmapLBACount)
		for k := range descs {
			lba := rapid.Uint64Range(0, testBlocks-1).Draw(rt, "lba")
			n := rapid.Uint64Range(0, min(left, testBlocks-lba)).Draw(rt, "blocks")
			left -= n
			descs[k] = UnmapDescriptor{LBA: lba, Blocks: uint32(n)}
			ranges[k] = [2]uint64{lba, n}
		}
		pre := []byte{0xEE}
		p := AppendUnmapParams(pre, descs)
		if p[0] != 0xEE || !bytes.Equal(p[1:], unmapParams(ranges...)) {
			rt.Fatalf("% x; the test builder gives % x", p[1:], unmapParams(ranges...))
		}
		p = p[1:]

		m.mu.Lock()
		for k := range m.data {
			m.data[k] = 0xFF
		}
		m.mu.Unlock()
		r, _ := do(l, nexA, AppendUnmap(nil, uint16(len(p))), p, 0)
		if r.Status != StatusGood {
			rt.Fatalf("UNMAP of %v: %v %v", descs, r.Status, r.Sense)
		}
		unmapped := make([]bool, testBlocks)
		for _, d := range descs {
			for b := d.LBA; b < d.LBA+uint64(d.Blocks); b++ {
				unmapped[b] = true
			}
		}
		m.mu.RLock()
		defer m.mu.RUnlock()
		for b, u := range unmapped {
			blk := m.data[b*bs : (b+1)*bs]
			if want := fill(bs, 0xFF); u {
				want = make([]byte, bs)
				if !bytes.Equal(blk, want) {
					rt.Fatalf("block %d of %v kept its data", b, descs)
				}
			} else if !bytes.Equal(blk, want) {
				rt.Fatalf("block %d lost its data to %v", b, descs)
			}
		}
	})
}

// TestUnmapParamsLimit: the largest list still has its length in 16 bits; one more descriptor
// panics rather than wrap the header's lengths.
func TestUnmapParamsLimit(t *testing.T) {
	p := AppendUnmapParams(nil, make([]UnmapDescriptor, MaxUnmapParamDescriptors))
	if len(p) > 0xFFFF || int(binary.BigEndian.Uint16(p)) != len(p)-2 ||
		int(binary.BigEndian.Uint16(p[2:])) != len(p)-8 {
		t.Fatalf("%d bytes, header % x", len(p), p[:8])
	}
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	AppendUnmapParams(nil, make([]UnmapDescriptor, MaxUnmapParamDescriptors+1))
}
