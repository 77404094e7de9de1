package target

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/frpool"
	"github.com/srpd/srpd/internal/cqpoll"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// Work request kinds (cqpoll.WRID). Receive WRs are posted directly and carry these IDs on the
// wire; send WRs are posted through the channel's frpool pool, which puts frpool.WRIDTag and its
// sequence number on the wire and gives these IDs back with the completions the target asked
// for (a response SEND, a control SEND, the keep-alive probe).
const (
	kindRecv cqpoll.Kind = iota + 1 // a receive buffer (index: its slot)
	kindRsp                         // a context's SRP_RSP SEND (index: the context)
	kindCtl                         // a control IU (index: the control buffer)
	kindKA                          // the keep-alive probe
)

// events handed to a channel's loop by other goroutines.
type evKind uint8

const (
	evExecuted evKind = iota + 1 // a LUN worker executed c
	evAborted                    // c was aborted before it was dispatched (and withdrawn)
	evTMDone                     // task management c has nothing left to wait for
)

type event struct {
	kind evKind
	c    *ioCtx
}

// chState is the lifecycle of a channel. Its String (chstate_string.go) is each constant's
// line comment.
type chState uint32

//go:generate go tool stringer -type=chState -linecomment -output=chstate_string.go

const (
	// processing IUs
	chLive chState = iota // live
	// SRP_T_LOGOUT posted, waiting for its completion
	chLoggingOut // logging-out
	// disconnected (QP in ERR): waiting for flushes and executions
	chDraining // draining
	// resources released (or handed to the reaper)
	chClosed // closed
)

// ctlBuf is a send buffer for target-initiated IUs (SRP_T_LOGOUT, SRP_CRED_REQ).
type ctlBuf struct {
	buf  []byte
	addr uint64
	busy bool
}

// closeReq asks a channel to close.
type closeReq struct {
	logout bool
	reason srp.TLogoutReason
	why    string
}

// errDisconnected is the cause given to the pool when the channel moves its QP to ERR.
var errDisconnected = errors.New("target: channel disconnected")

// channel is one RDMA channel (one RC QP) of a session. Everything but the close request, the
// event queue and the statistics is owned by whoever holds the poller's lock (cqp): the
// channel's loop goroutine (run) while it is not waiting, or the transport's receive goroutine
// running the poller's handler (run to completion: a command on a RAM LUN is answered without
// waking the loop). Receive and send completions, credits, contexts and posting all happen
// under it, so the data path takes no other lock of its own. LUN workers only execute commands
// and post events back.
type channel struct {
	// cqp owns the CQ: the lock above, and who handles completions when (cqHandler).
	cqp    *cqpoll.Poller
	router cqpoll.Router // completions by work request kind (onWC)

	t     *Target
	sess  *session
	id    uint64
	log   *zap.Logger
	view  *view
	nexus scsi.Nexus

	dev  transport.Device
	pd   transport.PD
	cq   transport.CQ
	qp   transport.QP
	mem  transport.Memory
	mr   transport.MR
	lkey uint32
	conn transport.CMConn
	// pool posts every send work request of the QP: RDMA READ / WRITE through the contexts'
	// RW contexts, SENDs as plain chains.
	pool *frpool.Pool

	depth, itLen, tiLen, immOff int
	// remInv: the initiator takes SEND_WITH_INV (srp.ExtRemoteInvalidate, granted at login):
	// a response to a command with one direct descriptor invalidates its key (respondCmd).
	remInv  bool
	maxDesc int
	maxXfer int
	// hostSGE: the device sends process memory as it lies (transport.SGE.Host), so a READ from
	// a LUN that lends its memory (RAM) goes out of it without the copy into the request
	// slot (Command.DataInViews).
	hostSGE bool
	rwSGEs  int // the SGEs of a request slot's own RW context

	// receive ring
	nRecv      int
	recvBase   int
	recvStride int
	posted     int
	recvWR     [1]transport.RecvWR
	recvSGE    [1]transport.SGE

	ctxs   []*ioCtx
	free   []*ioCtx
	queues map[*scsi.LUN]*lunQueue // cache of Target.queueFor
	parked []parkedIU
	tags   map[srp.Tag]*ioCtx
	cr     credits
	owed   int // contexts holding a credit not yet answered or dropped

	sqCap, sqFree int
	sqHead        *ioCtx
	sqTail        *ioCtx
	bigRW         []*frpool.RWCtx // free large RW contexts (see ioCtx.rw)
	bigOut        int             // large RW contexts borrowed

	ctl        [2]ctlBuf
	ctlWR      [1]transport.SendWR
	ctlSGE     [1]transport.SGE
	ctlChain   frpool.Chain
	credReqOut bool
	credTag    srp.Tag
	credSeq    uint64

	events chan event

	reqMu  sync.Mutex
	req    *closeReq
	wake   chan struct{}
	state  atomic.Uint32 // chState
	why    string
	dl     time.Time // logout or drain deadline
	forced bool
	done   chan struct{}
	reaped chan struct{} // closed once the memory is released

	memRes int64         // registered memory reserved at admission (given back by releaseMemory)
	pend   *pendingLogin // the pending login it was created for (Serve), or nil

	// Liveness and stall detection (loop-owned; see maintain).
	activity   uint64 // completions handled
	seenAct    uint64 // activity at the last maintenance tick
	kaOut      bool   // a keep-alive probe is posted
	kaDeadline time.Time
	kaWR       [1]transport.SendWR
	kaChain    frpool.Chain

	stats chanCounters
}

