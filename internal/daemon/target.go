package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/scsi/backend"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/target"
	"github.com/srpd/srpd/transport"
)

// ---------------------------------------------------------------------------------------------
// LUNs

// lunRT is an open LUN: its backend (wrapped to time the I/O) and the SCSI logical unit. One
// lunRT outlives restarts of its target when its configuration does not change, so that its
// reservations, unit attentions and file lock carry over.
type lunRT struct {
	cfg      config.LUN
	lun      *scsi.LUN
	capacity int64
	io       *ioTimes
}

// ioTimes are the backend's latency histograms.
type ioTimes struct {
	read, write, flush histogram
}

// timedBackend times a backend's reads, writes and flushes (no allocation per call).
type timedBackend struct {
	backend.Backend
	t *ioTimes
}

func (b *timedBackend) ReadAt(p []byte, off int64) (int, error) {
	t0 := time.Now()
	n, err := b.Backend.ReadAt(p, off)
	b.t.read.observe(time.Since(t0))
	return n, err
}

func (b *timedBackend) WriteAt(p []byte, off int64) (int, error) {
	t0 := time.Now()
	n, err := b.Backend.WriteAt(p, off)
	b.t.write.observe(time.Since(t0))
	return n, err
}

func (b *timedBackend) Flush() error {
	t0 := time.Now()
	err := b.Backend.Flush()
	b.t.flush.observe(time.Since(t0))
	return err
}

// defaultSerial is the unit serial number of a LUN without one: the target port ID and the LUN
// number, stable across restarts (the NAA identifier derives from it).
func defaultSerial(portID config.PortID, id int) string {
	return fmt.Sprintf("%016x%016x-%d", portID.IDExt(), portID.GUID(), id)
}

// openLUN opens the backend of l and creates the logical unit. g, when not nil, vets a file or
// blockdev path before the open and the opened file before it is resized or used (see
// lunGuard); symlinks are refused in every component unless l.FollowSymlinks.
func openLUN(t *config.Target, l config.LUN, g *lunGuard) (*lunRT, error) {
	var (
		be  backend.Backend
		err error
	)
	var admit func(backend.Identity) error
	if g != nil && l.Backend != config.BackendRAM {
		if err := g.check(t, &l); err != nil {
			return nil, err
		}
		admit = g.admit(t, &l)
	}
	switch l.Backend {
	case config.BackendRAM:
		be, err = backend.NewRAM(int64(l.Size), l.ReadOnly)
	case config.BackendFile:
		be, err = backend.OpenFile(l.Path, backend.FileOptions{ReadOnly: l.ReadOnly, Create: l.Create,
			Size: int64(l.Size), Direct: l.Direct, NoSymlinks: !l.FollowSymlinks, Admit: admit})
	case config.BackendBlockDev:
		be, err = backend.OpenBlockDev(l.Path, backend.BlockDevOptions{ReadOnly: l.ReadOnly, Direct: l.Direct,
			NoSymlinks: !l.FollowSymlinks, Admit: admit})
	case config.BackendRBD:
		be, err = openRBD(l)
	default:
		err = fmt.Errorf("unknown backend %q: %w", l.Backend, ctlapi.ErrInvalidArgument)
	}
	if err != nil {
		var pe *LUNPathError
		switch {
		case errors.As(err, &pe):
			return nil, pe
		case errors.Is(err, backend.ErrSymlink):
			return nil, &LUNPathError{Target: t.Name, LUN: l.ID, Path: l.Path, Err: backend.ErrSymlink,
				Reason: "has a symbolic link in its path; set follow_symlinks: true on the LUN to allow it"}
		}
		return nil, fmt.Errorf("target %s: LUN %d: %w", t.Name, l.ID, classifyOpenError(err))
	}
	serial := l.Serial
	if serial == "" {
		serial = defaultSerial(t.PortID, l.ID)
	}
	times := &ioTimes{}
	lun, err := scsi.NewLUN(scsi.LUNConfig{BlockSize: l.BlockSize, ReadOnly: l.ReadOnly, Serial: serial},
		&timedBackend{Backend: be, t: times})
	if err != nil {
		_ = be.Close()
		return nil, fmt.Errorf("target %s: LUN %d: %w", t.Name, l.ID, err)
	}
	return &lunRT{cfg: l, lun: lun, capacity: be.Size(), io: times}, nil
}

