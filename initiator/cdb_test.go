package initiator

import (
	"bytes"
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/srpd/srpd/scsi"
)

// The CDBs and UNMAP parameter lists the initiator sends, byte for byte, against layouts
// written out by hand from SBC-4 (READ(16) 5.14, WRITE(16) 5.46, SYNCHRONIZE CACHE(16) 5.28,
// WRITE SAME(16) 5.50, UNMAP 5.32, READ CAPACITY(10)/(16) 5.20/5.21) and SPC-4 (INQUIRY 6.6,
// MODE SENSE(10) 6.14, REPORT LUNS 6.33). They held for the hand-encoded CDBs the initiator
// used to build and hold for the scsi package's encoders that replaced them.

// cdbHex decodes hex with spaces between fields.
func cdbHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return b
}

// TestFillCDB: the READ(16)/WRITE(16) of each command of a block request (Session.fill, the
// per-I/O path): LBA from the job's start and the chunk's offset, block count cut to the
// channel's capacity and the LUN's maximum transfer length, FUA only on writes that ask for it.
func TestFillCDB(t *testing.T) {
	for _, tc := range []struct {
		name      string
		bs        int
		lba       uint64
		write     bool
		fua, zero bool
		maxBlocks int
		capacity  int
		off, n    int
		wantN     int
		//       op flags LBA (8 bytes)       blocks (4)  group control
		want string
	}{
		{name: "read", bs: 512, lba: 0, off: 0, n: 4096, capacity: 256 << 10, wantN: 4096,
			want: "88 00 0000000000000000 00000008 00 00"},
		{name: "read at a chunk offset", bs: 512, lba: 0x0123456789ab, off: 1024, n: 512, capacity: 256 << 10, wantN: 512,
			want: "88 00 00000123456789ad 00000001 00 00"},
		{name: "read cut to the channel", bs: 512, lba: 5, off: 0, n: 1 << 20, capacity: 256 << 10, wantN: 256 << 10,
			want: "88 00 0000000000000005 00000200 00 00"},
		{name: "read cut to max transfer", bs: 512, lba: 5, off: 0, n: 1 << 20, capacity: 256 << 10, maxBlocks: 100, wantN: 100 * 512,
			want: "88 00 0000000000000005 00000064 00 00"},
		{name: "read ignores fua", bs: 512, lba: 7, fua: true, off: 0, n: 512, capacity: 4096, wantN: 512,
			want: "88 00 0000000000000007 00000001 00 00"},
		{name: "write fua", bs: 512, lba: 1000, write: true, fua: true, off: 0, n: 8192, capacity: 256 << 10, wantN: 8192,
			want: "8a 08 00000000000003e8 00000010 00 00"},
		{name: "write", bs: 512, lba: 1000, write: true, off: 8192, n: 8192, capacity: 256 << 10, wantN: 8192,
			want: "8a 00 00000000000003f8 00000010 00 00"},
		{name: "write zeroes past 2^32", bs: 512, lba: 1 << 32, write: true, zero: true, off: 0, n: 512, capacity: 4096, wantN: 512,
			want: "8a 00 0000000100000000 00000001 00 00"},
		{name: "4K blocks, top LBA, partial block cut", bs: 4096, lba: 0xfffffffffffffff0, write: true, fua: true,
			off: 4096, n: 3*4096 + 100, capacity: 1 << 20, wantN: 3 * 4096,
			want: "8a 08 fffffffffffffff1 00000003 00 00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			buf := make([]byte, tc.off+tc.n)
			j := &job{op: "X", rw: true, lba: tc.lba, bs: tc.bs, maxBlocks: tc.maxBlocks, total: len(buf),
				write: tc.write, fua: tc.fua, zero: tc.zero}
			if !tc.zero {
				j.buf = buf
			}
			c := &channel{}
			c.capBytes.Store(int64(tc.capacity))
			n, err := new(Session).fill(j, c, &chunk{off: tc.off, n: tc.n})
			if err != nil {
				t.Fatal(err)
			}
			sp := &j.spec
			if got, want := sp.cdb[:sp.cdbLen], cdbHex(t, tc.want); n != tc.wantN || !bytes.Equal(got, want) {
				t.Fatalf("%d bytes, CDB % x; want %d bytes, % x", n, got, tc.wantN, want)
			}
			wantDir := dirIn
			if tc.write {
				wantDir = dirOut
			}
			if sp.dir != wantDir || sp.n != n || sp.zero != tc.zero || sp.lba != tc.lba+uint64(tc.off/tc.bs) ||
				(!tc.zero && (len(sp.buf) != n || &sp.buf[0] != &buf[tc.off])) {
				t.Fatalf("spec %+v", sp)
			}
		})
	}
}

