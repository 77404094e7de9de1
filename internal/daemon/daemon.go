// Package daemon is srpd proper: it keeps a configuration (internal/config) running — RDMA
// devices, SRP targets with their LUNs and ACLs, and initiator sessions with their NBD exports,
// each built by internal/stack — serves the control API (internal/ctlapi) on a unix socket and
// Prometheus metrics; applies only the difference on a reload or an API change (keeping LUNs
// open across a target restart, reconnecting lost sessions); and drains on shutdown.
//
// Life cycle (cmd/srpd drives it):
//
//	d := daemon.New(opts)
//	err := d.Start(ctx, cfg)     // control socket, transports, targets, metrics, sessions
//	... READY=1 ...
//	d.Reload(ctx)                // SIGHUP, or POST /v1/reload: RELOADING=1 ... READY=1
//	d.Shutdown(ctx)              // SIGTERM: stop accepting, log out, drain, close
//
// Concurrency: opMu serialises everything that changes what runs (start, API mutations,
// reloads, shutdown); mu guards the maps for the readers (status, lists, metrics), which never
// wait for a mutation in progress.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/logging"
	"github.com/srpd/srpd/internal/sdnotify"
	"github.com/srpd/srpd/internal/stack"
	"github.com/srpd/srpd/target"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/verbs"
)

// DefaultDrainTimeout bounds a shutdown (and each stop during a reload).
const DefaultDrainTimeout = 30 * time.Second

// Options configure a Daemon.
type Options struct {
	// ConfigPath is the file the configuration came from: reloads read it, ?persist=1 rewrites
	// it.
	ConfigPath string
	// Version is reported by /v1/status (default: the module version from the build info).
	Version string
	// Logger receives the daemon's logs (nil: none).
	Logger *zap.Logger
	// Level, if not nil, is the logger's level; logging.level of the configuration is applied
	// to it (at start and on reload). Nil when --log-level fixed it.
	Level *zap.AtomicLevel
	// Notifier receives RELOADING=1 / READY=1 / STATUS= around reloads (nil: none).
	Notifier *sdnotify.Notifier
	// DrainTimeout bounds a shutdown: logouts and the I/O in flight (DefaultDrainTimeout).
	DrainTimeout time.Duration
	// RunDirs are srpd's run directories (absolute), in which no LUN may lie. Nil: systemd's
	// $RUNTIME_DIRECTORY (RuntimeDirectory=, /run/srpd in srpd.service; colon-separated).
	RunDirs []string
}

func (o *Options) drainTimeout() time.Duration {
	if o.DrainTimeout <= 0 {
		return DefaultDrainTimeout
	}
	return o.DrainTimeout
}

// Daemon runs one configuration. Create it with New.
type Daemon struct {
	opts    Options
	log     *zap.Logger
	started time.Time
	version string

	opMu     sync.Mutex
	stopping atomic.Bool

	mu  sync.RWMutex
	cfg *config.Config
	// loaded is the configuration file as srpd last read or wrote it (configsvc.go).
	loaded     *config.Config
	transports map[string]*stack.Transport
	targets    map[string]*targetRT
	conns      map[string]*connRT
	mpaths     map[string]*mpathRT
	failed     map[string]string // "transport/x", "target/x": why it is not running
	ctl        *controlServer
	metrics    *metricsServer
	// registry holds the Prometheus collectors (metrics.go).
	registry *prometheus.Registry
	// connRec records the softroce connections for the next instance (connstate.go).
	connRec *connRecorder

	// budget is the admission control all targets share (config limits:).
	budget *target.Budget

	reloads, reloadFailures, mutations atomic.Uint64
	sessionSeq                         atomic.Uint64 // session numbers of the API (targetRT.ids)

	// openVerbs opens kernel verbs devices (nil: the engine's); tests stand in for it.
	openVerbs func(name string, cfg verbs.Config) (transport.Device, error)
	// writeConfigFile writes the configuration file (nil: config.AtomicWrite); tests make it
	// fail.
	writeConfigFile func(path string, data []byte, perm os.FileMode) error
}

