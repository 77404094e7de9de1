package initiator

// The remote port's state and timers, after torvalds/linux:drivers/scsi/scsi_transport_srp.c
// (enum srp_rport_state, fast_io_fail_tmo, dev_loss_tmo, reconnect_delay): the session runs
// while a channel is up and holds I/O while none is. A channel that fails is taken down by its
// goroutine (the QP drained, every registration settled, as ib_srp's srp_free_ch_ib after
// srp_terminate_io) and logged in again after reconnect_delay.

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/frpool"
	"github.com/srpd/srpd/internal/cqpoll"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// State is the state of a session, after scsi_transport_srp's rport states.
type State int32

const (
	// StateRunning: at least one channel is connected; I/O flows.
	StateRunning State = iota
	// StateBlocked: no channel is connected; channels are reconnecting and I/O is held.
	StateBlocked
	// StateFailFast: fast_io_fail_tmo expired while blocked; I/O fails with ErrFastFail until a
	// channel is back.
	StateFailFast
	// StateLost: dev_loss_tmo expired; the session is gone (ErrSessionLost).
	StateLost
	// StateClosed: Close was called.
	StateClosed
)

func (s State) String() string {
	switch s {
	case StateRunning:
		return "running"
	case StateBlocked:
		return "blocked"
	case StateFailFast:
		return "fail-fast"
	case StateLost:
		return "lost"
	case StateClosed:
		return "closed"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// State returns the session state.
func (s *Session) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Done is closed once the session has shut down (Close, or dev_loss_tmo); Err then says why.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err returns ErrClosed or ErrSessionLost once the session is over, nil before.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.termErr
}

func (s *Session) liveChannels() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live
}

func (s *Session) broadcastLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Session) channelUp(c *channel) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live++
	if s.state == StateBlocked || s.state == StateFailFast {
		if s.ffTimer != nil {
			s.ffTimer.Stop()
			s.ffTimer = nil
		}
		if s.dlTimer != nil {
			s.dlTimer.Stop()
			s.dlTimer = nil
		}
		if s.everRunning {
			s.log.Info("session running again", zap.Int("ch", c.idx))
		}
		s.everRunning = true
		s.state = StateRunning
	}
	s.broadcastLocked()
}

func (s *Session) channelDown(c *channel) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live--
	if s.live == 0 && s.state == StateRunning {
		s.state = StateBlocked
		s.log.Warn("no channel left: I/O held while reconnecting",
			zap.Duration("fast_io_fail_tmo", s.cfg.FastIOFailTmo), zap.Duration("dev_loss_tmo", s.cfg.DevLossTmo))
		if s.cfg.FastIOFailTmo >= 0 {
			s.ffTimer = time.AfterFunc(s.cfg.FastIOFailTmo, s.fastIOFail)
		}
		if s.cfg.DevLossTmo >= 0 {
			s.dlTimer = time.AfterFunc(s.cfg.DevLossTmo, s.devLoss)
		}
	}
	s.broadcastLocked()
}

func (s *Session) fastIOFail() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StateBlocked {
		return
	}
	s.state = StateFailFast
	s.log.Warn("fast_io_fail_tmo expired: failing I/O until a channel is back")
	s.broadcastLocked()
}

func (s *Session) devLoss() {
	s.mu.Lock()
	if s.state != StateBlocked && s.state != StateFailFast {
		s.mu.Unlock()
		return
	}
	s.state = StateLost
	s.termErr = ErrSessionLost
	s.broadcastLocked()
	s.mu.Unlock()
	s.log.Error("dev_loss_tmo expired: session lost")
	go s.shutdown()
}

