//go:build verbs && linux && cgo

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/srpd/srpd/transport"
)

// pd implements transport.PD.
type pd struct {
	dev    *Device
	ib     *C.struct_ibv_pd
	nmr    int // regular MRs (dev.mu)
	nmw    int // windows (dev.mu)
	nqp    int // QPs (dev.mu)
	mrs    map[*mr]struct{}
	closed bool
}

// RegMR implements transport.PD.
func (p *pd) RegMR(addr, length uint64, access transport.Access) (transport.MR, error) {
	if err := access.Validate(); err != nil {
		return nil, fmt.Errorf("verbs: register MR: %w", err)
	}
	if length == 0 {
		return nil, fmt.Errorf("verbs: register MR of 0 bytes: %w", transport.ErrInvalidArgument)
	}
	d := p.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || p.closed {
		return nil, transport.ErrClosed
	}
	r := d.findRegion(addr, length)
	if r == nil {
		return nil, fmt.Errorf("verbs: register [%#x, +%d): %w", addr, length, transport.ErrBadAddress)
	}
	ib, err := C.shim_reg_mr(p.ib, C.uint64_t(addr), C.uint64_t(length), C.int(access))
	if ib == nil {
		return nil, fmt.Errorf("%w: %v", transport.ErrNoResources, errnoErr("ibv_reg_mr", err))
	}
	m := &mr{pd: p, ib: ib, reg: r, addr: addr, length: length, access: access,
		lkey: uint32(ib.lkey), rkey: uint32(ib.rkey)}
	if m.rkey == 0 {
		// rxe gives an MR without remote rights rkey 0; the transport API has lkey = rkey.
		m.rkey = m.lkey
	}
	r.users++
	p.nmr++
	if p.mrs == nil {
		p.mrs = make(map[*mr]struct{})
	}
	p.mrs[m] = struct{}{}
	return m, nil
}

// AllocFastRegMR implements transport.PD with a type-2 memory window (see the package doc).
func (p *pd) AllocFastRegMR(maxPages int) (transport.MR, error) {
	d := p.dev
	if !d.mwType2 {
		return nil, fmt.Errorf("verbs: %s has no type-2 memory windows: %w", d.name, transport.ErrNotSupported)
	}
	if err := d.attr.CheckFastRegPages(maxPages); err != nil {
		return nil, fmt.Errorf("verbs: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || p.closed {
		return nil, transport.ErrClosed
	}
	mw, err := C.ibv_alloc_mw(p.ib, C.IBV_MW_TYPE_2)
	if mw == nil {
		return nil, fmt.Errorf("%w: %v", transport.ErrNoResources, errnoErr("ibv_alloc_mw", err))
	}
	f := &fastMR{pd: p, ib: mw, maxPages: maxPages, key0: uint32(mw.rkey), swKey: uint32(mw.rkey)}
	f.info = transport.MRInfo{State: transport.MRFree, Key: f.key0, FastReg: true}
	p.nmw++
	d.mws[f.key0>>8] = f
	return f, nil
}

// CreateQP implements transport.PD.
func (p *pd) CreateQP(attr transport.QPInitAttr) (transport.QP, error) { return p.createQP(attr) }

// Close implements transport.PD.
func (p *pd) Close() error {
	d := p.dev
	d.mu.Lock()
	if d.closed || p.closed {
		d.mu.Unlock()
		return transport.ErrClosed
	}
	if p.nmr > 0 || p.nmw > 0 || p.nqp > 0 {
		n1, n2, n3 := p.nmr, p.nmw, p.nqp
		d.mu.Unlock()
		return fmt.Errorf("verbs: close PD: %d MRs, %d fast-reg MRs, %d QPs: %w", n1, n2, n3, transport.ErrBusy)
	}
	p.closed = true
	delete(d.pds, p)
	for _, r := range d.mems {
		r.dropBacking(p)
	}
	d.mu.Unlock()
	if r := C.ibv_dealloc_pd(p.ib); r != 0 {
		return posErrno("ibv_dealloc_pd", r)
	}
	return nil
}

// destroyMRs deregisters every MR of p (device close).
func (p *pd) destroyMRs() {
	d := p.dev
	d.mu.Lock()
	ms := slices.Collect(maps.Keys(p.mrs))
	d.mu.Unlock()
	for _, m := range ms {
		m.dereg()
	}
}

// destroy deallocates p (device close).
func (p *pd) destroy() {
	if claimTeardown(&p.dev.mu, &p.closed) {
		C.ibv_dealloc_pd(p.ib)
	}
}

// mr implements transport.MR for a regular MR.
type mr struct {
	pd           *pd
	ib           *C.struct_ibv_mr
	reg          *region
	addr, length uint64
	access       transport.Access
	lkey, rkey   uint32
	closed       bool // dev.mu
}

func (m *mr) Index() uint32 { return m.lkey >> 8 }
func (m *mr) LKey() uint32  { return m.lkey }
func (m *mr) RKey() uint32  { return m.rkey }
func (m *mr) FastReg() bool { return false }
func (m *mr) MaxPages() int { return 0 }
func (m *mr) Query() transport.MRInfo {
	d := m.pd.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if m.closed {
		return transport.MRInfo{State: transport.MRInvalid}
	}
	return transport.MRInfo{State: transport.MRValid, Key: m.lkey, IOVA: m.addr, Length: m.length,
		Access: m.access, PageSize: uint32(d.attr.PageSize)}
}

func (m *mr) Close() error {
	if isSet(&m.pd.dev.mu, &m.closed) {
		return transport.ErrClosed
	}
	return m.dereg()
}

func (m *mr) dereg() error {
	d := m.pd.dev
	d.mu.Lock()
	if m.closed {
		d.mu.Unlock()
		return nil
	}
	m.closed = true
	m.reg.users--
	m.pd.nmr--
	delete(m.pd.mrs, m)
	d.mu.Unlock()
	if r := C.ibv_dereg_mr(m.ib); r != 0 {
		return posErrno("ibv_dereg_mr", r)
	}
	return nil
}

// fastMR implements a fast-registration MR as a type-2 memory window.
type fastMR struct {
	pd       *pd
	ib       *C.struct_ibv_mw
	maxPages int
	key0     uint32
	// swKey is the key the window will have once every bind posted so far has executed; the
	// provider reads the window's identity from ib.rkey at post time (qp.mu of the posting QP).
	swKey uint32

	mu      sync.Mutex
	info    transport.MRInfo // the device's view, as retired WRs left it
	unknown bool             // a bind or invalidate failed or was flushed: state unknown
	bound   *region          // region whose users count this VALID window holds (dev.mu)
	closed  bool
}

func (f *fastMR) Index() uint32 { return f.key0 >> 8 }
func (f *fastMR) LKey() uint32  { return f.key0 }
func (f *fastMR) RKey() uint32  { return f.key0 }
func (f *fastMR) FastReg() bool { return true }
func (f *fastMR) MaxPages() int { return f.maxPages }

// Query implements transport.MR: the view retired work requests left; VALID when unknown.
func (f *fastMR) Query() transport.MRInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return transport.MRInfo{State: transport.MRInvalid, FastReg: true}
	}
	inf := f.info
	if f.unknown {
		inf.State = transport.MRValid
	}
	return inf
}

