package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

// The control API (ctlapi.Service) over the running daemon. Reads look at what runs; changes
// go through mutate: edit a copy of the configuration, validate it, apply the difference, and
// persist it when asked.

var _ ctlapi.Service = (*Daemon)(nil)

// Status implements ctlapi.Service.
func (d *Daemon) Status(context.Context) (*ctlapi.Status, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	st := &ctlapi.Status{Version: d.version, APIVersion: ctlapi.APIVersion, PID: os.Getpid(), StartedAt: d.started,
		ConfigPath: d.opts.ConfigPath, Targets: len(d.cfg.Targets), Connections: len(d.cfg.Sessions),
		Transports: []ctlapi.TransportInfo{}}
	for _, t := range d.cfg.Transports {
		if rt := d.transports[t.Name]; rt != nil {
			st.Transports = append(st.Transports, transportInfo(rt))
			continue
		}
		st.Transports = append(st.Transports, ctlapi.TransportInfo{Name: t.Name, Driver: t.Driver, State: ctlapi.StateError,
			Error: d.failed["transport/"+t.Name]})
	}
	for _, t := range d.targets {
		st.Sessions += int(t.Port.Stats().Sessions)
	}
	st.Health = d.healthLocked()
	return st, nil
}

func (d *Daemon) targetInfoLocked(t *config.Target) ctlapi.TargetInfo {
	if rt := d.targets[t.Name]; rt != nil {
		info := rt.info()
		info.Spec = t.Clone()
		return info
	}
	info := ctlapi.TargetInfo{Name: t.Name, Transport: t.Transport, PortID: t.PortID, Listen: []string{}, State: ctlapi.StateError,
		Error: d.failed["target/"+t.Name], Limits: t.Limits, LUNs: []ctlapi.LUNInfo{}, ACLs: []ctlapi.ACLInfo{}}
	if info.Error == "" {
		info.State = ctlapi.StateDown
	}
	for _, l := range t.LUNs {
		info.LUNs = append(info.LUNs, ctlapi.LUNInfo{LUN: l, State: ctlapi.StateDown})
	}
	for _, a := range t.ACLs {
		info.ACLs = append(info.ACLs, ctlapi.ACLInfo{ACL: a})
	}
	info.Spec = t.Clone()
	return info
}

func notFound(kind, name string) error {
	return fmt.Errorf("%s %q: %w", kind, name, ctlapi.ErrNotFound)
}

// ListTargets implements ctlapi.Service.
func (d *Daemon) ListTargets(context.Context) ([]ctlapi.TargetInfo, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return infosLocked(d.cfg.Targets, d.targetInfoLocked), nil
}

// GetTarget implements ctlapi.Service.
func (d *Daemon) GetTarget(_ context.Context, name string) (*ctlapi.TargetInfo, error) {
	return getInfo(d, "target", name, (*config.Config).Target, d.targetInfoLocked)
}

// infosLocked is the info of each of the configuration's xs (never nil, for the JSON lists).
func infosLocked[T, I any](xs []T, info func(*T) I) []I {
	out := []I{}
	for i := range xs {
		out = append(out, info(&xs[i]))
	}
	return out
}

// getInfo answers a Get: the info of the object that find finds by name in the configuration,
// or a not-found error that calls it a kind.
func getInfo[T, I any](d *Daemon, kind, name string, find func(*config.Config, string) *T, info func(*T) I) (*I, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	x := find(d.cfg, name)
	if x == nil {
		return nil, notFound(kind, name)
	}
	v := info(x)
	return &v, nil
}

// CreateTarget implements ctlapi.Service.
func (d *Daemon) CreateTarget(ctx context.Context, t config.Target, opts ctlapi.MutateOptions) (*ctlapi.TargetInfo, error) {
	if err := d.mutate(ctx, opts.Persist, func(c *config.Config) error { return c.AddTarget(t) }, nil); err != nil {
		return nil, err
	}
	return d.GetTarget(ctx, t.Name)
}

// DeleteTarget implements ctlapi.Service.
func (d *Daemon) DeleteTarget(ctx context.Context, name string, opts ctlapi.DeleteOptions) error {
	return d.mutate(ctx, opts.Persist, func(c *config.Config) error {
		if c.Target(name) == nil {
			return notFound("target", name)
		}
		d.mu.RLock()
		rt := d.targets[name]
		d.mu.RUnlock()
		if rt != nil && !opts.Force {
			if n := rt.Port.Stats().Sessions; n > 0 {
				return fmt.Errorf("target %q has %d logged-in session(s); use force to log them out: %w", name, n, ctlapi.ErrConflict)
			}
		}
		return c.RemoveTarget(name)
	}, nil)
}

func (d *Daemon) runningTarget(name string) (*config.Target, error) {
	t := d.cfg.Target(name)
	if t == nil {
		return nil, notFound("target", name)
	}
	return t, nil
}

