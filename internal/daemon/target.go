package daemon

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/stack"
	"github.com/srpd/srpd/scsi/backend"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/target"
)

// ---------------------------------------------------------------------------------------------
// LUNs

// lunRT is an open LUN (its backend wrapped to time the I/O) and its latency histograms. One
// lunRT outlives restarts of its target when its configuration does not change, so that its
// reservations, unit attentions and file lock carry over.
type lunRT struct {
	*stack.LUN
	io *ioTimes

	// carried are the LUN's I/O counters (target.LUNStats) of the targets stopped before
	// the running one: a target restart that keeps the LUN keeps its counters monotonic.
	mu      sync.Mutex
	carried target.LUNStats
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

// ViewAt passes the wrapped backend's views on (backend.Viewer), timed as a read; a backend
// without them lends nothing.
func (b *timedBackend) ViewAt(views [][]byte, off int64, n int) (int, bool, error) {
	v, ok := b.Backend.(backend.Viewer)
	if !ok {
		return 0, false, nil
	}
	t0 := time.Now()
	k, ok, err := v.ViewAt(views, off, n)
	b.t.read.observe(time.Since(t0))
	return k, ok, err
}

// Nonblocking passes the wrapped backend's answer on (backend.Nonblocking): embedding the
// Backend interface would hide it, and a RAM LUN would then run on a LUN worker instead of
// inline on the receive path (target/sched.go). Timing adds no wait.
func (b *timedBackend) Nonblocking() bool {
	nb, ok := b.Backend.(backend.Nonblocking)
	return ok && nb.Nonblocking()
}

func (b *timedBackend) Flush() error {
	t0 := time.Now()
	err := b.Backend.Flush()
	b.t.flush.observe(time.Since(t0))
	return err
}

// openLUN opens LUN l of target t (stack.OpenLUN) with its I/O timed for the metrics. g, when
// not nil, vets a file or blockdev path before the open and the opened file before it is
// resized or used (see lunGuard); symlinks are refused in every component unless
// l.FollowSymlinks. A refused path is a *LUNPathError; the backend's other refusals are
// classified for the control API (classifyOpenError).
func openLUN(t *config.Target, l config.LUN, g *lunGuard, log *zap.Logger) (*lunRT, error) {
	o := stack.LUNOptions{Log: log}
	if g != nil && l.Backend != config.BackendRAM {
		if err := g.check(t, &l); err != nil {
			return nil, err
		}
		o.Admit = g.admit(t, &l)
	}
	times := &ioTimes{}
	o.Wrap = func(be backend.Backend) backend.Backend { return &timedBackend{Backend: be, t: times} }
	sl, err := stack.OpenLUN(t, l, o)
	if err != nil {
		var pe *LUNPathError
		switch {
		case errors.As(err, &pe):
			return nil, pe
		case errors.Is(err, backend.ErrSymlink):
			return nil, &LUNPathError{Target: t.Name, LUN: l.ID, Path: l.Path, Err: backend.ErrSymlink,
				Reason: "has a symbolic link in its path; set follow_symlinks: true on the LUN to allow it"}
		}
		return nil, classifyOpenError(err)
	}
	return &lunRT{LUN: sl, io: times}, nil
}

func (l *lunRT) close(log *zap.Logger) {
	if err := l.Close(); err != nil {
		log.Warn("closing LUN", zap.Int("lun", l.Config.ID), zap.Error(err))
	}
}

// ---------------------------------------------------------------------------------------------
// Targets

// targetRT is a running target (stack.StartTarget) and what the control API adds: the
// daemon's session numbers, and the LUNs with their I/O times.
type targetRT struct {
	*stack.Target
	log  *zap.Logger
	luns map[int]*lunRT
	// lunErrs are the LUNs of the configuration that a live change could not open, and why
	// (guarded by Daemon.mu); the next change or reload of the target tries them again.
	lunErrs map[int]string

	mu  sync.Mutex
	ids map[uint64]uint64 // the target's session number → the daemon's (unique across restarts)
	seq *atomic.Uint64    // the daemon's session numbers
}

// startTarget opens the LUNs of cfg (reusing those in keep) and starts the target. On failure
// everything it opened is closed again; kept LUNs are left to the caller.
func (d *Daemon) startTarget(cfg config.Target, tr *stack.Transport, keep map[int]*lunRT, guard *lunGuard) (_ *targetRT, err error) {
	log := d.log.With(zap.String("target", cfg.Name))
	luns := map[int]*lunRT{}
	var opened []*lunRT
	defer func() {
		if err != nil {
			for _, l := range opened {
				l.close(log)
			}
		}
	}()
	sl := map[int]*stack.LUN{}
	for _, l := range cfg.LUNs {
		if k := keep[l.ID]; k != nil {
			luns[l.ID], sl[l.ID] = k, k.LUN
			continue
		}
		lr, err := openLUN(&cfg, l, guard, log)
		if err != nil {
			return nil, err
		}
		opened = append(opened, lr)
		luns[l.ID], sl[l.ID] = lr, lr.LUN
		log.Info("LUN open", zap.Int("lun", l.ID), zap.String("backend", l.Backend), zap.String("path", l.Path),
			zap.Int64("capacity", lr.Capacity), zap.Int("block_size", l.BlockSize), zap.Bool("read_only", l.ReadOnly))
	}
	st, err := stack.StartTarget(cfg, tr, sl, stack.TargetOptions{Logger: d.log, Budget: d.budget})
	if err != nil {
		return nil, err
	}
	return &targetRT{Target: st, log: log, luns: luns, ids: map[uint64]uint64{}, seq: &d.sessionSeq}, nil
}

// stop drains the target (stack.Target.Stop): LUNs in keep stay open, the others are closed.
func (t *targetRT) stop(ctx context.Context, keep map[int]*lunRT) {
	kept := func(id int) bool { return keep[id] != nil && keep[id] == t.luns[id] }
	t.Stop(ctx, kept)
	for id, lr := range t.luns {
		if kept(id) {
			s := t.Port.LUNStats(lr.SCSI)
			lr.mu.Lock()
			lr.carried.Add(s)
			lr.mu.Unlock()
		}
	}
}

// lunStats are lr's I/O counters: those of the running target and those carried over.
func (t *targetRT) lunStats(lr *lunRT) target.LUNStats {
	s := t.Port.LUNStats(lr.SCSI)
	lr.mu.Lock()
	s.Add(lr.carried)
	lr.mu.Unlock()
	return s
}

// sessionNames returns the API names (sessionID) of the target's sessions, in the order of
// stats, and forgets the numbers of the sessions that are gone.
func (t *targetRT) sessionNames(stats []target.SessionStats) []string {
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
	out := make([]string, len(stats))
	for i, ss := range stats {
		out[i] = sessionID(t.Config.Name, t.numberLocked(ss.ID))
	}
	return out
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
	stats := t.Port.Sessions()
	sort.Slice(stats, func(i, j int) bool { return stats[i].ID < stats[j].ID })
	names := t.sessionNames(stats)
	out := make([]ctlapi.SessionInfo, 0, len(stats))
	for i, ss := range stats {
		si := ctlapi.SessionInfo{
			ID: names[i], Target: t.Config.Name, Initiator: config.PortID(ss.Initiator),
			Channels: len(ss.Channels), State: ctlapi.StateLoggedIn,
			Stats: ctlapi.IOStats{Commands: ss.Commands, ReadBytes: ss.BytesIn, WriteBytes: ss.BytesOut,
				Errors: ss.Errors, TaskMgmt: ss.TaskMgmt},
			LUNs: []int{},
		}
		if len(ss.Channels) > 0 {
			c := ss.Channels[0]
			si.QueueDepth, si.MaxITIULen, si.MaxTIIULen, si.ImmediateData = c.QueueDepth, c.MaxITIULen, c.MaxTIIULen, c.ImmDataOffset > 0
		}
		for _, r := range t.Channels(ss.Initiator) {
			if si.Remote == "" {
				si.Remote = r.Remote.String()
			}
			if si.LoginAt.IsZero() || r.At.Before(si.LoginAt) {
				si.LoginAt = r.At
			}
		}
		if a := t.Config.Admit(config.PortID(ss.Initiator)); a != nil {
			si.ReadOnly = a.ReadOnly
			for _, l := range t.Config.LUNs {
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
	stats := t.Port.Sessions()
	t.mu.Lock()
	for _, ss := range stats {
		if t.numberLocked(ss.ID) == n {
			ini, found = ss.Initiator, true
		}
	}
	t.mu.Unlock()
	recs := t.Channels(ini)
	if !found {
		return false, nil
	}
	if len(recs) == 0 {
		return true, fmt.Errorf("session %s has no established channel to close yet: %w", sessionID(t.Config.Name, n), ctlapi.ErrConflict)
	}
	errs := make(chan error, len(recs))
	for _, r := range recs {
		go func() { errs <- r.Close(ctx) }()
	}
	var err error
	for range recs {
		err = errors.Join(err, <-errs)
	}
	t.log.Info("session killed", zap.Stringer("initiator", ini), zap.String("session", sessionID(t.Config.Name, n)), zap.Int("channels", len(recs)))
	return true, err
}

func (t *targetRT) info() ctlapi.TargetInfo {
	info := ctlapi.TargetInfo{Name: t.Config.Name, Transport: t.Config.Transport, PortID: t.Config.PortID, Listen: t.Listen,
		State: ctlapi.StateListening, Limits: t.Config.Limits, LUNs: t.lunInfos(), ACLs: t.aclInfos(),
		Sessions: int(t.Port.Stats().Sessions)}
	return info
}

func (t *targetRT) lunInfos() []ctlapi.LUNInfo {
	out := []ctlapi.LUNInfo{}
	for _, l := range t.Config.LUNs {
		li := ctlapi.LUNInfo{LUN: l, State: ctlapi.StateUp}
		if lr := t.luns[l.ID]; lr != nil {
			li.Capacity = lr.Size() // follows live resizes
		} else {
			li.State, li.Error = ctlapi.StateError, t.lunErrs[l.ID]
		}
		out = append(out, li)
	}
	return out
}

func (t *targetRT) aclInfos() []ctlapi.ACLInfo {
	stats := t.Port.Sessions()
	out := []ctlapi.ACLInfo{}
	for _, a := range t.Config.ACLs {
		ai := ctlapi.ACLInfo{ACL: a}
		for _, ss := range stats {
			if adm := t.Config.Admit(config.PortID(ss.Initiator)); adm != nil && adm.Initiator == a.Initiator {
				ai.Sessions++
			}
		}
		out = append(out, ai)
	}
	return out
}