func (c *channel) run() {
	defer close(c.exited)
	c.cqp.Attach()
	defer c.cqp.Detach()
	failures := 0
	for {
		if c.live() {
			cause := c.serve()
			c.teardown(cause)
			failures = 0
		}
		if c.stopping() {
			return
		}
		if c.getState() == chDisabled {
			<-c.stop
			return
		}
		d := c.s.reconnectDelay(failures)
		if d < 0 { // reconnect_delay off: only dev_loss_tmo or Close end this
			<-c.stop
			return
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-c.stop:
			t.Stop()
			return
		}
		err := c.s.connect(c)
		switch {
		case err == nil:
			c.s.stats.reconnects.Add(1)
			c.log.Info("channel reconnected", zap.Uint32("qpn", c.qp.QPN()), zap.Int("attempt", failures+1))
		case c.getState() == chDisabled:
			c.log.Warn("channel disabled: the target refuses it", zap.Error(err))
		default:
			failures++
			c.log.Info("reconnect failed", zap.Int("attempt", failures), zap.Error(err))
		}
	}
}

// connect logs a down channel in again (the channel goroutine's reconnect step).
func (s *Session) connect(c *channel) error {
	s.loginMu.Lock()
	defer s.loginMu.Unlock()
	if c.stopping() {
		return ErrClosed
	}
	// SINGLE terminates the nexus' other channels at the target: only when we have none.
	multi := s.liveChannels() > 0
	err := s.login(s.ctx, c, multi)
	if err == nil {
		s.channelUp(c)
		return nil
	}
	s.refused(c, multi, err)
	return err
}

// refused disables c for good when the target refuses it as an extra channel of the nexus
// (multichannel not supported): asking again would never work.
func (s *Session) refused(c *channel, multi bool, err error) bool {
	var lre *LoginRejectError
	if multi && errors.As(err, &lre) && lre.Reason == srp.RejMultiChannelUnsupported {
		c.mu.Lock()
		c.state.Store(uint32(chDisabled))
		c.mu.Unlock()
		return true
	}
	return false
}

// reconnectDelay is the wait before reconnect attempt failures+1: reconnect_delay, then
// exponential back-off capped at MaxReconnectDelay, each with ±25 % jitter so that the channels
// (and the sessions of many initiators) do not reconnect in lockstep. Negative: never.
func (s *Session) reconnectDelay(failures int) time.Duration {
	base := s.cfg.ReconnectDelay
	if base < 0 {
		return -1
	}
	d := base
	for i := 0; i < failures && d < s.cfg.MaxReconnectDelay; i++ {
		d *= 2
	}
	d = min(d, s.cfg.MaxReconnectDelay)
	j := time.Duration(rand.Int64N(int64(d)/2 + 1))
	return d*3/4 + j
}

