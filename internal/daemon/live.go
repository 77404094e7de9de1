package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/stack"
	"github.com/srpd/srpd/scsi"
)

// Live changes of a running target (config.PlanTarget decides which changes are live): LUNs
// opened, resized, write-protected, reopened and closed, and the ACL views changed with
// target.Reconfigure, while the initiators stay logged in. The unit attentions that tell them
// are the target's and the scsi package's business.

// lunDrainTimeout bounds the wait for the commands admitted to a LUN that leaves every view.
const lunDrainTimeout = 10 * time.Second

// applyLive applies plan p to running target name, going from oc to nc (opMu held). On error
// what was applied stays applied (the caller goes back to the old configuration the same way).
func (d *Daemon) applyLive(ctx context.Context, oc, nc *config.Target, p config.TargetPlan, guard *lunGuard) error {
	d.mu.RLock()
	rt := d.targets[p.Name]
	d.mu.RUnlock()
	if rt == nil {
		return fmt.Errorf("target %s is not running: %w", p.Name, ctlapi.ErrUnavailable)
	}
	log := rt.log
	luns := maps.Clone(rt.luns)
	var (
		reopen = map[int]bool{}
		retire []*lunRT // unmapped: closed once drained
		errs   []error
	)
	// In place: sizes and write protection.
	for _, op := range p.Ops {
		lr := luns[op.LUN]
		switch op.Kind {
		case config.LUNResize:
			if lr == nil {
				continue
			}
			n, err := lr.Resize(int64(nc.LUN(op.LUN).Size))
			if err != nil {
				return fmt.Errorf("target %s: %w", p.Name, err)
			}
			log.Info("LUN resized", zap.Int("lun", op.LUN), zap.Int64("capacity", n))
			d.mu.Lock()
			lr.Config.Size = nc.LUN(op.LUN).Size
			d.mu.Unlock()
		case config.LUNReadOnly:
			if lr == nil {
				continue
			}
			ro := nc.LUN(op.LUN).ReadOnly
			err := lr.SCSI.SetReadOnly(ro)
			if errors.Is(err, scsi.ErrBackendReadOnly) {
				reopen[op.LUN] = true // opened read-only: open it again read-write
				continue
			}
			if err != nil {
				return fmt.Errorf("target %s: LUN %d: %w", p.Name, op.LUN, err)
			}
			d.mu.Lock()
			lr.Config.ReadOnly = ro
			d.mu.Unlock()
			log.Info("LUN write protection changed", zap.Int("lun", op.LUN), zap.Bool("read_only", ro))
		case config.LUNReopen:
			reopen[op.LUN] = true
		case config.LimitsChange:
			lim := stack.TargetConfig(nc, nil, d.log).Limits
			lim.MaxTransfer = rt.Port.Limits().MaxTransfer // not configurable: what the target started with
			if err := rt.Port.SetLimits(lim); err != nil {
				return err
			}
			d.mu.Lock()
			rt.Config.Limits = nc.Limits
			d.mu.Unlock()
			log.Info("limits changed: new logins negotiate them")
		case config.LUNRemove:
			if lr != nil {
				delete(luns, op.LUN)
				retire = append(retire, lr)
			}
		}
	}
	// LUNs reopened leave the views first: the new open may need what the old one holds
	// (a file's exclusive lock).
	for id := range reopen {
		if lr := luns[id]; lr != nil {
			delete(luns, id)
			retire = append(retire, lr)
		}
	}
	if len(retire) > 0 && len(reopen) > 0 {
		if err := d.reconfigure(rt, nc, luns); err != nil {
			return err
		}
	}
	d.retireLUNs(ctx, rt, retire)
	// Opened: the LUNs added and reopened.
	for _, l := range nc.LUNs {
		if luns[l.ID] != nil {
			continue
		}
		lr, err := openLUN(nc, l, guard, d.log.With(zap.String("target", nc.Name)))
		d.mu.Lock()
		if err != nil {
			if rt.lunErrs == nil {
				rt.lunErrs = map[int]string{}
			}
			rt.lunErrs[l.ID] = err.Error()
		} else {
			delete(rt.lunErrs, l.ID)
		}
		d.mu.Unlock()
		if err != nil {
			errs = append(errs, fmt.Errorf("target %s: %w", p.Name, err))
			continue
		}
		log.Info("LUN open", zap.Int("lun", l.ID), zap.String("backend", l.Backend), zap.String("path", l.Path),
			zap.Int64("capacity", lr.Capacity), zap.Bool("read_only", l.ReadOnly), zap.Bool("live", true))
		luns[l.ID] = lr
	}
	if err := d.reconfigure(rt, nc, luns); err != nil {
		for id, lr := range luns {
			if rt.luns[id] != lr {
				lr.close(log)
			}
		}
		return errors.Join(append(errs, err)...)
	}
	d.mu.Lock()
	rt.Config = *nc
	rt.luns = luns
	rt.LUNs = stackLUNs(luns)
	for id := range rt.lunErrs {
		if nc.LUN(id) == nil {
			delete(rt.lunErrs, id)
		}
	}
	d.mu.Unlock()
	for _, l := range p.Summary() {
		log.Info("applied live", zap.String("change", l))
	}
	return errors.Join(errs...)
}

// reconfigure gives the running target the views of nc over luns.
func (d *Daemon) reconfigure(rt *targetRT, nc *config.Target, luns map[int]*lunRT) error {
	tcfg := stack.TargetConfig(nc, stackLUNs(luns), d.log)
	res, err := rt.Port.Reconfigure(tcfg)
	if err != nil {
		return fmt.Errorf("target %s: %w", nc.Name, err)
	}
	for _, ini := range res.LoggedOut {
		rt.log.Info("initiator logged out by the change of its ACL", zap.Stringer("initiator", ini))
	}
	// The views now show what luns holds: the daemon's maps follow, so that a failure later
	// does not leave them naming LUNs the target no longer maps.
	d.mu.Lock()
	rt.luns = maps.Clone(luns)
	rt.LUNs = stackLUNs(luns)
	d.mu.Unlock()
	return nil
}

