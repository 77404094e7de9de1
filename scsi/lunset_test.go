package scsi

import (
	"bytes"
	"context"
	"testing"
)

func TestLUNAddress(t *testing.T) {
	cases := []struct {
		n uint16
		a LUNAddress
	}{
		{0, LUNAddress{}},
		{5, LUNAddress{0, 5}},
		{255, LUNAddress{0, 255}},
		{256, LUNAddress{0x41, 0}},
		{MaxLUN, LUNAddress{0x7F, 0xFF}},
	}
	for _, c := range cases {
		if got := LUNAddressOf(c.n); got != c.a {
			t.Errorf("LUNAddressOf(%d) = % x", c.n, got)
		}
		if n, ok := c.a.Number(); !ok || n != c.n {
			t.Errorf("% x: %d %v", c.a, n, ok)
		}
	}
	if n, ok := (LUNAddress{0x40, 5}).Number(); !ok || n != 5 {
		t.Error("flat addressing of a small LUN")
	}
	for _, a := range []LUNAddress{{0x01, 5}, {0, 5, 0, 1}, {0x80, 1}, {0xC0, 0}} {
		if _, ok := a.Number(); ok {
			t.Errorf("% x decoded", a)
		}
	}
	if LUNAddressOf(300).String() != "300" || (LUNAddress{0xC0}).String() != "c000000000000000" {
		t.Error("String")
	}
}

func setCmd(lun uint16, n Nexus, cdb []byte, in int) *Command {
	return &Command{LUN: LUNAddressOf(lun), Nexus: n, CDB: cdb, DataIn: make([]byte, in), Sense: make([]byte, MaxSenseLen)}
}

