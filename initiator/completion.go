package initiator

// Completions, after ib_srp.c (srp_recv_done, srp_handle_recv, srp_process_rsp): the channel
// goroutine's poll loop (serve), the handler the transport runs in its place while it waits
// (internal/cqpoll), and what the target sends: responses, credit and asynchronous event
// requests, logouts.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/frpool"
	"github.com/srpd/srpd/internal/cbatch"
	"github.com/srpd/srpd/internal/cqpoll"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// maxDirectRepolls bounds the extra polls a run of the completion handler makes for the
// LOCAL_INV completions of direct commands (Buffer) it has just invalidated.
const maxDirectRepolls = 2

// Work request kinds (cqpoll.WRID). Receive WRs carry them on the wire; the send WRs go through
// the MR pool, which keeps their IDs for us and puts its own (frpool.WRIDTag) on the wire.
const (
	kindRecv cqpoll.Kind = iota // a receive buffer (index: its number; the ID is the number)
	kindCmd                     // a command's SEND (index: the request slot)
	kindTM                      // a task management IU (index: low bits of its sequence)
	kindCtrl                    // a CRED_RSP / AER_RSP (index: the control buffer)
)

// wcError is a failed work completion, the usual reason a channel goes down.
type wcError struct{ wc transport.WC }

func (e *wcError) Error() string {
	return fmt.Sprintf("initiator: qp %#x: %v completion failed: %v", e.wc.QPN, e.wc.Opcode, e.wc.Status)
}

// serve polls the completion queue until the connection fails (or the session stops) and
// returns why. After an SRP_T_LOGOUT it stops taking commands and gives those in flight until
// Config.TeardownTimeout (or the target's disconnect) to be answered, so that as few as possible
// are re-issued elsewhere while the target may still execute them.
func (c *channel) serve() error {
	qpn := c.qp.QPN()
	var logout error
	var drainBy <-chan time.Time
	c.cqp.Begin(qpn)
	defer c.cqp.End()
	for {
		// Where the completion handler stopped, if it did: the error of the completion it
		// handled last, then the completions it left (they fit: it polls fewer than wcs holds).
		n, err, left := c.cqp.Take(c.wcs)
		first := 0
		if left {
			first = -1
		} else {
			n = c.cqp.Poll(c.wcs)
		}
		for i := first; i < n; i++ {
			if i >= 0 {
				wc := &c.wcs[i]
				if wc.QPN != qpn {
					continue // a completion of an earlier connection's QP
				}
				if wc.Status != transport.WCSuccess {
					c.leftover = append(c.leftover[:0], c.wcs[i:n]...)
					return &wcError{*wc}
				}
				err = c.handleWC(wc)
			}
			if errors.Is(err, errTargetLogout) && logout == nil {
				logout = err
				c.mu.Lock()
				c.state.Store(uint32(chDown)) // no new commands or task management
				c.wakeCreditLocked()
				c.mu.Unlock()
				t := time.NewTimer(c.s.cfg.TeardownTimeout)
				defer t.Stop()
				drainBy = t.C
				continue
			}
			if err != nil {
				c.leftover = append(c.leftover[:0], c.wcs[i+1:n]...)
				return err
			}
		}
		c.afterBatch()
		c.runAsync()
		c.mu.Lock()
		eh, inflight := c.ehReset, c.inflight
		c.mu.Unlock()
		if eh != nil {
			return eh
		}
		if logout != nil && inflight == 0 {
			return logout
		}
		if n > 0 || first < 0 {
			continue
		}
		c.cqp.Unlock()
		var (
			ev  transport.CMEvent
			got bool
			ok  bool
		)
		select {
		case <-drainBy:
			c.cqp.Lock()
			return logout
		case <-c.cqp.Notify():
		case <-c.kick:
		case ev, ok = <-c.events:
			got = true
		case <-c.stop:
			c.cqp.Lock()
			return ErrClosed
		}
		c.cqp.Lock()
		if got {
			if !ok {
				c.events = nil
				continue
			}
			if ev.Type == transport.CMEventDisconnected {
				return errDisconnected
			}
		}
	}
}

// cqHandler is the channel's cqpoll.Handler, run by the transport's receive goroutine: while
// serve waits, it handles successful completions in serve's place (a response signals its
// caller without waking the channel goroutine first) and gives the handles of finished requests
// back. Anything unusual (a failed completion, an error, a target logout) stops it: what it did
// not handle goes to serve (cqpoll.Poller.Take), and the token wakes serve.
type cqHandler channel

func (h *cqHandler) Ready() bool { return (*channel)(h).live() }

func (h *cqHandler) HandleCompletion(wc *transport.WC) error { return (*channel)(h).handleWC(wc) }

// EndBatch gives back the handles of the requests the batch finished. A direct command
// completes only once its LOCAL_INVs are confirmed; posted from here, they usually execute at
// once (the engine runs local operations in the post), so their completions are polled in the
// same run (repoll) rather than in a later wake-up.
func (h *cqHandler) EndBatch() bool { return (*channel)(h).afterBatch() }