type parkedIU struct {
	slot int
	n    int
}

func (ch *channel) st() chState { return chState(ch.state.Load()) }

// queueFor is Target.queueFor through a per-channel cache (no target lock per command).
func (ch *channel) queueFor(l *scsi.LUN) *lunQueue {
	q := ch.queues[l]
	if q == nil {
		q = ch.t.queueFor(l)
		ch.queues[l] = q
	}
	return q
}

// post hands an event to the loop. The queue holds one event per context, and a context
// has at most one event outstanding, so this never blocks.
func (ch *channel) post(ev event) { ch.events <- ev }

// requestClose asks the loop to close the channel (any goroutine).
func (ch *channel) requestClose(r closeReq) {
	ch.reqMu.Lock()
	if ch.req == nil {
		ch.req = &r
	}
	ch.reqMu.Unlock()
	select {
	case ch.wake <- struct{}{}:
	default:
	}
}

func (ch *channel) recvBuf(slot int) []byte {
	off := ch.recvBase + slot*ch.recvStride
	return ch.mem.Bytes()[off : off+ch.itLen]
}

// repost gives receive buffer slot back to the receive queue (while the channel is live).
func (ch *channel) repost(slot int) {
	if slot < 0 || ch.st() != chLive {
		return
	}
	if err := ch.postRecv(slot); err != nil {
		ch.fail("posting a receive", err)
	}
}

func (ch *channel) postRecv(slot int) error {
	off := ch.recvBase + slot*ch.recvStride
	ch.recvSGE[0] = transport.SGE{Addr: ch.mem.Addr() + uint64(off), Length: uint32(ch.itLen), LKey: ch.lkey}
	ch.recvWR[0] = transport.RecvWR{ID: cqpoll.WRID(kindRecv, uint32(slot)), SGL: ch.recvSGE[:]}
	if err := ch.qp.PostRecv(ch.recvWR[:]); err != nil {
		return err
	}
	ch.posted++
	return nil
}

// onWCs handles a batch of completions.
func (ch *channel) onWCs(wcs []transport.WC) {
	for i := range wcs {
		ch.onWC(&wcs[i])
	}
}

// afterWCs is the rest of a loop round after the completions: the queued events, the request
// checks and the credit request. It reports whether an event ran.
func (ch *channel) afterWCs() (progress bool) {
drain:
	for {
		select {
		case ev := <-ch.events:
			ch.onEvent(ev)
			progress = true
		default:
			break drain
		}
	}
	ch.checkRequest()
	if ch.st() == chLive {
		ch.maybeCredReq()
	}
	return progress
}

