package scsi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// want is the expected outcome of a command: GOOD unless key/status say otherwise.
type want struct {
	status    Status
	key       SenseKey
	asc, ascq uint8
	field     *FieldPointer
	info      *uint64
}

func good() want { return want{} }

func sk(key SenseKey, asc, ascq uint8) want {
	return want{status: StatusCheckCondition, key: key, asc: asc, ascq: ascq}
}

func badCDB(b, bit int) want {
	w := sk(IllegalRequest, 0x24, 0)
	f := fieldPointer(true, b, bit)
	w.field = &f
	return w
}

func badParam(b, bit int) want {
	w := sk(IllegalRequest, 0x26, 0)
	f := fieldPointer(false, b, bit)
	w.field = &f
	return w
}

func (w want) withInfo(v uint64) want { w.info = &v; return w }

func (w want) verify(t *testing.T, r Result) {
	t.Helper()
	if r.Status != w.status {
		t.Fatalf("status %v (sense %v); want %v", r.Status, r.Sense, w.status)
	}
	if w.status != StatusCheckCondition {
		return
	}
	if !r.Sense.Match(w.key, w.asc, w.ascq) {
		t.Fatalf("sense %v; want %v %02X/%02X", r.Sense, w.key, w.asc, w.ascq)
	}
	if w.field != nil && r.Sense.Field != *w.field {
		t.Fatalf("field pointer %+v; want %+v", r.Sense.Field, *w.field)
	}
	if w.field == nil && r.Sense.Field.Valid {
		t.Fatalf("unexpected field pointer %+v", r.Sense.Field)
	}
	if w.info != nil && (!r.Sense.InfoValid || r.Sense.Info != *w.info) {
		t.Fatalf("information %v/%d; want %d", r.Sense.InfoValid, r.Sense.Info, *w.info)
	}
}

type cmdCase struct {
	name  string
	cfg   func(*LUNConfig)
	be    func(*memBackend) // adjust the backend before NewLUN
	setup func(t *testing.T, l *LUN, m *memBackend)
	cdb   []byte
	out   []byte
	in    int
	want  want
	check func(t *testing.T, data []byte, l *LUN, m *memBackend)
}

func runCases(t *testing.T, cases []cmdCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			bs := cfg.BlockSize
			if bs == 0 {
				bs = 512
			}
			m := newMemBackend(int64(bs) * testBlocks)
			if c.be != nil {
				c.be(m)
			}
			l, err := NewLUN(cfg, m)
			if err != nil {
				t.Fatal(err)
			}
			clearUA(t, l, nexA)
			clearUA(t, l, nexB)
			if c.setup != nil {
				c.setup(t, l, m)
			}
			r, data := do(l, nexA, c.cdb, c.out, c.in)
			c.want.verify(t, r)
			if c.check != nil {
				c.check(t, data, l, m)
			}
		})
	}
}

func mustGood(t *testing.T, l *LUN, cdb, out []byte) {
	t.Helper()
	r, _ := do(l, nexA, cdb, out, 0)
	wantGood(t, r)
}

func readBack(t *testing.T, l *LUN, lba uint64, n uint32) []byte {
	t.Helper()
	var out []byte
	for n > 0 {
		k := min(n, 256)
		r, d := do(l, nexA, cdbRead16(lba, k), nil, int(k)*l.BlockSize())
		wantGood(t, r)
		out = append(out, d...)
		lba, n = lba+uint64(k), n-k
	}
	return out
}

func wantLen(t *testing.T, data []byte, n int) {
	t.Helper()
	if len(data) != n {
		t.Fatalf("data-in length %d; want %d", len(data), n)
	}
}

func TestInvalidOpcodes(t *testing.T) {
	runCases(t, []cmdCase{
		{name: "unsupported group 0", cdb: []byte{0x1D, 0, 0, 0, 0, 0}, want: sk(IllegalRequest, 0x20, 0)},
		{name: "vendor specific", cdb: []byte{0xC0, 0, 0, 0, 0, 0}, want: sk(IllegalRequest, 0x20, 0)},
		{name: "variable length", cdb: []byte{0x7F, 0, 0, 0, 0, 0, 0, 0, 0, 0}, want: sk(IllegalRequest, 0x20, 0)},
		{name: "empty CDB", cdb: []byte{}, want: sk(IllegalRequest, 0x20, 0)},
		{name: "short CDB", cdb: cdbRead16(0, 1)[:10], want: sk(IllegalRequest, 0x24, 0)},
		{name: "NACA", cdb: []byte{OpTestUnitReady, 0, 0, 0, 0, 0x04}, want: badCDB(5, 2)},
		{name: "NACA read16", cdb: func() []byte { c := cdbRead16(0, 1); c[15] = 0x04; return c }(), want: badCDB(15, 2)},
		{name: "trailing CDB bytes ignored", cdb: append(cdbTUR(), make([]byte, 10)...), want: good()},
	})
}

func TestTestUnitReady(t *testing.T) {
	runCases(t, []cmdCase{
		{name: "ready", cdb: cdbTUR(), want: good()},
		{name: "stopped", setup: func(t *testing.T, l *LUN, _ *memBackend) { mustGood(t, l, cdbStartStop(false, false), nil) },
			cdb: cdbTUR(), want: sk(NotReady, 0x04, 0x02)},
	})
}

