package initiator

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/srpd/srpd/transport"
)

// Buffer is memory of the session's RDMA device that a caller reads into and writes from
// (Bytes) and that the asynchronous block API maps for the target directly: a ReadAtAsync or
// WriteAtAsync whose p lies in a Buffer, starts on a page boundary and is carried by one
// command registers p itself instead of copying it through the request slot's buffer (one
// memory copy of the data less per I/O). Such a command completes (done runs) only once the
// target can no longer reach p: after every registration of it is invalidated and the pool
// confirmed it, not at the response already as a copying command does, so that a buffer never
// goes back to its owner while a key to it is live. Any other p (memory of the Go heap, of
// another Buffer's session, unaligned) is copied as before: correctness never depends on it.
//
// A Buffer stays valid until Free; Free of a Buffer that an I/O in flight uses fails with
// transport.ErrBusy (the device refuses it) and leaves it valid.
type Buffer struct {
	s   *Session
	mem transport.Memory
}

// Bytes returns the buffer's memory (page-aligned, at least the size asked for).
func (b *Buffer) Bytes() []byte { return b.mem.Bytes() }

// Free gives the memory back to the device. The caller must not use Bytes afterwards.
func (b *Buffer) Free() error {
	b.s.bufs.remove(b.mem)
	if err := b.mem.Free(); err != nil {
		b.s.bufs.add(b.mem) // still mapped: still ours
		return fmt.Errorf("initiator: free buffer: %w", err)
	}
	return nil
}

// AllocBuffer allocates n bytes (rounded up to whole pages) of the device's memory as a Buffer.
func (s *Session) AllocBuffer(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("initiator: buffer of %d bytes", n)
	}
	mem, err := s.cfg.Device.AllocMemory(n)
	if err != nil {
		return nil, fmt.Errorf("initiator: allocate a buffer of %d bytes: %w", n, err)
	}
	s.bufs.add(mem)
	return &Buffer{s: s, mem: mem}, nil
}

// bufRange is one Buffer's host memory and its device address.
type bufRange struct {
	start, end uintptr // host addresses of Bytes()[0] and one past its end
	addr       uint64  // device address of Bytes()[0]
	mem        transport.Memory
}

// bufSet is the session's Buffers, sorted by host address and looked up per I/O without a
// lock (copy on write: they change only on AllocBuffer and Free).
type bufSet struct {
	mu  sync.Mutex
	cur atomic.Pointer[[]bufRange]
}

func (bs *bufSet) load() []bufRange {
	if p := bs.cur.Load(); p != nil {
		return *p
	}
	return nil
}

func (bs *bufSet) add(mem transport.Memory) {
	b := mem.Bytes()
	if len(b) == 0 {
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	r := bufRange{start: start, end: start + uintptr(len(b)), addr: mem.Addr(), mem: mem}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	old := bs.load()
	i, _ := slices.BinarySearchFunc(old, start, func(x bufRange, t uintptr) int { return cmp.Compare(x.start, t) })
	next := slices.Insert(slices.Clone(old), i, r)
	bs.cur.Store(&next)
}

func (bs *bufSet) remove(mem transport.Memory) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	next := slices.DeleteFunc(slices.Clone(bs.load()), func(r bufRange) bool { return r.mem == mem })
	bs.cur.Store(&next)
}

// deviceAddr returns the device address of p when p lies entirely in one of the Buffers and
// starts on a page boundary of the device, else 0 (no device address is 0: transport.Memory
// addresses are never). The page alignment lets the command's registrations split p exactly as
// they split a request slot's buffer.
func (bs *bufSet) deviceAddr(p []byte, pageSize uint64) uint64 {
	cur := bs.load()
	if len(cur) == 0 || len(p) == 0 {
		return 0
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	end := start + uintptr(len(p))
	// The last Buffer starting at or before p (Buffers do not overlap).
	i, found := slices.BinarySearchFunc(cur, start, func(x bufRange, t uintptr) int { return cmp.Compare(x.start, t) })
	if !found {
		i--
	}
	if i < 0 || end > cur[i].end {
		return 0
	}
	a := cur[i].addr + uint64(start-cur[i].start)
	if a%pageSize != 0 {
		return 0
	}
	return a
}
