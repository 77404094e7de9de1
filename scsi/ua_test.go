package scsi

import (
	"context"
	"testing"
)

func TestUnitAttentionPowerOn(t *testing.T) {
	l, err := NewLUN(testConfig(), newMemBackend(testBlocks*512))
	if err != nil {
		t.Fatal(err)
	}
	// INQUIRY, REPORT LUNS do not report it and do not clear it.
	r, _ := do(l, nexA, cdbInquiry(false, 0, 96), nil, 96)
	wantGood(t, r)
	r, _ = do(l, nexA, cdbReportLUNs(0, 64), nil, 64)
	wantGood(t, r)
	// Any other command reports it once, even an invalid one...
	r, _ = do(l, nexA, []byte{0xC0, 0, 0, 0, 0, 0}, nil, 0)
	wantSense(t, r, UnitAttention, 0x29, 0x00)
	r, _ = do(l, nexA, []byte{0xC0, 0, 0, 0, 0, 0}, nil, 0)
	wantSense(t, r, IllegalRequest, 0x20, 0x00)
	r, _ = do(l, nexA, cdbTUR(), nil, 0)
	wantGood(t, r)
	// ...per I_T nexus: B and a nexus differing only in the target port still have theirs.
	r, _ = do(l, nexB, cdbRead16(0, 1), nil, 512)
	wantSense(t, r, UnitAttention, 0x29, 0x00)
	other := nexA
	other.TargetPortID[0] = 9
	r, _ = do(l, other, cdbTUR(), nil, 0)
	wantSense(t, r, UnitAttention, 0x29, 0x00)
	// REQUEST SENSE reports it as data, with GOOD status, and clears it.
	r, d := do(l, nexC, cdbRequestSense(false, 252), nil, 252)
	wantGood(t, r)
	if s, _ := ParseSense(d); !s.Match(UnitAttention, 0x29, 0) {
		t.Fatal(s)
	}
	r, _ = do(l, nexC, cdbTUR(), nil, 0)
	wantGood(t, r)
}

func TestUnitAttentionReset(t *testing.T) {
	l, _ := newTestLUN(t, testConfig())
	mustGood(t, l, cdbModeSelect10(20), modeSelectControl10(true))
	clearUA(t, l, nexB)
	l.wce.Store(false)
	mustGood(t, l, cdbStartStop(false, false), nil)
	l.Reset()
	if !l.WriteCacheEnabled() || l.dsense.Load() || l.stopped.Load() {
		t.Fatal("reset did not restore defaults")
	}
	for _, n := range []Nexus{nexA, nexB} {
		r, _ := do(l, n, cdbTUR(), nil, 0)
		wantSense(t, r, UnitAttention, 0x29, 0x03)
		r, _ = do(l, n, cdbTUR(), nil, 0)
		wantGood(t, r)
	}
	// A nexus first seen after the reset gets the power-on condition.
	r, _ := do(l, nexC, cdbTUR(), nil, 0)
	wantSense(t, r, UnitAttention, 0x29, 0x00)
}

func TestUnitAttentionQueue(t *testing.T) {
	l, _ := newTestLUN(t, testConfig())
	l.ua.establish(&nexA, uaModeChanged)
	l.ua.establish(&nexA, uaReservationsPreemp)
	l.ua.establish(&nexA, uaModeChanged) // duplicate: once
	r, _ := do(l, nexA, cdbTUR(), nil, 0)
	wantSense(t, r, UnitAttention, 0x2A, 0x01)
	r, _ = do(l, nexA, cdbTUR(), nil, 0)
	wantSense(t, r, UnitAttention, 0x2A, 0x03)
	r, _ = do(l, nexA, cdbTUR(), nil, 0)
	wantGood(t, r)

	// A reset supersedes everything queued.
	l.ua.establish(&nexA, uaModeChanged)
	l.NexusLost(nexA)
	r, _ = do(l, nexA, cdbTUR(), nil, 0)
	wantSense(t, r, UnitAttention, 0x29, 0x07)
	r, _ = do(l, nexA, cdbTUR(), nil, 0)
	wantGood(t, r)

	// A full queue drops what does not fit.
	for i := range uaQueueLen + 3 {
		l.ua.establish(&nexB, uaCode(0x2A00+i))
	}
	for i := range uaQueueLen {
		r, _ = do(l, nexB, cdbTUR(), nil, 0)
		wantSense(t, r, UnitAttention, 0x2A, uint8(i))
	}
	r, _ = do(l, nexB, cdbTUR(), nil, 0)
	wantGood(t, r)
}

func TestACARejected(t *testing.T) {
	l, _ := newTestLUN(t, testConfig())
	for _, a := range []TaskAttr{TaskACA, 3, 7} {
		cmd := &Command{CDB: cdbTUR(), Nexus: nexA, Attr: a, Sense: make([]byte, 32)}
		r := l.Execute(context.Background(), cmd)
		wantSense(t, r, IllegalRequest, 0x49, 0)
		if r.SenseLen != 18 || cmd.Sense[0] != 0x70 {
			t.Fatalf("% x", cmd.Sense[:r.SenseLen])
		}
	}
	mustGood(t, l, cdbTUR(), nil) // nothing left stuck in the task set
}

func TestNewLUNValidation(t *testing.T) {
	m := newMemBackend(1 << 20)
	cases := []struct {
		name string
		cfg  LUNConfig
		be   *memBackend
	}{
		{"block size", LUNConfig{Serial: "s", BlockSize: 1024}, m},
		{"size not a multiple", LUNConfig{Serial: "s", BlockSize: 4096}, newMemBackend(4096*3 + 512)},
		{"no identity", LUNConfig{}, m},
		{"vendor too long", LUNConfig{Serial: "s", Vendor: "123456789"}, m},
		{"product not ASCII", LUNConfig{Serial: "s", Product: "disk\x00"}, m},
		{"revision too long", LUNConfig{Serial: "s", Revision: "12345"}, m},
		{"serial too long", LUNConfig{Serial: string(make([]byte, 65))}, m},
		{"company ID", LUNConfig{Serial: "s", CompanyID: 1 << 24}, m},
		{"max transfer", LUNConfig{Serial: "s", MaxTransferLength: 1 << 22}, m},
	}
	for _, c := range cases {
		if _, err := NewLUN(c.cfg, c.be); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
	if _, err := NewLUN(LUNConfig{Serial: "s"}, nil); err == nil {
		t.Error("nil backend accepted")
	}
	l, err := NewLUN(LUNConfig{DeviceID: [16]byte{1}}, m)
	if err != nil {
		t.Fatal(err)
	}
	if l.BlockSize() != 512 || l.Blocks() != 2048 || l.ReadOnly() || !l.WriteCacheEnabled() ||
		l.MaxTransferBytes() != DefaultMaxTransferBytes || l.Serial() != "01000000000000000000000000000000" || l.Backend() != m {
		t.Fatalf("defaults: %d %d %v %v %d %q", l.BlockSize(), l.Blocks(), l.ReadOnly(), l.WriteCacheEnabled(),
			l.MaxTransferBytes(), l.Serial())
	}
	if err := l.Close(); err != nil || l.Close() != nil {
		t.Fatal("close")
	}
}
