//go:build verbs && linux && cgo

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/srpd/srpd/transport"
)

// region is one Memory allocation.
type region struct {
	dev  *Device
	base uint64 // virtual address of buf[0]
	buf  []byte // nil after Free
	// users counts regular MRs over the region and VALID windows bound into it (dev.mu).
	users int
	// backing are the hidden LOCAL_WRITE|MW_BIND MRs over the whole region that type-2 windows
	// bind to, one per PD, registered on the first REG_MR (dev.mu).
	backing map[*pd]*C.struct_ibv_mr
}

// memory implements transport.Memory.
type memory struct{ r *region }

func (m memory) Bytes() []byte { return m.r.buf }
func (m memory) Addr() uint64  { return m.r.base }
func (m memory) Len() int      { return len(m.r.buf) }

// Free implements transport.Memory. It deregisters the region's backing MRs (when no window
// is bound into it) and unmaps it.
func (m memory) Free() error {
	d := m.r.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if m.r.buf == nil {
		return transport.ErrClosed
	}
	if m.r.users > 0 {
		return fmt.Errorf("verbs: free memory at %#x: %d MRs or windows use it: %w", m.r.base, m.r.users, transport.ErrBusy)
	}
	m.r.dropBacking(nil)
	for i, x := range d.mems {
		if x == m.r {
			d.mems = append(d.mems[:i], d.mems[i+1:]...)
			break
		}
	}
	buf := m.r.buf
	m.r.buf = nil
	return unix.Munmap(buf)
}

// dropBacking deregisters the backing MRs of p (nil: all). dev.mu held.
func (r *region) dropBacking(p *pd) {
	for k, mr := range r.backing {
		if p == nil || k == p {
			C.ibv_dereg_mr(mr)
			delete(r.backing, k)
		}
	}
}

// backingMR returns (registering it if needed) the MR of p over the whole region that windows
// bind to. dev.mu held.
func (r *region) backingMR(p *pd) (*C.struct_ibv_mr, error) {
	if mr := r.backing[p]; mr != nil {
		return mr, nil
	}
	mr, err := C.shim_reg_mr(p.ib, C.uint64_t(r.base), C.uint64_t(len(r.buf)), C.IBV_ACCESS_LOCAL_WRITE|C.IBV_ACCESS_MW_BIND)
	if mr == nil {
		return nil, errnoErr("ibv_reg_mr (window backing)", err)
	}
	r.backing[p] = mr
	return mr, nil
}
