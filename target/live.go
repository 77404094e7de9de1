package target

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
)

// Live reconfiguration: the ACLs and their LUN views change while initiators are logged in,
// as LIO changes node ACLs and mapped LUNs (torvalds/linux:drivers/target/
// target_core_device.c core_enable_device_list_for_node / core_disable_device_list_for_node):
//
//   - A LUN mapped into or out of a view: the view's LUN set changes in place; the sessions
//     of that view (and only they) get REPORTED LUNS DATA HAS CHANGED (3Fh/0Eh) on the LUNs
//     they keep (target_luns_data_has_changed), and a LUN number that left the view answers
//     LOGICAL UNIT NOT SUPPORTED (25h/00h). Commands already admitted to it finish.
//   - An ACL's write protection of a LUN changed: MODE PARAMETERS CHANGED (2Ah/01h) to that
//     view's sessions (the WP bit of MODE SENSE changes).
//   - A new ACL: new logins of its initiator get its view; a session of that initiator
//     admitted by the default ACL is logged out, so that it logs in again under its own ACL.
//   - A removed ACL: the sessions it admitted are logged out (SRP_T_LOGOUT, then a
//     disconnect), nobody else's.
//
// The target port identifier and the limits are not live: a new port identifier is
// ErrNeedsRestart, and limits are left as they are (the caller restarts the target for them).

// ErrNeedsRestart: the change cannot be applied to a running target.
var ErrNeedsRestart = errors.New("target: the change needs a restart of the target")

// ReconfigureResult tells what Reconfigure changed.
type ReconfigureResult struct {
	// LoggedOut are the sessions logged out: those of removed ACLs, and those of initiators
	// that now have an ACL of their own and were admitted by the default one.
	LoggedOut []srp.PortID
	// RemovedLUNs are the logical units no view maps any more; the caller may close them
	// (after DrainLUN).
	RemovedLUNs []*scsi.LUN
}

// Reconfigure applies the ACLs and default ACL of cfg to the running target (see above). Only
// cfg.ACLs, cfg.DefaultACL and cfg.PortID are looked at; a different PortID is
// ErrNeedsRestart. Nothing is changed when an ACL of cfg is invalid.
func (t *Target) Reconfigure(cfg Config) (ReconfigureResult, error) {
	var res ReconfigureResult
	if cfg.PortID != t.portID {
		return res, fmt.Errorf("target %s: port ID %v → %v: %w", t.name, t.portID, cfg.PortID, ErrNeedsRestart)
	}
	want := make(map[srp.PortID]*ACL, len(cfg.ACLs))
	for i := range cfg.ACLs {
		a := &cfg.ACLs[i]
		if _, dup := want[a.Initiator]; dup {
			return res, fmt.Errorf("target: two ACLs for initiator %v", a.Initiator)
		}
		if err := checkACL(a); err != nil {
			return res, err
		}
		want[a.Initiator] = a
	}
	if cfg.DefaultACL != nil {
		if err := checkACL(cfg.DefaultACL); err != nil {
			return res, err
		}
	}
	before := t.mappedLUNs()

	var logout []*session
	t.mu.Lock()
	for ini, v := range t.acls {
		if want[ini] == nil {
			delete(t.acls, ini)
			logout = append(logout, t.sessionsOfLocked(v)...)
			t.log.Info("ACL removed", zap.String("acl", v.name))
		}
	}
	for ini, a := range want {
		if v := t.acls[ini]; v != nil {
			t.updateViewLocked(v, a)
			continue
		}
		v, err := compileACL(a, false)
		if err != nil { // checked above: cannot happen
			t.mu.Unlock()
			return res, err
		}
		t.acls[ini] = v
		if s := t.sessions[ini]; s != nil && s.view == t.defView && t.defView != nil {
			logout = append(logout, s)
		}
		t.log.Info("ACL added", zap.String("acl", v.name), zap.Int("luns", len(a.LUNs)))
	}
	switch {
	case cfg.DefaultACL == nil && t.defView != nil:
		logout = append(logout, t.sessionsOfLocked(t.defView)...)
		t.defView = nil
		t.log.Info("default ACL removed")
	case cfg.DefaultACL != nil && t.defView == nil:
		v, err := compileACL(cfg.DefaultACL, true)
		if err != nil {
			t.mu.Unlock()
			return res, err
		}
		t.defView = v
		t.log.Info("default ACL added")
	case cfg.DefaultACL != nil:
		t.updateViewLocked(t.defView, cfg.DefaultACL)
	}
	t.mu.Unlock()

	for _, s := range uniqueSessions(logout) {
		res.LoggedOut = append(res.LoggedOut, s.initiator)
		t.logoutSession(s, "its ACL was removed or replaced")
	}
	after := t.mappedLUNs()
	for l := range before {
		if !after[l] {
			res.RemovedLUNs = append(res.RemovedLUNs, l)
		}
	}
	return res, nil
}

