package frpool

import (
	"context"
	"fmt"
	"net/netip"
	"sort"

	"github.com/srpd/srpd/transport"
)

// This file is a deterministic test double of the transport API (device memory, PD, MRs, one RC
// QP) that implements exactly the verbs rules the pool relies on, with execution and completion
// delivery under the test's control:
//
//   - the send queue executes in order, one WR per exec() call; nothing executes by itself;
//   - REG_MR installs its key, page list (copied when it executes, as softroce and post-2021 rxe
//     do) and access when it executes; the MR must be FREE and the key's index the MR's;
//   - LOCAL_INV compares its key with the key in force (not with anything software chose later);
//     a mismatch completes with LOC_QP_OP_ERR and moves the QP to ERR, which flushes the rest;
//     like rxe and softroce it accepts an MR that is already FREE with that key;
//   - remote access (remoteAccess: any QP of the PD, so also while our QP is in ERR) checks the
//     key in force, VALID state, access rights and range, exactly like rxe's check_rkey;
//   - completions are queued when WRs execute (signaled, or in error) and delivered only when the
//     test pops them, in order; unsignaled WRs produce none;
//   - QP error (setError) flushes every WR not yet executed, each with its own completion;
//   - a remote SEND_WITH_INV (remoteInvalidate) invalidates at once and queues a receive
//     completion with WCWithInvalidate; a wrong key is a REM_INV_REQ_ERR receive completion plus
//     QP error.
//
// It also records violations of rules the pool must keep: a REG_MR's page list changing between
// post and execution, and every LOCAL_INV / REG_MR failure.

const fakePage = 4096

type fakeRegion struct {
	base  uint64
	buf   []byte
	users int
	freed bool
}

type fakeMemory struct{ r *fakeRegion }

func (m fakeMemory) Bytes() []byte { return m.r.buf }
func (m fakeMemory) Addr() uint64  { return m.r.base }
func (m fakeMemory) Len() int      { return len(m.r.buf) }
func (m fakeMemory) Free() error {
	if m.r.users > 0 {
		return transport.ErrBusy
	}
	m.r.freed = true
	return nil
}

type fakeDev struct {
	name    string
	attr    transport.DeviceAttr
	regions []*fakeRegion
	next    uint64
	mrs     []*fakeMR // by index; 0 unused
	freeIdx []uint32
	keySeed uint32
	// allocFail makes the next allocFail AllocFastRegMR calls fail (ErrNoResources).
	allocFail int

	// violations and counters
	invFail      int // LOCAL_INV key-check failures
	regFail      int // REG_MR failures
	pageMutation int // REG_MR page lists changed between post and execution
	remoteOK     int
	remoteDenied int
}

func newFakeDev(name string, seed uint32) *fakeDev {
	return &fakeDev{
		name:    name,
		next:    0x7000_0000_0000,
		mrs:     []*fakeMR{nil},
		keySeed: seed | 1,
		attr: transport.DeviceAttr{
			PageSize: fakePage, PageSizeCap: fakePage, MaxMRSize: 1 << 32, MaxMRPages: 512,
			MaxMR: 1 << 16, MaxPD: 16, MaxQP: 16, MaxQPWR: 4096, MaxSGE: 4, MaxInlineData: 0,
			MaxCQ: 16, MaxCQE: 1 << 16, MaxQPRdAtom: 16, MaxQPInitRdAtom: 16, MaxMsgSize: 1 << 31,
			MaxMTU: transport.MTU4096, ActiveMTU: transport.MTU4096,
		},
	}
}

func (d *fakeDev) alloc(n int) fakeMemory {
	n = (n + fakePage - 1) &^ (fakePage - 1)
	r := &fakeRegion{base: d.next, buf: make([]byte, n)}
	d.next += uint64(n) + 1<<20 // guard gap
	d.regions = append(d.regions, r)
	return fakeMemory{r}
}

func (d *fakeDev) AllocMemory(n int) (transport.Memory, error) { return d.alloc(n), nil }

