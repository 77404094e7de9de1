package stack

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
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/target"
	"github.com/srpd/srpd/transport"
)

// Target is a running SRP target port: its LUNs, and the RDMA CM listeners whose connection
// requests target.Serve answers. Serve hands every channel it establishes back
// (target.Config.OnChannel), and Target keeps a record of each (Channels): who, from where,
// since when, and a handle to close it.
type Target struct {
	Config    config.Target
	Transport *Transport
	// Port is the SRP target port (package target).
	Port *target.Target
	// LUNs are the logical units by LUN number; Stop closes those it is not told to keep.
	LUNs map[int]*LUN
	// Listen are the addresses listened on, "ip:cm_port".
	Listen []string

	log    *zap.Logger
	lns    []transport.Listener
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // accept loops, and a watcher per established channel

	mu    sync.Mutex
	chans map[srp.PortID][]*Channel
}

// Channel is an established channel of an initiator.
type Channel struct {
	*target.Channel
	Initiator srp.PortID
	Remote    netip.AddrPort
	At        time.Time // when it was established
}

// TargetOptions are what starting a target takes beyond its configuration.
type TargetOptions struct {
	Logger *zap.Logger
	// Budget is the admission control the target shares with others (nil: one of its own).
	Budget *target.Budget
	// MaxTransfer is the data buffer per request slot in bytes (0: the target's default);
	// srpbench sweeps it.
	MaxTransfer int
}

