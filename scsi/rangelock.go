package scsi

import (
	"sync"

	"github.com/srpd/srpd/scsi/backend"
)

// rangeLock serializes commands that modify overlapping LBA ranges, so that COMPARE AND WRITE
// is atomic against every other write to its range, while writes to disjoint ranges proceed in
// parallel. The mutex guards only the short list of held ranges, never the I/O itself; a
// waiter sleeps on a condition variable until some holder releases. Lock and unlock do not
// allocate once the list has grown to the concurrency the LUN sees.
type rangeLock struct {
	mu      sync.Mutex
	cond    sync.Cond
	held    []heldRange
	waiters int
	nextID  uint64
}

type heldRange struct {
	start, end uint64 // [start, end) in blocks
	id         uint64
}

func (r *rangeLock) init() {
	r.cond.L = &r.mu
	r.held = make([]heldRange, 0, 64)
}

// lock waits until no held range overlaps [start, start+n) and takes it. n == 0 is taken as 1
// so that every lock excludes something.
func (r *rangeLock) lock(start, n uint64) uint64 {
	end := start + max(n, 1)
	if end < start {
		end = ^uint64(0)
	}
	r.mu.Lock()
	for r.overlaps(start, end) {
		r.waiters++
		r.cond.Wait()
		r.waiters--
	}
	r.nextID++
	id := r.nextID
	r.held = append(r.held, heldRange{start, end, id})
	r.mu.Unlock()
	return id
}

func (r *rangeLock) overlaps(start, end uint64) bool {
	for i := range r.held {
		if h := &r.held[i]; h.start < end && start < h.end {
			return true
		}
	}
	return false
}

func (r *rangeLock) unlock(id uint64) {
	r.mu.Lock()
	for i := range r.held {
		if r.held[i].id == id {
			last := len(r.held) - 1
			r.held[i] = r.held[last]
			r.held = r.held[:last]
			break
		}
	}
	if r.waiters > 0 {
		r.cond.Broadcast()
	}
	r.mu.Unlock()
}

// flusher coalesces Backend.Flush calls (group commit): a caller needs a flush that started
// after its write completed; one running flush serves every caller that asked before it
// started. A failed flush fails every caller it would have served, and — since after an
// fdatasync error the kernel may have dropped the dirty pages — every caller still waiting
// for a later one too, so that a write is never acknowledged on the strength of a flush that
// came after a failure.
type flusher struct {
	be      backend.Backend
	mu      sync.Mutex
	cond    sync.Cond
	started uint64 // flushes started
	done    uint64 // flushes completed
	failed  uint64 // number of the last flush that failed (0: none)
	err     error  // its error
	running bool
}

func (f *flusher) init(be backend.Backend) {
	f.be = be
	f.cond.L = &f.mu
}

// flush returns once every write completed before the call is durable.
func (f *flusher) flush() error {
	f.mu.Lock()
	need := f.started + 1
	for f.done < need {
		if !f.running {
			f.running = true
			f.started++
			n := f.started
			f.mu.Unlock()
			err := f.be.Flush()
			f.mu.Lock()
			f.running = false
			f.done = n
			if err != nil {
				f.failed, f.err = n, err
			}
			f.cond.Broadcast()
			continue
		}
		f.cond.Wait()
	}
	var err error
	if f.failed >= need {
		err = f.err
	}
	f.mu.Unlock()
	return err
}