// retireLUNs waits for the commands admitted to LUNs that left every view, then closes them.
func (d *Daemon) retireLUNs(ctx context.Context, rt *targetRT, retire []*lunRT) {
	if len(retire) == 0 {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lunDrainTimeout)
	defer cancel()
	for _, lr := range retire {
		if err := rt.Port.DrainLUN(dctx, lr.SCSI); err != nil {
			rt.log.Warn("closing a removed LUN with commands still in flight", zap.Int("lun", lr.Config.ID), zap.Error(err))
		}
		lr.close(rt.log)
		rt.log.Info("LUN closed", zap.Int("lun", lr.Config.ID), zap.Bool("live", true))
	}
}

func stackLUNs(luns map[int]*lunRT) map[int]*stack.LUN {
	m := make(map[int]*stack.LUN, len(luns))
	for id, l := range luns {
		m[id] = l.LUN
	}
	return m
}

// livePlan is config.PlanTarget for target o → n of diff, with the LUNs diff lists as changed
// although their configuration is the same (allowed_paths changed: their real paths are
// checked again by opening them).
func livePlan(diff *config.Changeset, o, n *config.Target) config.TargetPlan {
	var recheck []int
	if td := diff.Target(n.Name); td != nil && diff.AllowedPaths {
		for _, id := range td.LUNs.Changed {
			if ol, nl := o.LUN(id), n.LUN(id); ol != nil && nl != nil && equalLUN(ol, nl) {
				recheck = append(recheck, id)
			}
		}
	}
	return config.PlanTarget(o, n, recheck...)
}

func equalLUN(a, b *config.LUN) bool { return reflect.DeepEqual(*a, *b) }

var _ ctlapi.LiveService = (*Daemon)(nil)

// UpdateLUN implements ctlapi.LiveService: a new size or write protection goes into the
// configuration and applies live (as a reload with that change would); a rescan reads the
// backend's size again and changes no configuration.
func (d *Daemon) UpdateLUN(ctx context.Context, target string, id int, u ctlapi.LUNUpdate, opts ctlapi.MutateOptions) (*ctlapi.LUNInfo, error) {
	if u.Rescan {
		if err := d.rescanLUN(target, id); err != nil {
			return nil, err
		}
	} else {
		err := d.mutate(ctx, opts.Persist, func(c *config.Config) error {
			t := c.Target(target)
			if t == nil {
				return notFound("target", target)
			}
			l := t.LUN(id)
			if l == nil {
				return notFound("LUN", fmt.Sprintf("%s/%d", target, id))
			}
			if u.Size != nil {
				switch l.Backend {
				case config.BackendBlockDev, config.BackendRBD:
					return fmt.Errorf("LUN %d: a %s LUN has the size of its device or image; grow that and rescan: %w",
						id, l.Backend, ctlapi.ErrInvalidArgument)
				}
				if cur := d.lunSize(target, id); cur > 0 && int64(*u.Size) < cur {
					return fmt.Errorf("LUN %d: %v is smaller than its capacity %v; LUNs never shrink: %w",
						id, *u.Size, config.Size(cur), ctlapi.ErrInvalidArgument)
				}
				l.Size = *u.Size
			}
			if u.ReadOnly != nil {
				l.ReadOnly = *u.ReadOnly
			}
			return nil
		}, d.targetUp(target))
		if err != nil {
			return nil, err
		}
	}
	return d.lunInfo(target, id)
}

// lunSize is the capacity of running LUN id of target in bytes (0: not running).
func (d *Daemon) lunSize(target string, id int) int64 {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if rt := d.targets[target]; rt != nil {
		if lr := rt.luns[id]; lr != nil {
			return lr.Size()
		}
	}
	return 0
}

// rescanLUN reads the size of a running LUN's backend again.
func (d *Daemon) rescanLUN(target string, id int) error {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	d.mu.RLock()
	rt := d.targets[target]
	var lr *lunRT
	if rt != nil {
		lr = rt.luns[id]
	}
	known := d.cfg.Target(target) != nil
	d.mu.RUnlock()
	switch {
	case !known:
		return notFound("target", target)
	case rt == nil:
		return fmt.Errorf("target %s is not running: %w", target, ctlapi.ErrUnavailable)
	case lr == nil:
		return notFound("LUN", fmt.Sprintf("%s/%d", target, id))
	}
	n, err := lr.Resize(0)
	if err != nil {
		return fmt.Errorf("target %s: %w", target, err)
	}
	rt.log.Info("LUN size read again", zap.Int("lun", id), zap.Int64("capacity", n))
	return nil
}

// UpdateACL implements ctlapi.LiveService: the ACL's view changes in place, to its sessions
// only.
func (d *Daemon) UpdateACL(ctx context.Context, target string, a config.ACL, opts ctlapi.MutateOptions) (*ctlapi.ACLInfo, error) {
	err := d.mutate(ctx, opts.Persist, func(c *config.Config) error {
		t := c.Target(target)
		if t == nil {
			return notFound("target", target)
		}
		for i := range t.ACLs {
			if t.ACLs[i].Initiator == a.Initiator {
				t.ACLs[i] = a
				return nil
			}
		}
		return notFound("ACL", a.Initiator.String())
	}, d.targetUp(target))
	if err != nil {
		return nil, err
	}
	return d.aclInfo(ctx, target, a.Initiator)
}
