package initiator

import (
	"context"
	"encoding/binary"
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

// chState is a channel's connection state.
type chState uint32

const (
	chDown     chState = iota // not connected: connecting, or waiting to reconnect
	chLive                    // connected and logged in
	chDisabled                // the target refused this channel for good (multichannel limits)
	chClosed                  // the session is closing
)

func (s chState) String() string {
	return [...]string{"down", "live", "disabled", "closed"}[s]
}

const (
	nTMBufs     = 4  // task management IU buffers (cycled, so a late retransmit sees stable bytes)
	nCtrlBufs   = 4  // CRED_RSP / AER_RSP buffers
	nTargetReqs = 4  // receive buffers beyond commands and TM for CRED_REQ, AER_REQ, T_LOGOUT
	maxCtrlQ    = 16 // target requests waiting for a free response buffer
	iuAlign     = 64
	// maxDirectRepolls bounds the extra polls a run of the completion handler makes for the
	// LOCAL_INV completions of direct commands (Buffer) it has just invalidated.
	maxDirectRepolls = 2
)

// Work request kinds (cqpoll.WRID). Receive WRs carry them on the wire; the send WRs go through
// the MR pool, which keeps their IDs for us and puts its own (frpool.WRIDTag) on the wire.
const (
	kindRecv cqpoll.Kind = iota // a receive buffer (index: its number; the ID is the number)
	kindCmd                     // a command's SEND (index: the request slot)
	kindTM                      // a task management IU (index: low bits of its sequence)
	kindCtrl                    // a CRED_RSP / AER_RSP (index: the control buffer)
)

var (
	errChannelDown  = errors.New("initiator: channel not connected")
	errTargetLogout = errors.New("initiator: target logged the channel out (SRP_T_LOGOUT)")
	errDisconnected = errors.New("initiator: connection disconnected by the target")
	errEHReset      = errors.New("initiator: channel reset by error handling")
	errProtocol     = errors.New("initiator: protocol error from the target")
)

// wcError is a failed work completion, the usual reason a channel goes down.
type wcError struct{ wc transport.WC }

func (e *wcError) Error() string {
	return fmt.Sprintf("initiator: qp %#x: %v completion failed: %v", e.wc.QPN, e.wc.Opcode, e.wc.Status)
}

// tmState is the channel's task management slot. Guarded by channel.mu except buf, which is
// only written by the goroutine holding tmMu.
type tmState struct {
	seq     uint32
	tag     uint64
	waiting bool
	got     bool
	resp    srp.TMResponse
	err     error
	done    chan struct{}
}

// connParams are what one login negotiated.
type connParams struct {
	txIULen  int // MAX IT IU LEN in force: our SRP_CMD IUs never exceed it
	rxIULen  int // MAX TI IU LEN: size of our receive buffers
	maxDescs int // direct descriptors per command (1: direct only)
	maxImm   int // largest immediate-data write (0: none)
	credits  int32
}

// channel is one RDMA channel: an RC QP with its request table, credits, MR pool and the
// goroutine that polls its completion queue and reconnects it.
type channel struct {
	s   *Session
	idx int
	log *zap.Logger

	// For the channel's lifetime.
	pd      transport.PD
	cq      transport.CQ
	pool    *frpool.Pool
	dataMem transport.Memory
	reqs    []request
	free    chan *request
	sqDepth int
	nRecv   int
	maxRegs int // MRs per command at most
	mrBytes int // bytes one MR maps

	// The connection; written by the channel goroutine under postMu (write), read by others
	// under postMu (read) while live.
	qp      transport.QP
	conn    transport.CMConn
	events  <-chan transport.CMEvent
	iuMem   transport.Memory
	iuMR    transport.MR
	txOff   int // offset of the tx IU area in iuMem
	txStr   int // tx stride
	rxOff   int
	rxStr   int
	params  connParams
	tmBufs  [nTMBufs]int // offsets
	ctrlBuf [nCtrlBufs]int

	state    atomic.Uint32 // chState; written under mu
	capBytes atomic.Int64  // capacity()

	mu          sync.Mutex
	reqLim      int32
	inflight    int
	creditCh    chan struct{} // closed when credits arrive or the channel goes down
	invQ        []*request    // requests whose registrations the goroutine must invalidate
	ehReset     error         // channel reset requested by error handling
	probing     bool          // a credit probe is in flight
	lastProbe   time.Time
	probeGained bool
	tm          tmState

	// postMu (read) is held by every goroutine posting on the send queue; the channel goroutine
	// takes it (write) before it lets the pool handle a QP error, so a post is never half done
	// when registrations are torn down.
	postMu sync.RWMutex
	tmMu   sync.Mutex // one task management function at a time

	// cqp owns the CQ. Its lock is held by serve while it is not waiting, and by the handler
	// it runs on the transport's receive goroutine (cqHandler) while that handles completions
	// in serve's place: the fields below that serve owns are only touched under it while
	// serving.
	cqp    *cqpoll.Poller
	router cqpoll.Router // completions by work request kind (handleWC)
	asyncQ []*request    // answered asynchronous commands to finish after the batch (mu)
	asyncW []*request    // runAsync's copy (cqp)

	// Owned by the channel goroutine (and the completion handler, see cqp).
	wcs        []transport.WC
	leftover   []transport.WC
	rwr        [1]transport.RecvWR
	rsge       [1]transport.SGE
	recvPosted int
	ctrlBusy   [nCtrlBufs]bool
	ctrlQ      []ctrlMsg
	invBatch   []*frpool.Reg
	invWork    []*request
	invChain   frpool.Chain
	ctrlWR     [1]transport.SendWR
	ctrlSGE    [1]transport.SGE
	ctrlChain  frpool.Chain

	// What a target can send as fast as it likes is logged at most once per logInterval each
	// (with the count of what was held back), so that a hostile target cannot flood the log.
	foreignLog, aerLog, ctrlLog logLimit

	kick   chan struct{}
	stop   chan struct{}
	exited chan struct{}
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

type ctrlMsg struct {
	op  srp.Opcode
	tag srp.Tag
}

func (c *channel) getState() chState { return chState(c.state.Load()) }
func (c *channel) live() bool        { return c.getState() == chLive }

func (c *channel) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// newChannel allocates the channel's lifetime resources: PD, CQ, data buffers, request slots.
// The QP, IU buffers and MR pool come with the first connection.
func newChannel(s *Session, idx int) (*channel, error) {
	cfg := &s.cfg
	c := &channel{
		s:    s,
		idx:  idx,
		log:  s.log.With(zap.Int("ch", idx)),
		kick: make(chan struct{}, 1),
		stop: make(chan struct{}),
	}
	c.exited = make(chan struct{})
	c.mrBytes = cfg.MaxPagesPerMR * pageSize
	c.maxRegs = min(cfg.CmdSGEntries, (cfg.MaxIOSize+c.mrBytes-1)/c.mrBytes)
	if cfg.DisableIndirect {
		c.maxRegs = 1
	}
	qd := cfg.QueueDepth
	c.sqDepth = qd*(1+2*c.maxRegs) + nTMBufs + nCtrlBufs + 8
	if m := cfg.Device.Attr().MaxQPWR; m > 0 && c.sqDepth > m {
		c.sqDepth = m
	}
	c.nRecv = qd + nTMBufs + nTargetReqs
	var err error
	dev := cfg.Device
	if c.pd, err = dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("initiator: channel %d: PD: %w", idx, err)
	}
	if c.cq, err = dev.CreateCQ(c.sqDepth + c.nRecv + 16); err != nil {
		c.release()
		return nil, fmt.Errorf("initiator: channel %d: CQ: %w", idx, err)
	}
	c.initCompletions()
	if c.dataMem, err = dev.AllocMemory(qd * cfg.MaxIOSize); err != nil {
		c.release()
		return nil, fmt.Errorf("initiator: channel %d: data buffers: %w", idx, err)
	}
	c.reqs = make([]request, qd)
	c.free = make(chan *request, qd)
	descs := make([]byte, qd*c.maxRegs*srp.DirectDescLen)
	regs := make([]*frpool.Reg, qd*c.maxRegs)
	flags := make([]bool, 2*qd*c.maxRegs)
	db := c.dataMem.Bytes()
	for i := range c.reqs {
		r := &c.reqs[i]
		r.ch = c
		r.idx = i
		r.data = db[i*cfg.MaxIOSize : (i+1)*cfg.MaxIOSize : (i+1)*cfg.MaxIOSize]
		r.dAddr = c.dataMem.Addr() + uint64(i*cfg.MaxIOSize)
		r.descs = descs[i*c.maxRegs*srp.DirectDescLen : (i+1)*c.maxRegs*srp.DirectDescLen]
		r.regs = regs[i*c.maxRegs : (i+1)*c.maxRegs : (i+1)*c.maxRegs]
		r.rel = flags[2*i*c.maxRegs : (2*i+1)*c.maxRegs : (2*i+1)*c.maxRegs]
		r.given = flags[(2*i+1)*c.maxRegs : (2*i+2)*c.maxRegs : (2*i+2)*c.maxRegs]
		r.done = make(chan struct{}, 1)
		r.expired = make(chan struct{}, 1)
		r.wr[0].SGL = r.sge[:]
		r.chain.WRs = r.wr[:]
		c.free <- r
	}
	c.tm.done = make(chan struct{}, 1)
	n := 256
	c.wcs = make([]transport.WC, n)
	c.leftover = make([]transport.WC, 0, n)
	c.asyncQ = make([]*request, 0, qd)
	c.asyncW = make([]*request, 0, qd)
	c.rwr[0].SGL = c.rsge[:]
	c.ctrlQ = make([]ctrlMsg, 0, maxCtrlQ)
	c.invQ = make([]*request, 0, qd)
	c.invBatch = make([]*frpool.Reg, 0, qd*c.maxRegs)
	c.invWork = make([]*request, 0, qd)
	c.ctrlWR[0].SGL = c.ctrlSGE[:]
	c.ctrlChain.WRs = c.ctrlWR[:]
	return c, nil
}

// release frees the channel's resources (after its goroutine exited, or on a failed setup).
func (c *channel) release() {
	var errs []error
	keep := func(err error) {
		if err != nil && !errors.Is(err, transport.ErrClosed) {
			errs = append(errs, err)
		}
	}
	if c.qp != nil {
		keep(c.qp.Close())
		c.qp = nil
	}
	if c.pool != nil {
		if c.pool.QPError() != nil {
			_ = c.pool.Recover(nil)
		}
		keep(c.pool.Close())
		c.pool = nil
	}
	if c.iuMR != nil {
		keep(c.iuMR.Close())
		c.iuMR = nil
	}
	if c.iuMem != nil {
		keep(c.iuMem.Free())
		c.iuMem = nil
	}
	if c.dataMem != nil {
		keep(c.dataMem.Free())
		c.dataMem = nil
	}
	if c.cq != nil {
		keep(c.cq.Close())
		c.cq = nil
	}
	if c.pd != nil {
		keep(c.pd.Close())
		c.pd = nil
	}
	if len(errs) > 0 {
		c.log.Warn("releasing channel resources", zap.Error(errors.Join(errs...)))
	}
}

// newQP creates an RC QP for a connection attempt.
func (c *channel) newQP() (transport.QP, error) {
	return c.pd.CreateQP(transport.QPInitAttr{
		Type:   transport.QPTypeRC,
		SendCQ: c.cq,
		RecvCQ: c.cq,
		Cap: transport.QPCap{
			MaxSendWR:  c.sqDepth,
			MaxRecvWR:  c.nRecv,
			MaxSendSGE: 1,
			MaxRecvSGE: 1,
		},
	})
}

// activate installs a connection that has just logged in: IU buffers laid out for the
// negotiated lengths, receive buffers posted, MR pool (re)bound to the QP, credits. It runs on
// the goroutine that owns the channel (Dial, or the channel goroutine) while the channel is down.
func (c *channel) activate(qp transport.QP, conn transport.CMConn, p connParams) error {
	c.postMu.Lock()
	defer c.postMu.Unlock()
	qd := len(c.reqs)
	txStr := roundUp(p.txIULen, iuAlign)
	rxStr := roundUp(p.rxIULen, iuAlign)
	nTx := qd + nTMBufs + nCtrlBufs
	need := nTx*txStr + c.nRecv*rxStr
	if c.iuMem == nil || c.iuMem.Len() < need {
		if c.iuMR != nil {
			if err := c.iuMR.Close(); err != nil {
				return fmt.Errorf("initiator: deregistering IU buffers: %w", err)
			}
			c.iuMR = nil
		}
		if c.iuMem != nil {
			if err := c.iuMem.Free(); err != nil {
				return fmt.Errorf("initiator: freeing IU buffers: %w", err)
			}
			c.iuMem = nil
		}
		m, err := c.s.cfg.Device.AllocMemory(need)
		if err != nil {
			return fmt.Errorf("initiator: IU buffers: %w", err)
		}
		c.iuMem = m
	}
	if c.iuMR == nil {
		// Local access only: the target reaches our memory through the MR pool's registrations.
		mr, err := c.pd.RegMR(c.iuMem.Addr(), uint64(c.iuMem.Len()), transport.AccessLocalWrite)
		if err != nil {
			return fmt.Errorf("initiator: registering IU buffers: %w", err)
		}
		c.iuMR = mr
	}
	c.txOff, c.txStr, c.rxStr = 0, txStr, rxStr
	c.rxOff = nTx * txStr
	b := c.iuMem.Bytes()
	base := c.iuMem.Addr()
	for i := range c.reqs {
		r := &c.reqs[i]
		off := c.txOff + i*txStr
		r.iu = b[off : off+p.txIULen : off+p.txIULen]
		r.iuAddr = base + uint64(off)
	}
	for i := range c.tmBufs {
		c.tmBufs[i] = c.txOff + (qd+i)*txStr
	}
	for i := range c.ctrlBuf {
		c.ctrlBuf[i] = c.txOff + (qd+nTMBufs+i)*txStr
		c.ctrlBusy[i] = false
	}
	c.ctrlQ = c.ctrlQ[:0]
	c.leftover = c.leftover[:0]

	if c.pool == nil {
		attr := c.s.cfg.Device.Attr()
		pool, err := frpool.New(frpool.Config{
			Attr:     attr,
			PD:       c.pd,
			QP:       qp,
			MaxPages: c.s.cfg.MaxPagesPerMR,
			NumMRs:   qd*c.maxRegs + 8,
			SQDepth:  c.sqDepth,
			Logger:   c.log,
		})
		if err != nil {
			return fmt.Errorf("initiator: MR pool: %w", err)
		}
		c.pool = pool
	} else if err := c.pool.Recover(qp); err != nil {
		c.log.Warn("MR pool recovery incomplete", zap.Error(err))
	}
	c.qp, c.conn = qp, conn
	c.events = nil
	if conn != nil {
		c.events = conn.Events()
	}
	c.params = p
	c.capBytes.Store(int64(min(c.s.cfg.MaxIOSize, p.maxDescs*c.mrBytes)))
	c.recvPosted = 0
	for i := 0; i < c.nRecv; i++ {
		if err := c.postRecv(i); err != nil {
			return fmt.Errorf("initiator: posting receive buffers: %w", err)
		}
	}
	c.mu.Lock()
	c.reqLim = clampCredits(int64(p.credits), c.maxReqLim())
	c.ehReset = nil
	c.invQ = c.invQ[:0]
	c.tm.waiting = false
	c.state.Store(uint32(chLive))
	c.wakeCreditLocked()
	c.mu.Unlock()
	return nil
}

func roundUp(n, a int) int { return (n + a - 1) / a * a }

func (c *channel) postRecv(i int) error {
	off := c.rxOff + i*c.rxStr
	c.rsge[0] = transport.SGE{Addr: c.iuMem.Addr() + uint64(off), Length: uint32(c.params.rxIULen), LKey: c.iuMR.LKey()}
	c.rwr[0].ID = cqpoll.WRID(kindRecv, uint32(i))
	if err := c.qp.PostRecv(c.rwr[:]); err != nil {
		return err
	}
	c.recvPosted++
	return nil
}

func (c *channel) rxBuf(i int, n uint32) []byte {
	off := c.rxOff + i*c.rxStr
	return c.iuMem.Bytes()[off : off+int(n)]
}

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

// capacity is the largest data transfer one command on this channel can carry (as negotiated by
// the current connection).
func (c *channel) capacity() int { return int(c.capBytes.Load()) }

// ---- submission (caller goroutines) ----

// start sends the command of spec on r, a slot of c taken from c.free. It returns posted ==
// false when nothing was sent (the slot must go back to c.free; err says why: errChannelDown,
// a context error, or a transient shortage), and posted == true when the command is on its way:
// the caller then waits for r.done.
func (c *channel) start(ctx context.Context, r *request, spec *cmdSpec) (posted bool, err error) {
	return c.startCmd(ctx, r, spec, true)
}

// errNoCredit: startCmd without waiting found no credit.
var errNoCredit = errors.New("initiator: no credit")

// startCmd is start; without wait it returns errNoCredit instead of waiting for a credit.
func (c *channel) startCmd(ctx context.Context, r *request, spec *cmdSpec, wait bool) (posted bool, err error) {
	// Take a credit: commands need req_lim > 1, the last credit is reserved for task management.
	for {
		c.postMu.RLock()
		c.mu.Lock()
		if c.getState() != chLive {
			c.mu.Unlock()
			c.postMu.RUnlock()
			return false, errChannelDown
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
			c.mu.Unlock()
			c.postMu.RUnlock()
			return false, errNoCredit
		}
		w := c.creditWaitLocked()
		c.mu.Unlock()
		c.postMu.RUnlock()
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
			return false, err
		}
	}
	// c.mu and postMu (read) held.
	c.beginLocked(r, spec)
	c.mu.Unlock()
	select { // a token left over from an earlier use (should not happen)
	case <-r.done:
	default:
	}

	r.started = time.Now() // before the post: an asynchronous command is another goroutine's then
	// With a device that can run its own deliveries on the caller (softroce: a target in this
	// process, on the same device), the post is bracketed so that the command, the target's
	// answer and its completion are processed right here (transport.Progresser). Hold only
	// from here on: nothing below blocks, so nothing can wait for this Progress.
	if c.cqp.Hold() {
		defer c.cqp.Progress() // after postMu is released
	}
	sent, err := c.post(r)
	c.postMu.RUnlock()
	if sent {
		return true, nil
	}
	// Nothing reached the send queue (the post is all-or-nothing): undo.
	c.mu.Lock()
	c.reqLim++
	r.state = reqIdle
	c.inflight--
	c.mu.Unlock()
	return false, err
}

