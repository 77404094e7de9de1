// Package ctlapitest provides an in-memory ctlapi.Service for tests of the control API and its
// clients (srpctl). It follows the flow the daemon is meant to follow for a mutation: clone the
// running configuration, apply the change with the config package's helpers, SetDefaults,
// Validate the whole, then make it current and persist it on request.
package ctlapitest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

// DemoConfig is a small daemon configuration (YAML) for a Fake to start from: transport lo,
// target demo (LUN 0 of 64 MiB, an ACL for initiator ...09) and session up. It ends inside
// session up, so that a test may append fields of it.
const DemoConfig = `
transports:
  - name: lo
    address: 127.0.0.1
targets:
  - name: demo
    port_id: 00000000000000010000000000000001
    luns:
      - {id: 0, backend: ram, size: 64MiB}
    acls:
      - initiator: 00000000000000000000000000000009
        luns: [0]
sessions:
  - name: up
    address: 127.0.0.1
    target_port_id: 00000000000000010000000000000001
`

// Fake is an in-memory Service. Its exported fields may be set before use; use the methods
// after.
type Fake struct {
	mu      sync.Mutex
	cfg     *config.Config
	started time.Time
	// sessions are target-side sessions (initiators logged in), set by AddSession.
	sessions []ctlapi.SessionInfo
	// Persisted receives a copy of the configuration on every persisting call.
	persisted []*config.Config
	// reloadFrom is what Reload reads: the configuration file (nil: loaded).
	reloadFrom *config.Config
	// loaded is the file as the Fake last read or wrote it (ConfigService).
	loaded *config.Config
	// errs makes the named method fail (keys are Service method names).
	errs map[string]error
}

// NewFake returns a Fake running cfg (nil: the empty configuration).
func NewFake(cfg *config.Config) *Fake {
	if cfg == nil {
		cfg = &config.Config{}
	}
	cfg = cfg.Clone()
	cfg.SetDefaults()
	return &Fake{cfg: cfg, loaded: cfg.Clone(), started: time.Unix(1700000000, 0).UTC(), errs: map[string]error{}}
}

var (
	_ ctlapi.Service       = (*Fake)(nil)
	_ ctlapi.ConfigService = (*Fake)(nil)
)

// FakeConfigPath is the configuration file a Fake reports.
const FakeConfigPath = "/etc/srpd/srpd.yaml"

// Config returns a copy of the running configuration.
func (f *Fake) Config() *config.Config {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cfg.Clone()
}

// Persisted returns the configurations persisted so far.
func (f *Fake) Persisted() []*config.Config {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.persisted)
}

// SetReloadSource sets the configuration Reload switches to: what the file holds now
// (without it, the configuration the Fake started with or last persisted).
func (f *Fake) SetReloadSource(c *config.Config) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reloadFrom = c.Clone()
}

// FailNext makes method (a Service method name) return err until FailNext(method, nil).
func (f *Fake) FailNext(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.errs, method)
	} else {
		f.errs[method] = err
	}
}

// AddSession simulates an initiator logging in to a target.
func (f *Fake) AddSession(s ctlapi.SessionInfo) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sessions = append(f.sessions, s)
}

// mutate applies fn to a clone of the running configuration, validates the result and makes it
// current; with persist it is also recorded as persisted.
func (f *Fake) mutate(method string, persist bool, fn func(c *config.Config) error) error {
	if err := f.errs[method]; err != nil {
		return err
	}
	next := f.cfg.Clone()
	if err := fn(next); err != nil {
		return err
	}
	next.SetDefaults()
	if err := next.Validate(); err != nil {
		return err
	}
	f.cfg = next
	if persist {
		f.persisted = append(f.persisted, next.Clone())
		f.loaded = next.Clone()
	}
	return nil
}

// file is what the configuration file holds (f.mu held).
func (f *Fake) file() *config.Config {
	c := f.loaded
	if f.reloadFrom != nil {
		c = f.reloadFrom
	}
	c = c.Clone()
	c.SetDefaults()
	return c
}

// RunningConfig implements ctlapi.ConfigService.
func (f *Fake) RunningConfig(context.Context) (*ctlapi.ConfigInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("RunningConfig"); err != nil {
		return nil, err
	}
	return &ctlapi.ConfigInfo{Path: FakeConfigPath, Config: f.cfg.Clone(), Unsaved: config.Diff(f.loaded, f.cfg).Summary()}, nil
}

