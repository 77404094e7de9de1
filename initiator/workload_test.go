package initiator

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// model is what every block of a LUN may contain: the IDs of the writes whose data it may hold
// (0: zeroes). A write that succeeded leaves exactly its own ID; a write that failed adds its ID
// to what was possible (its data may or may not have reached the medium); a read narrows the set
// to what it found. Operations on overlapping ranges never run at the same time (range locks),
// so the model is exact for acknowledged writes: any lost or misplaced acknowledged byte shows.
type model struct {
	bs      int
	mu      sync.Mutex
	cond    *sync.Cond
	busy    []bool
	allowed [][]uint64
	nextID  atomic.Uint64
}

func newModel(blocks, bs int) *model {
	m := &model{bs: bs, busy: make([]bool, blocks), allowed: make([][]uint64, blocks)}
	m.cond = sync.NewCond(&m.mu)
	for i := range m.allowed {
		m.allowed[i] = []uint64{0}
	}
	return m
}

func (m *model) lock(lba, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for {
		free := true
		for i := lba; i < lba+n; i++ {
			if m.busy[i] {
				free = false
				break
			}
		}
		if free {
			break
		}
		m.cond.Wait()
	}
	for i := lba; i < lba+n; i++ {
		m.busy[i] = true
	}
}

func (m *model) unlock(lba, n int) {
	m.mu.Lock()
	for i := lba; i < lba+n; i++ {
		m.busy[i] = false
	}
	m.cond.Broadcast()
	m.mu.Unlock()
}

var zeroBlock [4096]byte

var patternTable = func() []byte {
	b := make([]byte, 2048)
	for i := range b {
		b[i] = byte(i*131 ^ i>>3 ^ 0x5a)
	}
	return b
}()

// fill writes the content of write id into p, which starts at block lba.
func (m *model) fill(p []byte, id uint64, lba int) {
	for off := 0; off < len(p); off += m.bs {
		b := p[off : off+m.bs]
		l := uint64(lba + off/m.bs)
		binary.BigEndian.PutUint64(b, id)
		binary.BigEndian.PutUint64(b[8:], l)
		s := int((id*7 + l*13) % 1024)
		copy(b[16:], patternTable[s:])
	}
}

// check verifies what a read of p at lba returned against the model and narrows it.
func (m *model) check(p []byte, lba int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for off := 0; off < len(p); off += m.bs {
		b := p[off : off+m.bs]
		l := lba + off/m.bs
		id := binary.BigEndian.Uint64(b)
		if id == 0 {
			if !bytes.Equal(b, zeroBlock[:m.bs]) {
				return fmt.Errorf("block %d: neither zeroes nor a write's data", l)
			}
		} else {
			s := int((id*7 + uint64(l)*13) % 1024)
			if binary.BigEndian.Uint64(b[8:]) != uint64(l) || !bytes.Equal(b[16:], patternTable[s:s+m.bs-16]) {
				return fmt.Errorf("block %d: corrupt data of write %d (written for block %d)", l, id, binary.BigEndian.Uint64(b[8:]))
			}
		}
		ok := false
		for _, a := range m.allowed[l] {
			if a == id {
				ok = true
				break
			}
		}
		if !ok {
			return fmt.Errorf("block %d: holds write %d, expected one of %v", l, id, m.allowed[l])
		}
		m.allowed[l] = append(m.allowed[l][:0], id)
	}
	return nil
}

// wrote records a write (or zeroing, id 0) of n blocks at lba; certain if it succeeded.
func (m *model) wrote(lba, n int, id uint64, certain bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := lba; i < lba+n; i++ {
		if certain {
			m.allowed[i] = append(m.allowed[i][:0], id)
		} else {
			m.allowed[i] = append(m.allowed[i], id)
		}
	}
}

type workloadOpts struct {
	ops      int   // operations per worker phase
	qds      []int // queue depths (one phase each)
	maxSize  int   // largest I/O in bytes
	mixed    bool  // also Flush, Discard, WriteZeroes, FUA
	tolerate func(error) bool
	stop     <-chan struct{}
}

type workloadStats struct {
	reads, writes, others, failed atomic.Int64
	bytes                         atomic.Int64
}