// run is the channel's loop.
func (ch *channel) run() {
	defer ch.t.loops.Done()
	wcs := make([]transport.WC, 64)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var cmEvents <-chan transport.CMEvent
	if ch.conn != nil {
		cmEvents = ch.conn.Events()
	}
	notify := ch.cqp.Notify()
	var tick <-chan time.Time
	if p := ch.t.limits().maintenancePeriod(); p > 0 {
		tk := time.NewTicker(p)
		defer tk.Stop()
		tick = tk.C
	}
	ch.cqp.Attach()
	defer ch.cqp.Detach()
	ch.cqp.Begin(0) // one QP per CQ: every completion is this channel's
	defer ch.cqp.End()
	for {
		progress := false
		select { // a busy loop still checks liveness and stalls
		case now := <-tick:
			ch.maintain(now)
		default:
		}
		if n, _, _ := ch.cqp.Take(wcs); n > 0 { // what the handler left (it fits: same size)
			ch.onWCs(wcs[:n])
			progress = true
		}
		if n := ch.cqp.Poll(wcs); n > 0 {
			ch.onWCs(wcs[:n])
			progress = true
		}
		if ch.afterWCs() {
			progress = true
		}
		if s := ch.st(); s != chLive {
			if ch.drained() {
				if s == chLoggingOut {
					ch.disconnect()
					continue
				}
				break
			}
			if !time.Now().Before(ch.dl) {
				if s == chLoggingOut {
					ch.log.Debug("T_LOGOUT not completed in time; disconnecting")
					ch.disconnect()
					continue
				}
				ch.forced = true
				break
			}
		}
		if progress {
			continue
		}
		if s := ch.st(); s != chLive {
			timer.Reset(time.Until(ch.dl))
		}
		ch.cqp.Unlock()
		var (
			ev      event
			cme     transport.CMEvent
			gotEv   bool
			gotCMEv bool
			tickAt  time.Time
		)
		select {
		case <-notify:
		case ev = <-ch.events:
			gotEv = true
		case <-ch.wake:
		case e, ok := <-cmEvents:
			if !ok {
				cmEvents = nil
				break
			}
			cme, gotCMEv = e, true
		case <-timer.C:
		case tickAt = <-tick:
		}
		ch.cqp.Lock()
		if !tickAt.IsZero() {
			ch.maintain(tickAt)
		}
		if gotEv {
			ch.onEvent(ev)
		}
		if gotCMEv {
			ch.onCMEvent(cme)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
	ch.destroy()
}

// maintain runs on every maintenance tick (loop-owned): the keep-alive of an idle channel and
// the detection of commands stalled on the transport.
func (ch *channel) maintain(now time.Time) {
	if ch.st() != chLive {
		return
	}
	lim := ch.t.limits()
	if ka := lim.KeepAliveInterval; ka > 0 {
		switch {
		case ch.kaOut && !now.Before(ch.kaDeadline):
			ch.t.stats.keepAliveTimeouts.Add(1)
			ch.log.Warn("the peer did not acknowledge the keep-alive probe; closing the channel",
				zap.Duration("waited", ka/4))
			ch.kaOut = false // it flushes with the QP; nothing waits for it
			ch.startClose(nil, "peer unresponsive (keep-alive)")
			return
		case !ch.kaOut && ch.activity == ch.seenAct:
			ch.postKeepAlive(now.Add(ka / 4))
		}
		ch.seenAct = ch.activity
	}
	if st := lim.StallTimeout; st > 0 {
		ch.checkStalls(now, st)
	}
}

// postKeepAlive posts the probe: a zero-length RDMA WRITE, which the peer's RC transport
// acknowledges with no rkey check and no work for its ULP (IBA C9-88; rxe_resp.c check_rkey
// skips the key for a zero-byte RDMA WRITE). Its send-queue slot is one of ctlSlots.
func (ch *channel) postKeepAlive(deadline time.Time) {
	if ch.qp.State() != transport.QPSRTS {
		return
	}
	ch.kaWR[0] = transport.SendWR{ID: cqpoll.WRID(kindKA, 0), Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled}
	ch.kaChain.WRs = ch.kaWR[:]
	if err := ch.pool.Post(&ch.kaChain); err != nil {
		ch.log.Debug("posting the keep-alive probe", zap.Error(err))
		return
	}
	ch.kaOut, ch.kaDeadline = true, deadline
	ch.stats.keepAlives.Add(1)
}

// checkStalls finds commands that have waited on the transport (table or data RDMA READs,
// room in the send queue, the RDMA WRITEs and response SEND) for longer than st; time in the
// LUN queue or on the backend does not count. A command counts as waiting since the first
// tick that saw it in that state, so the bound is met within a tick.
func (ch *channel) checkStalls(now time.Time, st time.Duration) {
	var oldest time.Duration
	var worst *ioCtx
	for _, c := range ch.ctxs {
		switch c.state {
		case csTables, csFetch, csWaitSQ, csSend:
		default:
			c.stallSince = time.Time{}
			continue
		}
		if c.stallSince.IsZero() || c.stallGen != c.gen || c.stallState != c.state {
			c.stallSince, c.stallGen, c.stallState = now, c.gen, c.state
			continue
		}
		if d := now.Sub(c.stallSince); d >= st && d > oldest {
			oldest, worst = d, c
		}
	}
	if worst == nil {
		return
	}
	ch.t.stats.stalls.Add(1)
	ch.stats.stalls.Add(1)
	worst.stallSince = now // report a still-stuck command again one timeout later, not every tick
	if ch.t.limits().StallAction == StallLog {
		ch.log.Warn("command stalled on the transport", zap.Stringer("state", worst.state),
			zap.Duration("waiting", oldest), zap.Binary("tag", worst.tag[:]))
		return
	}
	ch.log.Warn("command stalled on the transport; closing the channel", zap.Stringer("state", worst.state),
		zap.Duration("waiting", oldest), zap.Binary("tag", worst.tag[:]))
	ch.startClose(nil, "command stalled on the transport")
}

// cqHandler is the channel's cqpoll.Handler: the poller runs it on the transport's receive
// goroutine, doing the loop's completion work when the loop is idle and the channel live, so
// that a request is answered without a goroutine handoff. Anything else (the loop busy, a
// failed completion, a teardown begun) is left to the loop, woken by the token. A flush or an
// error goes to the loop (after a disconnect event it may already hold, which makes the
// flushes expected).
type cqHandler channel

func (h *cqHandler) Ready() bool { return (*channel)(h).st() == chLive }

func (h *cqHandler) HandleCompletion(wc *transport.WC) error {
	(*channel)(h).onWC(wc)
	return nil
}

func (h *cqHandler) EndBatch() bool { return false }

func (h *cqHandler) EndRun(took bool) bool {
	ch := (*channel)(h)
	if !took || ch.st() != chLive {
		return false
	}
	ch.maybeCredReq()
	return true
}

// drained reports whether nothing of the channel is outstanding any more: for logging out,
// the T_LOGOUT's completion; for draining, every receive flushed and every context free.
func (ch *channel) drained() bool {
	if ch.st() == chLoggingOut {
		return !ch.ctl[0].busy
	}
	if ch.posted > 0 || ch.ctl[0].busy || ch.ctl[1].busy || ch.kaOut {
		return false
	}
	return len(ch.free) == len(ch.ctxs)
}

func (ch *channel) checkRequest() {
	ch.reqMu.Lock()
	r := ch.req
	ch.reqMu.Unlock()
	if r == nil || ch.st() != chLive {
		return
	}
	if r.logout {
		ch.startClose(&r.reason, r.why)
	} else {
		ch.startClose(nil, r.why)
	}
}

// startClose begins the teardown: abort everything in flight, send SRP_T_LOGOUT if asked (and
// possible), then disconnect.
func (ch *channel) startClose(reason *srp.TLogoutReason, why string) {
	if ch.st() != chLive {
		return
	}
	ch.why = why
	ch.log.Info("closing channel", zap.String("why", why))
	ch.state.Store(uint32(chLoggingOut))
	ch.abortAll()
	if reason != nil && ch.qp.State() == transport.QPSRTS && !ch.ctl[0].busy {
		b := ch.ctl[0].buf
		n, _ := srp.TLogout(b).Encode(&srp.TLogoutFields{Reason: *reason})
		if ch.postCtl(0, n, true) {
			ch.stats.tlogouts.Add(1)
			ch.dl = time.Now().Add(ch.t.limits().LogoutTimeout)
			ch.log.Debug("sent T_LOGOUT", zap.Stringer("reason", *reason))
			return
		}
	}
	ch.disconnect()
}

// disconnect moves the QP to ERR (with a CM DREQ when there is a connection) so that every
// outstanding work request flushes.
func (ch *channel) disconnect() {
	ch.state.Store(uint32(chDraining))
	ch.dl = time.Now().Add(ch.t.limits().TeardownTimeout)
	if ch.conn != nil {
		if err := ch.conn.Disconnect(nil); err != nil {
			ch.log.Debug("disconnect", zap.Error(err))
		}
	}
	if ch.qp.State() != transport.QPSErr {
		if err := ch.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState); err != nil {
			ch.log.Debug("moving the QP to ERR", zap.Error(err))
		}
	}
	ch.pool.HandleQPError(errDisconnected)
	// Contexts waiting for send-queue slots will never get them.
	for c := ch.sqHead; c != nil; {
		n := c.sqNextW
		c.sqNextW = nil
		ch.dropUnposted(c)
		c = n
	}
	ch.sqHead, ch.sqTail = nil, nil
}

// onCMEvent handles an event of the channel's connection: a disconnect (the initiator's DREQ,
// how ib_srp logs out) closes the channel at once, before the flushed work requests that the
// QP's move to ERR produced are taken for transport errors.
func (ch *channel) onCMEvent(e transport.CMEvent) {
	if e.Type == transport.CMEventDisconnected {
		ch.requestClose(closeReq{why: "disconnected by the initiator (DREQ)"})
		ch.checkRequest()
	}
}

// fail handles a fatal error of the transport: close without T_LOGOUT.
func (ch *channel) fail(what string, err error) {
	if ch.st() == chLive && ch.conn != nil && ch.qp.State() == transport.QPSErr {
		// The CM moves the QP to ERR before it delivers the disconnect event, so the flushes
		// of a DREQ can be polled first: take a pending disconnect now; then they are no error.
		// (Querying the state also waits for softroce's CM to finish handling the DREQ, which
		// it does under the device lock: the event is queued by then.)
		select {
		case e, ok := <-ch.conn.Events():
			if ok {
				ch.onCMEvent(e)
			}
		default:
		}
		if ch.st() != chLive {
			return
		}
	}
	ch.stats.errors.Add(1)
	if ch.st() == chLive {
		ch.log.Warn("channel failed", zap.String("while", what), zap.Error(err))
		ch.startClose(nil, what+": "+err.Error())
	}
}

// protocolError answers an unusable IU with SRP_T_LOGOUT and closes the channel.
func (ch *channel) protocolError(reason srp.TLogoutReason, detail string) {
	ch.stats.badIUs.Add(1)
	if ch.st() == chLive {
		ch.log.Warn("protocol error; logging the initiator out", zap.Stringer("reason", reason), zap.String("detail", detail))
		ch.startClose(&reason, "protocol error: "+reason.String())
	}
}

// abortAll ends every request of the channel (teardown): commands are aborted in their LUN
// queues, parked IUs dropped.
func (ch *channel) abortAll() {
	ch.stats.dropped.Add(uint64(len(ch.parked)))
	ch.parked = ch.parked[:0]
	for _, c := range ch.ctxs {
		if c.kind == kCmd && c.lq != nil && (c.state == csTables || c.state == csFetch || c.state == csExec) {
			c.lq.abort(func(x *ioCtx) bool { return x == c }, nil)
		}
	}
}

// ---- completions ----

// initCompletions sets up the channel's poller and the routes of its work request kinds.
func (ch *channel) initCompletions() {
	ch.router.Tagged(frpool.WRIDTag, ch.onSendWC)
	ch.router.Route(kindRecv, ch.onRecvWC)
	ch.router.Route(kindRsp, ch.onRspWC)
	ch.router.Route(kindCtl, ch.onCtlWC)
	ch.router.Route(kindKA, ch.onKAWC)
	ch.router.Unknown(ch.onUnknownWC)
	ch.cqp = cqpoll.New(cqpoll.Config{
		CQ: ch.cq, Handler: (*cqHandler)(ch), NoEngine: ch.t.limits().NoCompletionHandler,
		Runs: &ch.t.stats.handlerBatches,
	})
}

func (ch *channel) onWC(wc *transport.WC) {
	ch.activity++
	_ = ch.router.Dispatch(wc) // the routes act on errors themselves (fail)
}

func (ch *channel) onUnknownWC(wc *transport.WC, _ uint32) error {
	ch.log.Error("completion with an unknown work request ID", zap.Uint64("id", wc.ID))
	return nil
}

func (ch *channel) onRecvWC(wc *transport.WC, slot uint32) error {
	// The pool learns of QP errors and remote invalidations from receive completions; a plain
	// successful receive tells it nothing (HandleRecvCompletion would only take its lock).
	if wc.Status != transport.WCSuccess || wc.Flags&transport.WCWithInvalidate != 0 {
		if err := ch.pool.HandleRecvCompletion(wc); err != nil && !errors.Is(err, frpool.ErrStaleCompletion) {
			ch.log.Debug("receive completion refused by the MR pool", zap.Error(err))
		}
	}
	ch.onRecv(wc, int(slot))
	return nil
}

// onSendWC hands a send completion to the pool, which retires the work requests it covers
// (running RWDone for the RW contexts it completes) and gives back the completions of the
// target's own SENDs (deliver), which the router then dispatches by kind.
func (ch *channel) onSendWC(wc *transport.WC) (deliver bool, err error) {
	deliver, err = ch.pool.HandleSendCompletion(wc)
	if err != nil && !errors.Is(err, frpool.ErrStaleCompletion) {
		ch.log.Error("send completion refused by the MR pool", zap.Uint64("id", wc.ID), zap.Error(err))
		ch.fail("send completion", err)
	}
	return deliver, nil
}

func (ch *channel) onKAWC(wc *transport.WC, _ uint32) error {
	ch.kaOut = false
	if wc.Status != transport.WCSuccess && (wc.Status != transport.WCWRFlushErr || ch.st() == chLive) {
		ch.fail("keep-alive probe", fmt.Errorf("completion status %v", wc.Status))
	}
	return nil
}

func (ch *channel) onRecv(wc *transport.WC, slot int) {
	ch.posted--
	if wc.Status != transport.WCSuccess {
		if wc.Status != transport.WCWRFlushErr || ch.st() == chLive {
			ch.fail("receive", fmt.Errorf("completion status %v", wc.Status))
		}
		return
	}
	if ch.st() != chLive {
		return
	}
	ch.stats.ius.Add(1)
	n := int(wc.ByteLen)
	if len(ch.parked) > 0 || !ch.handleIU(slot, ch.recvBuf(slot)[:n]) {
		ch.parked = append(ch.parked, parkedIU{slot: slot, n: n})
		ch.stats.parked.Add(1)
	}
}

// onRspWC handles the completion of a context's SRP_RSP SEND (after the RDMA WRITEs chained
// before it, if any): the request is over.
func (ch *channel) onRspWC(wc *transport.WC, idx uint32) error {
	c := ch.ctxs[idx]
	if wc.Status != transport.WCSuccess && (wc.Status != transport.WCWRFlushErr || ch.st() == chLive) {
		ch.fail(fmt.Sprintf("%v for %v", wc.Opcode, c.state), fmt.Errorf("completion status %v", wc.Status))
	}
	ch.sqFree += c.sqUsed
	c.sqUsed = 0
	if c.state == csSend {
		ch.release(c)
	} else {
		ch.log.Error("send completion for a context in state " + c.state.String())
	}
	ch.kickSQ()
	return nil
}

// rwDone continues a context whose RDMA READ transfer (external tables, data-out) completed.
// For data-in the response SEND chained after the RDMA WRITEs completes the request
// (onRspWC, delivered by the same HandleSendCompletion call right after this).
func (ch *channel) rwDone(c *ioCtx, err error) {
	if ch.st() == chClosed {
		return // the pool given up at teardown (destroy released the contexts)
	}
	if err != nil {
		st := transport.WCWRFlushErr
		var we *frpool.WCError
		if errors.As(err, &we) {
			st = we.Status
		}
		if st != transport.WCWRFlushErr || ch.st() == chLive {
			ch.fail(fmt.Sprintf("RDMA transfer for %v", c.state), err)
		}
	}
	switch c.state {
	case csTables, csFetch:
	case csSend:
		return
	default:
		ch.log.Error("RDMA transfer completion for a context in state " + c.state.String())
		return
	}
	ch.sqFree += c.sqUsed
	c.sqUsed = 0
	ch.putBig(c)
	switch {
	case err != nil || ch.st() != chLive:
		ch.withdrawDrop(c)
	case c.state == csTables:
		ch.afterTables(c)
	default:
		ch.stats.bytesOut.Add(uint64(c.xferOut))
		ch.ready(c)
	}
	ch.kickSQ()
}

func (ch *channel) onCtlWC(wc *transport.WC, i uint32) error {
	ch.ctl[i].busy = false
	if wc.Status != transport.WCSuccess && (wc.Status != transport.WCWRFlushErr || ch.st() == chLive) {
		ch.fail("control send", fmt.Errorf("completion status %v", wc.Status))
	}
	return nil
}

func (ch *channel) onEvent(ev event) {
	c := ev.c
	switch ev.kind {
	case evExecuted:
		if c.aborted.Load() || ch.st() != chLive {
			ch.drop(c)
		} else {
			ch.respondCmd(c)
		}
	case evAborted:
		ch.drop(c)
	case evTMDone:
		ch.finishTM(c)
	}
}

// ---- contexts ----

func (ch *channel) alloc(kind ctxKind, slot int) *ioCtx {
	c := ch.free[len(ch.free)-1]
	ch.free = ch.free[:len(ch.free)-1]
	c.reset(kind, slot)
	return c
}

// release frees a context and lets a parked IU use it.
func (ch *channel) release(c *ioCtx) {
	ch.putBig(c)
	if c.slot >= 0 {
		ch.repost(c.slot)
		c.slot = -1
	}
	if c.inTags {
		delete(ch.tags, c.tag)
		c.inTags = false
	}
	c.state = csFree
	ch.free = append(ch.free, c)
	for len(ch.parked) > 0 && len(ch.free) > 0 && ch.st() == chLive {
		p := ch.parked[0]
		if !ch.handleIU(p.slot, ch.recvBuf(p.slot)[:p.n]) {
			break
		}
		copy(ch.parked, ch.parked[1:])
		ch.parked = ch.parked[:len(ch.parked)-1]
	}
}

// drop ends a request without a response (aborted, or the channel is closing); its credit is
// owed to the initiator.
func (ch *channel) drop(c *ioCtx) {
	if c.credit {
		ch.cr.dropped()
		ch.owed--
		c.credit = false
		ch.stats.aborted.Add(1)
	}
	ch.release(c)
	ch.publishCredits()
}

// withdrawDrop takes an admitted command whose data transfer did not happen out of its LUN
// queue and drops it.
func (ch *channel) withdrawDrop(c *ioCtx) {
	if c.lq != nil {
		c.lq.withdraw(c)
	}
	ch.drop(c)
}

// dropUnposted ends a context whose work requests were never posted.
func (ch *channel) dropUnposted(c *ioCtx) {
	switch c.next {
	case csTables, csFetch:
		ch.withdrawDrop(c)
	default:
		ch.release(c)
	}
}

func (ch *channel) publishCredits() {
	ch.stats.reqLim.Store(int64(ch.cr.reqLim))
	ch.stats.pending.Store(int64(ch.cr.pending))
	ch.stats.returned.Store(ch.cr.returned)
}

// ---- send queue ----

// postChain posts what c has prepared for state next — the RDMA READs of c.rw (csTables,
// csFetch), or the SRP_RSP after the RDMA WRITEs of c.rw (csSend with c.withRW) or alone — or
// queues c until the send queue has room for c.nwr work requests. The pool posts all-or-nothing
// and reserves the slots of later READ waves at once; the channel accounts the slots itself
// (conservatively: a chain's slots come back when it has completed) so that a chain is never
// refused by the pool and the control SENDs always find their reserved slots.
func (ch *channel) postChain(c *ioCtx, next cstate) {
	if ch.sqHead == nil && c.needBig {
		ch.takeBig(c)
	}
	if ch.sqHead != nil || c.needBig || ch.sqFree < c.nwr {
		c.state, c.next = csWaitSQ, next
		if ch.sqTail != nil {
			ch.sqTail.sqNextW = c
		} else {
			ch.sqHead = c
		}
		ch.sqTail = c
		ch.stats.sqWaits.Add(1)
		return
	}
	ch.doPost(c, next)
}

func (ch *channel) doPost(c *ioCtx, next cstate) {
	var err error
	switch {
	case next != csSend:
		err = ch.pool.PostRW(c.rw, nil, c)
	case c.withRW:
		err = ch.pool.PostRW(c.rw, &c.sendWR[0], c)
	default:
		err = ch.pool.Post(&c.chain)
	}
	if err != nil {
		c.state = csWaitSQ
		c.next = next
		ch.dropUnposted(c)
		ch.fail("posting work requests", err)
		return
	}
	ch.sqFree -= c.nwr
	c.sqUsed = c.nwr
	c.state = next
}

func (ch *channel) kickSQ() {
	for c := ch.sqHead; c != nil && ch.st() == chLive; c = ch.sqHead {
		if c.needBig && !ch.takeBig(c) {
			return
		}
		if ch.sqFree < c.nwr {
			return
		}
		ch.sqHead = c.sqNextW
		if ch.sqHead == nil {
			ch.sqTail = nil
		}
		c.sqNextW = nil
		ch.doPost(c, c.next)
	}
}

// prepareRW initialises c's transfer (c.local, c.remote) in its own RW context; a transfer
// that needs more work requests than that holds is marked needBig, to be initialised in a
// large context when one is free (takeBig). extra is the work requests posted with it (the
// SEND of a response). False if the transfer cannot be described at all.
func (ch *channel) prepareRW(c *ioCtx, dir frpool.RWDir, extra int) bool {
	c.rw = c.own
	nwr, err := c.rw.Init(dir, c.local[:c.nlocal], c.remote)
	switch {
	case err == nil:
		c.nwr = nwr + extra
		return true
	case errors.Is(err, frpool.ErrRWLength) && len(ch.bigRW)+ch.bigOut > 0:
		c.needBig, c.nwr = true, extra
		return true
	}
	ch.log.Error("preparing an RDMA transfer", zap.Error(err))
	return false
}

// takeBig gives c a free large RW context and initialises its transfer in it; false if none
// is free.
func (ch *channel) takeBig(c *ioCtx) bool {
	n := len(ch.bigRW)
	if n == 0 {
		return false
	}
	rw := ch.bigRW[n-1]
	dir := frpool.RWRead
	if c.withRW {
		dir = frpool.RWWrite
	}
	nwr, err := rw.Init(dir, c.local[:c.nlocal], c.remote)
	if err != nil { // cannot happen: large contexts hold maxWR work requests
		ch.log.Error("preparing a large RDMA transfer", zap.Error(err))
		return false
	}
	ch.bigRW = ch.bigRW[:n-1]
	ch.bigOut++
	c.rw, c.needBig = rw, false
	c.nwr += nwr
	ch.stats.bigRW.Add(1)
	return true
}

// putBig gives back the large RW context c used, if any (its transfer is over or was never
// posted).
func (ch *channel) putBig(c *ioCtx) {
	if c.rw != c.own {
		ch.bigRW = append(ch.bigRW, c.rw)
		ch.bigOut--
		c.rw = c.own
	}
	c.needBig = false
}

// postCtl sends n bytes of control buffer i (one reserved SQ slot each).
func (ch *channel) postCtl(i, n int, solicited bool) bool {
	cb := &ch.ctl[i]
	ch.ctlSGE[0] = transport.SGE{Addr: cb.addr, Length: uint32(n), LKey: ch.lkey}
	fl := transport.SendSignaled
	if solicited {
		fl |= transport.SendSolicited
	}
	ch.ctlWR[0] = transport.SendWR{ID: cqpoll.WRID(kindCtl, uint32(i)), Opcode: transport.WRSend, Flags: fl, SGL: ch.ctlSGE[:]}
	if err := ch.pool.Post(&ch.ctlChain); err != nil {
		ch.log.Debug("posting a control IU", zap.Error(err))
		return false
	}
	cb.busy = true // its send-queue slot is one of the two reserved at creation
	return true
}

// maybeCredReq returns owed credits with SRP_CRED_REQ when no response is coming that could
// carry them (pain point: ib_srpt only piggybacks them, so an idle channel whose commands were
// aborted by another channel's task management starves).
func (ch *channel) maybeCredReq() {
	if ch.cr.pending == 0 || ch.owed > 0 || ch.credReqOut || ch.ctl[1].busy {
		return
	}
	ch.credSeq++
	be.PutUint64(ch.credTag[:], ch.credSeq|1<<63)
	d := ch.cr.credReq()
	n, _ := srp.CredReq(ch.ctl[1].buf).Encode(&srp.CredReqFields{ReqLimDelta: d, Tag: ch.credTag})
	if !ch.postCtl(1, n, false) {
		ch.cr.pending += d // not sent: still owed
		ch.cr.reqLim -= d
		return
	}
	ch.credReqOut = true
	ch.stats.credReqs.Add(1)
	ch.publishCredits()
}

// ---- teardown ----

// destroy releases the channel's transport resources. Memory that a LUN worker may still be
// writing into (a command that outlived the drain deadline) is released by a reaper goroutine
// once those commands return.
func (ch *channel) destroy() {
	ch.state.Store(uint32(chClosed))
	busy := 0
	for _, c := range ch.ctxs {
		switch c.state {
		case csFree:
		case csExec, csTM:
			busy++
		case csTables, csFetch, csWaitSQ:
			if c.lq != nil {
				c.lq.withdraw(c)
			}
			if c.credit {
				c.credit = false
				ch.owed--
			}
			c.state = csFree
		default:
			c.state = csFree
		}
	}
	if ch.forced {
		ch.t.stats.teardownTimeouts.Add(1)
		ch.log.Warn("channel drain timed out; releasing its resources anyway",
			zap.Int("executing", busy), zap.Int("receives_outstanding", ch.posted))
	}
	var errs []error
	if err := ch.qp.Close(); err != nil && !errors.Is(err, transport.ErrClosed) {
		errs = append(errs, fmt.Errorf("QP: %w", err))
	}
	if err := ch.closePool(); err != nil {
		errs = append(errs, fmt.Errorf("MR pool: %w", err))
	}
	if err := ch.cq.Close(); err != nil && !errors.Is(err, transport.ErrClosed) {
		errs = append(errs, fmt.Errorf("CQ: %w", err))
	}
	if busy == 0 {
		ch.releaseMemory(errs)
		ch.t.channelGone(ch)
		return
	}
	ch.t.reapers.Add(1)
	go ch.reap(busy, errs)
	ch.t.channelGone(ch)
}

// closePool closes the channel's pool once its QP is closed (or never connected). After a
// drain that timed out, work requests may still be outstanding in the pool's books: Recover
// forgets them first (their RW contexts complete with an error, which rwDone ignores once the
// channel is closed).
func (ch *channel) closePool() error {
	err := ch.pool.Close()
	if errors.Is(err, frpool.ErrBusy) {
		_ = ch.pool.Recover(nil)
		err = ch.pool.Close()
	}
	if errors.Is(err, frpool.ErrClosed) {
		err = nil
	}
	return err
}

// reap waits for the commands that were still executing at the drain deadline and releases
// the memory they used.
func (ch *channel) reap(busy int, errs []error) {
	defer ch.t.reapers.Done()
	for busy > 0 {
		ev := <-ch.events
		switch ev.kind {
		case evExecuted, evAborted, evTMDone:
			if ev.c.state == csExec || ev.c.state == csTM {
				ev.c.state = csFree
				busy--
			}
		}
	}
	ch.releaseMemory(errs)
}

func (ch *channel) releaseMemory(errs []error) {
	if err := ch.mr.Close(); err != nil && !errors.Is(err, transport.ErrClosed) {
		errs = append(errs, fmt.Errorf("MR: %w", err))
	} else {
		ch.t.stats.mrs.Add(-1)
	}
	n := ch.mem.Len()
	if err := ch.mem.Free(); err != nil {
		errs = append(errs, fmt.Errorf("memory: %w", err))
	} else {
		ch.t.stats.memBytes.Add(-int64(n))
	}
	if err := ch.pd.Close(); err != nil && !errors.Is(err, transport.ErrClosed) {
		errs = append(errs, fmt.Errorf("PD: %w", err))
	}
	ch.t.putMemory(ch.memRes, ch.pend)
	ch.memRes = 0
	if err := errors.Join(errs...); err != nil {
		ch.log.Error("releasing channel resources", zap.Error(err))
	}
	ch.log.Info("channel closed", zap.String("why", ch.why))
	close(ch.reaped)
}
