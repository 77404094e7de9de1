package frpool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/srpd/srpd/transport"
)

// Config sizes and wires a pool. One pool serves exactly one QP: MRs are never used on another
// QP (ordering between send queues is undefined, so the reuse rule below would not hold).
type Config struct {
	// Attr are the device limits (Device.Attr()). PageSize, MaxMRPages, MaxSGE and MaxMsgSize are
	// used.
	Attr transport.DeviceAttr
	// PD is the QP's protection domain; the pool's MRs are allocated in it.
	PD transport.PD
	// QP is the queue pair whose send queue the pool posts on. The pool must be the only poster on
	// that send queue (the ULP posts through Post / PostRW): it keeps the sequence of every WR.
	QP transport.QP
	// MaxPages is the page-list capacity of each MR (≤ Attr.MaxMRPages).
	MaxPages int
	// NumMRs is the number of MRs, allocated at creation. The pool never grows.
	NumMRs int
	// Access granted by registrations; default LocalWrite|RemoteRead|RemoteWrite (as ib_srp).
	Access transport.Access
	// SQDepth is the number of send-queue slots the pool may use; 0 means QP.Query().Cap.MaxSendWR.
	// One slot is kept back for the sentinel.
	SQDepth int
	// SignalInterval bounds the number of consecutive unsignaled WRs: when a post would leave more
	// than this many WRs without a later signaled one, its last WR is signaled (and the extra
	// completion swallowed). 0 means (SQDepth-1)/2.
	SignalInterval int
	// BatchInvalidates posts LOCAL_INVs unsignaled and leaves their confirmation to the next
	// signaled completion; the ULP then calls Flush after each batch of work (typically after
	// draining its CQ) so that a sentinel is posted if nothing else would retire them. When false
	// (default) the last LOCAL_INV of every post is signaled.
	BatchInvalidates bool
	// MaxRdAtomic caps the RDMA READ work requests an RW context has outstanding (the QP's
	// max_rd_atomic, and the peer's responder resources); 0 means QP.Query().MaxRdAtomic at the
	// first RDMA READ, or 1 if that is 0.
	MaxRdAtomic int
	// PeerMaxMsg caps the bytes of one RDMA READ/WRITE work request (the peer's limit); 0 means
	// Attr.MaxMsgSize (and never more than 2^31).
	PeerMaxMsg uint64
	// Logger receives state transitions (QP error, recovery); nil means no logging.
	Logger *zap.Logger
}

// mrState is the per-MR state machine. Its String (mrstate_string.go) is each constant's line
// comment.
type mrState uint8

//go:generate go tool stringer -type=mrState -linecomment -output=mrstate_string.go

const (
	// free; the device has no key of ours in force
	mrFree mrState = iota // free
	// free for reuse on this QP; a LOCAL_INV is posted, unconfirmed
	mrInvalidating // invalidating
	// taken by Get; REG_MR not posted yet
	mrRegistering // registering
	// REG_MR posted
	mrValid // valid
	// device state unknown (QP error, key mismatch) until resolved
	mrQuarantined // quarantined
	// re-creation failed; retried by Recover
	mrDead // dead
)

// mrSlot is one MR of the pool and what the pool knows about it.
type mrSlot struct {
	mr      transport.MR
	index   uint32
	state   mrState
	keyByte uint8     // key byte of the last registration built (initially the MR's initial key)
	live    [4]uint64 // key bytes of registrations that may still be valid on the device
	dead    [4]uint64 // key bytes of dead registrations whose remote-invalidation report may still come
	cur     *Reg      // the registration in registering / valid state
	regs    *Reg      // registrations whose key is marked live (posted, invalidating)
	pendInv int       // registrations of this MR with a LOCAL_INV posted and unconfirmed
	inFIFO  bool
	quarSeq uint64 // quarantined: resolve once every WR before this sequence number is retired
	cause   error  // quarantined: why
}

func (s *mrSlot) isLive(b uint8) bool { return s.live[b>>6]&(1<<(b&63)) != 0 }
func (s *mrSlot) setLive(b uint8)     { s.live[b>>6] |= 1 << (b & 63) }
func (s *mrSlot) clearLive(b uint8)   { s.live[b>>6] &^= 1 << (b & 63) }
func (s *mrSlot) isDead(b uint8) bool { return s.dead[b>>6]&(1<<(b&63)) != 0 }
func (s *mrSlot) setDead(b uint8)     { s.dead[b>>6] |= 1 << (b & 63) }
func (s *mrSlot) clearDead(b uint8)   { s.dead[b>>6] &^= 1 << (b & 63) }

// nextKey picks the key of the next registration: the next key byte after the last one, mod 256,
// skipping bytes of registrations that may still be live. wrapped reports passing 255 → 0.
func (s *mrSlot) nextKey() (key uint32, wrapped, ok bool) {
	b := s.keyByte
	for i := 0; i < 256; i++ {
		b++
		if b == 0 {
			wrapped = true
		}
		if !s.isLive(b) {
			return s.index<<8 | uint32(b), wrapped, true
		}
	}
	return 0, false, false
}

func (s *mrSlot) unlinkReg(r *Reg) {
	for pp := &s.regs; *pp != nil; pp = &(*pp).nextSlot {
		if *pp == r {
			*pp = r.nextSlot
			r.nextSlot = nil
			return
		}
	}
}

// localMem is memory registered with AddLocalMemory (a regular MR, local access only).
type localMem struct {
	addr, end uint64
	lkey      uint32
	mr        transport.MR
}