func TestInquiry(t *testing.T) {
	runCases(t, []cmdCase{
		{name: "standard", cdb: cdbInquiry(false, 0, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, l *LUN, _ *memBackend) {
				wantLen(t, d, stdInquiryLen)
				if d[0] != 0 || d[2] != 0x06 || d[3]&0x0F != 2 || int(d[4]) != stdInquiryLen-5 || d[7]&0x02 == 0 {
					t.Fatalf("header % x", d[:8])
				}
				if string(d[8:16]) != "SRPD    " || string(d[16:32]) != "SRPD LUN        " || string(d[32:36]) != "0001" {
					t.Fatalf("identification %q", d[8:36])
				}
				if binary.BigEndian.Uint16(d[58:]) != versionSAM5 {
					t.Fatalf("version descriptors % x", d[58:74])
				}
			}},
		{name: "allocation length truncates", cdb: cdbInquiry(false, 0, 36), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) { wantLen(t, d, 36) }},
		{name: "buffer truncates", cdb: cdbInquiry(false, 0, 255), in: 5, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) { wantLen(t, d, 5) }},
		{name: "custom strings", cfg: func(c *LUNConfig) { c.Vendor, c.Product, c.Revision = "ACME", "Disk", "9" },
			cdb: cdbInquiry(false, 0, 96), in: 96, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if string(d[8:36]) != "ACME    Disk            9   " {
					t.Fatalf("%q", d[8:36])
				}
			}},
		{name: "page code without EVPD", cdb: cdbInquiry(false, 0x80, 255), want: badCDB(2, 7)},
		{name: "CMDDT", cdb: []byte{OpInquiry, 0x02, 0, 0, 255, 0}, want: badCDB(1, 1)},
		{name: "unsupported VPD page", cdb: cdbInquiry(true, 0x99, 255), want: badCDB(2, 7)},
		{name: "VPD 00", cdb: cdbInquiry(true, 0x00, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if !bytes.Equal(d, []byte{0, 0, 0, 7, 0x00, 0x80, 0x83, 0x86, 0xB0, 0xB1, 0xB2}) {
					t.Fatalf("% x", d)
				}
			}},
		{name: "VPD 80", cdb: cdbInquiry(true, 0x80, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if d[1] != 0x80 || string(d[4:]) != "SRPDTEST0001" || int(binary.BigEndian.Uint16(d[2:])) != len(d)-4 {
					t.Fatalf("% x", d)
				}
			}},
		{name: "VPD 80 from DeviceID", cfg: func(c *LUNConfig) { c.Serial = ""; c.DeviceID = [16]byte{15: 0x2A} },
			cdb: cdbInquiry(true, 0x80, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if string(d[4:]) != "0000000000000000000000000000002a" {
					t.Fatalf("%q", d[4:])
				}
			}},
		{name: "VPD 83", cdb: cdbInquiry(true, 0x83, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, l *LUN, _ *memBackend) {
				if int(binary.BigEndian.Uint16(d[2:])) != len(d)-4 {
					t.Fatalf("page length % x", d)
				}
				naa := d[4:]
				if naa[0] != 0x01 || naa[1] != 0x03 || naa[3] != 16 || naa[4]>>4 != 6 {
					t.Fatalf("NAA designator % x", naa[:20])
				}
				want := deriveNAA(DefaultCompanyID, [16]byte{}, "SRPDTEST0001")
				if !bytes.Equal(naa[4:20], want[:]) || l.NAA() != want {
					t.Fatalf("NAA % x; want % x", naa[4:20], want)
				}
				// IEEE company ID 00-14-05 in the 24 bits after the NAA nibble
				cid := uint32(naa[4]&0x0F)<<20 | uint32(naa[5])<<12 | uint32(naa[6])<<4 | uint32(naa[7])>>4
				if cid != DefaultCompanyID {
					t.Fatalf("company ID %06x", cid)
				}
				t10 := d[24:]
				if t10[0] != 0x02 || t10[1] != 0x01 || string(t10[4:4+t10[3]]) != "SRPD    SRPDTEST0001" {
					t.Fatalf("T10 designator %q", t10)
				}
			}},
		{name: "VPD B0", cdb: cdbInquiry(true, 0xB0, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				wantLen(t, d, 64)
				be32 := binary.BigEndian.Uint32
				if d[4]&1 != 1 || d[5] != 8 || be32(d[8:]) != 256 || be32(d[20:]) != 1024 || be32(d[24:]) != 4 ||
					binary.BigEndian.Uint64(d[36:]) != 1024 || binary.BigEndian.Uint16(d[2:]) != 0x3C {
					t.Fatalf("% x", d)
				}
			}},
		{name: "VPD B1", cdb: cdbInquiry(true, 0xB1, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if binary.BigEndian.Uint16(d[4:]) != 1 {
					t.Fatalf("rotation rate % x", d[4:6])
				}
			}},
		{name: "VPD B1 rotational", be: func(m *memBackend) { m.info.Rotational = true },
			cdb: cdbInquiry(true, 0xB1, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if binary.BigEndian.Uint16(d[4:]) != 0 {
					t.Fatalf("rotation rate % x", d[4:6])
				}
			}},
		{name: "VPD B2", cdb: cdbInquiry(true, 0xB2, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if !bytes.Equal(d, []byte{0, 0xB2, 0, 4, 0, 0xE4, 0x02, 0}) {
					t.Fatalf("% x", d)
				}
			}},
		{name: "VPD B2 no discard", be: func(m *memBackend) { m.info.CanDiscard = false },
			cdb: cdbInquiry(true, 0xB2, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if !bytes.Equal(d, []byte{0, 0xB2, 0, 4, 0, 0, 0, 0}) {
					t.Fatalf("% x", d)
				}
			}},
	})
}