// New returns a daemon that runs nothing yet.
func New(opts Options) *Daemon {
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	v := opts.Version
	if v == "" {
		v = BuildVersion()
	}
	if opts.RunDirs == nil {
		if rd := os.Getenv("RUNTIME_DIRECTORY"); rd != "" {
			opts.RunDirs = strings.Split(rd, ":")
		}
	}
	d := &Daemon{opts: opts, log: log, version: v, cfg: emptyConfig(), loaded: emptyConfig(),
		transports: map[string]*stack.Transport{}, targets: map[string]*targetRT{}, conns: map[string]*connRT{},
		mpaths: map[string]*mpathRT{}, failed: map[string]string{}, budget: target.NewBudget(stack.BudgetConfig(&config.GlobalLimits{}))}
	d.registry = d.newRegistry()
	return d
}

func emptyConfig() *config.Config {
	c := &config.Config{}
	c.SetDefaults()
	return c
}

// BuildVersion is the main module's version and VCS revision from the build info.
func BuildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += "+" + s.Value[:12]
		}
	}
	return v
}

// Config returns a copy of the running configuration.
func (d *Daemon) Config() *config.Config {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.cfg.Clone()
}

// ControlSocket is the path the control API listens on ("" before Start).
func (d *Daemon) ControlSocket() string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.ctl == nil {
		return ""
	}
	return d.ctl.cfg.Socket
}

// MetricsAddr is the metrics listener's address ("" without one).
func (d *Daemon) MetricsAddr() string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.metrics == nil {
		return ""
	}
	return d.metrics.ln.Addr().String()
}

// Start brings cfg up: the control socket first (a live one belongs to another srpd: error;
// a stale one is replaced), then the transports, targets and the metrics endpoint, then the
// initiator sessions, whose first login it waits for (bounded by ctx and each session's
// connect_timeout; a session that cannot log in keeps trying in the background). Any other
// failure is fatal: Start closes what it opened and returns the error.
func (d *Daemon) Start(ctx context.Context, cfg *config.Config) error {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	d.started = time.Now()
	d.applyLogLevel(cfg)
	ctl, err := d.listenControl(cfg.Control)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.ctl = ctl
	d.mu.Unlock()
	old := emptyConfig()
	old.Control = cfg.Control
	old.Logging = cfg.Logging
	if err := d.apply(ctx, old, cfg); err != nil {
		d.mu.Lock()
		d.cfg = cfg
		d.mu.Unlock()
		d.shutdownLocked(ctx)
		return err
	}
	rec := d.startConnRecovery(cfg.Control.Socket)
	d.mu.Lock()
	d.cfg = cfg
	d.loaded = cfg.Clone()
	d.connRec = rec
	conns := make([]*connRT, 0, len(d.conns))
	for _, c := range d.conns {
		conns = append(conns, c)
	}
	d.mu.Unlock()
	for _, c := range conns {
		if err := c.waitFirst(ctx); err != nil {
			c.log.Warn("not connected at start-up; retrying in the background", zap.Error(err))
		}
	}
	d.log.Info("srpd started", zap.String("version", d.version), zap.String("config", d.opts.ConfigPath),
		zap.String("control_socket", cfg.Control.Socket), zap.String("status", d.StatusLine()))
	return nil
}

// StatusLine is a one-line summary for systemd's STATUS=.
func (d *Daemon) StatusLine() string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	up := 0
	for _, c := range d.conns {
		if _, s := c.stats(); s != nil {
			up++
		}
	}
	sessions := 0
	for _, t := range d.targets {
		sessions += int(t.Port.Stats().Sessions)
	}
	line := fmt.Sprintf("%d target(s), %d initiator session(s) logged in; %d/%d connection(s) up", len(d.targets), sessions, up, len(d.conns))
	if h := healthSummary(d.healthLocked()); h != "" {
		line += "; " + h
	}
	return line
}

func (d *Daemon) applyLogLevel(c *config.Config) {
	if d.opts.Level == nil {
		return
	}
	if l, err := logging.ParseLevel(c.Logging.Level); err == nil {
		d.opts.Level.SetLevel(l)
	}
}

// plan is what apply does, from a config.Diff.
type plan struct {
	diff            *config.Changeset
	closeTransports []string
	openTransports  []string
	stopTargets     []string
	startTargets    []string
	stopConns       []string
	startConns      []string
	stopMpaths      []string
	startMpaths     []string
	// live are the changed targets that keep running: their changes apply in place
	// (config.PlanTarget), their initiators stay logged in.
	live             []config.TargetPlan
	keepLUNs         map[string]map[int]bool // target → LUN ids whose backend stays open
	control, metrics bool
}