// Stats is a snapshot of the pool's gauges and counters.
type Stats struct {
	MRs           int // MRs in the pool
	Free          int // free MRs (including ones whose LOCAL_INV is posted, reusable on this QP)
	InUse         int // MRs registering or valid
	Invalidating  int // registrations whose invalidation is posted but not confirmed (buffers held)
	Quarantined   int // MRs whose device state is unknown until resolved
	Dead          int // MRs lost because re-creation failed (Recover retries)
	SQOutstanding int // WRs posted and not known complete
	Waiting       int // Get calls waiting now

	Waits               uint64 // Get calls that had to wait
	KeyWraps            uint64 // key bytes that wrapped 255 → 0
	Registrations       uint64 // REG_MRs posted
	InvalidationsLocal  uint64 // LOCAL_INVs confirmed
	InvalidationsRemote uint64 // remote invalidations (SEND_WITH_INV) confirmed
	Sentinels           uint64 // sentinel WRs posted
	RWTransfers         uint64 // RW contexts completed
	Errors              uint64 // QP errors, key mismatches, failed recreations
}

type counters struct {
	waits, keyWraps, regs, invLocal, invRemote, sentinels, rw, errors uint64
}

// WCError is the error given to owners (and returned) when a completion reports a failure.
type WCError struct {
	Status transport.WCStatus
	Opcode transport.WCOpcode
	QPN    uint32
	Err    error // ErrQPError
}

func (e *WCError) Error() string {
	return fmt.Sprintf("%v: qp %#x %v completed with %v", e.Err, e.QPN, e.Opcode, e.Status)
}

func (e *WCError) Unwrap() error { return e.Err }

// Pool is a fast-registration MR pool for one QP. All methods are safe for concurrent use.
type Pool struct {
	mu      sync.Mutex
	log     *zap.Logger // baseLog with the QP's number (p.mu)
	baseLog *zap.Logger

	attr      transport.DeviceAttr
	pd        transport.PD
	qp        transport.QP
	access    transport.Access
	pageSize  uint64
	maxPages  int
	batchInv  bool
	sigEvery  int
	maxSGE    int
	maxWRLen  uint64
	rdAtomic  int
	cfgRdAtom int

	slots   []mrSlot
	byIndex map[uint32]*mrSlot
	fifo    []*mrSlot // ring of slots that Get may take (free or invalidating)
	fifoHd  int
	fifoN   int

	handles  []Reg
	freeRegs *Reg
	nFree    int // handles in freeRegs

	t        *sqTracker
	reserved int // slots reserved for later waves of posted RW contexts
	wrs      []transport.SendWR
	ents     []sqEntry
	lastInv  uint64 // one past the sequence number of the last LOCAL_INV posted
	epoch    uint64 // chain-duplicate marks

	qpErr   error // non-nil: QP in error (or reset) until Recover
	closed  bool
	nQuar   int
	nInval  int
	waiting int
	waitCh  chan struct{}

	notifyRegs *Reg
	notifyRW   *RWCtx

	local atomic.Pointer[[]localMem]

	c counters
}