func TestNAAStable(t *testing.T) {
	id := [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	a := deriveNAA(DefaultCompanyID, id, "x")
	b := deriveNAA(DefaultCompanyID, id, "y") // the serial does not matter when an ID is set
	c := deriveNAA(DefaultCompanyID, [16]byte{}, "x")
	d := deriveNAA(0xABCDEF, id, "x")
	if a != b || a == c || a == d {
		t.Fatalf("derivation not as documented: % x % x % x % x", a, b, c, d)
	}
	// Golden value: changing the derivation would change every LUN's identity.
	if got := deriveNAA(DefaultCompanyID, [16]byte{}, "SRPDTEST0001"); got[0] != 0x60 || got[1] != 0x01 || got[2] != 0x40 || got[3]>>4 != 5 {
		t.Fatalf("% x", got)
	}
	if d[0] != 0x6A || d[1] != 0xBC || d[2] != 0xDE || d[3]>>4 != 0xF {
		t.Fatalf("company ID placement % x", d[:4])
	}
}

func TestRequestSense(t *testing.T) {
	runCases(t, []cmdCase{
		{name: "no sense fixed", cdb: cdbRequestSense(false, 252), in: 252, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				wantLen(t, d, 18)
				if d[0] != 0x70 || d[2] != 0 || d[7] != 10 || d[12] != 0 {
					t.Fatalf("% x", d)
				}
			}},
		{name: "no sense descriptor", cdb: cdbRequestSense(true, 252), in: 252, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if !bytes.Equal(d, []byte{0x72, 0, 0, 0, 0, 0, 0, 0}) {
					t.Fatalf("% x", d)
				}
			}},
		{name: "stopped", setup: func(t *testing.T, l *LUN, _ *memBackend) { mustGood(t, l, cdbStartStop(false, false), nil) },
			cdb: cdbRequestSense(false, 252), in: 252, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				s, _ := ParseSense(d)
				if !s.Match(NotReady, 0x04, 0x02) {
					t.Fatal(s)
				}
			}},
		{name: "pending unit attention reported and cleared",
			setup: func(t *testing.T, l *LUN, _ *memBackend) { l.Reset() },
			cdb:   cdbRequestSense(false, 252), in: 252, want: good(),
			check: func(t *testing.T, d []byte, l *LUN, _ *memBackend) {
				s, _ := ParseSense(d)
				if !s.Match(UnitAttention, 0x29, 0x03) {
					t.Fatal(s)
				}
				mustGood(t, l, cdbTUR(), nil)
			}},
		{name: "allocation length", cdb: cdbRequestSense(false, 8), in: 252, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) { wantLen(t, d, 8) }},
	})
}

func TestReadCapacity(t *testing.T) {
	runCases(t, []cmdCase{
		{name: "10", cdb: cdbReadCap10(), in: 8, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if !bytes.Equal(d, []byte{0, 0, 0x07, 0xFF, 0, 0, 0x02, 0}) {
					t.Fatalf("% x", d)
				}
			}},
		{name: "10 4096", cfg: func(c *LUNConfig) { c.BlockSize = 4096 }, cdb: cdbReadCap10(), in: 8, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if !bytes.Equal(d, []byte{0, 0, 0x07, 0xFF, 0, 0, 0x10, 0}) {
					t.Fatalf("% x", d)
				}
			}},
		{name: "10 LBA without PMI", cdb: func() []byte { c := cdbReadCap10(); c[5] = 1; return c }(), want: badCDB(2, 7)},
		{name: "10 LBA with PMI", cdb: func() []byte { c := cdbReadCap10(); c[5], c[8] = 1, 1; return c }(), in: 8, want: good()},
		{name: "16", cdb: cdbReadCap16(32), in: 32, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				wantLen(t, d, 32)
				if binary.BigEndian.Uint64(d) != testBlocks-1 || binary.BigEndian.Uint32(d[8:]) != 512 || d[14] != 0xC0 {
					t.Fatalf("% x", d)
				}
			}},
		{name: "16 physical exponent", be: func(m *memBackend) { m.info.PhysicalBlockSize = 4096; m.info.CanDiscard = false },
			cdb: cdbReadCap16(32), in: 32, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if d[13] != 3 || d[14] != 0 {
					t.Fatalf("% x", d)
				}
			}},
		{name: "16 allocation length", cdb: cdbReadCap16(12), in: 32, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) { wantLen(t, d, 12) }},
		{name: "16 LBA without PMI", cdb: func() []byte { c := cdbReadCap16(32); c[9] = 1; return c }(), want: badCDB(2, 7)},
		{name: "service action in, unknown SA", cdb: func() []byte { c := cdbReadCap16(32); c[1] = 0x11; return c }(), want: badCDB(1, 4)},
	})
}

