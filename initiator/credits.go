package initiator

// Credits: the target's request limit, kept as ib_srp keeps ch->req_lim (__srp_get_tx_iu,
// srp_process_rsp, srp_process_cred_req): a command needs more than one credit, the last is
// reserved for task management, and a channel starved of the credits a target holds back
// spends the reserved one on a probe that brings them back.

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/srp"
)

// wakeCreditLocked wakes goroutines waiting for credits (or for the channel to go down).
func (c *channel) wakeCreditLocked() {
	if c.creditCh != nil {
		close(c.creditCh)
		c.creditCh = nil
	}
}

func (c *channel) creditWaitLocked() <-chan struct{} {
	if c.creditCh == nil {
		c.creditCh = make(chan struct{})
	}
	return c.creditCh
}

func (c *channel) addCredits(d int32) {
	c.mu.Lock()
	c.addCreditsLocked(d)
	c.mu.Unlock()
}

// maxReqLim is the most credits the channel keeps: one per request slot and the one reserved
// for task management. More could never be used, and a target's REQUEST LIMIT DELTA (a signed
// 32-bit number, added as ib_srp adds it) must not overflow the count: 2^31-1 credits and one
// more used to wrap it negative and starve the channel for good.
func (c *channel) maxReqLim() int32 { return int32(len(c.reqs)) + 1 }

// addCreditsLocked adds a REQUEST LIMIT DELTA, keeping the credits within [0, maxReqLim]:
// below zero there is nothing to send with either way, and what the target grants beyond what
// we can use is never needed (keeping fewer than granted never exceeds the target's limit).
func (c *channel) addCreditsLocked(d int32) {
	c.reqLim = clampCredits(int64(c.reqLim)+int64(d), c.maxReqLim())
	if d > 0 {
		c.wakeCreditLocked()
	}
}

func clampCredits(v int64, hi int32) int32 { return int32(min(max(v, 0), int64(hi))) }

// errNoCredit: startCmd without waiting found no credit.
var errNoCredit = errors.New("initiator: no credit")

// lockLive takes the locks that posting needs, postMu (read) and mu, and keeps them if the
// channel is live; otherwise it releases both and returns false.
func (c *channel) lockLive() bool {
	c.postMu.RLock()
	c.mu.Lock()
	if c.getState() != chLive {
		c.unlockPost()
		return false
	}
	return true
}

// unlockPost releases what lockLive took.
func (c *channel) unlockPost() {
	c.mu.Unlock()
	c.postMu.RUnlock()
}

// waitCmdCredit waits until the channel has a credit for a command: commands need req_lim > 1,
// the last credit is reserved for task management. It returns with postMu (read) and mu held
// and the credit still counted (beginLocked spends it), or with neither held and why not:
// errChannelDown, ctx's error, or errNoCredit when told not to wait.
func (c *channel) waitCmdCredit(ctx context.Context, wait bool) (err error) {
	for {
		if !c.lockLive() {
			return errChannelDown
		}
		if c.reqLim > 1 {
			break
		}
		var embargo time.Duration
		if c.reqLim == 1 && c.inflight == 0 && !c.probing {
			// Starved: nothing in flight will bring credits back (a target that returns
			// those of aborted commands only with later responses, §8.5). Spend the reserved
			// credit on a harmless task management function to collect them; at most once a
			// second while probes gain nothing.
			if since := time.Since(c.lastProbe); c.probeGained || since > time.Second {
				c.probing = true
				go c.creditProbe()
			} else {
				embargo = time.Second - since
			}
		}
		if !wait {
			c.unlockPost()
			return errNoCredit
		}
		w := c.creditWaitLocked()
		c.unlockPost()
		c.s.stats.creditWaits.Add(1)
		var recheck *time.Timer
		var rc <-chan time.Time
		if embargo > 0 {
			// Nothing may ever close w (a probe whose credits others took at once): look
			// again when the next probe is allowed.
			recheck = time.NewTimer(embargo + time.Millisecond)
			rc = recheck.C
		}
		select {
		case <-w:
		case <-rc:
		case <-ctx.Done():
			err = ctx.Err()
		}
		if recheck != nil {
			recheck.Stop()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// creditProbe sends ABORT TASK for a tag never used, only for the credits its response carries.
func (c *channel) creditProbe() {
	err := c.taskMgmt(srp.TMAbortTask, 0, srp.LUN{}, makeTag(false, 0, c.idx, 0xfffe))
	var tme *TaskMgmtError
	if err != nil && !(errors.As(err, &tme) && tme.Err == nil && !tme.Timeout) {
		c.log.Debug("credit probe", zap.Error(err))
	}
	c.mu.Lock()
	c.probing = false
	c.lastProbe = time.Now()
	c.probeGained = c.reqLim > 1 // otherwise at most one probe a second
	// Callers that found the channel starved while this probe ran wait for credits: let them
	// look again (the probe may have gained nothing, or others took what it gained).
	c.wakeCreditLocked()
	c.mu.Unlock()
}