func TestLUNSet(t *testing.T) {
	s := NewLUNSet()
	l0, _ := newTestLUN(t, testConfig())
	l7, _ := newTestLUN(t, testConfig())
	ctx := context.Background()
	if s.Add(0, l0) != nil || s.Add(300, l7) != nil {
		t.Fatal("add")
	}
	if s.Add(0, l7) == nil || s.Add(MaxLUN+1, l7) == nil || s.Add(1, nil) == nil {
		t.Fatal("bad add accepted")
	}
	if got := s.Numbers(); len(got) != 2 || got[0] != 0 || got[1] != 300 {
		t.Fatal(got)
	}
	// REPORT LUNS, from any LUN address, even one that does not exist.
	for _, lun := range []uint16{0, 300, 9} {
		cmd := setCmd(lun, nexA, cdbReportLUNs(0, 64), 64)
		r := s.Execute(ctx, cmd)
		wantGood(t, r)
		want := []byte{0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x41, 0x2C, 0, 0, 0, 0, 0, 0}
		if !bytes.Equal(cmd.DataIn[:r.DataInLen], want) {
			t.Fatalf("% x", cmd.DataIn[:r.DataInLen])
		}
	}
	// Sent to the LUN directly, REPORT LUNS uses the set the LUN is in.
	r, d := do(l7, nexA, cdbReportLUNs(0, 64), nil, 64)
	wantGood(t, r)
	if len(d) != 24 {
		t.Fatalf("% x", d)
	}
	cmd := setCmd(0, nexA, cdbReportLUNs(0, 8), 64)
	wantField(t, s.Execute(ctx, cmd), true, 6, 7)

	// Routing.
	cmd = setCmd(300, nexA, cdbReadCap10(), 8)
	if r := s.Execute(ctx, cmd); r.Status != StatusGood || cmd.DataIn[3] != 0xFF {
		t.Fatal(r)
	}
	if i, err := s.ParseCDB(LUNAddressOf(300), cdbRead16(0, 2)); err != nil || i.Length != 1024 {
		t.Fatal(i, err)
	}

	// A LUN that does not exist.
	cmd = setCmd(9, nexA, cdbInquiry(false, 0, 96), 96)
	r = s.Execute(ctx, cmd)
	wantGood(t, r)
	if r.DataInLen != 96 || cmd.DataIn[0] != 0x7F || cmd.DataIn[2] != 6 {
		t.Fatalf("% x", cmd.DataIn[:8])
	}
	cmd = setCmd(9, nexA, cdbInquiry(true, 0x83, 96), 96)
	wantSense(t, s.Execute(ctx, cmd), IllegalRequest, 0x25, 0)
	cmd = setCmd(9, nexA, cdbInquiry(false, 1, 96), 96)
	wantField(t, s.Execute(ctx, cmd), true, 2, 7)
	cmd = setCmd(9, nexA, cdbRequestSense(false, 252), 252)
	r = s.Execute(ctx, cmd)
	wantGood(t, r)
	if sense, _ := ParseSense(cmd.DataIn[:r.DataInLen]); !sense.Match(IllegalRequest, 0x25, 0) {
		t.Fatal(sense)
	}
	for _, cdb := range [][]byte{cdbTUR(), cdbRead16(0, 1), {}, cdbRequestSense(false, 252)[:3]} {
		cmd = setCmd(9, nexA, cdb, 512)
		r = s.Execute(ctx, cmd)
		if len(cdb) == 3 {
			wantSense(t, r, IllegalRequest, 0x24, 0)
			continue
		}
		wantSense(t, r, IllegalRequest, 0x25, 0)
	}
	cmd = setCmd(9, nexA, []byte{OpRequestSense, 0, 0, 0, 18, 4}, 252)
	wantField(t, s.Execute(ctx, cmd), true, 5, 2)
	if i, err := s.ParseCDB(LUNAddressOf(9), cdbInquiry(false, 0, 36)); err != nil || i.Dir != DirIn || i.Length != 36 {
		t.Fatal(i, err)
	}
	if _, err := s.ParseCDB(LUNAddressOf(9), cdbTUR()); err == nil {
		t.Fatal("TUR to a missing LUN parsed")
	}
	if s.Lookup(LUNAddress{0xC0}) != nil || s.Get(300) != l7 {
		t.Fatal("lookup")
	}

	// Inventory changes are announced; REPORT LUNS clears the announcement.
	l9, _ := newTestLUN(t, testConfig())
	if err := s.Add(9, l9); err != nil {
		t.Fatal(err)
	}
	cmd = setCmd(0, nexA, cdbTUR(), 0)
	wantSense(t, s.Execute(ctx, cmd), UnitAttention, 0x3F, 0x0E)
	cmd = setCmd(0, nexA, cdbTUR(), 0)
	wantGood(t, s.Execute(ctx, cmd))
	cmd = setCmd(300, nexB, cdbReportLUNs(0, 64), 64)
	wantGood(t, s.Execute(ctx, cmd))
	cmd = setCmd(300, nexB, cdbTUR(), 0)
	wantGood(t, s.Execute(ctx, cmd))
	if s.Remove(9) != l9 || s.Remove(9) != nil {
		t.Fatal("remove")
	}
	cmd = setCmd(9, nexA, cdbTUR(), 0)
	wantSense(t, s.Execute(ctx, cmd), IllegalRequest, 0x25, 0)

	// Admit through the set, then Execute; Withdraw.
	cmd = setCmd(0, nexA, cdbTUR(), 0)
	cmd.Attr = TaskOrdered
	s.Admit(cmd)
	s.Withdraw(cmd)
	cmd = setCmd(0, nexA, cdbTUR(), 0)
	s.Admit(cmd)
	wantSense(t, s.Execute(ctx, cmd), UnitAttention, 0x3F, 0x0E)
	cmd = setCmd(0, nexA, cdbReportLUNs(0, 64), 64)
	s.Admit(cmd)
	wantGood(t, s.Execute(ctx, cmd))

	s.NexusLost(nexB)
	cmd = setCmd(300, nexB, cdbTUR(), 0)
	wantSense(t, s.Execute(ctx, cmd), UnitAttention, 0x29, 0x07)
}
