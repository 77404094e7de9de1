package target

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// ErrClosed is returned by a Target that has been closed.
var ErrClosed = errors.New("target: closed")

// Target is an SRP target port: it decides logins, runs the channels of its sessions and
// dispatches their commands to the LUNs of each initiator's view. All methods are safe for
// concurrent use.
type Target struct {
	name   string
	portID srp.PortID
	lim    atomic.Pointer[Limits] // limits(): replaced whole by Reconfigure
	log    *zap.Logger

	mu       sync.Mutex
	acls     map[srp.PortID]*view
	defView  *view
	sessions map[srp.PortID]*session // live sessions by initiator port
	closing  bool
	closeCh  chan struct{}                // closed by Close
	pending  map[*PendingChannel]struct{} // logins accepted, channel not yet established
	queues   map[*scsi.LUN]*lunQueue
	noLUN    *lunQueue
	nextID   uint64
	nSess    int   // sessions holding a session slot (Limits.MaxSessions)
	memUsed  int64 // registered memory reserved by channels (Limits.MaxMemory)

	budget    *Budget
	onChannel func(ch *Channel, initiator srp.PortID, remote netip.AddrPort)
	rejLog    rateLog // login rejections, logged once per source and cause per interval
	acceptLog rateLog // logins whose connection did not complete

	loops   sync.WaitGroup // channel loops
	workers sync.WaitGroup // LUN workers
	reapers sync.WaitGroup // memory reapers of timed-out channels
	serving sync.WaitGroup // Serve login handlers

	stats targetCounters
}

// session is an I_T nexus with its channels.
type session struct {
	id        uint64
	initiator srp.PortID
	nexus     scsi.Nexus
	view      *view
	log       *zap.Logger
	channels  []*channel    // live and pending channels; guarded by Target.mu
	reserved  int           // logins accepted whose channel is not yet attached
	ended     bool          // no longer the nexus' current session
	lost      bool          // NexusLost has been reported
	slot      bool          // holds a session slot of the target and the budget
	closed    sessionTotals // counters of channels gone; guarded by Target.mu
}

// New creates a target.
func New(cfg Config) (*Target, error) {
	if cfg.PortID == (srp.PortID{}) {
		return nil, errNoPortID
	}
	lim := cfg.Limits.withDefaults()
	if err := lim.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	name := cfg.Name
	if name == "" {
		name = cfg.PortID.String()
	}
	t := &Target{
		name:      name,
		portID:    cfg.PortID,
		log:       log.With(zap.String("target", name)),
		acls:      make(map[srp.PortID]*view),
		sessions:  make(map[srp.PortID]*session),
		queues:    make(map[*scsi.LUN]*lunQueue),
		pending:   make(map[*PendingChannel]struct{}),
		closeCh:   make(chan struct{}),
		budget:    cfg.Budget,
		onChannel: cfg.OnChannel,
	}
	t.lim.Store(&lim)
	if t.budget == nil {
		t.budget = NewBudget(BudgetConfig{})
	}
	t.noLUN = newLUNQueue(t, nil)
	for i := range cfg.ACLs {
		a := &cfg.ACLs[i]
		if _, dup := t.acls[a.Initiator]; dup {
			return nil, fmt.Errorf("target: two ACLs for initiator %v", a.Initiator)
		}
		v, err := compileACL(a, false)
		if err != nil {
			return nil, err
		}
		t.acls[a.Initiator] = v
	}
	if cfg.DefaultACL != nil {
		v, err := compileACL(cfg.DefaultACL, true)
		if err != nil {
			return nil, err
		}
		t.defView = v
	}
	return t, nil
}

// Name is the target's name.
func (t *Target) Name() string { return t.name }

// PortID is the target port identifier.
func (t *Target) PortID() srp.PortID { return t.portID }

// Limits are the effective limits (defaults filled in).
func (t *Target) Limits() Limits { return *t.limits() }

// limits are the target's current limits: what Reconfigure last set (an immutable snapshot).
// New logins negotiate with them; the channels logged in keep what they negotiated, and read
// the run-time bounds (keep-alive, stall action, logout and teardown timeouts) from here.
func (t *Target) limits() *Limits { return t.lim.Load() }