// setValid records an executed bind. Called by the CQ poller.
func (f *fastMR) setValid(key uint32, iova, length uint64, access transport.Access, pageSize uint32, npages int) {
	d := f.pd.dev
	d.mu.Lock()
	f.mu.Lock()
	if f.bound == nil {
		if r := d.findRegion(iova, length); r != nil {
			r.users++
			f.bound = r
		}
	}
	f.info = transport.MRInfo{State: transport.MRValid, Key: key, IOVA: iova, Length: length, Access: access,
		PageSize: pageSize, NPages: npages, FastReg: true}
	f.unknown = false
	f.mu.Unlock()
	d.mu.Unlock()
}

// setFree records an executed invalidation of key (local or remote). Called by the CQ poller.
func (f *fastMR) setFree(key uint32) {
	d := f.pd.dev
	d.mu.Lock()
	f.mu.Lock()
	if f.info.State == transport.MRValid && f.info.Key == key {
		f.info.State = transport.MRFree
		if f.bound != nil {
			f.bound.users--
			f.bound = nil
		}
		f.unknown = false
	}
	f.mu.Unlock()
	d.mu.Unlock()
}

func (f *fastMR) setUnknown() {
	f.mu.Lock()
	f.unknown = true
	f.mu.Unlock()
}

// Close implements transport.MR: deallocates the window (which also unbinds it).
func (f *fastMR) Close() error {
	if isSet(&f.mu, &f.closed) {
		return transport.ErrClosed
	}
	return f.destroy()
}

func (f *fastMR) destroy() error {
	d := f.pd.dev
	d.mu.Lock()
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		d.mu.Unlock()
		return nil
	}
	f.closed = true
	if f.bound != nil {
		f.bound.users--
		f.bound = nil
	}
	f.mu.Unlock()
	if d.mws[f.key0>>8] == f {
		delete(d.mws, f.key0>>8)
	}
	f.pd.nmw--
	d.mu.Unlock()
	if r := C.ibv_dealloc_mw(f.ib); r != 0 {
		return posErrno("ibv_dealloc_mw", r)
	}
	return nil
}

// mwByKey finds the window a key names.
func (d *Device) mwByKey(key uint32) *fastMR {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mws[key>>8]
}
