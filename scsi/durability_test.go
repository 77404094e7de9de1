package scsi

import (
	"bytes"
	"context"
	"sync"
	"testing"
)

// The memBackend's durable image is what a crash would leave: the data as of the last Flush.
// A write acknowledged with GOOD must be in it whenever FUA or WCE=0 asked for durability, and
// everything acknowledged before a SYNCHRONIZE CACHE must be in it once that returns GOOD.

func durable(m *memBackend, lba uint64, n int) []byte {
	return m.snapshot(int64(lba)*512, int64(n)*512, true)
}

func TestDurabilityFUA(t *testing.T) {
	write := map[string][]byte{
		"WRITE(10)":         cdbRW10(OpWrite10, 8, 2, true),
		"WRITE(12)":         cdbRW12(OpWrite12, 8, 2, true),
		"WRITE(16)":         cdbRW16(OpWrite16, 8, 2, true),
		"COMPARE AND WRITE": func() []byte { c := cdbCAW(8, 2); c[1] |= 0x08; return c }(),
	}
	for name, cdb := range write {
		t.Run(name, func(t *testing.T) {
			l, m := newTestLUN(t, testConfig())
			data := fill(1024, 0x77)
			out := data
			if cdb[0] == OpCompareAndWrite {
				out = append(make([]byte, 1024), data...)
			}
			// without FUA, with the write cache on: acknowledged but not yet durable
			plain := bytes.Clone(cdb)
			plain[1] &^= 0x08
			r, _ := do(l, nexA, plain, out, 0)
			wantGood(t, r)
			if m.flushes.Load() != 0 || bytes.Equal(durable(m, 8, 2), data) {
				t.Fatal("write without FUA flushed")
			}
			if cdb[0] == OpCompareAndWrite {
				out = append(bytes.Clone(data), data...)
			}
			r, _ = do(l, nexA, cdb, out, 0)
			wantGood(t, r)
			if m.flushes.Load() != 1 || !bytes.Equal(durable(m, 8, 2), data) {
				t.Fatalf("FUA write not durable at GOOD status (%d flushes)", m.flushes.Load())
			}
		})
	}
}

func TestDurabilityWriteCacheDisabled(t *testing.T) {
	cfg := testConfig()
	cfg.DisableWriteCache = true
	l, m := newTestLUN(t, cfg)
	steps := []struct {
		cdb []byte
		out []byte
		lba uint64
		n   int
		b   byte
	}{
		{cdbRW6(OpWrite6, 1, 1), fill(512, 1), 1, 1, 1},
		{cdbRW10(OpWrite10, 2, 1, false), fill(512, 2), 2, 1, 2},
		{cdbRW12(OpWrite12, 3, 1, false), fill(512, 3), 3, 1, 3},
		{cdbWrite16(4, 1), fill(512, 4), 4, 1, 4},
		{cdbCAW(5, 1), append(make([]byte, 512), fill(512, 5)...), 5, 1, 5},
		{cdbWriteSame16(6, 4, false, false), fill(512, 6), 6, 4, 6},
		{cdbWriteSame16(1, 1, true, false), make([]byte, 512), 1, 1, 0},
		{cdbUnmap(24), unmapParams([2]uint64{2, 1}), 2, 1, 0},
	}
	for i, s := range steps {
		before := m.flushes.Load()
		r, _ := do(l, nexA, s.cdb, s.out, 0)
		wantGood(t, r)
		if m.flushes.Load() != before+1 || !bytes.Equal(durable(m, s.lba, s.n), fill(s.n*512, s.b)) {
			t.Fatalf("step %d: not durable at GOOD status with WCE=0", i)
		}
	}
	// MODE SELECT turning the cache on stops the per-write flushes.
	mustGood(t, l, cdbModeSelect6(24), modeSelectCaching(true, false))
	before := m.flushes.Load()
	mustGood(t, l, cdbWrite16(9, 1), fill(512, 9))
	if m.flushes.Load() != before {
		t.Fatal("flushed with WCE=1")
	}
}

func TestDurabilitySynchronizeCache(t *testing.T) {
	l, m := newTestLUN(t, testConfig())
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			cmd := &Command{CDB: cdbWrite16(uint64(w*16), 16), Nexus: nexA, DataOut: fill(16*512, byte(w+1))}
			if r := l.Execute(context.Background(), cmd); r.Status != StatusGood {
				t.Error(r.Sense)
			}
		})
	}
	wg.Wait()
	if m.flushes.Load() != 0 {
		t.Fatal("flushed early")
	}
	mustGood(t, l, cdbSync16(0, 0), nil)
	for w := range 8 {
		if !bytes.Equal(durable(m, uint64(w*16), 16), fill(16*512, byte(w+1))) {
			t.Fatalf("writer %d not durable after SYNCHRONIZE CACHE", w)
		}
	}
}

// TestFlushCoalescing: concurrent FUA writes share flushes, and each is durable at GOOD.
func TestFlushCoalescing(t *testing.T) {
	l, m := newTestLUN(t, testConfig())
	gate := make(chan struct{})
	var once sync.Once
	m.hook = func(op byte, off int64, _ int) {
		if op == 'w' && off == 0 {
			once.Do(func() { <-gate })
		}
	}
	const n = 16
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			lba := uint64(w)
			cmd := &Command{CDB: cdbRW16(OpWrite16, lba, 1, true), Nexus: nexA, DataOut: fill(512, byte(w+1))}
			if r := l.Execute(context.Background(), cmd); r.Status != StatusGood {
				t.Error(r.Sense)
				return
			}
			if !bytes.Equal(durable(m, lba, 1), fill(512, byte(w+1))) {
				t.Errorf("lba %d not durable at GOOD", lba)
			}
		})
	}
	close(gate)
	wg.Wait()
	if f := m.flushes.Load(); f < 1 || f > n {
		t.Fatalf("%d flushes for %d FUA writes", f, n)
	}
	t.Logf("%d flushes for %d FUA writes", m.flushes.Load(), n)
}

// TestFlushFailureSticks: once a flush fails, no write waiting for it is acknowledged.
func TestFlushFailureSticks(t *testing.T) {
	l, m := newTestLUN(t, testConfig())
	m.flushErr.Store(true)
	r, _ := do(l, nexA, cdbRW16(OpWrite16, 0, 1, true), fill(512, 1), 0)
	wantSense(t, r, MediumError, 0x0C, 0)
	m.flushErr.Store(false)
	r, _ = do(l, nexA, cdbRW16(OpWrite16, 0, 1, true), fill(512, 1), 0)
	wantGood(t, r)
}
