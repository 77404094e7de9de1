package initiator

// Block requests as SCSI commands, in the place of the SCSI midlayer and sd (scsi_lib.c,
// sd.c): a READ/WRITE range split into commands, a window of them in flight, each retried as
// its outcome calls for; and the asynchronous path, which finishes a command its completion
// answered GOOD without a goroutine of its own.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/frpool"
	"github.com/srpd/srpd/internal/cbatch"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// maxWindow is how many commands of one block request are in flight at once.
const maxWindow = 8

// job is one block-layer request: a single command, or a READ/WRITE range split into commands
// that fit the channels and the LUN's maximum transfer length.
type job struct {
	lun     uint64
	lunAddr srp.LUN
	op      string
	// A single command (rw == false).
	spec cmdSpec
	xfer int // single command: bytes transferred (data-in)
	// A READ(16) / WRITE(16) range (rw == true).
	rw        bool
	write     bool
	fua       bool
	lba       uint64
	bs        int // block size
	maxBlocks int // LUN's maximum transfer length in blocks (0: none)
	total     int // bytes
	buf       []byte
	zero      bool // write zeroes (buf nil)
}

// chunk is a part of a job in flight or waiting to be (re-)issued.
type chunk struct {
	r        *request
	off, n   int // byte range within the job
	tries    int // re-issues after channel failures and resets
	uas      int // UNIT ATTENTION retries
	busy     int // BUSY / TASK SET FULL / NOT READY retries
	notAfter time.Time
	notBefr  time.Time
}

const (
	maxUARetries   = 16
	maxBusyRetries = 64
)

// run executes j: commands are issued up to maxWindow at a time and each is retried as its
// outcome calls for. The first hard error stops issuing; it is returned once the commands in
// flight are over.
func (s *Session) run(ctx context.Context, j *job) error {
	var win [maxWindow]chunk
	// Chunks to re-issue: at most the window's, plus one being issued in parts (a channel that
	// carries less than the chunk).
	var retry [2 * maxWindow]chunk
	head, count, nretry := 0, 0, 0
	total := 1
	if j.rw {
		total = j.total
	}
	next := 0
	var firstErr error
	for {
		// Issue: retries first, then new chunks.
		for firstErr == nil && count < maxWindow && (nretry > 0 || next < total) {
			if err := ctx.Err(); err != nil {
				firstErr = err
				break
			}
			var ck chunk
			fromRetry := nretry > 0
			if fromRetry {
				ck = retry[0]
				if wait := time.Until(ck.notBefr); wait > 0 {
					if count > 0 {
						break
					}
					if err := sleepCtx(ctx, wait); err != nil {
						firstErr = err
						break
					}
				}
			} else {
				ck = chunk{off: next, n: total - next}
			}
			var r *request
			if count == 0 {
				var err error
				if r, err = s.acquire(ctx); err != nil {
					firstErr = err
					break
				}
			} else if r = s.tryAcquire(); r == nil {
				break
			}
			n, err := s.fill(j, r.ch, &ck)
			if err != nil {
				s.releaseSlot(r)
				firstErr = err
				break
			}
			r.async, r.claimed = false, false
			posted, err := r.ch.start(ctx, r, &j.spec)
			if !posted {
				s.releaseSlot(r)
				if errors.Is(err, errChannelDown) {
					continue // pick another slot
				}
				if ctx.Err() != nil {
					firstErr = ctx.Err()
					break
				}
				if !transient(err) {
					firstErr = err
					break
				}
				// A transient shortage (MRs, send queue), or a channel about to go down: retry
				// shortly.
				if sleepCtx(ctx, time.Millisecond) != nil {
					firstErr = ctx.Err()
				}
				continue
			}
			if s.cfg.CommandTimeout > 0 {
				r.deadline.Store(int64(s.now() + s.cfg.CommandTimeout))
			}
			ck.r = r
			full := ck
			full.n = n
			win[(head+count)%maxWindow] = full
			count++
			if fromRetry {
				if n < ck.n { // the channel carries less: the rest stays queued
					retry[0].off += n
					retry[0].n -= n
				} else {
					copy(retry[:], retry[1:nretry])
					nretry--
				}
			} else {
				next += n
			}
		}
		if count == 0 {
			return firstErr
		}
		ck := win[head]
		head = (head + 1) % maxWindow
		count--
		again, err := s.await(ctx, j, &ck)
		switch {
		case err != nil:
			if firstErr == nil {
				firstErr = err
			}
		case again:
			if firstErr == nil {
				ck.r = nil
				retry[nretry] = ck
				nretry++
				s.stats.retries.Add(1)
			}
		}
	}
}

