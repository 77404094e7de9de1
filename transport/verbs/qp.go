//go:build verbs && linux && cgo

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/srpd/srpd/transport"
)

// Wire work-request IDs: bit 63 receive, bits 32..62 the QP's generation, bits 0..31 the low
// bits of the WR's sequence number on its queue. The generation keeps completions of a
// destroyed QP (whose number the device may reuse) from being taken for another's.
const (
	wrRecv    = uint64(1) << 63
	genShift  = 32
	genMask   = (uint64(1) << 31) - 1
	seqMask32 = (uint64(1) << 32) - 1
)

// sqEntry is the engine's record of a posted send WR.
type sqEntry struct {
	id       uint64
	op       transport.WROpcode
	signaled bool
	soft     bool // posted while the QP was in ERR: the engine flushes it
	// REG_MR (a bind) and LOCAL_INV: the window and what the WR installs.
	mw       *fastMR
	key      uint32
	iova     uint64
	length   uint64
	access   transport.Access
	pageSize uint32
	npages   int
}

type rqEntry struct {
	id   uint64
	soft bool
}

// qp implements transport.QP.
type qp struct {
	dev      *Device
	pd       *pd
	scq, rcq *cq
	ib       *C.struct_ibv_qp
	qpn      uint32
	gen      uint64
	caps     transport.QPCap
	sigAll   bool

	mu     sync.Mutex
	state  transport.QPState // the engine's view; HW may be in ERR already (State asks it)
	closed bool
	sq     []sqEntry
	sqHead uint64 // oldest outstanding
	sqTail uint64 // next sequence number
	rq     []rqEntry
	rqHead uint64
	rqTail uint64
	// pendingAccept is the passive connection waiting for its RTU (COMM_EST goes to it).
	pendingAccept *cmConn

	// C scratch for posting (C memory; guarded by mu).
	cwr      *C.struct_shim_wr
	csge     *C.struct_ibv_sge
	cscratch *C.struct_ibv_send_wr
	rids     *C.uint64_t
	roff     *C.uint32_t
	rnum     *C.uint32_t
	rsge     *C.struct_ibv_sge
	rscratch *C.struct_ibv_recv_wr
	flushBuf []transport.WC
}