func (l *lunRT) close(log *zap.Logger) {
	if err := l.lun.Close(); err != nil {
		log.Warn("closing LUN", zap.Int("lun", l.cfg.ID), zap.Error(err))
	}
}

// ---------------------------------------------------------------------------------------------
// Targets

// targetRT is a running target: the SRP target port, its LUNs, and the RDMA CM listeners whose
// connection requests target.Serve answers. Serve hands every channel it establishes back
// (target.Config.OnChannel), so that the daemon holds a handle on each: session kill, the
// remote address and login time of each session.
type targetRT struct {
	cfg    config.Target
	tr     *transportRT
	log    *zap.Logger
	luns   map[int]*lunRT
	tgt    *target.Target
	lns    []transport.Listener
	listen []string

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // accept loops and login handlers

	mu    sync.Mutex
	chans map[srp.PortID][]*chanRec
	ids   map[uint64]uint64 // the target's session number → the daemon's (unique across restarts)
	seq   *atomic.Uint64    // the daemon's session numbers

}

// chanRec is an established channel of an initiator.
type chanRec struct {
	ch     *target.Channel
	remote netip.AddrPort
	at     time.Time
}

// targetConfig maps the configuration of t onto the target package's: every ACL with an
// initiator becomes a target.ACL with its LUN view; "*" becomes the default ACL.
func targetConfig(t *config.Target, luns map[int]*lunRT, log *zap.Logger) target.Config {
	imm := t.Limits.ImmediateData == nil || *t.Limits.ImmediateData
	cfg := target.Config{
		Name: t.Name, PortID: t.PortID.SRP(), Logger: log,
		Limits: target.Limits{
			MaxChannels: t.Limits.MaxChannels, QueueDepth: t.Limits.QueueDepth,
			MaxITIULen: uint32(t.Limits.MaxITIULen), MaxTIIULen: uint32(t.Limits.MaxTIIULen),
			DisableImmediateData: !imm,
			MaxSessions:          t.Limits.MaxSessions,
			MaxMemory:            int64(t.Limits.MaxRegisteredMemory),
			KeepAliveInterval:    timeoutOrOff(t.Limits.KeepaliveInterval),
			StallTimeout:         timeoutOrOff(t.Limits.StallTimeout),
		},
	}
	if t.Limits.StallAction == config.StallLog {
		cfg.Limits.StallAction = target.StallLog
	}
	for _, a := range t.ACLs {
		ta := target.ACL{Name: a.Initiator.String(), Initiator: a.Initiator.ID.SRP()}
		ids := make([]int, 0, len(luns))
		for id := range luns {
			if a.Visible(id) {
				ids = append(ids, id)
			}
		}
		sort.Ints(ids)
		for _, id := range ids {
			ta.LUNs = append(ta.LUNs, target.LUNMapping{Number: uint16(id), LUN: luns[id].lun, ReadOnly: a.ReadOnly})
		}
		if a.Initiator.Any {
			ta.Name = "*"
			cfg.DefaultACL = &ta
		} else {
			cfg.ACLs = append(cfg.ACLs, ta)
		}
	}
	return cfg
}

// timeoutOrOff maps an optional timeout onto the target package's convention: 0 for the
// default (omitted), negative for off.
func timeoutOrOff(t *config.Timeout) time.Duration {
	switch {
	case t == nil:
		return 0
	case t.Off():
		return -1
	}
	return t.Duration()
}

