//go:build verbs && linux && cgo

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"math/bits"
	"unsafe"

	"github.com/srpd/srpd/transport"
)

func postErr(i int, wr uint64, err error) error {
	return &transport.PostError{Index: i, WRID: wr, Err: err}
}

// ibvOpcodes maps a transport opcode to enum ibv_wr_opcode (REG_MR is posted as BIND_MW); ok
// is false for an opcode the engine does not post.
var ibvOpcodes = [...]struct {
	op C.uint32_t
	ok bool
}{
	transport.WRRDMAWrite:        {C.IBV_WR_RDMA_WRITE, true},
	transport.WRRDMAWriteWithImm: {C.IBV_WR_RDMA_WRITE_WITH_IMM, true},
	transport.WRSend:             {C.IBV_WR_SEND, true},
	transport.WRSendWithImm:      {C.IBV_WR_SEND_WITH_IMM, true},
	transport.WRRDMARead:         {C.IBV_WR_RDMA_READ, true},
	transport.WRSendWithInv:      {C.IBV_WR_SEND_WITH_INV, true},
	transport.WRLocalInv:         {C.IBV_WR_LOCAL_INV, true},
	transport.WRRegMR:            {C.IBV_WR_BIND_MW, true},
}

// ibvOpcode is op's enum ibv_wr_opcode (ibvOpcodes).
func ibvOpcode(op transport.WROpcode) (C.uint32_t, bool) {
	if int(op) >= len(ibvOpcodes) {
		return 0, false
	}
	e := ibvOpcodes[op]
	return e.op, e.ok
}

// PostSend implements transport.QP. The chain is validated completely before anything reaches
// the device; a device refusal after that (not expected) leaves the WRs before the refused one
// posted, and the PostError says which one was refused.
func (q *qp) PostSend(wrs []transport.SendWR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(wrs) == 0 {
		return nil
	}
	if q.closed {
		return postErr(0, wrs[0].ID, transport.ErrClosed)
	}
	switch q.state {
	case transport.QPSRTS, transport.QPSSQD, transport.QPSErr:
	default:
		return postErr(0, wrs[0].ID, fmt.Errorf("%w: QP %#x in %v", transport.ErrQPState, q.qpn, q.state))
	}
	for i := range wrs {
		if err := q.checkSend(&wrs[i]); err != nil {
			return postErr(i, wrs[i].ID, err)
		}
	}
	free := len(q.sq) - int(q.sqTail-q.sqHead)
	if len(wrs) > free {
		return postErr(free, wrs[free].ID, transport.ErrSQFull)
	}
	n := uint64(len(q.sq))
	if q.state == transport.QPSErr {
		for i := range wrs {
			q.sq[(q.sqTail+uint64(i))%n] = sqEntry{id: wrs[i].ID, op: wrs[i].Opcode, soft: true}
		}
		q.sqTail += uint64(len(wrs))
		q.softFlushLocked()
		return nil
	}
	// Windows need their backing MR before anything is built.
	var backing []*C.struct_ibv_mr
	for i := range wrs {
		if wrs[i].Opcode != transport.WRRegMR {
			continue
		}
		mr, err := q.backingFor(&wrs[i].Reg)
		if err != nil {
			return postErr(i, wrs[i].ID, err)
		}
		backing = append(backing, mr)
	}
	cw := unsafe.Slice(q.cwr, len(q.sq))
	cs := unsafe.Slice(q.csge, len(q.sq)*q.caps.MaxSendSGE)
	sgeOff, bi := 0, 0
	for i := range wrs {
		wr := &wrs[i]
		seq := q.sqTail + uint64(i)
		op, _ := ibvOpcode(wr.Opcode)
		w := &cw[i]
		*w = C.struct_shim_wr{}
		w.wr_id = C.uint64_t(q.gen<<genShift | seq&seqMask32)
		w.opcode = op
		w.flags = C.uint32_t(wr.Flags)
		if q.sigAll {
			w.flags |= C.IBV_SEND_SIGNALED
		}
		e := sqEntry{id: wr.ID, op: wr.Opcode, signaled: wr.Flags&transport.SendSignaled != 0}
		switch wr.Opcode {
		case transport.WRRegMR:
			r := &wr.Reg
			f := r.MR.(*fastMR)
			w.mw = f.ib
			w.mr = backing[bi]
			bi++
			w.rkey = C.uint32_t(r.Key)
			w.remote_addr = C.uint64_t(r.IOVA)
			w.length = C.uint64_t(r.Length)
			w.access = C.uint32_t(r.Access & (transport.AccessRemoteRead | transport.AccessRemoteWrite | transport.AccessRemoteAtomic))
			w.cur_rkey = C.uint32_t(f.swKey)
			f.swKey = r.Key
			e.mw, e.key, e.iova, e.length, e.access = f, r.Key, r.IOVA, r.Length, r.Access
			e.pageSize, e.npages = r.PageSize, len(r.Pages)
		case transport.WRLocalInv:
			w.imm = C.uint32_t(wr.InvalidateRKey)
			e.mw, e.key = q.dev.mwByKey(wr.InvalidateRKey), wr.InvalidateRKey
		case transport.WRSendWithInv:
			w.imm = C.uint32_t(wr.InvalidateRKey)
		case transport.WRSendWithImm, transport.WRRDMAWriteWithImm:
			w.imm = C.uint32_t(wr.Imm)
		}
		switch wr.Opcode {
		case transport.WRRDMAWrite, transport.WRRDMAWriteWithImm, transport.WRRDMARead:
			w.remote_addr = C.uint64_t(wr.RemoteAddr)
			w.rkey = C.uint32_t(wr.RKey)
		}
		if wr.Opcode != transport.WRRegMR && wr.Opcode != transport.WRLocalInv {
			w.sge_off = C.uint32_t(sgeOff)
			w.num_sge = C.uint32_t(len(wr.SGL))
			for _, s := range wr.SGL {
				cs[sgeOff] = C.struct_ibv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Length), lkey: C.uint32_t(s.LKey)}
				sgeOff++
			}
		}
		q.sq[seq%n] = e
	}
	var bad C.int
	r := C.shim_post_send(q.ib, q.cwr, C.int(len(wrs)), q.csge, q.cscratch, &bad)
	if r != 0 {
		posted := int(bad)
		if posted < 0 {
			posted = 0
		}
		for i := len(wrs) - 1; i >= posted; i-- { // undo the key bookkeeping of unposted binds
			if wrs[i].Opcode == transport.WRRegMR {
				f := wrs[i].Reg.MR.(*fastMR)
				f.swKey = uint32(cw[i].cur_rkey)
				f.ib.rkey = cw[i].cur_rkey
			}
		}
		for i := posted; i < len(wrs); i++ {
			q.sq[(q.sqTail+uint64(i))%n] = sqEntry{}
		}
		q.sqTail += uint64(posted)
		return postErr(posted, wrs[posted].ID, fmt.Errorf("%w: %v", transport.ErrInvalidWR, posErrno("ibv_post_send", r)))
	}
	q.sqTail += uint64(len(wrs))
	return nil
}