func (p *pd) createQP(attr transport.QPInitAttr) (*qp, error) {
	if attr.Type != 0 && attr.Type != transport.QPTypeRC {
		return nil, fmt.Errorf("verbs: QP type %d: %w", attr.Type, transport.ErrNotSupported)
	}
	sc, ok1 := attr.SendCQ.(*cq)
	rc, ok2 := attr.RecvCQ.(*cq)
	d := p.dev
	if !ok1 || !ok2 || sc.dev != d || rc.dev != d {
		return nil, fmt.Errorf("verbs: create QP: %w", transport.ErrWrongDevice)
	}
	cp, err := d.attr.CheckQPCap(attr.Cap)
	if err != nil {
		return nil, fmt.Errorf("verbs: create QP: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || p.closed {
		return nil, transport.ErrClosed
	}
	caps := C.struct_shim_caps{send_wr: C.uint32_t(cp.MaxSendWR), recv_wr: C.uint32_t(cp.MaxRecvWR),
		send_sge: C.uint32_t(cp.MaxSendSGE), recv_sge: C.uint32_t(cp.MaxRecvSGE), inline_data: C.uint32_t(cp.MaxInlineData)}
	sig := C.int(0)
	if attr.SQSigAll {
		sig = 1
	}
	ib, err := C.shim_create_qp(p.ib, sc.ib, rc.ib, &caps, sig)
	if ib == nil {
		return nil, fmt.Errorf("%w: %v", transport.ErrNoResources, errnoErr("ibv_create_qp", err))
	}
	q := &qp{dev: d, pd: p, scq: sc, rcq: rc, ib: ib, qpn: uint32(C.shim_qp_num(ib)), sigAll: attr.SQSigAll,
		gen: uint64(d.gen.Add(1)) & genMask,
		caps: transport.QPCap{MaxSendWR: int(caps.send_wr), MaxRecvWR: int(caps.recv_wr), MaxSendSGE: int(caps.send_sge),
			MaxRecvSGE: int(caps.recv_sge), MaxInlineData: int(caps.inline_data)}}
	// The engine's queues are as deep as the request: the device may round up, but the
	// slot accounting (SendQueueFree) follows what the caller asked for.
	q.caps.MaxSendWR, q.caps.MaxRecvWR = min(q.caps.MaxSendWR, max(cp.MaxSendWR, 1)), min(q.caps.MaxRecvWR, max(cp.MaxRecvWR, 1))
	q.sq = make([]sqEntry, q.caps.MaxSendWR)
	q.rq = make([]rqEntry, q.caps.MaxRecvWR)
	ns, nr := q.caps.MaxSendWR, q.caps.MaxRecvWR
	q.cwr = (*C.struct_shim_wr)(C.calloc(C.size_t(ns), C.size_t(unsafe.Sizeof(C.struct_shim_wr{}))))
	q.csge = (*C.struct_ibv_sge)(C.calloc(C.size_t(ns*q.caps.MaxSendSGE), C.size_t(unsafe.Sizeof(C.struct_ibv_sge{}))))
	q.cscratch = (*C.struct_ibv_send_wr)(C.calloc(C.size_t(ns), C.size_t(unsafe.Sizeof(C.struct_ibv_send_wr{}))))
	q.rids = (*C.uint64_t)(C.calloc(C.size_t(nr), 8))
	q.roff = (*C.uint32_t)(C.calloc(C.size_t(nr), 4))
	q.rnum = (*C.uint32_t)(C.calloc(C.size_t(nr), 4))
	q.rsge = (*C.struct_ibv_sge)(C.calloc(C.size_t(nr*q.caps.MaxRecvSGE), C.size_t(unsafe.Sizeof(C.struct_ibv_sge{}))))
	q.rscratch = (*C.struct_ibv_recv_wr)(C.calloc(C.size_t(nr), C.size_t(unsafe.Sizeof(C.struct_ibv_recv_wr{}))))
	q.flushBuf = make([]transport.WC, 0, max(ns, nr))
	sc.users++
	rc.users++
	p.nqp++
	d.qpMu.Lock()
	d.qps[q.qpn] = q
	d.qpMu.Unlock()
	return q, nil
}

func (q *qp) QPN() uint32 { return q.qpn }

// State implements transport.QP: the device's state (ibv_query_qp), which may have moved to
// ERR on its own.
func (q *qp) State() transport.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return q.state
	}
	var a C.struct_shim_qpattr
	if C.shim_query_qp(q.ib, &a, nil, C.IBV_QP_STATE) == 0 {
		hw := transport.QPState(a.state)
		if hw == transport.QPSErr && q.state != transport.QPSErr {
			q.state = transport.QPSErr
		}
		if hw == transport.QPSSQE {
			q.state = transport.QPSErr
		}
	}
	return q.state
}

func (q *qp) modifyLimits() transport.ModifyLimits {
	d := q.dev
	return transport.ModifyLimits{MaxQPRdAtom: d.attr.MaxQPRdAtom, MaxQPInitRdAtom: d.attr.MaxQPInitRdAtom,
		MaxMTU: d.attr.ActiveMTU, LocalAddr: d.isLocal}
}

