package softroce

import (
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/srpd/srpd/transport"
)

const (
	pageSize  = 4096
	pageShift = 12
	// devAddrBase is the first device address handed out. Device addresses are synthetic: they
	// are not Go or process addresses, and every region is followed by an unmapped guard gap,
	// so that an address one past a region never belongs to the next one.
	devAddrBase = 0x1000_0000_0000
	guardGap    = 1 << 20
)

// memSpace is device memory: the regions AllocMemory maps, their device addresses, and the
// freed memory that waits for packets still pointing into it (linkref.go). A device has its
// own; the devices of a group (the queues of one multi-queue device, group.go) share one, as
// any queue may register any of the group's memory. Its lock (lock, unlock) is taken after a
// device's mu, never before, and guards the map, every region's buf and users, and dead; it
// is a no-op where one device owns the space, whose mu then guards all of it. Free also holds
// the mu of every device sharing the space (in order), as the devices use memory under their
// own mu only: the loopback path resolves a payload reference and copies from it under it.
type memSpace struct {
	mu     sync.Mutex
	shared bool // several devices (set before any is used)
	mm     memMap
	// refOut counts the packets built with a Payload of this memory for the link and not yet
	// through sendFrom, on every device sharing it (linkref.go).
	refOut atomic.Int64
	dead   [][]byte     // freed while packets were out (mu)
	deadN  atomic.Int32 // len(dead), read without mu
	// devs are the devices sharing the space (set before any is used) and closed the number
	// whose senders have all stopped (Close): once all have, nothing can read freed memory
	// any more (mu).
	devs   []*Device
	closed int
}

// region is one Memory allocation: an mmap'd buffer and its device address range.
type region struct {
	ms   *memSpace
	base uint64 // device address of buf[0]
	buf  []byte // the mmap'd bytes; nil after Free
	// users counts regular MRs over the region and VALID fast-reg MRs with a page in it.
	users int
}

// memory implements transport.Memory.
type memory struct{ r *region }

func (m memory) Bytes() []byte { return m.r.buf }
func (m memory) Addr() uint64  { return m.r.base }
func (m memory) Len() int      { return len(m.r.buf) }

func (m memory) Free() error {
	ms := m.r.ms
	for _, d := range ms.devs {
		d.mu.Lock()
		defer d.mu.Unlock()
	}
	ms.lock()
	defer ms.unlock()
	if m.r.buf == nil {
		return transport.ErrClosed
	}
	if m.r.users > 0 {
		return fmt.Errorf("free memory at %#x: %d MRs use it: %w", m.r.base, m.r.users, transport.ErrBusy)
	}
	ms.mm.remove(m.r)
	buf := m.r.buf
	m.r.buf = nil
	return ms.unmap(buf)
}

func (ms *memSpace) lock() {
	if ms.shared {
		ms.mu.Lock()
	}
}

func (ms *memSpace) unlock() {
	if ms.shared {
		ms.mu.Unlock()
	}
}

// holds reports whether [addr, addr+n) lies in one region of the space.
func (ms *memSpace) holds(addr, n uint64) bool {
	ms.lock()
	defer ms.unlock()
	return ms.mm.find(addr, n) != nil
}

// slice returns the bytes of [addr, addr+n) when they lie in one region of the space, else
// nil.
func (ms *memSpace) slice(addr, n uint64) []byte {
	ms.lock()
	defer ms.unlock()
	b, _ := ms.mm.slice(addr, n)
	return b
}

// memMap is the device's sorted set of regions.
type memMap struct {
	regions []*region // sorted by base
	next    uint64    // next base address
}

func (mm *memMap) add(r *region) {
	if mm.next == 0 {
		mm.next = devAddrBase
	}
	r.base = mm.next
	mm.next += uint64(len(r.buf)) + guardGap
	mm.regions = append(mm.regions, r) // bases increase monotonically: stays sorted
}

func (mm *memMap) remove(r *region) {
	for i, x := range mm.regions {
		if x == r {
			mm.regions = append(mm.regions[:i], mm.regions[i+1:]...)
			return
		}
	}
}

// find returns the region containing [addr, addr+n) entirely, or nil. n may be 0 (then addr
// must still lie inside a region). Overflow-safe.
func (mm *memMap) find(addr, n uint64) *region {
	rs := mm.regions
	lo, hi := 0, len(rs) // first index with base > addr
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if rs[mid].base > addr {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	if lo == 0 {
		return nil
	}
	r := rs[lo-1]
	off := addr - r.base
	if off >= uint64(len(r.buf)) || n > uint64(len(r.buf))-off {
		return nil
	}
	return r
}

// slice returns the host bytes for [addr, addr+n) if they lie in one region.
func (mm *memMap) slice(addr, n uint64) ([]byte, *region) {
	r := mm.find(addr, n)
	if r == nil {
		return nil, nil
	}
	off := addr - r.base
	return r.buf[off : off+n : off+n], r
}

func mmapAnon(n int) ([]byte, error) {
	return unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
}
