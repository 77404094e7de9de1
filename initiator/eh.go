package initiator

// Error handling, after torvalds/linux:drivers/scsi/scsi_error.c and ib_srp.c (srp_abort,
// srp_reset_device, srp_reset_host): the command timeout watchdog, task management (ABORT
// TASK, then LOGICAL UNIT RESET) and, as the last resort, a reset of the channel.

import (
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/frpool"
	"github.com/srpd/srpd/internal/cqpoll"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// tmState is the channel's task management slot, guarded by channel.mu. Its IU buffers
// (channel.tmBufs) are written only by the goroutine holding channel.tmMu.
type tmState struct {
	seq     uint32
	tag     uint64
	waiting bool
	got     bool
	resp    srp.TMResponse
	err     error
	done    chan struct{}
}

// watchdog times commands out (Config.CommandTimeout): every tick it gives the token of every
// command whose deadline has passed, so a command times out between CommandTimeout and
// CommandTimeout + watchdogTick(CommandTimeout) after it was posted. Ends with the session.
func (s *Session) watchdog() {
	t := time.NewTicker(watchdogTick(s.cfg.CommandTimeout))
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		now := int64(s.now())
		for _, c := range s.chans {
			for i := range c.reqs {
				r := &c.reqs[i]
				if d := r.deadline.Load(); d != 0 && now >= d && r.deadline.CompareAndSwap(d, 0) {
					// Read before the token: once await has it, the slot may be reused.
					async := r.async
					r.expired <- struct{}{} // never blocks: await takes every token given
					if async {
						s.asyncSlow(r) // nobody waits: await runs on a goroutine of its own
					}
				}
			}
		}
	}
}

// watchdogTick is the watchdog's period for a command timeout d: d/16, within [1 ms, 250 ms].
func watchdogTick(d time.Duration) time.Duration {
	return min(max(d/16, time.Millisecond), 250*time.Millisecond)
}

// abortCmd runs error handling for a timed-out command: ABORT TASK; if that fails, LOGICAL UNIT
// RESET; if that fails too, a reset of the channel. It returns once the command is over (see
// finishLocked: answered, or ended with its buffers released), with what error handling ran
// into (nil if the abort worked).
func (s *Session) abortCmd(r *request) error {
	c := r.ch
	c.mu.Lock()
	gen, tag, over := r.gen, r.tag, r.out != outNone
	lun, lunAddr := r.spec.lun, r.spec.lunAddr
	c.mu.Unlock()
	var ehErr error
	switch {
	case over:
	case !c.live():
		// The channel is down: its teardown ends the command (and releases its buffers).
		ehErr = errChannelDown
	default:
		s.stats.aborts.Add(1)
		err := c.taskMgmt(srp.TMAbortTask, lun, lunAddr, tag)
		switch {
		case err == nil:
			if c.forceFinish(r, gen, outAborted) {
				s.log.Info("timed-out command aborted", zap.Int("ch", c.idx), zap.Uint64("lun", lun),
					zap.Uint64("tag", tag), zap.Duration("age", time.Since(r.started)))
			}
		case !c.live():
			ehErr = err // the channel failed meanwhile; its teardown ends the command
		default:
			ehErr = err
			s.log.Warn("abort failed; resetting the logical unit", zap.Int("ch", c.idx), zap.Uint64("lun", lun), zap.Error(err))
			if err := s.resetLUN(lun, lunAddr, c, r, gen); err != nil {
				ehErr = err
				if c.live() {
					s.log.Warn("logical unit reset failed; resetting the channel", zap.Int("ch", c.idx), zap.Uint64("lun", lun), zap.Error(err))
					c.requestReset(errEHReset)
				}
			}
		}
	}
	t := time.NewTimer(s.cfg.TaskMgmtTimeout)
	defer t.Stop()
	select {
	case <-r.done:
	case <-t.C:
		// Its buffers are not back (the channel is stuck): a channel reset releases them.
		c.requestReset(errEHReset)
		<-r.done
	}
	return ehErr
}

// resetLUN sends LOGICAL UNIT RESET and ends every unanswered command to the LUN on every
// channel (the target aborted them all; their callers re-issue them). r/gen, when set, is the
// command that prompted it: nothing is sent if it is over by the time it is our turn.
func (s *Session) resetLUN(lun uint64, lunAddr srp.LUN, prefer *channel, r *request, gen uint32) error {
	s.ehMu.Lock()
	defer s.ehMu.Unlock()
	if r != nil {
		c := r.ch
		c.mu.Lock()
		over := r.gen != gen || r.out != outNone
		c.mu.Unlock()
		if over {
			return nil
		}
	}
	c := prefer
	if c == nil || !c.live() {
		c = nil
		for _, x := range s.chans {
			if x.live() {
				c = x
				break
			}
		}
		if c == nil {
			return &TaskMgmtError{Func: srp.TMLUNReset, LUN: lun, Err: errChannelDown}
		}
	}
	s.stats.lunResets.Add(1)
	if err := c.taskMgmt(srp.TMLUNReset, lun, lunAddr, ^uint64(0)); err != nil {
		return err
	}
	n := 0
	for _, x := range s.chans {
		n += x.forceFinishLUN(lun, outReset)
	}
	s.log.Info("logical unit reset", zap.Uint64("lun", lun), zap.Int("commands_ended", n))
	return nil
}

