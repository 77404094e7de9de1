package softroce

import (
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// The requester, after rxe_req.c: turns send WQEs into packets in SQ order.

const (
	// maxUnackedPSNs is rxe's RXE_MAX_UNACKED_PSNS: the requester stalls while req.psn is more
	// than this far ahead of comp.psn.
	maxUnackedPSNs = 128
	// maxPktPerAck is rxe's RXE_MAX_PKT_PER_ACK: AckReq is also set once this many non-END
	// packets have gone out without it.
	maxPktPerAck = 64
)

func isRead(op transport.WROpcode) bool { return op == transport.WRRDMARead }

func isLocalOp(op transport.WROpcode) bool {
	return op == transport.WRRegMR || op == transport.WRLocalInv
}

// npkts is the number of packets (PSNs) of a message of n bytes: max(1, ceil(n/mtu)).
func npkts(n uint32, mtu int) uint32 {
	if n == 0 {
		return 1
	}
	return (n + uint32(mtu) - 1) / uint32(mtu)
}

// requester makes one step: executes a local operation or builds one packet into buf. It
// returns false when it cannot make progress now (empty SQ, window full, fence, RNR wait, ...);
// whatever unblocks it reschedules the QP. dev.mu held.
func (q *qp) requester(pkts []link.Packet, buf []byte, now time.Time) ([]link.Packet, bool) {
	if q.state != transport.QPSRTS && q.state != transport.QPSSQD {
		return pkts, false
	}
	if q.req.needRetry && !q.req.waitRNR {
		q.reqRetry()
		q.req.needRetry = false
	}
	if q.req.waitRNR || q.sqReq == q.sqTail {
		return pkts, false
	}
	w := &q.sq[q.sqReq&q.sqMask]
	if w.state == wqeDone {
		// A local operation that already executed, met again after a go-back-N rewind
		// (reqRetry): never execute it twice (rxe req_retry leaves wqe_state_done WQEs done).
		// Its completion is produced once, in SQ order, when it reaches the head.
		q.sqReq++
		q.retire()
		return pkts, true
	}
	if q.state == transport.QPSSQD && !w.tx {
		return pkts, false // draining: no new WQE starts
	}
	op := w.wr.Opcode
	// Fences (rxe_wqe_is_fenced): LOCAL_INV waits for every earlier WQE to complete; FENCE waits
	// for every outstanding READ.
	if op == transport.WRLocalInv && q.sqReq != q.sqHead {
		return pkts, false
	}
	if w.wr.Flags&transport.SendFence != 0 && !w.tx && q.req.rdAtomic != q.maxRdAtomic {
		return pkts, false
	}
	if isLocalOp(op) {
		q.doLocalOp(w)
		return pkts, true
	}
	// Window (RXE_MAX_UNACKED_PSNS).
	if q.req.psn.Sub(q.comp.psn) > maxUnackedPSNs {
		q.req.waitWindow = true
		return pkts, false
	}
	if isRead(op) {
		if !w.rdToken {
			if q.req.rdAtomic <= 0 {
				return pkts, false
			}
			q.req.rdAtomic--
			w.rdToken = true
		}
		return q.sendRead(pkts, buf, w, now), true
	}
	return q.sendData(pkts, buf, w, now), true
}

// doLocalOp executes REG_MR / LOCAL_INV in SQ order (rxe_do_local_ops). The WQE is done at once;
// its completion is delivered when it reaches the head of the SQ. A failure is
// IB_WC_LOC_QP_OP_ERR (LOC_PROT_ERR for a page outside device memory) and the QP goes to ERR.
func (q *qp) doLocalOp(w *sendWQE) {
	st := transport.WCSuccess
	switch w.wr.Opcode {
	case transport.WRRegMR:
		st = q.dev.regMR(q.pd, &w.wr.Reg)
	case transport.WRLocalInv:
		if !q.dev.invalidate(q.pd, w.wr.InvalidateRKey) {
			st = transport.WCLocQPOpErr
		}
	}
	w.wr.Reg.Pages = nil // the page list has been copied (or is no longer needed)
	q.sqReq++
	if st != transport.WCSuccess {
		w.state, w.status = wqeError, st
		q.toError()
		return
	}
	w.state = wqeDone
	q.retire()
}

// retire completes, in order, the WQEs at the head of the SQ that are already done (local
// operations executed behind outstanding WQEs). After a go-back-N rewind the requester may
// not have passed a done WQE yet (sqReq == sqHead); it is retired all the same, and the
// requester moves past it: it must not execute again.
func (q *qp) retire() {
	for q.sqHead != q.sqTail {
		w := &q.sq[q.sqHead&q.sqMask]
		if w.state != wqeDone {
			return
		}
		q.postSendWC(w, transport.WCSuccess, false)
		if q.sqReq == q.sqHead {
			q.sqReq++
		}
		q.sqHead++
	}
}

// sendPacket finishes a packet: counters, retransmit timer.
func (q *qp) sent(pkts []link.Packet, p wire.Packet, first, next wire.PSN, now time.Time) []link.Packet {
	if first.Less(q.req.high) {
		q.dev.stats.retransmits.Add(1)
	}
	if q.req.high.Less(next) {
		q.req.high = next
	}
	if q.timeout != 0 && q.retransAt.IsZero() {
		q.retransAt = now.Add(q.timeout)
		q.dev.armTimer(q.retransAt)
	}
	return append(pkts, q.linkPacket(p))
}

// sendRead sends the READ request for w's remaining bytes (a retry asks only for the rest).
func (q *qp) sendRead(pkts []link.Packet, buf []byte, w *sendWQE, now time.Time) []link.Packet {
	resid := w.length - w.rdRecv
	n := npkts(resid, q.mtu)
	psn := q.req.psn
	w.firstPSN = psn
	w.lastPSN = psn.Add(n - 1)
	w.tx = true
	q.req.noack = 0
	p := q.newPacket(buf, wire.RCRDMAReadRequest, 0, psn, true)
	r := p.RETH()
	r.SetVA(w.wr.RemoteAddr + uint64(w.rdRecv))
	r.SetRKey(w.wr.RKey)
	r.SetDMALen(resid)
	q.req.psn = psn.Add(n)
	w.state = wqePending
	q.sqReq++
	return q.sent(pkts, p, psn, q.req.psn, now)
}

// sendData sends the next packet of a SEND* / RDMA_WRITE* WQE (rxe init_req_packet +
// finish_packet): opcode by position in the message, AckReq on the last packet and after
// maxPktPerAck packets without one, RETH on the first WRITE packet, ImmDt / IETH on the last.
func (q *qp) sendData(pkts []link.Packet, buf []byte, w *sendWQE, now time.Time) []link.Packet {
	mtu := uint32(q.mtu)
	rem := w.length - w.sent
	n := min(rem, mtu)
	first := w.sent == 0
	last := rem <= mtu
	op := dataOpcode(w.wr.Opcode, first, last)
	psn := q.req.psn
	if first {
		w.firstPSN = psn
		w.lastPSN = psn.Add(npkts(w.length, q.mtu) - 1)
	}
	ackReq := last
	if !ackReq {
		if q.req.noack > maxPktPerAck {
			ackReq = true
		}
		q.req.noack++
	}
	if ackReq {
		q.req.noack = 0
	}
	p := q.newPacket(buf, op, int(n), psn, ackReq)
	if last && w.wr.Flags&transport.SendSolicited != 0 &&
		(w.wr.Opcode != transport.WRRDMAWrite) {
		p.BTH().SetSolicitedEvent(true)
	}
	if r := p.RETH(); r != nil {
		r.SetVA(w.wr.RemoteAddr)
		r.SetRKey(w.wr.RKey)
		r.SetDMALen(w.length)
	}
	if im := p.ImmDt(); im != nil {
		im.SetImm(w.wr.Imm)
	}
	if ie := p.IETH(); ie != nil {
		ie.SetRKey(w.wr.InvalidateRKey)
	}
	// payload is carried by reference in the link.Packet: to the link (linkref.go), or to the
	// loopback queue when it is one piece of process memory (SGE.Host, loopref.go).
	var payload []byte
	toLink := false
	if n > 0 {
		ok, byRef := true, false
		if payload, ok = q.linkRef(w, w.sent, n); payload != nil {
			byRef, toLink = true, true
		} else if ok && w.wr.Flags&transport.SendInline == 0 && q.byRef(n) {
			// To the device itself: the receiver copies from the SGL's memory (loopref.go).
			var r loopRef
			ok, payload = q.gatherRef(w, w.sent, n, &r)
			if byRef = ok && (r.n > 0 || payload != nil); byRef && payload == nil {
				r.put(p)
			}
		}
		if ok && !byRef {
			ok = q.gather(w, w.sent, p.Payload())
		}
		if !ok {
			w.state, w.status = wqeError, transport.WCLocProtErr
			q.sqReq++
			q.toError()
			return pkts
		}
	}
	w.tx = true
	w.sent += n
	q.req.psn = psn.Inc()
	if last {
		w.state = wqePending
		q.sqReq++
	}
	pkts = q.sent(pkts, p, psn, q.req.psn, now)
	if payload != nil {
		// The link sends the headers, the payload from the MR, then the (zero) ICRC field:
		// what follows the headers in buf stands in for that field. loopSend takes the
		// headers and keeps the payload beside them.
		lp := &pkts[len(pkts)-1]
		lp.Buf = lp.Buf[:p.HeaderLen()+wire.ICRCLen]
		lp.Payload = payload
		if toLink {
			q.dev.ms.refOut.Add(1)
		}
	}
	return pkts
}

func dataOpcode(op transport.WROpcode, first, last bool) wire.Opcode {
	switch op {
	case transport.WRRDMAWrite, transport.WRRDMAWriteWithImm:
		imm := op == transport.WRRDMAWriteWithImm
		switch {
		case first && last && imm:
			return wire.RCRDMAWriteOnlyWithImmediate
		case first && last:
			return wire.RCRDMAWriteOnly
		case first:
			return wire.RCRDMAWriteFirst
		case last && imm:
			return wire.RCRDMAWriteLastWithImmediate
		case last:
			return wire.RCRDMAWriteLast
		}
		return wire.RCRDMAWriteMiddle
	}
	switch {
	case first && last:
		switch op {
		case transport.WRSendWithImm:
			return wire.RCSendOnlyWithImmediate
		case transport.WRSendWithInv:
			return wire.RCSendOnlyWithInvalidate
		}
		return wire.RCSendOnly
	case first:
		return wire.RCSendFirst
	case last:
		switch op {
		case transport.WRSendWithImm:
			return wire.RCSendLastWithImmediate
		case transport.WRSendWithInv:
			return wire.RCSendLastWithInvalidate
		}
		return wire.RCSendLast
	}
	return wire.RCSendMiddle
}

// gather copies len(dst) bytes of w's data starting at message offset off: from the inline
// copy, or through the SGL with an lkey check of every SGE touched. false: protection error.
func (q *qp) gather(w *sendWQE, off uint32, dst []byte) bool {
	if w.wr.Flags&transport.SendInline != 0 {
		copy(dst, w.inline[off:])
		return true
	}
	it := sglIter{sgl: w.wr.SGL, off: off, n: uint32(len(dst))}
	for {
		m, va, host, k, ok := q.nextSGE(&it)
		switch {
		case k == 0:
			return ok
		case host != nil:
			copy(dst[:k], host)
		default:
			m.copyOut(dst[:k], va)
		}
		dst = dst[k:]
	}
}

// sglIter walks n bytes of an SGL from byte offset off (gather, gatherRef).
type sglIter struct {
	sgl []transport.SGE
	i   int
	off uint32 // into sgl[i]
	n   uint32 // bytes left
}

// nextSGE returns the next piece of it: k bytes at MR address va of m, whose SGE passed the
// lkey check, or the bytes themselves (host) for an SGE.Host (checked at post time). k == 0
// ends the walk: ok reports whether all n bytes were there (false: a protection error or an
// SGL too short).
func (q *qp) nextSGE(it *sglIter) (m *mr, va uint64, host []byte, k uint32, ok bool) {
	for ; it.n > 0 && it.i < len(it.sgl); it.i++ {
		s := &it.sgl[it.i]
		if it.off >= s.Length {
			it.off -= s.Length
			continue
		}
		k = min(it.n, s.Length-it.off)
		if s.Host != nil {
			host = s.Host[it.off : it.off+k : it.off+k]
		} else {
			if m = q.dev.checkLocal(q.pd, s.Addr, s.Length, s.LKey, false); m == nil {
				return nil, 0, nil, 0, false
			}
			va = s.Addr + uint64(it.off)
		}
		it.n -= k
		it.off = 0
		it.i++
		return m, va, host, k, true
	}
	return nil, 0, nil, 0, it.n == 0
}

// reqRetry rewinds the SQ for go-back-N (rxe req_retry): transmission restarts at the oldest
// unfinished WQE with PSN comp.psn; a partly acknowledged SEND/WRITE skips the packets already
// acknowledged; a partly received READ is re-requested for the rest only. WQEs already done
// (local operations executed behind an outstanding WQE) stay done: the requester steps over
// them without executing them again, and retire completes them once, in SQ order.
func (q *qp) reqRetry() {
	q.dev.stats.retryEvents.Add(1)
	q.sqReq = q.sqHead
	q.req.psn = q.comp.psn
	q.req.noack = 0
	first := true
	for i := q.sqHead; i != q.sqTail; i++ {
		w := &q.sq[i&q.sqMask]
		if w.state == wqePosted && !w.tx {
			break
		}
		if w.state == wqeDone || w.state == wqeError {
			continue
		}
		if !isRead(w.wr.Opcode) {
			w.sent = 0
			if first {
				np := uint32(q.comp.psn.Sub(w.firstPSN))
				if int32(np) > 0 && np < npkts(w.length, q.mtu) {
					w.sent = np * uint32(q.mtu)
				}
			}
		} else if !first {
			w.rdRecv = 0
		}
		w.tx = w.sent > 0
		w.state = wqePosted
		first = false
	}
}
