package nbd

import (
	"errors"
	"testing"
	"unsafe"
)

// fakeAlloc hands out page-aligned heap memory and counts what is live.
type fakeAlloc struct {
	live, allocs int
	fail         bool
}

func (a *fakeAlloc) Alloc(n int) ([]byte, func(), error) {
	if a.fail {
		return nil, nil, errors.New("no device memory")
	}
	raw := make([]byte, n+allocPage)
	off := allocPage - int(uintptr(unsafe.Pointer(&raw[0]))%allocPage)
	a.live++
	a.allocs++
	freed := false
	return raw[off : off+n], func() {
		if freed {
			panic("freed twice")
		}
		freed = true
		a.live--
	}, nil
}

// TestBufPoolAllocator: buffers of 32 KiB and more come from the Allocator with a page-aligned
// payload and the reply header room just before it; smaller ones, and all of them when the
// Allocator fails, from the heap; Allocator buffers are reused, freed when the pool drops them
// to make room, and by releaseFree when not in use.
func TestBufPoolAllocator(t *testing.T) {
	a := &fakeAlloc{}
	p := newBufPool(384<<10, 256<<10, noReserve, a)
	stop := make(chan struct{})
	wake := make(chan struct{}, 1)
	big := p.get(128<<10, holds(0), wake, stop, nil)
	if big.free == nil || a.live != 1 {
		t.Fatalf("128 KiB buffer: from the Allocator %v, live %d", big.free != nil, a.live)
	}
	pl := big.payload(128 << 10)
	if uintptr(unsafe.Pointer(&pl[0]))%allocPage != 0 || len(big.b) != replyHeadroom+128<<10 {
		t.Fatalf("payload at page offset %d, buffer %d bytes", uintptr(unsafe.Pointer(&pl[0]))%allocPage, len(big.b))
	}
	small := p.get(4096, holds(0), wake, stop, nil)
	if small.free != nil || a.allocs != 1 {
		t.Fatalf("4 KiB buffer from the Allocator (allocs %d)", a.allocs)
	}
	p.put(big)
	if again := p.get(100<<10, holds(0), wake, stop, nil); again != big || a.allocs != 1 {
		t.Fatalf("a free 128 KiB buffer was not reused (allocs %d)", a.allocs)
	} else {
		p.put(again)
	}
	// 256 KiB needs room: the free 128 KiB buffer is dropped (and freed).
	b256 := p.get(256<<10, holds(0), wake, stop, nil)
	if a.live != 1 || a.allocs != 2 || b256.free == nil {
		t.Fatalf("after making room: live %d allocs %d", a.live, a.allocs)
	}
	p.put(b256)
	p.put(small)
	p.releaseFree()
	if a.live != 0 {
		t.Fatalf("releaseFree left %d Allocator buffers", a.live)
	}
	if alloc, _, _ := p.stats(); alloc != 4096 {
		t.Fatalf("after releaseFree %d bytes accounted, want the 4 KiB heap buffer's", alloc)
	}
	a.fail = true
	h := p.get(64<<10, holds(0), wake, stop, nil)
	if h.free != nil || len(h.b) != replyHeadroom+64<<10 || p.allocErrs.Load() != 1 {
		t.Fatalf("with the Allocator failing: free %v, %d bytes, errors %d", h.free != nil, len(h.b), p.allocErrs.Load())
	}
	p.put(h)
}