// SaveConfig implements ctlapi.ConfigService: the running configuration becomes the file's.
func (f *Fake) SaveConfig(_ context.Context, opts ctlapi.SaveOptions) (*ctlapi.SaveResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("SaveConfig"); err != nil {
		return nil, err
	}
	file := f.file()
	if edits := config.Diff(f.loaded, file); !edits.Empty() && !opts.Force {
		return nil, fmt.Errorf("the file has edits not loaded: %w", ctlapi.ErrConflict)
	}
	res := &ctlapi.SaveResult{Path: FakeConfigPath, Changes: config.Diff(file, f.cfg).Summary()}
	if out, err := config.MarshalMinimal(f.cfg); err == nil {
		res.Bytes = len(out)
	}
	f.loaded, f.reloadFrom = f.cfg.Clone(), nil
	f.persisted = append(f.persisted, f.cfg.Clone())
	return res, nil
}

// ReloadWith implements ctlapi.ConfigService.
func (f *Fake) ReloadWith(ctx context.Context, opts ctlapi.ReloadOptions) (*ctlapi.ReloadResult, error) {
	f.mu.Lock()
	p := config.PreviewReload(f.loaded, f.cfg, f.file())
	f.mu.Unlock()
	if opts.DryRun {
		return &ctlapi.ReloadResult{DryRun: true, Changes: p.Changes.Summary(), Diff: p.Changes, Discarded: p.Discarded.Summary()}, nil
	}
	if opts.RefuseDiscard && !p.Discarded.Empty() {
		return nil, fmt.Errorf("the reload would discard %q: %w", p.Discarded.Summary(), ctlapi.ErrConflict)
	}
	return f.Reload(ctx)
}

func (f *Fake) fail(method string) error { return f.errs[method] }