// taskMgmt sends a task management function on the channel and waits for its response.
func (c *channel) taskMgmt(fn srp.TaskMgmtFunc, lun uint64, lunAddr srp.LUN, taskTag uint64) error {
	c.tmMu.Lock()
	defer c.tmMu.Unlock()
	timeout := time.NewTimer(c.s.cfg.TaskMgmtTimeout)
	defer timeout.Stop()
	fail := func(err error, to bool) error {
		return &TaskMgmtError{Func: fn, LUN: lun, Timeout: to, Err: err}
	}
	for {
		if !c.lockLive() {
			return fail(errChannelDown, false)
		}
		if c.reqLim > 0 { // TM may use the reserved credit
			break
		}
		w := c.creditWaitLocked()
		c.unlockPost()
		select {
		case <-w:
		case <-timeout.C:
			return fail(errors.New("no credit for task management"), true)
		}
	}
	c.reqLim--
	c.tm.seq++
	seq := c.tm.seq
	tag := makeTag(true, seq, c.idx, 0xffff)
	c.tm.tag, c.tm.waiting, c.tm.got, c.tm.err = tag, true, false, nil
	select {
	case <-c.tm.done:
	default:
	}
	c.mu.Unlock()
	off := c.tmBufs[int(seq)%nTMBufs]
	buf := c.iuMem.Bytes()[off : off+srp.TskMgmtLen]
	n, err := srp.TskMgmt(buf).Encode(&srp.TskMgmtFields{Tag: tagBytes(tag), LUN: lunAddr, Func: fn, TaskTag: tagBytes(taskTag)})
	if err == nil {
		sge := [1]transport.SGE{{Addr: c.iuMem.Addr() + uint64(off), Length: uint32(n), LKey: c.iuMR.LKey()}}
		wr := [1]transport.SendWR{{ID: cqpoll.WRID(kindTM, seq&0xffff), Opcode: transport.WRSend, SGL: sge[:]}}
		err = c.pool.Post(&frpool.Chain{WRs: wr[:]})
	}
	c.postMu.RUnlock()
	if err != nil {
		c.mu.Lock()
		c.tm.waiting = false
		c.reqLim++
		c.mu.Unlock()
		return fail(err, false)
	}
	c.s.stats.taskMgmt.Add(1)
	select {
	case <-c.tm.done:
	case <-timeout.C:
		c.mu.Lock()
		c.tm.waiting = false
		c.mu.Unlock()
		return fail(nil, true)
	}
	c.mu.Lock()
	got, resp, terr := c.tm.got, c.tm.resp, c.tm.err
	c.mu.Unlock()
	switch {
	case terr != nil:
		return fail(terr, false)
	case !got:
		return fail(errors.New("response without task management response code"), false)
	case resp != srp.TMSuccess:
		return &TaskMgmtError{Func: fn, LUN: lun, Response: resp}
	}
	return nil
}

// forceFinish ends r (inflight, no answer yet) with out: its registrations are invalidated by
// the channel goroutine and its caller is woken when they are released. It reports whether r was
// still unanswered.
func (c *channel) forceFinish(r *request, gen uint32, out outcome) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.state != reqInflight || r.gen != gen || r.out != outNone {
		return false
	}
	r.out = out
	c.queueInvLocked(r)
	c.finishLocked(r)
	return true
}

// forceFinishLUN ends every unanswered command to lun with out (after a LOGICAL UNIT RESET).
func (c *channel) forceFinishLUN(lun uint64, out outcome) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for i := range c.reqs {
		r := &c.reqs[i]
		if r.state == reqInflight && r.out == outNone && r.spec.lun == lun {
			r.out = out
			c.queueInvLocked(r)
			c.finishLocked(r)
			n++
		}
	}
	return n
}

// requestReset asks the channel goroutine to tear the connection down and reconnect.
func (c *channel) requestReset(cause error) {
	c.mu.Lock()
	if c.ehReset == nil {
		c.ehReset = cause
	}
	c.mu.Unlock()
	c.wake()
}
