package scsi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sort"
	"testing"
)

// cdbGetLBAStatus is GET LBA STATUS (sbc4r15 5.8): SERVICE ACTION IN(16) 0x12, STARTING LBA in
// bytes 2-9, allocation length in 10-13.
func cdbGetLBAStatus(lba uint64, alloc uint32) []byte {
	c := make([]byte, 16)
	c[0], c[1] = OpServiceActionIn16, SAGetLBAStatus
	binary.BigEndian.PutUint64(c[2:], lba)
	binary.BigEndian.PutUint32(c[10:], alloc)
	return c
}

// cdbGetLBAStatusRT is cdbGetLBAStatus with REPORT TYPE rt in byte 14.
func cdbGetLBAStatusRT(lba uint64, alloc uint32, rt uint8) []byte {
	c := cdbGetLBAStatus(lba, alloc)
	c[14] = rt
	return c
}

// cdbLogSense is LOG SENSE (spc4r37 6.8): PC and page code in byte 2, subpage in 3, parameter
// pointer in 5-6, allocation length in 7-8.
func cdbLogSense(pc, page, sub uint8, ptr, alloc uint16) []byte {
	c := []byte{OpLogSense, 0, pc<<6 | page, sub, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(c[5:], ptr)
	binary.BigEndian.PutUint16(c[7:], alloc)
	return c
}

// cdbRSTMF is REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS (spc4r37 6.40): MAINTENANCE IN 0x0D,
// REPD in byte 2 bit 7, allocation length in bytes 6-9.
func cdbRSTMF(repd bool, alloc uint32) []byte {
	c := []byte{OpMaintenanceIn, SAReportSupportedTMFs, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if repd {
		c[2] = 0x80
	}
	binary.BigEndian.PutUint32(c[6:], alloc)
	return c
}

// fakeAlloc is a backend.Allocation over a list of allocated byte extents.
type fakeAlloc struct {
	ext         [][2]int64 // [start, end), sorted, disjoint
	size        int64
	used, avail int64
	err         error
	calls       int
}

func (f *fakeAlloc) Allocated(off, n int64) (bool, int64, error) {
	f.calls++
	if f.err != nil {
		return false, 0, f.err
	}
	end := off + n
	i := sort.Search(len(f.ext), func(i int) bool { return f.ext[i][1] > off })
	if i < len(f.ext) && f.ext[i][0] <= off {
		return true, min(f.ext[i][1], end) - off, nil
	}
	next := end
	if i < len(f.ext) {
		next = min(f.ext[i][0], end)
	}
	return false, next - off, nil
}

func (f *fakeAlloc) Usage() (int64, int64, error) { return f.used, f.avail, f.err }

func withAlloc(f *fakeAlloc) func(*LUNConfig) { return func(c *LUNConfig) { c.Allocation = f } }

// lbaDesc is one GET LBA STATUS descriptor (sbc4r15 Table 47): LBA, block count, provisioning
// status in byte 12.
func lbaDesc(lba uint64, n uint32, status uint8) []byte {
	d := make([]byte, 16)
	binary.BigEndian.PutUint64(d, lba)
	binary.BigEndian.PutUint32(d[8:], n)
	d[12] = status
	return d
}

// lbaStatusRTP is lbaStatus with the RTP bit (byte 7 bit 0, sbc4r12): the REPORT TYPE was
// processed.
func lbaStatusRTP(descs ...[]byte) []byte {
	b := lbaStatus(descs...)
	b[7] = 0x01
	return b
}

func lbaStatus(descs ...[]byte) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint32(b, uint32(4+16*len(descs)))
	for _, d := range descs {
		b = append(b, d...)
	}
	return b
}

func TestGetLBAStatus(t *testing.T) {
	const bs = 512
	// Blocks 0-9 allocated, 10-99 a hole, 100-101 allocated plus 100 bytes of block 102, a
	// 300-byte hole (inside block 102), the rest of 102 and 103 allocated, then a hole to the end.
	frag := func() *fakeAlloc {
		return &fakeAlloc{ext: [][2]int64{{0, 10 * bs}, {100 * bs, 102*bs + 100}, {102*bs + 400, 104 * bs}}}
	}
	expect := func(want []byte) func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
		return func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
			if !bytes.Equal(d, want) {
				t.Fatalf("\n got % x\nwant % x", d, want)
			}
		}
	}
	runCases(t, []cmdCase{
		{name: "no allocation information: all mapped", cdb: cdbGetLBAStatus(5, 255), in: 255, want: good(),
			check: expect(lbaStatus(lbaDesc(5, testBlocks-5, 0)))},
		{name: "runs", cfg: withAlloc(frag()), cdb: cdbGetLBAStatus(0, 255), in: 255, want: good(),
			check: expect(lbaStatus(lbaDesc(0, 10, 0), lbaDesc(10, 90, 1), lbaDesc(100, 4, 0), lbaDesc(104, testBlocks-104, 1)))},
		{name: "from inside a hole", cfg: withAlloc(frag()), cdb: cdbGetLBAStatus(50, 255), in: 255, want: good(),
			check: expect(lbaStatus(lbaDesc(50, 50, 1), lbaDesc(100, 4, 0), lbaDesc(104, testBlocks-104, 1)))},
		{name: "allocation length bounds the descriptors", cfg: withAlloc(frag()), cdb: cdbGetLBAStatus(0, 8+2*16), in: 255,
			want: good(), check: expect(lbaStatus(lbaDesc(0, 10, 0), lbaDesc(10, 90, 1)))},
		{name: "at least one descriptor, truncated", cfg: withAlloc(frag()), cdb: cdbGetLBAStatus(0, 12), in: 255,
			want: good(), check: expect(lbaStatus(lbaDesc(0, 10, 0))[:12])},
		{name: "last LBA", cfg: withAlloc(frag()), cdb: cdbGetLBAStatus(testBlocks-1, 255), in: 255, want: good(),
			check: expect(lbaStatus(lbaDesc(testBlocks-1, 1, 1)))},
		{name: "4096-byte blocks", cfg: func(c *LUNConfig) {
			c.BlockSize = 4096
			c.Allocation = &fakeAlloc{ext: [][2]int64{{4096, 4096 + 1}}}
		}, cdb: cdbGetLBAStatus(0, 255), in: 255, want: good(),
			check: expect(lbaStatus(lbaDesc(0, 1, 1), lbaDesc(1, 1, 0), lbaDesc(2, testBlocks-2, 1)))},
		{name: "LBA beyond the capacity", cdb: cdbGetLBAStatus(testBlocks, 255), want: sk(IllegalRequest, 0x21, 0)},
		// REPORT TYPE (byte 14, sbc4r15 5.8; sg_get_lba_status --report-type): only the
		// descriptors of that provisioning status, from the first such LBA at or after the start.
		{name: "report type 1: non-zero status", cfg: withAlloc(frag()), cdb: cdbGetLBAStatusRT(0, 255, 1), in: 255, want: good(),
			check: expect(lbaStatusRTP(lbaDesc(10, 90, 1), lbaDesc(104, testBlocks-104, 1)))},
		{name: "report type 2: mapped", cfg: withAlloc(frag()), cdb: cdbGetLBAStatusRT(0, 255, 2), in: 255, want: good(),
			check: expect(lbaStatusRTP(lbaDesc(0, 10, 0), lbaDesc(100, 4, 0)))},
		{name: "report type 2 from inside a hole", cfg: withAlloc(frag()), cdb: cdbGetLBAStatusRT(50, 255, 2), in: 255, want: good(),
			check: expect(lbaStatusRTP(lbaDesc(100, 4, 0)))},
		{name: "report type 3: deallocated", cfg: withAlloc(frag()), cdb: cdbGetLBAStatusRT(0, 255, 3), in: 255, want: good(),
			check: expect(lbaStatusRTP(lbaDesc(10, 90, 1), lbaDesc(104, testBlocks-104, 1)))},
		{name: "report type 3 from inside a hole", cfg: withAlloc(frag()), cdb: cdbGetLBAStatusRT(50, 255, 3), in: 255, want: good(),
			check: expect(lbaStatusRTP(lbaDesc(50, 50, 1), lbaDesc(104, testBlocks-104, 1)))},
		{name: "report type 3, allocation length bounds the descriptors", cfg: withAlloc(frag()), cdb: cdbGetLBAStatusRT(0, 8+16, 3),
			in: 255, want: good(), check: expect(lbaStatusRTP(lbaDesc(10, 90, 1)))},
		{name: "report type 2 without allocation information", cdb: cdbGetLBAStatusRT(5, 255, 2), in: 255, want: good(),
			check: expect(lbaStatusRTP(lbaDesc(5, testBlocks-5, 0)))},
		{name: "report type 3 without allocation information: none", cdb: cdbGetLBAStatusRT(5, 255, 3), in: 255, want: good(),
			check: expect(lbaStatusRTP())},
		{name: "report type 4: no anchored LBAs", cfg: withAlloc(frag()), cdb: cdbGetLBAStatusRT(0, 255, 4), in: 255, want: good(),
			check: expect(lbaStatusRTP())},
		{name: "report type 10h: no LBA known to return unrecovered errors", cfg: withAlloc(frag()), cdb: cdbGetLBAStatusRT(0, 255, 0x10),
			in: 255, want: good(), check: expect(lbaStatusRTP())},
		{name: "undefined report type", cdb: cdbGetLBAStatusRT(0, 255, 5), want: badCDB(14, 7)},
		{name: "backend error", cfg: withAlloc(&fakeAlloc{err: errors.New("EIO")}), cdb: cdbGetLBAStatus(3, 255),
			want: sk(MediumError, 0x11, 0).withInfo(3)},
	})
}