// startTarget opens the LUNs of cfg (reusing those in keep), creates the target and starts
// listening. On failure everything it opened is closed again; kept LUNs are left to the caller.
func (d *Daemon) startTarget(cfg config.Target, tr *transportRT, keep map[int]*lunRT, guard *lunGuard) (_ *targetRT, err error) {
	log := d.log.With(zap.String("target", cfg.Name))
	t := &targetRT{cfg: cfg, tr: tr, log: log, luns: map[int]*lunRT{}, chans: map[srp.PortID][]*chanRec{},
		ids: map[uint64]uint64{}, seq: &d.sessionSeq}
	var opened []*lunRT
	defer func() {
		if err != nil {
			for _, ln := range t.lns {
				_ = ln.Close()
			}
			for _, l := range opened {
				l.close(log)
			}
		}
	}()
	for _, l := range cfg.LUNs {
		if k := keep[l.ID]; k != nil {
			t.luns[l.ID] = k
			continue
		}
		lr, err := openLUN(&cfg, l, guard)
		if err != nil {
			return nil, err
		}
		opened = append(opened, lr)
		t.luns[l.ID] = lr
		log.Info("LUN open", zap.Int("lun", l.ID), zap.String("backend", l.Backend), zap.String("path", l.Path),
			zap.Int64("capacity", lr.capacity), zap.Int("block_size", l.BlockSize), zap.Bool("read_only", l.ReadOnly))
	}
	tcfg := targetConfig(&cfg, t.luns, d.log)
	tcfg.Budget = d.budget
	tcfg.OnChannel = t.established
	tgt, err := target.New(tcfg)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", cfg.Name, err)
	}
	t.tgt = tgt
	var addrs []netip.Addr
	for _, a := range cfg.Listen {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return nil, fmt.Errorf("target %s: listen %q: %w", cfg.Name, a, err)
		}
		addrs = append(addrs, ip.Unmap())
	}
	if len(addrs) == 0 {
		if b := tr.bound.Addr(); tr.bound.IsValid() && b.IsUnspecified() {
			addrs = []netip.Addr{b}
		} else {
			addrs = tr.addrs()
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("target %s: transport %s (device %s) has no IP address to listen on: %w",
				cfg.Name, tr.cfg.Name, tr.dev.Name(), ctlapi.ErrUnavailable)
		}
	}
	for _, a := range addrs {
		ln, err := tr.cm.Listen(a, uint16(cfg.CMPort))
		if err != nil {
			return nil, fmt.Errorf("target %s: listen on %v port %d: %w", cfg.Name, a, cfg.CMPort, err)
		}
		t.lns = append(t.lns, ln)
		t.listen = append(t.listen, netip.AddrPortFrom(a, uint16(cfg.CMPort)).String())
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	for _, ln := range t.lns {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			if err := tgt.Serve(t.ctx, ln, tr.dev); err != nil && t.ctx.Err() == nil && !errors.Is(err, transport.ErrClosed) {
				t.log.Error("accepting connection requests", zap.Error(err))
			}
		}()
	}
	log.Info("target listening", zap.Stringer("port_id", cfg.PortID), zap.Strings("listen", t.listen),
		zap.Int("luns", len(t.luns)), zap.Int("acls", len(cfg.ACLs)))
	return t, nil
}

// established records a channel that target.Serve has established (Config.OnChannel).
func (t *targetRT) established(ch *target.Channel, ini srp.PortID, remote netip.AddrPort) {
	rec := &chanRec{ch: ch, remote: remote, at: time.Now()}
	t.mu.Lock()
	t.chans[ini] = append(t.chans[ini], rec)
	t.mu.Unlock()
	t.log.Debug("channel up", zap.Stringer("initiator", ini), zap.Stringer("remote", remote),
		zap.Uint64("channel", ch.ID()), zap.Uint32("qpn", ch.QPN()))
	t.wg.Add(1) // Serve's count of this login is still held: Add cannot race with stop's Wait reaching 0
	go func() {
		defer t.wg.Done()
		<-ch.Done()
		t.forget(ini, rec)
	}()
}