func (t *Target) queueFor(l *scsi.LUN) *lunQueue {
	if l == nil {
		return t.noLUN
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.queues[l]
	if q == nil {
		q = newLUNQueue(t, l)
		t.queues[l] = q
	}
	return q
}

func (t *Target) policyLocked() loginPolicy {
	return loginPolicy{portID: t.portID, lim: *t.limits(), acls: t.acls, defaultView: t.defView, closing: t.closing}
}

func (t *Target) existingLocked(ini srp.PortID) int {
	if s := t.sessions[ini]; s != nil {
		return len(s.channels) + s.reserved
	}
	return 0
}

// DecideLogin returns the decision Login would make for req now, without changing anything.
func (t *Target) DecideLogin(req srp.LoginReq, info ConnInfo) LoginDecision {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.policyLocked()
	return decideLogin(&p, &req, info, t.existingLocked(req.InitiatorPortID))
}

// PendingChannel is an accepted login whose channel resources exist (the QP in INIT with its
// receive ring posted) but whose connection is not established yet. The caller connects the
// QP (CM Accept, or out of band) and calls Establish, or Abort.
type PendingChannel struct {
	t    *Target
	ch   *channel
	d    LoginDecision
	rsp  [srp.LoginRspLen]byte
	once sync.Once
	used atomic.Bool
}

// QP is the channel's queue pair, to be connected to the initiator's.
func (p *PendingChannel) QP() transport.QP { return p.ch.qp }

// Decision is the login decision.
func (p *PendingChannel) Decision() LoginDecision { return p.d }

// LoginRsp is the encoded SRP_LOGIN_RSP (52 bytes) for the CM REP private data.
func (p *PendingChannel) LoginRsp() []byte { return p.rsp[:] }

// Establish starts the channel once its QP is connected (in RTS). conn, if not nil, is the CM
// connection: the channel watches it for a disconnect and disconnects it when closing.
func (p *PendingChannel) Establish(conn transport.CMConn) (*Channel, error) {
	if !p.used.CompareAndSwap(false, true) {
		return nil, errors.New("target: pending channel already established or aborted")
	}
	ch := p.ch
	ch.conn = conn
	t := p.t
	t.mu.Lock()
	if t.closing || ch.sess.ended {
		t.mu.Unlock()
		p.abort()
		return nil, ErrClosed
	}
	delete(t.pending, p)
	ch.sess.reserved--
	ch.sess.channels = append(ch.sess.channels, ch)
	t.loops.Add(1)
	t.mu.Unlock()
	t.stats.channels.Add(1)
	ch.log.Info("channel established", zap.Int("queue_depth", ch.depth), zap.Int("max_it_iu_len", ch.itLen),
		zap.Int("max_ti_iu_len", ch.tiLen), zap.Int("imm_data_offset", ch.immOff),
		zap.Bool("remote_invalidate", ch.remInv))
	go ch.run()
	return &Channel{ch: ch}, nil
}

// Abort releases a pending channel that will not be established.
func (p *PendingChannel) Abort() {
	if p.used.CompareAndSwap(false, true) {
		p.abort()
	}
}

func (p *PendingChannel) abort() {
	p.once.Do(func() {
		t := p.t
		ch := p.ch
		t.mu.Lock()
		delete(t.pending, p)
		ch.sess.reserved--
		t.endSessionIfEmptyLocked(ch.sess)
		t.mu.Unlock()
		ch.state.Store(uint32(chClosed))
		_ = ch.qp.Close()
		_ = ch.closePool()
		_ = ch.cq.Close()
		ch.why = "login aborted"
		ch.releaseMemory(nil)
		close(ch.done)
	})
}

// Login decides a login request and, if it is accepted, creates the channel's resources on
// dev. The returned decision is what to answer (LOGIN_RSP or LOGIN_REJ); a rejected login has
// no PendingChannel. A failure to create the resources turns the decision into a rejection
// with "insufficient resources" (0x00010001), and err tells why. A SINGLE login terminates the
// nexus' existing channels (SRP_T_LOGOUT "multi-channel action", then disconnect).
func (t *Target) Login(dev transport.Device, req srp.LoginReq, info ConnInfo) (*PendingChannel, LoginDecision, error) {
	return t.login(dev, req, info, nil)
}

// login is Login for a connection request that Serve admitted as pending login p. When the
// budget's registered memory is what stops it and half-open logins hold memory, it evicts
// enough of them (the oldest of the busiest source first), takes their reservations over and
// tries once more: reservations of forged requests must not keep a real login out. (A
// target's own max_registered_memory is not taken over: it counts until the evicted
// channels are gone.)
func (t *Target) login(dev transport.Device, req srp.LoginReq, info ConnInfo, p *pendingLogin) (*PendingChannel, LoginDecision, error) {
	retry := p != nil
	if !retry {
		return t.login1(dev, req, info, nil, true)
	}
	pc, d, err := t.login1(dev, req, info, p, false)
	deadline := time.Now().Add(memoryRetry)
	for d.Cause == CauseMemoryBudget && time.Now().Before(deadline) {
		if !t.budget.evictForMemory(d.memNeed, p) {
			if !t.budget.unrecordedMemory() {
				break // established channels hold the memory: a real rejection
			}
			time.Sleep(5 * time.Millisecond) // another login's channel is being created right now
		}
		pc, d, err = t.login1(dev, req, info, p, false)
	}
	if !d.Accepted {
		t.loginRejected(&req, info, &d, err)
	}
	return pc, d, err
}

// memoryRetry bounds how long a login keeps evicting half-open logins to get memory.
const memoryRetry = time.Second

func (t *Target) login1(dev transport.Device, req srp.LoginReq, info ConnInfo, pl *pendingLogin, report bool) (*PendingChannel, LoginDecision, error) {
	t.mu.Lock()
	p := t.policyLocked()
	d := decideLogin(&p, &req, info, t.existingLocked(req.InitiatorPortID))
	if !d.Accepted {
		t.mu.Unlock()
		if report {
			t.loginRejected(&req, info, &d, nil)
		}
		return nil, d, nil
	}
	s := t.sessions[req.InitiatorPortID]
	replace := s != nil && req.MultiChannel() == srp.MultiChanSingle && d.Terminate > 0
	// Admission, before anything changes: the channel's registered memory, then a session
	// slot if this login opens a session (a SINGLE login replacing its initiator's session
	// takes over the old one's slot).
	if c := t.admitLocked(dev, &req, &d, s == nil, pl); c != CauseNone {
		t.mu.Unlock()
		d = LoginDecision{Rej: srp.LoginRejFields{Reason: srp.RejInsufficientResources, Tag: req.Tag, BufFmt: t.limits().BufFormats},
			Cause: c, memNeed: d.memNeed}
		if report {
			t.loginRejected(&req, info, &d, nil)
		}
		return nil, d, nil
	}
	var old *session
	if replace {
		old = s
		old.ended = true
		delete(t.sessions, req.InitiatorPortID)
		s = nil
	}
	if s == nil {
		t.nextID++
		s = &session{
			id:        t.nextID,
			initiator: req.InitiatorPortID,
			nexus:     scsi.Nexus{InitiatorPortID: req.InitiatorPortID, TargetPortID: t.portID},
			view:      d.view,
			slot:      true,
		}
		if old != nil && old.slot {
			old.slot = false // handed over: the new session holds it
		}
		s.log = t.log.With(zap.Stringer("initiator", req.InitiatorPortID), zap.Uint64("session", s.id))
		s.view.set.Bind(s.nexus) // the view's changes concern this nexus (Reconfigure)
		t.sessions[req.InitiatorPortID] = s
		t.stats.sessions.Add(1)
	}
	s.reserved++
	t.nextID++
	id := t.nextID
	var terminate []*channel
	if old != nil {
		terminate = append(terminate, old.channels...)
	}
	t.mu.Unlock()

	for _, c := range terminate {
		c.requestClose(closeReq{logout: true, reason: srp.TLogoutMultiChannelAction,
			why: "terminated by a SINGLE login of the same initiator"})
	}
	if old != nil {
		t.mu.Lock()
		t.endSessionIfEmptyLocked(old)
		t.mu.Unlock()
	}

	ch, err := t.newChannel(dev, s, id, &d)
	if err != nil {
		t.putMemory(d.memory, pl)
		t.mu.Lock()
		s.reserved--
		t.endSessionIfEmptyLocked(s)
		t.mu.Unlock()
		d = LoginDecision{Rej: srp.LoginRejFields{Reason: srp.RejInsufficientResources, Tag: req.Tag, BufFmt: t.limits().BufFormats},
			Cause: CauseResources}
		if report {
			t.loginRejected(&req, info, &d, err)
		}
		return nil, d, err
	}
	if pl != nil {
		t.budget.setPendingMemory(pl, d.memory)
		ch.pend = pl
	}
	pc := &PendingChannel{t: t, ch: ch, d: d}
	if _, err := srp.LoginRsp(pc.rsp[:]).Encode(&d.Rsp); err != nil {
		pc.Abort()
		return nil, d, err
	}
	t.mu.Lock()
	if t.closing { // Close ran meanwhile and could not see this channel
		t.mu.Unlock()
		pc.Abort()
		d = LoginDecision{Rej: srp.LoginRejFields{Reason: srp.RejInsufficientResources, Tag: req.Tag, BufFmt: t.limits().BufFormats},
			Cause: CauseShuttingDown}
		if report {
			t.loginRejected(&req, info, &d, nil)
		}
		return nil, d, ErrClosed
	}
	t.pending[pc] = struct{}{}
	t.mu.Unlock()
	t.stats.loginsAccepted.Add(1)
	ch.log.Info("login accepted", zap.String("acl", d.ACL), zap.Stringer("remote", info.Remote),
		zap.Uint8("multichannel_result", uint8(d.Rsp.Flags&srp.MultiChanResultMask)), zap.Int("terminated", d.Terminate))
	return pc, d, nil
}

func (t *Target) loginRejected(req *srp.LoginReq, info ConnInfo, d *LoginDecision, err error) {
	t.stats.loginsRejected.Add(1)
	t.stats.rejects[d.Cause].Add(1)
	// A flood of logins must not become a flood of log lines: once per source and cause per
	// interval, with the number of rejections not logged since.
	ok, suppressed := t.rejLog.allow(info.Remote.Addr(), d.Cause, time.Now())
	if !ok {
		return
	}
	fields := []zap.Field{zap.Stringer("initiator", req.InitiatorPortID), zap.Stringer("remote", info.Remote),
		zap.Stringer("reason", d.Rej.Reason), zap.Stringer("cause", d.Cause)}
	if suppressed > 0 {
		fields = append(fields, zap.Int("not_logged_since", suppressed))
	}
	if err != nil {
		fields = append(fields, zap.Error(err))
	}
	t.log.Info("login rejected", fields...)
}

// endSessionIfEmptyLocked ends a session with no channel left: its nexus is lost (each LUN of
// the view reports I_T NEXUS LOSS OCCURRED to it next time).
func (t *Target) endSessionIfEmptyLocked(s *session) {
	if len(s.channels) > 0 || s.reserved > 0 || s.lost {
		return
	}
	if t.sessions[s.initiator] == s {
		delete(t.sessions, s.initiator)
	}
	s.ended, s.lost = true, true
	if s.slot {
		s.slot = false
		t.nSess--
		t.budget.putSession(s.initiator)
	}
	s.view.set.Unbind(s.nexus)
	s.view.set.NexusLost(s.nexus)
	t.stats.sessions.Add(-1)
}

// channelGone is called by a channel's loop when it has stopped.
func (t *Target) channelGone(ch *channel) {
	t.mu.Lock()
	s := ch.sess
	for i, c := range s.channels {
		if c == ch {
			s.channels = append(s.channels[:i], s.channels[i+1:]...)
			break
		}
	}
	snap := ch.snapshot()
	s.closed.add(snap)
	t.endSessionIfEmptyLocked(s)
	t.mu.Unlock()
	t.stats.channels.Add(-1)
	t.stats.closedChannels.Add(1)
	t.stats.commands.Add(snap.Commands)
	t.stats.bytesIn.Add(snap.BytesIn)
	t.stats.bytesOut.Add(snap.BytesOut)
	t.stats.errors.Add(snap.ErrorCount())
	close(ch.done)
}

// Close shuts the target down: new logins are rejected, every channel is sent SRP_T_LOGOUT
// (reason "no reason specified") and disconnected, and Close waits (bounded by ctx and each
// channel's teardown timeout) for the channels to drain.
func (t *Target) Close(ctx context.Context) error {
	t.mu.Lock()
	if !t.closing {
		t.closing = true
		close(t.closeCh)
	}
	var chs []*channel
	for _, s := range t.sessions {
		chs = append(chs, s.channels...)
	}
	var pcs []*PendingChannel
	for p := range t.pending {
		pcs = append(pcs, p)
	}
	t.mu.Unlock()
	for _, p := range pcs {
		p.Abort()
	}
	for _, ch := range chs {
		ch.requestClose(closeReq{logout: true, reason: srp.TLogoutNoReason, why: "target shutting down"})
	}
	done := make(chan struct{})
	go func() {
		t.serving.Wait()
		t.loops.Wait()
		t.workers.Wait()
		t.reapers.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	t.mu.Lock()
	for l, q := range t.queues {
		l.SetTaskAborter(q, nil) // the LUN may outlive the target (a live restart keeps it)
	}
	t.mu.Unlock()
	return nil
}

// Channel is a handle on an established channel.
type Channel struct{ ch *channel }

// ID is the channel's identifier (unique in the target).
func (c *Channel) ID() uint64 { return c.ch.id }

// QPN is the channel's local QP number.
func (c *Channel) QPN() uint32 { return c.ch.qp.QPN() }

// Done is closed when the channel has stopped (its transport resources released).
func (c *Channel) Done() <-chan struct{} { return c.ch.done }

// Close asks the channel to log the initiator out (SRP_T_LOGOUT, reason "inactive channel")
// and disconnect, and waits (bounded by ctx) until it has stopped.
func (c *Channel) Close(ctx context.Context) error {
	c.ch.requestClose(closeReq{logout: true, reason: srp.TLogoutInactive, why: "closed by the target"})
	select {
	case <-c.ch.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stats returns a snapshot of the channel's counters.
func (c *Channel) Stats() ChannelStats { return c.ch.snapshot() }