// makePlan decides what to stop and start to go from old to new. Objects that failed before
// are retried (their configuration may be right and the world fixed since).
func (d *Daemon) makePlan(old, new *config.Config) *plan {
	diff := config.Diff(old, new)
	p := &plan{diff: diff, keepLUNs: map[string]map[int]bool{}, control: diff.Control, metrics: diff.Metrics}
	restart := map[string]bool{}
	for _, n := range append(slices.Clone(diff.Transports.Removed), diff.Transports.Changed...) {
		restart[n] = true
		p.closeTransports = append(p.closeTransports, n)
	}
	for _, t := range new.Transports {
		if restart[t.Name] || slices.Contains(diff.Transports.Added, t.Name) || d.failed["transport/"+t.Name] != "" {
			p.openTransports = append(p.openTransports, t.Name)
			restart[t.Name] = true
		}
	}
	changedT := map[string]bool{}
	for _, n := range diff.Targets.Changed {
		changedT[n] = true
	}
	for _, t := range old.Targets {
		nt := new.Target(t.Name)
		if nt != nil && changedT[t.Name] && !restart[t.Transport] && !restart[nt.Transport] && d.failed["target/"+t.Name] == "" {
			if tp := livePlan(diff, &t, nt); !tp.Restart {
				p.live = append(p.live, tp)
				continue
			}
		}
		switch {
		case nt == nil:
			p.stopTargets = append(p.stopTargets, t.Name)
		case changedT[t.Name] || restart[t.Transport] || restart[nt.Transport]:
			p.stopTargets = append(p.stopTargets, t.Name)
			keep := map[int]bool{}
			td := diff.Target(t.Name)
			for _, l := range t.LUNs {
				nl := nt.LUN(l.ID)
				switch {
				case nl == nil, td != nil && slices.Contains(td.LUNs.Changed, l.ID):
				case l.Serial == "" && t.PortID != nt.PortID: // the derived serial (and NAA id) changes
				default:
					keep[l.ID] = true
				}
			}
			p.keepLUNs[t.Name] = keep
		}
	}
	for _, t := range new.Targets {
		if old.Target(t.Name) == nil || slices.Contains(p.stopTargets, t.Name) || d.failed["target/"+t.Name] != "" {
			p.startTargets = append(p.startTargets, t.Name)
			continue
		}
		// A running target with LUNs a live change could not open: they are tried again.
		if rt := d.targets[t.Name]; rt != nil && len(rt.lunErrs) > 0 && !slices.ContainsFunc(p.live, func(x config.TargetPlan) bool { return x.Name == t.Name }) {
			p.live = append(p.live, config.TargetPlan{Name: t.Name})
		}
	}
	changedC := map[string]bool{}
	for _, n := range diff.Sessions.Changed {
		changedC[n] = true
	}
	for _, s := range old.Sessions {
		ns := new.Session(s.Name)
		if ns == nil || changedC[s.Name] || restart[s.Transport] || restart[ns.Transport] {
			p.stopConns = append(p.stopConns, s.Name)
		}
	}
	for _, s := range new.Sessions {
		if old.Session(s.Name) == nil || slices.Contains(p.stopConns, s.Name) || d.failed["session/"+s.Name] != "" {
			p.startConns = append(p.startConns, s.Name)
		}
	}
	// A multipath group starts again when it changed or one of its paths' sessions did.
	for _, m := range old.Multipath {
		if nm := new.MultipathGroup(m.Name); nm == nil || slices.Contains(diff.Multipath.Changed, m.Name) ||
			slices.ContainsFunc(m.Sessions, func(n string) bool { return slices.Contains(p.stopConns, n) }) {
			p.stopMpaths = append(p.stopMpaths, m.Name)
		}
	}
	for _, m := range new.Multipath {
		if old.MultipathGroup(m.Name) == nil || slices.Contains(p.stopMpaths, m.Name) || d.failed["multipath/"+m.Name] != "" {
			p.startMpaths = append(p.startMpaths, m.Name)
		}
	}
	return p
}

