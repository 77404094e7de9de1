package backend

import (
	"fmt"
	"sync"
	"sync/atomic"
)

const (
	// ramChunkShift sets the RAM backend's allocation unit: 64 KiB. Smaller chunks make
	// discard reclaim memory at a finer grain; larger ones shrink the chunk table (8 bytes per
	// chunk whether allocated or not: 128 MiB of table for a 1 TiB RAM disk).
	ramChunkShift = 16
	ramChunkSize  = 1 << ramChunkShift
	// ramMaxChunks bounds the chunk table (1 GiB of pointers, an 8 TiB RAM disk).
	ramMaxChunks = 1 << 27
)

// RAM is a sparse, memory-backed Backend. Memory is allocated in 64 KiB chunks on the first write
// to each chunk; never-written and discarded chunks read as zeroes and cost only their table
// entry. Each chunk has its own RWMutex, so accesses to different chunks never contend and reads
// of one chunk run in parallel; ReadAt and WriteAt do not allocate once a chunk exists.
//
// The content is lost on Close. Flush is a no-op.
type RAM struct {
	size     atomic.Int64 // Resize grows it, within the chunk table
	readOnly bool
	closed   atomic.Bool
	// chunks[i] covers [i*ramChunkSize, (i+1)*ramChunkSize); nil = all zeroes. A chunk removed
	// from the table is marked dead under its lock first, so a goroutine that loaded the pointer
	// before the removal notices and retries instead of writing into an orphan.
	chunks []atomic.Pointer[ramChunk]
	// zeros backs the views of never-written ranges (ViewAt); nobody writes into it.
	zeros []byte
}

type ramChunk struct {
	mu   sync.RWMutex
	dead bool // removed from the table; guarded by mu
	data []byte
}

var (
	_ Backend     = (*RAM)(nil)
	_ Nonblocking = (*RAM)(nil)
	_ Viewer      = (*RAM)(nil)
)

// NewRAM returns a RAM backend of size bytes, all zeroes. A read-only RAM backend stays all zeroes
// (every mutating call fails with ErrReadOnly); it is mostly useful for tests.
func NewRAM(size int64, readOnly bool) (*RAM, error) {
	if size <= 0 {
		return nil, fmt.Errorf("backend ram: size %d: %w", size, ErrInvalidSize)
	}
	n := (size + ramChunkSize - 1) >> ramChunkShift
	if n > ramMaxChunks {
		return nil, fmt.Errorf("backend ram: size %d exceeds the maximum %d: %w",
			size, int64(ramMaxChunks)<<ramChunkShift, ErrInvalidSize)
	}
	r := &RAM{readOnly: readOnly, chunks: make([]atomic.Pointer[ramChunk], ramTableLen(n)), zeros: make([]byte, ramChunkSize)}
	r.size.Store(size)
	return r, nil
}

// Nonblocking reports true: RAM accesses copy memory under per-chunk locks and never wait for
// I/O (see the Nonblocking interface).
func (r *RAM) Nonblocking() bool { return true }

// Size returns the capacity in bytes.
func (r *RAM) Size() int64 { return r.size.Load() }

// Info describes the backend: Kind "ram", CanDiscard and DiscardZeroes true (also when read-only:
// they describe the medium), non-rotational, PhysicalBlockSize 0 (RAM has no block it prefers;
// the 64 KiB chunk is only the unit in which discards free memory).
func (r *RAM) Info() Info {
	return Info{Kind: "ram", ReadOnly: r.readOnly, CanDiscard: true, DiscardZeroes: true}
}

// ReadAt reads len(p) bytes at off. Never-written chunks read as zeroes without allocating.
func (r *RAM) ReadAt(p []byte, off int64) (int, error) { return r.access("read", p, off, false) }

// access copies between p and the chunks that [off, off+len(p)) spans.
func (r *RAM) access(op string, p []byte, off int64, write bool) (int, error) {
	if err := r.check(op, off, int64(len(p)), write); err != nil {
		return 0, err
	}
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		i, o := pos>>ramChunkShift, int(pos&(ramChunkSize-1))
		m := min(len(p)-done, ramChunkSize-o)
		if write {
			r.writeChunk(i, o, p[done:done+m])
		} else {
			r.readChunk(i, o, p[done:done+m])
		}
		done += m
	}
	return done, nil
}

func (r *RAM) readChunk(i int64, o int, dst []byte) {
	for {
		c := r.chunks[i].Load()
		if c == nil {
			clear(dst)
			return
		}
		c.mu.RLock()
		if !c.dead {
			copy(dst, c.data[o:])
			c.mu.RUnlock()
			return
		}
		c.mu.RUnlock() // discarded meanwhile: look again
	}
}

