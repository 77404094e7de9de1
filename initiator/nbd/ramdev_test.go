package nbd

import (
	"context"
	"sync"
	"sync/atomic"
)

// ramDevice is a RAM-backed Device for tests, with fault injection: hook, when set, runs at
// the start of every call and may delay it, block it, or fail it (its error is returned).
type ramDevice struct {
	mu      sync.RWMutex
	data    []byte
	bs      int
	ro      bool
	discard bool

	hook atomic.Pointer[hookFunc]

	reads, writes, flushes, discards, zeroes atomic.Int64
	fuaWrites, noUnmapZeroes                 atomic.Int64
	active, maxActive                        atomic.Int64
	lastDiscard                              atomic.Pointer[[2]int64]
}

// hookFunc is called with the operation ("read", "write", "flush", "discard", "zeroes"), the
// range and the request's context.
type hookFunc func(ctx context.Context, op string, off, n int64) error

func newRAM(size int64, bs int) *ramDevice {
	return &ramDevice{data: make([]byte, size), bs: bs, discard: true}
}

// holdReads makes every read wait in the device until gate is closed.
func (d *ramDevice) holdReads(gate <-chan struct{}) {
	d.setHook(func(ctx context.Context, op string, off, n int64) error {
		if op == "read" {
			<-gate
		}
		return nil
	})
}

func (d *ramDevice) setHook(h hookFunc) {
	if h == nil {
		d.hook.Store(nil)
		return
	}
	d.hook.Store(&h)
}

func (d *ramDevice) enter(ctx context.Context, op string, off, n int64) error {
	a := d.active.Add(1)
	for {
		m := d.maxActive.Load()
		if a <= m || d.maxActive.CompareAndSwap(m, a) {
			break
		}
	}
	if h := d.hook.Load(); h != nil {
		return (*h)(ctx, op, off, n)
	}
	return nil
}

func (d *ramDevice) leave() { d.active.Add(-1) }

func (d *ramDevice) ReadAt(ctx context.Context, p []byte, off int64) error {
	defer d.leave()
	d.reads.Add(1)
	if err := d.enter(ctx, "read", off, int64(len(p))); err != nil {
		return err
	}
	d.mu.RLock()
	copy(p, d.data[off:])
	d.mu.RUnlock()
	return nil
}

func (d *ramDevice) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	defer d.leave()
	d.writes.Add(1)
	if fua {
		d.fuaWrites.Add(1)
	}
	if err := d.enter(ctx, "write", off, int64(len(p))); err != nil {
		return err
	}
	d.mu.Lock()
	copy(d.data[off:], p)
	d.mu.Unlock()
	return nil
}

func (d *ramDevice) Flush(ctx context.Context) error {
	defer d.leave()
	d.flushes.Add(1)
	return d.enter(ctx, "flush", 0, 0)
}

func (d *ramDevice) Discard(ctx context.Context, off, n int64) error {
	defer d.leave()
	d.discards.Add(1)
	d.lastDiscard.Store(&[2]int64{off, n})
	if err := d.enter(ctx, "discard", off, n); err != nil {
		return err
	}
	d.zero(off, n)
	return nil
}

func (d *ramDevice) WriteZeroes(ctx context.Context, off, n int64, noUnmap bool) error {
	defer d.leave()
	d.zeroes.Add(1)
	if noUnmap {
		d.noUnmapZeroes.Add(1)
	}
	if err := d.enter(ctx, "zeroes", off, n); err != nil {
		return err
	}
	d.zero(off, n)
	return nil
}

func (d *ramDevice) zero(off, n int64) {
	d.mu.Lock()
	clear(d.data[off : off+n])
	d.mu.Unlock()
}

func (d *ramDevice) Size() int64      { return int64(len(d.data)) }
func (d *ramDevice) BlockSize() int   { return d.bs }
func (d *ramDevice) ReadOnly() bool   { return d.ro }
func (d *ramDevice) CanDiscard() bool { return d.discard }

// snapshot returns a copy of [off, off+n).
func (d *ramDevice) snapshot(off, n int64) []byte {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return append([]byte(nil), d.data[off:off+n]...)
}

// fill sets the contents from p at off.
func (d *ramDevice) fill(off int64, p []byte) {
	d.mu.Lock()
	copy(d.data[off:], p)
	d.mu.Unlock()
}