// ListLUNs implements ctlapi.Service.
func (d *Daemon) ListLUNs(_ context.Context, target string) ([]ctlapi.LUNInfo, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	t, err := d.runningTarget(target)
	if err != nil {
		return nil, err
	}
	return d.targetInfoLocked(t).LUNs, nil
}

// checkBackend catches the common mistakes of a new LUN of target before anything is restarted
// for it: a path srpd refuses (its own files, symlinks, outside allowed_paths), a missing
// file, the wrong kind of file.
func (d *Daemon) checkBackend(target string, l config.LUN) error {
	d.mu.RLock()
	c := d.cfg
	d.mu.RUnlock()
	t := c.Target(target)
	if t == nil {
		t = &config.Target{Name: target}
	}
	if err := d.newLUNGuard(c).check(t, &l); err != nil {
		return err
	}
	switch l.Backend {
	case config.BackendFile:
		fi, err := os.Stat(l.Path)
		switch {
		case errors.Is(err, os.ErrNotExist) && !l.Create:
			return fmt.Errorf("LUN %d: %s does not exist (add create and a size to create it): %w", l.ID, l.Path, ctlapi.ErrInvalidArgument)
		case err == nil && !fi.Mode().IsRegular():
			return fmt.Errorf("LUN %d: %s is not a regular file: %w", l.ID, l.Path, ctlapi.ErrInvalidArgument)
		}
	case config.BackendBlockDev:
		fi, err := os.Stat(l.Path)
		switch {
		case err != nil:
			return fmt.Errorf("LUN %d: %w: %w", l.ID, err, ctlapi.ErrInvalidArgument)
		case fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0:
			return fmt.Errorf("LUN %d: %s is not a block device: %w", l.ID, l.Path, ctlapi.ErrInvalidArgument)
		}
	}
	return nil
}

// lunInfo describes LUN id of the running target.
func (d *Daemon) lunInfo(target string, id int) (*ctlapi.LUNInfo, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	t, err := d.runningTarget(target)
	if err != nil {
		return nil, err
	}
	for _, li := range d.targetInfoLocked(t).LUNs {
		if li.ID == id {
			return &li, nil
		}
	}
	return nil, notFound("LUN", fmt.Sprintf("%s/%d", target, id))
}

// AddLUN implements ctlapi.Service. The LUN is added to the running target: the initiators
// whose ACL shows it are told REPORTED LUNS DATA HAS CHANGED and stay logged in.
func (d *Daemon) AddLUN(ctx context.Context, target string, l config.LUN, opts ctlapi.MutateOptions) (*ctlapi.LUNInfo, error) {
	if err := d.checkBackend(target, l); err != nil {
		return nil, err
	}
	err := d.mutate(ctx, opts.Persist, func(c *config.Config) error { return c.AddLUN(target, l) }, d.targetUp(target))
	if err != nil {
		return nil, err
	}
	return d.lunInfo(target, l.ID)
}

// RemoveLUN implements ctlapi.Service.
func (d *Daemon) RemoveLUN(ctx context.Context, target string, id int, opts ctlapi.MutateOptions) error {
	return d.mutate(ctx, opts.Persist, func(c *config.Config) error { return c.RemoveLUN(target, id) }, d.targetUp(target))
}

// targetUp fails a change that left the target in error (it is then undone).
func (d *Daemon) targetUp(target string) func(*config.Config) error {
	return func(c *config.Config) error {
		d.mu.RLock()
		defer d.mu.RUnlock()
		if msg := d.failed["target/"+target]; msg != "" {
			return errors.New(msg)
		}
		return nil
	}
}

// ListACLs implements ctlapi.Service.
func (d *Daemon) ListACLs(_ context.Context, target string) ([]ctlapi.ACLInfo, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	t, err := d.runningTarget(target)
	if err != nil {
		return nil, err
	}
	return d.targetInfoLocked(t).ACLs, nil
}

// AddACL implements ctlapi.Service (live: nobody logged in is logged out, except a session of
// that initiator admitted by the "*" ACL, which logs in again under its own).
func (d *Daemon) AddACL(ctx context.Context, target string, a config.ACL, opts ctlapi.MutateOptions) (*ctlapi.ACLInfo, error) {
	if err := d.mutate(ctx, opts.Persist, func(c *config.Config) error { return c.AddACL(target, a) }, d.targetUp(target)); err != nil {
		return nil, err
	}
	return d.aclInfo(ctx, target, a.Initiator)
}

// aclInfo is the ACL of initiator ini on target as ListACLs shows it.
func (d *Daemon) aclInfo(ctx context.Context, target string, ini config.InitiatorID) (*ctlapi.ACLInfo, error) {
	acls, err := d.ListACLs(ctx, target)
	if err != nil {
		return nil, err
	}
	for _, ai := range acls {
		if ai.Initiator == ini {
			return &ai, nil
		}
	}
	return nil, notFound("ACL", ini.String())
}

