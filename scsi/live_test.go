package scsi

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
)

// grow makes the test backend n bytes larger (what a backend's own resize does first).
func (m *memBackend) grow(n int) {
	m.mu.Lock()
	m.data = append(m.data, make([]byte, n)...)
	m.durable = append(m.durable, make([]byte, n)...)
	m.mu.Unlock()
}

func readCap16Blocks(t *testing.T, l *LUN, n Nexus) uint64 {
	t.Helper()
	r, d := do(l, n, cdbReadCap16(32), nil, 32)
	wantGood(t, r)
	return binary.BigEndian.Uint64(d) + 1
}

func TestResizeCapacityChanged(t *testing.T) {
	l, m := newTestLUN(t, testConfig()) // nexA and nexB have used it
	m.grow(512 * 1024)
	blocks, err := l.Resize()
	if err != nil || blocks != testBlocks+1024 || l.Blocks() != blocks {
		t.Fatalf("Resize: %d %v (Blocks %d); want %d", blocks, err, l.Blocks(), testBlocks+1024)
	}
	// Every nexus that knew the LUN gets CAPACITY DATA HAS CHANGED once.
	for _, n := range []Nexus{nexA, nexB} {
		r, _ := do(l, n, cdbTUR(), nil, 0)
		wantSense(t, r, UnitAttention, 0x2A, 0x09)
		r, _ = do(l, n, cdbTUR(), nil, 0)
		wantGood(t, r)
	}
	// A nexus new to the LUN sees POWER ON only.
	r, _ := do(l, nexC, cdbTUR(), nil, 0)
	wantSense(t, r, UnitAttention, 0x29, 0x00)
	r, _ = do(l, nexC, cdbTUR(), nil, 0)
	wantGood(t, r)
	if got := readCap16Blocks(t, l, nexA); got != testBlocks+1024 {
		t.Fatalf("READ CAPACITY(16) after the resize: %d blocks", got)
	}
	// The new blocks are usable.
	r, _ = do(l, nexA, cdbWrite16(testBlocks+1000, 1), make([]byte, 512), 0)
	wantGood(t, r)
	// The same size again changes nothing: no unit attention.
	if _, err := l.Resize(); err != nil {
		t.Fatal(err)
	}
	r, _ = do(l, nexA, cdbTUR(), nil, 0)
	wantGood(t, r)
	// A size that is not a multiple of the block size is refused and the capacity stays.
	m.grow(100)
	if _, err := l.Resize(); !errors.Is(err, ErrCapacity) || l.Blocks() != testBlocks+1024 {
		t.Fatalf("Resize to a partial block: %v, %d blocks", err, l.Blocks())
	}
}

func TestSetReadOnly(t *testing.T) {
	l, m := newTestLUN(t, testConfig())
	r, _ := do(l, nexA, cdbWrite16(0, 1), make([]byte, 512), 0)
	wantGood(t, r)
	if err := l.SetReadOnly(true); err != nil || !l.ReadOnly() {
		t.Fatalf("SetReadOnly(true): %v", err)
	}
	r, _ = do(l, nexA, cdbWrite16(0, 1), make([]byte, 512), 0)
	wantSense(t, r, UnitAttention, 0x2A, 0x01) // MODE PARAMETERS CHANGED first
	r, _ = do(l, nexA, cdbWrite16(0, 1), make([]byte, 512), 0)
	wantSense(t, r, DataProtect, 0x27, 0x00)
	r, d := do(l, nexA, cdbModeSense6(true, 0, 0x3F, 0, 255), nil, 255)
	wantGood(t, r)
	if d[2]&0x80 == 0 {
		t.Fatal("MODE SENSE of a read-only LUN without WP")
	}
	r, _ = do(l, nexA, cdbRead16(0, 1), nil, 512)
	wantGood(t, r)
	if err := l.SetReadOnly(false); err != nil || l.ReadOnly() {
		t.Fatalf("SetReadOnly(false): %v", err)
	}
	clearUA(t, l, nexA)
	r, _ = do(l, nexA, cdbWrite16(0, 1), make([]byte, 512), 0)
	wantGood(t, r)

	// A LUN over a read-only backend cannot be made writable.
	m2 := newMemBackend(512 * testBlocks)
	m2.info.ReadOnly = true
	l2, err := NewLUN(testConfig(), m2)
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.SetReadOnly(false); !errors.Is(err, ErrBackendReadOnly) || !l2.ReadOnly() {
		t.Fatalf("SetReadOnly(false) over a read-only backend: %v", err)
	}
	_ = m
}