// recordCmds wraps cmd to append a copy of each CDB to *cdbs.
func recordCmds(cdbs *[][]byte, cmd lunCmd) lunCmd {
	return func(cdb, in []byte) (int, error) {
		*cdbs = append(*cdbs, append([]byte(nil), cdb...))
		return cmd(cdb, in)
	}
}

func wantCDBs(t *testing.T, got [][]byte, want []string) {
	t.Helper()
	for i := range max(len(got), len(want)) {
		var g, w []byte
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = cdbHex(t, want[i])
		}
		if !bytes.Equal(g, w) {
			t.Errorf("command %d: % x; want % x", i, g, w)
		}
	}
}

// TestDiscoveryCDBs: the commands of REPORT LUNS and probeLUN, in order, against a scsi LUN;
// then against one that refuses READ CAPACITY(16), so that READ CAPACITY(10) follows.
func TestDiscoveryCDBs(t *testing.T) {
	l := newSeedLUN(t, scsi.LUNConfig{BlockSize: 512, Serial: "cdb"}, 8<<20)
	var cdbs [][]byte
	if _, err := reportLUNs(recordCmds(&cdbs, scsiLUNCmd(l))); err != nil {
		t.Fatal(err)
	}
	//          op reserved select reserved alloc (4)  reserved control
	wantCDBs(t, cdbs, []string{"a0 00 00 000000 00000208 00 00"})

	cdbs = nil
	var info LUNInfo
	if err := probeLUN(&info, recordCmds(&cdbs, scsiLUNCmd(l))); err != nil {
		t.Fatal(err)
	}
	if !info.Provisioning {
		t.Fatal("the LUN is not thin: VPD 0xB2 is not asked for")
	}
	inquiry := []string{
		// op evpd page alloc(2) control
		"12 00 00 0060 00", // standard INQUIRY, 96 bytes
		"12 01 00 00ff 00", // VPD 0x00 supported pages
		"12 01 80 00ff 00", // VPD 0x80 unit serial number
		"12 01 83 0400 00", // VPD 0x83 device identification
	}
	// op    sa LBA (8)            alloc (4) pmi control
	rc16 := "9e 10 0000000000000000 00000020 00 00"
	vpdB0 := "12 01 b0 0040 00" // VPD 0xB0 block limits
	vpdB2 := "12 01 b2 0040 00" // VPD 0xB2 logical block provisioning
	// op  dbd pc|page subpage reserved alloc(2) control: caching page, current values
	modeSense := "5a 08 08 00 000000 0040 00"
	wantCDBs(t, cdbs, append(append([]string(nil), inquiry...), rc16, vpdB0, vpdB2, modeSense))

	cdbs = nil
	info = LUNInfo{}
	refuseRC16 := func(cdb, in []byte) (int, error) {
		if cdb[0] == scsi.OpServiceActionIn16 {
			return 0, &SCSIError{Op: "READ CAPACITY(16)", Status: scsi.StatusCheckCondition,
				Sense: scsi.Sense{Key: scsi.IllegalRequest, ASC: 0x20}}
		}
		return scsiLUNCmd(l)(cdb, in)
	}
	if err := probeLUN(&info, recordCmds(&cdbs, refuseRC16)); err != nil {
		t.Fatal(err)
	}
	// op  reserved LBA (4) reserved pmi control. READ CAPACITY(10) has no LBPME: no VPD 0xB2.
	rc10 := "25 00 00000000 0000 00 00"
	wantCDBs(t, cdbs, append(append([]string(nil), inquiry...), rc16, rc10, vpdB0, modeSense))
}