// fill prepares j.spec for the next command of chunk ck on channel c and returns its byte count.
func (s *Session) fill(j *job, c *channel, ck *chunk) (int, error) {
	if !j.rw {
		if j.spec.n > c.capacity() {
			return 0, fmt.Errorf("initiator: %s: %d bytes exceed the channel's %d", j.op, j.spec.n, c.capacity())
		}
		return 1, nil
	}
	n := min(ck.n, c.capacity())
	if j.maxBlocks > 0 {
		n = min(n, j.maxBlocks*j.bs)
	}
	n -= n % j.bs
	if n <= 0 {
		return 0, fmt.Errorf("initiator: %s: no room for one block", j.op)
	}
	sp := &j.spec
	lba := j.lba + uint64(ck.off/j.bs)
	*sp = cmdSpec{op: j.op, lun: j.lun, lunAddr: j.lunAddr, n: n, lba: lba}
	blocks := uint32(n / j.bs)
	if j.write {
		sp.cdbLen = len(scsi.AppendWrite16(sp.cdb[:0], lba, blocks, j.fua))
		sp.dir = dirOut
		if j.zero {
			sp.zero = true
		} else {
			sp.buf = j.buf[ck.off : ck.off+n]
		}
	} else {
		sp.cdbLen = len(scsi.AppendRead16(sp.cdb[:0], lba, blocks, false))
		sp.dir = dirIn
		sp.buf = j.buf[ck.off : ck.off+n]
	}
	return n, nil
}

// await waits for the command of ck (aborting it if it times out), consumes its outcome and gives
// the slot back. again asks for the chunk to be issued again.
func (s *Session) await(ctx context.Context, j *job, ck *chunk) (again bool, err error) {
	r := ck.r
	c := r.ch
	timedOut, fired := false, false
	var cause error
	select {
	case <-r.done:
	case <-ctx.Done():
		timedOut, cause = true, ctx.Err()
	case <-r.expired:
		timedOut, fired = true, true
	}
	if s.cfg.CommandTimeout > 0 && !r.claimed && r.deadline.Swap(0) == 0 && !fired {
		<-r.expired // the watchdog disarmed it first: take the token it is giving
	}
	var ehErr error
	if timedOut {
		ehErr = s.abortCmd(r)
	}
	c.mu.Lock()
	out, status, flags := r.out, r.status, r.rspFlags
	diResid, doResid, imm, lba := r.diResid, r.doResid, r.imm, r.spec.lba
	var sense []byte
	if out == outRsp && status != 0 {
		sense = append([]byte(nil), r.sense[:r.senseLen]...)
	}
	c.mu.Unlock()

	n := ck.n
	if out == outRsp && status == 0 {
		// GOOD: move data-in to the caller before the slot goes back (it goes back only once
		// its registrations are dead: finishLocked).
		if j.rw {
			if !j.write && !r.direct { // a direct command's data-in is in j.buf already
				copy(j.buf[ck.off:ck.off+n], r.data[:n])
			}
		} else if j.spec.dir == dirIn {
			got := dataInLen(j.spec.n, flags, diResid)
			copy(j.spec.buf[:got], r.data[:got])
			j.xfer = got
		}
	}
	c.doneWith(r)

	if timedOut && out != outRsp {
		s.stats.timeouts.Add(1)
		// The caller's context ended: give up. Config.CommandTimeout alone: error handling has
		// made sure the command is over; re-issue it, as the SCSI midlayer does after EH.
		if cause != nil || ck.tries >= s.cfg.MaxRetries {
			return false, &timeoutError{op: j.op, cause: cause, eh: ehErr}
		}
		out = outFailed
	}
	switch out {
	case outFailed, outReset, outAborted:
		ck.tries++
		if ck.tries > s.cfg.MaxRetries {
			return false, fmt.Errorf("initiator: %s to LUN %d: %w", j.op, j.lun, ErrTransport)
		}
		return true, nil
	}
	s.stats.commands.Add(1)
	if imm {
		s.stats.imm.Add(1)
	}
	if status == 0 {
		if j.rw {
			if shortTransfer(flags, diResid, doResid) {
				return false, fmt.Errorf("initiator: %s to LUN %d at LBA %d: %w", j.op, j.lun, lba, ErrShortTransfer)
			}
			s.stats.countRW(j.write, n)
		}
		return false, nil
	}
	return s.classify(j, ck, status, sense, lba)
}