// checkACL validates a's mappings as compileACL would, without building anything.
func checkACL(a *ACL) error {
	seen := make(map[uint16]bool, len(a.LUNs))
	for _, m := range a.LUNs {
		switch {
		case m.LUN == nil:
			return fmt.Errorf("target: ACL %s: LUN %d is nil", a.Name, m.Number)
		case m.Number > scsi.MaxLUN:
			return fmt.Errorf("target: ACL %s: LUN %d: the largest is %d", a.Name, m.Number, scsi.MaxLUN)
		case seen[m.Number]:
			return fmt.Errorf("target: ACL %s: LUN %d mapped twice", a.Name, m.Number)
		}
		seen[m.Number] = true
	}
	return nil
}

// updateViewLocked makes view v map what a maps (t.mu held; the LUN set has its own lock and
// never calls back): LUN numbers whose LUN changed or left are removed, new ones added, and
// changed write protection reported.
func (t *Target) updateViewLocked(v *view, a *ACL) {
	want := make(map[uint16]LUNMapping, len(a.LUNs))
	for _, m := range a.LUNs {
		want[m.Number] = m
	}
	oldRO := v.readOnlyMap()
	for _, n := range v.set.Numbers() {
		if m, ok := want[n]; !ok || m.LUN != v.set.Get(n) {
			v.set.Remove(n)
		}
	}
	ro := make(map[*scsi.LUN]bool)
	for _, m := range a.LUNs {
		if m.ReadOnly {
			ro[m.LUN] = true
		}
	}
	v.readOnly.Store(&ro) // before the LUNs appear: a new LUN is never writable by mistake
	for _, m := range a.LUNs {
		if v.set.Get(m.Number) == nil {
			_ = v.set.Add(m.Number, m.LUN) // checked: a free number, a valid LUN
		} else if oldRO[m.LUN] != ro[m.LUN] {
			v.set.ModeChanged(m.Number)
		}
	}
	v.maxChannels = a.MaxChannels
}

// sessionsOfLocked returns the live sessions that view v admitted (t.mu held).
func (t *Target) sessionsOfLocked(v *view) []*session {
	var out []*session
	for _, s := range t.sessions {
		if s.view == v {
			out = append(out, s)
		}
	}
	return out
}

func uniqueSessions(ss []*session) []*session {
	seen := make(map[*session]bool, len(ss))
	out := ss[:0]
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// logoutSession sends SRP_T_LOGOUT on each channel of s and disconnects them; logins of s
// not yet established are aborted.
func (t *Target) logoutSession(s *session, why string) {
	t.mu.Lock()
	chs := append([]*channel(nil), s.channels...)
	var pcs []*PendingChannel
	for p := range t.pending {
		if p.ch.sess == s {
			pcs = append(pcs, p)
		}
	}
	t.mu.Unlock()
	for _, p := range pcs {
		p.Abort()
	}
	for _, ch := range chs {
		ch.requestClose(closeReq{logout: true, reason: srp.TLogoutNoReason, why: why})
	}
	s.log.Info("session logged out by a configuration change", zap.String("why", why), zap.Int("channels", len(chs)))
}

// mappedLUNs is the set of LUNs some view maps.
func (t *Target) mappedLUNs() map[*scsi.LUN]bool {
	t.mu.Lock()
	views := make([]*view, 0, len(t.acls)+1)
	for _, v := range t.acls {
		views = append(views, v)
	}
	if t.defView != nil {
		views = append(views, t.defView)
	}
	t.mu.Unlock()
	m := make(map[*scsi.LUN]bool)
	for _, v := range views {
		for _, n := range v.set.Numbers() {
			if l := v.set.Get(n); l != nil {
				m[l] = true
			}
		}
	}
	return m
}

// DrainLUN waits (bounded by ctx) until no command of the target executes on or waits for l:
// after Reconfigure unmapped l, the commands admitted before finish, and l may then be closed.
// Its queue is forgotten.
func (t *Target) DrainLUN(ctx context.Context, l *scsi.LUN) error {
	t.mu.Lock()
	q := t.queues[l]
	t.mu.Unlock()
	if q == nil {
		return nil
	}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		q.mu.Lock()
		idle := q.active.head == nil && q.pending.head == nil && q.running == 0
		q.mu.Unlock()
		if idle {
			t.mu.Lock()
			if t.queues[l] == q {
				delete(t.queues, l)
				l.SetTaskAborter(q, nil)
			}
			t.mu.Unlock()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("target %s: draining a removed LUN: %w", t.name, ctx.Err())
		case <-tick.C:
		}
	}
}

// SetLimits replaces the target's limits while it runs, without logging anybody out: new
// logins negotiate with them (channels, queue depth, IU lengths, immediate data, RDMA depth),
// the admission bounds (sessions, registered memory) apply from the next login on, and the
// channels logged in keep what they negotiated but take the run-time bounds (keep-alive,
// stall timeout and action, logout and teardown timeouts) at once. LUN queues keep the
// workers they were created with. Nothing changes when l is invalid.
func (t *Target) SetLimits(l Limits) error {
	lim := l.withDefaults()
	if err := lim.validate(); err != nil {
		return fmt.Errorf("target %s: %w", t.name, err)
	}
	t.lim.Store(&lim)
	return nil
}