// New creates a pool and allocates its MRs.
func New(cfg Config) (*Pool, error) {
	if cfg.PD == nil || cfg.QP == nil {
		return nil, fmt.Errorf("frpool: PD and QP are required: %w", transport.ErrInvalidArgument)
	}
	ps := uint64(cfg.Attr.PageSize)
	if ps == 0 {
		ps = 4096
	}
	if ps&(ps-1) != 0 {
		return nil, fmt.Errorf("frpool: page size %d: %w", ps, transport.ErrInvalidArgument)
	}
	if cfg.MaxPages <= 0 || (cfg.Attr.MaxMRPages > 0 && cfg.MaxPages > cfg.Attr.MaxMRPages) {
		return nil, fmt.Errorf("frpool: MaxPages %d (device max %d): %w", cfg.MaxPages, cfg.Attr.MaxMRPages, transport.ErrInvalidArgument)
	}
	if cfg.NumMRs <= 0 {
		return nil, fmt.Errorf("frpool: NumMRs %d: %w", cfg.NumMRs, transport.ErrInvalidArgument)
	}
	qattr := cfg.QP.Query()
	depth := cfg.SQDepth
	if depth == 0 {
		depth = qattr.Cap.MaxSendWR
	}
	if depth < 2 {
		return nil, fmt.Errorf("frpool: send queue depth %d (need ≥ 2): %w", depth, transport.ErrInvalidArgument)
	}
	access := cfg.Access
	if access == 0 {
		access = transport.AccessLocalWrite | transport.AccessRemoteRead | transport.AccessRemoteWrite
	}
	if err := access.Validate(); err != nil {
		return nil, fmt.Errorf("frpool: access %v: %w", access, err)
	}
	sig := cfg.SignalInterval
	if sig <= 0 || sig > depth-1 {
		sig = (depth - 1) / 2
	}
	if sig < 1 {
		sig = 1
	}
	maxSGE := cfg.Attr.MaxSGE
	if c := qattr.Cap.MaxSendSGE; c > 0 && (maxSGE == 0 || c < maxSGE) {
		maxSGE = c
	}
	if maxSGE <= 0 {
		maxSGE = 1
	}
	maxWR := uint64(1) << 31
	if m := cfg.Attr.MaxMsgSize; m > 0 && m < maxWR {
		maxWR = m
	}
	if m := cfg.PeerMaxMsg; m > 0 && m < maxWR {
		maxWR = m
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	p := &Pool{
		log:       log.With(zap.Uint32("qpn", cfg.QP.QPN())),
		baseLog:   log,
		attr:      cfg.Attr,
		pd:        cfg.PD,
		qp:        cfg.QP,
		access:    access,
		pageSize:  ps,
		maxPages:  cfg.MaxPages,
		batchInv:  cfg.BatchInvalidates,
		sigEvery:  sig,
		maxSGE:    maxSGE,
		maxWRLen:  maxWR,
		cfgRdAtom: cfg.MaxRdAtomic,
		slots:     make([]mrSlot, cfg.NumMRs),
		byIndex:   make(map[uint32]*mrSlot, cfg.NumMRs),
		fifo:      make([]*mrSlot, cfg.NumMRs),
		t:         newSQTracker(depth),
		wrs:       make([]transport.SendWR, depth),
		ents:      make([]sqEntry, depth),
	}
	for i := range p.slots {
		mr, err := cfg.PD.AllocFastRegMR(cfg.MaxPages)
		if err != nil {
			for j := 0; j < i; j++ {
				_ = p.slots[j].mr.Close()
			}
			return nil, fmt.Errorf("frpool: allocating MR %d of %d: %w", i+1, cfg.NumMRs, err)
		}
		s := &p.slots[i]
		s.mr = mr
		s.index = mr.Index()
		s.keyByte = uint8(mr.RKey())
		p.byIndex[s.index] = s
		p.pushFIFO(s)
	}
	// Handles: one per MR in use plus one per registration whose LOCAL_INV may be outstanding
	// (each holds a send-queue slot), so Get never waits for a handle while an MR is free.
	nh := cfg.NumMRs + depth
	p.handles = make([]Reg, nh)
	pages := make([]uint64, nh*cfg.MaxPages)
	for i := range p.handles {
		r := &p.handles[i]
		r.p = p
		r.pages = pages[i*cfg.MaxPages : (i+1)*cfg.MaxPages : (i+1)*cfg.MaxPages]
		r.nextFree = p.freeRegs
		p.freeRegs = r
	}
	p.nFree = nh
	empty := []localMem{}
	p.local.Store(&empty)
	return p, nil
}

// ---- free list of MRs ----

func (p *Pool) pushFIFO(s *mrSlot) {
	if s.inFIFO {
		return
	}
	s.inFIFO = true
	p.fifo[(p.fifoHd+p.fifoN)%len(p.fifo)] = s
	p.fifoN++
}

// popFIFO takes the oldest slot that is free or invalidating; slots that changed state while in
// the ring (quarantined) are dropped from it.
func (p *Pool) popFIFO() *mrSlot {
	for p.fifoN > 0 {
		s := p.fifo[p.fifoHd]
		p.fifo[p.fifoHd] = nil
		p.fifoHd = (p.fifoHd + 1) % len(p.fifo)
		p.fifoN--
		s.inFIFO = false
		if s.state == mrFree || s.state == mrInvalidating {
			return s
		}
	}
	return nil
}

// idleState is the state of a slot with no current registration.
func idleState(s *mrSlot) mrState {
	if s.pendInv > 0 {
		return mrInvalidating
	}
	return mrFree
}

// ---- waiting ----

func (p *Pool) wakeLocked() {
	if p.waitCh != nil {
		close(p.waitCh)
		p.waitCh = nil
	}
}

// ---- Get / Cancel ----

// Get takes a free MR (possibly one whose LOCAL_INV is posted but not yet confirmed: on the same
// send queue the new REG_MR executes after it) and prepares a registration mapping segs, with its
// key (RKey) picked; nothing is posted yet (the MR is "registering"). It waits, within ctx, while
// every MR is in use: exhaustion is backpressure, reported as an error wrapping ErrExhausted and
// ctx.Err(). It fails at once with ErrQPError while the QP is in error, ErrMapping if segs do not
// fit one MR, and ErrClosed after Close. The returned handle is posted with Register or Post, or
// given back unposted with Cancel.
func (p *Pool) Get(ctx context.Context, segs []Seg, owner BufferOwner) (*Reg, error) {
	return p.get(ctx, segs, owner, true)
}

// TryGet is Get without waiting: ErrExhausted if no MR is free now.
func (p *Pool) TryGet(segs []Seg, owner BufferOwner) (*Reg, error) {
	return p.get(nil, segs, owner, false)
}

func (p *Pool) get(ctx context.Context, segs []Seg, owner BufferOwner, block bool) (*Reg, error) {
	npages, length, err := mapSegs(segs, p.pageSize, p.maxPages)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	waited := false
	var s *mrSlot
	for {
		if p.closed {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		if p.qpErr != nil {
			err := p.qpErr
			p.mu.Unlock()
			return nil, err
		}
		if p.freeRegs != nil {
			if s = p.popFIFO(); s != nil {
				if _, _, ok := s.nextKey(); ok {
					break
				}
				// Every key byte of this MR may still be live (256 unconfirmed invalidations).
				p.pushFIFO(s)
				p.mu.Unlock()
				return nil, ErrKeySpace
			}
		}
		if !block {
			p.mu.Unlock()
			return nil, ErrExhausted
		}
		if !waited {
			waited = true
			p.c.waits++
		}
		if err := ctx.Err(); err != nil {
			p.mu.Unlock()
			return nil, fmt.Errorf("%w: %w", ErrExhausted, err)
		}
		if p.waitCh == nil {
			p.waitCh = make(chan struct{})
		}
		ch := p.waitCh
		p.waiting++
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		p.mu.Lock()
		p.waiting--
	}
	r := p.freeRegs
	p.freeRegs = r.nextFree
	r.nextFree = nil
	p.nFree--
	r.slot = s
	r.state = regMapped
	r.owner = owner
	r.key, r.wrap, _ = s.nextKey()
	r.err = nil
	r.given = false
	r.npages = npages
	r.length = length
	r.iova = segs[0].Addr
	s.cur = r
	s.state = mrRegistering
	p.mu.Unlock()
	fillPages(r.pages, segs, p.pageSize)
	return r, nil
}

// Cancel gives back a handle whose REG_MR was never posted (Get succeeded, then the ULP decided
// not to use it, or Post failed). The buffer was never exposed; no owner callback is made.
func (p *Pool) Cancel(r *Reg) error {
	p.mu.Lock()
	if r.p != p || r.state != regMapped {
		p.mu.Unlock()
		return ErrState
	}
	s := r.slot
	s.cur = nil
	if s.state == mrRegistering {
		s.state = idleState(s)
		p.pushFIFO(s)
	}
	p.recycleLocked(r)
	p.wakeLocked()
	p.mu.Unlock()
	return nil
}

func (p *Pool) recycleLocked(r *Reg) {
	r.gen++
	r.state = regIdle
	r.slot = nil
	r.owner = nil
	r.err = nil
	r.key = 0
	r.given = false
	r.nextSlot = nil
	r.nextNotify = nil
	r.nextFree = p.freeRegs
	p.freeRegs = r
	p.nFree++
}

// ---- posting ----

// Chain is one all-or-nothing post: the REG_MRs of Reg (handles from Get), then the ULP's WRs,
// then the LOCAL_INVs of Inv (handles posted earlier and still valid; posting their LOCAL_INV
// gives them back, as Invalidate does). Either all of it is posted and the pool state advanced,
// or nothing is and the pool state is unchanged (the key bytes included).
//
// Order matters and is fixed: REG_MRs come first so that the SEND carrying their rkeys executes
// after them (SQ order, IBA: work requests on one send queue are executed in order; rxe executes
// REG_MR inline when it reaches it, roce-wire §4.5). LOCAL_INVs come last so that they do not hold
// up the SEND (LOCAL_INV is fenced behind every earlier WR in rxe).
type Chain struct {
	Reg []*Reg
	WRs []transport.SendWR
	Inv []*Reg
}

// Register posts the REG_MR of r alone (unsignaled).
func (p *Pool) Register(r *Reg) error {
	regs := [1]*Reg{r}
	return p.Post(&Chain{Reg: regs[:]})
}

// Invalidate posts the LOCAL_INV of r with the key r was registered with. The MR becomes free for
// reuse on this QP at once (a later REG_MR on the same send queue executes after the LOCAL_INV);
// the buffer goes back to r's owner only when the invalidation is confirmed. With
// Config.BatchInvalidates the LOCAL_INV is unsignaled: call Flush after the batch.
//
// Invalidate also gives the handle back to the pool (see BufferOwner), whatever happened to the
// registration: if it is already dead (remotely invalidated, or torn down after a QP error) there
// is nothing to post and it returns nil; if it is being torn down (QP error, quarantined MR) it
// returns that error, and the owner callback will report the teardown. Only ErrSQFull and
// ErrClosed leave the handle with the ULP (retry later); ErrState means the handle was not the
// ULP's to give.
func (p *Pool) Invalidate(r *Reg) error {
	p.mu.Lock()
	var err error
	switch {
	case r == nil || r.p != p || r.given:
		err = ErrState
	case r.state == regReleasing:
		r.given = true // recycled when the callback returns
	case r.state == regReleased:
		r.given = true
		p.recycleLocked(r)
		p.wakeLocked()
	case r.state == regPosted && p.qpErr == nil && !p.closed &&
		r.slot.state != mrQuarantined && r.slot.state != mrDead:
		invs := [1]*Reg{r}
		err = p.postChainLocked(&Chain{Inv: invs[:]})
	case r.state == regPosted && !p.closed:
		r.given = true // torn down by the resolution of the quarantine
		if p.qpErr != nil {
			err = p.qpErr
		} else {
			err = slotErr(r.slot)
		}
	case p.closed:
		err = ErrClosed
	default:
		err = ErrState
	}
	p.mu.Unlock()
	return err
}

// Post posts c all-or-nothing (see Chain). Each ULP WR keeps its opcode, SGL, flags and ID as
// far as the ULP is concerned: the pool replaces the ID on the wire with its own (WRIDTag | sequence
// number) and gives the ULP's ID back in HandleSendCompletion. It may set SendSignaled on the last
// WR (SignalInterval); such extra completions are swallowed.
func (p *Pool) Post(c *Chain) error {
	p.mu.Lock()
	err := p.postChainLocked(c)
	p.mu.Unlock()
	return err
}

func (p *Pool) usableLocked() error {
	if p.closed {
		return ErrClosed
	}
	return p.qpErr
}

func (p *Pool) postChainLocked(c *Chain) error {
	if err := p.usableLocked(); err != nil {
		return err
	}
	n := len(c.Reg) + len(c.WRs) + len(c.Inv)
	if n == 0 {
		return nil
	}
	// Validate without changing anything.
	p.epoch++
	for _, r := range c.Reg {
		if r == nil || r.p != p || r.state != regMapped || r.mark == p.epoch {
			return ErrState
		}
		if r.slot.state != mrRegistering {
			return slotErr(r.slot)
		}
		r.mark = p.epoch
	}
	for _, r := range c.Inv {
		if r == nil || r.p != p || r.state != regPosted || r.given || r.mark == p.epoch {
			return ErrState
		}
		if r.slot.state == mrQuarantined || r.slot.state == mrDead {
			return slotErr(r.slot)
		}
		r.mark = p.epoch
	}
	if n > p.t.free()-1-p.reserved {
		return ErrSQFull
	}
	// Build into the preallocated scratch WRs; nothing of the pool changes before the post
	// succeeds (so a failed post leaves no wrong key behind: the concern of rdma_rw_update_lkey).
	i := 0
	for _, r := range c.Reg {
		// The key chosen at Get is still unused: only this handle can make a key of its MR live.
		// If the MR was re-created with another index meanwhile, the ULP must start over.
		if r.key>>8 != r.slot.index || r.slot.isLive(uint8(r.key)) {
			return fmt.Errorf("%w: MR re-created since Get", ErrQuarantined)
		}
		r.regWR(&p.wrs[i], WRIDTag|p.t.seqAt(i)&seqMask, r.key, p.access, uint32(p.pageSize))
		p.ents[i] = sqEntry{kind: kindReg, reg: r, gen: r.gen, op: transport.WRRegMR}
		i++
	}
	for _, wr := range c.WRs {
		p.wrs[i] = wr
		p.wrs[i].ID = WRIDTag | p.t.seqAt(i)&seqMask
		sig := wr.Flags&transport.SendSignaled != 0
		p.ents[i] = sqEntry{kind: kindULP, ulp: true, ulpID: wr.ID, op: wr.Opcode, signaled: sig, ulpWants: sig}
		i++
	}
	for _, r := range c.Inv {
		// SendFence: LOCAL_INV must not overtake RDMA READs still writing through this MR's key
		// (IBA fence semantics, 10.8.3.3 as cited by rxe); rxe fences LOCAL_INV behind every
		// earlier WR anyway (roce-wire §4.5), other engines may not.
		p.wrs[i] = transport.SendWR{
			ID:             WRIDTag | p.t.seqAt(i)&seqMask,
			Opcode:         transport.WRLocalInv,
			Flags:          transport.SendFence,
			InvalidateRKey: r.key,
		}
		p.ents[i] = sqEntry{kind: kindInv, reg: r, gen: r.gen, op: transport.WRLocalInv}
		i++
	}
	if len(c.Inv) > 0 && !p.batchInv {
		p.signalLocked(n - 1)
	}
	if err := p.postLocked(n); err != nil {
		return err
	}
	// Commit.
	for _, r := range c.Reg {
		key := r.key
		s := r.slot
		if r.wrap {
			p.c.keyWraps++
		}
		s.keyByte = uint8(key)
		s.setLive(uint8(key))
		s.clearDead(uint8(key))
		r.state = regPosted
		r.nextSlot = s.regs
		s.regs = r
		s.state = mrValid
		p.c.regs++
	}
	base := p.t.tail - uint64(n)
	for k, r := range c.Inv {
		s := r.slot
		r.state = regInvalidating
		r.given = true
		p.nInval++
		s.pendInv++
		s.cur = nil
		s.state = mrInvalidating
		p.lastInv = base + uint64(len(c.Reg)+len(c.WRs)+k) + 1
		p.pushFIFO(s)
	}
	if len(c.Inv) > 0 {
		p.wakeLocked()
	}
	return nil
}

func slotErr(s *mrSlot) error {
	if errors.Is(s.cause, ErrQPError) {
		return s.cause
	}
	return fmt.Errorf("%w: %w", ErrQuarantined, s.cause)
}

// signalLocked makes WR i of the post being built signaled.
func (p *Pool) signalLocked(i int) {
	p.wrs[i].Flags |= transport.SendSignaled
	p.ents[i].signaled = true
}

// postLocked applies the signal policy to p.wrs[:n] / p.ents[:n], posts them and, on success,
// records them in the tracker. On failure nothing is recorded.
func (p *Pool) postLocked(n int) error {
	last := -1
	for i := n - 1; i >= 0; i-- {
		if p.ents[i].signaled {
			last = i
			break
		}
	}
	unc := n - 1 - last
	if last < 0 {
		unc += p.t.uncovered()
	}
	if unc > p.sigEvery {
		p.signalLocked(n - 1)
	}
	if err := p.qp.PostSend(p.wrs[:n]); err != nil {
		for i := 0; i < n; i++ {
			p.wrs[i] = transport.SendWR{}
		}
		if errors.Is(err, transport.ErrSQFull) {
			return fmt.Errorf("%w: %w", ErrSQFull, err)
		}
		return err
	}
	for i := 0; i < n; i++ {
		p.t.push(p.ents[i])
		p.wrs[i] = transport.SendWR{} // drop references (page lists, SGLs)
	}
	return nil
}

// Flush posts a sentinel (a signaled zero-length RDMA WRITE, which needs no rkey and touches no
// memory) if a posted LOCAL_INV, or a quarantined MR waiting for the send queue to drain, would
// otherwise wait for a completion that nothing already posted will produce. It is cheap when
// there is nothing to do. The ULP calls it after each batch when Config.BatchInvalidates is set.
func (p *Pool) Flush() error {
	p.mu.Lock()
	err := p.flushLocked()
	p.mu.Unlock()
	return err
}

func (p *Pool) flushLocked() error {
	if p.closed || p.qpErr != nil {
		return nil
	}
	need := p.lastInv
	for i := range p.slots {
		if s := &p.slots[i]; s.state == mrQuarantined && s.quarSeq > need {
			need = s.quarSeq
		}
	}
	return p.coverLocked(need)
}

// Sync posts a sentinel if any WR posted so far would not be retired by a completion already
// due (an unsignaled tail), so that the send queue drains completely; for quiescing.
func (p *Pool) Sync() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.qpErr != nil {
		return nil
	}
	return p.coverLocked(p.t.tail)
}

// coverLocked posts a sentinel unless every WR before sequence number need is retired or covered
// by an outstanding signaled WR.
func (p *Pool) coverLocked(need uint64) error {
	if need <= p.t.head || need <= p.t.lastSig {
		return nil // already retired, or covered by a signaled WR that is outstanding
	}
	if p.t.free()-p.reserved < 1 {
		return ErrSQFull
	}
	p.wrs[0] = transport.SendWR{
		ID:     WRIDTag | p.t.seqAt(0)&seqMask,
		Opcode: transport.WRRDMAWrite,
		Flags:  transport.SendSignaled,
	}
	p.ents[0] = sqEntry{kind: kindSentinel, op: transport.WRRDMAWrite, signaled: true}
	if err := p.postLocked(1); err != nil {
		return err
	}
	p.c.sentinels++
	return nil
}

// ---- completions ----

// HandleSendCompletion must be called with every completion of the QP's send queue, in the order
// the CQ returned them (the ULP owns the polling loop). It retires the WRs the completion covers
// (it and every earlier WR of the send queue), confirms invalidations, advances RW contexts, and
// detects QP errors. If the completion belongs to a ULP work request the ULP asked to see
// (signaled) or that failed, it rewrites wc.ID to the ULP's ID and returns deliver = true; the
// ULP then handles wc as its own. Owner callbacks run before it returns, without locks held.
//
// Errors: ErrForeignWR (an ID without WRIDTag: something else posted on the send queue),
// ErrStaleCompletion (a completion from before Recover, harmless), ErrBadCompletion (out of
// order: a bug in the engine or a misrouted completion).
func (p *Pool) HandleSendCompletion(wc *transport.WC) (deliver bool, err error) {
	p.mu.Lock()
	deliver, err = p.sendCompletionLocked(wc)
	p.unlockAndNotify()
	return deliver, err
}

func (p *Pool) sendCompletionLocked(wc *transport.WC) (bool, error) {
	if wc.QPN != 0 && wc.QPN != p.qp.QPN() {
		return false, ErrStaleCompletion // from a QP replaced by Recover (CQs may be shared)
	}
	seq, err := p.t.resolve(wc.ID)
	if err != nil {
		return false, err
	}
	first, last, err := p.t.complete(seq, wc.Status)
	if err != nil {
		return false, err
	}
	if wc.Status != transport.WCSuccess {
		p.enterErrorLocked(&WCError{Status: wc.Status, Opcode: wc.Opcode, QPN: wc.QPN, Err: ErrQPError})
	}
	deliver := false
	var ulpID uint64
	for s := first; s <= last; s++ {
		e := p.t.entry(s)
		ok := s < last || wc.Status == transport.WCSuccess // executed successfully
		switch e.kind {
		case kindInv:
			if ok && e.reg.gen == e.gen && e.reg.state == regInvalidating {
				p.confirmLocked(e.reg, nil)
				p.c.invLocal++
			}
		case kindRW:
			rw := e.rw
			if rw.gen != e.gen {
				break
			}
			if !ok && rw.err == nil {
				rw.err = &WCError{Status: wc.Status, Opcode: wc.Opcode, QPN: wc.QPN, Err: ErrQPError}
			}
			if e.waveEnd {
				p.waveDoneLocked(rw)
			}
		}
		if s == last && e.ulp && (e.ulpWants || wc.Status != transport.WCSuccess) {
			deliver = true
			ulpID = e.ulpID
		}
	}
	p.t.retire(last)
	if deliver {
		wc.ID = ulpID
	}
	p.resolveDueLocked(false)
	return deliver, nil
}

// HandleRecvCompletion must be called with every receive completion of the QP (the ULP keeps
// processing it as its own afterwards). A successful completion with WCWithInvalidate confirms the
// remote invalidation of wc.InvalidatedRKey; a failed one means the QP is in error.
func (p *Pool) HandleRecvCompletion(wc *transport.WC) error {
	p.mu.Lock()
	var err error
	switch {
	case wc.QPN != 0 && wc.QPN != p.qp.QPN():
		err = ErrStaleCompletion // from a QP replaced by Recover
	case wc.Status != transport.WCSuccess:
		p.enterErrorLocked(&WCError{Status: wc.Status, Opcode: wc.Opcode, QPN: wc.QPN, Err: ErrQPError})
		p.resolveDueLocked(false)
	case wc.Flags&transport.WCWithInvalidate != 0:
		err = p.remoteInvalidatedLocked(wc.InvalidatedRKey)
	}
	p.unlockAndNotify()
	return err
}

// HandleRecvInvalidate confirms that the peer invalidated rkey (a receive completion with
// WCWithInvalidate); it is what HandleRecvCompletion does for such a completion.
func (p *Pool) HandleRecvInvalidate(rkey uint32) error {
	p.mu.Lock()
	err := p.remoteInvalidatedLocked(rkey)
	p.unlockAndNotify()
	return err
}

func (p *Pool) remoteInvalidatedLocked(rkey uint32) error {
	s := p.byIndex[rkey>>8]
	if s == nil {
		if p.qpErr != nil {
			return nil // see below
		}
		return ErrUnknownRKey
	}
	for r := s.regs; r != nil; r = r.nextSlot {
		if r.key == rkey && (r.state == regPosted || r.state == regInvalidating) {
			// The responder invalidated exactly this key, so the REG_MR that installed it has
			// executed and no access through it can succeed any more. A LOCAL_INV of it that may
			// still be queued executes before any later REG_MR of this MR (SQ order) and finds the
			// MR FREE with that key, which rxe and softroce accept.
			p.confirmLocked(r, nil)
			// This was the registration's one report: leave no room for another (confirmLocked
			// leaves room for a report polled after a registration's death; see below).
			s.clearDead(uint8(rkey))
			p.c.invRemote++
			return nil
		}
	}
	if s.index == rkey>>8 && s.isDead(uint8(rkey)) {
		// The registration is already dead: its LOCAL_INV completed (or it was torn down) before
		// this receive completion was polled. Completions of the send queue and of the receive
		// queue are not ordered with respect to each other (IBA orders completions only within
		// one work queue), so a peer's SEND_WITH_INV that executed before our LOCAL_INV's
		// completion may be polled after it. Each registration is allowed exactly one report,
		// whichever side was polled first: a report confirms a live registration and uses up
		// its allowance (above), or it uses up the allowance its death left (here). A second
		// report of one registration is a peer error in either order (a second SEND_WITH_INV;
		// rxe_invalidate_mr accepts a FREE MR whose key still matches) and falls through to the
		// mismatch below, so that what the pool reports does not depend on the polling order.
		s.clearDead(uint8(rkey))
		return nil
	}
	if p.qpErr != nil {
		// After a QP error the registrations were (or will be) torn down from the device's own view;
		// a receive completion polled late can name one of them. Nothing to do.
		return nil
	}
	if s.state != mrQuarantined && s.state != mrDead {
		p.c.errors++
		// The QP is healthy: WRs posted before now may still execute on this MR, so the resolution
		// waits until they are retired.
		p.quarantineLocked(s, ErrRKeyMismatch, p.t.tail)
		_ = p.flushLocked() // make sure the WRs posted before the quarantine get retired
		p.resolveDueLocked(false)
	}
	return fmt.Errorf("%w: rkey %#x", ErrRKeyMismatch, rkey)
}

// confirmLocked records that r's key is dead on the device (leaving room for one remote
// invalidation report of it polled late, see remoteInvalidatedLocked) and queues r's owner
// callback.
func (p *Pool) confirmLocked(r *Reg, err error) {
	s := r.slot
	s.unlinkReg(r)
	s.clearLive(uint8(r.key))
	s.setDead(uint8(r.key))
	switch r.state {
	case regInvalidating:
		s.pendInv--
		p.nInval--
		if s.state == mrInvalidating && s.pendInv == 0 {
			s.state = mrFree
		}
	case regPosted: // remote invalidation, or teardown, of the current registration
		s.cur = nil
		if s.state == mrValid {
			s.state = idleState(s)
			p.pushFIFO(s)
			p.wakeLocked()
		}
	}
	r.state = regReleasing
	r.err = err
	r.nextNotify = p.notifyRegs
	p.notifyRegs = r
}

// ---- QP error, quarantine, recovery ----

// enterErrorLocked puts the pool in the QP error state: no more posts, and every MR whose device
// state is now unknown (registering, valid, or with an invalidation not yet confirmed) is
// quarantined. An errored or flushed completion means the QP is in ERR, where nothing executes
// any more, so the device's view of each MR (MR.Query) is final: the quarantine is resolved at
// once, at the end of the completion's processing (WRs it retires as executed are confirmed
// first). Waiting for the flushed WRs would not do: a WR that executed unsignaled before the error
// never completes at all.
func (p *Pool) enterErrorLocked(cause error) {
	if p.qpErr != nil {
		return
	}
	p.qpErr = cause
	p.c.errors++
	n := 0
	for i := range p.slots {
		s := &p.slots[i]
		if s.state == mrRegistering || s.state == mrValid || s.pendInv > 0 {
			p.quarantineLocked(s, cause, p.t.head)
			n++
		}
	}
	p.log.Log(qpErrorLevel(cause), "QP error: MRs quarantined", zap.Error(cause), zap.Int("quarantined", n),
		zap.Int("outstanding_wrs", p.t.outstanding()))
	p.wakeLocked()
}

// qpErrorLevel is the log level of a QP error. A QP goes to the error state on every channel
// failure (disconnect, the peer going away, a retry timeout); the ULP reports those, and the
// pool's part, tearing down its registrations, is routine: Info, or Debug when the pool only
// learnt of the error from flushed completions or out of band (the ULP or CM moved the QP to
// ERR and knows why). Warn is kept for a local error status: one of the work requests on this
// send queue failed its own local checks (a LOCAL_INV or REG_MR refused, a bad lkey, a bad
// length), which points at a bug in the pool, the ULP or the engine.
func qpErrorLevel(cause error) zapcore.Level {
	var wce *WCError
	if !errors.As(cause, &wce) {
		return zapcore.DebugLevel // HandleQPError, Recover
	}
	switch wce.Status {
	case transport.WCWRFlushErr:
		return zapcore.DebugLevel
	case transport.WCLocLenErr, transport.WCLocQPOpErr, transport.WCLocProtErr, transport.WCLocAccessErr:
		return zapcore.WarnLevel
	}
	return zapcore.InfoLevel
}

// quarantineLocked quarantines s until every WR before sequence number due is retired.
func (p *Pool) quarantineLocked(s *mrSlot, cause error, due uint64) {
	if s.state == mrQuarantined || s.state == mrDead {
		return
	}
	s.state = mrQuarantined
	s.quarSeq = due
	s.cause = cause
	p.nQuar++
}

// resolveDueLocked resolves quarantined MRs once every WR posted before their quarantine is
// retired (or all of them when force is set: the send queue was reset).
func (p *Pool) resolveDueLocked(force bool) {
	if p.nQuar == 0 {
		return
	}
	for i := range p.slots {
		s := &p.slots[i]
		if s.state == mrQuarantined && (force || p.qpErr != nil || p.t.head >= s.quarSeq) {
			p.resolveLocked(s)
		}
	}
}

// resolveLocked decides a quarantined MR from the device's own view (MR.Query: the key in force,
// which only executed work requests change). If the MR is FREE no key of any registration is
// valid; if it is VALID (an invalidation that never executed) the MR is deregistered and a new
// one allocated in its place, so that its key can never be used again. Either way every
// registration still recorded is handed back to its owner with the quarantine cause.
func (p *Pool) resolveLocked(s *mrSlot) {
	info := s.mr.Query()
	if info.State != transport.MRFree {
		p.recreateLocked(s)
	}
	for s.regs != nil {
		p.confirmLocked(s.regs, s.cause)
	}
	s.live = [4]uint64{}
	p.nQuar--
	switch {
	case s.mr == nil:
		s.state = mrDead
	case s.cur != nil: // a handle from Get, never posted: still the ULP's
		s.state = mrRegistering
	default:
		s.state = mrFree
		p.pushFIFO(s)
	}
	p.wakeLocked()
}

// recreateLocked deregisters s's MR and allocates a new one (mr == nil if that fails).
func (p *Pool) recreateLocked(s *mrSlot) {
	old := s.index
	if s.mr != nil {
		if err := s.mr.Close(); err != nil && !errors.Is(err, transport.ErrClosed) {
			p.log.Warn("deregistering a quarantined MR failed", zap.Uint32("index", old), zap.Error(err))
		}
	}
	mr, err := p.pd.AllocFastRegMR(p.maxPages)
	if err != nil {
		p.c.errors++
		p.log.Warn("re-creating a quarantined MR failed", zap.Uint32("index", old), zap.Error(err))
		s.mr = nil
		delete(p.byIndex, old)
		return
	}
	s.mr = mr
	if mr.Index() != old {
		delete(p.byIndex, old)
		s.index = mr.Index()
		s.keyByte = uint8(mr.RKey())
		s.dead = [4]uint64{}
		p.byIndex[s.index] = s
	}
	// Same index: keep counting from our last key byte, so that rkeys handed out before are
	// avoided for as long as the 8-bit key space allows (256 registrations).
	p.log.Info("quarantined MR re-created", zap.Uint32("old_index", old), zap.Uint32("index", s.index))
}

// Recover resumes the pool on qp (the same QP after it was reset and reconnected, or a new QP of
// the same PD; nil keeps the current one) after a QP error. Work requests still outstanding on the
// old send queue are forgotten (their completions, if any arrive, are reported as
// ErrStaleCompletion); RW contexts among them complete with ErrQPError; every quarantined MR is
// resolved now from the device's view (re-created if its state is not FREE); MRs whose
// re-creation failed earlier are allocated again. Calling it while the QP is healthy treats the
// send queue as reset: registrations in flight are torn down the same way.
//
// The old QP must be in ERR, reset or destroyed (nothing of it executes any more), and a new QP
// must belong to the same PD and have at least the old send-queue depth. The one-QP rule still
// holds: an MR moves to the new QP only once the device reports it FREE, or as a new MR.
func (p *Pool) Recover(qp transport.QP) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	if p.qpErr == nil {
		p.enterErrorLocked(ErrQPError)
	}
	for s := p.t.head; s < p.t.tail; s++ {
		e := p.t.entry(s)
		if e.kind == kindRW && e.waveEnd && e.rw.gen == e.gen {
			if e.rw.err == nil {
				e.rw.err = p.qpErr
			}
			e.rw.next = e.rw.nwr // no more waves
			p.waveDoneLocked(e.rw)
		}
	}
	p.t.reset()
	p.reserved = 0
	p.lastInv = 0
	p.resolveDueLocked(true)
	var firstErr error
	for i := range p.slots {
		s := &p.slots[i]
		if s.state != mrDead {
			continue
		}
		mr, err := p.pd.AllocFastRegMR(p.maxPages)
		if err != nil {
			p.c.errors++
			if firstErr == nil {
				firstErr = fmt.Errorf("frpool: re-creating MR: %w", err)
			}
			continue
		}
		s.mr, s.index, s.keyByte = mr, mr.Index(), uint8(mr.RKey())
		s.dead = [4]uint64{}
		p.byIndex[s.index] = s
		if s.cur != nil { // a handle from Get, never posted: still the ULP's
			s.state = mrRegistering
		} else {
			s.state = mrFree
			p.pushFIFO(s)
		}
	}
	oldQPN := p.qp.QPN()
	if qp != nil {
		p.qp = qp
	}
	p.rdAtomic = 0
	p.qpErr = nil
	if qp != nil && qp.QPN() != oldQPN {
		p.log = p.baseLog.With(zap.Uint32("qpn", qp.QPN())) // later lines name the new QP
		p.log.Info("recovered", zap.Uint32("old_qpn", oldQPN))
	} else {
		p.log.Info("recovered")
	}
	p.wakeLocked()
	p.unlockAndNotify()
	return firstErr
}