// dataInLen is how much of n bytes of data-in a GOOD response says arrived: n less an underflow
// residual, never below 0 nor above n whatever the residual (an overflow residual moves
// nothing beyond the buffer).
func dataInLen(n int, flags srp.RspFlags, diResid uint32) int {
	if flags&srp.DIUnder == 0 {
		return n
	}
	if uint64(diResid) >= uint64(n) {
		return 0
	}
	return n - int(diResid)
}

// shortTransfer reports whether a GOOD response to a READ(16)/WRITE(16) moved less than asked
// (an underflow residual).
func shortTransfer(flags srp.RspFlags, diResid, doResid uint32) bool {
	return (flags&srp.DIUnder != 0 && diResid > 0) || (flags&srp.DOUnder != 0 && doResid > 0)
}

// classify decides what a status other than GOOD means for the chunk: retry (UNIT ATTENTION,
// BUSY, TASK SET FULL, becoming ready, ABORTED COMMAND, TASK ABORTED, within limits) or fail
// with a *SCSIError.
func (s *Session) classify(j *job, ck *chunk, status uint8, sense []byte, lba uint64) (bool, error) {
	st := scsi.Status(status)
	e := &SCSIError{Op: j.op, LUN: j.lun, LBA: lba, Status: st, RawSense: sense}
	switch st {
	case scsi.StatusCheckCondition:
		sn, err := scsi.ParseSense(sense)
		if err != nil {
			return false, e
		}
		e.Sense = sn
		switch sn.Key {
		case scsi.UnitAttention:
			s.stats.uas.Add(1)
			if rescanUA(&sn) {
				s.requestRescan()
			}
			ck.uas++
			if ck.uas <= maxUARetries {
				s.log.Debug("unit attention", zap.Uint64("lun", j.lun), zap.Stringer("sense", sn))
				return true, nil
			}
		case scsi.NotReady:
			// LOGICAL UNIT IS IN PROCESS OF BECOMING READY / operation in progress.
			if sn.ASC == 0x04 && (sn.ASCQ == 0x01 || sn.ASCQ == 0x07 || sn.ASCQ == 0x09) {
				ck.busy++
				if ck.busy <= maxBusyRetries {
					ck.notBefr = time.Now().Add(100 * time.Millisecond)
					return true, nil
				}
			}
		case scsi.AbortedCommand:
			ck.tries++
			if ck.tries <= s.cfg.MaxRetries {
				return true, nil
			}
		}
	case scsi.StatusBusy, scsi.StatusTaskSetFull:
		ck.busy++
		if ck.busy <= maxBusyRetries {
			ck.notBefr = time.Now().Add(min(time.Duration(ck.busy)*time.Millisecond, 100*time.Millisecond))
			return true, nil
		}
	case scsi.StatusTaskAborted:
		ck.tries++
		if ck.tries <= s.cfg.MaxRetries {
			return true, nil
		}
	}
	return false, e
}