// find returns the bytes of [addr, addr+n) if they lie in one region.
func (d *fakeDev) find(addr, n uint64) ([]byte, *fakeRegion) {
	i := sort.Search(len(d.regions), func(i int) bool { return d.regions[i].base > addr }) - 1
	if i < 0 {
		return nil, nil
	}
	r := d.regions[i]
	off := addr - r.base
	if r.freed || off > uint64(len(r.buf)) || n > uint64(len(r.buf))-off {
		return nil, nil
	}
	return r.buf[off : off+n], r
}

func (d *fakeDev) nextKeyByte() uint32 {
	d.keySeed = d.keySeed*1103515245 + 12345
	return (d.keySeed >> 16) & 0xff
}

type fakePD struct{ dev *fakeDev }

func (d *fakeDev) AllocPD() (transport.PD, error) { return &fakePD{d}, nil }

func (p *fakePD) newMR() *fakeMR {
	d := p.dev
	var idx uint32
	if n := len(d.freeIdx); n > 0 {
		idx = d.freeIdx[n-1]
		d.freeIdx = d.freeIdx[:n-1]
	} else {
		d.mrs = append(d.mrs, nil)
		idx = uint32(len(d.mrs) - 1)
	}
	key := idx<<8 | d.nextKeyByte()
	m := &fakeMR{dev: d, pd: p, index: idx, initKey: key, key: key}
	d.mrs[idx] = m
	return m
}

func (p *fakePD) RegMR(addr, length uint64, access transport.Access) (transport.MR, error) {
	b, r := p.dev.find(addr, length)
	if b == nil {
		return nil, transport.ErrBadAddress
	}
	m := p.newMR()
	m.state, m.access, m.iova, m.length, m.buf = transport.MRValid, access, addr, length, b
	r.users++
	m.reg = r
	return m, nil
}

func (p *fakePD) AllocFastRegMR(maxPages int) (transport.MR, error) {
	if maxPages <= 0 || maxPages > p.dev.attr.MaxMRPages {
		return nil, transport.ErrInvalidArgument
	}
	if p.dev.allocFail > 0 {
		p.dev.allocFail--
		return nil, transport.ErrNoResources
	}
	m := p.newMR()
	m.fast, m.maxPages, m.state = true, maxPages, transport.MRFree
	m.access = transport.AccessLocalWrite | transport.AccessRemote
	m.pages = make([]uint64, 0, maxPages)
	return m, nil
}

func (p *fakePD) CreateQP(attr transport.QPInitAttr) (transport.QP, error) {
	return newFakeQP(p, attr.Cap.MaxSendWR, attr.Cap.MaxSendSGE), nil
}

func (p *fakePD) Close() error { return nil }

type fakeMR struct {
	dev      *fakeDev
	pd       *fakePD
	index    uint32
	initKey  uint32
	fast     bool
	maxPages int
	closed   bool

	state  transport.MRState
	key    uint32
	access transport.Access
	iova   uint64
	length uint64
	pages  []uint64 // fast: copied at REG_MR execution
	buf    []byte   // regular
	reg    *fakeRegion
}

func (m *fakeMR) Index() uint32 { return m.index }
func (m *fakeMR) LKey() uint32  { return m.initKey }
func (m *fakeMR) RKey() uint32  { return m.initKey }
func (m *fakeMR) FastReg() bool { return m.fast }
func (m *fakeMR) MaxPages() int { return m.maxPages }
func (m *fakeMR) Query() transport.MRInfo {
	inf := transport.MRInfo{State: m.state, Key: m.key, FastReg: m.fast}
	if m.state == transport.MRValid {
		inf.IOVA, inf.Length, inf.Access, inf.NPages = m.iova, m.length, m.access, len(m.pages)
	}
	return inf
}

func (m *fakeMR) Close() error {
	if m.closed {
		return transport.ErrClosed
	}
	m.closed = true
	m.state = transport.MRInvalid
	if m.reg != nil {
		m.reg.users--
	}
	m.dev.mrs[m.index] = nil
	m.dev.freeIdx = append(m.dev.freeIdx, m.index)
	return nil
}