// Status implements ctlapi.Service.
func (f *Fake) Status(context.Context) (*ctlapi.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("Status"); err != nil {
		return nil, err
	}
	st := &ctlapi.Status{
		Version: "test", APIVersion: ctlapi.APIVersion, PID: 4242, StartedAt: f.started,
		ConfigPath: "/etc/srpd/srpd.yaml", Targets: len(f.cfg.Targets), Sessions: len(f.sessions),
		Connections: len(f.cfg.Sessions), Health: &ctlapi.Health{State: ctlapi.HealthOK, Failed: []ctlapi.FailedObject{}},
	}
	for _, t := range f.cfg.Transports {
		st.Transports = append(st.Transports, ctlapi.TransportInfo{
			Name: t.Name, Driver: t.Driver, Device: t.Device, Addresses: nonEmpty(t.Address), State: ctlapi.StateUp})
	}
	return st, nil
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

func (f *Fake) targetInfo(t *config.Target) ctlapi.TargetInfo {
	info := ctlapi.TargetInfo{Name: t.Name, Transport: t.Transport, PortID: t.PortID, State: ctlapi.StateListening,
		Limits: t.Limits, LUNs: []ctlapi.LUNInfo{}, ACLs: []ctlapi.ACLInfo{}, Spec: t.Clone()}
	addrs := t.Listen
	if len(addrs) == 0 {
		if tr := f.cfg.Transport(t.Transport); tr != nil && tr.Address != "" {
			addrs = []string{tr.Address}
		}
	}
	for _, a := range addrs {
		info.Listen = append(info.Listen, fmt.Sprintf("%s:%d", a, t.CMPort))
	}
	for _, l := range t.LUNs {
		info.LUNs = append(info.LUNs, lunInfo(l))
	}
	for _, a := range t.ACLs {
		info.ACLs = append(info.ACLs, f.aclInfo(t.Name, a))
	}
	for _, s := range f.sessions {
		if s.Target == t.Name {
			info.Sessions++
		}
	}
	return info
}

func lunInfo(l config.LUN) ctlapi.LUNInfo {
	return ctlapi.LUNInfo{LUN: l, Capacity: int64(l.Size), State: ctlapi.StateUp}
}

func (f *Fake) aclInfo(target string, a config.ACL) ctlapi.ACLInfo {
	info := ctlapi.ACLInfo{ACL: a}
	for _, s := range f.sessions {
		if s.Target == target && a.Initiator.Matches(s.Initiator) {
			info.Sessions++
		}
	}
	return info
}

func (f *Fake) target(name string) (*config.Target, error) {
	if t := f.cfg.Target(name); t != nil {
		return t, nil
	}
	return nil, fmt.Errorf("target %q: %w", name, ctlapi.ErrNotFound)
}

// lookup is the target a read of method names, or f's error for method, or not found.
func (f *Fake) lookup(method, name string) (*config.Target, error) {
	if err := f.fail(method); err != nil {
		return nil, err
	}
	return f.target(name)
}

// infos is the info of each of xs, nil when there are none.
func infos[T, I any](xs []T, info func(*T) I) []I {
	var out []I
	for i := range xs {
		out = append(out, info(&xs[i]))
	}
	return out
}

// answer is the reply of a call that returns one object: err, or else info's.
func answer[I any](err error, info func() I) (*I, error) {
	if err != nil {
		return nil, err
	}
	v := info()
	return &v, nil
}

// ListTargets implements ctlapi.Service.
func (f *Fake) ListTargets(context.Context) ([]ctlapi.TargetInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("ListTargets"); err != nil {
		return nil, err
	}
	return infos(f.cfg.Targets, f.targetInfo), nil
}

// GetTarget implements ctlapi.Service.
func (f *Fake) GetTarget(_ context.Context, name string) (*ctlapi.TargetInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, err := f.lookup("GetTarget", name)
	return answer(err, func() ctlapi.TargetInfo { return f.targetInfo(t) })
}

// CreateTarget implements ctlapi.Service.
func (f *Fake) CreateTarget(_ context.Context, t config.Target, opts ctlapi.MutateOptions) (*ctlapi.TargetInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.mutate("CreateTarget", opts.Persist, func(c *config.Config) error { return c.AddTarget(t) })
	return answer(err, func() ctlapi.TargetInfo { return f.targetInfo(f.cfg.Target(t.Name)) })
}

// DeleteTarget implements ctlapi.Service.
func (f *Fake) DeleteTarget(_ context.Context, name string, opts ctlapi.DeleteOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range f.sessions {
		if s.Target == name {
			n++
		}
	}
	if n > 0 && !opts.Force && f.cfg.Target(name) != nil {
		return fmt.Errorf("target %q has %d logged-in sessions (force to log them out): %w", name, n, ctlapi.ErrConflict)
	}
	err := f.mutate("DeleteTarget", opts.Persist, func(c *config.Config) error { return c.RemoveTarget(name) })
	if err == nil {
		f.sessions = slices.DeleteFunc(f.sessions, func(s ctlapi.SessionInfo) bool { return s.Target == name })
	}
	return err
}

// ListLUNs implements ctlapi.Service.
func (f *Fake) ListLUNs(_ context.Context, target string) ([]ctlapi.LUNInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, err := f.lookup("ListLUNs", target)
	if err != nil {
		return nil, err
	}
	return infos(t.LUNs, func(l *config.LUN) ctlapi.LUNInfo { return lunInfo(*l) }), nil
}

// AddLUN implements ctlapi.Service.
func (f *Fake) AddLUN(_ context.Context, target string, l config.LUN, opts ctlapi.MutateOptions) (*ctlapi.LUNInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.mutate("AddLUN", opts.Persist, func(c *config.Config) error { return c.AddLUN(target, l) })
	return answer(err, func() ctlapi.LUNInfo { return lunInfo(*f.cfg.Target(target).LUN(l.ID)) })
}

// RemoveLUN implements ctlapi.Service.
func (f *Fake) RemoveLUN(_ context.Context, target string, id int, opts ctlapi.MutateOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mutate("RemoveLUN", opts.Persist, func(c *config.Config) error { return c.RemoveLUN(target, id) })
}

// ListACLs implements ctlapi.Service.
func (f *Fake) ListACLs(_ context.Context, target string) ([]ctlapi.ACLInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, err := f.lookup("ListACLs", target)
	if err != nil {
		return nil, err
	}
	return infos(t.ACLs, func(a *config.ACL) ctlapi.ACLInfo { return f.aclInfo(target, *a) }), nil
}

// AddACL implements ctlapi.Service.
func (f *Fake) AddACL(_ context.Context, target string, a config.ACL, opts ctlapi.MutateOptions) (*ctlapi.ACLInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.mutate("AddACL", opts.Persist, func(c *config.Config) error { return c.AddACL(target, a) })
	return answer(err, func() ctlapi.ACLInfo { return f.aclInfo(target, *f.cfg.Target(target).ACL(a.Initiator)) })
}

// RemoveACL implements ctlapi.Service.
func (f *Fake) RemoveACL(_ context.Context, target string, ini config.InitiatorID, opts ctlapi.MutateOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mutate("RemoveACL", opts.Persist, func(c *config.Config) error { return c.RemoveACL(target, ini) })
}

// ListSessions implements ctlapi.Service.
func (f *Fake) ListSessions(_ context.Context, filter ctlapi.SessionFilter) ([]ctlapi.SessionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("ListSessions"); err != nil {
		return nil, err
	}
	if filter.Target != "" && f.cfg.Target(filter.Target) == nil {
		return nil, fmt.Errorf("target %q: %w", filter.Target, ctlapi.ErrNotFound)
	}
	var out []ctlapi.SessionInfo
	for _, s := range f.sessions {
		if filter.Target == "" || s.Target == filter.Target {
			out = append(out, s)
		}
	}
	return out, nil
}

// GetSession implements ctlapi.Service.
func (f *Fake) GetSession(_ context.Context, id string) (*ctlapi.SessionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.sessions {
		if s.ID == id {
			return &s, nil
		}
	}
	return nil, fmt.Errorf("session %q: %w", id, ctlapi.ErrNotFound)
}

// KillSession implements ctlapi.Service.
func (f *Fake) KillSession(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.sessions)
	f.sessions = slices.DeleteFunc(f.sessions, func(s ctlapi.SessionInfo) bool { return s.ID == id })
	if len(f.sessions) == n {
		return fmt.Errorf("session %q: %w", id, ctlapi.ErrNotFound)
	}
	return nil
}