func TestReadWrite(t *testing.T) {
	pattern := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7 + i>>9)
		}
		return b
	}
	roundTrip := func(wcdb, rcdb []byte, n int) cmdCase {
		return cmdCase{cdb: wcdb, out: pattern(n), want: good(),
			check: func(t *testing.T, _ []byte, l *LUN, _ *memBackend) {
				r, d := do(l, nexA, rcdb, nil, n)
				wantGood(t, r)
				if !bytes.Equal(d, pattern(n)) {
					t.Fatal("read back differs")
				}
			}}
	}
	rt := func(name string, c cmdCase) cmdCase { c.name = name; return c }
	runCases(t, []cmdCase{
		rt("6", roundTrip(cdbRW6(OpWrite6, 100, 3), cdbRW6(OpRead6, 100, 3), 3*512)),
		rt("6 length 0 is 256", roundTrip(cdbRW6(OpWrite6, 0, 0), cdbRW6(OpRead6, 0, 0), 256*512)),
		rt("10", roundTrip(cdbRW10(OpWrite10, 2000, 48, false), cdbRW10(OpRead10, 2000, 48, false), 48*512)),
		rt("10 FUA", roundTrip(cdbRW10(OpWrite10, 7, 1, true), cdbRW10(OpRead10, 7, 1, true), 512)),
		rt("12", roundTrip(cdbRW12(OpWrite12, 1, 256, false), cdbRW12(OpRead12, 1, 256, false), 256*512)),
		rt("16", roundTrip(cdbWrite16(2047, 1), cdbRead16(2047, 1), 512)),
		rt("16 4096", func() cmdCase {
			c := roundTrip(cdbWrite16(5, 2), cdbRead16(5, 2), 8192)
			c.cfg = func(c *LUNConfig) { c.BlockSize = 4096 }
			return c
		}()),
		{name: "read length 0", cdb: cdbRead16(0, 0), in: 512, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) { wantLen(t, d, 0) }},
		{name: "write length 0 at capacity", cdb: cdbWrite16(testBlocks, 0), want: good()},
		{name: "short data-in buffer", setup: func(t *testing.T, l *LUN, _ *memBackend) {
			mustGood(t, l, cdbWrite16(0, 2), pattern(1024))
		}, cdb: cdbRead16(0, 2), in: 700, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if !bytes.Equal(d, pattern(1024)[:700]) {
					t.Fatal("partial read differs")
				}
			}},
		{name: "read past end", cdb: cdbRead16(testBlocks-1, 2), in: 1024, want: sk(IllegalRequest, 0x21, 0)},
		{name: "read LBA wraps", cdb: cdbRead16(^uint64(0), 2), in: 1024, want: sk(IllegalRequest, 0x21, 0)},
		{name: "write past end", cdb: cdbWrite16(testBlocks, 1), out: pattern(512), want: sk(IllegalRequest, 0x21, 0)},
		{name: "read6 past end", cdb: cdbRW6(OpRead6, testBlocks-10, 20), in: 20 * 512, want: sk(IllegalRequest, 0x21, 0)},
		{name: "read10 past end", cdb: cdbRW10(OpRead10, testBlocks, 1, false), in: 512, want: sk(IllegalRequest, 0x21, 0)},
		{name: "read12 past end", cdb: cdbRW12(OpRead12, 0, testBlocks+1, false), in: 512, want: badCDB(6, 7)},
		{name: "read10 beyond max transfer", cdb: cdbRW10(OpRead10, 0, 257, false), want: badCDB(7, 7)},
		{name: "write12 beyond max transfer", cdb: cdbRW12(OpWrite12, 0, 257, false), want: badCDB(6, 7)},
		{name: "read16 beyond max transfer", cdb: cdbRead16(0, 257), want: badCDB(10, 7)},
		{name: "read6 256 beyond max transfer", cfg: func(c *LUNConfig) { c.MaxTransferLength = 255 },
			cdb: cdbRW6(OpRead6, 0, 0), want: badCDB(4, 7)},
		{name: "RDPROTECT", cdb: func() []byte { c := cdbRead16(0, 1); c[1] = 0x20; return c }(), want: badCDB(1, 7)},
		{name: "WRPROTECT", cdb: func() []byte { c := cdbRW10(OpWrite10, 0, 1, false); c[1] = 0x40; return c }(),
			out: pattern(512), want: badCDB(1, 7)},
		{name: "write protected config", cfg: func(c *LUNConfig) { c.ReadOnly = true },
			cdb: cdbWrite16(0, 1), out: pattern(512), want: sk(DataProtect, 0x27, 0)},
		{name: "write protected backend", be: func(m *memBackend) { m.info.ReadOnly = true },
			cdb: cdbRW6(OpWrite6, 0, 1), out: pattern(512), want: sk(DataProtect, 0x27, 0)},
		{name: "read-only LUN reads", cfg: func(c *LUNConfig) { c.ReadOnly = true }, cdb: cdbRead16(0, 1), in: 512, want: good()},
		{name: "medium error on read", be: func(m *memBackend) { m.readErrAt.Store(10*512 + 100) },
			cdb: cdbRead16(8, 4), in: 4 * 512, want: sk(MediumError, 0x11, 0).withInfo(10),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) { wantLen(t, d, 0) }},
		{name: "medium error on write", be: func(m *memBackend) { m.writeErrAt.Store(3 * 512) },
			cdb: cdbRW10(OpWrite10, 1, 4, false), out: pattern(4 * 512), want: sk(MediumError, 0x0C, 0).withInfo(3)},
		{name: "medium error on FUA flush", be: func(m *memBackend) { m.flushErr.Store(true) },
			cdb: cdbRW16(OpWrite16, 0, 1, true), out: pattern(512), want: sk(MediumError, 0x0C, 0)},
		{name: "short data-out 10", cdb: cdbRW10(OpWrite10, 0, 2, false), out: pattern(1000), want: badCDB(7, 7)},
		{name: "short data-out 6", cdb: cdbRW6(OpWrite6, 0, 2), out: nil, want: badCDB(4, 7)},
		{name: "short data-out 12", cdb: cdbRW12(OpWrite12, 0, 2, false), out: pattern(512), want: badCDB(6, 7)},
		{name: "short data-out 16", cdb: cdbWrite16(0, 2), out: pattern(512), want: badCDB(10, 7)},
		{name: "closed backend", setup: func(t *testing.T, l *LUN, _ *memBackend) {
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
		}, cdb: cdbRead16(0, 1), in: 512, want: sk(NotReady, 0x04, 0)},
		{name: "stopped", setup: func(t *testing.T, l *LUN, _ *memBackend) { mustGood(t, l, cdbStartStop(false, false), nil) },
			cdb: cdbRead16(0, 1), in: 512, want: sk(NotReady, 0x04, 0x02)},
	})
}

func TestVerify(t *testing.T) {
	setup := func(t *testing.T, l *LUN, _ *memBackend) {
		mustGood(t, l, cdbWrite16(10, 4), fill(4*512, 0x5A))
	}
	runCases(t, []cmdCase{
		{name: "bytchk 0", setup: setup, cdb: cdbVerify16(10, 4, 0), want: good()},
		{name: "bytchk 0 length 0", cdb: cdbVerify16(0, 0, 0), want: good()},
		{name: "10 bytchk 0", cdb: func() []byte { c := cdbRW10(OpVerify10, 0, 16, false); c[1] = 0; return c }(), want: good()},
		{name: "bytchk 0 medium error", be: func(m *memBackend) { m.readErrAt.Store(12 * 512) },
			cdb: cdbVerify16(10, 4, 0), want: sk(MediumError, 0x11, 0).withInfo(12)},
		{name: "bytchk 1 match", setup: setup, cdb: cdbVerify16(10, 4, 1), out: fill(4*512, 0x5A), want: good()},
		{name: "bytchk 1 miscompare", setup: setup, cdb: cdbVerify16(10, 4, 1),
			out: func() []byte { b := fill(4*512, 0x5A); b[1500] = 0; return b }(), want: sk(Miscompare, 0x1D, 0).withInfo(1500)},
		{name: "10 bytchk 1 miscompare", setup: setup,
			cdb: func() []byte { c := cdbRW10(OpVerify10, 10, 4, false); c[1] = 0x02; return c }(),
			out: fill(4*512, 0x5B), want: sk(Miscompare, 0x1D, 0).withInfo(0)},
		{name: "bytchk 1 short data-out", setup: setup, cdb: cdbVerify16(10, 4, 1), out: fill(512, 0x5A), want: badCDB(10, 7)},
		{name: "bytchk 1 beyond max transfer", cdb: cdbVerify16(0, 257, 1), want: badCDB(10, 7)},
		{name: "bytchk 3 match", setup: setup, cdb: cdbVerify16(10, 4, 3), out: fill(512, 0x5A), want: good()},
		{name: "bytchk 3 miscompare", setup: setup, cdb: cdbVerify16(10, 5, 3), out: fill(512, 0x5A),
			want: sk(Miscompare, 0x1D, 0).withInfo(4 * 512)},
		{name: "bytchk 2 reserved", cdb: cdbVerify16(0, 1, 2), want: badCDB(1, 2)},
		{name: "VRPROTECT", cdb: func() []byte { c := cdbVerify16(0, 1, 0); c[1] |= 0x20; return c }(), want: badCDB(1, 7)},
		{name: "out of range", cdb: cdbVerify16(testBlocks-1, 2, 0), want: sk(IllegalRequest, 0x21, 0)},
	})
}