// apply moves what runs from old to new (opMu held). It returns every failure; what failed is
// left out of the running objects and recorded in d.failed (reported as state error). The
// caller decides whether to keep new (reload) or go back to old (API mutations).
func (d *Daemon) apply(ctx context.Context, old, new *config.Config) error {
	p := d.makePlan(old, new)
	d.budget.SetConfig(stack.BudgetConfig(&new.Limits))
	var errs []error
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opts.drainTimeout())
	defer cancel()

	// Stop: connections first (their NBD clients and logouts may go to our own targets),
	// then targets, then transports.
	var wg sync.WaitGroup
	for _, n := range p.stopMpaths {
		if m := takeRunning(d, d.mpaths, "multipath", n); m != nil {
			m.stop(stopCtx)
		}
	}
	for _, n := range p.stopConns {
		c := takeRunning(d, d.conns, "session", n)
		if c != nil {
			wg.Add(1)
			go func() { defer wg.Done(); c.stop(stopCtx) }()
		}
	}
	wg.Wait()
	kept := map[string]map[int]*lunRT{}
	for _, n := range p.stopTargets {
		t := takeRunning(d, d.targets, "target", n)
		if t == nil {
			continue
		}
		keep := map[int]*lunRT{}
		for id := range p.keepLUNs[n] {
			if l := t.luns[id]; l != nil {
				keep[id] = l
			}
		}
		kept[n] = keep
		wg.Add(1)
		go func() { defer wg.Done(); t.stop(stopCtx, keep) }()
	}
	wg.Wait()
	for _, n := range p.closeTransports {
		t := takeRunning(d, d.transports, "transport", n)
		if t != nil {
			t.Close(stopCtx)
		}
	}

	// Start.
	for _, n := range p.openTransports {
		d.mu.Lock()
		t := d.transports[n]
		delete(d.transports, n)
		d.mu.Unlock()
		if t != nil { // a retry of a failed transport never had one; a changed one was closed
			t.Close(stopCtx)
		}
		tr, err := stack.OpenTransport(ctx, *new.Transport(n), stack.TransportOptions{
			Logger: d.log.With(zap.String("transport", n)), OpenVerbs: d.openVerbs, BusyPoll: new.BusyPoll(new.Transport(n))})
		d.mu.Lock()
		if err == nil {
			d.transports[n] = tr
		}
		errs = d.noteStartLocked(errs, "transport/"+n, err)
		d.mu.Unlock()
	}
	guard := d.newLUNGuard(new)
	for _, n := range p.startTargets {
		cfg := new.Target(n)
		d.mu.RLock()
		tr := d.transports[cfg.Transport]
		d.mu.RUnlock()
		var (
			t   *targetRT
			err error
		)
		if tr == nil {
			err = fmt.Errorf("target %s: transport %q is not up: %w", n, cfg.Transport, ctlapi.ErrUnavailable)
		} else {
			t, err = d.startTarget(*cfg, tr, kept[n], guard)
		}
		if err != nil {
			for _, l := range kept[n] { // nobody else will close them
				l.close(d.log)
			}
		}
		delete(kept, n)
		d.mu.Lock()
		if err == nil {
			d.targets[n] = t
		}
		errs = d.noteStartLocked(errs, "target/"+n, err)
		d.mu.Unlock()
	}
	for _, tp := range p.live {
		if err := d.applyLive(ctx, old.Target(tp.Name), new.Target(tp.Name), tp, guard); err != nil {
			errs = append(errs, err)
		}
	}
	for _, keep := range kept { // targets stopped for good
		for _, l := range keep {
			l.close(d.log)
		}
	}
	// A failed metrics listener is retried by a later change, not by the shutdown (which would
	// report the same failure a second time).
	if p.metrics || (d.failed["metrics"] != "" && !d.stopping.Load()) {
		if err := d.restartMetrics(new.Metrics); err != nil {
			errs = append(errs, err)
		}
	}
	if p.control && old.Control != new.Control {
		if err := d.updateControl(new.Control); err != nil {
			errs = append(errs, err)
		}
	}
	if p.diff.Logging {
		d.applyLogLevel(new)
		if old.Logging.Format != new.Logging.Format {
			d.log.Warn("logging.format changes take effect when srpd restarts", zap.String("format", new.Logging.Format))
		}
	}
	for _, n := range p.startConns {
		cfg := new.Session(n)
		var err error
		d.mu.Lock()
		if tr := d.transports[cfg.Transport]; tr == nil {
			err = fmt.Errorf("session %s: transport %q is not up: %w", n, cfg.Transport, ctlapi.ErrUnavailable)
		} else {
			d.conns[n] = d.startConn(*cfg, tr, new.Control.Group)
		}
		errs = d.noteStartLocked(errs, "session/"+n, err)
		d.mu.Unlock()
	}
	for _, n := range p.startMpaths {
		m, err := d.startMultipath(*new.MultipathGroup(n), new.Control.Group)
		d.mu.Lock()
		if err == nil {
			d.mpaths[n] = m
		}
		errs = d.noteStartLocked(errs, "multipath/"+n, err)
		d.mu.Unlock()
	}
	return errors.Join(errs...)
}

