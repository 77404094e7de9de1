package initiator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/frpool"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

const pageSize = 4096

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

// loginParams are what logins ask for; they only ever go down (negotiation).
type loginParams struct {
	itIULen uint32
	bufFmt  srp.BufFormats
	imm     bool
}

// Stats are a session's counters.
type Stats struct {
	Commands       uint64 // SCSI commands completed by the target
	ImmediateData  uint64 // of which writes sent as immediate data
	Direct         uint64 // of which mapped the caller's Buffer directly (no copy)
	Retries        uint64 // commands re-issued (channel failure, reset, UNIT ATTENTION, BUSY, ...)
	UnitAttentions uint64
	Timeouts       uint64 // commands that timed out
	Aborts         uint64 // ABORT TASKs sent
	LUNResets      uint64 // LOGICAL UNIT RESETs sent
	TaskMgmt       uint64 // task management functions sent
	Reconnects     uint64 // channel reconnections
	CreditWaits    uint64 // submissions that waited for credits
	StaleResponses uint64 // responses for commands no longer outstanding
	BytesRead      uint64 // data-in bytes of READ(16)s that completed GOOD
	BytesWritten   uint64 // data-out bytes of WRITE(16)s that completed GOOD (zeroes sent as WRITE(16) included)
	// HandlerBatches counts completion batches handled on the transport's receive goroutine
	// (transport.CompletionHandler) instead of the channel goroutine.
	HandlerBatches uint64
	CredReqs       uint64 // SRP_CRED_REQs answered
	AerReqs        uint64 // SRP_AER_REQs answered
	LiveChannels   int
}

// countRW counts the bytes of a READ(16)/WRITE(16) that completed GOOD.
func (c *counters) countRW(write bool, n int) {
	if write {
		c.bytesWritten.Add(uint64(n))
	} else {
		c.bytesRead.Add(uint64(n))
	}
}

type counters struct {
	commands, imm, direct, retries, uas, timeouts, aborts, lunResets, taskMgmt atomic.Uint64
	reconnects, creditWaits, staleRsps, credReqs, aerReqs                      atomic.Uint64
	handlerBatches                                                             atomic.Uint64
	bytesRead, bytesWritten                                                    atomic.Uint64
}

// Session is an SRP initiator session with one target port: ChCount RDMA channels, their
// request tables and credits, reconnection, and the logical units found on the target.
// All methods are safe for concurrent use.
type Session struct {
	cfg   Config
	log   *zap.Logger
	chans []*channel
	iport srp.PortID
	rr    atomic.Uint32
	stats counters

	epoch  time.Time       // origin of now()
	ctx    context.Context // cancelled when the session closes or is lost
	cancel context.CancelFunc

	mu          sync.Mutex
	state       State
	live        int
	changed     chan struct{} // closed (and replaced) on every state or channel change
	ffTimer     *time.Timer
	dlTimer     *time.Timer
	termErr     error // ErrClosed / ErrSessionLost once terminal
	everRunning bool
	done        chan struct{} // closed when the session has shut down
	shutOnce    sync.Once

	loginMu  sync.Mutex
	lp       loginParams
	loginSeq uint64

	ehMu sync.Mutex // one LOGICAL UNIT RESET at a time

	lunMu sync.RWMutex
	luns  []*LUN

	bufs bufSet // AllocBuffer's Buffers
}