// checkSend validates one send WR (q.mu held).
func (q *qp) checkSend(wr *transport.SendWR) error {
	if _, ok := ibvOpcode(wr.Opcode); !ok {
		return fmt.Errorf("%w: %v", transport.ErrInvalidOpcode, wr.Opcode)
	}
	if len(wr.SGL) > q.caps.MaxSendSGE {
		return fmt.Errorf("%w: %d > %d", transport.ErrTooManySGE, len(wr.SGL), q.caps.MaxSendSGE)
	}
	if wr.Flags&^(transport.SendFence|transport.SendSignaled|transport.SendSolicited|transport.SendInline) != 0 {
		return fmt.Errorf("%w: flags %#x", transport.ErrInvalidWR, wr.Flags)
	}
	if hasHost(wr.SGL) {
		return fmt.Errorf("%w: SGE.Host (DeviceAttr.HostSGE is false: memory must be registered)", transport.ErrInvalidWR)
	}
	switch wr.Opcode {
	case transport.WRRDMARead, transport.WRLocalInv, transport.WRRegMR:
		if wr.Flags&(transport.SendInline|transport.SendSolicited) != 0 {
			return fmt.Errorf("%w: inline or solicited %v", transport.ErrInvalidWR, wr.Opcode)
		}
	}
	if wr.Flags&transport.SendInline != 0 {
		total := 0
		q.dev.mu.Lock()
		for _, s := range wr.SGL {
			total += int(s.Length)
			if q.dev.findRegion(s.Addr, uint64(s.Length)) == nil {
				q.dev.mu.Unlock()
				return fmt.Errorf("%w: inline SGE [%#x, +%d)", transport.ErrBadAddress, s.Addr, s.Length)
			}
		}
		q.dev.mu.Unlock()
		if total > q.caps.MaxInlineData {
			return fmt.Errorf("%w: %d > %d", transport.ErrInlineTooLong, total, q.caps.MaxInlineData)
		}
	}
	if wr.Opcode == transport.WRRegMR {
		return q.checkReg(&wr.Reg)
	}
	return nil
}

