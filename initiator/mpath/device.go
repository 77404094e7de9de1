// Package mpath is multipath for the initiator: one logical unit reached through several
// target ports (SRP sessions to several srpd gateways, or ports of one target), after Linux
// dm-multipath with the ALUA device handler (torvalds/linux:drivers/md/dm-mpath.c,
// drivers/scsi/device_handler/scsi_dh_alua.c).
//
// Paths are grouped by the logical unit's designator (VPD 0x83, NAA preferred): a LUN whose
// designator differs from the device's is refused. I/O goes to the best usable path: a
// logged-in session whose target port group is active/optimized, else active/non-optimized
// (standby, unavailable and transitioning groups take none). A path checker reads each path's
// session state and its group's state (REPORT TARGET PORT GROUPS) every CheckInterval and
// switches to a better path at once (failback "immediate"). An I/O that fails for a reason of
// its path (the session's transport: fast_io_fail_tmo, channel failures, dev_loss_tmo; the
// group refusing with NOT READY) is retried on the next usable path; while none is usable, I/O
// waits for one up to NoPathTimeout (queue_if_no_path with a limit), then fails with
// ErrNoPath. Errors that are the logical unit's answer (medium errors, ILLEGAL REQUEST,
// reservation conflicts, write protection) are returned as they are. A path's own reconnect,
// fast_io_fail and dev_loss timers stay its session's (initiator/rport.go).
package mpath

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/initiator"
	"github.com/srpd/srpd/transport"
)

// ErrNoPath: no path was usable within NoPathTimeout (an NBD client gets EIO, as from
// dm-multipath when no_path_retry runs out).
var ErrNoPath = errors.New("mpath: no usable path")

var _ initiator.BlockDevice = (*Device)(nil)

// ErrOtherUnit: a path's LUN reports another logical unit designator than the device's.
var ErrOtherUnit = errors.New("mpath: the path leads to another logical unit")

// Path is one way to the logical unit.
type Path interface {
	// Name names the path in logs and the API (the daemon: its session's name).
	Name() string
	// LUN is the path's LUN now: nil while its session is not logged in (after dev_loss_tmo
	// the daemon dials a new session, whose LUN then comes back here).
	LUN() *initiator.LUN
}

// PostBatchPath may be implemented by a Path whose commands go through a transport device
// that batches posts (transport.PostBatcher; the daemon's paths: their session's device). The
// Device brackets posts on every such device its paths had when it was made (BeginPosts), so
// that an NBD export of it sends the requests of one read together as a LUN's export does.
type PostBatchPath interface {
	Path
	PostBatcher() transport.PostBatcher
}

// Options tune a Device.
type Options struct {
	Logger *zap.Logger
	// CheckInterval is the path checker's period (default 1 s).
	CheckInterval time.Duration
	// NoPathTimeout bounds how long I/O waits for a usable path (default 30 s).
	NoPathTimeout time.Duration
	// CheckTimeout bounds one path check's commands (default 5 s).
	CheckTimeout time.Duration
}

// Device is the logical unit through its paths. Its block API is the initiator LUN's
// (initiator.BlockDevice): initiator.NBDDevice exports it over NBD.
type Device struct {
	log   *zap.Logger
	opts  Options
	paths []*path

	mu      sync.Mutex
	active  *path         // the path I/O goes to; nil: none usable
	changed chan struct{} // closed and replaced when active changes
	id      []byte        // the logical unit's designator, from the first path seen
	size    int64
	bs      int
	ro, dis bool

	reqs sync.Pool // *request: async I/O in flight
	// batchers are the paths' transport devices that batch posts (PostBatchPath), fixed at
	// New so that every BeginPosts meets its EndPosts on the same devices.
	batchers []transport.PostBatcher

	ready  chan struct{} // closed once the unit was seen through a path (size and block size known)
	stop   chan struct{}
	done   chan struct{}
	closed atomic.Bool
}

// path is a Path and what the checker knows of it (guarded by Device.mu unless atomic).
type path struct {
	p     Path
	lun   *initiator.LUN // the LUN the rest was read from
	tpg   uint16
	tpgOK bool
	state State
	up    bool   // logged in, same unit, usable group
	why   string // why not up
	ios   atomic.Uint64
	fails atomic.Uint64
}

// PathInfo is a path's state, for the API.
type PathInfo struct {
	Name     string `json:"name"`
	Up       bool   `json:"up"`
	Active   bool   `json:"active"`
	Group    int    `json:"group"` // target port group, -1 unknown
	State    string `json:"alua_state"`
	Why      string `json:"why,omitempty"`
	IOs      uint64 `json:"ios"`      // commands completed through it
	Failures uint64 `json:"failures"` // I/Os it failed that were retried elsewhere
}

