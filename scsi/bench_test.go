package scsi

import (
	"context"
	"testing"

	"github.com/srpd/srpd/scsi/backend"
)

// benchLUN returns a LUN over the real RAM backend (64 MiB), its data chunks allocated.
func benchLUN(tb testing.TB) *LUN {
	tb.Helper()
	be, err := backend.NewRAM(64<<20, false)
	if err != nil {
		tb.Fatal(err)
	}
	l, err := NewLUN(LUNConfig{Serial: "BENCH"}, be)
	if err != nil {
		tb.Fatal(err)
	}
	clearUA(tb, l, nexA)
	w := &Command{CDB: cdbWrite16(0, 256), Nexus: nexA, DataOut: make([]byte, 256*512)}
	for lba := uint64(0); lba < 1024; lba += 256 {
		w.CDB = cdbWrite16(lba, 256)
		if r := l.Execute(context.Background(), w); r.Status != StatusGood {
			tb.Fatal(r.Sense)
		}
	}
	return l
}

// BenchmarkRead16 is the command path of a 4 KiB READ(16): CDB decode, checks, the RAM
// backend copying into the caller's preallocated buffer.
func BenchmarkRead16(b *testing.B) {
	benchCommand(b, &Command{CDB: cdbRead16(8, 8), Nexus: nexA, DataIn: make([]byte, 4096), Sense: make([]byte, MaxSenseLen)}, 4096)
}

// BenchmarkWrite16 is the same for a 4 KiB WRITE(16) (range lock included).
func BenchmarkWrite16(b *testing.B) {
	benchCommand(b, &Command{CDB: cdbWrite16(8, 8), Nexus: nexA, DataOut: make([]byte, 4096), Sense: make([]byte, MaxSenseLen)}, 0)
}

// benchCommand executes cmd (4 KiB of data) on a benchmark LUN b.N times; each must end GOOD
// with dataIn bytes of data in.
func benchCommand(b *testing.B, cmd *Command, dataIn int) {
	l := benchLUN(b)
	ctx := context.Background()
	b.SetBytes(4096)
	b.ReportAllocs()
	for b.Loop() {
		if r := l.Execute(ctx, cmd); r.Status != StatusGood || r.DataInLen != dataIn {
			b.Fatal(r)
		}
	}
}

// BenchmarkRead16Parallel runs 4 KiB READ(16)s from all Ps at once, to disjoint LBAs.
func BenchmarkRead16Parallel(b *testing.B) {
	l := benchLUN(b)
	ctx := context.Background()
	b.SetBytes(4096)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		cmd := &Command{CDB: cdbRead16(8, 8), Nexus: nexA, DataIn: make([]byte, 4096), Sense: make([]byte, MaxSenseLen)}
		for pb.Next() {
			if r := l.Execute(ctx, cmd); r.Status != StatusGood {
				b.Error(r)
				return
			}
		}
	})
}

// TestIOPathDoesNotAllocate guards the zero-allocation READ/WRITE path (also on the test
// backend, and for ORDERED-free SIMPLE traffic through a LUNSet).
func TestIOPathDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	l := benchLUN(t)
	ml, _ := newTestLUN(t, testConfig())
	s := NewLUNSet()
	if err := s.Add(0, l); err != nil {
		t.Fatal(err)
	}
	clearUA(t, l, nexA)
	ctx := context.Background()
	cases := []struct {
		name string
		l    *LUN
		cmd  *Command
	}{
		{"READ(16) ram", l, &Command{CDB: cdbRead16(8, 8), Nexus: nexA, DataIn: make([]byte, 4096)}},
		{"WRITE(16) ram", l, &Command{CDB: cdbWrite16(8, 8), Nexus: nexA, DataOut: make([]byte, 4096)}},
		{"READ(10) mem", ml, &Command{CDB: cdbRW10(OpRead10, 8, 8, false), Nexus: nexA, DataIn: make([]byte, 4096)}},
		{"WRITE(10) mem", ml, &Command{CDB: cdbRW10(OpWrite10, 8, 8, false), Nexus: nexA, DataOut: make([]byte, 4096)}},
		{"TEST UNIT READY", ml, &Command{CDB: cdbTUR(), Nexus: nexA}},
		{"bad LBA", ml, &Command{CDB: cdbRead16(1<<40, 8), Nexus: nexA, Sense: make([]byte, MaxSenseLen)}},
	}
	for _, c := range cases {
		if n := testing.AllocsPerRun(200, func() { c.l.Execute(ctx, c.cmd) }); n != 0 {
			t.Errorf("%s: %v allocs", c.name, n)
		}
	}
	cmd := &Command{CDB: cdbRead16(8, 8), Nexus: nexA, DataIn: make([]byte, 4096)}
	if n := testing.AllocsPerRun(200, func() { s.Execute(ctx, cmd) }); n != 0 {
		t.Errorf("LUNSet READ(16): %v allocs", n)
	}
}