// span is a range of device memory an access touched.
type span struct{ addr, n uint64 }

// resolve maps [va, va+n) of a VALID MR to device address spans (range already checked).
func (m *fakeMR) resolve(va, n uint64, out []span) []span {
	if !m.fast {
		return append(out, span{va, n})
	}
	off := va - m.iova + m.iova%fakePage
	for n > 0 {
		pg := m.pages[off/fakePage]
		po := off % fakePage
		k := min(n, fakePage-po)
		out = append(out, span{pg + po, k})
		off += k
		n -= k
	}
	return out
}

func (m *fakeMR) inRange(va, n uint64) bool {
	return va >= m.iova && va-m.iova <= m.length && n <= m.length-(va-m.iova)
}

// lookup finds the MR a key names if that exact key is in force, VALID, with the rights.
func (d *fakeDev) lookup(key uint32, va, n uint64, need transport.Access) *fakeMR {
	idx := key >> 8
	if idx == 0 || int(idx) >= len(d.mrs) {
		return nil
	}
	m := d.mrs[idx]
	if m == nil || m.closed || m.state != transport.MRValid || m.key != key || m.access&need != need || !m.inRange(va, n) {
		return nil
	}
	return m
}

// copyMR moves bytes between b and the MR range [va, va+len(b)).
func (d *fakeDev) copyMR(m *fakeMR, va uint64, b []byte, write bool) {
	var tmp [16]span
	for _, s := range m.resolve(va, uint64(len(b)), tmp[:0]) {
		mem, _ := d.find(s.addr, s.n)
		if write {
			copy(mem, b[:s.n])
		} else {
			copy(b[:s.n], mem)
		}
		b = b[s.n:]
	}
}

// remoteAccess is a peer's RDMA READ (write=false) or WRITE of len(data) bytes at (rkey, va),
// through any QP of the PD. It returns the device memory touched, or ok=false if the responder
// would NAK (remote access error).
func (d *fakeDev) remoteAccess(rkey uint32, va uint64, data []byte, write bool) (touched []span, ok bool) {
	need := transport.AccessRemoteRead
	if write {
		need = transport.AccessRemoteWrite
	}
	if len(data) == 0 {
		return nil, true
	}
	m := d.lookup(rkey, va, uint64(len(data)), need)
	if m == nil {
		d.remoteDenied++
		return nil, false
	}
	d.remoteOK++
	d.copyMR(m, va, data, write)
	return m.resolve(va, uint64(len(data)), nil), true
}

// invalidate implements LOCAL_INV and remote invalidation (rxe_invalidate_mr).
func (d *fakeDev) invalidate(key uint32) bool {
	idx := key >> 8
	if idx == 0 || int(idx) >= len(d.mrs) {
		return false
	}
	m := d.mrs[idx]
	if m == nil || m.closed || !m.fast || m.key != key {
		return false
	}
	m.state = transport.MRFree
	m.pages = m.pages[:0]
	return true
}

// ---- QP ----

type fakeWQE struct {
	wr    transport.SendWR
	sgl   []transport.SGE // backing for wr.SGL (copied at post)
	pages []uint64        // REG_MR: snapshot of the page list at post, to detect mutation
}

type fakeQP struct {
	pd          *fakePD
	dev         *fakeDev
	qpn         uint32
	state       transport.QPState
	depth       int
	maxSGE      int
	maxRdAtomic uint8
	sq          []fakeWQE // ring
	sqHead      int
	sqN         int
	used        int // engine slots in use
	sendWC      []transport.WC
	recvWC      []transport.WC
	peer        *fakeDev // remote memory for RDMA READ / WRITE
	failPost    error    // next PostSend fails with this (nothing posted)
	sends       int      // SENDs executed
	posted      int      // WRs accepted
	executed    int
}