func connInfo(s config.Session) ctlapi.ConnectionInfo {
	info := ctlapi.ConnectionInfo{
		Name: s.Name, Address: fmt.Sprintf("%s:%d", s.Address, s.Port), TargetPortID: s.TargetPortID,
		InitiatorPortID: config.MakePortID(uint64(s.InitiatorExt), 0x5054_00ff_fe00_0001),
		State:           ctlapi.StateRunning, Channels: s.ChCount, QueueDepth: s.QueueDepth,
		ConnectedAt: time.Unix(1700000100, 0).UTC(), Config: s, LUNs: []ctlapi.RemoteLUN{},
	}
	for _, e := range s.NBD {
		info.LUNs = append(info.LUNs, ctlapi.RemoteLUN{LUN: e.LUN, Capacity: 64 << 20, BlockSize: 512, NBDSocket: e.Socket})
	}
	return info
}

// ListConnections implements ctlapi.Service.
func (f *Fake) ListConnections(context.Context) ([]ctlapi.ConnectionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("ListConnections"); err != nil {
		return nil, err
	}
	return infos(f.cfg.Sessions, func(s *config.Session) ctlapi.ConnectionInfo { return connInfo(*s) }), nil
}

// GetConnection implements ctlapi.Service.
func (f *Fake) GetConnection(_ context.Context, name string) (*ctlapi.ConnectionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.cfg.Session(name)
	if s == nil {
		return nil, fmt.Errorf("connection %q: %w", name, ctlapi.ErrNotFound)
	}
	info := connInfo(*s)
	return &info, nil
}

// Connect implements ctlapi.Service.
func (f *Fake) Connect(_ context.Context, s config.Session, opts ctlapi.MutateOptions) (*ctlapi.ConnectionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.mutate("Connect", opts.Persist, func(c *config.Config) error { return c.AddSession(s) })
	return answer(err, func() ctlapi.ConnectionInfo { return connInfo(*f.cfg.Session(s.Name)) })
}

// Disconnect implements ctlapi.Service.
func (f *Fake) Disconnect(_ context.Context, name string, opts ctlapi.MutateOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mutate("Disconnect", opts.Persist, func(c *config.Config) error { return c.RemoveSession(name) })
}

// Reload implements ctlapi.Service.
func (f *Fake) Reload(context.Context) (*ctlapi.ReloadResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("Reload"); err != nil {
		return nil, err
	}
	next := f.file()
	if err := next.Validate(); err != nil {
		return nil, err
	}
	p := config.PreviewReload(f.loaded, f.cfg, next)
	f.cfg = next
	f.loaded = next.Clone()
	return &ctlapi.ReloadResult{Changes: p.Changes.Summary(), Diff: p.Changes, Discarded: p.Discarded.Summary()}, nil
}