func TestSynchronizeCache(t *testing.T) {
	flushed := func(t *testing.T, _ []byte, _ *LUN, m *memBackend) {
		if m.flushes.Load() != 1 {
			t.Fatalf("%d flushes", m.flushes.Load())
		}
	}
	runCases(t, []cmdCase{
		{name: "16", cdb: cdbSync16(0, 0), want: good(), check: flushed},
		{name: "10", cdb: func() []byte { c := make10(OpSynchronizeCache10); c[1] = 0x02; return c }(), want: good(), check: flushed},
		{name: "range", cdb: cdbSync16(testBlocks-1, 1), want: good(), check: flushed},
		{name: "out of range", cdb: cdbSync16(testBlocks-1, 2), want: sk(IllegalRequest, 0x21, 0)},
		{name: "flush fails", be: func(m *memBackend) { m.flushErr.Store(true) }, cdb: cdbSync16(0, 0), want: sk(MediumError, 0x0C, 0)},
	})
}

func TestWriteSame(t *testing.T) {
	dirty := func(t *testing.T, l *LUN, _ *memBackend) { mustGood(t, l, cdbWrite16(0, 64), fill(64*512, 0xEE)) }
	wantData := func(lba uint64, n uint32, b byte) func(*testing.T, []byte, *LUN, *memBackend) {
		return func(t *testing.T, _ []byte, l *LUN, _ *memBackend) {
			if d := readBack(t, l, lba, n); !bytes.Equal(d, fill(int(n)*512, b)) {
				t.Fatalf("range [%d,+%d) not all %#x", lba, n, b)
			}
		}
	}
	ws10 := func(lba uint32, n uint16, unmap bool) []byte {
		c := cdbRW10(OpWriteSame10, lba, n, false)
		if unmap {
			c[1] |= 0x08
		}
		return c
	}
	runCases(t, []cmdCase{
		{name: "pattern", setup: dirty, cdb: cdbWriteSame16(4, 600, false, false), out: fill(512, 0x11), want: good(),
			check: func(t *testing.T, d []byte, l *LUN, m *memBackend) {
				wantData(4, 600, 0x11)(t, d, l, m)
				wantData(0, 4, 0xEE)(t, d, l, m)
			}},
		{name: "10 pattern", cdb: ws10(7, 3, false), out: fill(512, 0x22), want: good(), check: wantData(7, 3, 0x22)},
		{name: "zero unmap discards", setup: dirty, cdb: cdbWriteSame16(0, 64, true, false), out: make([]byte, 512), want: good(),
			check: func(t *testing.T, d []byte, l *LUN, m *memBackend) {
				wantData(0, 64, 0)(t, d, l, m)
				if m.discards.Load() != 1 {
					t.Fatal("no discard")
				}
			}},
		{name: "zero without unmap writes zeroes", setup: dirty, cdb: ws10(0, 64, false), out: make([]byte, 512), want: good(),
			check: func(t *testing.T, d []byte, l *LUN, m *memBackend) {
				wantData(0, 64, 0)(t, d, l, m)
				if m.zeroes.Load() != 1 || m.discards.Load() != 0 {
					t.Fatal("not WriteZeroes")
				}
			}},
		{name: "unmap with data writes the data", cdb: cdbWriteSame16(0, 8, true, false), out: fill(512, 3), want: good(),
			check: wantData(0, 8, 3)},
		{name: "NDOB", setup: dirty, cdb: cdbWriteSame16(2, 5, false, true), want: good(), check: wantData(2, 5, 0)},
		{name: "zero blocks (WSNZ)", cdb: cdbWriteSame16(0, 0, false, false), out: fill(512, 1), want: badCDB(10, 7)},
		{name: "10 zero blocks", cdb: ws10(0, 0, false), out: fill(512, 1), want: badCDB(7, 7)},
		{name: "beyond max", cdb: cdbWriteSame16(0, 1025, false, false), out: fill(512, 1), want: badCDB(10, 7)},
		{name: "anchor", cdb: func() []byte { c := cdbWriteSame16(0, 1, false, false); c[1] |= 0x10; return c }(), out: fill(512, 1),
			want: badCDB(1, 4)},
		{name: "out of range", cdb: cdbWriteSame16(testBlocks-4, 8, false, false), out: fill(512, 1), want: sk(IllegalRequest, 0x21, 0)},
		{name: "write protected", cfg: func(c *LUNConfig) { c.ReadOnly = true }, cdb: cdbWriteSame16(0, 1, false, false),
			out: fill(512, 1), want: sk(DataProtect, 0x27, 0)},
		{name: "no data-out", cdb: cdbWriteSame16(0, 1, false, false), want: sk(IllegalRequest, 0x24, 0)},
		{name: "medium error", be: func(m *memBackend) { m.writeErrAt.Store(5 * 512) }, cdb: cdbWriteSame16(0, 8, false, false),
			out: fill(512, 1), want: sk(MediumError, 0x0C, 0).withInfo(5)},
	})
}

