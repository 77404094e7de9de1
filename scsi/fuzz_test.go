package scsi

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/srpd/srpd/internal/fuzzbound"
)

// fuzzSeeds holds one CDB per supported command (and a few variants), with fitting data-out.
func fuzzSeeds() [][2][]byte {
	blk := make([]byte, 512)
	var seeds [][2][]byte
	add := func(cdb, out []byte) { seeds = append(seeds, [2][]byte{cdb, out}) }
	add(cdbTUR(), nil)
	add(cdbRequestSense(false, 252), nil)
	add(cdbRequestSense(true, 252), nil)
	add(cdbRW6(OpRead6, 1, 1), nil)
	add(cdbRW6(OpWrite6, 1, 1), blk)
	add(cdbInquiry(false, 0, 96), nil)
	for _, p := range vpdPages {
		add(cdbInquiry(true, p, 255), nil)
	}
	add(cdbModeSelect6(24), modeSelectCaching(false, false))
	add(cdbModeSense6(false, 0, 0x3F, 0, 255), nil)
	add(cdbStartStop(false, false), nil)
	add(cdbStartStop(true, false), nil)
	add(cdbReadCap10(), nil)
	add(cdbRW10(OpRead10, 1, 2, true), nil)
	add(cdbRW10(OpWrite10, 1, 2, true), make([]byte, 1024))
	add(func() []byte { c := cdbRW10(OpVerify10, 0, 1, false); c[1] = 0x02; return c }(), blk)
	add(make10(OpSynchronizeCache10), nil)
	add(cdbRW10(OpWriteSame10, 0, 4, false), blk)
	add(cdbUnmap(24), unmapParams([2]uint64{0, 8}))
	add(cdbModeSelect10(20), modeSelectControl10(true))
	add(cdbModeSense10(false, true, 0, 0x08, 0, 255), nil)
	for sa := range uint8(4) {
		add(cdbPRIn(sa, 255), nil)
	}
	for sa := range uint8(7) {
		add(cdbPROut(sa, prTypeWriteExclusive), prParams(0, 0x1234))
	}
	add(cdbRead16(0, 1), nil)
	add(cdbCAW(0, 1), make([]byte, 1024))
	add(cdbWrite16(0, 1), blk)
	add(cdbVerify16(0, 2, 3), blk)
	add(cdbSync16(0, 0), nil)
	add(cdbWriteSame16(0, 8, true, false), blk)
	add(cdbWriteSame16(0, 8, false, true), nil)
	add(cdbReadCap16(32), nil)
	add(cdbReportLUNs(0, 64), nil)
	add(cdbRSOC(true, 0, 0, 0, 4096), nil)
	add(cdbRSOC(false, 2, OpServiceActionIn16, SAReadCapacity16, 64), nil)
	add(cdbRW12(OpRead12, 0, 1, false), nil)
	add(cdbRW12(OpWrite12, 0, 1, false), blk)
	add(cdbLogSense(0, 0x00, 0, 0, 255), nil)
	add(cdbLogSense(1, 0x00, 0xFF, 0, 255), nil)
	add(cdbLogSense(1, 0x0C, 0, 0, 255), nil)
	add(cdbGetLBAStatus(0, 64), nil)
	add(cdbRTPG(false, 255), nil)
	add(cdbRTPG(true, 255), nil)
	add(cdbRSTMF(false, 4), nil)
	add(cdbRSTMF(true, 16), nil)
	return seeds
}

func TestFuzzSeedsCoverEveryCommand(t *testing.T) {
	seen := map[*cmdInfo]bool{}
	cfg := testConfig()
	cfg.ALUA = testALUA(ALUAActiveOptimized)
	l, _ := newTestLUN(t, cfg)
	for _, s := range fuzzSeeds() {
		if i, err := l.ParseCDB(s[0]); err == nil {
			seen[i.cmd] = true
		}
	}
	for i := range commands {
		if !seen[&commands[i]] {
			t.Errorf("no valid seed for %s", commands[i].name)
		}
	}
}

// FuzzExecute feeds arbitrary CDBs and data-out to a fresh LUN and checks the invariants of
// every outcome: no panic, a known status, well-formed sense on CHECK CONDITION matching
// Result.Sense, data-in within bounds, and agreement between ParseCDB and Execute.
func FuzzExecute(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s[0], s[1], uint16(4096), uint8(0))
		f.Add(s[0], s[1], uint16(4096), uint8(128)) // with ALUA
	}
	f.Fuzz(func(t *testing.T, cdb, out []byte, inLen uint16, opts uint8) {
		fuzzbound.Run(t, func() {
			if err := executeOne(cdb, out, inLen, opts); err != nil {
				t.Error(err)
			}
		})
	})
}