func newFakeQP(pd *fakePD, depth, maxSGE int) *fakeQP {
	if maxSGE == 0 {
		maxSGE = pd.dev.attr.MaxSGE
	}
	q := &fakeQP{pd: pd, dev: pd.dev, qpn: 0x11, state: transport.QPSRTS, depth: depth, maxSGE: maxSGE,
		maxRdAtomic: 4, sq: make([]fakeWQE, depth)}
	for i := range q.sq {
		q.sq[i].sgl = make([]transport.SGE, 0, maxSGE)
	}
	q.sendWC = make([]transport.WC, 0, 4*depth)
	return q
}

func (q *fakeQP) QPN() uint32              { return q.qpn }
func (q *fakeQP) State() transport.QPState { return q.state }
func (q *fakeQP) Query() transport.QPAttr {
	return transport.QPAttr{State: q.state, MaxRdAtomic: q.maxRdAtomic,
		Cap: transport.QPCap{MaxSendWR: q.depth, MaxRecvWR: q.depth, MaxSendSGE: q.maxSGE, MaxRecvSGE: 1}}
}
func (q *fakeQP) PostRecv([]transport.RecvWR) error { return nil }
func (q *fakeQP) SendQueueFree() int                { return q.depth - q.used }
func (q *fakeQP) RecvQueueFree() int                { return q.depth }
func (q *fakeQP) Close() error                      { q.sqN, q.used = 0, 0; return nil }

func (q *fakeQP) Modify(attr *transport.QPAttr, mask transport.QPAttrMask) error {
	if mask&transport.AttrState == 0 {
		return nil
	}
	switch attr.State {
	case transport.QPSErr:
		q.setError()
	case transport.QPSReset:
		q.reset()
	default:
		q.state = attr.State
	}
	return nil
}

func (q *fakeQP) PostSend(wrs []transport.SendWR) error {
	if err := q.failPost; err != nil {
		q.failPost = nil
		return &transport.PostError{Index: 0, WRID: wrs[0].ID, Err: err}
	}
	switch q.state {
	case transport.QPSRTS, transport.QPSSQD, transport.QPSErr:
	default:
		return transport.ErrQPState
	}
	if len(wrs) > q.depth-q.used {
		return &transport.PostError{Index: 0, WRID: wrs[0].ID, Err: transport.ErrSQFull}
	}
	for i := range wrs {
		w := &wrs[i]
		bad := false
		switch w.Opcode {
		case transport.WRRegMR:
			bad = w.Reg.MR == nil || len(w.Reg.Pages) > w.Reg.MR.MaxPages()
		case transport.WRLocalInv:
		case transport.WRSend, transport.WRSendWithImm, transport.WRRDMAWrite, transport.WRRDMARead, transport.WRSendWithInv:
			bad = len(w.SGL) > q.maxSGE
		default:
			bad = true
		}
		if bad {
			return &transport.PostError{Index: i, WRID: w.ID, Err: transport.ErrInvalidWR}
		}
	}
	for i := range wrs {
		q.posted++
		if q.state == transport.QPSErr {
			q.used++
			q.pushWC(&wrs[i], transport.WCWRFlushErr)
			continue
		}
		slot := &q.sq[(q.sqHead+q.sqN)%len(q.sq)]
		slot.wr = wrs[i]
		slot.sgl = append(slot.sgl[:0], wrs[i].SGL...)
		slot.wr.SGL = slot.sgl
		slot.pages = append(slot.pages[:0], wrs[i].Reg.Pages...)
		q.sqN++
		q.used++
	}
	return nil
}

func (q *fakeQP) pushWC(wr *transport.SendWR, st transport.WCStatus) {
	q.used--
	q.sendWC = append(q.sendWC, transport.WC{ID: wr.ID, Status: st, Opcode: wr.Opcode.CompletionOpcode(), QPN: q.qpn})
}

// pending is the number of WRs posted and not executed.
func (q *fakeQP) pending() int { return q.sqN }

// pendingRegKey reports whether an unexecuted REG_MR with key is queued.
func (q *fakeQP) pendingRegKey(key uint32) bool {
	for i := 0; i < q.sqN; i++ {
		w := &q.sq[(q.sqHead+i)%len(q.sq)].wr
		if w.Opcode == transport.WRRegMR && w.Reg.Key == key {
			return true
		}
	}
	return false
}