// transient tells the post failures worth retrying: the MR pool or the send queue is full for
// now, or the QP is failing (the channel goes down and the command moves elsewhere).
func transient(err error) bool {
	return errors.Is(err, frpool.ErrExhausted) || errors.Is(err, frpool.ErrSQFull) ||
		errors.Is(err, frpool.ErrKeySpace) || errors.Is(err, frpool.ErrQuarantined) ||
		errors.Is(err, frpool.ErrQPError) || errors.Is(err, transport.ErrSQFull) ||
		errors.Is(err, transport.ErrQPState) || errors.Is(err, transport.ErrClosed)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// submitAsync starts j as one command without blocking, if a request slot and a credit are
// free at once and the whole range fits one command; false leaves j to the caller.
func (s *Session) submitAsync(ctx context.Context, j *job, done func(error)) bool {
	if s.cfg.CommandTimeout <= 0 {
		// A posted command observes its context only where its error handling runs, which the
		// command timeout starts; without one, a command the target never answers would keep
		// its caller (an NBD connection shutting down) forever. The synchronous path waits on
		// the context.
		return false
	}
	r := s.tryAcquire()
	if r == nil {
		return false
	}
	ck := chunk{off: 0, n: j.total}
	n, err := s.fill(j, r.ch, &ck)
	if err != nil || n != j.total {
		s.releaseSlot(r)
		return false
	}
	// p in a Buffer: the command maps it directly (only here: the synchronous path, which
	// error handling re-runs, always copies through the slot's buffer).
	j.spec.addr = s.bufs.deviceAddr(j.spec.buf, pageSize)
	r.async, r.aJob, r.aCtx, r.aDone, r.claimed = true, *j, ctx, done, false
	r.slow.Store(false)
	// Armed before the post: the answer may be handled (asyncAnswered claims the deadline)
	// before startCmd returns.
	if s.cfg.CommandTimeout > 0 {
		r.deadline.Store(int64(s.now() + s.cfg.CommandTimeout))
	}
	posted, _ := r.ch.startCmd(ctx, r, &j.spec, false)
	if !posted {
		r.deadline.Store(0) // nothing was posted: the watchdog cannot have fired in between
		r.async, r.aJob, r.aCtx, r.aDone = false, job{}, nil, nil
		s.releaseSlot(r)
		return false
	}
	return true
}

// asyncAnswered finishes an asynchronous command the target answered (called after the
// completion batch, c.mu not held): GOOD with the whole transfer completes it here, anything
// else goes to the synchronous error handling.
func (s *Session) asyncAnswered(r *request) {
	if s.cfg.CommandTimeout > 0 {
		if r.deadline.Swap(0) == 0 {
			return // the watchdog timed it out first and started the error handling
		}
		r.claimed = true
	}
	c := r.ch
	c.mu.Lock()
	out, status, flags, diResid, doResid, imm := r.out, r.status, r.rspFlags, r.diResid, r.doResid, r.imm
	c.mu.Unlock()
	if out != outRsp || status != 0 || shortTransfer(flags, diResid, doResid) {
		s.asyncSlow(r)
		return
	}
	j, done := &r.aJob, r.aDone
	b := cbatch.From(r.aCtx) // read while r is ours (claimed, not given back)
	if !j.write && !r.direct {
		copy(j.buf[:j.total], r.data[:j.total])
	}
	<-r.done // given by finishLocked before it queued r
	s.stats.commands.Add(1)
	s.stats.countRW(j.write, j.total)
	if imm {
		s.stats.imm.Add(1)
	}
	if r.direct {
		s.stats.direct.Add(1)
	}
	r.async, r.aJob, r.aCtx, r.aDone = false, job{}, nil, nil
	c.doneWith(r)
	if b != nil {
		c.openBatch(b)
	}
	done(nil)
}

// asyncSlow runs the synchronous path (await: abort, retries, sense) for an asynchronous
// command on a goroutine of its own, once, whoever asks first (its completion, the watchdog,
// a reset or teardown that ended it).
func (s *Session) asyncSlow(r *request) {
	if !r.slow.CompareAndSwap(false, true) {
		return
	}
	ctx, j, done := r.aCtx, r.aJob, r.aDone
	go func() {
		ck := chunk{r: r, off: 0, n: j.total}
		again, err := s.await(ctx, &j, &ck) // gives the slot back
		if err == nil && again {
			err = s.run(ctx, &j)
		}
		done(err)
	}()
}