// Dial creates a session: it logs channel 0 in (negotiating IU lengths and formats down if the
// target rejects them), then the other channels, starts their completion goroutines and
// discovers the target's logical units (REPORT LUNS, INQUIRY, READ CAPACITY(16)). A login the
// target rejects is returned as a *LoginRejectError.
func Dial(ctx context.Context, cfg Config) (*Session, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Session{cfg: cfg, state: StateBlocked, changed: make(chan struct{}), done: make(chan struct{}), epoch: time.Now()}
	s.iport = cfg.InitiatorPortID
	if s.iport == (srp.PortID{}) {
		var guid uint64
		if g := cfg.Device.GIDs(); len(g) > 0 {
			guid = binary.BigEndian.Uint64(g[0][8:])
		}
		s.iport = srp.MakePortID(cfg.InitiatorExt, guid)
	}
	s.log = cfg.Logger.With(zap.String("session", cfg.Name), zap.Stringer("target_port", cfg.TargetPortID),
		zap.Stringer("initiator_port", s.iport))
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.lp = s.initialLoginParams()

	for i := 0; i < cfg.ChCount; i++ {
		c, err := newChannel(s, i)
		if err != nil {
			s.abandon()
			return nil, err
		}
		s.chans = append(s.chans, c)
	}
	// Channel 0 must log in; the others are best effort (like ib_srp, the session proceeds
	// with the channels it got; the rest keep trying in the background).
	for i, c := range s.chans {
		s.loginMu.Lock()
		err := s.login(ctx, c, i > 0)
		s.loginMu.Unlock()
		if err == nil {
			s.channelUp(c)
			continue
		}
		if i == 0 {
			s.abandon()
			return nil, err
		}
		if s.refused(c, true, err) {
			s.log.Warn("channel refused by the target; going on without it", zap.Int("ch", i), zap.Error(err))
		} else {
			s.log.Warn("channel login failed; retrying in the background", zap.Int("ch", i), zap.Error(err))
		}
	}
	for _, c := range s.chans {
		go c.run()
	}
	if cfg.CommandTimeout > 0 {
		go s.watchdog()
	}
	if err := s.Rescan(ctx); err != nil {
		cctx, cancel := context.WithTimeout(context.Background(), cfg.TeardownTimeout)
		defer cancel()
		_ = s.Close(cctx)
		return nil, err
	}
	s.log.Info("session established", zap.Int("channels", s.liveChannels()), zap.Int("luns", len(s.LUNs())))
	return s, nil
}

// abandon releases what a failed Dial set up (no goroutines are running).
func (s *Session) abandon() {
	s.cancel()
	for _, c := range s.chans {
		if c.qp != nil && c.conn != nil {
			_ = c.conn.Disconnect(nil)
		}
		if c.qp != nil {
			_ = c.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState)
		}
		c.release()
	}
	close(s.done)
}

func (s *Session) initialLoginParams() loginParams {
	cfg := &s.cfg
	lp := loginParams{bufFmt: srp.BufFormatDirect, imm: !cfg.DisableImmediateData && cfg.MaxImmediateData > 0}
	maxRegs := s.maxRegs()
	n := srp.CmdHdrLen + srp.DirectDescLen
	if maxRegs > 1 {
		lp.bufFmt |= srp.BufFormatIndirect
		n = srp.CmdHdrLen + srp.IndirectHdrLen + maxRegs*srp.DirectDescLen
	}
	if lp.imm {
		n = max(n, srp.DefaultImmDataOffset+cfg.MaxImmediateData)
	}
	if cfg.MaxITIULen != 0 && uint32(n) > cfg.MaxITIULen {
		n = int(cfg.MaxITIULen)
	}
	lp.itIULen = uint32(n)
	return lp
}

func (s *Session) maxRegs() int {
	mrBytes := s.cfg.MaxPagesPerMR * pageSize
	n := min(s.cfg.CmdSGEntries, (s.cfg.MaxIOSize+mrBytes-1)/mrBytes)
	if s.cfg.DisableIndirect {
		n = 1
	}
	return n
}

// smallerIULen is the next IU length to try after a target found len too large: a ladder of
// immediate-data sizes (68 + 2^k) and then descriptor-only sizes, down to 64.
func smallerIULen(n uint32) uint32 {
	for _, c := range [...]uint32{8260, 4164, 2116, 1092, 580, 324, 196, 132, 100, 84, 64} {
		if c < n {
			return c
		}
	}
	return 0
}

