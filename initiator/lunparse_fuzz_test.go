package initiator

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/srpd/srpd/internal/fuzzbound"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/scsi/backend"
	"github.com/srpd/srpd/srp"
)

// A hostile target's answers to discovery, for probeLUN and reportLUNs: a script of one entry
// per command, each a control byte, a big-endian 16-bit length and that many bytes of data-in
// (fewer when the script ends; commands past its end get GOOD with no data). Control bits 0-1:
// 0 GOOD with the data, 1 CHECK CONDITION ILLEGAL REQUEST, 2 a transport failure, 3 GOOD with
// no data. Bit 2: the target says it transferred the whole buffer (a residual of 0) whatever
// it wrote; bit 3: the bytes it did not write are 0xFF rather than zero.
type scriptTarget struct {
	b    []byte
	cmds int
}

const (
	scriptGood      = 0
	scriptIllegal   = 1
	scriptTransport = 2
	scriptEmpty     = 3
	scriptWholeBuf  = 4
	scriptFillFF    = 8
)

var errScriptTransport = fmt.Errorf("script: %w", ErrTransport)

func (s *scriptTarget) cmd(cdb, in []byte) (int, error) {
	s.cmds++
	if len(s.b) < 3 {
		s.b = nil
		return 0, nil
	}
	c, l := s.b[0], int(binary.BigEndian.Uint16(s.b[1:]))
	s.b = s.b[3:]
	data := s.b[:min(l, len(s.b))]
	s.b = s.b[len(data):]
	switch c & 3 {
	case scriptIllegal:
		return 0, &SCSIError{Op: "script", Status: scsi.StatusCheckCondition, Sense: scsi.Sense{Key: scsi.IllegalRequest, ASC: 0x24}}
	case scriptTransport:
		return 0, errScriptTransport
	case scriptEmpty:
		return 0, nil
	}
	n := copy(in, data)
	if c&scriptFillFF != 0 {
		for i := n; i < len(in); i++ {
			in[i] = 0xFF
		}
	}
	if c&scriptWholeBuf != 0 {
		n = len(in)
	}
	return n, nil
}

// scriptEntry is one entry of a script.
func scriptEntry(c byte, data []byte) []byte {
	return append([]byte{c, byte(len(data) >> 8), byte(len(data))}, data...)
}

// recordScript runs cmd (a real target's answers) and records them as a script.
func recordScript(script *[]byte, cmd lunCmd) lunCmd {
	return func(cdb, in []byte) (int, error) {
		n, err := cmd(cdb, in)
		switch {
		case errors.Is(err, ErrIllegalRequest):
			*script = append(*script, scriptEntry(scriptIllegal, nil)...)
		case err != nil:
			*script = append(*script, scriptEntry(scriptTransport, nil)...)
		default:
			*script = append(*script, scriptEntry(scriptGood, in[:n])...)
		}
		return n, err
	}
}

// scsiLUNCmd runs discovery commands on a scsi.LUN, as the test target does.
func scsiLUNCmd(l *scsi.LUN) lunCmd {
	return func(cdb, in []byte) (int, error) {
		cmd := &scsi.Command{CDB: cdb, DataIn: in, Sense: make([]byte, scsi.MaxSenseLen)}
		r := l.Execute(context.Background(), cmd)
		if r.Status != scsi.StatusGood {
			return 0, &SCSIError{Op: "seed", Status: r.Status, Sense: r.Sense}
		}
		return r.DataInLen, nil
	}
}

func newSeedLUN(tb testing.TB, cfg scsi.LUNConfig, size int64) *scsi.LUN {
	tb.Helper()
	ram, err := backend.NewRAM(size, cfg.ReadOnly)
	if err != nil {
		tb.Fatal(err)
	}
	l, err := scsi.NewLUN(cfg, ram)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = l.Close() })
	// The first command of a nexus reports POWER ON: take it now.
	for range 4 {
		if _, err := scsiLUNCmd(l)([]byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, nil); err == nil {
			break
		}
	}
	return l
}

