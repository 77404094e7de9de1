package scsi

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"testing"
)

// TestParseRecordsForExecute: LUNSet.Parse keeps its result in the Command and Execute uses
// it; a Command whose CDB changed in place since (a target reusing a receive buffer) is parsed
// afresh, never run on the stale result.
func TestParseRecordsForExecute(t *testing.T) {
	l, m := newTestLUN(t, testConfig())
	s := NewLUNSet()
	if err := s.Add(0, l); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	data := fill(512, 0x5A)
	cmd := setCmd(0, nexA, cdbRW10(OpWrite10, 5, 1, false), 512)
	cmd.DataOut = data
	info, err := s.Parse(cmd)
	if err != nil || info.Dir != DirOut || info.Length != 512 || info.LBA != 5 || info.Name() != "WRITE(10)" {
		t.Fatalf("Parse(WRITE(10)) = %+v, %v", info, err)
	}
	if !cmd.pc.matches(l, cmd) {
		t.Fatal("Parse kept no result Execute can use")
	}
	wantGood(t, s.Execute(ctx, cmd))
	if !bytes.Equal(m.data[5*512:6*512], data) {
		t.Fatal("WRITE(10) after Parse did not write LBA 5")
	}

	// The same CDB buffer now holds a READ(10) of LBA 5; nobody called Parse.
	copy(cmd.CDB, cdbRW10(OpRead10, 5, 1, false))
	cmd.DataOut = nil
	if cmd.pc.matches(l, cmd) {
		t.Fatal("a changed CDB still matches the recorded parse")
	}
	r := s.Execute(ctx, cmd)
	wantGood(t, r)
	if r.DataInLen != 512 || !bytes.Equal(cmd.DataIn[:512], data) {
		t.Fatalf("READ(10) in a reused Command: %d bytes, % x...", r.DataInLen, cmd.DataIn[:8])
	}

	// WriteProtected changed after Parse: the record does not apply either.
	cmd = setCmd(0, nexA, cdbRW10(OpWrite10, 6, 1, false), 0)
	cmd.DataOut = data
	if _, err := s.Parse(cmd); err != nil {
		t.Fatal(err)
	}
	cmd.WriteProtected = true
	wantSense(t, s.Execute(ctx, cmd), DataProtect, 0x27, 0)

	// An invalid CDB: Parse reports what ParseCDB does, and Execute the same CHECK CONDITION.
	bad := cdbRead16(testBlocks, 1)
	cmd = setCmd(0, nexA, bad, 512)
	info, err = s.Parse(cmd)
	want, werr := s.ParseCDB(cmd.LUN, bad)
	var got Sense
	if !errors.As(err, &got) || !got.Match(IllegalRequest, 0x21, 0) || err != werr || info != want || info.Dir != DirNone {
		t.Fatalf("Parse(bad LBA) = %+v, %v; ParseCDB = %+v, %v", info, err, want, werr)
	}
	wantSense(t, s.Execute(ctx, cmd), IllegalRequest, 0x21, 0)

	// No LUN there, and REPORT LUNS: the set's answers, as ParseCDB gives them.
	for _, c := range []*Command{setCmd(9, nexA, cdbInquiry(false, 0, 96), 96), setCmd(0, nexA, cdbReportLUNs(0, 64), 64)} {
		info, err := s.Parse(c)
		want, werr := s.ParseCDB(c.LUN, c.CDB)
		if err != nil || werr != nil || info != want || info.Dir != DirIn {
			t.Fatalf("Parse(% x) = %+v, %v; ParseCDB %+v, %v", c.CDB, info, err, want, werr)
		}
		wantGood(t, s.Execute(ctx, c))
	}
	cmd = setCmd(9, nexA, cdbTUR(), 0)
	if _, err := s.Parse(cmd); !errors.As(err, &got) || !got.Match(IllegalRequest, 0x25, 0) {
		t.Fatalf("Parse(TUR to no LUN) = %v", err)
	}
}