func (h *cqHandler) EndRun(took bool) bool {
	(*channel)(h).runAsync()
	return took
}

// initCompletions sets up the channel's poller and the routes of its work request kinds.
func (c *channel) initCompletions() {
	c.router.Tagged(frpool.WRIDTag, c.sendWC)
	c.router.Route(kindRecv, c.recvWC)
	c.router.Route(kindCtrl, c.ctrlWC)
	// Commands and task management IUs are unsignaled: the pool delivers them only when they
	// fail, and a failed completion never reaches handleWC.
	c.cqp = cqpoll.New(cqpoll.Config{
		CQ: c.cq, Handler: (*cqHandler)(c), Device: c.dev, Repolls: maxDirectRepolls,
		NoEngine: c.s.cfg.NoCompletionHandler, Runs: &c.s.stats.handlerBatches,
	})
}

// runAsync finishes the asynchronous commands answered in the batch (cqp's lock held, c.mu
// not).
func (c *channel) runAsync() {
	c.mu.Lock()
	if len(c.asyncQ) == 0 {
		c.mu.Unlock()
		return
	}
	c.asyncW = append(c.asyncW[:0], c.asyncQ...)
	clear(c.asyncQ)
	c.asyncQ = c.asyncQ[:0]
	c.mu.Unlock()
	for i, r := range c.asyncW {
		c.asyncW[i] = nil
		c.s.asyncAnswered(r)
	}
	c.closeBatches()
}

// openBatch opens a completion batch for b (internal/cbatch: the consumer of the answer about
// to be delivered, as its submission context named it) unless this run already has, so that b
// can hold what the answers produce until closeBatches (runAsync, cqp's lock held).
func (c *channel) openBatch(b cbatch.Batcher) {
	for _, o := range c.batches {
		if o == b {
			return
		}
	}
	c.batches = append(c.batches, b)
	b.BeginCompletions()
}

// closeBatches ends the completion batches of this run.
func (c *channel) closeBatches() {
	for i, b := range c.batches {
		c.batches[i] = nil
		b.EndCompletions()
	}
	c.batches = c.batches[:0]
}

// handleWC handles one successful completion.
func (c *channel) handleWC(wc *transport.WC) error { return c.router.Dispatch(wc) }

// sendWC hands a send completion to the MR pool, which delivers those of our CRED_RSP /
// AER_RSP SENDs (signaled) back to us (ctrlWC).
func (c *channel) sendWC(wc *transport.WC) (deliver bool, err error) {
	deliver, err = c.pool.HandleSendCompletion(wc)
	if err != nil && !errors.Is(err, frpool.ErrStaleCompletion) {
		c.log.Warn("send completion refused by the MR pool", zap.Uint64("wr_id", wc.ID), zap.Error(err))
	}
	return deliver, nil
}

func (c *channel) ctrlWC(_ *transport.WC, i uint32) error {
	c.ctrlBusy[i] = false
	c.sendQueuedCtrl()
	return nil
}

func (c *channel) recvWC(wc *transport.WC, i uint32) error {
	c.recvPosted--
	if err := c.pool.HandleRecvCompletion(wc); err != nil {
		c.log.Warn("remote invalidation refused by the MR pool", zap.Uint32("rkey", wc.InvalidatedRKey), zap.Error(err))
	} else if wc.Flags&transport.WCWithInvalidate != 0 {
		c.s.stats.remoteInvs.Add(1)
	}
	err := c.handleIU(c.rxBuf(int(i), wc.ByteLen))
	if perr := c.postRecv(int(i)); perr != nil && err == nil {
		err = perr
	}
	return err
}

// handleIU processes one IU from the target.
func (c *channel) handleIU(b []byte) error {
	op, err := srp.PeekOpcode(b)
	if err != nil {
		return fmt.Errorf("%w: empty IU", errProtocol)
	}
	switch op {
	case srp.OpRsp:
		rsp, err := srp.ParseRsp(b)
		if err != nil {
			return fmt.Errorf("%w: %w", errProtocol, err)
		}
		c.handleRsp(rsp)
	case srp.OpCredReq:
		req, err := srp.ParseCredReq(b)
		if err != nil {
			return fmt.Errorf("%w: %w", errProtocol, err)
		}
		c.addCredits(req.ReqLimDelta())
		c.s.stats.credReqs.Add(1)
		c.sendCtrl(srp.OpCredRsp, req.Tag())
	case srp.OpAerReq:
		req, err := srp.ParseAerReq(b)
		if err != nil {
			return fmt.Errorf("%w: %w", errProtocol, err)
		}
		c.addCredits(req.ReqLimDelta())
		c.s.stats.aerReqs.Add(1)
		if ok, held := c.aerLog.allow(); ok {
			sense, _ := scsi.ParseSense(req.Sense())
			lun := req.LUN()
			c.log.Info("asynchronous event from the target", zap.String("lun", scsi.LUNAddress(lun).String()),
				zap.Stringer("sense", sense), zap.Int("not_logged_since", held))
		}
		c.sendCtrl(srp.OpAerRsp, req.Tag())
	case srp.OpTLogout:
		lo, err := srp.ParseTLogout(b)
		if err != nil {
			return fmt.Errorf("%w: %w", errProtocol, err)
		}
		c.log.Warn("target logout", zap.Stringer("reason", lo.Reason()))
		return errTargetLogout
	default:
		return fmt.Errorf("%w: unexpected %v", errProtocol, op)
	}
	return nil
}