// teardown takes a failed connection down: no more posts, QP to ERR, the flushed work drained
// (bounded by Config.TeardownTimeout), the QP destroyed and the MR pool recovered, so that every
// registration is dead before the requests it served are completed (as outFailed unless
// answered) and re-issued by their callers.
func (c *channel) teardown(cause error) {
	c.mu.Lock()
	closing := c.stopping()
	if closing {
		c.state.Store(uint32(chClosed))
	} else {
		c.state.Store(uint32(chDown))
	}
	c.reqLim = 0
	c.wakeCreditLocked()
	if c.tm.waiting {
		c.tm.waiting = false
		c.tm.err = cause
		select {
		case c.tm.done <- struct{}{}:
		default:
		}
	}
	inflight := c.inflight
	c.mu.Unlock()
	if !closing {
		c.log.Warn("channel down", zap.Uint32("qpn", c.qp.QPN()), zap.Int("inflight", inflight), zap.Error(cause))
	}
	c.s.channelDown(c)

	c.postMu.Lock()
	defer c.postMu.Unlock()
	qpn := c.qp.QPN()
	deadline := time.NewTimer(c.s.cfg.TeardownTimeout)
	defer deadline.Stop()
	sqEmpty := func() bool { return c.pool.Stats().SQOutstanding == 0 }
	// A logout with nothing in flight first lets the send queue drain while the QP still works
	// (a sentinel retires the unsignaled tail), so that the pool sees no error at all.
	graceful := closing && inflight == 0 && len(c.leftover) == 0 && c.pool.QPError() == nil
	if graceful {
		if err := c.pool.Sync(); err == nil {
			c.drain(qpn, deadline.C, sqEmpty, false)
		}
		graceful = sqEmpty()
	}
	if c.conn != nil {
		_ = c.conn.Disconnect(nil)
	}
	_ = c.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState)
	for i := range c.leftover {
		c.drainWC(&c.leftover[i], qpn, graceful)
	}
	c.leftover = c.leftover[:0]
	if !graceful {
		// Nothing executes on the QP any more: the pool settles every registration now, from
		// the device's view of each MR, and hands the buffers back.
		c.pool.HandleQPError(cause)
	}
	// Answers that arrived before the failure still count; the rest of the receives flush.
	if !c.drain(qpn, deadline.C, func() bool { return c.recvPosted == 0 }, graceful) {
		c.log.Warn("teardown: receive buffers did not all flush", zap.Int("recv", c.recvPosted))
	}
	if err := c.qp.Close(); err != nil && !errors.Is(err, transport.ErrClosed) {
		c.log.Warn("destroying QP", zap.Error(err))
	}
	// Give every handle back and end the commands that got no answer: they are re-issued.
	c.giveBackRegs()
	c.mu.Lock()
	for i := range c.reqs {
		r := &c.reqs[i]
		if r.state == reqInflight && r.out == outNone {
			r.out = outFailed
		}
		r.invQueued = false
		c.finishLocked(r)
	}
	c.invQ = c.invQ[:0]
	c.mu.Unlock()
	c.ctrlQ = c.ctrlQ[:0]
	for i := range c.ctrlBusy {
		c.ctrlBusy[i] = false
	}
	c.conn = nil
	c.events = nil
	// Answers drained above, and direct commands whose registrations the teardown released,
	// were queued for runAsync: finish them now, not at the next connection's first batch.
	c.cqp.Lock()
	c.runAsync()
	c.cqp.Unlock()
}

// drain polls the CQ, handling the completions of qpn as teardown does, until done() or the
// deadline. It reports whether done() became true.
func (c *channel) drain(qpn uint32, deadline <-chan time.Time, done func() bool, graceful bool) bool {
	for !done() {
		n := c.cqp.Poll(c.wcs)
		for i := 0; i < n; i++ {
			c.drainWC(&c.wcs[i], qpn, graceful)
		}
		if n > 0 {
			continue
		}
		select {
		case <-c.cqp.Notify():
		case <-deadline:
			return done()
		}
	}
	return true
}

// drainWC handles a completion during teardown: answers that made it still count; flushed
// receives of a graceful logout are not handed to the pool (nothing is registered any more, and
// the pool would take them for a QP error).
func (c *channel) drainWC(wc *transport.WC, qpn uint32, graceful bool) {
	if wc.QPN != qpn {
		return
	}
	if wc.Status != transport.WCSuccess && wc.Status != transport.WCWRFlushErr {
		c.log.Debug("teardown: failed completion", zap.Uint64("wr_id", wc.ID), zap.Stringer("opcode", wc.Opcode),
			zap.Stringer("status", wc.Status), zap.Uint32("vendor_err", wc.VendorErr))
	}
	if !isRecv(wc) {
		_, _ = c.pool.HandleSendCompletion(wc)
		return
	}
	c.recvPosted--
	if graceful && wc.Status != transport.WCSuccess {
		return
	}
	_ = c.pool.HandleRecvCompletion(wc)
	if wc.Status == transport.WCSuccess {
		_ = c.handleIU(c.rxBuf(int(cqpoll.IndexOf(wc.ID)), wc.ByteLen))
	}
}

// isRecv tells receive completions from send completions by the WR ID: every send WR is posted
// through the MR pool, which tags its IDs with frpool.WRIDTag (the opcode of a flushed
// completion is only best effort).
func isRecv(wc *transport.WC) bool { return wc.ID&frpool.WRIDTag == 0 }