// login connects c with a new QP and logs it in (loginMu held). multi selects MULTI-CHANNEL
// ACTION MULTI (keep the nexus' other channels) instead of SINGLE.
func (s *Session) login(ctx context.Context, c *channel, multi bool) error {
	cfg := &s.cfg
	for {
		lp := s.lp
		qp, err := c.newQP()
		if err != nil {
			return fmt.Errorf("initiator: channel %d: creating QP: %w", c.idx, err)
		}
		s.loginSeq++
		req := srp.LoginReq{
			ReqITIULen:      lp.itIULen,
			BufFmt:          lp.bufFmt,
			Flags:           srp.MultiChanSingle,
			InitiatorPortID: s.iport,
			TargetPortID:    cfg.TargetPortID,
		}
		binary.BigEndian.PutUint64(req.Tag[:], s.loginSeq)
		if multi {
			req.Flags = srp.MultiChanMulti
		}
		if lp.imm {
			req.Flags |= srp.ImmedRequested
			req.ImmDataOffset = srp.DefaultImmDataOffset
		}
		var buf [srp.LoginReqLen]byte
		var n int
		if cfg.LoginForm == LoginIBCM {
			n, err = req.Encode(buf[:])
		} else {
			n, err = req.EncodeRDMA(buf[:])
		}
		if err != nil {
			_ = qp.Close()
			return err
		}
		dctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
		conn, err := cfg.Dialer.Dial(dctx, qp, buf[:n], cfg.ConnParam)
		cancel()
		if err != nil {
			_ = qp.Close()
			var rej *transport.RejectError
			if !errors.As(err, &rej) {
				return fmt.Errorf("initiator: channel %d: connecting: %w", c.idx, err)
			}
			lre := &LoginRejectError{Channel: c.idx, CMReason: rej.Reason, ReqITIULen: lp.itIULen}
			if lr, perr := srp.ParseLoginRej(rej.PrivateData); perr == nil {
				lre.Reason, lre.BufFmt = lr.Reason(), lr.BufFmt()
			}
			switch lre.Reason {
			case srp.RejITIULenTooLarge:
				if next := smallerIULen(lp.itIULen); next != 0 {
					s.log.Info("target refuses the IU length; negotiating down", zap.Int("ch", c.idx),
						zap.Uint32("rejected", lp.itIULen), zap.Uint32("next", next))
					s.lp.itIULen = next
					continue
				}
			case srp.RejUnsupportedDescFormat:
				if lp.bufFmt&srp.BufFormatIndirect != 0 && (lre.BufFmt == 0 || lre.BufFmt&srp.BufFormatDirect != 0) {
					s.log.Info("target refuses indirect descriptors; retrying with direct descriptors only", zap.Int("ch", c.idx))
					s.lp.bufFmt = srp.BufFormatDirect
					continue
				}
			}
			return lre
		}
		p, err := s.checkLoginRsp(conn.PrivateData(), &req)
		if err == nil {
			err = c.activate(qp, conn, p)
		}
		if err != nil {
			_ = conn.Disconnect(nil)
			_ = qp.Close()
			if c.qp == qp {
				c.qp, c.conn, c.events = nil, nil, nil
			}
			return fmt.Errorf("initiator: channel %d: %w", c.idx, err)
		}
		c.log.Info("channel logged in", zap.Uint32("qpn", qp.QPN()), zap.Bool("multi", multi),
			zap.Int32("credits", p.credits), zap.Int("max_it_iu_len", p.txIULen), zap.Int("max_ti_iu_len", p.rxIULen),
			zap.Int("max_descriptors", p.maxDescs), zap.Int("max_immediate", p.maxImm))
		return nil
	}
}