func (c *channel) handleRsp(rsp srp.Rsp) {
	t := rsp.Tag()
	tag := binary.BigEndian.Uint64(t[:])
	c.mu.Lock()
	c.addCreditsLocked(rsp.ReqLimDelta())
	if tag&tagTM != 0 {
		if c.tm.waiting && c.tm.tag == tag {
			c.tm.waiting = false
			c.tm.resp, c.tm.got = rsp.TMResponse()
			select {
			case c.tm.done <- struct{}{}:
			default:
			}
		} else {
			c.s.stats.staleRsps.Add(1)
		}
		c.mu.Unlock()
		return
	}
	slot := int(tag & 0xffff)
	if int(tag>>16&0xffff) != c.idx || slot >= len(c.reqs) {
		c.mu.Unlock()
		c.s.stats.staleRsps.Add(1)
		if ok, held := c.foreignLog.allow(); ok {
			c.log.Warn("response with a tag that is not ours", zap.Stringer("tag", t), zap.Int("not_logged_since", held))
		}
		return
	}
	r := &c.reqs[slot]
	if r.state != reqInflight || r.tag != tag || r.out != outNone {
		// An answer for an aborted or reset command, or an earlier use of the slot: only
		// its credits count.
		c.mu.Unlock()
		c.s.stats.staleRsps.Add(1)
		return
	}
	r.out = outRsp
	r.status = rsp.Status()
	r.rspFlags = rsp.Flags()
	r.diResid = rsp.DataInResid()
	r.doResid = rsp.DataOutResid()
	r.senseLen = copy(r.sense[:], rsp.Sense())
	c.queueInvNoWakeLocked(r) // handled in a completion batch: its afterBatch gives them back
	c.finishLocked(r)
	c.mu.Unlock()
}

type ctrlMsg struct {
	op  srp.Opcode
	tag srp.Tag
}

// sendCtrl answers a target request (CRED_RSP, AER_RSP). It consumes no credit.
func (c *channel) sendCtrl(op srp.Opcode, tag srp.Tag) {
	for i := range c.ctrlBusy {
		if c.ctrlBusy[i] {
			continue
		}
		off := c.ctrlBuf[i]
		buf := c.iuMem.Bytes()[off : off+srp.CredRspLen]
		var n int
		if op == srp.OpCredRsp {
			n, _ = srp.CredRsp(buf).Encode(&srp.CredRspFields{Tag: tag})
		} else {
			n, _ = srp.AerRsp(buf).Encode(&srp.AerRspFields{Tag: tag})
		}
		c.ctrlSGE[0] = transport.SGE{Addr: c.iuMem.Addr() + uint64(off), Length: uint32(n), LKey: c.iuMR.LKey()}
		c.ctrlWR[0] = transport.SendWR{ID: cqpoll.WRID(kindCtrl, uint32(i)), Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: c.ctrlSGE[:]}
		if err := c.pool.Post(&c.ctrlChain); err != nil {
			if ok, held := c.ctrlLog.allow(); ok {
				c.log.Warn("cannot answer target request", zap.Stringer("iu", op), zap.Error(err), zap.Int("not_logged_since", held))
			}
			return
		}
		c.ctrlBusy[i] = true
		return
	}
	if len(c.ctrlQ) < cap(c.ctrlQ) {
		c.ctrlQ = append(c.ctrlQ, ctrlMsg{op, tag})
		return
	}
	if ok, held := c.ctrlLog.allow(); ok {
		c.log.Warn("too many unanswered target requests; dropping one", zap.Stringer("iu", op), zap.Int("not_logged_since", held))
	}
}

func (c *channel) sendQueuedCtrl() {
	for len(c.ctrlQ) > 0 {
		free := false
		for _, b := range c.ctrlBusy {
			free = free || !b
		}
		if !free {
			return
		}
		m := c.ctrlQ[0]
		copy(c.ctrlQ, c.ctrlQ[1:])
		c.ctrlQ = c.ctrlQ[:len(c.ctrlQ)-1]
		c.sendCtrl(m.op, m.tag)
	}
}

// logInterval is the least time between two log entries of one logLimit.
const logInterval = time.Second

// logLimit lets one log entry through per logInterval and counts those it holds back.
type logLimit struct {
	mu   sync.Mutex
	next time.Time
	held int
}

// allow reports whether an entry may be logged now and how many were held back since the last.
func (l *logLimit) allow() (ok bool, held int) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.held++
		return false, 0
	}
	held, l.held, l.next = l.held, 0, now.Add(logInterval)
	return true, held
}