// checkReg validates a REG_MR in the form a type-2 window can carry (see the package doc).
func (q *qp) checkReg(r *transport.RegMRWR) error {
	if r.MR == nil {
		return fmt.Errorf("%w: REG_MR without an MR", transport.ErrInvalidWR)
	}
	f, ok := r.MR.(*fastMR)
	if !ok {
		return fmt.Errorf("%w: REG_MR on an MR that is not a fast-reg MR of this engine", transport.ErrInvalidWR)
	}
	if f.pd != q.pd {
		return fmt.Errorf("%w: REG_MR: MR of another PD", transport.ErrWrongDevice)
	}
	ps := uint64(r.PageSize)
	switch {
	case r.Key>>8 != f.Index():
		return fmt.Errorf("%w: REG_MR key %#x for MR index %#x", transport.ErrInvalidWR, r.Key, f.Index())
	case ps < 4096 || bits.OnesCount64(ps) != 1:
		return fmt.Errorf("%w: page size %d", transport.ErrInvalidWR, r.PageSize)
	case len(r.Pages) == 0 || len(r.Pages) > f.maxPages:
		return fmt.Errorf("%w: %d pages (MR holds %d)", transport.ErrInvalidWR, len(r.Pages), f.maxPages)
	case r.Length == 0 || r.Length > uint64(len(r.Pages))*ps-r.IOVA%ps:
		return fmt.Errorf("%w: length %d over %d pages", transport.ErrInvalidWR, r.Length, len(r.Pages))
	case r.Access.Validate() != nil:
		return fmt.Errorf("%w: access %v", transport.ErrInvalidWR, r.Access)
	}
	for i, p := range r.Pages {
		if p%ps != 0 {
			return fmt.Errorf("%w: page %d at %#x not aligned", transport.ErrInvalidWR, i, p)
		}
		if p != r.Pages[0]+uint64(i)*ps {
			return fmt.Errorf("%w: page list not virtually contiguous (a memory window maps one range)", transport.ErrNotSupported)
		}
	}
	if r.IOVA-r.IOVA%ps != r.Pages[0] {
		return fmt.Errorf("%w: IOVA %#x is not the address of the first page %#x (a memory window is not zero-based here)",
			transport.ErrNotSupported, r.IOVA, r.Pages[0])
	}
	return nil
}

// backingFor returns the hidden backing MR a window bind over r uses. q.mu held.
func (q *qp) backingFor(r *transport.RegMRWR) (*C.struct_ibv_mr, error) {
	d := q.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	reg := d.findRegion(r.IOVA, r.Length)
	if reg == nil {
		return nil, fmt.Errorf("%w: REG_MR range [%#x, +%d) outside device memory", transport.ErrBadAddress, r.IOVA, r.Length)
	}
	mr, err := reg.backingMR(q.pd)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", transport.ErrNoResources, err)
	}
	return mr, nil
}

// PostRecv implements transport.QP.
func (q *qp) PostRecv(wrs []transport.RecvWR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(wrs) == 0 {
		return nil
	}
	if q.closed {
		return postErr(0, wrs[0].ID, transport.ErrClosed)
	}
	if q.state == transport.QPSReset {
		return postErr(0, wrs[0].ID, fmt.Errorf("%w: QP %#x in RESET", transport.ErrQPState, q.qpn))
	}
	for i := range wrs {
		if len(wrs[i].SGL) > q.caps.MaxRecvSGE {
			return postErr(i, wrs[i].ID, fmt.Errorf("%w: %d > %d", transport.ErrTooManySGE, len(wrs[i].SGL), q.caps.MaxRecvSGE))
		}
		if hasHost(wrs[i].SGL) {
			return postErr(i, wrs[i].ID, fmt.Errorf("%w: SGE.Host in a receive", transport.ErrInvalidWR))
		}
	}
	free := len(q.rq) - int(q.rqTail-q.rqHead)
	if len(wrs) > free {
		return postErr(free, wrs[free].ID, transport.ErrRQFull)
	}
	n := uint64(len(q.rq))
	if q.state == transport.QPSErr {
		for i := range wrs {
			q.rq[(q.rqTail+uint64(i))%n] = rqEntry{id: wrs[i].ID, soft: true}
		}
		q.rqTail += uint64(len(wrs))
		q.softFlushLocked()
		return nil
	}
	ids := unsafe.Slice(q.rids, len(q.rq))
	offs := unsafe.Slice(q.roff, len(q.rq))
	nums := unsafe.Slice(q.rnum, len(q.rq))
	cs := unsafe.Slice(q.rsge, len(q.rq)*q.caps.MaxRecvSGE)
	off := 0
	for i := range wrs {
		seq := q.rqTail + uint64(i)
		ids[i] = C.uint64_t(wrRecv | q.gen<<genShift | seq&seqMask32)
		offs[i] = C.uint32_t(off)
		nums[i] = C.uint32_t(len(wrs[i].SGL))
		for _, s := range wrs[i].SGL {
			cs[off] = C.struct_ibv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Length), lkey: C.uint32_t(s.LKey)}
			off++
		}
		q.rq[seq%n] = rqEntry{id: wrs[i].ID}
	}
	var bad C.int
	r := C.shim_post_recv(q.ib, q.rids, q.roff, q.rnum, C.int(len(wrs)), q.rsge, q.rscratch, &bad)
	if r != 0 {
		posted := max(int(bad), 0)
		q.rqTail += uint64(posted)
		return postErr(posted, wrs[posted].ID, fmt.Errorf("%w: %v", transport.ErrInvalidWR, posErrno("ibv_post_recv", r)))
	}
	q.rqTail += uint64(len(wrs))
	return nil
}

// hasHost reports whether sgl has an SGE.Host, which a NIC cannot reach.
func hasHost(sgl []transport.SGE) bool {
	for i := range sgl {
		if sgl[i].Host != nil {
			return true
		}
	}
	return false
}