func TestUnmap(t *testing.T) {
	dirty := func(t *testing.T, l *LUN, _ *memBackend) { mustGood(t, l, cdbWrite16(0, 64), fill(64*512, 0xEE)) }
	p := unmapParams([2]uint64{0, 8}, [2]uint64{20, 4})
	runCases(t, []cmdCase{
		{name: "two ranges", setup: dirty, cdb: cdbUnmap(uint16(len(p))), out: p, want: good(),
			check: func(t *testing.T, _ []byte, l *LUN, m *memBackend) {
				d := readBack(t, l, 0, 64)
				for i := range 64 {
					zero := i < 8 || (i >= 20 && i < 24)
					if got := d[i*512] == 0; got != zero {
						t.Fatalf("block %d zero=%v", i, got)
					}
				}
				if m.discards.Load() != 2 {
					t.Fatalf("%d discards", m.discards.Load())
				}
			}},
		{name: "zero count descriptor", cdb: cdbUnmap(24), out: unmapParams([2]uint64{testBlocks, 0}), want: good()},
		{name: "parameter list length 0", cdb: cdbUnmap(0), want: good()},
		{name: "parameter list length 4", cdb: cdbUnmap(4), out: p[:4], want: sk(IllegalRequest, 0x1A, 0)},
		{name: "truncated data-out", cdb: cdbUnmap(40), out: p[:20], want: sk(IllegalRequest, 0x1A, 0)},
		{name: "descriptor length beyond list", cdb: cdbUnmap(24),
			out: func() []byte { b := unmapParams([2]uint64{0, 1}); b[3] = 32; return b }(), want: sk(IllegalRequest, 0x1A, 0)},
		{name: "too many descriptors", cdb: cdbUnmap(8 + 5*16),
			out: unmapParams([2]uint64{0, 1}, [2]uint64{1, 1}, [2]uint64{2, 1}, [2]uint64{3, 1}, [2]uint64{4, 1}), want: badParam(2, 7)},
		{name: "too many blocks", cdb: cdbUnmap(40), out: unmapParams([2]uint64{0, 1000}, [2]uint64{1000, 25}), want: badParam(32, 7)},
		{name: "out of range", cdb: cdbUnmap(24), out: unmapParams([2]uint64{testBlocks - 1, 2}), want: sk(IllegalRequest, 0x21, 0)},
		{name: "anchor", cdb: func() []byte { c := cdbUnmap(24); c[1] = 1; return c }(), out: unmapParams([2]uint64{0, 1}), want: badCDB(1, 0)},
		{name: "backend cannot discard", be: func(m *memBackend) { m.info.CanDiscard = false },
			cdb: cdbUnmap(24), out: unmapParams([2]uint64{0, 1}), want: sk(IllegalRequest, 0x20, 0)},
		{name: "read-only LUN has no UNMAP", cfg: func(c *LUNConfig) { c.ReadOnly = true },
			cdb: cdbUnmap(24), out: unmapParams([2]uint64{0, 1}), want: sk(IllegalRequest, 0x20, 0)},
	})
}

func TestCompareAndWrite(t *testing.T) {
	setup := func(t *testing.T, l *LUN, _ *memBackend) { mustGood(t, l, cdbWrite16(100, 2), fill(1024, 0xAA)) }
	payload := func(cmp, wr byte) []byte { return append(fill(1024, cmp), fill(1024, wr)...) }
	runCases(t, []cmdCase{
		{name: "match writes", setup: setup, cdb: cdbCAW(100, 2), out: payload(0xAA, 0xBB), want: good(),
			check: func(t *testing.T, _ []byte, l *LUN, _ *memBackend) {
				if !bytes.Equal(readBack(t, l, 100, 2), fill(1024, 0xBB)) {
					t.Fatal("not written")
				}
			}},
		{name: "miscompare", setup: setup, cdb: cdbCAW(100, 2),
			out:  func() []byte { p := payload(0xAA, 0xBB); p[777] = 1; return p }(),
			want: sk(Miscompare, 0x1D, 0).withInfo(777),
			check: func(t *testing.T, _ []byte, l *LUN, _ *memBackend) {
				if !bytes.Equal(readBack(t, l, 100, 2), fill(1024, 0xAA)) {
					t.Fatal("written despite miscompare")
				}
			}},
		{name: "zero blocks", cdb: cdbCAW(0, 0), want: good()},
		{name: "beyond max", cdb: cdbCAW(0, 9), out: make([]byte, 9*1024), want: badCDB(13, 7)},
		{name: "out of range", cdb: cdbCAW(testBlocks-1, 2), out: make([]byte, 2048), want: sk(IllegalRequest, 0x21, 0)},
		{name: "short data-out", setup: setup, cdb: cdbCAW(100, 2), out: fill(1024, 0xAA), want: badCDB(13, 7)},
		{name: "write protected", cfg: func(c *LUNConfig) { c.ReadOnly = true }, cdb: cdbCAW(0, 1), out: make([]byte, 1024),
			want: sk(DataProtect, 0x27, 0)},
		{name: "read error", be: func(m *memBackend) { m.readErrAt.Store(101 * 512) }, setup: setup, cdb: cdbCAW(100, 2),
			out: payload(0xAA, 0xBB), want: sk(MediumError, 0x11, 0).withInfo(101)},
		{name: "write error", be: func(m *memBackend) { m.writeErrAt.Store(101 * 512) }, cdb: cdbCAW(100, 2),
			out: payload(0, 0xBB), want: sk(MediumError, 0x0C, 0).withInfo(101)},
		{name: "WRPROTECT", cdb: func() []byte { c := cdbCAW(0, 1); c[1] = 0x20; return c }(), out: make([]byte, 1024), want: badCDB(1, 7)},
	})
}