func TestLogSense(t *testing.T) {
	expect := func(want []byte) func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
		return func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
			if !bytes.Equal(d, want) {
				t.Fatalf("\n got % x\nwant % x", d, want)
			}
		}
	}
	// Logical block provisioning parameters (sbc4r15 6.4.6): code, control 03h (binary
	// list), length 8, RESOURCE COUNT in blocks, SCOPE.
	avail := []byte{0, 1, 0x03, 8, 0, 0, 0x01, 0x00, 0, 0, 0, 0}
	used := []byte{0, 2, 0x03, 8, 0, 0, 0x00, 0x40, 0, 0, 0, 0}
	runCases(t, []cmdCase{
		{name: "supported pages", cdb: cdbLogSense(1, 0, 0, 0, 255), in: 255, want: good(),
			check: expect([]byte{0x00, 0, 0, 2, 0x00, 0x0C})},
		{name: "supported pages and subpages", cdb: cdbLogSense(1, 0, 0xFF, 0, 255), in: 255, want: good(),
			check: expect([]byte{0x40, 0xFF, 0, 6, 0x00, 0x00, 0x00, 0xFF, 0x0C, 0x00})},
		{name: "provisioning", cfg: withAlloc(&fakeAlloc{used: 64 * 512, avail: 256 * 512}),
			cdb: cdbLogSense(1, 0x0C, 0, 0, 255), in: 255, want: good(),
			check: expect(append(append([]byte{0x0C, 0, 0, 24}, avail...), used...))},
		{name: "provisioning from parameter 2", cfg: withAlloc(&fakeAlloc{used: 64 * 512, avail: 256 * 512}),
			cdb: cdbLogSense(1, 0x0C, 0, 2, 255), in: 255, want: good(),
			check: expect(append([]byte{0x0C, 0, 0, 12}, used...))},
		{name: "provisioning, available unknown", cfg: withAlloc(&fakeAlloc{used: 64 * 512, avail: -1}),
			cdb: cdbLogSense(1, 0x0C, 0, 0, 255), in: 255, want: good(),
			check: expect(append([]byte{0x0C, 0, 0, 12}, used...))},
		{name: "provisioning without allocation information: all used", cdb: cdbLogSense(1, 0x0C, 0, 0, 255), in: 255,
			want: good(), check: expect([]byte{0x0C, 0, 0, 12, 0, 2, 0x03, 8, 0, 0, testBlocks >> 8, 0, 0, 0, 0, 0})},
		{name: "allocation length", cdb: cdbLogSense(1, 0, 0, 0, 5), in: 255, want: good(),
			check: expect([]byte{0x00, 0, 0, 2, 0x00})},
		{name: "parameter pointer past the last parameter", cdb: cdbLogSense(1, 0x0C, 0, 3, 255), want: badCDB(5, 7)},
		{name: "parameter pointer on the supported pages", cdb: cdbLogSense(1, 0, 0, 1, 255), want: badCDB(5, 7)},
		{name: "unsupported page", cdb: cdbLogSense(1, 0x0D, 0, 0, 255), want: badCDB(2, 5)},
		{name: "unsupported subpage", cdb: cdbLogSense(1, 0x0C, 1, 0, 255), want: badCDB(3, 7)},
		{name: "SP", cdb: func() []byte { c := cdbLogSense(1, 0, 0, 0, 255); c[1] = 1; return c }(), want: badCDB(1, 0)},
		{name: "backend error", cfg: withAlloc(&fakeAlloc{err: errors.New("EIO")}), cdb: cdbLogSense(1, 0x0C, 0, 0, 255),
			want: sk(MediumError, 0x11, 0).withInfo(0)},
	})
}

