package softroce

import (
	"fmt"
	"math/bits"
	"math/rand/v2"

	"github.com/srpd/srpd/transport"
)

// pd implements transport.PD.
type pd struct {
	dev    *Device
	nMR    int
	nQP    int
	closed bool
}

// mr implements transport.MR. Everything below the "device view" comment is the hardware state:
// it changes only under dev.mu, when a REG_MR / LOCAL_INV work request executes in SQ order, when
// a peer's SEND_WITH_INV executes, or at (de)registration. Software's choice of the next key
// lives in the caller (the REG_MR WR), never here.
type mr struct {
	dev      *Device
	pd       *pd
	index    uint32
	initKey  uint32
	fast     bool
	maxPages int

	// device view (dev.mu)
	state  transport.MRState
	key    uint32
	access transport.Access
	iova   uint64
	length uint64
	// regular MR
	reg *region
	buf []byte // host bytes of [iova, iova+length)
	// fast-reg MR: the page list copied from the REG_MR WR at execution
	pageShift uint
	pageOff   uint64 // iova's offset inside the first page
	pageAddrs []uint64
	pageBufs  [][]byte
	pageRegs  []*region
}

func (m *mr) Index() uint32 { return m.index }
func (m *mr) LKey() uint32  { return m.initKey }
func (m *mr) RKey() uint32  { return m.initKey }
func (m *mr) FastReg() bool { return m.fast }
func (m *mr) MaxPages() int { return m.maxPages }

func (m *mr) Query() transport.MRInfo {
	m.dev.mu.Lock()
	defer m.dev.mu.Unlock()
	inf := transport.MRInfo{State: m.state, Key: m.key, FastReg: m.fast}
	if m.state == transport.MRValid {
		inf.IOVA, inf.Length, inf.Access = m.iova, m.length, m.access
		if m.fast {
			inf.PageSize = 1 << m.pageShift
			inf.NPages = len(m.pageAddrs)
		}
	}
	return inf
}

func (m *mr) Close() error {
	d := m.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if m.state == transport.MRInvalid {
		return transport.ErrClosed
	}
	m.release()
	m.state = transport.MRInvalid
	d.mrs[m.index] = nil
	d.freeMR = append(d.freeMR, m.index)
	m.pd.nMR--
	return nil
}

// release drops the MR's hold on memory regions (invalidate / deregister).
func (m *mr) release() {
	ms := m.dev.ms
	ms.lock()
	defer ms.unlock()
	if m.fast {
		if m.state == transport.MRValid {
			for i, r := range m.pageRegs {
				r.users--
				m.pageRegs[i] = nil
				m.pageBufs[i] = nil
			}
			m.pageRegs = m.pageRegs[:0]
			m.pageBufs = m.pageBufs[:0]
			m.pageAddrs = m.pageAddrs[:0]
		}
		return
	}
	if m.reg != nil {
		m.reg.users--
		m.reg = nil
		m.buf = nil
	}
}

// inRange reports whether [va, va+n) lies inside the MR (overflow-safe).
func (m *mr) inRange(va uint64, n uint64) bool {
	if va < m.iova {
		return false
	}
	off := va - m.iova
	return off <= m.length && n <= m.length-off
}

// chunk returns the longest host slice (≤ n bytes) backing MR address va. The caller has checked
// the range with inRange.
func (m *mr) chunk(va uint64, n int) []byte {
	off := va - m.iova
	if !m.fast {
		return m.buf[off : off+uint64(n) : off+uint64(n)]
	}
	po := off + m.pageOff
	pb := m.pageBufs[po>>m.pageShift]
	b := pb[po&(1<<m.pageShift-1):]
	if len(b) > n {
		b = b[:n]
	}
	return b
}

// copyIn writes src at MR address va (range already checked).
func (m *mr) copyIn(va uint64, src []byte) {
	for len(src) > 0 {
		c := m.chunk(va, len(src))
		k := copy(c, src)
		src = src[k:]
		va += uint64(k)
	}
}

// copyOut reads len(dst) bytes at MR address va (range already checked).
func (m *mr) copyOut(dst []byte, va uint64) {
	for len(dst) > 0 {
		c := m.chunk(va, len(dst))
		k := copy(dst, c)
		dst = dst[k:]
		va += uint64(k)
	}
}

func (p *pd) RegMR(addr, length uint64, access transport.Access) (transport.MR, error) {
	if err := access.Validate(); err != nil {
		return nil, err
	}
	d := p.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.closed || d.closed {
		return nil, transport.ErrClosed
	}
	if length == 0 || length > d.attr.MaxMRSize {
		return nil, fmt.Errorf("register MR of %d bytes: %w", length, transport.ErrInvalidArgument)
	}
	ms := d.ms
	ms.lock()
	defer ms.unlock()
	b, r := ms.mm.slice(addr, length)
	if r == nil {
		return nil, fmt.Errorf("register MR [%#x, +%d): %w", addr, length, transport.ErrBadAddress)
	}
	m, err := d.newMR(p)
	if err != nil {
		return nil, err
	}
	m.state = transport.MRValid
	m.access = access
	m.iova, m.length = addr, length
	m.reg, m.buf = r, b
	r.users++
	return m, nil
}

