package nbd

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// buffer is a data buffer for one request: b[:replyHeadroom] is room for the reply header, so
// a read reply goes out in one write; the payload is b[replyHeadroom:replyHeadroom+n].
type buffer struct {
	b       []byte
	class   int
	reserve bool   // counted in the pool's reserve (bufPool.resInUse) while handed out
	free    func() // gives Allocator memory back; nil for Go heap memory
}

// release gives the buffer's memory back (Allocator memory at once, the heap's to the GC).
func (b *buffer) release() {
	if b.free != nil {
		b.free()
		b.free = nil
	}
	b.b = nil
}

// Allocator provides memory the Device reaches without a copy (an RDMA initiator's registered
// memory: initiator.NBDAllocator) for the server's larger request buffers.
type Allocator interface {
	// Alloc returns at least n bytes starting on a page boundary, and the function that gives
	// them back (called once, when the server no longer needs them).
	Alloc(n int) (b []byte, free func(), err error)
}

// allocMinClass is the smallest size class taken from Config.Allocator (32 KiB): below it a
// copy costs little and the page kept in front of the payload (so that the payload is
// page-aligned, as the Device's direct mapping needs) would cost a fifth or more of the buffer.
const allocMinClass = 3

// allocPage is the room kept in front of an Allocator buffer's payload: the reply header sits
// at its end, the payload starts on the page boundary after it.
const allocPage = 4096

// payload returns the first n payload bytes.
func (b *buffer) payload(n int) []byte { return b.b[replyHeadroom : replyHeadroom+n] }

// minBufShift is log2 of the smallest size class (4 KiB).
const minBufShift = 12

// bufPool hands out request buffers in power-of-two size classes from 4 KiB to the maximum
// request size. It never holds more than budget bytes (counted by class size) in buffers, in
// use or free: a free buffer is kept for reuse, so a steady workload allocates nothing, and a
// request that does not fit takes free buffers of other classes out of the pool (for the GC)
// or, when every byte is in use, waits for a put. Safe for concurrent use.
//
// The budget is in two parts: shared (budget - reserve) for every connection, and the reserve
// for connections that hold little: a get by a connection that will then hold at most
// smallMax bytes is served from the reserve when the shared part is in use. Connections that
// stop reading their replies keep their buffers until the write deadline closes them; this way
// they can take the shared part, plus at most smallMax each of the reserve, and with
// reserve ≥ MaxConnections × smallMax a connection holding at most smallMax always finds room
// at once, whatever the others hold.
type bufPool struct {
	mu        sync.Mutex
	budget    int64
	shared    int64 // budget - reserve: the bytes in use that big holders may take together
	smallMax  int64 // a connection holding at most this (with the new buffer) may use the reserve
	allocated int64
	inUse     int64       // bytes of the buffers handed out (allocated - the free ones)
	resInUse  int64       // the part of inUse counted in the reserve
	free      [][]*buffer // per class, a stack
	waiters   []chan struct{}
	alloc     Allocator    // nil: every buffer from the heap
	allocErrs atomic.Int64 // Allocator failures (the heap served instead)
}

// reserveShare is the part of the budget kept for connections that hold little (1/reserveShare).
const reserveShare = 4

// newBufPool returns a pool of budget bytes for requests of up to maxSize bytes, with a
// reserve (a quarter of the budget, less if the budget holds less than a maximum-size buffer
// beyond it) for connections holding at most reserve/maxConns bytes.
func newBufPool(budget int64, maxSize int, maxConns int, alloc Allocator) *bufPool {
	maxBuf := classBytes(sizeClass(maxSize))
	reserve := min(budget/reserveShare, budget-maxBuf) // a maximum-size request must fit in shared
	reserve = max(reserve, 0)
	var smallMax int64
	if maxConns > 0 {
		smallMax = reserve / int64(maxConns)
	}
	if smallMax < classBytes(0) {
		// Not even one smallest buffer each: no reserve, everyone shares the whole budget.
		reserve, smallMax = 0, 0
	}
	return &bufPool{budget: budget, shared: budget - reserve, smallMax: smallMax,
		free: make([][]*buffer, sizeClass(maxSize)+1), alloc: alloc}
}