func TestReportSupportedTMFs(t *testing.T) {
	runCases(t, []cmdCase{
		{name: "basic", cdb: cdbRSTMF(false, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				// ATS, ATSS, CTSS, LURS (spc4r37 Table 221)
				if !bytes.Equal(d, []byte{0xD8, 0, 0, 0}) {
					t.Fatalf("% x", d)
				}
			}},
		{name: "extended", cdb: cdbRSTMF(true, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if !bytes.Equal(d, []byte{0xD8, 0, 0, 0x0C, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) {
					t.Fatalf("% x", d)
				}
			}},
		{name: "allocation length under 4", cdb: cdbRSTMF(false, 3), want: badCDB(6, 7)},
	})
}

func TestExtendedInquiryAndRWRecovery(t *testing.T) {
	runCases(t, []cmdCase{
		{name: "VPD 86", cdb: cdbInquiry(true, 0x86, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				want := make([]byte, 64)
				want[1], want[3], want[5], want[6] = 0x86, 0x3C, 0x07, 0x01
				if !bytes.Equal(d, want) {
					t.Fatalf("% x", d)
				}
			}},
		// Read-write error recovery (sbc4r15 6.5.9): current, changeable and default all zero.
		{name: "mode page 01 current", cdb: cdbModeSense6(true, 0, 0x01, 0, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if !bytes.Equal(d, []byte{15, 0, 0x10, 0, 0x01, 0x0A, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) {
					t.Fatalf("% x", d)
				}
			}},
		{name: "mode page 01 changeable", cdb: cdbModeSense10(true, false, 1, 0x01, 0, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if !bytes.Equal(d[8:], []byte{0x01, 0x0A, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) {
					t.Fatalf("% x", d)
				}
			}},
		{name: "mode page 01 default", cdb: cdbModeSense10(true, false, 2, 0x01, 0, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if !bytes.Equal(d[8:], []byte{0x01, 0x0A, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) {
					t.Fatalf("% x", d)
				}
			}},
		{name: "mode select page 01 unchanged", cdb: cdbModeSelect6(16),
			out: []byte{0, 0, 0, 0, 0x01, 0x0A, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, want: good()},
		{name: "mode select page 01 read retry count", cdb: cdbModeSelect6(16),
			out: []byte{0, 0, 0, 0, 0x01, 0x0A, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0}, want: badParam(7, 2)},
		{name: "RSOC lists the new commands", cfg: withALUA(ALUAActiveOptimized), cdb: cdbRSOC(false, 0, 0, 0, 4096), in: 4096,
			want: good(), check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				type opsa struct{ op, sa uint8 }
				seen := map[opsa]bool{}
				for p := 4; p+8 <= len(d); p += 8 {
					seen[opsa{d[p], d[p+3]}] = true
				}
				for _, k := range []opsa{{OpLogSense, 0}, {OpServiceActionIn16, SAGetLBAStatus},
					{OpMaintenanceIn, SAReportTargetPortGrps}, {OpMaintenanceIn, SAReportSupportedTMFs}} {
					if !seen[k] {
						t.Errorf("%02x/%02x not listed", k.op, k.sa)
					}
				}
			}},
	})
}