// Modify implements transport.QP.
func (q *qp) Modify(attr *transport.QPAttr, mask transport.QPAttrMask) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return &transport.ModifyError{From: q.state, To: attr.State, Err: transport.ErrClosed}
	}
	next, err := transport.ValidateModify(q.state, attr, mask, q.modifyLimits())
	if err != nil {
		return err
	}
	var a C.struct_shim_qpattr
	a.state = C.uint32_t(next)
	a.cur_state = C.uint32_t(attr.CurState)
	a.access = C.uint32_t(attr.AccessFlags &^ transport.AccessLocalWrite)
	a.pkey_index = C.uint32_t(attr.PKeyIndex)
	a.port = C.uint32_t(q.dev.port)
	a.path_mtu = C.uint32_t(attr.PathMTU)
	a.timeout = C.uint32_t(attr.Timeout)
	a.retry_cnt = C.uint32_t(attr.RetryCnt)
	a.rnr_retry = C.uint32_t(attr.RNRRetry)
	a.rq_psn = C.uint32_t(attr.RQPSN)
	a.sq_psn = C.uint32_t(attr.SQPSN)
	a.max_rd_atomic = C.uint32_t(attr.MaxRdAtomic)
	a.max_dest_rd_atomic = C.uint32_t(attr.MaxDestRdAtomic)
	a.min_rnr_timer = C.uint32_t(attr.MinRNRTimer)
	a.dest_qpn = C.uint32_t(attr.DestQPN)
	if mask&transport.AttrAV != 0 {
		av := attr.AV
		if av.DstPort != 0 && av.DstPort != transport.RoCEv2Port {
			return &transport.ModifyError{From: q.state, To: next, Attrs: transport.AttrAV, Err: transport.ErrInvalidAttr,
				Detail: fmt.Sprintf("UDP port %d: the kernel's RoCEv2 uses %d only", av.DstPort, transport.RoCEv2Port)}
		}
		idx := q.dev.sgidIndex(av.SrcAddr)
		if idx < 0 {
			return &transport.ModifyError{From: q.state, To: next, Attrs: transport.AttrAV, Err: transport.ErrInvalidAttr,
				Detail: fmt.Sprintf("no RoCEv2 GID for %v", av.SrcAddr)}
		}
		a.sgid_index = C.uint32_t(idx)
		hl := av.HopLimit
		if hl == 0 {
			hl = 64
		}
		a.hop_limit = C.uint32_t(hl)
		a.traffic_class = C.uint32_t(av.TrafficClass)
		a.flow_label = C.uint32_t(av.FlowLabel)
		g := transport.GIDFromAddr(av.DstAddr.Unmap())
		for i := range g {
			a.dgid[i] = C.uint8_t(g[i])
		}
	}
	m := mask | transport.AttrState
	if next == transport.QPSInit && q.state == transport.QPSReset {
		m |= transport.AttrPort // the device's port, whatever the caller's 1 was
	}
	if r := C.shim_modify_qp(q.ib, &a, C.int(m)); r != 0 {
		return &transport.ModifyError{From: q.state, To: next, Err: transport.ErrInvalidAttr,
			Detail: fmt.Sprintf("ibv_modify_qp: %v", posErrno("modify", r))}
	}
	q.setStateLocked(next)
	return nil
}

// setStateLocked records a state the QP was moved to. q.mu held.
func (q *qp) setStateLocked(next transport.QPState) {
	q.state = next
	if next == transport.QPSReset {
		// Outstanding WRs are discarded without completions; their completions, if the
		// device still reports some, fall outside [head, tail) and are dropped.
		q.sqHead, q.rqHead = q.sqTail, q.rqTail
	}
}

// cmModify moves the QP to state with the attributes rdma_cm derives for id.
func (q *qp) cmModify(id *C.struct_rdma_cm_id, state transport.QPState, rdOverride int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return transport.ErrClosed
	}
	if r := C.shim_cm_modify(id, q.ib, C.int(state), C.int(rdOverride)); r != 0 {
		return fmt.Errorf("verbs: QP %#x to %v for rdma_cm: %w", q.qpn, state, negErrno("modify", r))
	}
	q.setStateLocked(state)
	return nil
}

// toErr moves the QP to ERR (disconnect, device close); errors are ignored.
func (q *qp) toErr() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.toErrLocked()
}

func (q *qp) toErrLocked() {
	if q.closed || q.state == transport.QPSErr || q.state == transport.QPSReset {
		return
	}
	var a C.struct_shim_qpattr
	a.state = C.IBV_QPS_ERR
	if C.shim_modify_qp(q.ib, &a, C.IBV_QP_STATE) == 0 {
		q.state = transport.QPSErr
	}
}

