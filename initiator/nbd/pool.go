package nbd

import (
	"math/bits"
	"sync"
)

// buffer is a data buffer for one request: b[:replyHeadroom] is room for the reply header, so
// a read reply goes out in one write; the payload is b[replyHeadroom:replyHeadroom+n].
type buffer struct {
	b     []byte
	class int
}

// payload returns the first n payload bytes.
func (b *buffer) payload(n int) []byte { return b.b[replyHeadroom : replyHeadroom+n] }

// minBufShift is log2 of the smallest size class (4 KiB).
const minBufShift = 12

// bufPool hands out request buffers in power-of-two size classes from 4 KiB to the maximum
// request size. It never holds more than budget bytes (counted by class size) in buffers, in
// use or free: a free buffer is kept for reuse, so a steady workload allocates nothing, and a
// request that does not fit takes free buffers of other classes out of the pool (for the GC)
// or, when every byte is in use, waits for a put. Safe for concurrent use.
type bufPool struct {
	mu        sync.Mutex
	budget    int64
	allocated int64
	free      [][]*buffer // per class, a stack
	waiters   []chan struct{}
}

func newBufPool(budget int64, maxSize int) *bufPool {
	return &bufPool{budget: budget, free: make([][]*buffer, sizeClass(maxSize)+1)}
}

// sizeClass returns the class of an n-byte buffer (n ≥ 1).
func sizeClass(n int) int {
	if n <= 1<<minBufShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minBufShift
}

func classBytes(c int) int64 { return 1 << (minBufShift + c) }

// get returns a buffer of at least n (1 ≤ n ≤ the pool's maximum) bytes. When the budget is
// used up it waits, registering wake (a channel with capacity 1 owned by the caller) for a put,
// until stop is closed; then it returns nil. beforeWait, if not nil, is called before each
// wait (the caller's chance to give back what it holds).
func (p *bufPool) get(n int, wake chan struct{}, stop <-chan struct{}, beforeWait func()) *buffer {
	c := sizeClass(n)
	size := classBytes(c)
	for {
		p.mu.Lock()
		if k := len(p.free[c]); k > 0 {
			b := p.free[c][k-1]
			p.free[c][k-1] = nil
			p.free[c] = p.free[c][:k-1]
			p.mu.Unlock()
			return b
		}
		// Make room by dropping free buffers of other classes, largest first.
		for o := len(p.free) - 1; o >= 0 && p.allocated+size > p.budget; o-- {
			for len(p.free[o]) > 0 && p.allocated+size > p.budget {
				k := len(p.free[o])
				p.free[o][k-1] = nil
				p.free[o] = p.free[o][:k-1]
				p.allocated -= classBytes(o)
			}
		}
		if p.allocated+size <= p.budget {
			p.allocated += size
			p.mu.Unlock()
			return &buffer{b: make([]byte, replyHeadroom+int(size)), class: c}
		}
		p.waiters = append(p.waiters, wake)
		p.mu.Unlock()
		if beforeWait != nil {
			beforeWait()
		}
		select {
		case <-wake:
		case <-stop:
			return nil
		}
	}
}

// put returns b to the pool and wakes every waiter (the sends never block: each wake channel
// has room for one token, and a token already there will do).
func (p *bufPool) put(b *buffer) {
	p.mu.Lock()
	p.free[b.class] = append(p.free[b.class], b)
	for i, ch := range p.waiters {
		select {
		case ch <- struct{}{}:
		default:
		}
		p.waiters[i] = nil
	}
	p.waiters = p.waiters[:0]
	p.mu.Unlock()
}

// stats returns the bytes held in buffers (in use or free) and the budget.
func (p *bufPool) stats() (allocated, budget int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.allocated, p.budget
}