// forget drops a channel that has stopped.
func (t *targetRT) forget(ini srp.PortID, rec *chanRec) {
	ch := rec.ch
	t.mu.Lock()
	rs := t.chans[ini]
	for i, r := range rs {
		if r == rec {
			rs = append(rs[:i], rs[i+1:]...)
			break
		}
	}
	if len(rs) == 0 {
		delete(t.chans, ini)
	} else {
		t.chans[ini] = rs
	}
	t.mu.Unlock()
	t.log.Debug("channel gone", zap.Stringer("initiator", ini), zap.Uint64("channel", ch.ID()), zap.Uint32("qpn", ch.QPN()))
}

// stop drains the target: no new logins, SRP_T_LOGOUT and a disconnect to every channel, the
// commands in flight finished (bounded by ctx). LUNs in keep stay open; the others are closed.
func (t *targetRT) stop(ctx context.Context, keep map[int]*lunRT) {
	t.cancel()
	for _, ln := range t.lns {
		_ = ln.Close()
	}
	if err := t.tgt.Close(ctx); err != nil {
		t.log.Warn("target drain did not finish in time", zap.Error(err))
	}
	waitCtx(ctx, &t.wg)
	for id, l := range t.luns {
		if keep[id] != l {
			l.close(t.log)
		}
	}
	t.log.Info("target stopped")
}