// checkLoginRsp validates an SRP_LOGIN_RSP and derives the connection's parameters.
func (s *Session) checkLoginRsp(b []byte, req *srp.LoginReq) (connParams, error) {
	var p connParams
	rsp, err := srp.ParseLoginRsp(b)
	if err != nil {
		return p, fmt.Errorf("%w: %w", ErrLogin, err)
	}
	if rsp.Tag() != req.Tag {
		return p, fmt.Errorf("%w: tag %v, want %v", ErrLogin, rsp.Tag(), req.Tag)
	}
	if rsp.BufFmt()&srp.BufFormatDirect == 0 {
		return p, fmt.Errorf("%w: the target does not support direct descriptors (formats %#x)", ErrLogin, rsp.BufFmt())
	}
	tx := int(req.ReqITIULen)
	if m := int(rsp.MaxITIULen()); m < tx {
		tx = m // the target accepts less than we asked for: respect it
	}
	if tx < minITIULen {
		return p, fmt.Errorf("%w: MAX IT IU LEN %d is below %d", ErrLogin, tx, minITIULen)
	}
	rx := int(rsp.MaxTIIULen())
	if rx < srp.RspHdrLen+4 {
		return p, fmt.Errorf("%w: MAX TI IU LEN %d is too small for a response", ErrLogin, rx)
	}
	p.txIULen, p.rxIULen = tx, min(rx, maxTIIULen)
	p.maxDescs = 1
	if req.BufFmt&rsp.BufFmt()&srp.BufFormatIndirect != 0 {
		p.maxDescs = max(1, min(s.maxRegs(), (tx-srp.CmdHdrLen-srp.IndirectHdrLen)/srp.DirectDescLen))
	}
	if req.Flags&srp.ImmedRequested != 0 && rsp.Flags()&srp.ImmedSupported != 0 {
		p.maxImm = max(0, min(s.cfg.MaxImmediateData, tx-srp.DefaultImmDataOffset))
	}
	p.credits = max(rsp.ReqLimDelta(), 0)
	return p, nil
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

// InitiatorPortID is the initiator port identifier the session logs in with.
func (s *Session) InitiatorPortID() srp.PortID { return s.iport }

// Stats returns a snapshot of the session's counters.
func (s *Session) Stats() Stats {
	c := &s.stats
	return Stats{
		Commands: c.commands.Load(), ImmediateData: c.imm.Load(), Direct: c.direct.Load(), Retries: c.retries.Load(),
		UnitAttentions: c.uas.Load(), Timeouts: c.timeouts.Load(), Aborts: c.aborts.Load(),
		LUNResets: c.lunResets.Load(), TaskMgmt: c.taskMgmt.Load(), Reconnects: c.reconnects.Load(),
		CreditWaits: c.creditWaits.Load(), StaleResponses: c.staleRsps.Load(), CredReqs: c.credReqs.Load(),
		AerReqs: c.aerReqs.Load(), HandlerBatches: c.handlerBatches.Load(), LiveChannels: s.liveChannels(),
		BytesRead: c.bytesRead.Load(), BytesWritten: c.bytesWritten.Load(),
	}
}

// Close logs out: new I/O fails with ErrClosed, commands in flight are given until ctx is done to
// complete, then every channel is disconnected and the session's resources are released.
func (s *Session) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.termErr == nil {
		s.termErr = ErrClosed
	}
	if s.state != StateLost {
		s.state = StateClosed
	}
	if s.ffTimer != nil {
		s.ffTimer.Stop()
	}
	if s.dlTimer != nil {
		s.dlTimer.Stop()
	}
	s.broadcastLocked()
	s.mu.Unlock()
	// Let commands in flight finish.
	for s.busy() {
		select {
		case <-ctx.Done():
			s.log.Warn("closing with commands in flight", zap.Error(ctx.Err()))
			s.shutdown()
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	s.shutdown()
	return nil
}

// busy reports whether any request slot is in use.
func (s *Session) busy() bool {
	for _, c := range s.chans {
		if len(c.free) != cap(c.free) {
			return true
		}
	}
	return false
}

// shutdown stops every channel (disconnecting it) and releases the resources. Idempotent.
func (s *Session) shutdown() {
	s.shutOnce.Do(func() {
		s.cancel()
		for _, c := range s.chans {
			close(c.stop)
		}
		for _, c := range s.chans {
			<-c.exited
		}
		// Wait for callers to give their slots back (they are woken by the teardown).
		deadline := time.Now().Add(s.cfg.TeardownTimeout)
		for s.busy() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if s.busy() {
			s.log.Warn("releasing the session while callers still hold request slots")
		}
		for _, c := range s.chans {
			c.release()
		}
		s.log.Info("session closed", zap.Error(s.Err()))
		close(s.done)
	})
	<-s.done
}

// now is the session's clock for command deadlines (monotonic).
func (s *Session) now() time.Duration { return time.Since(s.epoch) }

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

// ---- asynchronous commands ----

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

// watchdogTick is the watchdog's period for a command timeout d: d/16, within [1 ms, 250 ms].
func watchdogTick(d time.Duration) time.Duration {
	return min(max(d/16, time.Millisecond), 250*time.Millisecond)
}

// ---- request slots ----

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

// ---- command execution ----

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
	*sp = cmdSpec{op: j.op, lun: j.lun, lunAddr: j.lunAddr, cdbLen: 16, n: n, lba: lba}
	if j.write {
		sp.cdb[0] = 0x8a // WRITE(16)
		if j.fua {
			sp.cdb[1] = 0x08
		}
		sp.dir = dirOut
		if j.zero {
			sp.zero = true
		} else {
			sp.buf = j.buf[ck.off : ck.off+n]
		}
	} else {
		sp.cdb[0] = 0x88 // READ(16)
		sp.dir = dirIn
		sp.buf = j.buf[ck.off : ck.off+n]
	}
	binary.BigEndian.PutUint64(sp.cdb[2:], lba)
	binary.BigEndian.PutUint32(sp.cdb[10:], uint32(n/j.bs))
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
