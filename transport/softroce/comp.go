package softroce

import (
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// The completer, after rxe_comp.c: matches ACKs, NAKs and READ responses to send WQEs, copies
// read data, produces send completions in SQ order and starts go-back-N retries.

// resetRetry is rxe's reset_retry_counters: retry budgets count consecutive failures.
func (q *qp) resetRetry() {
	q.comp.retryCnt = int(q.attr.RetryCnt)
	q.comp.rnrRetry = int(q.attr.RNRRetry)
	q.comp.startedRetry = false
}

// head returns the oldest uncompleted send WQE, or nil.
func (q *qp) head() *sendWQE {
	if q.sqHead == q.sqTail {
		return nil
	}
	return &q.sq[q.sqHead&q.sqMask]
}

// completeWQE is do_complete for a successful WQE at the head.
func (q *qp) completeWQE(w *sendWQE) {
	if w.rdToken {
		w.rdToken = false
		q.req.rdAtomic++
	}
	// Completing a WQE acknowledges all its PSNs (a coalesced ACK or a later response).
	if q.comp.psn.LessEq(w.lastPSN) {
		q.comp.psn = w.lastPSN.Inc()
		q.req.waitWindow = false
	}
	q.postSendWC(w, transport.WCSuccess, false)
	q.sqHead++
	if q.sqReq == q.sqHead-1 {
		// Acknowledged while go-back-N was retransmitting it: the requester moves on to the
		// next WQE, at the PSN that follows this one.
		q.sqReq = q.sqHead
		q.req.noack = 0
		if q.req.psn.Less(q.comp.psn) {
			q.req.psn = q.comp.psn
		}
	}
	q.retire()
}

// acked reports whether a SEND/WRITE WQE at the head can be completed by an acknowledgement
// of its last PSN: it is waiting for one, or it is being retransmitted after having been sent
// completely once (a late ACK of the first transmission).
func (q *qp) acked(w *sendWQE) bool {
	return w.state == wqePending || (w.state == wqePosted && w.tx && w.lastPSN.Less(q.req.high))
}

// compError fails the head WQE with st and moves the QP to ERR (COMPST_ERROR).
func (q *qp) compError(w *sendWQE, st transport.WCStatus, vendor uint32) {
	w.state, w.status, w.vendor = wqeError, st, vendor
	if q.sqReq == q.sqHead {
		q.sqReq++
	}
	q.toError()
}

// complete processes one response packet whose payload is src's pieces in order (as for
// respond). dev.mu held.
func (q *qp) complete(p wire.Packet, src [][]byte, now time.Time) {
	op := p.Opcode()
	psn := p.BTH().PSN()
	if op == wire.RCAcknowledge {
		q.dev.stats.acksRcvd.Add(1)
	}
	q.compPacket(p, src, op, psn, now)
	if q.state == transport.QPSErr {
		return
	}
	// Retransmit timer: restart while PSNs are outstanding (and not waiting out an RNR NAK).
	if q.timeout != 0 && !q.req.waitRNR && q.comp.psn.Less(q.req.psn) {
		q.retransAt = now.Add(q.timeout)
		q.dev.armTimer(q.retransAt)
	} else {
		q.retransAt = time.Time{}
	}
	if q.sqReq != q.sqTail || q.req.needRetry {
		q.dev.schedule(q)
	}
}

func (q *qp) compPacket(p wire.Packet, src [][]byte, op wire.Opcode, psn wire.PSN, now time.Time) {
	for {
		w := q.head()
		if w == nil || (w.state == wqePosted && !w.tx) {
			return // nothing outstanding: stale or stray response
		}
		// check_psn
		if psn.Sub(w.lastPSN) > 0 {
			if !q.acked(w) {
				return
			}
			if isRead(w.wr.Opcode) {
				q.errorRetry(false) // responses of the READ were skipped: implied NAK
				return
			}
			q.resetRetry()
			q.completeWQE(w) // coalesced ACK; go on with the next WQE
			continue
		}
		diff := psn.Sub(q.comp.psn)
		if diff < 0 {
			if psn == w.lastPSN && !isRead(w.wr.Opcode) && q.acked(w) && op == wire.RCAcknowledge &&
				p.AETH().Syndrome().Type() == wire.SyndromeACK {
				q.completeWQE(w)
				return
			}
			// A NAK arriving in the middle of a READ's responses is still acted on; anything
			// else behind comp.psn is a duplicate (a stale positive ACK must not reset the
			// READ response sequence, which rxe would do).
			if !(op == wire.RCAcknowledge && p.AETH().Syndrome().Type() != wire.SyndromeACK &&
				(q.comp.opcode == int(wire.RCRDMAReadResponseFirst) || q.comp.opcode == int(wire.RCRDMAReadResponseMiddle))) {
				return // duplicate
			}
		} else if diff > 0 && isRead(w.wr.Opcode) {
			// A gap in the READ responses: rxe drops the packet and waits for the local ACK
			// timeout; we re-request the rest at once (once per gap: startedRetry), which is
			// what the timeout would do, only sooner.
			q.errorRetry(false)
			return
		}
		q.checkAck(p, src, op, psn, w, now)
		return
	}
}

// checkAck is rxe's check_ack and what follows it.
func (q *qp) checkAck(p wire.Packet, src [][]byte, op wire.Opcode, psn wire.PSN, w *sendWQE, now time.Time) {
	// Sequence of READ responses.
	switch q.comp.opcode {
	case -1:
		if !op.Is(wire.First) {
			q.compError(w, transport.WCBadRespErr, 1)
			return
		}
	case int(wire.RCRDMAReadResponseFirst), int(wire.RCRDMAReadResponseMiddle):
		if op != wire.RCAcknowledge && op != wire.RCRDMAReadResponseMiddle && op != wire.RCRDMAReadResponseLast {
			if !(psn == w.firstPSN && op == wire.RCRDMAReadResponseFirst) &&
				!(w.firstPSN == w.lastPSN && op == wire.RCRDMAReadResponseOnly) {
				q.compError(w, transport.WCBadRespErr, 2)
				return
			}
		}
	}
	switch op {
	case wire.RCRDMAReadResponseFirst, wire.RCRDMAReadResponseLast, wire.RCRDMAReadResponseOnly,
		wire.RCRDMAReadResponseMiddle:
		if op != wire.RCRDMAReadResponseMiddle && p.AETH().Syndrome().Type() != wire.SyndromeACK {
			q.compError(w, transport.WCBadRespErr, 3)
			return
		}
		if !isRead(w.wr.Opcode) {
			q.compError(w, transport.WCBadRespErr, 4)
			return
		}
		q.resetRetry()
		q.doRead(p, src, op, psn, w)
	case wire.RCAcknowledge:
		syn := p.AETH().Syndrome()
		switch syn.Type() {
		case wire.SyndromeACK:
			if isRead(w.wr.Opcode) && w.firstPSN.LessEq(psn) {
				// An ACK covering a READ whose responses we have not seen (e.g. the
				// responder re-ACKing a duplicate behind it): they were lost, so this is an
				// implied NAK. (rxe would complete the READ without its data here.)
				q.errorRetry(false)
				return
			}
			q.resetRetry()
			if w.lastPSN == psn && !isRead(w.wr.Opcode) && q.acked(w) {
				q.completeWQE(w)
			}
			q.updateComp(op, psn)
		case wire.SyndromeRNRNAK:
			q.dev.stats.rnrNaksRcvd.Add(1)
			q.rnrRetry(w, syn, psn, now)
		case wire.SyndromeNAK:
			code := uint8(syn)
			q.dev.stats.naksRcvd[nakIndex(code)].Add(1)
			switch wire.NakCode(code) {
			case wire.NakPSNSequenceError:
				// A NAK implicitly acknowledges every PSN before it.
				if psn.Sub(q.comp.psn) > 0 {
					q.comp.psn = psn
					q.req.waitWindow = false
					// That is forward progress, so the retry budget starts over and this
					// new gap gets its own go-back-N at once: retry_cnt is there to give up
					// on a dead path, not to count losses. rxe resets only on a positive
					// ACK, so a large WRITE whose every retransmission loses a packet
					// somewhere exhausts retry_cnt although each round moved it on (1-2%
					// loss with reordering did that within a few thousand 64 KiB WRITEs).
					// Local requester policy only: nothing on the wire changes.
					q.resetRetry()
				}
				q.errorRetry(false)
			case wire.NakInvalidRequest:
				q.compError(w, transport.WCRemInvReqErr, 5)
			case wire.NakRemoteAccessError:
				q.compError(w, transport.WCRemAccessErr, 6)
			default:
				q.compError(w, transport.WCRemOpErr, 7)
			}
		default:
			q.compError(w, transport.WCBadRespErr, 8)
		}
	default: // ATOMIC_ACKNOWLEDGE: we never send atomics
		q.compError(w, transport.WCBadRespErr, 9)
	}
}

// doRead copies a READ response's payload (src's pieces; the packet says its length) into
// the WQE's SGL (rxe do_read + copy_data).
func (q *qp) doRead(p wire.Packet, src [][]byte, op wire.Opcode, psn wire.PSN, w *sendWQE) {
	pl := p.Payload()
	if uint32(len(pl)) > w.length-w.rdRecv {
		q.compError(w, transport.WCBadRespErr, 10)
		return
	}
	if !q.scatterPieces(q.pd, w.wr.SGL, w.rdRecv, src) {
		q.compError(w, transport.WCLocProtErr, 11)
		return
	}
	w.rdRecv += uint32(len(pl))
	if w.rdRecv == w.length && op.Is(wire.Last) {
		q.completeWQE(w)
	}
	q.updateComp(op, psn)
}

// scatter copies src into an SGL at byte offset off, checking every SGE touched for
// LocalWrite through its lkey. false: protection error (or the SGL is too short).
func (q *qp) scatter(p *pd, sgl []transport.SGE, off uint32, src []byte) bool {
	d := q.dev
	for _, s := range sgl {
		if len(src) == 0 {
			break
		}
		if off >= s.Length {
			off -= s.Length
			continue
		}
		m := d.checkLocal(p, s.Addr, s.Length, s.LKey, true)
		if m == nil {
			return false
		}
		k := min(uint32(len(src)), s.Length-off)
		m.copyIn(s.Addr+uint64(off), src[:k])
		src = src[k:]
		off = 0
	}
	return len(src) == 0
}

// updateComp is COMPST_UPDATE_COMP.
func (q *qp) updateComp(op wire.Opcode, psn wire.PSN) {
	if op.Is(wire.Last) {
		q.comp.opcode = -1
	} else {
		q.comp.opcode = int(op)
	}
	if psn.Sub(q.comp.psn) >= 0 {
		q.comp.psn = psn.Inc()
		q.comp.startedRetry = false
	}
	q.req.waitWindow = false
}

// errorRetry is COMPST_ERROR_RETRY: start a go-back-N retry unless one is already under way
// (a timeout always starts one), or fail the head WQE with RETRY_EXC_ERR when retry_cnt is
// exhausted (7 = infinite, as rxe).
func (q *qp) errorRetry(timeout bool) {
	w := q.head()
	if w == nil || (w.state == wqePosted && !w.tx) {
		return
	}
	if q.comp.startedRetry && !timeout {
		return
	}
	if q.comp.retryCnt > 0 {
		if q.comp.retryCnt != 7 {
			q.comp.retryCnt--
		}
		if q.comp.psn.Less(q.req.psn) {
			q.req.needRetry = true
			q.comp.startedRetry = true
			q.dev.schedule(q)
		}
		return
	}
	q.dev.stats.retryExceeded.Add(1)
	q.compError(w, transport.WCRetryExcErr, 12)
}

// rnrRetry handles an RNR NAK: WQEs before its PSN are done, then wait the peer's RNR time and
// go back to its PSN; rnr_retry 7 is infinite.
func (q *qp) rnrRetry(w *sendWQE, syn wire.Syndrome, psn wire.PSN, now time.Time) {
	if q.comp.rnrRetry <= 0 {
		q.dev.stats.rnrRetryExceeded.Add(1)
		q.compError(w, transport.WCRNRRetryExcErr, 13)
		return
	}
	if q.comp.rnrRetry != 7 {
		q.comp.rnrRetry--
	}
	if psn.Sub(q.comp.psn) > 0 {
		q.comp.psn = psn
	}
	q.req.waitRNR = true
	q.req.needRetry = true
	q.comp.startedRetry = true
	q.retransAt = time.Time{}
	q.rnrAt = now.Add(syn.RNRTimer().Duration())
	q.dev.armTimer(q.rnrAt)
}

func (q *qp) rnrTimerExpired() {
	if q.state == transport.QPSErr {
		return
	}
	q.req.waitRNR = false
	q.req.needRetry = true
	q.dev.schedule(q)
}

func (q *qp) retransTimerExpired(now time.Time) {
	if q.state != transport.QPSRTS && q.state != transport.QPSSQD || q.req.waitRNR {
		return
	}
	if !q.comp.psn.Less(q.req.psn) {
		return
	}
	q.dev.stats.timeouts.Add(1)
	q.errorRetry(true)
	if q.state == transport.QPSErr {
		return
	}
	if q.timeout != 0 {
		q.retransAt = now.Add(q.timeout)
		q.dev.armTimer(q.retransAt)
	}
}
