package initiator

// The request table, after ib_srp.c's ch->req_ring and blk-mq's unique tags: the slots, their
// tags, when a command is over and when its slot and buffers are free again.

import (
	"context"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"time"

	"github.com/srpd/srpd/frpool"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// Tags. The 8-byte SRP tag of a command is the big-endian u64
//
//	bit 63     0 (1 for task management)
//	bits 62-32 generation of the request slot (incremented on every use)
//	bits 31-16 channel index
//	bits 15-0  slot index
//
// so that, like blk_mq_unique_tag, the channel and slot are found from the tag alone, and a late
// response for an earlier use of the slot (after an abort, or a channel reset) is recognised as
// stale by its generation. A task management tag has bit 63 set and a per-channel sequence
// number in place of the generation.
const (
	tagTM      = uint64(1) << 63
	tagGenMask = uint64(1)<<31 - 1
)

func makeTag(tm bool, gen uint32, ch, slot int) uint64 {
	t := (uint64(gen)&tagGenMask)<<32 | uint64(ch&0xffff)<<16 | uint64(slot&0xffff)
	if tm {
		t |= tagTM
	}
	return t
}

func tagBytes(t uint64) (b srp.Tag) {
	binary.BigEndian.PutUint64(b[:], t)
	return b
}

// dataDir is the direction of a command's data transfer.
type dataDir uint8

const (
	dirNone dataDir = iota
	dirIn           // data-in: target to initiator (READ)
	dirOut          // data-out: initiator to target (WRITE)
)

// outcome says how a request ended.
type outcome uint8

const (
	outNone    outcome = iota
	outRsp             // the target answered with SRP_RSP (status valid)
	outFailed          // the channel failed (or the post failed) before an answer: re-issue
	outAborted         // ABORT TASK succeeded: no answer will come
	outReset           // a LOGICAL UNIT RESET (or a channel reset by error handling) ended it: re-issue
)

// reqState is the life of a request slot.
type reqState uint8

const (
	reqIdle     reqState = iota // in the channel's free list, or held by a caller not yet started
	reqInflight                 // started: outcome pending or known, maybe buffers not released
)

// cmdSpec describes one SCSI command as the block layer wants it sent.
type cmdSpec struct {
	op      string // for errors: "READ(16)", ...
	lun     uint64
	lunAddr srp.LUN
	cdb     [16]byte // the scsi package's encoders append to cdb[:0]: no allocation per command
	cdbLen  int
	dir     dataDir
	n       int    // data bytes
	buf     []byte // caller's data: destination (in) or source (out); nil + zero for zeroes
	zero    bool   // data-out is n zero bytes
	addr    uint64 // device address of buf when it lies in a Buffer (mapped directly), else 0
	lba     uint64 // for errors
}

// request is one slot of a channel's request table: its IU buffer, its registered data buffer,
// its MR handles and the state of the command it carries. Everything is preallocated; nothing
// in the hot path allocates.
type request struct {
	ch  *channel
	idx int

	iu     []byte // tx IU buffer (max IT IU length of the connection)
	iuAddr uint64
	data   []byte // data buffer (Config.MaxIOSize), registered per command through the MR pool
	dAddr  uint64

	spec cmdSpec

	// Hot-path scratch.
	cmdf  srp.CmdFields
	descs []byte              // direct descriptors of an indirect data buffer (16 × max regs)
	regs  []*frpool.Reg       // MR handles of the command (ours until given back)
	rel   []bool              // regs[i] released by the pool (its buffer is ours again)
	given []bool              // regs[i] given back to the pool (Invalidate)
	nregs int                 // handles taken for the command
	segs  [1]frpool.Seg       //
	wr    [1]transport.SendWR //
	sge   [1]transport.SGE    //
	chain frpool.Chain        //
	// Config.CommandTimeout: deadline is when the command times out, in Session.now's
	// clock (0: not armed); the session's watchdog swaps it to 0 and then gives expired its
	// token. A timer per command would cost a wake-up of the runtime's poller per command.
	deadline atomic.Int64
	expired  chan struct{}

	// Asynchronous commands (LUN.ReadAtAsync/WriteAtAsync), set before the post: the job,
	// its caller's context and completion function. claimed says the deadline was already
	// taken from the watchdog (await must not wait for its token); slow that the synchronous
	// error handling has been started on a goroutine (once).
	async   bool
	aJob    job
	aCtx    context.Context
	aDone   func(error)
	claimed bool
	slow    atomic.Bool

	// Completion state, guarded by ch.mu.
	state     reqState
	tag       uint64
	gen       uint32
	pending   int // registrations not yet released by the MR pool
	ungiven   int // handles not yet given back to the MR pool
	invQueued bool
	out       outcome
	signaled  bool
	callerOff bool          // the caller has consumed the outcome: the slot is the channel's to free
	done      chan struct{} // receives one token per started command once it is over
	started   time.Time

	// Response, valid when out == outRsp.
	status   uint8
	rspFlags srp.RspFlags
	diResid  uint32
	doResid  uint32
	senseLen int
	sense    [scsi.MaxSenseLen]byte
	imm      bool // sent with immediate data
	// direct: the command's registrations map the caller's buffer (spec.addr), not data: it
	// is over only once they are dead (finishLocked). Set by post, guarded by ch.mu.
	direct bool
}

// acquire takes a free request slot on a connected channel, round robin; while no channel is
// connected it waits (I/O held) until one is, fast_io_fail_tmo or dev_loss_tmo expire, or ctx
// ends.
func (s *Session) acquire(ctx context.Context) (*request, error) {
	n := len(s.chans)
	for {
		if r := s.tryAcquire(); r != nil {
			return r, nil
		}
		s.mu.Lock()
		st, changed, term := s.state, s.changed, s.termErr
		s.mu.Unlock()
		switch st {
		case StateLost, StateClosed:
			return nil, term
		case StateFailFast:
			return nil, ErrFastFail
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var free chan *request
		start := int(s.rr.Load())
		for i := 0; i < n; i++ {
			if c := s.chans[(start+i)%n]; c.live() {
				free = c.free
				break
			}
		}
		select {
		case r := <-free:
			return r, nil
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// tryAcquire is acquire without waiting.
func (s *Session) tryAcquire() *request {
	n := len(s.chans)
	start := int(s.rr.Add(1))
	for i := 0; i < n; i++ {
		c := s.chans[(start+i)%n]
		if !c.live() {
			continue
		}
		select {
		case r := <-c.free:
			return r
		default:
		}
	}
	return nil
}

func (s *Session) releaseSlot(r *request) { r.ch.free <- r }

// BufferReleased implements frpool.BufferOwner: one of the request's registrations is dead
// (invalidated locally or remotely, or torn down after a QP error). The request completes when
// the last one is.
func (r *request) BufferReleased(reg *frpool.Reg, err error) {
	c := r.ch
	c.mu.Lock()
	for i := 0; i < r.nregs; i++ {
		if r.regs[i] == reg && !r.rel[i] {
			r.rel[i] = true
			r.pending--
			break
		}
	}
	c.finishLocked(r)
	c.mu.Unlock()
}

// finishLocked signals the request's caller once the command is over, and puts the slot back in
// the free list once the caller is done with it and every registration is dead.
//
// A command the target answered (SRP_RSP) is over at once: the data-in the target wrote is in
// the slot's buffer before its response (RC ordering), and the caller copies it out while the
// channel goroutine invalidates the registrations; this keeps the LOCAL_INV's round trip
// through the engine (and a wakeup of the channel goroutine for its completion) out of the
// command's latency. The slot and its registered buffer are reused only once every buffer is
// back and every MR handle has been given back to the pool, so the target can never reach a
// buffer that serves another command. A command ended otherwise (aborted, reset, the channel
// failed) is over only then, as its registrations may still be live on the device; so is a
// direct command (its registrations map the caller's Buffer, which goes back to the caller
// when the command is over).
func (c *channel) finishLocked(r *request) {
	if r.state != reqInflight || r.out == outNone {
		return
	}
	released := r.pending == 0 && r.ungiven == 0
	if !r.signaled && (released || (r.out == outRsp && !r.direct)) {
		r.signaled = true
		c.inflight--
		if c.inflight == 0 && c.reqLim <= 1 {
			// Nothing in flight will return credits now: a caller waiting for one must look
			// again and probe (startCmd).
			c.wakeCreditLocked()
		}
		select {
		case r.done <- struct{}{}:
		default:
		}
		if r.async {
			if r.out == outRsp {
				// Answered: finished by the completion batch that got the response
				// (channel.runAsync), without a goroutine when the answer is GOOD.
				c.asyncQ = append(c.asyncQ, r)
			} else {
				c.s.asyncSlow(r) // aborted, reset, failed: the synchronous error handling
			}
		}
	}
	if released && r.callerOff {
		r.state = reqIdle
		r.callerOff = false
		c.free <- r // never blocks: the list has room for every slot
	}
}

// doneWith is the caller's end of a signaled request: the slot goes back to the free list now,
// or once its registrations are dead (finishLocked).
func (c *channel) doneWith(r *request) {
	c.mu.Lock()
	r.callerOff = true
	c.finishLocked(r)
	c.mu.Unlock()
}

// queueInvLocked asks the channel goroutine to give r's MR handles back (invalidating the
// registrations still valid).
func (c *channel) queueInvLocked(r *request) {
	if c.queueInvNoWakeLocked(r) {
		c.wake()
	}
}

// queueInvNoWakeLocked queues r's handles for the afterBatch that ends the completion batch
// being handled (by serve or onCQ), without waking the channel goroutine: a wake-up per
// response, found with nothing to do, was a goroutine handoff per I/O. It reports whether r
// was queued.
func (c *channel) queueInvNoWakeLocked(r *request) bool {
	if r.ungiven > 0 && !r.invQueued {
		r.invQueued = true
		c.invQ = append(c.invQ, r)
		return true
	}
	return false
}

// afterBatch gives back the MR handles of the requests that are over (answered, aborted or
// reset): one post carries the LOCAL_INVs of every registration still valid; handles whose
// registration is already dead (remotely invalidated) are only handed back.
func (c *channel) afterBatch() (directWait bool) {
	c.mu.Lock()
	if len(c.invQ) == 0 {
		c.mu.Unlock()
		return false
	}
	reqs := append(c.invWork[:0], c.invQ...)
	c.invQ = c.invQ[:0]
	live := c.invBatch[:0]
	// A request whose last handle goes back below may be finished by its other completion
	// and started again (beginLocked) while this loop still walks it: the generation taken
	// here tells the loop to stop touching it then, not to give back the new command's handles.
	gens := c.invGens[:0]
	for _, r := range reqs {
		gens = append(gens, r.gen)
		r.invQueued = false
		for i := 0; i < r.nregs; i++ {
			if !r.given[i] && !r.rel[i] {
				live = append(live, r.regs[i])
				directWait = directWait || r.direct
			}
		}
	}
	c.mu.Unlock()
	batchOK := false
	if len(live) > 0 {
		c.invChain.Inv = live
		batchOK = c.pool.Post(&c.invChain) == nil
		c.invChain.Inv = nil
	}
	for k, r := range reqs {
		retry := false
		for i := 0; ; i++ {
			c.mu.Lock()
			if r.gen != gens[k] || i >= r.nregs {
				c.mu.Unlock()
				break
			}
			given, rel, reg := r.given[i], r.rel[i], r.regs[i]
			c.mu.Unlock()
			if given {
				continue
			}
			if rel || !batchOK {
				// Already dead (only gives the handle back), or the batch was refused: one by
				// one. A QP error or a quarantine gives the handle back too (the pool releases
				// the buffer itself); a full send queue is retried after the next completions.
				if err := c.pool.Invalidate(reg); errors.Is(err, frpool.ErrSQFull) {
					retry = true
					continue
				}
			}
			c.mu.Lock()
			r.given[i] = true
			r.ungiven--
			c.mu.Unlock()
		}
		c.mu.Lock()
		if r.gen == gens[k] {
			if retry {
				c.queueInvLocked(r)
			}
			c.finishLocked(r)
		}
		c.mu.Unlock()
	}
	c.invGens = gens[:0]
	return directWait && batchOK
}

// giveBackRegs gives the pool every registration handle that in-flight requests still hold
// (after a QP error: the pool invalidates them, none of them is live on the wire any more).
func (c *channel) giveBackRegs() {
	var give []*frpool.Reg
	c.mu.Lock()
	for i := range c.reqs {
		r := &c.reqs[i]
		if r.state != reqInflight {
			continue
		}
		for j := 0; j < r.nregs; j++ {
			if !r.given[j] {
				give = append(give, r.regs[j])
				r.given[j] = true
				r.ungiven--
			}
		}
	}
	c.mu.Unlock()
	for _, reg := range give {
		_ = c.pool.Invalidate(reg)
	}
}
