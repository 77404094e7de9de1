package initiator

import (
	"context"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

const pageSize = 4096

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
	Rescans        uint64 // background rescans after unit attentions (LUNs or capacity changed)
	// RemoteInvalidations counts registrations the target invalidated with its response
	// (SEND_WITH_INV; Config.DisableRemoteInvalidate): each saved a LOCAL_INV.
	RemoteInvalidations uint64
	LiveChannels        int
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
	handlerBatches, rescans, remoteInvs                                        atomic.Uint64
	bytesRead, bytesWritten                                                    atomic.Uint64
}

// Session is an SRP initiator session with one target port: ChCount RDMA channels, their
// request tables and credits, reconnection, and the logical units found on the target.
// All methods are safe for concurrent use.
type Session struct {
	// Set by Dial, then read-only.
	cfg   Config
	log   *zap.Logger
	chans []*channel
	// batchers are the devices of the channels (their queues) that batch posts
	// (transport.PostBatcher): LUN.BeginPosts brackets them all.
	batchers []transport.PostBatcher
	iport    srp.PortID
	epoch    time.Time       // origin of now()
	ctx      context.Context // cancelled when the session closes or is lost
	cancel   context.CancelFunc
	done     chan struct{} // closed when the session has shut down
	shutOnce sync.Once     // shutdown's

	// Read without a lock.
	rr    atomic.Uint32 // round robin over the channels (request.go)
	stats counters

	// mu guards the session's state and its timers (rport.go).
	mu          sync.Mutex
	state       State
	live        int           // channels up
	changed     chan struct{} // closed (and replaced) on every state or channel change
	ffTimer     *time.Timer
	dlTimer     *time.Timer
	termErr     error // ErrClosed / ErrSessionLost once terminal
	everRunning bool

	// loginMu serializes logins and guards what they negotiate (login.go).
	loginMu  sync.Mutex
	lp       loginParams
	loginSeq uint64

	// ehMu: one LOGICAL UNIT RESET at a time (eh.go).
	ehMu sync.Mutex

	// lunMu guards the logical units (lun.go).
	lunMu sync.RWMutex
	luns  []*LUN

	// The background rescan after unit attentions (rescan.go).
	rescanState atomic.Int32
	rescanWG    sync.WaitGroup
	rescanMu    sync.Mutex // guards rescanStop and the WaitGroup's Add against shutdown's Wait
	rescanStop  bool

	bufs bufSet // AllocBuffer's Buffers (own lock; buffer.go)
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
		if b, ok := c.dev.(transport.PostBatcher); ok && !slices.Contains(s.batchers, b) {
			s.batchers = append(s.batchers, b)
		}
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
		BytesRead: c.bytesRead.Load(), BytesWritten: c.bytesWritten.Load(), Rescans: c.rescans.Load(),
		RemoteInvalidations: c.remoteInvs.Load(),
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
		s.rescanMu.Lock()
		s.rescanStop = true
		s.rescanMu.Unlock()
		s.rescanWG.Wait() // its commands fail now: the session's context is cancelled
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