// drain waits (bounded by ctx) until every outstanding WR has completed, or until the device has
// reported nothing for a while: unsignaled WRs that completed before the QP entered ERR are
// never reported (no later completion retires them), so an empty-handed quiet period ends the
// wait too.
func (q *qp) drain(ctx context.Context) error {
	const quiet = 100 * time.Millisecond
	var lastS, lastR uint64
	since := time.Now()
	for {
		q.mu.Lock()
		idle := q.closed || q.state == transport.QPSReset || (q.sqHead == q.sqTail && q.rqHead == q.rqTail)
		hs, hr := q.sqHead, q.rqHead
		q.mu.Unlock()
		if idle {
			return nil
		}
		if hs != lastS || hr != lastR {
			lastS, lastR, since = hs, hr, time.Now()
		} else if time.Since(since) > quiet {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// Query implements transport.QP.
func (q *qp) Query() transport.QPAttr {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := transport.QPAttr{State: q.state, Cap: q.caps, SQSigAll: q.sigAll, Port: 1}
	if q.closed {
		return out
	}
	var a C.struct_shim_qpattr
	mask := C.IBV_QP_STATE | C.IBV_QP_CUR_STATE | C.IBV_QP_ACCESS_FLAGS | C.IBV_QP_PKEY_INDEX | C.IBV_QP_PORT |
		C.IBV_QP_AV | C.IBV_QP_PATH_MTU | C.IBV_QP_TIMEOUT | C.IBV_QP_RETRY_CNT | C.IBV_QP_RNR_RETRY |
		C.IBV_QP_RQ_PSN | C.IBV_QP_MAX_QP_RD_ATOMIC | C.IBV_QP_MIN_RNR_TIMER | C.IBV_QP_SQ_PSN |
		C.IBV_QP_MAX_DEST_RD_ATOMIC | C.IBV_QP_DEST_QPN
	if C.shim_query_qp(q.ib, &a, nil, C.int(mask)) != 0 {
		return out
	}
	if hw := transport.QPState(a.state); hw == transport.QPSErr {
		q.state = transport.QPSErr
		out.State = hw
	}
	out.AccessFlags = transport.Access(a.access)
	out.PKeyIndex = uint16(a.pkey_index)
	out.PathMTU = transport.MTU(a.path_mtu)
	out.Timeout = uint8(a.timeout)
	out.RetryCnt = uint8(a.retry_cnt)
	out.RNRRetry = uint8(a.rnr_retry)
	out.RQPSN = uint32(a.rq_psn)
	out.SQPSN = uint32(a.sq_psn)
	out.MaxRdAtomic = uint8(a.max_rd_atomic)
	out.MaxDestRdAtomic = uint8(a.max_dest_rd_atomic)
	out.MinRNRTimer = uint8(a.min_rnr_timer)
	out.DestQPN = uint32(a.dest_qpn)
	var g transport.GID
	for i := range g {
		g[i] = byte(a.dgid[i])
	}
	if g != (transport.GID{}) {
		out.AV.DstAddr = g.Addr()
		out.AV.DstPort = transport.RoCEv2Port
		out.AV.HopLimit = uint8(a.hop_limit)
		out.AV.TrafficClass = uint8(a.traffic_class)
		out.AV.FlowLabel = uint32(a.flow_label)
		if gids := q.dev.gidTable(); int(a.sgid_index) < len(gids) {
			out.AV.SrcAddr = gids[a.sgid_index].Addr()
		}
	}
	return out
}

func (q *qp) SendQueueFree() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.sq) - int(q.sqTail-q.sqHead)
}

func (q *qp) RecvQueueFree() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.rq) - int(q.rqTail-q.rqHead)
}

// Close implements transport.QP.
func (q *qp) Close() error {
	if isSet(&q.mu, &q.closed) {
		return transport.ErrClosed
	}
	return q.destroy()
}

func (q *qp) destroy() error {
	if !claimTeardown(&q.mu, &q.closed) {
		return nil
	}
	d := q.dev
	d.qpMu.Lock()
	if d.qps[q.qpn] == q {
		delete(d.qps, q.qpn)
	}
	d.qpMu.Unlock()
	r := C.ibv_destroy_qp(q.ib)
	d.mu.Lock()
	q.scq.users--
	q.rcq.users--
	q.pd.nqp--
	d.mu.Unlock()
	q.mu.Lock()
	for _, p := range []unsafe.Pointer{unsafe.Pointer(q.cwr), unsafe.Pointer(q.csge), unsafe.Pointer(q.cscratch),
		unsafe.Pointer(q.rids), unsafe.Pointer(q.roff), unsafe.Pointer(q.rnum), unsafe.Pointer(q.rsge), unsafe.Pointer(q.rscratch)} {
		C.free(p)
	}
	q.cwr, q.csge, q.cscratch, q.rids, q.roff, q.rnum, q.rsge, q.rscratch = nil, nil, nil, nil, nil, nil, nil, nil
	q.mu.Unlock()
	return posErrno("ibv_destroy_qp", r)
}

// ---- completions ------------------------------------------------------------------------------

var wcFlagWithImm = uint32(C.IBV_WC_WITH_IMM)