// executeOne is one FuzzExecute input; it returns the first broken invariant (it runs on
// fuzzbound's goroutine, where t.Fatal must not be called).
func executeOne(cdb, out []byte, inLen uint16, opts uint8) error {
	cfg := testConfig()
	if opts&1 != 0 {
		cfg.BlockSize = 4096
	}
	cfg.ReadOnly = opts&2 != 0
	if opts&128 != 0 {
		cfg.ALUA = testALUA(ALUAActiveOptimized)
	}
	bs := int64(cfg.BlockSize)
	if bs == 0 {
		bs = 512
	}
	m := newMemBackend(64 * bs)
	if opts&4 != 0 {
		m.readErrAt.Store(3 * bs)
		m.writeErrAt.Store(5 * bs)
	}
	m.flushErr.Store(opts&8 != 0)
	l, err := NewLUN(cfg, m)
	if err != nil {
		return err
	}
	if err := clearUAErr(l, nexA); err != nil {
		return err
	}
	if opts&16 != 0 {
		if r, _ := do(l, nexA, cdbModeSelect10(20), modeSelectControl10(true), 0); r.Status != StatusGood {
			return fmt.Errorf("MODE SELECT(10) D_SENSE: %v", r.Sense)
		}
	}
	info, perr := l.ParseCDB(cdb)
	if perr == nil && info.Dir == DirOut && uint64(info.Length) > uint64(l.MaxDataOutBytes()) {
		return fmt.Errorf("data-out length %d beyond MaxDataOutBytes %d", info.Length, l.MaxDataOutBytes())
	}
	cmd := &Command{
		CDB:     cdb,
		Nexus:   nexA,
		Attr:    TaskAttr(opts >> 5 & 3),
		DataOut: out,
		DataIn:  make([]byte, int(inLen)),
		Sense:   make([]byte, MaxSenseLen),
	}
	r := l.Execute(context.Background(), cmd)
	switch r.Status {
	case StatusGood, StatusCheckCondition, StatusReservationConflict:
	default:
		return fmt.Errorf("status %v", r.Status)
	}
	if r.DataInLen < 0 || r.DataInLen > len(cmd.DataIn) {
		return fmt.Errorf("data-in length %d of %d", r.DataInLen, len(cmd.DataIn))
	}
	if perr == nil && info.Dir != DirIn && r.DataInLen != 0 || perr == nil && uint64(r.DataInLen) > uint64(info.Length) {
		return fmt.Errorf("data-in %d for %+v", r.DataInLen, info)
	}
	if r.Status != StatusCheckCondition {
		if r.SenseLen != 0 {
			return errors.New("sense without CHECK CONDITION")
		}
		if perr != nil {
			return fmt.Errorf("ParseCDB rejected (%v) what Execute accepted", perr)
		}
		return nil
	}
	if err := wellFormedSense(cmd.Sense[:r.SenseLen], opts&16 != 0); err != nil {
		return err
	}
	s, err := ParseSense(cmd.Sense[:r.SenseLen])
	if err != nil {
		return err
	}
	if s.Key != r.Sense.Key || s.ASC != r.Sense.ASC || s.ASCQ != r.Sense.ASCQ || s.Field != r.Sense.Field {
		return fmt.Errorf("encoded %v, reported %v", s, r.Sense)
	}
	if s.Key == NoSense {
		return errors.New("CHECK CONDITION with NO SENSE")
	}
	var ps Sense
	if cmd.Attr == TaskSimple && errors.As(perr, &ps) && ps != r.Sense {
		return fmt.Errorf("ParseCDB said %v, Execute %v", ps, r.Sense)
	}
	return nil
}

// wellFormedSense: response code 0x70/0x72 as D_SENSE says, valid key, additional length
// consistent with the length, descriptors that tile the descriptor area exactly.
func wellFormedSense(b []byte, desc bool) error {
	if len(b) < 8 {
		return fmt.Errorf("sense % x too short", b)
	}
	switch b[0] & 0x7F {
	case SenseFixedCurrent:
		if desc || len(b) != 18 || int(b[7]) != len(b)-8 || b[2]&0xF0 != 0 {
			return fmt.Errorf("fixed sense % x", b)
		}
	case SenseDescriptorCurrent:
		if !desc || int(b[7]) != len(b)-8 || b[1]&0xF0 != 0 || b[0]&0x80 != 0 {
			return fmt.Errorf("descriptor sense % x", b)
		}
		for p := 8; p < len(b); p += 2 + int(b[p+1]) {
			if p+2 > len(b) || p+2+int(b[p+1]) > len(b) {
				return fmt.Errorf("descriptors % x", b)
			}
		}
	default:
		return fmt.Errorf("response code % x", b)
	}
	return nil
}