func TestStartStopUnit(t *testing.T) {
	stop := func(t *testing.T, l *LUN, _ *memBackend) { mustGood(t, l, cdbStartStop(false, false), nil) }
	runCases(t, []cmdCase{
		{name: "stop flushes", cdb: cdbStartStop(false, false), want: good(),
			check: func(t *testing.T, _ []byte, l *LUN, m *memBackend) {
				if m.flushes.Load() != 1 {
					t.Fatal("no flush")
				}
				r, _ := do(l, nexA, cdbWrite16(0, 1), make([]byte, 512), 0)
				wantSense(t, r, NotReady, 0x04, 0x02)
				r, _ = do(l, nexA, cdbInquiry(false, 0, 96), nil, 96)
				wantGood(t, r)
			}},
		{name: "stop no flush", cdb: cdbStartStop(false, true), want: good(),
			check: func(t *testing.T, _ []byte, _ *LUN, m *memBackend) {
				if m.flushes.Load() != 0 {
					t.Fatal("flushed")
				}
			}},
		{name: "start", setup: stop, cdb: cdbStartStop(true, false), want: good(),
			check: func(t *testing.T, _ []byte, l *LUN, _ *memBackend) { mustGood(t, l, cdbTUR(), nil) }},
		{name: "power condition accepted", setup: stop, cdb: []byte{OpStartStopUnit, 0, 0, 0, 0x10, 0}, want: good()},
		{name: "reserved power condition", cdb: []byte{OpStartStopUnit, 0, 0, 0, 0x50, 0}, want: badCDB(4, 7)},
		{name: "LOEJ", cdb: []byte{OpStartStopUnit, 0, 0, 0, 0x02, 0}, want: badCDB(4, 1)},
		{name: "stop flush fails", be: func(m *memBackend) { m.flushErr.Store(true) }, cdb: cdbStartStop(false, false),
			want: sk(MediumError, 0x0C, 0)},
	})
}

func TestReportLUNsStandalone(t *testing.T) {
	runCases(t, []cmdCase{
		{name: "LUN 0", cdb: cdbReportLUNs(0, 64), in: 64, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if !bytes.Equal(d, []byte{0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) {
					t.Fatalf("% x", d)
				}
			}},
		{name: "well known only", cdb: cdbReportLUNs(1, 64), in: 64, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) { wantLen(t, d, 8) }},
		{name: "select report reserved", cdb: cdbReportLUNs(5, 64), want: badCDB(2, 7)},
		{name: "allocation length < 16", cdb: cdbReportLUNs(0, 15), want: badCDB(6, 7)},
	})
}

func TestReportSupportedOpcodes(t *testing.T) {
	countSupported := func(l *LUN) int {
		n := 0
		for i := range commands {
			if l.supports(&commands[i]) {
				n++
			}
		}
		return n
	}
	// Without ALUA, REPORT TARGET PORT GROUPS is not supported: one command fewer.
	nALUA := 0
	for i := range commands {
		if commands[i].flags&cmdALUA != 0 {
			nALUA++
		}
	}
	if nALUA != 1 {
		t.Fatalf("%d ALUA-only commands", nALUA)
	}
	nCmds := len(commands) - nALUA
	runCases(t, []cmdCase{
		{name: "all", cdb: cdbRSOC(false, 0, 0, 0, 4096), in: 4096, want: good(),
			check: func(t *testing.T, d []byte, l *LUN, _ *memBackend) {
				n := countSupported(l)
				if int(binary.BigEndian.Uint32(d)) != 8*n || len(d) != 4+8*n || n != nCmds {
					t.Fatalf("length %d for %d commands", binary.BigEndian.Uint32(d), n)
				}
				found := false
				for p := 4; p < len(d); p += 8 {
					if d[p] == OpRead16 && binary.BigEndian.Uint16(d[p+6:]) == 16 && d[p+5] == 0 {
						found = true
					}
					if d[p] == OpServiceActionIn16 && (d[p+5] != 1 || d[p+3] != SAReadCapacity16 && d[p+3] != SAGetLBAStatus) {
						t.Fatalf("SERVICE ACTION IN(16) descriptor % x", d[p:p+8])
					}
				}
				if !found {
					t.Fatal("READ(16) missing")
				}
			}},
		{name: "all, no discard", be: func(m *memBackend) { m.info.CanDiscard = false }, cdb: cdbRSOC(false, 0, 0, 0, 4096), in: 4096,
			want: good(), check: func(t *testing.T, d []byte, l *LUN, _ *memBackend) {
				for p := 4; p < len(d); p += 8 {
					if d[p] == OpUnmap {
						t.Fatal("UNMAP listed")
					}
				}
				if len(d) != 4+8*(nCmds-1) {
					t.Fatalf("length %d", len(d))
				}
			}},
		{name: "all with timeouts", cdb: cdbRSOC(true, 0, 0, 0, 8192), in: 8192, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if len(d) != 4+20*nCmds || d[4+5]&0x02 == 0 || binary.BigEndian.Uint16(d[4+8:]) != 0x0A {
					t.Fatalf("length %d, first % x", len(d), d[4:24])
				}
			}},
		{name: "all truncated", cdb: cdbRSOC(false, 0, 0, 0, 10), in: 4096, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if len(d) != 10 || int(binary.BigEndian.Uint32(d)) != 8*nCmds {
					t.Fatalf("% x", d)
				}
			}},
		{name: "one", cdb: cdbRSOC(false, 1, OpRead16, 0, 64), in: 64, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if d[1] != 3 || binary.BigEndian.Uint16(d[2:]) != 16 || !bytes.Equal(d[4:], lookupCmd(OpRead16, 0).usage) {
					t.Fatalf("% x", d)
				}
			}},
		// GET LBA STATUS evaluates byte 14, REPORT TYPE (sg_get_lba_status --report-type).
		{name: "one with service action: GET LBA STATUS", cdb: cdbRSOC(false, 2, OpServiceActionIn16, SAGetLBAStatus, 64), in: 64,
			want: good(), check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if d[1] != 3 || binary.BigEndian.Uint16(d[2:]) != 16 || len(d) != 4+16 || d[4] != OpServiceActionIn16 || d[4+1] != 0x1F || d[4+14] != 0xFF {
					t.Fatalf("% x", d)
				}
			}},
		{name: "one with timeouts", cdb: cdbRSOC(true, 1, OpTestUnitReady, 0, 64), in: 64, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if d[1] != 0x83 || len(d) != 4+6+12 {
					t.Fatalf("% x", d)
				}
			}},
		{name: "one unsupported", cdb: cdbRSOC(false, 1, 0x1D, 0, 64), in: 64, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if !bytes.Equal(d, []byte{0, 1, 0, 0}) {
					t.Fatalf("% x", d)
				}
			}},
		{name: "one, opcode with service actions", cdb: cdbRSOC(false, 1, OpServiceActionIn16, 0, 64), want: badCDB(2, 2)},
		{name: "one, nonzero SA", cdb: cdbRSOC(false, 1, OpRead16, 1, 64), want: badCDB(4, 7)},
		{name: "with SA", cdb: cdbRSOC(false, 2, OpServiceActionIn16, SAReadCapacity16, 64), in: 64, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if d[1] != 3 || d[4] != OpServiceActionIn16 {
					t.Fatalf("% x", d)
				}
			}},
		{name: "with SA, unsupported SA", cdb: cdbRSOC(false, 2, OpServiceActionIn16, 0x13, 64), in: 64, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if d[1] != 1 {
					t.Fatalf("% x", d)
				}
			}},
		{name: "with SA, opcode without", cdb: cdbRSOC(false, 2, OpRead16, 0, 64), want: badCDB(2, 2)},
		{name: "option 3", cdb: cdbRSOC(false, 3, OpPersistentResvOut, PROutPreempt, 64), in: 64, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if d[1] != 3 || d[4] != OpPersistentResvOut {
					t.Fatalf("% x", d)
				}
			}},
		{name: "reserved option", cdb: cdbRSOC(false, 5, 0, 0, 64), want: badCDB(2, 2)},
		{name: "maintenance in, unknown SA", cdb: func() []byte { c := cdbRSOC(false, 0, 0, 0, 64); c[1] = 0x05; return c }(),
			want: badCDB(1, 4)},
		{name: "maintenance in, RTPG without ALUA", cdb: func() []byte { c := cdbRSOC(false, 0, 0, 0, 64); c[1] = 0x0A; return c }(),
			want: badCDB(1, 4)},
	})
}