func (p *pd) AllocFastRegMR(maxPages int) (transport.MR, error) {
	d := p.dev
	if err := d.attr.CheckFastRegPages(maxPages); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.closed || d.closed {
		return nil, transport.ErrClosed
	}
	m, err := d.newMR(p)
	if err != nil {
		return nil, err
	}
	m.fast = true
	m.maxPages = maxPages
	m.state = transport.MRFree
	// rxe pre-sets every remote right on a fresh fast-reg MR; the REG_MR WR's access replaces it.
	m.access = transport.AccessLocalWrite | transport.AccessRemote
	m.pageAddrs = make([]uint64, 0, maxPages)
	m.pageBufs = make([][]byte, 0, maxPages)
	m.pageRegs = make([]*region, 0, maxPages)
	return m, nil
}

// newMR takes a free table index (never 0) and a random key byte. dev.mu held.
func (d *Device) newMR(p *pd) (*mr, error) {
	var idx uint32
	if n := len(d.freeMR); n > 0 {
		idx = d.freeMR[n-1]
		d.freeMR = d.freeMR[:n-1]
	} else {
		if len(d.mrs) > d.attr.MaxMR {
			return nil, fmt.Errorf("MR table full (%d): %w", d.attr.MaxMR, transport.ErrNoResources)
		}
		d.mrs = append(d.mrs, nil)
		idx = uint32(len(d.mrs) - 1)
	}
	key := idx<<8 | uint32(rand.N(256))
	m := &mr{dev: d, pd: p, index: idx, initKey: key, key: key}
	d.mrs[idx] = m
	p.nMR++
	return m, nil
}

// mrByKey returns the MR whose index is key>>8 (not checking the key byte). dev.mu held.
func (d *Device) mrByKey(key uint32) *mr {
	idx := key >> 8
	if idx == 0 || int(idx) >= len(d.mrs) {
		return nil
	}
	return d.mrs[idx]
}

// checkLocal validates an SGE-sized access through lkey: the MR exists with that exact key in
// force, is VALID, belongs to pd, covers the range and (write) grants LocalWrite. dev.mu held.
func (d *Device) checkLocal(p *pd, addr uint64, n uint32, lkey uint32, write bool) *mr {
	m := d.mrByKey(lkey)
	if m == nil || m.state != transport.MRValid || m.key != lkey || m.pd != p {
		return nil
	}
	if write && m.access&transport.AccessLocalWrite == 0 {
		return nil
	}
	if !m.inRange(addr, uint64(n)) {
		return nil
	}
	return m
}

// checkRemote validates a remote access (rxe check_rkey / lookup_mr): index, full key, PD, VALID,
// access ⊇ need, and [va, va+n) inside the MR with overflow checks. dev.mu held.
func (d *Device) checkRemote(p *pd, va uint64, n uint32, rkey uint32, need transport.Access) *mr {
	m := d.mrByKey(rkey)
	if m == nil || m.state != transport.MRValid || m.key != rkey || m.pd != p {
		return nil
	}
	if m.access&need != need {
		return nil
	}
	if !m.inRange(va, uint64(n)) {
		return nil
	}
	return m
}

// regMR executes a REG_MR WR (rxe_reg_fast_mr): MR FREE, same PD, key index = MR index; then
// the page list is copied and resolved and the new key, iova, length and access take effect.
// dev.mu held.
func (d *Device) regMR(p *pd, w *transport.RegMRWR) transport.WCStatus {
	m, ok := w.MR.(*mr)
	if !ok || m.dev != d || !m.fast || m.state != transport.MRFree || m.pd != p ||
		w.Key>>8 != m.index || w.Access.Validate() != nil {
		return transport.WCLocQPOpErr
	}
	ps := uint64(w.PageSize)
	if ps < pageSize || ps&(ps-1) != 0 || len(w.Pages) > m.maxPages {
		return transport.WCLocQPOpErr
	}
	off := w.IOVA & (ps - 1)
	if w.Length > uint64(len(w.Pages))*ps-off || (len(w.Pages) == 0 && w.Length != 0) {
		return transport.WCLocQPOpErr
	}
	ms := d.ms
	ms.lock()
	defer ms.unlock()
	for _, a := range w.Pages {
		if a&(ps-1) != 0 || ms.mm.find(a, ps) == nil {
			return transport.WCLocProtErr
		}
	}
	for _, a := range w.Pages {
		b, r := ms.mm.slice(a, ps)
		r.users++
		m.pageAddrs = append(m.pageAddrs, a)
		m.pageBufs = append(m.pageBufs, b)
		m.pageRegs = append(m.pageRegs, r)
	}
	m.pageShift = uint(bits.TrailingZeros64(ps))
	m.pageOff = off
	m.iova, m.length = w.IOVA, w.Length
	m.access = w.Access
	m.key = w.Key
	m.state = transport.MRValid
	return transport.WCSuccess
}

// invalidate implements LOCAL_INV and remote invalidation (rxe_invalidate_mr): the MR at
// key>>8 must be a fast-reg MR of pd whose key in force equals key. dev.mu held.
func (d *Device) invalidate(p *pd, key uint32) bool {
	m := d.mrByKey(key)
	if m == nil || !m.fast || m.key != key || m.pd != p || m.state == transport.MRInvalid {
		return false
	}
	m.release()
	m.state = transport.MRFree
	return true
}