// HandleQPError tells the pool that its QP is in the error state although no completion said so
// (an asynchronous event, a CM disconnect, the ULP's own Modify to ERR, or an empty send queue
// when the error struck: WRs that executed unsignaled never complete). The pool stops posting and
// resolves every MR whose state is unknown from the device's view; every outstanding
// registration's buffer goes back to its owner with an error wrapping ErrQPError (cause, if given).
// Call Recover once the QP (or a new one) is usable again.
func (p *Pool) HandleQPError(cause error) {
	p.mu.Lock()
	if cause == nil {
		cause = ErrQPError
	} else if !errors.Is(cause, ErrQPError) {
		cause = fmt.Errorf("%w: %w", ErrQPError, cause)
	}
	p.enterErrorLocked(cause)
	p.resolveDueLocked(false)
	p.unlockAndNotify()
}

// QPError returns the error the pool is in (nil when healthy).
func (p *Pool) QPError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.qpErr
}

// ---- notifications ----

// unlockAndNotify releases p.mu and runs the owner callbacks queued meanwhile, then recycles
// their handles.
func (p *Pool) unlockAndNotify() {
	for p.notifyRegs != nil || p.notifyRW != nil {
		regs, rws := p.notifyRegs, p.notifyRW
		p.notifyRegs, p.notifyRW = nil, nil
		p.mu.Unlock()
		for r := regs; r != nil; r = r.nextNotify {
			if r.owner != nil {
				r.owner.BufferReleased(r, r.err)
			}
		}
		for c := rws; c != nil; {
			next := c.nextNotify
			c.nextNotify = nil
			owner, err := c.owner, c.err
			c.owner = nil
			c.state = rwReady
			if owner != nil {
				owner.RWDone(c, err)
			}
			c = next
		}
		p.mu.Lock()
		for r := regs; r != nil; {
			next := r.nextNotify
			r.nextNotify = nil
			if r.given {
				p.recycleLocked(r)
			} else {
				r.state = regReleased // the ULP still holds it (remote invalidation, teardown)
			}
			r = next
		}
		if regs != nil {
			p.wakeLocked()
		}
	}
	p.mu.Unlock()
}