// TestBlockCommandCDBs: Flush, Discard and WriteZeroes as the target receives them, CDBs and
// data-out, split by the LUN's MAXIMUM UNMAP LBA COUNT and MAXIMUM WRITE SAME LENGTH.
func TestBlockCommandCDBs(t *testing.T) {
	e := newMemEnv(t, pipeNone(), tgtConfig{maxUnmapLBAs: 1000, maxWriteSame: 1000})
	s := e.dial(e.config())
	l := s.LUNs()[0]
	if i := l.Info(); !i.UnmapSupported || !i.WriteSameUnmap || !i.ZeroesAfterUnmap || i.MaxUnmapLBAs != 1000 || i.MaxWriteSame != 1000 {
		t.Fatalf("the test LUN does not offer what the test needs: %+v", i)
	}
	type sent struct{ cdb, out []byte }
	var mu sync.Mutex
	var got []sent
	record := func() []sent {
		mu.Lock()
		defer mu.Unlock()
		r := got
		got = nil
		return r
	}
	e.tgt.mu.Lock()
	e.tgt.observe = func(cdb, out []byte) {
		mu.Lock()
		got = append(got, sent{append([]byte(nil), cdb...), append([]byte(nil), out...)})
		mu.Unlock()
	}
	e.tgt.mu.Unlock()
	check := func(what string, want ...sent) {
		t.Helper()
		g := record()
		if len(g) != len(want) {
			t.Errorf("%s: %d commands; want %d", what, len(g), len(want))
		}
		for i := range min(len(g), len(want)) {
			if !bytes.Equal(g[i].cdb, want[i].cdb) || !bytes.Equal(g[i].out, want[i].out) {
				t.Errorf("%s: command %d: CDB % x data-out % x; want % x, % x", what, i, g[i].cdb, g[i].out, want[i].cdb, want[i].out)
			}
		}
	}
	ctx := ctxT(t, 10*time.Second)

	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// op flags(IMMED 0) LBA (8) blocks (4): 0 is through the last LBA, group control
	check("Flush", sent{cdbHex(t, "91 00 0000000000000000 00000000 00 00"), nil})

	// 2048 blocks from LBA 8: 1000 + 1000 + 48 blocks, one descriptor each.
	if err := l.Discard(ctx, 8*512, 2048*512); err != nil {
		t.Fatal(err)
	}
	// UNMAP CDB: op anchor reserved(4) group param-list-length(2) control, then the zeroes that
	// pad it to SRP_CMD's 16-byte CDB field. Parameter list: UNMAP DATA LENGTH (2) = 22, BLOCK DESCRIPTOR DATA LENGTH (2) = 16,
	// reserved (4); descriptor: LBA (8), blocks (4), reserved (4).
	unmapCDB := cdbHex(t, "42 00 00000000 00 0018 00  000000000000")
	check("Discard",
		sent{unmapCDB, cdbHex(t, "0016 0010 00000000  0000000000000008 000003e8 00000000")},
		sent{unmapCDB, cdbHex(t, "0016 0010 00000000  00000000000003f0 000003e8 00000000")},
		sent{unmapCDB, cdbHex(t, "0016 0010 00000000  00000000000007d8 00000030 00000000")})

	// WRITE SAME(16) of one zero block: with UNMAP (the LUN reads unmapped blocks as zeroes)
	// unless noUnmap, 1000 + 48 blocks from LBA 3.
	zero := make([]byte, 512)
	if err := l.WriteZeroes(ctx, 3*512, 1048*512, false); err != nil {
		t.Fatal(err)
	}
	// op flags(UNMAP 0x08) LBA (8) blocks (4) group control
	check("WriteZeroes",
		sent{cdbHex(t, "93 08 0000000000000003 000003e8 00 00"), zero},
		sent{cdbHex(t, "93 08 00000000000003eb 00000030 00 00"), zero})
	if err := l.WriteZeroes(ctx, 0x10000*512, 512, true); err != nil {
		t.Fatal(err)
	}
	check("WriteZeroes noUnmap", sent{cdbHex(t, "93 00 0000000000010000 00000001 00 00"), zero})
}