// New starts a Device over paths (at least one) and its path checker; Close stops it.
func New(paths []Path, o Options) (*Device, error) {
	if len(paths) == 0 {
		return nil, errors.New("mpath: no path")
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.CheckInterval <= 0 {
		o.CheckInterval = time.Second
	}
	if o.NoPathTimeout <= 0 {
		o.NoPathTimeout = 30 * time.Second
	}
	if o.CheckTimeout <= 0 {
		o.CheckTimeout = 5 * time.Second
	}
	d := &Device{log: o.Logger, opts: o, changed: make(chan struct{}), ready: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	for _, p := range paths {
		d.paths = append(d.paths, &path{p: p, state: Unavailable, why: "not checked yet"})
		if pb, ok := p.(PostBatchPath); ok {
			if b := pb.PostBatcher(); b != nil && !slices.Contains(d.batchers, b) {
				d.batchers = append(d.batchers, b)
			}
		}
	}
	d.reqs.New = func() any {
		r := &request{d: d}
		r.cb = r.complete
		return r
	}
	d.check(context.Background())
	go d.checker()
	return d, nil
}

// Close stops the path checker; I/O waiting for a path fails with ErrNoPath.
func (d *Device) Close() {
	if d.closed.Swap(true) {
		return
	}
	close(d.stop)
	<-d.done
	d.mu.Lock()
	d.setActiveLocked(nil)
	d.mu.Unlock()
}

// Paths reports each path's state.
func (d *Device) Paths() []PathInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]PathInfo, len(d.paths))
	for i, p := range d.paths {
		g := -1
		if p.tpgOK {
			g = int(p.tpg)
		}
		out[i] = PathInfo{Name: p.p.Name(), Up: p.up, Active: p == d.active, Group: g, State: p.state.String(),
			Why: p.why, IOs: p.ios.Load(), Failures: p.fails.Load()}
	}
	return out
}

func (d *Device) checker() {
	defer close(d.done)
	t := time.NewTicker(d.opts.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-d.stop:
				case <-ctx.Done():
				}
				cancel()
			}()
			d.check(ctx)
			cancel()
		}
	}
}

// check reads every path's state and picks the active path.
func (d *Device) check(ctx context.Context) {
	for _, p := range d.paths {
		d.checkPath(ctx, p)
	}
	d.mu.Lock()
	d.pickLocked()
	d.mu.Unlock()
}

// checkPath is one path check: the session's state, the unit's designator, the path's target
// port group (VPD 0x83, read once per LUN) and the groups' states (RTPG). A target without
// ALUA (RTPG refused) counts as active/optimized, as scsi_dh_alua's TPGS 0.
func (d *Device) checkPath(ctx context.Context, p *path) {
	l := p.p.LUN()
	set := func(up bool, st State, why string) {
		d.mu.Lock()
		if p.up != up || p.state != st {
			d.log.Info("path state", zap.String("path", p.p.Name()), zap.Bool("up", up), zap.Stringer("alua_state", st), zap.String("why", why))
		}
		p.up, p.state, p.why = up, st, why
		d.mu.Unlock()
	}
	if l == nil {
		set(false, p.state, "not logged in")
		return
	}
	if st := l.Session().State(); st != initiator.StateRunning {
		set(false, p.state, "session "+st.String())
		return
	}
	info := l.Info()
	d.mu.Lock()
	if d.id == nil && len(info.ID) > 0 {
		d.id = bytes.Clone(info.ID)
		d.size, d.bs, d.ro, d.dis = l.Size(), l.BlockSize(), l.ReadOnly(), l.CanDiscard()
		close(d.ready)
	}
	same := len(info.ID) > 0 && bytes.Equal(d.id, info.ID)
	newLUN := p.lun != l
	if same {
		d.size, d.ro = l.Size(), l.ReadOnly()
	}
	d.mu.Unlock()
	if !same {
		set(false, p.state, fmt.Sprintf("%v (%s)", ErrOtherUnit, info.IDString()))
		return
	}
	cctx, cancel := context.WithTimeout(ctx, d.opts.CheckTimeout)
	defer cancel()
	if newLUN {
		page := make([]byte, 255)
		n, err := l.Command(cctx, []byte{0x12, 0x01, 0x83, 0, 255, 0}, page, nil)
		if err != nil {
			set(false, p.state, "INQUIRY VPD 0x83: "+err.Error())
			return
		}
		tpg, ok, err := ParseTPGDesignator(page[:n])
		if err != nil {
			set(false, p.state, err.Error())
			return
		}
		d.mu.Lock()
		p.lun, p.tpg, p.tpgOK = l, tpg, ok
		d.mu.Unlock()
	}
	d.mu.Lock()
	tpg, tpgOK := p.tpg, p.tpgOK
	d.mu.Unlock()
	if !tpgOK {
		set(true, ActiveOptimized, "")
		return
	}
	buf := make([]byte, 1024)
	n, err := l.Command(cctx, rtpgCDB(uint32(len(buf))), buf, nil)
	if err != nil {
		if errors.Is(err, initiator.ErrIllegalRequest) {
			set(true, ActiveOptimized, "")
			return
		}
		set(false, p.state, "REPORT TARGET PORT GROUPS: "+err.Error())
		return
	}
	states, err := ParseRTPG(buf[:n])
	if err != nil {
		set(false, p.state, err.Error())
		return
	}
	st, ok := states[tpg]
	if !ok {
		set(false, Unavailable, fmt.Sprintf("RTPG does not list the path's group %d", tpg))
		return
	}
	if !st.usable() {
		set(false, st, "group "+st.String())
		return
	}
	set(true, st, "")
}