// newBuffer makes a buffer of class c: from the Allocator for the larger classes (falling
// back to the heap if it fails), else from the heap. Called without p.mu: an Allocator maps
// memory (a system call), which must not hold up the other connections' gets and puts.
func (p *bufPool) newBuffer(c int) *buffer {
	size := int(classBytes(c))
	if p.alloc != nil && c >= allocMinClass {
		m, free, err := p.alloc.Alloc(allocPage + size)
		if err == nil && len(m) >= allocPage+size {
			return &buffer{b: m[allocPage-replyHeadroom : allocPage+size : allocPage+size], class: c, free: free}
		}
		if err == nil {
			free()
		}
		p.allocErrs.Add(1)
	}
	return &buffer{b: make([]byte, replyHeadroom+size), class: c}
}

// releaseFree drops the Allocator buffers that are not in use (the server has no connection
// left, or shuts down): device memory is not kept for a client that may never come back.
func (p *bufPool) releaseFree() {
	var drop []*buffer
	p.mu.Lock()
	for c := range p.free {
		k := 0
		for _, b := range p.free[c] {
			if b.free == nil {
				p.free[c][k] = b
				k++
				continue
			}
			drop = append(drop, b)
			p.allocated -= classBytes(c)
		}
		clear(p.free[c][k:])
		p.free[c] = p.free[c][:k]
	}
	p.mu.Unlock()
	for _, b := range drop {
		b.release() // unmaps: outside p.mu, as newBuffer maps
	}
}

// sizeClass returns the class of an n-byte buffer (n ≥ 1).
func sizeClass(n int) int {
	if n <= 1<<minBufShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minBufShift
}

func classBytes(c int) int64 { return 1 << (minBufShift + c) }

// get returns a buffer of at least n (1 ≤ n ≤ the pool's maximum) bytes for a connection that
// will hold holding() bytes with it (the new buffer's class size included), which decides
// whether the reserve may serve it; holding is asked again after each wait, since the
// connection's own releases (a reply written meanwhile) change it. When there is no room it waits, registering wake (a
// channel with capacity 1 owned by the caller) for a put, until stop is closed; then it
// returns nil. beforeWait, if not nil, is called before each wait (the caller's chance to
// give back what it holds).
func (p *bufPool) get(n int, holding func() int64, wake chan struct{}, stop <-chan struct{}, beforeWait func()) *buffer {
	c := sizeClass(n)
	size := classBytes(c)
	for {
		p.mu.Lock()
		var drop []*buffer
		fromReserve := false
		fits := p.inUse-p.resInUse+size <= p.shared
		if !fits && holding() <= p.smallMax && p.resInUse+size <= p.budget-p.shared {
			fits, fromReserve = true, true
		}
		if fits {
			if k := len(p.free[c]); k > 0 {
				b := p.free[c][k-1]
				p.free[c][k-1] = nil
				p.free[c] = p.free[c][:k-1]
				p.take(b, fromReserve)
				p.mu.Unlock()
				return b
			}
			// Make room by dropping free buffers of other classes, largest first (released
			// once p.mu is let go). inUse + size ≤ budget, so the free ones make enough room.
			for o := len(p.free) - 1; o >= 0 && p.allocated+size > p.budget; o-- {
				for len(p.free[o]) > 0 && p.allocated+size > p.budget {
					k := len(p.free[o])
					drop = append(drop, p.free[o][k-1])
					p.free[o][k-1] = nil
					p.free[o] = p.free[o][:k-1]
					p.allocated -= classBytes(o)
				}
			}
			fits = p.allocated+size <= p.budget
		}
		if fits {
			p.allocated += size // reserved: the buffer is made outside p.mu
			p.inUse += size
			if fromReserve {
				p.resInUse += size
			}
		} else {
			p.waiters = append(p.waiters, wake)
		}
		p.mu.Unlock()
		for _, b := range drop {
			b.release()
		}
		if fits {
			b := p.newBuffer(c)
			b.reserve = fromReserve
			return b
		}
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

// take counts free buffer b as handed out (p.mu held).
func (p *bufPool) take(b *buffer, fromReserve bool) {
	size := classBytes(b.class)
	p.inUse += size
	b.reserve = fromReserve
	if fromReserve {
		p.resInUse += size
	}
}

// put returns b to the pool and wakes every waiter (the sends never block: each wake channel
// has room for one token, and a token already there will do).
func (p *bufPool) put(b *buffer) {
	p.mu.Lock()
	p.free[b.class] = append(p.free[b.class], b)
	p.inUse -= classBytes(b.class)
	if b.reserve {
		p.resInUse -= classBytes(b.class)
		b.reserve = false
	}
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

// stats returns the bytes held in buffers (in use or free), the bytes in use and the budget.
func (p *bufPool) stats() (allocated, inUse, budget int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.allocated, p.inUse, p.budget
}