// takeRunning removes the running object name of kind ("target") from m, where d keeps them,
// with its recorded failure, and returns it: nil if it was not running.
func takeRunning[T any](d *Daemon, m map[string]*T, kind, name string) *T {
	d.mu.Lock()
	defer d.mu.Unlock()
	o := m[name]
	delete(m, name)
	delete(d.failed, kind+"/"+name)
	return o
}

// noteStartLocked records how starting the object key ("target/name") went (d.mu held): a
// failure stays in d.failed, for status and the next reload to retry, and is appended to errs;
// a success clears an earlier failure.
func (d *Daemon) noteStartLocked(errs []error, key string, err error) []error {
	if err != nil {
		d.failed[key] = err.Error()
		return append(errs, err)
	}
	delete(d.failed, key)
	return errs
}

// Reload re-reads the configuration file and applies the difference (SIGHUP and POST
// /v1/reload). An invalid file changes nothing and is returned (a config.ErrorList). Objects
// that fail to start stay in state error; the others run the new configuration.
// Run-time changes made without --persist that the reload undoes are logged (a warning each)
// and listed in the result.
func (d *Daemon) Reload(ctx context.Context) (*ctlapi.ReloadResult, error) {
	return d.reload(ctx, ctlapi.ReloadOptions{})
}

// reload is Reload, or with opts.DryRun what it would do, or with opts.RefuseDiscard a
// reload that undoes no run-time change (ErrConflict if it would).
func (d *Daemon) reload(ctx context.Context, opts ctlapi.ReloadOptions) (*ctlapi.ReloadResult, error) {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	if d.stopping.Load() {
		return nil, fmt.Errorf("srpd is shutting down: %w", ctlapi.ErrUnavailable)
	}
	next, err := config.Load(d.opts.ConfigPath)
	var preview *config.ReloadPreview
	if err == nil {
		d.mu.RLock()
		preview = config.PreviewReload(d.loaded, d.cfg, next)
		cur := d.cfg
		d.mu.RUnlock()
		if opts.DryRun {
			return &ctlapi.ReloadResult{DryRun: true, Changes: preview.Changes.Summary(), Diff: preview.Changes,
				Discarded: preview.Discarded.Summary(), Plans: config.PlanTargets(cur, next)}, nil
		}
		if opts.RefuseDiscard && !preview.Discarded.Empty() {
			return nil, discardError(preview)
		}
	} else if opts.DryRun {
		return nil, err
	}
	n := d.opts.Notifier
	_ = n.Reloading("reloading " + d.opts.ConfigPath)
	d.reloads.Add(1)
	if err != nil {
		d.reloadFailures.Add(1)
		d.log.Error("reload: the configuration file is invalid; nothing changed", zap.String("config", d.opts.ConfigPath), zap.Error(err))
		_ = n.Ready("reload failed (invalid configuration; running the previous one); " + d.StatusLine())
		return nil, err
	}
	d.mu.RLock()
	old := d.cfg
	d.mu.RUnlock()
	diff := config.Diff(old, next)
	aerr := d.apply(ctx, old, next)
	d.mu.Lock()
	d.cfg = next
	d.loaded = next.Clone()
	d.mu.Unlock()
	res := &ctlapi.ReloadResult{Changes: diff.Summary(), Diff: diff, Discarded: preview.Discarded.Summary(),
		Plans: config.PlanTargets(old, next)}
	for _, l := range res.Discarded {
		d.log.Warn("reload discarded a run-time change made without --persist", zap.String("change", l))
	}
	d.logChanges(res.Changes)
	if aerr != nil {
		d.reloadFailures.Add(1)
		d.log.Error("reload applied with failures", zap.Error(aerr))
		_ = n.Ready("reloaded with failures; " + d.StatusLine())
		res.Failed = strings.Split(aerr.Error(), "\n")
		return res, nil
	}
	d.log.Info("reloaded", zap.Int("changes", len(res.Changes)))
	_ = n.Ready("reloaded; " + d.StatusLine())
	return res, nil
}