// pickLocked makes the best usable path active: active/optimized before active/non-optimized,
// in the order the paths were given.
func (d *Device) pickLocked() {
	var best *path
	for _, p := range d.paths {
		if !p.up || p.lun == nil {
			continue
		}
		if best == nil || (p.state == ActiveOptimized && best.state != ActiveOptimized) {
			best = p
		}
	}
	d.setActiveLocked(best)
}

func (d *Device) setActiveLocked(p *path) {
	if p == d.active {
		return
	}
	from, to := "none", "none"
	if d.active != nil {
		from = d.active.p.Name()
	}
	if p != nil {
		to = p.p.Name()
	}
	d.log.Info("active path", zap.String("from", from), zap.String("to", to))
	d.active = p
	close(d.changed)
	d.changed = make(chan struct{})
}

// current returns the active path and its LUN, or nil and a channel closed when that changes.
func (d *Device) current() (*path, *initiator.LUN, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.active == nil || d.closed.Load() {
		return nil, nil, d.changed
	}
	return d.active, d.active.lun, nil
}

// failed takes p out of use after an I/O failed on it for a reason of the path; the checker
// puts it back once it passes a check again.
func (d *Device) failed(p *path, err error) {
	p.fails.Add(1)
	d.mu.Lock()
	if p.up {
		d.log.Warn("path failed", zap.String("path", p.p.Name()), zap.Error(err))
		p.up, p.why = false, err.Error()
	}
	d.pickLocked()
	d.mu.Unlock()
}

// wait returns a usable path, waiting for one until deadline.
func (d *Device) wait(ctx context.Context, deadline time.Time) (*path, *initiator.LUN, error) {
	for {
		p, l, ch := d.current()
		if p != nil {
			return p, l, nil
		}
		if d.closed.Load() {
			return nil, nil, fmt.Errorf("%w: device closed", ErrNoPath)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, nil, fmt.Errorf("%w within %v", ErrNoPath, d.opts.NoPathTimeout)
		}
		t := time.NewTimer(left)
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, nil, ctx.Err()
		}
		t.Stop()
	}
}

// pathError reports whether err is a failure of the path rather than the logical unit's
// answer: dm-mpath fails the path on transport errors (scsi_dh_alua also on the ALUA NOT READY
// codes 04/0A, 04/0B, 04/0C).
func pathError(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	case errors.Is(err, initiator.ErrFastFail), errors.Is(err, initiator.ErrTransport),
		errors.Is(err, initiator.ErrSessionLost), errors.Is(err, initiator.ErrClosed),
		errors.Is(err, initiator.ErrTimeout), errors.Is(err, initiator.ErrNoLUN):
		return true
	}
	var se *initiator.SCSIError
	if errors.As(err, &se) && se.Sense.Key == 0x2 && se.Sense.ASC == 0x04 && (se.Sense.ASCQ >= 0x0A && se.Sense.ASCQ <= 0x0C) {
		return true
	}
	return false
}

// do runs fn on the active path, on the next ones when it fails for a path reason.
func (d *Device) do(ctx context.Context, fn func(l *initiator.LUN) error) error {
	deadline := time.Now().Add(d.opts.NoPathTimeout)
	for {
		p, l, err := d.wait(ctx, deadline)
		if err != nil {
			return err
		}
		err = fn(l)
		if !pathError(err) {
			p.ios.Add(1)
			return err
		}
		d.failed(p, err)
	}
}

// ReadAt reads p at off through the active path.
func (d *Device) ReadAt(ctx context.Context, p []byte, off int64) error {
	return d.do(ctx, func(l *initiator.LUN) error { return l.ReadAt(ctx, p, off) })
}

// WriteAt writes p at off through the active path (again on the next path if that one
// fails: a block write is idempotent).
func (d *Device) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	return d.do(ctx, func(l *initiator.LUN) error { return l.WriteAt(ctx, p, off, fua) })
}

// Flush makes completed writes durable.
func (d *Device) Flush(ctx context.Context) error {
	return d.do(ctx, func(l *initiator.LUN) error { return l.Flush(ctx) })
}