// exec executes the oldest pending WR. It reports false if none is pending.
func (q *fakeQP) exec() bool {
	if q.sqN == 0 || q.state != transport.QPSRTS {
		return false
	}
	slot := &q.sq[q.sqHead]
	q.sqHead = (q.sqHead + 1) % len(q.sq)
	q.sqN--
	q.executed++
	wr := &slot.wr
	st := q.execWR(wr, slot.pages)
	if st != transport.WCSuccess || wr.Flags&transport.SendSignaled != 0 {
		q.pushWC(wr, st)
	} else {
		q.used--
	}
	if st != transport.WCSuccess {
		q.setError()
	}
	return true
}

func (q *fakeQP) execWR(wr *transport.SendWR, snap []uint64) transport.WCStatus {
	d := q.dev
	switch wr.Opcode {
	case transport.WRRegMR:
		w := &wr.Reg
		if len(snap) != len(w.Pages) {
			d.pageMutation++
		} else {
			for i := range snap {
				if snap[i] != w.Pages[i] {
					d.pageMutation++
					break
				}
			}
		}
		m, _ := w.MR.(*fakeMR)
		ok := m != nil && !m.closed && m.fast && m.dev == d && m.state == transport.MRFree && m.pd == q.pd &&
			w.Key>>8 == m.index && len(w.Pages) <= m.maxPages && w.PageSize == fakePage &&
			w.Length <= uint64(len(w.Pages))*fakePage-w.IOVA%fakePage
		for _, a := range w.Pages {
			if b, _ := d.find(a, fakePage); !ok || a%fakePage != 0 || b == nil {
				ok = false
				break
			}
		}
		if !ok {
			d.regFail++
			return transport.WCLocQPOpErr
		}
		m.pages = append(m.pages[:0], w.Pages...) // copied now, at execution
		m.key, m.iova, m.length, m.access, m.state = w.Key, w.IOVA, w.Length, w.Access, transport.MRValid
		return transport.WCSuccess
	case transport.WRLocalInv:
		if !d.invalidate(wr.InvalidateRKey) {
			d.invFail++
			return transport.WCLocQPOpErr
		}
		return transport.WCSuccess
	case transport.WRSend, transport.WRSendWithImm, transport.WRSendWithInv:
		for _, s := range wr.SGL {
			if d.lookupLocal(s) == nil {
				return transport.WCLocProtErr
			}
		}
		q.sends++
		return transport.WCSuccess
	case transport.WRRDMAWrite, transport.WRRDMARead:
		var total uint64
		for _, s := range wr.SGL {
			total += uint64(s.Length)
		}
		if total == 0 {
			return transport.WCSuccess // zero-length: the rkey is not looked at
		}
		need := transport.AccessRemoteWrite
		if wr.Opcode == transport.WRRDMARead {
			need = transport.AccessRemoteRead
		}
		if q.peer == nil {
			return transport.WCRemAccessErr
		}
		rm := q.peer.lookup(wr.RKey, wr.RemoteAddr, total, need)
		if rm == nil {
			return transport.WCRemAccessErr
		}
		va := wr.RemoteAddr
		for _, s := range wr.SGL {
			if s.Host != nil { // SGE.Host: a WRITE's source in process memory
				if wr.Opcode != transport.WRRDMAWrite || len(s.Host) != int(s.Length) {
					return transport.WCLocProtErr
				}
				q.peer.copyMR(rm, va, append([]byte(nil), s.Host...), true)
				va += uint64(s.Length)
				continue
			}
			lm := d.lookupLocal(s)
			if lm == nil || (wr.Opcode == transport.WRRDMARead && lm.access&transport.AccessLocalWrite == 0) {
				return transport.WCLocProtErr
			}
			buf := make([]byte, s.Length)
			if wr.Opcode == transport.WRRDMAWrite {
				d.copyMR(lm, s.Addr, buf, false)
				q.peer.copyMR(rm, va, buf, true)
			} else {
				q.peer.copyMR(rm, va, buf, false)
				d.copyMR(lm, s.Addr, buf, true)
			}
			va += uint64(s.Length)
		}
		return transport.WCSuccess
	}
	return transport.WCLocQPOpErr
}

