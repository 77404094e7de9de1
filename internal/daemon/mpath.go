package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/initiator"
	"github.com/srpd/srpd/initiator/mpath"
	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/stack"
	"github.com/srpd/srpd/transport"
)

// mpathRT is a running multipath group: one mpath.Device per exported LUN over the group's
// sessions, and the NBD exports.
type mpathRT struct {
	cfg    config.Multipath
	log    *zap.Logger
	devs   map[int]*mpath.Device
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu   sync.Mutex
	exps []*stack.Export
}

// connPath is a session of ours as a path: its current login's LUN (the session object
// changes when the connection logs in anew after dev_loss_tmo).
type connPath struct {
	d    *Daemon
	name string
	lun  int
}

func (p connPath) Name() string { return p.name }

// PostBatcher makes the path an mpath.PostBatchPath: its session's transport device, when it
// batches posts (softroce).
func (p connPath) PostBatcher() transport.PostBatcher {
	p.d.mu.RLock()
	c := p.d.conns[p.name]
	p.d.mu.RUnlock()
	if c == nil || c.tr == nil {
		return nil
	}
	b, _ := c.tr.Device.(transport.PostBatcher)
	return b
}

func (p connPath) LUN() *initiator.LUN {
	p.d.mu.RLock()
	c := p.d.conns[p.name]
	p.d.mu.RUnlock()
	if c == nil {
		return nil
	}
	c.mu.Lock()
	s := c.sess
	c.mu.Unlock()
	if s == nil {
		return nil
	}
	return s.LUN(uint64(p.lun))
}

// startMultipath starts group m (its sessions are started first): a device per NBD export
// and the export. The devices wait for their paths; nothing here waits for a login.
func (d *Daemon) startMultipath(m config.Multipath, nbdGroup string) (*mpathRT, error) {
	rt := &mpathRT{cfg: m, log: d.log.With(zap.String("multipath", m.Name)), devs: map[int]*mpath.Device{}}
	npt := 30 * time.Second
	if m.NoPathTimeout != nil {
		npt = m.NoPathTimeout.Duration()
	}
	for _, e := range m.NBD {
		var paths []mpath.Path
		for _, s := range m.Sessions {
			paths = append(paths, connPath{d: d, name: s, lun: e.LUN})
		}
		dev, err := mpath.New(paths, mpath.Options{Logger: rt.log.With(zap.Int("lun", e.LUN)), NoPathTimeout: npt})
		if err != nil {
			rt.stop(context.Background())
			return nil, fmt.Errorf("multipath %s: %w", m.Name, err)
		}
		rt.devs[e.LUN] = dev
	}
	// Each export starts once its device has seen the unit through a path (the NBD
	// handshake needs its size and block size); until then its socket does not exist.
	rt.ctx, rt.cancel = context.WithCancel(context.Background())
	for _, e := range m.NBD {
		dev := rt.devs[e.LUN]
		rt.wg.Add(1)
		go func() {
			defer rt.wg.Done()
			select {
			case <-dev.Ready():
			case <-rt.ctx.Done():
				return
			}
			desc := fmt.Sprintf("srpd multipath %s LUN %d", m.Name, e.LUN)
			x, err := stack.ServeNBDDevice(initiator.NBDDevice(dev), desc, nil, e,
				stack.NBDOptions{Logger: rt.log, Session: m.Name, ShutdownTimeout: d.opts.drainTimeout() / 2, Group: nbdGroup})
			rt.mu.Lock()
			defer rt.mu.Unlock()
			if err != nil {
				rt.log.Error("NBD export failed", zap.Int("lun", e.LUN), zap.Error(err))
				return
			}
			if rt.ctx.Err() != nil {
				x.Stop()
			}
			rt.exps = append(rt.exps, x)
		}()
	}
	return rt, nil
}

// stop ends the exports (bounded by ctx) and the devices.
func (rt *mpathRT) stop(ctx context.Context) {
	if rt.cancel != nil {
		rt.cancel()
	}
	rt.wg.Wait()
	rt.mu.Lock()
	exps := rt.exps
	rt.mu.Unlock()
	for _, x := range exps {
		x.Stop()
	}
	for _, x := range exps {
		select {
		case <-x.Done():
		case <-ctx.Done():
			rt.log.Warn("NBD server did not stop in time", zap.String("socket", x.Config.Socket))
		}
	}
	for _, dev := range rt.devs {
		dev.Close()
	}
}

// info is the group for the API.
func (rt *mpathRT) info() ctlapi.MultipathInfo {
	mi := ctlapi.MultipathInfo{Name: rt.cfg.Name, Sessions: rt.cfg.Sessions, LUNs: []ctlapi.MultipathLUN{}}
	for _, e := range rt.cfg.NBD {
		dev := rt.devs[e.LUN]
		if dev == nil {
			continue
		}
		ml := ctlapi.MultipathLUN{LUN: e.LUN, Capacity: dev.Size(), BlockSize: dev.BlockSize(), NBDSocket: e.Socket}
		for _, p := range dev.Paths() {
			ml.Paths = append(ml.Paths, ctlapi.MultipathPath{Session: p.Name, Up: p.Up, Active: p.Active, Group: p.Group,
				ALUAState: p.State, Why: p.Why, IOs: p.IOs, Failures: p.Failures})
		}
		mi.LUNs = append(mi.LUNs, ml)
	}
	return mi
}

var _ ctlapi.MultipathService = (*Daemon)(nil)

// ListMultipath implements ctlapi.MultipathService.
func (d *Daemon) ListMultipath(context.Context) ([]ctlapi.MultipathInfo, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := []ctlapi.MultipathInfo{}
	for _, m := range d.cfg.Multipath {
		if rt := d.mpaths[m.Name]; rt != nil {
			out = append(out, rt.info())
		} else {
			out = append(out, ctlapi.MultipathInfo{Name: m.Name, Sessions: m.Sessions, LUNs: []ctlapi.MultipathLUN{}})
		}
	}
	return out, nil
}

// pathsLocked is connection name's place in the running multipath groups (d.mu held).
func (d *Daemon) pathsLocked(name string) []ctlapi.ConnectionPath {
	var out []ctlapi.ConnectionPath
	for _, m := range d.cfg.Multipath {
		rt := d.mpaths[m.Name]
		if rt == nil {
			continue
		}
		for _, l := range rt.info().LUNs {
			for _, p := range l.Paths {
				if p.Session == name {
					out = append(out, ctlapi.ConnectionPath{Multipath: m.Name, LUN: l.LUN, MultipathPath: p})
				}
			}
		}
	}
	return out
}