// TestWriteProtectedNexus: Command.WriteProtected refuses the medium writes (and only those)
// with DATA PROTECT, WRITE PROTECTED, before the unit attention of the nexus and after CDB
// validity, lets reads through, and sets WP in MODE SENSE data; without it the same LUN is
// writable.
func TestWriteProtectedNexus(t *testing.T) {
	l, m := newTestLUN(t, testConfig())
	s := NewLUNSet()
	if err := s.Add(0, l); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	prOut := cdbPROut(PROutRegister, 0)
	for _, tc := range []struct {
		name  string
		cdb   []byte
		out   []byte
		write bool
	}{
		{"WRITE(6)", cdbRW6(OpWrite6, 1, 1), fill(512, 1), true},
		{"WRITE(10)", cdbRW10(OpWrite10, 1, 1, false), fill(512, 1), true},
		{"WRITE(12)", cdbRW12(OpWrite12, 1, 1, false), fill(512, 1), true},
		{"WRITE(16)", cdbWrite16(1, 1), fill(512, 1), true},
		{"WRITE SAME(10)", func() []byte { c := cdbRW10(OpWriteSame10, 1, 1, false); return c }(), fill(512, 1), true},
		{"WRITE SAME(16)", cdbWriteSame16(1, 1, false, false), fill(512, 1), true},
		{"UNMAP", cdbUnmap(24), unmapParams([2]uint64{1, 1}), true},
		{"COMPARE AND WRITE", cdbCAW(1, 1), fill(1024, 0), true},
		{"READ(16)", cdbRead16(1, 1), nil, false},
		{"SYNCHRONIZE CACHE(16)", cdbSync16(0, 0), nil, false},
		{"MODE SELECT(6)", cdbModeSelect6(0), nil, false},
		{"PERSISTENT RESERVE OUT", prOut, prParams(0, 0x1234), false},
		{"START STOP UNIT", cdbStartStop(true, false), nil, false},
	} {
		cmd := setCmd(0, nexA, tc.cdb, 512)
		cmd.DataOut = tc.out
		cmd.WriteProtected = true
		info, err := s.Parse(cmd)
		var sense Sense
		refused := errors.As(err, &sense) && sense.Match(DataProtect, 0x27, 0)
		if refused != tc.write || (refused && info.Dir != DirNone) || (!refused && err != nil) {
			t.Errorf("%s: Parse = %+v, %v; want refused %v", tc.name, info, err, tc.write)
			continue
		}
		r := s.Execute(ctx, cmd)
		if tc.write {
			wantSense(t, r, DataProtect, 0x27, 0)
		} else if r.Status != StatusGood {
			t.Errorf("%s: %v %v; want GOOD", tc.name, r.Status, r.Sense)
		}
	}
	if m.data[512] != 0 {
		t.Fatal("a refused write reached the medium")
	}

	// Without Parse (LUN.Execute straight away) too, and before the nexus's unit attention:
	// nexC has POWER ON pending, still there afterwards.
	cmd := &Command{CDB: cdbWrite16(1, 1), Nexus: nexC, DataOut: fill(512, 1), WriteProtected: true, Sense: make([]byte, MaxSenseLen)}
	wantSense(t, l.Execute(ctx, cmd), DataProtect, 0x27, 0)
	r, _ := do(l, nexC, cdbTUR(), nil, 0)
	wantSense(t, r, UnitAttention, 0x29, 0x00)

	// An invalid write is reported as invalid, not as write protected; an unsupported write
	// opcode (WRITE AND VERIFY(10)) as an invalid opcode.
	for _, tc := range []struct {
		cdb       []byte
		asc, ascq uint8
	}{
		{cdbWrite16(testBlocks, 1), 0x21, 0},
		{[]byte{0x2E, 0, 0, 0, 0, 1, 0, 0, 1, 0}, 0x20, 0},
	} {
		cmd := setCmd(0, nexA, tc.cdb, 0)
		cmd.DataOut, cmd.WriteProtected = fill(512, 1), true
		var sense Sense
		if _, err := s.Parse(cmd); !errors.As(err, &sense) || !sense.Match(IllegalRequest, tc.asc, tc.ascq) {
			t.Errorf("Parse(% x) = %v", tc.cdb, err)
		}
		wantSense(t, s.Execute(ctx, cmd), IllegalRequest, tc.asc, tc.ascq)
	}

	// MODE SENSE(6) and (10) report WP (device-specific parameter) for the protected nexus only.
	for _, wp := range []bool{false, true} {
		for _, ms := range []struct {
			cdb []byte
			off int
		}{{cdbModeSense6(true, 0, 0x3F, 0, 255), 2}, {cdbModeSense10(true, false, 0, 0x3F, 0, 255), 3}} {
			cmd := setCmd(0, nexA, ms.cdb, 255)
			cmd.WriteProtected = wp
			if _, err := s.Parse(cmd); err != nil {
				t.Fatal(err)
			}
			r := s.Execute(ctx, cmd)
			wantGood(t, r)
			if got := cmd.DataIn[ms.off]&0x80 != 0; got != wp {
				t.Errorf("MODE SENSE % x, WriteProtected %v: WP %v", ms.cdb[:1], wp, got)
			}
		}
	}

	// The same LUN without WriteProtected takes the write.
	cmd = setCmd(0, nexA, cdbWrite16(1, 1), 0)
	cmd.DataOut = fill(512, 7)
	if _, err := s.Parse(cmd); err != nil {
		t.Fatal(err)
	}
	wantGood(t, s.Execute(ctx, cmd))
	if m.data[512] != 7 {
		t.Fatal("write without WriteProtected did not reach the medium")
	}
}