// lookupLocal checks an SGE against the local MR table (lkey = key in force).
func (d *fakeDev) lookupLocal(s transport.SGE) *fakeMR {
	idx := s.LKey >> 8
	if idx == 0 || int(idx) >= len(d.mrs) {
		return nil
	}
	m := d.mrs[idx]
	if m == nil || m.closed || m.state != transport.MRValid || m.key != s.LKey || !m.inRange(s.Addr, uint64(s.Length)) {
		return nil
	}
	return m
}

// setError moves the QP to ERR and flushes every WR not executed.
func (q *fakeQP) setError() {
	q.state = transport.QPSErr
	for q.sqN > 0 {
		slot := &q.sq[q.sqHead]
		q.sqHead = (q.sqHead + 1) % len(q.sq)
		q.sqN--
		q.pushWC(&slot.wr, transport.WCWRFlushErr)
	}
}

// reset discards WRs and completions (QP → RESET) and brings the QP back to RTS, as a reconnect.
func (q *fakeQP) reset() {
	q.sqN, q.sqHead, q.used = 0, 0, 0
	q.sendWC = q.sendWC[:0]
	q.recvWC = q.recvWC[:0]
	q.state = transport.QPSRTS
}

// popSend removes the oldest undelivered send completion, popRecv the oldest receive one.
func (q *fakeQP) popSend() (transport.WC, bool) { return popWC(&q.sendWC) }
func (q *fakeQP) popRecv() (transport.WC, bool) { return popWC(&q.recvWC) }

// popWC removes the first completion of *wcs (in place: the slice keeps its array).
func popWC(wcs *[]transport.WC) (transport.WC, bool) {
	if len(*wcs) == 0 {
		return transport.WC{}, false
	}
	wc := (*wcs)[0]
	copy(*wcs, (*wcs)[1:])
	*wcs = (*wcs)[:len(*wcs)-1]
	return wc, true
}

// remoteInvalidate is the peer's SEND_WITH_INV naming rkey arriving at our responder.
func (q *fakeQP) remoteInvalidate(rkey uint32) {
	if q.state == transport.QPSErr {
		return // dropped
	}
	if q.dev.invalidate(rkey) {
		q.recvWC = append(q.recvWC, transport.WC{Status: transport.WCSuccess, Opcode: transport.WCRecv,
			Flags: transport.WCWithInvalidate, InvalidatedRKey: rkey, QPN: q.qpn})
		return
	}
	q.recvWC = append(q.recvWC, transport.WC{Status: transport.WCRemInvReqErr, Opcode: transport.WCRecv, QPN: q.qpn})
	q.setError()
}

// fakeDevice wraps fakeDev as a transport.Device (for code that wants one).
type fakeDevice struct{ *fakeDev }

func (d fakeDevice) Name() string                                { return d.name }
func (d fakeDevice) Attr() transport.DeviceAttr                  { return d.attr }
func (d fakeDevice) GIDs() []transport.GID                       { return nil }
func (d fakeDevice) Addrs() []netip.AddrPort                     { return nil }
func (d fakeDevice) CreateCQ(int) (transport.CQ, error)          { return nil, transport.ErrNotSupported }
func (d fakeDevice) Close(context.Context) error                 { return nil }
func (d fakeDevice) String() string                              { return fmt.Sprintf("fake(%s)", d.name) }
func (d fakeDevice) AllocPD() (transport.PD, error)              { return d.fakeDev.AllocPD() }
func (d fakeDevice) AllocMemory(n int) (transport.Memory, error) { return d.fakeDev.AllocMemory(n) }

var (
	_ transport.Device = fakeDevice{}
	_ transport.QP     = (*fakeQP)(nil)
	_ transport.MR     = (*fakeMR)(nil)
	_ transport.PD     = (*fakePD)(nil)
	_ transport.Memory = fakeMemory{}
)