// TestLUNSetUAScoped: one LUN in two sets (two ACL views); a change of one set reports
// REPORTED LUNS DATA HAS CHANGED to that set's nexuses only, and a removed LUN answers
// LOGICAL UNIT NOT SUPPORTED to the set it left while the other set still reaches it.
func TestLUNSetUAScoped(t *testing.T) {
	ctx := context.Background()
	shared, _ := newTestLUN(t, testConfig()) // nexA and nexB have used it
	extra, _ := newTestLUN(t, testConfig())
	setA, setB := NewLUNSet(), NewLUNSet()
	setA.Bind(nexA)
	setB.Bind(nexB)
	if setA.Add(0, shared) != nil || setB.Add(0, shared) != nil || setB.Add(1, extra) != nil {
		t.Fatal("add")
	}
	// Set B's second LUN was news to nexB only.
	wantGood(t, setA.Execute(ctx, setCmd(0, nexA, cdbTUR(), 0)))
	clearUA(t, shared, nexB)
	clearUA(t, extra, nexB)
	tur := func(s *LUNSet, lun uint16, n Nexus) Result { return s.Execute(ctx, setCmd(lun, n, cdbTUR(), 0)) }

	// A LUN added to set A: nexA is told, nexB (set B only) is not.
	added, _ := newTestLUN(t, testConfig())
	if err := setA.Add(5, added); err != nil {
		t.Fatal(err)
	}
	wantSense(t, tur(setA, 0, nexA), UnitAttention, 0x3F, 0x0E)
	wantGood(t, tur(setA, 0, nexA))
	wantGood(t, tur(setB, 0, nexB))
	wantGood(t, tur(setB, 1, nexB))

	// LUN 1 removed from set B: nexB is told on the LUNs it still sees, nexA is not, and
	// LUN 1 answers LOGICAL UNIT NOT SUPPORTED.
	if setB.Remove(1) != extra {
		t.Fatal("Remove")
	}
	wantGood(t, tur(setA, 0, nexA))
	wantSense(t, tur(setB, 0, nexB), UnitAttention, 0x3F, 0x0E)
	wantGood(t, tur(setB, 0, nexB))
	wantSense(t, tur(setB, 1, nexB), IllegalRequest, 0x25, 0x00)
	cmd := setCmd(1, nexB, cdbReportLUNs(0, 64), 64)
	r := setB.Execute(ctx, cmd)
	wantGood(t, r)
	if binary.BigEndian.Uint32(cmd.DataIn) != 8 {
		t.Fatalf("REPORT LUNS after the removal lists %d bytes of LUNs, want 8", binary.BigEndian.Uint32(cmd.DataIn))
	}

	// Write protection changed for set A's view of LUN 0: MODE PARAMETERS CHANGED to nexA only.
	if !setA.ModeChanged(0) || setA.ModeChanged(9) {
		t.Fatal("ModeChanged")
	}
	wantGood(t, tur(setB, 0, nexB))
	wantSense(t, tur(setA, 0, nexA), UnitAttention, 0x2A, 0x01)

	// Unbound, nexA is no longer told.
	setA.Unbind(nexA)
	if setA.Remove(5) == nil {
		t.Fatal("Remove 5")
	}
	wantGood(t, tur(setA, 0, nexA))
}

// TestLUNSetUnbound: a set nobody bound reports its changes to every nexus its LUNs know
// (the behaviour before views bound their sessions).
func TestLUNSetUnbound(t *testing.T) {
	ctx := context.Background()
	l0, _ := newTestLUN(t, testConfig())
	s := NewLUNSet()
	if s.Add(0, l0) != nil {
		t.Fatal("add")
	}
	l1, _ := newTestLUN(t, testConfig())
	if s.Add(1, l1) != nil {
		t.Fatal("add")
	}
	for _, n := range []Nexus{nexA, nexB} {
		wantSense(t, s.Execute(ctx, setCmd(0, n, cdbTUR(), 0)), UnitAttention, 0x3F, 0x0E)
	}
}
