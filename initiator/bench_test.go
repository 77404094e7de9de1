package initiator

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/srpd/srpd/target"
	"github.com/srpd/srpd/transport/softroce/link"
)

// benchEnv is an initiator session to the srpd target over softroce on UDP loopback, with a
// 64 MiB RAM LUN; noRemoteInv does not offer srpd's remote invalidation (every registration is
// then invalidated with a LOCAL_INV).
func benchEnv(b *testing.B, chs int, noRemoteInv bool) *LUN {
	e := newRealEnv(b, true, link.PipeConfig{}, target.Limits{QueueDepth: 128}, 1, 64<<20)
	cfg := e.config()
	cfg.QueueDepth = 64
	cfg.ChCount = chs
	cfg.DisableRemoteInvalidate = noRemoteInv
	cfg.MaxIOSize = 1 << 20
	s := e.dial(cfg)
	l := s.LUNs()[0]
	// Touch the whole LUN so that reads hit allocated RAM.
	buf := make([]byte, 1<<20)
	for off := int64(0); off < l.Size(); off += int64(len(buf)) {
		if err := l.WriteAt(context.Background(), buf, off, false); err != nil {
			b.Fatal(err)
		}
	}
	return l
}

func benchIO(b *testing.B, l *LUN, size, qd int, write, seq bool) {
	ctx := context.Background()
	blocks := int(l.Size()) / size
	b.SetBytes(int64(size))
	var next atomic.Int64
	op := func(p []byte, i int64) {
		off := (i * 7919 % int64(blocks)) * int64(size)
		if seq {
			off = (i % int64(blocks)) * int64(size)
		}
		var err error
		if write {
			err = l.WriteAt(ctx, p, off, false)
		} else {
			err = l.ReadAt(ctx, p, off)
		}
		if err != nil {
			b.Error(err)
		}
	}
	// Warm up: every slot, MR and buffer touched once.
	buf := make([]byte, size)
	for i := 0; i < 256; i++ {
		op(buf, int64(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	if qd == 1 {
		for i := 0; i < b.N; i++ {
			op(buf, int64(i))
		}
		return
	}
	b.SetParallelism((qd + 1) / 2) // GOMAXPROCS 2 on the build machine: qd goroutines
	b.RunParallel(func(pb *testing.PB) {
		p := make([]byte, size)
		for pb.Next() {
			op(p, next.Add(1))
		}
	})
}

// BenchmarkBlockIO: 4 KiB random reads at QD 1 and 32, 128 KiB sequential reads and writes at
// QD 1 and 8, through the block API, over softroce on UDP loopback, against the srpd target;
// each with srpd's remote invalidation (SEND_WITH_INV responses, the default) and without it
// (LOCAL_INV), interleaved when run with -count:
//
//	go test -run '^$' -bench BlockIO -benchmem -count 6 ./initiator/ | tee /tmp/b.txt
//	benchstat -col /inv /tmp/b.txt
func BenchmarkBlockIO(b *testing.B) {
	for _, c := range []struct {
		name       string
		size, qd   int
		write, seq bool
	}{
		{"read-4k-qd1", 4 << 10, 1, false, false},
		{"read-4k-qd32", 4 << 10, 32, false, false},
		{"write-4k-qd1", 4 << 10, 1, true, false},
		{"seqread-128k-qd1", 128 << 10, 1, false, true},
		{"seqwrite-128k-qd1", 128 << 10, 1, true, true},
		{"seqread-128k-qd8", 128 << 10, 8, false, true},
		{"seqwrite-128k-qd8", 128 << 10, 8, true, true},
	} {
		for _, inv := range []string{"remote", "local"} {
			b.Run(c.name+"/inv="+inv, func(b *testing.B) {
				l := benchEnv(b, 1, inv == "local")
				benchIO(b, l, c.size, c.qd, c.write, c.seq)
			})
		}
	}
}

// TestSteadyStateAllocs: once warm, a block I/O allocates nothing (initiator, softroce and the
// srpd target together, as the allocation counter sees the whole process).
func TestSteadyStateAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	e := newRealEnv(t, false, link.PipeConfig{}, target.Limits{}, 1, 32<<20)
	cfg := e.config()
	cfg.MaxIOSize = 256 << 10
	s := e.dial(cfg)
	l := s.LUNs()[0]
	ctx := context.Background()
	errc := make(chan error, 1)
	done := func(err error) { errc <- err }
	for _, c := range []struct {
		name  string
		size  int
		write bool
		async bool
	}{{"read-4k", 4 << 10, false, false}, {"write-4k-imm", 4 << 10, true, false}, {"write-64k", 64 << 10, true, false},
		{"read-256k", 256 << 10, false, false}, {"read-1m-split", 1 << 20, false, false},
		{"async-read-4k", 4 << 10, false, true}, {"async-write-64k", 64 << 10, true, true}} {
		p := make([]byte, c.size)
		i := 0
		f := func() {
			off := int64(i%16) * int64(c.size)
			i++
			var err error
			switch {
			case c.async && c.write:
				l.WriteAtAsync(ctx, p, off, false, done)
				err = <-errc
			case c.async:
				l.ReadAtAsync(ctx, p, off, done)
				err = <-errc
			case c.write:
				err = l.WriteAt(ctx, p, off, false)
			default:
				err = l.ReadAt(ctx, p, off)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		for k := 0; k < 200; k++ {
			f()
		}
		if a := testing.AllocsPerRun(500, f); a > 0.05 {
			t.Errorf("%s: %.2f allocations per I/O", c.name, a)
		}
	}
	var _ = fmt.Sprint
}