// TestCommandTableConsistent checks that every listed command parses (no invalid opcode) and
// that usage data lengths are the CDB lengths.
func TestCommandTableConsistent(t *testing.T) {
	l, _ := newTestLUN(t, testConfig())
	for i := range commands {
		c := &commands[i]
		if len(c.usage) != cdbLen(c.op) || c.usage[0] != c.op {
			t.Fatalf("%s: usage data % x", c.name, c.usage)
		}
		cdb := make([]byte, len(c.usage))
		cdb[0] = c.op
		if c.hasSA {
			cdb[1] = c.sa
		}
		_, err := l.ParseCDB(cdb)
		var s Sense
		if err != nil {
			s = err.(Sense)
		}
		if s.Match(IllegalRequest, 0x20, 0) {
			t.Fatalf("%s: invalid opcode", c.name)
		}
		if i > 0 && (commands[i-1].op > c.op || commands[i-1].op == c.op && commands[i-1].sa >= c.sa) {
			t.Fatalf("%s: table not sorted", c.name)
		}
	}
}

func TestParseCDB(t *testing.T) {
	l, _ := newTestLUN(t, testConfig())
	cases := []struct {
		cdb    []byte
		dir    Direction
		length uint32
		name   string
	}{
		{cdbRead16(5, 8), DirIn, 4096, "READ(16)"},
		{cdbRW10(OpWrite10, 5, 8, true), DirOut, 4096, "WRITE(10)"},
		{cdbRW6(OpRead6, 0, 0), DirIn, 256 * 512, "READ(6)"},
		{cdbRead16(5, 0), DirNone, 0, "READ(16)"},
		{cdbTUR(), DirNone, 0, "TEST UNIT READY"},
		{cdbInquiry(false, 0, 36), DirIn, 36, "INQUIRY"},
		{cdbCAW(0, 2), DirOut, 2048, "COMPARE AND WRITE"},
		{cdbWriteSame16(0, 10, false, false), DirOut, 512, "WRITE SAME(16)"},
		{cdbWriteSame16(0, 10, false, true), DirNone, 0, "WRITE SAME(16)"},
		{cdbVerify16(0, 4, 0), DirNone, 0, "VERIFY(16)"},
		{cdbVerify16(0, 4, 1), DirOut, 2048, "VERIFY(16)"},
		{cdbVerify16(0, 4, 3), DirOut, 512, "VERIFY(16)"},
		{cdbUnmap(40), DirOut, 40, "UNMAP"},
		{cdbPROut(PROutRegister, 0), DirOut, 24, "PERSISTENT RESERVE OUT (REGISTER)"},
		{cdbPRIn(PRInReadKeys, 100), DirIn, 100, "PERSISTENT RESERVE IN (READ KEYS)"},
		{cdbModeSelect10(30), DirOut, 30, "MODE SELECT(10)"},
		{cdbReadCap16(32), DirIn, 32, "READ CAPACITY(16)"},
		{cdbReportLUNs(0, 100), DirIn, 100, "REPORT LUNS"},
	}
	for _, c := range cases {
		i, err := l.ParseCDB(c.cdb)
		if err != nil || i.Dir != c.dir || i.Length != c.length || i.Name() != c.name {
			t.Errorf("% x: %+v %v; want %v %d %s", c.cdb, i, err, c.dir, c.length, c.name)
		}
	}
	i, err := l.ParseCDB(cdbRead16(testBlocks, 1))
	var s Sense
	if !errors.As(err, &s) || !s.Match(IllegalRequest, 0x21, 0) || i.Dir != DirNone || i.Name() != "READ(16)" {
		t.Fatalf("%+v %v", i, err)
	}
	huge := cdbPROut(PROutRegister, 0)
	binary.BigEndian.PutUint32(huge[5:], 1<<31)
	if _, err := l.ParseCDB(huge); !errors.As(err, &s) || !s.Match(IllegalRequest, 0x1A, 0) {
		t.Fatalf("PR OUT with a 2 GiB parameter list: %v", err)
	}
	if l.MaxDataOutBytes() != 256*512 {
		t.Fatal(l.MaxDataOutBytes())
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = l.ParseCDB(c16) }); n != 0 {
		t.Fatalf("ParseCDB allocates %v", n)
	}
}

var c16 = cdbRead16(1, 8)