// RemoveACL implements ctlapi.Service.
func (d *Daemon) RemoveACL(ctx context.Context, target string, ini config.InitiatorID, opts ctlapi.MutateOptions) error {
	return d.mutate(ctx, opts.Persist, func(c *config.Config) error { return c.RemoveACL(target, ini) }, d.targetUp(target))
}

// ListSessions implements ctlapi.Service.
func (d *Daemon) ListSessions(_ context.Context, f ctlapi.SessionFilter) ([]ctlapi.SessionInfo, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if f.Target != "" && d.cfg.Target(f.Target) == nil {
		return nil, notFound("target", f.Target)
	}
	out := []ctlapi.SessionInfo{}
	for _, name := range sortedKeys(d.targets) {
		if f.Target == "" || f.Target == name {
			out = append(out, d.targets[name].sessionInfos()...)
		}
	}
	return out, nil
}

// parseSessionID splits "target.N".
func parseSessionID(id string) (string, uint64, bool) {
	i := strings.LastIndexByte(id, '.')
	if i <= 0 {
		return "", 0, false
	}
	n, err := strconv.ParseUint(id[i+1:], 10, 64)
	return id[:i], n, err == nil
}

// GetSession implements ctlapi.Service.
func (d *Daemon) GetSession(_ context.Context, id string) (*ctlapi.SessionInfo, error) {
	name, _, ok := parseSessionID(id)
	if !ok {
		return nil, notFound("session", id)
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if t := d.targets[name]; t != nil {
		for _, s := range t.sessionInfos() {
			if s.ID == id {
				return &s, nil
			}
		}
	}
	return nil, notFound("session", id)
}

// KillSession implements ctlapi.Service: the initiator is logged out (SRP_T_LOGOUT, then a
// disconnect, on each of its channels). It may log in again if its ACL allows.
func (d *Daemon) KillSession(ctx context.Context, id string) error {
	name, n, ok := parseSessionID(id)
	if !ok {
		return notFound("session", id)
	}
	d.mu.RLock()
	t := d.targets[name]
	d.mu.RUnlock()
	if t == nil {
		return notFound("session", id)
	}
	found, err := t.kill(ctx, n)
	if !found {
		return notFound("session", id)
	}
	return err
}

// ListConnections implements ctlapi.Service.
func (d *Daemon) ListConnections(context.Context) ([]ctlapi.ConnectionInfo, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return infosLocked(d.cfg.Sessions, d.connInfoLocked), nil
}

func (d *Daemon) connInfoLocked(s *config.Session) ctlapi.ConnectionInfo {
	if c := d.conns[s.Name]; c != nil {
		ci := c.info()
		ci.Paths = d.pathsLocked(s.Name)
		return ci
	}
	return ctlapi.ConnectionInfo{Name: s.Name, Address: s.Address, TargetPortID: s.TargetPortID, State: ctlapi.StateError,
		Error: d.failed["session/"+s.Name], Config: *s, LUNs: []ctlapi.RemoteLUN{}, Paths: d.pathsLocked(s.Name)}
}

// GetConnection implements ctlapi.Service.
func (d *Daemon) GetConnection(_ context.Context, name string) (*ctlapi.ConnectionInfo, error) {
	return getInfo(d, "connection", name, (*config.Config).Session, d.connInfoLocked)
}

// Connect implements ctlapi.Service: the session is added and its first login awaited; if it
// fails the session is removed again and the error returned (a session in the configuration
// file, by contrast, keeps trying).
func (d *Daemon) Connect(ctx context.Context, s config.Session, opts ctlapi.MutateOptions) (*ctlapi.ConnectionInfo, error) {
	err := d.mutate(ctx, opts.Persist, func(c *config.Config) error { return c.AddSession(s) }, func(*config.Config) error {
		d.mu.RLock()
		c := d.conns[s.Name]
		msg := d.failed["session/"+s.Name]
		d.mu.RUnlock()
		if c == nil {
			return fmt.Errorf("connection %s: %s: %w", s.Name, msg, ctlapi.ErrUnavailable)
		}
		if err := c.waitFirst(ctx); err != nil {
			return fmt.Errorf("connection %s: %w: %w", s.Name, err, ctlapi.ErrUnavailable)
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, x := range c.exports {
			if x.err != "" {
				return fmt.Errorf("connection %s: NBD export of LUN %d on %s: %s: %w", s.Name, x.lun, x.socket, x.err, ctlapi.ErrInvalidArgument)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return d.GetConnection(ctx, s.Name)
}

// Disconnect implements ctlapi.Service.
func (d *Daemon) Disconnect(ctx context.Context, name string, opts ctlapi.MutateOptions) error {
	return d.mutate(ctx, opts.Persist, func(c *config.Config) error {
		if c.Session(name) == nil {
			return notFound("connection", name)
		}
		return c.RemoveSession(name)
	}, nil)
}
