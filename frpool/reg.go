package frpool

import (
	"github.com/srpd/srpd/transport"
)

// Seg is one piece of a buffer to register: Len bytes at device address Addr (transport.Memory
// addresses). A registration maps a list of segments as one virtually contiguous region.
type Seg struct {
	Addr uint64
	Len  int
}

// BufferOwner is told when the buffer a registration mapped is back in its hands: when the
// invalidation of the registration is confirmed (err == nil), or when the registration was torn
// down by a QP error or a key mismatch (err wraps ErrQPError or ErrRKeyMismatch; in that case the
// pool has made sure, through the device's view of the MR, that no key of that registration is
// valid any more). It is called exactly once per posted registration, without pool locks held,
// from the goroutine that called the pool method which found out (usually HandleSendCompletion or
// HandleRecvCompletion); it may call back into the pool.
//
// The handle stays the ULP's until the ULP gives it back: with Cancel before it is posted, with
// Invalidate after. Invalidate of a registration that is already dead (remotely invalidated, or
// torn down) only gives the handle back. A handle is recycled once both have happened (callback
// returned, handle given back), so a late Invalidate can never hit another user's registration.
type BufferOwner interface {
	BufferReleased(r *Reg, err error)
}

// regState is the lifecycle of a registration handle.
type regState uint8

const (
	regIdle         regState = iota // in the pool's handle free list
	regMapped                       // returned by Get, REG_MR not posted (MR "registering")
	regPosted                       // REG_MR posted: the key may be in force (MR "valid")
	regInvalidating                 // LOCAL_INV posted, not yet confirmed
	regReleasing                    // confirmed dead; owner callback pending or running
	regReleased                     // owner callback done; waiting for the ULP to give the handle back
)

func (s regState) String() string {
	switch s {
	case regIdle:
		return "idle"
	case regMapped:
		return "registering"
	case regPosted:
		return "valid"
	case regInvalidating:
		return "invalidating"
	case regReleasing:
		return "releasing"
	case regReleased:
		return "released"
	}
	return "?"
}

// Reg is a registration handle: one use of one MR to map one buffer. It remembers the exact key
// it was registered with; its LOCAL_INV always names that key. Handles are preallocated by the
// pool and recycled after the owner's BufferReleased returns.
type Reg struct {
	p      *Pool
	slot   *mrSlot
	gen    uint32
	state  regState
	key    uint32
	iova   uint64
	length uint64
	npages int
	pages  []uint64 // page list for the REG_MR; untouched until the handle is recycled
	owner  BufferOwner
	err    error
	mark   uint64 // chain-duplicate detection
	given  bool   // the ULP gave the handle back (Invalidate)
	wrap   bool   // choosing key wrapped the key byte

	nextFree   *Reg // handle free list
	nextSlot   *Reg // the slot's list of registrations whose key may be live
	nextNotify *Reg // pending owner callbacks
}

// RKey is the key of the registration. It is chosen by Get, so that the ULP can put it in a SEND
// posted in the same chain as the REG_MR; the MR's key byte only advances when the REG_MR is
// posted (a Get that is cancelled, or a post that fails, leaves the MR untouched). Read it before
// giving the handle back.
func (r *Reg) RKey() uint32 { return r.key }

// LKey equals RKey (a fast-reg MR has lkey = rkey).
func (r *Reg) LKey() uint32 { return r.key }

// IOVA is the address the peer uses for the first byte (the device address of the first byte).
func (r *Reg) IOVA() uint64 { return r.iova }

// Length is the number of bytes mapped.
func (r *Reg) Length() uint64 { return r.length }

// Gen is the handle's generation, incremented every time the handle is recycled. A ULP that
// keeps handles in long-lived tables can compare it to detect use after release.
func (r *Reg) Gen() uint32 { return r.gen }

// mapSegs checks that segs can be mapped by one MR of maxPages pages of size ps and returns the
// number of pages. Rules of ib_map_mr_sg for IB_MR_TYPE_MEM_REG: the first segment may start
// anywhere, every later one must start on a page boundary; every segment but the last must end on
// a page boundary.
func mapSegs(segs []Seg, ps uint64, maxPages int) (npages int, length uint64, err error) {
	if len(segs) == 0 {
		return 0, 0, ErrMapping
	}
	for i, s := range segs {
		if s.Len <= 0 {
			return 0, 0, ErrMapping
		}
		end := s.Addr + uint64(s.Len)
		if end < s.Addr {
			return 0, 0, ErrMapping
		}
		if i > 0 && s.Addr%ps != 0 {
			return 0, 0, ErrMapping
		}
		if i < len(segs)-1 && end%ps != 0 {
			return 0, 0, ErrMapping
		}
		first := s.Addr / ps
		last := (end - 1) / ps
		npages += int(last - first + 1)
		length += uint64(s.Len)
		if npages > maxPages {
			return 0, 0, ErrMapping
		}
	}
	return npages, length, nil
}

// fillPages writes the page addresses of segs (already checked by mapSegs) into pages.
func fillPages(pages []uint64, segs []Seg, ps uint64) int {
	n := 0
	for _, s := range segs {
		end := s.Addr + uint64(s.Len)
		for a := s.Addr &^ (ps - 1); a < end; a += ps {
			pages[n] = a
			n++
		}
	}
	return n
}

// regWR fills the REG_MR work request of r with key.
func (r *Reg) regWR(wr *transport.SendWR, id uint64, key uint32, access transport.Access, ps uint32) {
	*wr = transport.SendWR{
		ID:     id,
		Opcode: transport.WRRegMR,
		Reg: transport.RegMRWR{
			MR:       r.slot.mr,
			Key:      key,
			Access:   access,
			IOVA:     r.iova,
			Length:   r.length,
			PageSize: ps,
			Pages:    r.pages[:r.npages],
		},
	}
}