// probeSeeds are scripts of real answers (the scsi package's LUNs) and of answers that once
// were trouble: short data, capacities at the limits, block sizes of 0.
func probeSeeds(tb testing.TB) [][]byte {
	var seeds [][]byte
	for _, cfg := range []scsi.LUNConfig{
		{BlockSize: 512, Serial: "seed-0", MaxTransferLength: 2048, MaxUnmapDescriptors: 16, MaxWriteSameLength: 1 << 20},
		{BlockSize: 4096, Serial: "seed-1", ReadOnly: true},
	} {
		var script []byte
		info := LUNInfo{}
		if err := probeLUN(&info, recordScript(&script, scsiLUNCmd(newSeedLUN(tb, cfg, 8<<20)))); err != nil {
			tb.Fatalf("seed LUN: %v", err)
		}
		seeds = append(seeds, script)
	}
	inq := make([]byte, 36)
	copy(inq[8:], "VENDOR  PRODUCT         REV ")
	vpd0 := []byte{0, 0, 0, 5, 0x00, 0x80, 0x83, 0xb0, 0xb2}
	rc16 := func(lba uint64, bs uint32, n int) []byte { return rcap16(lba, bs, 0, 0x80, n) }
	rc10 := rcap10
	cat := func(es ...[]byte) []byte { return bytes.Join(es, nil) }
	serial := scriptEntry(0, []byte{0, 0x80, 0xff, 0xff, 'x'}) // page length past the data
	id := scriptEntry(0, []byte{0, 0x83, 0, 8, 1, 3, 0, 4, 1, 2, 3})
	seeds = append(seeds,
		cat(scriptEntry(0, inq[:35])),
		cat(scriptEntry(0, inq), scriptEntry(0, vpd0), serial, id, scriptEntry(0, rc16(math.MaxUint64, 512, 32))),
		cat(scriptEntry(0, inq), scriptEntry(0, vpd0), serial, id, scriptEntry(0, rc16(1<<60, 4096, 32))),
		cat(scriptEntry(0, inq), scriptEntry(0, vpd0), serial, id, scriptEntry(0, rc16(100, 0, 32))),
		cat(scriptEntry(0, inq), scriptEntry(0, vpd0), serial, id, scriptEntry(0, rc16(100, 512, 13)),
			scriptEntry(0, rc10(math.MaxUint32, 512))),
		cat(scriptEntry(0, inq), scriptEntry(3, nil), scriptEntry(scriptIllegal, nil), scriptEntry(0, rc10(99, 0))),
		cat(scriptEntry(0, inq), scriptEntry(3, nil), scriptEntry(scriptIllegal, nil), scriptEntry(scriptWholeBuf, nil)),
		cat(scriptEntry(scriptWholeBuf|scriptFillFF, nil)),
		cat(scriptEntry(0, inq), scriptEntry(scriptWholeBuf|scriptFillFF, []byte{0, 0, 0, 0xff})),
	)
	return seeds
}

// FuzzProbeLUN runs discovery of one logical unit against a hostile target's answers.
// Invariants: no panic; a bounded number of commands; an error is errNotDisk, ErrLUNData or
// what the target's answer gave; a LUN that is accepted has a block size the block API can
// shift by and a capacity in bytes that neither is zero nor overflows.
func FuzzProbeLUN(f *testing.F) {
	for _, s := range probeSeeds(f) {
		f.Add(s)
	}
	fuzzbound.Fuzz(f, func(t *testing.T, script []byte) {
		st := &scriptTarget{b: script}
		info := LUNInfo{Number: 3}
		err := probeLUN(&info, st.cmd)
		if st.cmds > 12 {
			t.Errorf("%d commands", st.cmds)
		}
		if err != nil {
			if !errors.Is(err, errNotDisk) && !errors.Is(err, ErrLUNData) && !errors.Is(err, ErrIllegalRequest) &&
				!errors.Is(err, errScriptTransport) {
				t.Errorf("unexpected error %v", err)
			}
			return
		}
		if err := checkLUNInfo(&info); err != nil {
			t.Error(err)
		}
	})
}