// runWorkload runs random I/O against l, checking every byte read against m.
func runWorkload(ctx context.Context, t testing.TB, l *LUN, m *model, o workloadOpts) *workloadStats {
	st := &workloadStats{}
	blocks := len(m.busy)
	bs := m.bs
	maxBlocks := o.maxSize / bs
	for _, qd := range o.qds {
		var wg sync.WaitGroup
		errc := make(chan error, qd)
		for w := 0; w < qd; w++ {
			wg.Add(1)
			go func(seed uint64) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, 0x1234))
				buf := make([]byte, o.maxSize)
				for i := 0; i < o.ops; i++ {
					if o.stop != nil {
						select {
						case <-o.stop:
							return
						default:
						}
					}
					// Log-uniform sizes between one block and maxSize.
					n := 1 << rng.IntN(bitsLen(maxBlocks))
					n = min(maxBlocks, n+rng.IntN(n))
					lba := rng.IntN(blocks - n + 1)
					p := buf[:n*bs]
					m.lock(lba, n)
					err := doOp(ctx, l, m, rng, p, lba, n, o.mixed, st)
					m.unlock(lba, n)
					if err != nil {
						if o.tolerate != nil && o.tolerate(err) {
							st.failed.Add(1)
							continue
						}
						errc <- err
						return
					}
				}
			}(rand.Uint64())
		}
		wg.Wait()
		close(errc)
		if err := <-errc; err != nil {
			t.Fatalf("workload at QD %d: %v", qd, err)
		}
	}
	return st
}

func bitsLen(n int) int {
	k := 0
	for 1<<k <= n {
		k++
	}
	return k
}

func doOp(ctx context.Context, l *LUN, m *model, rng *rand.Rand, p []byte, lba, n int, mixed bool, st *workloadStats) error {
	bs := m.bs
	off := int64(lba) * int64(bs)
	r := rng.IntN(100)
	switch {
	case r < 45:
		if err := l.ReadAt(ctx, p, off); err != nil {
			return fmt.Errorf("read %d+%d: %w", lba, n, err)
		}
		st.reads.Add(1)
		st.bytes.Add(int64(len(p)))
		if err := m.check(p, lba); err != nil {
			return fmt.Errorf("read %d+%d: %w", lba, n, err)
		}
	case r < 90 || !mixed:
		id := m.nextID.Add(1)
		m.fill(p, id, lba)
		err := l.WriteAt(ctx, p, off, mixed && r%7 == 0)
		m.wrote(lba, n, id, err == nil)
		if err != nil {
			return fmt.Errorf("write %d+%d: %w", lba, n, err)
		}
		st.writes.Add(1)
		st.bytes.Add(int64(len(p)))
	case r < 93:
		st.others.Add(1)
		if err := l.Flush(ctx); err != nil {
			return fmt.Errorf("flush: %w", err)
		}
	case r < 96:
		st.others.Add(1)
		err := l.Discard(ctx, off, int64(len(p)))
		m.wrote(lba, n, 0, err == nil)
		if err != nil {
			return fmt.Errorf("discard %d+%d: %w", lba, n, err)
		}
	default:
		st.others.Add(1)
		err := l.WriteZeroes(ctx, off, int64(len(p)), r%2 == 0)
		m.wrote(lba, n, 0, err == nil)
		if err != nil {
			return fmt.Errorf("write zeroes %d+%d: %w", lba, n, err)
		}
	}
	return nil
}

// verifyAll reads the whole LUN and checks it against the model.
func verifyAll(ctx context.Context, t testing.TB, l *LUN, m *model) {
	t.Helper()
	const chunk = 1 << 20
	size := int(l.Size())
	var wg sync.WaitGroup
	errs := make(chan error, size/chunk+1)
	sem := make(chan struct{}, 8)
	for off := 0; off < size; off += chunk {
		wg.Add(1)
		sem <- struct{}{}
		go func(off int) {
			defer wg.Done()
			defer func() { <-sem }()
			n := min(chunk, size-off)
			p := make([]byte, n)
			if err := l.ReadAt(ctx, p, int64(off)); err != nil {
				errs <- err
				return
			}
			if err := m.check(p, off/m.bs); err != nil {
				errs <- err
			}
		}(off)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("final verification: %v", err)
	}
}

var _ = errors.Is

// scaled shortens workloads under the race detector (about ten times slower).
func scaled(n int) int {
	if raceEnabled {
		return max(1, n/3)
	}
	return n
}
