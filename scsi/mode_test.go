package scsi

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func TestModeSense(t *testing.T) {
	runCases(t, []cmdCase{
		{name: "6 caching with block descriptor", cdb: cdbModeSense6(false, 0, 0x08, 0, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				wantLen(t, d, 4+8+20)
				if d[0] != byte(len(d)-1) || d[2] != 0x10 || d[3] != 8 {
					t.Fatalf("header % x", d[:4])
				}
				if binary.BigEndian.Uint32(d[4:]) != testBlocks || d[10] != 0x02 || d[11] != 0 {
					t.Fatalf("block descriptor % x", d[4:12])
				}
				if d[12] != 0x08 || d[13] != 0x12 || d[14] != 0x04 {
					t.Fatalf("caching page % x", d[12:])
				}
			}},
		{name: "6 DBD", cdb: cdbModeSense6(true, 0, 0x08, 0, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if len(d) != 24 || d[3] != 0 || d[4] != 0x08 {
					t.Fatalf("% x", d)
				}
			}},
		{name: "6 write cache disabled", cfg: func(c *LUNConfig) { c.DisableWriteCache = true },
			cdb: cdbModeSense6(true, 0, 0x08, 0, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if d[6]&0x04 != 0 {
					t.Fatalf("WCE set: % x", d)
				}
			}},
		{name: "6 write protected", cfg: func(c *LUNConfig) { c.ReadOnly = true }, cdb: cdbModeSense6(true, 0, 0x08, 0, 255),
			in: 255, want: good(), check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if d[2] != 0x90 {
					t.Fatalf("device-specific parameter %#x", d[2])
				}
			}},
		{name: "6 control", cdb: cdbModeSense6(true, 0, 0x0A, 0, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if !bytes.Equal(d[4:], []byte{0x0A, 0x0A, 0, 0x10, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0}) {
					t.Fatalf("% x", d)
				}
			}},
		{name: "6 informational exceptions", cdb: cdbModeSense6(true, 0, 0x1C, 0, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if !bytes.Equal(d[4:], []byte{0x1C, 0x0A, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0}) {
					t.Fatalf("% x", d)
				}
			}},
		{name: "6 all pages", cdb: cdbModeSense6(true, 0, 0x3F, 0, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if len(d) != 4+12+20+12+12 || d[4] != 0x01 || d[16] != 0x08 || d[36] != 0x0A || d[48] != 0x1C {
					t.Fatalf("% x", d)
				}
			}},
		{name: "6 all pages and subpages", cdb: cdbModeSense6(true, 0, 0x3F, 0xFF, 255), in: 255, want: good()},
		{name: "6 changeable", cdb: cdbModeSense6(true, 1, 0x3F, 0, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if d[6] != 0 || d[18] != 0x04 || d[38] != 0x04 || d[39] != 0 || d[50] != 0 {
					t.Fatalf("% x", d)
				}
			}},
		{name: "6 default", setup: func(t *testing.T, l *LUN, _ *memBackend) { l.wce.Store(false) },
			cdb: cdbModeSense6(true, 2, 0x08, 0, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if d[6] != 0x04 {
					t.Fatalf("% x", d)
				}
			}},
		{name: "6 allocation length", cdb: cdbModeSense6(false, 0, 0x3F, 0, 10), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if len(d) != 10 || d[0] != 4+8+56-1 {
					t.Fatalf("% x", d)
				}
			}},
		{name: "10 long LBA", cdb: cdbModeSense10(false, true, 0, 0x08, 0, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				wantLen(t, d, 8+16+20)
				if binary.BigEndian.Uint16(d) != uint16(len(d)-2) || d[3] != 0x10 || d[4] != 1 || binary.BigEndian.Uint16(d[6:]) != 16 {
					t.Fatalf("header % x", d[:8])
				}
				if binary.BigEndian.Uint64(d[8:]) != testBlocks || binary.BigEndian.Uint32(d[20:]) != 512 || d[24] != 0x08 {
					t.Fatalf("% x", d)
				}
			}},
		{name: "10 short descriptor", cdb: cdbModeSense10(false, false, 0, 0x0A, 0, 255), in: 255, want: good(),
			check: func(t *testing.T, d []byte, _ *LUN, _ *memBackend) {
				if len(d) != 8+8+12 || binary.BigEndian.Uint16(d[6:]) != 8 || d[4] != 0 {
					t.Fatalf("% x", d)
				}
			}},
		{name: "saved values", cdb: cdbModeSense6(false, 3, 0x08, 0, 255), want: sk(IllegalRequest, 0x39, 0)},
		{name: "unsupported page", cdb: cdbModeSense6(false, 0, 0x19, 0, 255), want: badCDB(2, 5)},
		{name: "10 unsupported page", cdb: cdbModeSense10(false, false, 0, 0x02, 0, 255), want: badCDB(2, 5)},
		{name: "unsupported subpage", cdb: cdbModeSense6(false, 0, 0x0A, 1, 255), want: badCDB(3, 7)},
		{name: "all pages, bad subpage", cdb: cdbModeSense10(false, false, 0, 0x3F, 1, 255), want: badCDB(3, 7)},
	})
}