// waitCtx waits for wg, or until ctx is done.
func waitCtx(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// sessionID names a session in the API: target name, '.', a number the daemon gives each
// session once (a restarted target's sessions get new numbers).
func sessionID(target string, n uint64) string { return fmt.Sprintf("%s.%d", target, n) }

// number returns the daemon's number of the target's session id (t.mu held).
func (t *targetRT) numberLocked(id uint64) uint64 {
	n, ok := t.ids[id]
	if !ok {
		n = t.seq.Add(1)
		t.ids[id] = n
	}
	return n
}

func (t *targetRT) sessionInfos() []ctlapi.SessionInfo {
	stats := t.tgt.Sessions()
	sort.Slice(stats, func(i, j int) bool { return stats[i].ID < stats[j].ID })
	t.mu.Lock()
	defer t.mu.Unlock()
	live := make(map[uint64]bool, len(stats))
	for _, ss := range stats {
		live[ss.ID] = true
	}
	for id := range t.ids {
		if !live[id] {
			delete(t.ids, id)
		}
	}
	out := make([]ctlapi.SessionInfo, 0, len(stats))
	for _, ss := range stats {
		si := ctlapi.SessionInfo{
			ID: sessionID(t.cfg.Name, t.numberLocked(ss.ID)), Target: t.cfg.Name, Initiator: config.PortID(ss.Initiator),
			Channels: len(ss.Channels), State: ctlapi.StateLoggedIn,
			Stats: ctlapi.IOStats{Commands: ss.Commands, ReadBytes: ss.BytesIn, WriteBytes: ss.BytesOut,
				Errors: ss.Errors, TaskMgmt: ss.TaskMgmt},
			LUNs: []int{},
		}
		if len(ss.Channels) > 0 {
			c := ss.Channels[0]
			si.QueueDepth, si.MaxITIULen, si.MaxTIIULen, si.ImmediateData = c.QueueDepth, c.MaxITIULen, c.MaxTIIULen, c.ImmDataOffset > 0
		}
		for _, r := range t.chans[ss.Initiator] {
			if si.Remote == "" {
				si.Remote = r.remote.String()
			}
			if si.LoginAt.IsZero() || r.at.Before(si.LoginAt) {
				si.LoginAt = r.at
			}
		}
		if a := t.cfg.Admit(config.PortID(ss.Initiator)); a != nil {
			si.ReadOnly = a.ReadOnly
			for _, l := range t.cfg.LUNs {
				if a.Visible(l.ID) {
					si.LUNs = append(si.LUNs, l.ID)
				}
			}
		}
		out = append(out, si)
	}
	return out
}

// kill logs the initiator of session n (the daemon's number) out: SRP_T_LOGOUT and a
// disconnect on each of its channels.
func (t *targetRT) kill(ctx context.Context, n uint64) (bool, error) {
	var ini srp.PortID
	found := false
	stats := t.tgt.Sessions()
	t.mu.Lock()
	for _, ss := range stats {
		if t.numberLocked(ss.ID) == n {
			ini, found = ss.Initiator, true
		}
	}
	recs := append([]*chanRec(nil), t.chans[ini]...)
	t.mu.Unlock()
	if !found {
		return false, nil
	}
	if len(recs) == 0 {
		return true, fmt.Errorf("session %s has no established channel to close yet: %w", sessionID(t.cfg.Name, n), ctlapi.ErrConflict)
	}
	errs := make(chan error, len(recs))
	for _, r := range recs {
		go func() { errs <- r.ch.Close(ctx) }()
	}
	var err error
	for range recs {
		err = errors.Join(err, <-errs)
	}
	t.log.Info("session killed", zap.Stringer("initiator", ini), zap.String("session", sessionID(t.cfg.Name, n)), zap.Int("channels", len(recs)))
	return true, err
}

func (t *targetRT) info() ctlapi.TargetInfo {
	info := ctlapi.TargetInfo{Name: t.cfg.Name, Transport: t.cfg.Transport, PortID: t.cfg.PortID, Listen: t.listen,
		State: ctlapi.StateListening, Limits: t.cfg.Limits, LUNs: t.lunInfos(), ACLs: t.aclInfos(),
		Sessions: int(t.tgt.Stats().Sessions)}
	return info
}

func (t *targetRT) lunInfos() []ctlapi.LUNInfo {
	out := []ctlapi.LUNInfo{}
	for _, l := range t.cfg.LUNs {
		li := ctlapi.LUNInfo{LUN: l, State: ctlapi.StateUp}
		if lr := t.luns[l.ID]; lr != nil {
			li.Capacity = lr.capacity
		}
		out = append(out, li)
	}
	return out
}

func (t *targetRT) aclInfos() []ctlapi.ACLInfo {
	stats := t.tgt.Sessions()
	out := []ctlapi.ACLInfo{}
	for _, a := range t.cfg.ACLs {
		ai := ctlapi.ACLInfo{ACL: a}
		for _, ss := range stats {
			if adm := t.cfg.Admit(config.PortID(ss.Initiator)); adm != nil && adm.Initiator == a.Initiator {
				ai.Sessions++
			}
		}
		out = append(out, ai)
	}
	return out
}

// budgetConfig maps the daemon-wide limits onto the target package's budget. An omitted
// max_registered_memory is half of the machine's memory: registered memory is pinned on a
// hardware RNIC, and softroce touches it as channels run.
func budgetConfig(l *config.GlobalLimits) target.BudgetConfig {
	c := target.BudgetConfig{
		MaxSessions:             l.MaxSessions,
		MaxSessionsPerInitiator: l.MaxSessionsPerInitiator,
		MaxMemory:               int64(l.MaxRegisteredMemory),
		MaxPendingLogins:        l.MaxPendingLogins,
		MaxPendingPerSource:     l.MaxPendingLoginsPerSource,
		LoginTimeout:            time.Duration(l.LoginTimeout),
	}
	if l.LoginRatePerSource > 0 {
		c.LoginRate = float64(l.LoginRatePerSource)
		c.LoginBurst = 6 * l.LoginRatePerSource
	}
	if c.MaxMemory == 0 {
		c.MaxMemory = memTotal() / 2
	}
	return c
}

// memTotal is /proc/meminfo's MemTotal in bytes, or 0 if it cannot be read.
func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}