// Discard deallocates [off, off+n).
func (d *Device) Discard(ctx context.Context, off, n int64) error {
	return d.do(ctx, func(l *initiator.LUN) error { return l.Discard(ctx, off, n) })
}

// WriteZeroes makes [off, off+n) read as zeroes.
func (d *Device) WriteZeroes(ctx context.Context, off, n int64, noUnmap bool) error {
	return d.do(ctx, func(l *initiator.LUN) error { return l.WriteZeroes(ctx, off, n, noUnmap) })
}

// Provisioning reports the allocation of [off, off+n) (GET LBA STATUS) through the active path.
func (d *Device) Provisioning(ctx context.Context, off, n int64) (runs []initiator.Run, err error) {
	err = d.do(ctx, func(l *initiator.LUN) error {
		var e error
		runs, e = l.Provisioning(ctx, off, n)
		return e
	})
	return runs, err
}

// Size is the capacity in bytes (as the last path checked reports it).
func (d *Device) Size() int64 { d.mu.Lock(); defer d.mu.Unlock(); return d.size }

// BlockSize is the logical block size.
func (d *Device) BlockSize() int { d.mu.Lock(); defer d.mu.Unlock(); return d.bs }

// ReadOnly reports write protection.
func (d *Device) ReadOnly() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.ro }

// CanDiscard reports whether the unit deallocates.
func (d *Device) CanDiscard() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.dis }

// Ready is closed once the unit has been seen through a path: Size and BlockSize are known
// from then on.
func (d *Device) Ready() <-chan struct{} { return d.ready }

// ID is the logical unit's designator (nil before a path was seen).
func (d *Device) ID() []byte { d.mu.Lock(); defer d.mu.Unlock(); return bytes.Clone(d.id) }

// request is an asynchronous read or write in flight; pooled, so that the steady state
// allocates nothing per I/O.
type request struct {
	d        *Device
	cb       func(error) // r.complete, bound once
	ctx      context.Context
	buf      []byte
	off      int64
	write    bool
	fua      bool
	done     func(error)
	p        *path
	deadline time.Time
}

// BeginPosts opens a bracket on the paths' post-batching devices (see PostBatchPath): the
// commands posted until EndPosts, on whichever path, are sent together.
func (d *Device) BeginPosts() {
	for _, b := range d.batchers {
		b.BeginPosts()
	}
}

// EndPosts ends a BeginPosts bracket.
func (d *Device) EndPosts() {
	for _, b := range d.batchers {
		b.EndPosts()
	}
}

// ReadAtAsync starts a read through the active path; done is called once, maybe on the
// transport's goroutine.
func (d *Device) ReadAtAsync(ctx context.Context, p []byte, off int64, done func(error)) {
	d.start(ctx, p, off, false, false, done)
}

// WriteAtAsync starts a write through the active path.
func (d *Device) WriteAtAsync(ctx context.Context, p []byte, off int64, fua bool, done func(error)) {
	d.start(ctx, p, off, true, fua, done)
}

func (d *Device) start(ctx context.Context, p []byte, off int64, write, fua bool, done func(error)) {
	r := d.reqs.Get().(*request)
	r.ctx, r.buf, r.off, r.write, r.fua, r.done = ctx, p, off, write, fua, done
	r.deadline = time.Time{}
	r.issue()
}

// issue posts r on the active path; without one it waits on a goroutine of its own (the
// rare case), never on the caller's.
func (r *request) issue() {
	p, l, _ := r.d.current()
	if p == nil {
		if r.deadline.IsZero() {
			r.deadline = time.Now().Add(r.d.opts.NoPathTimeout)
		}
		go func() {
			p, l, err := r.d.wait(r.ctx, r.deadline)
			if err != nil {
				r.finish(err)
				return
			}
			r.post(p, l)
		}()
		return
	}
	r.post(p, l)
}

func (r *request) post(p *path, l *initiator.LUN) {
	r.p = p
	if r.write {
		l.WriteAtAsync(r.ctx, r.buf, r.off, r.fua, r.cb)
	} else {
		l.ReadAtAsync(r.ctx, r.buf, r.off, r.cb)
	}
}

func (r *request) complete(err error) {
	if pathError(err) && !r.d.closed.Load() {
		if r.deadline.IsZero() {
			r.deadline = time.Now().Add(r.d.opts.NoPathTimeout)
		}
		if time.Now().Before(r.deadline) {
			r.d.failed(r.p, err)
			r.issue()
			return
		}
	}
	if err == nil || !pathError(err) {
		r.p.ios.Add(1)
	}
	r.finish(err)
}

func (r *request) finish(err error) {
	done := r.done
	*r = request{d: r.d, cb: r.cb}
	r.d.reqs.Put(r)
	done(err)
}