// translate turns a device completion into the caller's WC and queues it on the QP's CQ (under
// q.mu, so that the engine's own flushes queued after it keep WR order), updating the QP's
// shadow rings and the windows' state. Completions that are not the caller's (a retired or
// discarded WR, a destroyed QP, a successful unsignaled WR) are dropped.
func (d *Device) translate(w *C.struct_shim_wc, poller *cq) {
	qpn := uint32(w.qp_num)
	d.qpMu.RLock()
	q := d.qps[qpn]
	d.qpMu.RUnlock()
	if q == nil {
		return
	}
	id := uint64(w.wr_id)
	if (id>>genShift)&genMask != q.gen {
		return
	}
	st := transport.WCStatus(w.status)
	wc := transport.WC{Status: st, QPN: qpn, VendorErr: uint32(w.vendor_err), ByteLen: uint32(w.byte_len),
		SrcQP: uint32(w.src_qp)}
	q.mu.Lock()
	defer q.mu.Unlock()
	if id&wrRecv != 0 {
		seq, ok := unwrap(id, q.rqHead, q.rqTail)
		if !ok {
			return
		}
		e := q.rq[seq%uint64(len(q.rq))]
		q.rqHead = seq + 1
		wc.ID = e.id
		wc.Opcode = transport.WCOpcode(w.opcode)
		if st != transport.WCSuccess {
			wc.Opcode = transport.WCRecv
			wc.ByteLen = 0
			q.state = transport.QPSErr
		} else {
			fl := uint32(w.wc_flags)
			if fl&wcFlagWithImm != 0 {
				wc.Flags |= transport.WCWithImm
				wc.Imm = uint32(w.imm)
			}
			if fl&d.invMask != 0 {
				wc.Flags |= transport.WCWithInvalidate
				wc.InvalidatedRKey = uint32(w.imm)
				if m := d.mwByKey(wc.InvalidatedRKey); m != nil {
					m.setFree(wc.InvalidatedRKey)
				}
			}
		}
		q.rcq.pushFrom(poller, wc)
		q.softFlushLocked()
		return
	}
	seq, ok := unwrap(id, q.sqHead, q.sqTail)
	if !ok {
		return
	}
	n := uint64(len(q.sq))
	for s := q.sqHead; s < seq; s++ { // unsignaled WRs retired by this completion
		q.retire(&q.sq[s%n], true)
	}
	e := &q.sq[seq%n]
	q.sqHead = seq + 1
	wc.ID = e.id
	wc.Opcode = e.op.CompletionOpcode()
	if e.op != transport.WRRDMARead {
		wc.ByteLen = 0
	}
	if st != transport.WCSuccess {
		q.state = transport.QPSErr
		q.retire(e, false)
		q.scq.pushFrom(poller, wc)
	} else {
		q.retire(e, true)
		if e.signaled || q.sigAll {
			q.scq.pushFrom(poller, wc)
		}
	}
	q.softFlushLocked()
}

// unwrap maps the low 32 bits of a wire ID to the outstanding sequence number in [head, tail).
func unwrap(id, head, tail uint64) (uint64, bool) {
	low := id & seqMask32
	dist := (low - head) & seqMask32
	if dist >= tail-head {
		return 0, false
	}
	return head + dist, true
}

// retire applies what an executed (ok) or failed/flushed send WR did to windows. q.mu held.
func (q *qp) retire(e *sqEntry, ok bool) {
	if e.mw == nil {
		return
	}
	switch {
	case !ok:
		e.mw.setUnknown()
	case e.op == transport.WRRegMR:
		e.mw.setValid(e.key, e.iova, e.length, e.access, e.pageSize, e.npages)
	case e.op == transport.WRLocalInv:
		e.mw.setFree(e.key)
	}
	e.mw = nil
}

// softFlushLocked completes, with WR_FLUSH_ERR, the WRs the engine accepted while the QP was in
// ERR, once everything the device holds before them has completed. q.mu held; the CQ pushes
// happen with q.mu held (lock order q.mu → the CQ queue's lock).
func (q *qp) softFlushLocked() {
	buf := q.flushBuf[:0]
	ns := uint64(len(q.sq))
	for q.sqHead < q.sqTail && q.sq[q.sqHead%ns].soft {
		e := &q.sq[q.sqHead%ns]
		buf = append(buf, transport.WC{ID: e.id, Status: transport.WCWRFlushErr, Opcode: e.op.CompletionOpcode(), QPN: q.qpn})
		q.retire(e, false)
		e.soft = false
		q.sqHead++
	}
	if len(buf) > 0 {
		q.scq.push(buf...)
	}
	buf = q.flushBuf[:0]
	nr := uint64(len(q.rq))
	for q.rqHead < q.rqTail && q.rq[q.rqHead%nr].soft {
		e := &q.rq[q.rqHead%nr]
		buf = append(buf, transport.WC{ID: e.id, Status: transport.WCWRFlushErr, Opcode: transport.WCRecv, QPN: q.qpn})
		e.soft = false
		q.rqHead++
	}
	if len(buf) > 0 {
		q.rcq.push(buf...)
	}
}
