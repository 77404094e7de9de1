package initiator

// A channel is one RC QP with its completion queue, request table, credits and MR pool, as
// struct srp_rdma_ch is in torvalds/linux:drivers/infiniband/ulp/srp/ib_srp.h. This file holds
// the channel's state, grouped by the lock that guards it, and its lifetime resources; what it
// does is split by concern as ib_srp and the SCSI layers are: login.go (connecting, logging in),
// submit.go (posting commands), completion.go (the CQ and the IUs from the target), credits.go,
// request.go (the request table), eh.go (task management, error handling) and rport.go
// (channel and session state, teardown, reconnection).

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/frpool"
	"github.com/srpd/srpd/internal/cbatch"
	"github.com/srpd/srpd/internal/cqpoll"
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
)

var (
	errChannelDown  = errors.New("initiator: channel not connected")
	errTargetLogout = errors.New("initiator: target logged the channel out (SRP_T_LOGOUT)")
	errDisconnected = errors.New("initiator: connection disconnected by the target")
	errEHReset      = errors.New("initiator: channel reset by error handling")
	errProtocol     = errors.New("initiator: protocol error from the target")
)

// channel is one RDMA channel: an RC QP with its request table, credits, MR pool and the
// goroutine that polls its completion queue and reconnects it. Its fields are grouped by the
// lock that guards them; the comment of each group says which file's concern it is.
type channel struct {
	// Set by newChannel, then read-only.
	s   *Session
	idx int
	// dev is the device the channel's PD, CQ, QP and memory are on: queue idx (round robin)
	// of a multi-queue device (transport.QueueFor), so that channels use several CPUs.
	dev     transport.Device
	log     *zap.Logger
	pd      transport.PD
	cq      transport.CQ
	cqp     *cqpoll.Poller // owns the CQ; its lock guards the serve group below (completion.go)
	router  cqpoll.Router  // completions by work request kind (completion.go)
	dataMem transport.Memory
	reqs    []request     // the request table (request.go)
	free    chan *request // its free slots
	sqDepth int
	nRecv   int
	maxRegs int           // MRs per command at most
	mrBytes int           // bytes one MR maps
	kick    chan struct{} // wakes the channel goroutine (wake)
	stop    chan struct{} // closed when the session stops the channel
	exited  chan struct{} // closed when the channel goroutine has exited

	// Read without a lock.
	state    atomic.Uint32 // chState; written under mu (rport.go)
	capBytes atomic.Int64  // capacity(); written by activate

	// postMu guards the connection (login.go, submit.go). The channel goroutine (or Dial)
	// writes it under postMu (write) while the channel is down; every goroutine posting on the
	// send queue holds postMu (read) and reads it while the channel is live. The channel
	// goroutine also takes postMu (write) before it lets the pool handle a QP error (teardown),
	// so a post is never half done when registrations are torn down.
	postMu  sync.RWMutex
	pool    *frpool.Pool // made by the first activate, then kept across connections (own lock)
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

	// mu guards the credits (credits.go), the completion state of the requests (request.go,
	// see request), what error handling asks of the channel goroutine and the task management
	// slot (eh.go).
	mu          sync.Mutex
	reqLim      int32         // credits
	creditCh    chan struct{} // closed when credits arrive or the channel goes down
	probing     bool          // a credit probe is in flight
	lastProbe   time.Time
	probeGained bool
	inflight    int        // commands started and not signaled yet
	invQ        []*request // requests whose registrations the end of the batch must invalidate
	asyncQ      []*request // answered asynchronous commands to finish after the batch
	ehReset     error      // channel reset requested by error handling
	tm          tmState

	// tmMu: one task management function at a time (eh.go).
	tmMu sync.Mutex

	// The serve group: owned by the channel goroutine, and while it serves only touched under
	// the poller's lock (cqp), which the completion handler holds when it runs in serve's place
	// (completion.go).
	asyncW     []*request       // runAsync's copy of asyncQ
	batches    []cbatch.Batcher // completion batches runAsync opened (openBatch)
	wcs        []transport.WC
	leftover   []transport.WC // completions after the one that failed the connection (teardown)
	rwr        [1]transport.RecvWR
	rsge       [1]transport.SGE
	recvPosted int
	ctrlBusy   [nCtrlBufs]bool
	ctrlQ      []ctrlMsg
	ctrlWR     [1]transport.SendWR
	ctrlSGE    [1]transport.SGE
	ctrlChain  frpool.Chain
	invBatch   []*frpool.Reg
	invWork    []*request
	invGens    []uint32 // invWork's generations (afterBatch)
	invChain   frpool.Chain

	// Each with its own lock: what a target can send as fast as it likes is logged at most
	// once per logInterval each (with the count of what was held back), so that a hostile
	// target cannot flood the log (completion.go).
	foreignLog, aerLog, ctrlLog logLimit
}

func (c *channel) getState() chState { return chState(c.state.Load()) }

func (c *channel) live() bool { return c.getState() == chLive }

func (c *channel) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
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
	c.dev = transport.QueueFor(cfg.Device, idx)
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
	dev := c.dev
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
	c.invGens = make([]uint32, 0, qd)
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
	dispose(&c.qp, transport.QP.Close, keep)
	if c.pool != nil {
		if c.pool.QPError() != nil {
			_ = c.pool.Recover(nil)
		}
		keep(c.pool.Close())
		c.pool = nil
	}
	dispose(&c.iuMR, transport.MR.Close, keep)
	dispose(&c.iuMem, transport.Memory.Free, keep)
	dispose(&c.dataMem, transport.Memory.Free, keep)
	dispose(&c.cq, transport.CQ.Close, keep)
	dispose(&c.pd, transport.PD.Close, keep)
	if len(errs) > 0 {
		c.log.Warn("releasing channel resources", zap.Error(errors.Join(errs...)))
	}
}

// dispose ends the resource *p holds with end, passes end's error to keep and forgets the
// resource; it leaves a nil *p alone.
func dispose[T comparable](p *T, end func(T) error, keep func(error)) {
	var none T
	if *p != none {
		keep(end(*p))
		*p = none
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

// capacity is the largest data transfer one command on this channel can carry (as negotiated by
// the current connection).
func (c *channel) capacity() int { return int(c.capBytes.Load()) }

func roundUp(n, a int) int { return (n + a - 1) / a * a }