// mutate applies an API change: fn edits a copy of the running configuration, which is
// validated and applied; with persist fn also edits what the configuration file holds, which
// is written back keeping its comments and layout (preparePersist). On any failure what
// runs goes back to the previous configuration and the error is returned.
func (d *Daemon) mutate(ctx context.Context, persist bool, fn func(c *config.Config) error, after func(*config.Config) error) error {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	if d.stopping.Load() {
		return fmt.Errorf("srpd is shutting down: %w", ctlapi.ErrUnavailable)
	}
	d.mu.RLock()
	old := d.cfg
	d.mu.RUnlock()
	next := old.Clone()
	if err := fn(next); err != nil {
		return err
	}
	next.SetDefaults()
	if err := next.Validate(); err != nil {
		return err
	}
	var persistFile func() error
	if persist {
		// Before anything changes: a change the file cannot take is refused whole.
		w, err := d.preparePersist(old, next, fn)
		if err != nil {
			return err
		}
		persistFile = w
	}
	revert := func(why error) error {
		if rerr := d.apply(context.WithoutCancel(ctx), next, old); rerr != nil {
			d.log.Error("restoring the previous configuration after a failed change", zap.Error(rerr))
		}
		return why
	}
	if err := d.apply(ctx, old, next); err != nil {
		return revert(err)
	}
	if after != nil {
		if err := after(next); err != nil {
			return revert(err)
		}
	}
	if persistFile != nil {
		if err := persistFile(); err != nil {
			return revert(fmt.Errorf("the change was not applied: persisting it failed: %w", err))
		}
	}
	d.mu.Lock()
	d.cfg = next
	d.mu.Unlock()
	d.mutations.Add(1)
	d.logChanges(config.Diff(old, next).Summary())
	return nil
}

func (d *Daemon) logChanges(lines []string) {
	for _, l := range lines {
		d.log.Info("configuration change applied", zap.String("change", l))
	}
}

// Shutdown drains and stops everything (SIGTERM): the control API stops accepting requests,
// the target listeners stop accepting logins, NBD exports answer what is in flight, our
// sessions log out (DREQ), our targets send SRP_T_LOGOUT and disconnect after finishing the
// commands in flight, the LUNs are flushed and closed, the devices closed. Bounded by ctx and
// Options.DrainTimeout. Idempotent.
func (d *Daemon) Shutdown(ctx context.Context) {
	if d.stopping.Swap(true) {
		return
	}
	d.mu.RLock()
	ctl := d.ctl
	d.mu.RUnlock()
	if ctl != nil {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ctl.close(cctx) // waits for API calls in progress (which may hold opMu)
		cancel()
	}
	d.opMu.Lock()
	defer d.opMu.Unlock()
	d.shutdownLocked(ctx)
}

func (d *Daemon) shutdownLocked(ctx context.Context) {
	d.stopping.Store(true)
	ctx, cancel := context.WithTimeout(ctx, d.opts.drainTimeout())
	defer cancel()
	d.mu.Lock()
	ctl, ms := d.ctl, d.metrics
	d.mu.Unlock()
	if ctl != nil {
		ctl.close(ctx)
	}
	d.mu.RLock()
	cur := d.cfg
	d.mu.RUnlock()
	// Stop accepting logins on every target before anything drains.
	d.mu.RLock()
	for _, t := range d.targets {
		t.StopAccepting()
	}
	d.mu.RUnlock()
	empty := emptyConfig()
	empty.Control, empty.Logging, empty.Metrics = cur.Control, cur.Logging, cur.Metrics
	if err := d.apply(ctx, cur, empty); err != nil {
		d.log.Warn("shutdown", zap.Error(err))
	}
	// Whatever is left (transports without targets, or objects that never started).
	d.mu.Lock()
	trs := d.transports
	d.transports = map[string]*stack.Transport{}
	d.mu.Unlock()
	for _, t := range trs {
		t.Close(ctx)
	}
	d.mu.Lock()
	rec := d.connRec
	d.connRec = nil
	d.mu.Unlock()
	if rec != nil {
		rec.close()
	}
	if ms != nil {
		ms.close(ctx)
	}
	d.log.Info("srpd stopped")
}