// checkLUNInfo checks what the block API relies on in an accepted LUN.
func checkLUNInfo(info *LUNInfo) error {
	bs := info.BlockSize
	if bs < minBlockSize || bs > maxBlockSize || 1<<log2(bs) != bs {
		return fmt.Errorf("accepted block size %d", bs)
	}
	if info.Blocks == 0 || info.Blocks > math.MaxInt64/uint64(bs) {
		return fmt.Errorf("accepted %d blocks of %d bytes", info.Blocks, bs)
	}
	l := &LUN{blockSize: bs, bsShift: uint(log2(bs))}
	l.info.Store(info)
	if sz := l.Size(); sz <= 0 || uint64(sz)>>l.bsShift != info.Blocks {
		return fmt.Errorf("size %d for %d blocks of %d bytes", sz, info.Blocks, bs)
	}
	if len(info.Vendor) > 8 || len(info.Product) > 16 || len(info.Revision) > 4 {
		return fmt.Errorf("INQUIRY strings %q %q %q", info.Vendor, info.Product, info.Revision)
	}
	if (len(info.ID) == 0) != (info.IDType == "") {
		return fmt.Errorf("designator %x of type %q", info.ID, info.IDType)
	}
	if info.UnmapSupported && info.MaxUnmapDescs == 0 {
		return errors.New("UNMAP supported with no descriptors")
	}
	return nil
}

// reportLUNsSeeds: a real LUN set's answer, a list longer than the first buffer, a list length
// larger than the data, one that grows with every answer, duplicates, and short data.
func reportLUNsSeeds() [][]byte {
	list := func(listLen uint32, luns ...uint16) []byte {
		b := make([]byte, 8+8*len(luns))
		binary.BigEndian.PutUint32(b, listLen)
		for i, n := range luns {
			copy(b[8+8*i:], func() []byte { a := scsi.LUNAddressOf(n); return a[:] }())
		}
		return b
	}
	many := make([]uint16, 100)
	for i := range many {
		many[i] = uint16(i)
	}
	return [][]byte{
		scriptEntry(0, list(16, 0, 1)),
		append(scriptEntry(0, list(800, many[:64]...)), scriptEntry(0, list(800, many...))...),
		scriptEntry(0, list(0xffffffff, 0, 1)),
		append(append(scriptEntry(0, list(1000, 0)), scriptEntry(0, list(2000, 0))...), scriptEntry(0, list(4000, 0))...),
		scriptEntry(0, list(24, 5, 5, 5)),
		scriptEntry(0, []byte{0, 0, 0, 8, 0}),
		scriptEntry(scriptWholeBuf|scriptFillFF, nil),
	}
}

// FuzzReportLUNs runs REPORT LUNS against a hostile target's answers. Invariants: no panic; at
// most maxReportLUNsTries commands; at most maxReportLUNs LUNs, none twice, each one the
// target's last answer lists; an error is ErrLUNData or the target's.
func FuzzReportLUNs(f *testing.F) {
	for _, s := range reportLUNsSeeds() {
		f.Add(s)
	}
	fuzzbound.Fuzz(f, func(t *testing.T, script []byte) {
		st := &scriptTarget{b: script}
		var last []byte
		luns, err := reportLUNs(func(cdb, in []byte) (int, error) {
			n, err := st.cmd(cdb, in)
			last = in[:n]
			return n, err
		})
		if st.cmds > maxReportLUNsTries {
			t.Errorf("%d REPORT LUNS commands", st.cmds)
		}
		if err != nil {
			if !errors.Is(err, ErrLUNData) && !errors.Is(err, ErrIllegalRequest) && !errors.Is(err, errScriptTransport) {
				t.Errorf("unexpected error %v", err)
			}
			return
		}
		if len(luns) > maxReportLUNs {
			t.Errorf("%d LUNs", len(luns))
		}
		seen := map[srp.LUN]bool{}
		for _, a := range luns {
			if seen[a] {
				t.Errorf("LUN %x twice", a)
			}
			seen[a] = true
			found := false
			for off := 8; off+8 <= len(last); off += 8 {
				found = found || bytes.Equal(last[off:off+8], a[:])
			}
			if !found {
				t.Errorf("LUN %x not in the answer", a)
			}
		}
	})
}