// beginLocked spends a credit on r and makes it the in-flight command of spec, under a new tag.
func (c *channel) beginLocked(r *request, spec *cmdSpec) {
	c.reqLim--
	r.gen++
	r.tag = makeTag(false, r.gen, c.idx, r.idx)
	r.state = reqInflight
	r.out = outNone
	r.pending = 0
	r.ungiven = 0
	r.nregs = 0
	r.invQueued = false
	r.signaled = false
	r.imm = false
	r.senseLen = 0
	r.spec = *spec
	c.inflight++
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

// post maps r's data (immediate data, or MRs from the pool) and posts the REG_MRs and the SEND
// in one all-or-nothing chain. sent reports whether it was posted; if not, nothing was (the
// handles went back to the pool). postMu (read) is held.
func (c *channel) post(r *request) (sent bool, err error) {
	sp := &r.spec
	f := &r.cmdf
	*f = srp.CmdFields{Tag: tagBytes(r.tag), LUN: sp.lunAddr, CDB: sp.cdb[:sp.cdbLen]}
	p := &c.params
	r.chain.Reg = nil
	switch {
	case sp.n == 0 || sp.dir == dirNone:
	case sp.dir == dirOut && sp.n <= p.maxImm:
		// SRP-2 immediate data: the data travels in the SRP_CMD itself, no MR.
		f.DataOut = srp.DataBuf{Format: srp.DescImmediate, Total: uint32(sp.n)}
		f.ImmDataOffset = srp.DefaultImmDataOffset
		if !sp.zero {
			f.DataOut.Imm = sp.buf[:sp.n]
		}
		r.imm = true
	default:
		if sp.addr == 0 && sp.dir == dirOut {
			if sp.zero {
				clear(r.data[:sp.n])
			} else {
				copy(r.data, sp.buf[:sp.n])
			}
		}
		k := (sp.n + c.mrBytes - 1) / c.mrBytes
		if k > p.maxDescs || k > len(r.regs) {
			return false, fmt.Errorf("initiator: %d bytes need %d descriptors, the channel allows %d", sp.n, k, p.maxDescs)
		}
		base := r.dAddr
		if sp.addr != 0 {
			base = sp.addr // the caller's Buffer, page-aligned like the slot's buffer
		}
		for j := 0; j < k; j++ {
			off := j * c.mrBytes
			r.segs[0] = frpool.Seg{Addr: base + uint64(off), Len: min(c.mrBytes, sp.n-off)}
			reg, err := c.pool.TryGet(r.segs[:], r)
			if err != nil {
				for i := 0; i < j; i++ {
					_ = c.pool.Cancel(r.regs[i])
					r.regs[i] = nil
				}
				return false, err
			}
			r.regs[j] = reg
		}
		r.chain.Reg = r.regs[:k]
		var d srp.DataBuf
		if k == 1 {
			reg := r.regs[0]
			d = srp.DataBuf{Format: srp.DescDirect, Direct: srp.DirectDesc{VA: reg.IOVA(), Key: reg.RKey(), Len: uint32(sp.n)}}
		} else {
			list := srp.DescList(r.descs[:k*srp.DirectDescLen])
			for j := 0; j < k; j++ {
				reg := r.regs[j]
				list.Set(j, srp.DirectDesc{VA: reg.IOVA(), Key: reg.RKey(), Len: uint32(reg.Length())})
			}
			// The whole table travels in the IU; its table descriptor names where it sits in our
			// IU buffer (not remotely accessible: a target never needs to fetch a complete table).
			d = srp.DataBuf{Format: srp.DescIndirect, Total: uint32(sp.n), List: list,
				Table: srp.DirectDesc{VA: r.iuAddr + srp.CmdHdrLen + srp.IndirectHdrLen, Len: uint32(len(list))}}
		}
		if sp.dir == dirOut {
			f.DataOut = d
		} else {
			f.DataIn = d
		}
	}
	k := len(r.chain.Reg)
	n, err := srp.Cmd(r.iu).Encode(f)
	if err == nil && f.DataOut.Format == srp.DescImmediate && f.DataOut.Imm == nil {
		clear(r.iu[n : n+sp.n])
		n += sp.n
	}
	if err == nil {
		r.sge[0] = transport.SGE{Addr: r.iuAddr, Length: uint32(n), LKey: c.iuMR.LKey()}
		r.wr[0] = transport.SendWR{ID: cqpoll.WRID(kindCmd, uint32(r.idx)), Opcode: transport.WRSend, SGL: r.sge[:]}
		// The registrations are live from the post on: account for them first.
		c.mu.Lock()
		r.nregs, r.pending, r.ungiven = k, k, k
		r.direct = k > 0 && sp.addr != 0
		for i := 0; i < k; i++ {
			r.rel[i], r.given[i] = false, false
		}
		c.mu.Unlock()
		// REG_MRs and the SEND that names their keys, all or nothing.
		err = c.pool.Post(&r.chain)
	}
	r.chain.Reg = nil
	if err != nil {
		c.mu.Lock()
		r.nregs, r.pending, r.ungiven = 0, 0, 0
		r.direct = false
		c.mu.Unlock()
		for i := 0; i < k; i++ {
			_ = c.pool.Cancel(r.regs[i])
			r.regs[i] = nil
		}
		return false, err
	}
	return true, nil
}

// ---- task management ----

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
		c.postMu.RLock()
		c.mu.Lock()
		if c.getState() != chLive {
			c.mu.Unlock()
			c.postMu.RUnlock()
			return fail(errChannelDown, false)
		}
		if c.reqLim > 0 { // TM may use the reserved credit
			break
		}
		w := c.creditWaitLocked()
		c.mu.Unlock()
		c.postMu.RUnlock()
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

// ---- the channel goroutine ----

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

func (c *channel) stopping() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
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
		CQ: c.cq, Handler: (*cqHandler)(c), Device: c.s.cfg.Device, Repolls: maxDirectRepolls,
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
	for _, r := range reqs {
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
	for _, r := range reqs {
		retry := false
		for i := 0; i < r.nregs; i++ {
			c.mu.Lock()
			given, rel := r.given[i], r.rel[i]
			c.mu.Unlock()
			if given {
				continue
			}
			if rel || !batchOK {
				// Already dead (only gives the handle back), or the batch was refused: one by
				// one. A QP error or a quarantine gives the handle back too (the pool releases
				// the buffer itself); a full send queue is retried after the next completions.
				if err := c.pool.Invalidate(r.regs[i]); errors.Is(err, frpool.ErrSQFull) {
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
		if retry {
			c.queueInvLocked(r)
		}
		c.finishLocked(r)
		c.mu.Unlock()
	}
	return directWait && batchOK
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