// TestParseThenExecuteDoesNotAllocate: the one-parse path of a target (LUNSet.Parse, then
// LUNSet.Execute) stays allocation-free for READ and WRITE.
func TestParseThenExecuteDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	l := benchLUN(t)
	s := NewLUNSet()
	if err := s.Add(0, l); err != nil {
		t.Fatal(err)
	}
	clearUA(t, l, nexA)
	ctx := context.Background()
	for _, cmd := range []*Command{
		{CDB: cdbRead16(8, 8), Nexus: nexA, DataIn: make([]byte, 4096)},
		{CDB: cdbWrite16(8, 8), Nexus: nexA, DataOut: make([]byte, 4096)},
	} {
		n := testing.AllocsPerRun(200, func() {
			if _, err := s.Parse(cmd); err != nil {
				t.Fatal(err)
			}
			if r := s.Execute(ctx, cmd); r.Status != StatusGood {
				t.Fatal(r.Sense)
			}
		})
		if n != 0 {
			t.Errorf("% x: %v allocs", cmd.CDB[:1], n)
		}
	}
}

// TestParseAgreesWithExecute: for every fuzz seed (one per supported command), with and
// without WriteProtected, Parse then Execute gives what Execute alone gives on an identical
// LUN: the same result, data-in and medium.
func TestParseAgreesWithExecute(t *testing.T) {
	ctx := context.Background()
	for _, seed := range fuzzSeeds() {
		for _, wp := range []bool{false, true} {
			var res [2]Result
			var din [2][]byte
			var media [2][]byte
			for k := range 2 {
				l, m := newTestLUN(t, testConfig())
				s := NewLUNSet()
				if err := s.Add(0, l); err != nil {
					t.Fatal(err)
				}
				cmd := setCmd(0, nexA, seed[0], 4096)
				cmd.DataOut, cmd.WriteProtected = seed[1], wp
				if k == 1 {
					s.Parse(cmd)
				}
				res[k] = s.Execute(ctx, cmd)
				din[k], media[k] = cmd.DataIn[:res[k].DataInLen], m.data
			}
			if !reflect.DeepEqual(res[0], res[1]) || !bytes.Equal(din[0], din[1]) || !bytes.Equal(media[0], media[1]) {
				t.Errorf("% x (WriteProtected %v): Execute %v %v, Parse+Execute %v %v", seed[0], wp,
					res[0].Status, res[0].Sense, res[1].Status, res[1].Sense)
			}
		}
	}
}