// TargetConfig maps the configuration of t onto the target package's: every ACL with an
// initiator becomes a target.ACL with its LUN view; "*" becomes the default ACL.
func TargetConfig(t *config.Target, luns map[int]*LUN, log *zap.Logger) target.Config {
	imm := t.Limits.ImmediateData == nil || *t.Limits.ImmediateData
	cfg := target.Config{
		Name: t.Name, PortID: t.PortID.SRP(), Logger: log,
		Limits: target.Limits{
			MaxChannels: t.Limits.MaxChannels, QueueDepth: t.Limits.QueueDepth,
			MaxITIULen: uint32(t.Limits.MaxITIULen), MaxTIIULen: uint32(t.Limits.MaxTIIULen),
			DisableImmediateData:    !imm,
			DisableRemoteInvalidate: t.Limits.RemoteInvalidate != nil && !*t.Limits.RemoteInvalidate,
			MaxSessions:             t.Limits.MaxSessions,
			MaxMemory:               int64(t.Limits.MaxRegisteredMemory),
			KeepAliveInterval:       timeoutOrOff(t.Limits.KeepaliveInterval),
			StallTimeout:            timeoutOrOff(t.Limits.StallTimeout),
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
			ta.LUNs = append(ta.LUNs, target.LUNMapping{Number: uint16(id), LUN: luns[id].SCSI, ReadOnly: a.ReadOnly})
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

// StartTarget creates the target of cfg over luns (opened by the caller, e.g. with OpenLUN)
// and starts listening on tr: on cfg.Listen, or on every address of the transport (a wildcard
// softroce socket: its wildcard address). On failure it closes what it opened; luns stay the
// caller's. On success the target owns luns: Stop closes them.
func StartTarget(cfg config.Target, tr *Transport, luns map[int]*LUN, o TargetOptions) (_ *Target, err error) {
	base := o.Logger
	if base == nil {
		base = zap.NewNop()
	}
	log := base.With(zap.String("target", cfg.Name))
	t := &Target{Config: cfg, Transport: tr, LUNs: luns, log: log, chans: map[srp.PortID][]*Channel{}}
	defer func() {
		if err != nil {
			for _, ln := range t.lns {
				_ = ln.Close()
			}
		}
	}()
	tcfg := TargetConfig(&cfg, luns, base)
	tcfg.Budget = o.Budget
	tcfg.Limits.MaxTransfer = o.MaxTransfer
	tcfg.OnChannel = t.established
	tgt, err := target.New(tcfg)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", cfg.Name, err)
	}
	t.Port = tgt
	var addrs []netip.Addr
	for _, a := range cfg.Listen {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return nil, fmt.Errorf("target %s: listen %q: %w", cfg.Name, a, err)
		}
		addrs = append(addrs, ip.Unmap())
	}
	if len(addrs) == 0 {
		if b := tr.Bound.Addr(); tr.Bound.IsValid() && b.IsUnspecified() {
			addrs = []netip.Addr{b}
		} else {
			addrs = tr.Addrs()
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("target %s: transport %s (device %s) has no IP address to listen on: %w",
				cfg.Name, tr.Config.Name, tr.Device.Name(), ctlapi.ErrUnavailable)
		}
	}
	for _, a := range addrs {
		ln, err := tr.CM.Listen(a, uint16(cfg.CMPort))
		if err != nil {
			// The transports' Listen errors say "listen on" the address and port already.
			return nil, fmt.Errorf("target %s: %w", cfg.Name, err)
		}
		t.lns = append(t.lns, ln)
		t.Listen = append(t.Listen, netip.AddrPortFrom(a, uint16(cfg.CMPort)).String())
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	for _, ln := range t.lns {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			if err := tgt.Serve(t.ctx, ln, tr.Device); err != nil && t.ctx.Err() == nil && !errors.Is(err, transport.ErrClosed) {
				t.log.Error("accepting connection requests", zap.Error(err))
			}
		}()
	}
	log.Info("target listening", zap.Stringer("port_id", cfg.PortID), zap.Strings("listen", t.Listen),
		zap.Int("luns", len(luns)), zap.Int("acls", len(cfg.ACLs)))
	return t, nil
}

// established records a channel that target.Serve has established (Config.OnChannel).
func (t *Target) established(ch *target.Channel, ini srp.PortID, remote netip.AddrPort) {
	rec := &Channel{Channel: ch, Initiator: ini, Remote: remote, At: time.Now()}
	t.mu.Lock()
	t.chans[ini] = append(t.chans[ini], rec)
	t.mu.Unlock()
	t.log.Debug("channel up", zap.Stringer("initiator", ini), zap.Stringer("remote", remote),
		zap.Uint64("channel", ch.ID()), zap.Uint32("qpn", ch.QPN()))
	t.wg.Add(1) // Serve's count of this login is still held: Add cannot race with Stop's Wait reaching 0
	go func() {
		defer t.wg.Done()
		<-ch.Done()
		t.forget(rec)
	}()
}

// forget drops a channel that has stopped.
func (t *Target) forget(rec *Channel) {
	ini := rec.Initiator
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
	t.log.Debug("channel gone", zap.Stringer("initiator", ini), zap.Uint64("channel", rec.ID()), zap.Uint32("qpn", rec.QPN()))
}

// Channels returns the established channels of initiator ini.
func (t *Target) Channels(ini srp.PortID) []*Channel {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]*Channel(nil), t.chans[ini]...)
}

// StopAccepting closes the listeners: no new logins; the channels keep running.
func (t *Target) StopAccepting() {
	t.cancel()
	for _, ln := range t.lns {
		_ = ln.Close()
	}
}

// Stop drains the target: no new logins, SRP_T_LOGOUT and a disconnect to every channel, the
// commands in flight finished (bounded by ctx). LUNs for which keep reports true stay open
// (keep may be nil); the others are closed.
func (t *Target) Stop(ctx context.Context, keep func(id int) bool) {
	t.StopAccepting()
	if err := t.Port.Close(ctx); err != nil {
		t.log.Warn("target drain did not finish in time", zap.Error(err))
	}
	waitCtx(ctx, &t.wg)
	for id, l := range t.LUNs {
		if keep == nil || !keep(id) {
			if err := l.Close(); err != nil {
				t.log.Warn("closing LUN", zap.Int("lun", id), zap.Error(err))
			}
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

// BudgetConfig maps the daemon-wide limits onto the target package's budget. An omitted
// max_registered_memory is half of the machine's memory: registered memory is pinned on a
// hardware RNIC, and softroce touches it as channels run.
func BudgetConfig(l *config.GlobalLimits) target.BudgetConfig {
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
