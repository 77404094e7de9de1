package softroce

import (
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// The responder, after rxe_resp.c: CHK_PSN → CHK_OP_SEQ → CHK_OP_VALID → CHK_RESOURCE →
// CHK_LENGTH → CHK_RKEY → EXECUTE → COMPLETE → ACKNOWLEDGE, with duplicate handling and the
// class B (NAK, QP stays up) / class C (NAK, QP to ERR) errors.

// setCtl records the ACK/NAK to send for q, keeping at most one: a fatal NAK wins, otherwise
// the one with the highest PSN (each implies acknowledgement of everything before it).
func (q *qp) setCtl(syn wire.Syndrome, psn wire.PSN, fatal bool) {
	c := &q.ctl
	if c.pending && c.fatal && !fatal {
		return
	}
	if c.pending && !fatal && !c.fatal && psn.Less(c.psn) {
		return
	}
	c.pending, c.syn, c.psn, c.fatal = true, syn, psn, fatal
	q.dev.touch(q)
}

// buildCtl writes the pending ACK/NAK into buf and returns the link packet. dev.mu held.
func (q *qp) buildCtl(buf []byte) link.Packet {
	c := &q.ctl
	p := q.newPacket(buf, wire.RCAcknowledge, 0, c.psn, false)
	a := p.AETH()
	a.SetSyndrome(c.syn)
	a.SetMSN(q.resp.msn)
	st := &q.dev.stats
	switch c.syn.Type() {
	case wire.SyndromeACK:
		st.acksSent.Add(1)
	case wire.SyndromeRNRNAK:
		st.rnrNaksSent.Add(1)
	default:
		st.naksSent[nakIndex(uint8(c.syn))].Add(1)
	}
	c.pending, c.fatal = false, false
	return q.linkPacket(p)
}

// flushAck turns a coalesced ACK into the pending control packet.
func (q *qp) ackNow(psn wire.PSN) { q.setCtl(wire.SyndromeACKUnlimited, psn, false) }

// classC is a class C error: NAK with the offending PSN, the receive WQE in use (if any)
// completes with st, and the QP goes to ERR.
func (q *qp) classC(code wire.NakCode, psn wire.PSN, st transport.WCStatus) {
	q.setCtl(code.Syndrome(), psn, true)
	if q.resp.hasWQE {
		r := &q.rq[q.rqHead&q.rqMask]
		wc := transport.WC{ID: r.id, Status: st, Opcode: transport.WCRecv, QPN: q.qpn, SrcQP: q.attr.DestQPN}
		q.rqHead++
		q.resp.hasWQE = false
		q.pushWC(q.rcq, &wc)
	}
	q.toError()
}

// respond processes one request packet whose payload is src's pieces in order (the packet's
// own, or a loop packet's carried by reference: loopref.go). dev.mu held.
func (q *qp) respond(p wire.Packet, src [][]byte, now time.Time) {
	bth := p.BTH()
	psn := bth.PSN()
	op := p.Opcode()
	st := &q.dev.stats

	// CHK_PSN
	switch diff := psn.Sub(q.resp.psn); {
	case diff > 0:
		st.oos.Add(1)
		if !q.resp.sentPSNNak {
			q.resp.sentPSNNak = true
			q.setCtl(wire.NakPSNSequenceError.Syndrome(), q.resp.psn, false)
		}
		return
	case diff < 0:
		st.dups.Add(1)
		q.duplicate(p, op, psn)
		return
	}
	q.resp.sentPSNNak = false

	// CHK_OP_SEQ
	switch q.resp.opcode {
	case int(wire.RCSendFirst), int(wire.RCSendMiddle):
		switch op {
		case wire.RCSendMiddle, wire.RCSendLast, wire.RCSendLastWithImmediate, wire.RCSendLastWithInvalidate:
		default:
			q.classC(wire.NakInvalidRequest, psn, transport.WCRemInvReqErr)
			return
		}
	case int(wire.RCRDMAWriteFirst), int(wire.RCRDMAWriteMiddle):
		switch op {
		case wire.RCRDMAWriteMiddle, wire.RCRDMAWriteLast, wire.RCRDMAWriteLastWithImmediate:
		default:
			q.classC(wire.NakInvalidRequest, psn, transport.WCRemInvReqErr)
			return
		}
	default:
		if (op.Is(wire.Send) || op.Is(wire.Write)) && !op.Is(wire.First) {
			q.classC(wire.NakInvalidRequest, psn, transport.WCRemInvReqErr)
			return
		}
	}

	// CHK_OP_VALID: QP access rights; atomics, FLUSH and ATOMIC_WRITE are not supported.
	acc := q.attr.AccessFlags
	switch {
	case op.Is(wire.Read):
		if acc&transport.AccessRemoteRead == 0 {
			q.classC(wire.NakInvalidRequest, psn, transport.WCRemInvReqErr)
			return
		}
	case op.Is(wire.Write):
		if acc&transport.AccessRemoteWrite == 0 {
			q.classC(wire.NakInvalidRequest, psn, transport.WCRemInvReqErr)
			return
		}
	case op.Is(wire.Send):
	default:
		q.classC(wire.NakInvalidRequest, psn, transport.WCRemInvReqErr)
		return
	}

	// CHK_RESOURCE
	if op.Is(wire.Read) && len(q.resp.res) == 0 {
		q.classC(wire.NakInvalidRequest, psn, transport.WCRemInvReqErr)
		return
	}
	if op.Is(wire.ConsumesRecvWQE) && !q.resp.hasWQE {
		if q.rqHead == q.rqTail {
			q.setCtl(wire.RNRNAKSyndrome(wire.RNRTimer(q.attr.MinRNRTimer)), psn, false)
			return
		}
		q.resp.hasWQE = true
		q.resp.recvOff = 0
	}

	// CHK_LENGTH
	mtu := q.mtu
	pl := p.PayloadLen()
	switch {
	case op.Is(wire.Read):
	case op.Is(wire.First) && op.Is(wire.Last):
		if pl > mtu {
			q.classC(wire.NakInvalidRequest, psn, transport.WCRemInvReqErr)
			return
		}
	case op.Is(wire.Last):
		if pl < 1 || pl > mtu {
			q.classC(wire.NakInvalidRequest, psn, transport.WCRemInvReqErr)
			return
		}
	default: // FIRST, MIDDLE
		if pl != mtu {
			q.classC(wire.NakInvalidRequest, psn, transport.WCRemInvReqErr)
			return
		}
	}

	// CHK_RKEY and EXECUTE
	switch {
	case op.Is(wire.Send):
		r := &q.rq[q.rqHead&q.rqMask]
		if pl > 0 {
			if uint64(q.resp.recvOff)+uint64(pl) > uint64(r.len) {
				q.classC(wire.NakInvalidRequest, psn, transport.WCLocLenErr)
				return
			}
			if !q.scatterPieces(q.pd, r.sge, q.resp.recvOff, src) {
				q.classC(wire.NakRemoteOperational, psn, transport.WCLocProtErr)
				return
			}
			q.resp.recvOff += uint32(pl)
		}
	case op.Is(wire.Write):
		if reth := p.RETH(); reth != nil {
			va, rkey, n := reth.VA(), reth.RKey(), reth.DMALen()
			if n > 1<<31 {
				q.classC(wire.NakInvalidRequest, psn, transport.WCRemInvReqErr)
				return
			}
			q.resp.wrMR = nil
			if n > 0 {
				m := q.dev.checkRemote(q.pd, va, n, rkey, transport.AccessRemoteWrite)
				if m == nil {
					q.classC(wire.NakRemoteAccessError, psn, transport.WCRemAccessErr)
					return
				}
				q.resp.wrMR = m
			}
			q.resp.wrVA, q.resp.wrResid, q.resp.wrLen = va, n, n
			// rxe check_rkey: while the residue exceeds the MTU a packet carries exactly the
			// MTU; the last one carries exactly the residue.
			if uint32(mtu) < n {
				if pl != mtu {
					q.classC(wire.NakInvalidRequest, psn, transport.WCRemInvReqErr)
					return
				}
			} else if uint32(pl) != n {
				q.classC(wire.NakInvalidRequest, psn, transport.WCRemInvReqErr)
				return
			}
		}
		if uint32(pl) > q.resp.wrResid || (op.Is(wire.Last) && uint32(pl) != q.resp.wrResid) {
			q.classC(wire.NakInvalidRequest, psn, transport.WCRemInvReqErr)
			return
		}
		if pl > 0 {
			m := q.resp.wrMR
			// Re-validate: the MR may have been invalidated or deregistered meanwhile.
			if m == nil || m.state != transport.MRValid || !m.inRange(q.resp.wrVA, uint64(pl)) {
				q.classC(wire.NakRemoteAccessError, psn, transport.WCRemAccessErr)
				return
			}
			m.copyInPieces(q.resp.wrVA, src)
			q.resp.wrVA += uint64(pl)
			q.resp.wrResid -= uint32(pl)
		}
	case op.Is(wire.Read):
		reth := p.RETH()
		va, rkey, n := reth.VA(), reth.RKey(), reth.DMALen()
		if n > 1<<31 {
			q.classC(wire.NakInvalidRequest, psn, transport.WCRemInvReqErr)
			return
		}
		if n > 0 && q.dev.checkRemote(q.pd, va, n, rkey, transport.AccessRemoteRead) == nil {
			q.classC(wire.NakRemoteAccessError, psn, transport.WCRemAccessErr)
			return
		}
		np := npkts(n, mtu)
		i := q.resp.resNext
		// rxe recycles the oldest resource; one still streaming is left alone (only a peer
		// exceeding max_dest_rd_atomic gets here).
		for k := 0; k < len(q.resp.res) && q.resp.res[i].streaming; k++ {
			i = (i + 1) % len(q.resp.res)
		}
		res := &q.resp.res[i]
		if res.streaming {
			st.dropped.Add(1)
			return
		}
		q.resp.resNext = (i + 1) % len(q.resp.res)
		*res = readRes{valid: true, firstPSN: psn, lastPSN: psn.Add(np - 1), va: va, length: n, rkey: rkey,
			curPSN: psn, curVA: va, resid: n}
		q.resp.msn++
		q.resp.psn = psn.Add(np)
		q.resp.opcode = -1
		q.startStream(i)
		return
	}

	if im := p.ImmDt(); im != nil {
		q.resp.imm, q.resp.hasImm = im.Imm(), true
	}
	// Sequence state and PSN.
	if op.Is(wire.Last) {
		q.resp.opcode = -1
		q.resp.msn++
	} else {
		q.resp.opcode = int(op)
	}
	q.resp.psn = psn.Inc()

	// COMPLETE: a receive WQE finishes with SEND LAST/ONLY and WRITE_WITH_IMM.
	if op.Is(wire.Completes) {
		r := &q.rq[q.rqHead&q.rqMask]
		wc := transport.WC{ID: r.id, Status: transport.WCSuccess, Opcode: transport.WCRecv, QPN: q.qpn,
			SrcQP: q.attr.DestQPN, ByteLen: q.resp.recvOff}
		if op.Is(wire.Write) {
			wc.Opcode = transport.WCRecvRDMAWithImm
			wc.ByteLen = q.resp.wrLen
		}
		if q.resp.hasImm {
			wc.Flags |= transport.WCWithImm
			wc.Imm = q.resp.imm
		}
		if ie := p.IETH(); ie != nil {
			key := ie.RKey()
			if !q.dev.invalidate(q.pd, key) {
				// Deviation from rxe (which ACKs and stalls): NAK invalid request.
				q.classC(wire.NakInvalidRequest, psn, transport.WCRemInvReqErr)
				return
			}
			wc.Flags |= transport.WCWithInvalidate
			wc.InvalidatedRKey = key
		}
		q.rqHead++
		q.resp.hasWQE = false
		q.resp.hasImm = false
		q.pushWC(q.rcq, &wc)
		if q.state == transport.QPSErr {
			return
		}
	}

	// ACKNOWLEDGE: only packets with AckReq get one; within an rx batch ACKs coalesce to the
	// latest AckReq PSN (never beyond it).
	if bth.AckReq() {
		q.ackNow(psn)
	}
}

// duplicate handles a request with PSN below the expected one: SEND/WRITE are re-ACKed with
// the last accepted PSN; a READ inside a saved resource is replayed from its PSN, provided the
// new range lies inside the original one with the same R_Key; anything else is dropped.
func (q *qp) duplicate(p wire.Packet, op wire.Opcode, psn wire.PSN) {
	if !op.Is(wire.Read) {
		if op.Is(wire.Send) || op.Is(wire.Write) {
			q.ackNow(q.resp.psn.Add(wire.PSNMask)) // resp.psn - 1
		}
		return
	}
	reth := p.RETH()
	va, rkey, n := reth.VA(), reth.RKey(), reth.DMALen()
	for i := range q.resp.res {
		res := &q.resp.res[i]
		if !res.valid || psn.Less(res.firstPSN) || res.lastPSN.Less(psn) {
			continue
		}
		if rkey != res.rkey || va < res.va || uint64(va-res.va)+uint64(n) > uint64(res.length) {
			return
		}
		q.dev.stats.readReplays.Add(1)
		res.curPSN, res.curVA, res.resid = psn, va, n
		res.started = psn != res.firstPSN // replay from the middle starts with MIDDLE/LAST
		if !res.streaming {
			q.startStream(i)
		}
		return
	}
}

// startStream queues read resource i for the transmit loop. An ACK/NAK still pending from
// earlier requests goes out before the stream's first response (PSN order).
func (q *qp) startStream(i int) {
	res := &q.resp.res[i]
	res.streaming = true
	n := len(q.resp.stream)
	e := &q.resp.stream[(q.resp.sHead+q.resp.nstream)%n]
	e.res = i
	e.pre = q.ctl
	q.ctl.pending, q.ctl.fatal = false, false
	q.resp.nstream++
	q.dev.schedule(q)
}

// readResponse builds the next READ response packet of the oldest stream (rxe read_reply):
// ONLY or FIRST for a new request, MIDDLE/LAST after; FIRST/LAST/ONLY carry AETH (ACK, MSN).
// The MR is re-validated for every packet; if it went away meanwhile the stream ends with NAK
// remote access error. dev.mu held.
func (q *qp) readResponse(pkts []link.Packet, buf []byte) []link.Packet {
	e := &q.resp.stream[q.resp.sHead]
	if e.pre.pending {
		c := q.ctl
		q.ctl = e.pre
		e.pre.pending = false
		pk := q.buildCtl(buf)
		q.ctl = c
		return append(pkts, pk)
	}
	res := &q.resp.res[e.res]
	mtu := uint32(q.mtu)
	n := min(res.resid, mtu)
	var op wire.Opcode
	if !res.started {
		op = wire.RCRDMAReadResponseFirst
		if res.resid <= mtu {
			op = wire.RCRDMAReadResponseOnly
		}
	} else {
		op = wire.RCRDMAReadResponseMiddle
		if res.resid <= mtu {
			op = wire.RCRDMAReadResponseLast
		}
	}
	var m *mr
	if n > 0 {
		m = q.dev.checkRemote(q.pd, res.curVA, n, res.rkey, transport.AccessRemoteRead)
		if m == nil {
			q.endStream(res)
			q.classC(wire.NakRemoteAccessError, res.curPSN, transport.WCRemAccessErr)
			return append(pkts, q.buildCtl(buf))
		}
	}
	p := q.newPacket(buf, op, int(n), res.curPSN, false)
	if a := p.AETH(); a != nil {
		a.SetSyndrome(wire.SyndromeACKUnlimited)
		a.SetMSN(q.resp.msn)
	}
	if n > 0 {
		// To the device itself, the requester copies from the MR (loopref.go).
		var r loopRef
		if q.byRef(n) && m.refRange(&r, res.curVA, uint64(n)) {
			r.put(p)
		} else {
			m.copyOut(p.Payload(), res.curVA)
		}
	}
	res.started = true
	res.curPSN = res.curPSN.Inc()
	res.curVA += uint64(n)
	res.resid -= n
	if op.Is(wire.Last) {
		q.endStream(res)
	}
	return append(pkts, q.linkPacket(p))
}

func (q *qp) endStream(res *readRes) {
	res.streaming = false
	res.started = false
	q.resp.sHead = (q.resp.sHead + 1) % len(q.resp.stream)
	q.resp.nstream--
}