// ---- stats, close ----

// Stats returns a snapshot.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Stats{
		MRs:                 len(p.slots),
		Invalidating:        p.nInval,
		SQOutstanding:       p.t.outstanding(),
		Waiting:             p.waiting,
		Waits:               p.c.waits,
		KeyWraps:            p.c.keyWraps,
		Registrations:       p.c.regs,
		InvalidationsLocal:  p.c.invLocal,
		InvalidationsRemote: p.c.invRemote,
		Sentinels:           p.c.sentinels,
		RWTransfers:         p.c.rw,
		Errors:              p.c.errors,
	}
	for i := range p.slots {
		switch p.slots[i].state {
		case mrFree, mrInvalidating:
			st.Free++
		case mrRegistering, mrValid:
			st.InUse++
		case mrQuarantined:
			st.Quarantined++
		case mrDead:
			st.Dead++
		}
	}
	return st
}

// Close deregisters the pool's MRs (and local memory registrations). It fails with ErrBusy while
// registrations are outstanding or work requests are not retired; waiting Get calls return
// ErrClosed.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if p.nFree != len(p.handles) || p.t.outstanding() > 0 || p.reserved > 0 {
		return ErrBusy // registrations, or handles not given back, or work requests outstanding
	}
	p.closed = true
	p.wakeLocked()
	var errs []error
	for i := range p.slots {
		if s := &p.slots[i]; s.mr != nil {
			if err := s.mr.Close(); err != nil {
				errs = append(errs, err)
			}
			s.mr = nil
		}
	}
	for _, lm := range *p.local.Load() {
		if err := lm.mr.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