// ViewAt lends the chunks' memory for [off, off+n) (Viewer): one view per chunk touched, the
// shared zero chunk for those never written. A chunk discarded later keeps its bytes for the
// views that hold it (a write after a discard allocates a new one), so a view never shows
// another range's data.
func (r *RAM) ViewAt(views [][]byte, off int64, n int) (int, bool, error) {
	if err := r.check("read", off, int64(n), false); err != nil {
		return 0, false, err
	}
	views = views[:cap(views)]
	k := 0
	for done := 0; done < n; k++ {
		if k == len(views) {
			return 0, false, nil
		}
		pos := off + int64(done)
		i, o := pos>>ramChunkShift, int(pos&(ramChunkSize-1))
		m := min(n-done, ramChunkSize-o)
		views[k] = r.viewChunk(i, o, m)
		done += m
	}
	return k, true, nil
}

func (r *RAM) viewChunk(i int64, o, m int) []byte {
	for {
		c := r.chunks[i].Load()
		if c == nil {
			return r.zeros[:m:m]
		}
		c.mu.RLock()
		dead := c.dead
		c.mu.RUnlock()
		if !dead {
			return c.data[o : o+m : o+m]
		}
		// discarded meanwhile: look again
	}
}

// WriteAt writes len(p) bytes at off, allocating the chunks it touches for the first time.
func (r *RAM) WriteAt(p []byte, off int64) (int, error) { return r.access("write", p, off, true) }

func (r *RAM) writeChunk(i int64, o int, src []byte) {
	for {
		c := r.chunks[i].Load()
		if c == nil {
			nc := &ramChunk{data: make([]byte, ramChunkSize)}
			if !r.chunks[i].CompareAndSwap(nil, nc) {
				continue // another writer installed one first: use theirs
			}
			c = nc
		}
		c.mu.Lock()
		if !c.dead {
			copy(c.data[o:], src)
			c.mu.Unlock()
			return
		}
		c.mu.Unlock() // discarded meanwhile: allocate afresh
	}
}

// Flush is a no-op: RAM has nothing to make durable.
func (r *RAM) Flush() error {
	if r.closed.Load() {
		return fmt.Errorf("backend ram: flush: %w", ErrClosed)
	}
	return nil
}

// Discard frees the chunks that lie entirely inside [off, off+n) and zeroes the partial chunks at
// either end, so the whole range reads as zeroes afterwards.
func (r *RAM) Discard(off, n int64) error {
	if err := r.check("discard", off, n, true); err != nil {
		return err
	}
	r.zeroRange(off, n)
	return nil
}

// WriteZeroes is Discard: dropping a chunk is the cheapest way to make it read as zeroes.
func (r *RAM) WriteZeroes(off, n int64) error {
	if err := r.check("write zeroes", off, n, true); err != nil {
		return err
	}
	r.zeroRange(off, n)
	return nil
}

func (r *RAM) zeroRange(off, n int64) {
	end := off + n
	for pos := off; pos < end; {
		i, o := pos>>ramChunkShift, pos&(ramChunkSize-1)
		m := min(end-pos, ramChunkSize-o)
		last := pos+m == r.size.Load() // the tail chunk of a size that is not a multiple of the chunk
		if m == ramChunkSize || (o == 0 && last) {
			r.dropChunk(i)
		} else {
			r.clearChunk(i, int(o), int(o+m))
		}
		pos += m
	}
}

func (r *RAM) dropChunk(i int64) {
	c := r.chunks[i].Load()
	if c == nil {
		return
	}
	c.mu.Lock()
	if !c.dead {
		c.dead = true
		r.chunks[i].CompareAndSwap(c, nil)
	}
	c.mu.Unlock()
}

func (r *RAM) clearChunk(i int64, from, to int) {
	c := r.chunks[i].Load()
	if c == nil {
		return // reads as zeroes already
	}
	c.mu.Lock()
	if !c.dead {
		clear(c.data[from:to])
	}
	c.mu.Unlock()
}

// Close drops all memory. Later calls fail with ErrClosed, and so does a second Close.
func (r *RAM) Close() error {
	if !r.closed.CompareAndSwap(false, true) {
		return fmt.Errorf("backend ram: close: %w", ErrClosed)
	}
	for i := range r.chunks {
		r.chunks[i].Store(nil)
	}
	return nil
}

// allocatedChunks counts the chunks holding memory (tests only).
func (r *RAM) allocatedChunks() int {
	n := 0
	for i := range r.chunks {
		if r.chunks[i].Load() != nil {
			n++
		}
	}
	return n
}

// check validates a call in the order closed, read-only (for mutating calls), range.
func (r *RAM) check(op string, off, n int64, mutating bool) error {
	if r.closed.Load() {
		return ramError(op, off, n, ErrClosed)
	}
	if mutating && r.readOnly {
		return ramError(op, off, n, ErrReadOnly)
	}
	if !inRange(off, n, r.size.Load()) {
		return ramError(op, off, n, ErrOutOfRange)
	}
	return nil
}

func ramError(op string, off, n int64, err error) error {
	return fmt.Errorf("backend ram: %s [%d, +%d): %w", op, off, n, err)
}