// modeSelectCaching builds a MODE SELECT(6) parameter list with the caching page.
func modeSelectCaching(wce bool, blockDesc bool) []byte {
	p := []byte{0, 0, 0, 0}
	if blockDesc {
		p[3] = 8
		p = append(p, 0, 0, 0, 0, 0, 0, 0x02, 0x00) // 0 blocks = no change, 512 bytes
	}
	pg := make([]byte, 20)
	pg[0], pg[1] = 0x08, 0x12
	if wce {
		pg[2] = 0x04
	}
	return append(p, pg...)
}

func modeSelectControl10(dsense bool) []byte {
	p := make([]byte, 8)
	pg := []byte{0x0A, 0x0A, 0, 0x10, 0, 0, 0, 0, 0xFF, 0xFF, 0, 0}
	if dsense {
		pg[2] = 0x04
	}
	return append(p, pg...)
}

func TestModeSelect(t *testing.T) {
	wceOff := modeSelectCaching(false, true)
	runCases(t, []cmdCase{
		{name: "6 WCE off", cdb: cdbModeSelect6(uint8(len(wceOff))), out: wceOff, want: good(),
			check: func(t *testing.T, _ []byte, l *LUN, m *memBackend) {
				if l.WriteCacheEnabled() {
					t.Fatal("WCE still on")
				}
				if m.flushes.Load() != 1 {
					t.Fatal("turning the cache off did not flush")
				}
				// the other nexus is told, the issuer is not
				r, _ := do(l, nexB, cdbTUR(), nil, 0)
				wantSense(t, r, UnitAttention, 0x2A, 0x01)
				mustGood(t, l, cdbTUR(), nil)
				r, d := do(l, nexA, cdbModeSense6(true, 0, 0x08, 0, 255), nil, 255)
				wantGood(t, r)
				if d[6]&0x04 != 0 {
					t.Fatal("MODE SENSE still shows WCE")
				}
			}},
		{name: "6 WCE on again is no change", cdb: cdbModeSelect6(24), out: modeSelectCaching(true, false), want: good(),
			check: func(t *testing.T, _ []byte, l *LUN, _ *memBackend) {
				if !l.WriteCacheEnabled() {
					t.Fatal("WCE off")
				}
				r, _ := do(l, nexB, cdbTUR(), nil, 0)
				wantGood(t, r)
			}},
		{name: "10 D_SENSE", cdb: cdbModeSelect10(20), out: modeSelectControl10(true), want: good(),
			check: func(t *testing.T, _ []byte, l *LUN, _ *memBackend) {
				cmd := &Command{CDB: cdbRead16(testBlocks, 1), Nexus: nexA, Sense: make([]byte, MaxSenseLen)}
				r := l.Execute(t.Context(), cmd)
				if r.SenseLen != 8 || cmd.Sense[0] != 0x72 || cmd.Sense[1] != 5 || cmd.Sense[2] != 0x21 {
					t.Fatalf("% x", cmd.Sense[:r.SenseLen])
				}
				cmd.CDB = cdbRead16(0, 300)
				r = l.Execute(t.Context(), cmd)
				if r.SenseLen != 16 || cmd.Sense[8] != 0x02 || cmd.Sense[12] != 0xCF || cmd.Sense[14] != 10 {
					t.Fatalf("% x", cmd.Sense[:r.SenseLen])
				}
				s, err := ParseSense(cmd.Sense[:r.SenseLen])
				if err != nil || s != r.Sense {
					t.Fatalf("%v %v", s, err)
				}
			}},
		{name: "parameter list length 0", cdb: cdbModeSelect6(0), want: good()},
		{name: "SP", cdb: []byte{OpModeSelect6, 0x11, 0, 0, 24, 0}, out: modeSelectCaching(true, false), want: badCDB(1, 0)},
		{name: "PF clear", cdb: []byte{OpModeSelect6, 0x00, 0, 0, 24, 0}, out: modeSelectCaching(true, false), want: badCDB(1, 4)},
		{name: "header truncated", cdb: cdbModeSelect6(3), out: []byte{0, 0, 0}, want: sk(IllegalRequest, 0x1A, 0)},
		{name: "data-out shorter than list", cdb: cdbModeSelect6(32), out: wceOff[:20], want: sk(IllegalRequest, 0x1A, 0)},
		{name: "page truncated", cdb: cdbModeSelect6(20), out: modeSelectCaching(false, false)[:20], want: sk(IllegalRequest, 0x1A, 0)},
		{name: "page header truncated", cdb: cdbModeSelect6(5), out: modeSelectCaching(false, false)[:5], want: sk(IllegalRequest, 0x1A, 0)},
		{name: "bad block descriptor length", cdb: cdbModeSelect6(8),
			out: []byte{0, 0, 0, 4, 0, 0, 0, 0}, want: badParam(3, 7)},
		{name: "10 bad block descriptor length", cdb: cdbModeSelect10(16),
			out: []byte{0, 0, 0, 0, 1, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0}, want: badParam(6, 7)},
		{name: "block length change", cdb: cdbModeSelect6(12),
			out: []byte{0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0x10, 0}, want: badParam(9, 7)},
		{name: "block count change", cdb: cdbModeSelect6(12),
			out: []byte{0, 0, 0, 8, 0, 0, 0, 5, 0, 0, 0x02, 0}, want: badParam(4, 7)},
		{name: "block count same", cdb: cdbModeSelect6(12),
			out: []byte{0, 0, 0, 8, 0, 0, 0x08, 0, 0, 0, 0x02, 0}, want: good()},
		{name: "unchangeable bit", cdb: cdbModeSelect6(24),
			out: func() []byte { p := modeSelectCaching(true, false); p[4+2] |= 0x01; return p }(), want: badParam(6, 0)},
		{name: "unchangeable control bit", cdb: cdbModeSelect10(20),
			out: func() []byte { p := modeSelectControl10(false); p[8+3] = 0x00; return p }(), want: badParam(11, 4)},
		{name: "page length", cdb: cdbModeSelect6(24),
			out: func() []byte { p := modeSelectCaching(true, false); p[5] = 0x11; return p }(), want: badParam(5, 7)},
		{name: "unknown page", cdb: cdbModeSelect6(24),
			out: func() []byte { p := modeSelectCaching(true, false); p[4] = 0x19; return p }(), want: badParam(4, 5)},
		{name: "subpage format", cdb: cdbModeSelect6(24),
			out: func() []byte { p := modeSelectCaching(true, false); p[4] |= 0x40; return p }(), want: badParam(4, 6)},
		{name: "nothing applied on error", cdb: cdbModeSelect6(24 + 12),
			out:  append(modeSelectCaching(false, false), 0x1C, 0x0A, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0),
			want: badParam(24+2, 3),
			check: func(t *testing.T, _ []byte, l *LUN, _ *memBackend) {
				if !l.WriteCacheEnabled() {
					t.Fatal("WCE changed by a failed MODE SELECT")
				}
			}},
	})
}
