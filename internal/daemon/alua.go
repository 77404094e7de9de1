package daemon

import (
	"context"
	"fmt"
	"slices"
	"sort"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/scsi"
)

var _ ctlapi.ALUAService = (*Daemon)(nil)

// aluaTargetLocked returns the running target named name, which must have an alua section.
func (d *Daemon) aluaTargetLocked(name string) (*targetRT, *config.Target, error) {
	c, err := d.runningTarget(name)
	if err != nil {
		return nil, nil, err
	}
	t := d.targets[name]
	if t == nil {
		return nil, nil, fmt.Errorf("target %s is not running: %w", name, ctlapi.ErrUnavailable)
	}
	if c.ALUA == nil {
		return nil, nil, fmt.Errorf("target %s has no alua section: %w", name, ctlapi.ErrInvalidArgument)
	}
	return t, c, nil
}

// aluaInfos lists the ALUA state of the target's LUNs in LUN order.
func aluaInfos(t *targetRT, c *config.Target) []ctlapi.ALUAInfo {
	ids := make([]int, 0, len(t.luns))
	for id := range t.luns {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	out := []ctlapi.ALUAInfo{}
	for _, id := range ids {
		info := ctlapi.ALUAInfo{LUN: id, Groups: []ctlapi.ALUAGroupInfo{}}
		for _, g := range t.luns[id].SCSI.ALUAStates() {
			gi := ctlapi.ALUAGroupInfo{Group: int(g.ID), State: g.State.String(), Local: int(g.ID) == c.ALUA.Group}
			for _, r := range g.RelativePorts {
				gi.RelativePorts = append(gi.RelativePorts, int(r))
			}
			info.Groups = append(info.Groups, gi)
		}
		out = append(out, info)
	}
	return out
}

// GetALUA implements ctlapi.ALUAService.
func (d *Daemon) GetALUA(_ context.Context, target string) ([]ctlapi.ALUAInfo, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	t, c, err := d.aluaTargetLocked(target)
	if err != nil {
		return nil, err
	}
	return aluaInfos(t, c), nil
}

// SetALUA implements ctlapi.ALUAService: an implicit transition of one target port group on
// the target's LUNs (or one of them), live — sessions stay, the nexuses through the group's
// port get ASYMMETRIC ACCESS STATE CHANGED. The configuration is left as it is.
func (d *Daemon) SetALUA(_ context.Context, target string, ch ctlapi.ALUAChange) ([]ctlapi.ALUAInfo, error) {
	if err := ch.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", err, ctlapi.ErrInvalidArgument)
	}
	st, err := scsi.ParseALUAState(ch.State)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, ctlapi.ErrInvalidArgument)
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	t, c, err := d.aluaTargetLocked(target)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(c.ALUA.Groups(), ch.Group) {
		return nil, fmt.Errorf("target %s has no target port group %d: %w", target, ch.Group, ctlapi.ErrNotFound)
	}
	var luns []*lunRT
	if ch.LUN != nil {
		l := t.luns[*ch.LUN]
		if l == nil {
			return nil, notFound("LUN", fmt.Sprint(*ch.LUN))
		}
		luns = append(luns, l)
	} else {
		for _, l := range t.luns {
			luns = append(luns, l)
		}
	}
	for _, l := range luns {
		if err := l.SCSI.SetALUAState(uint16(ch.Group), st); err != nil {
			return nil, fmt.Errorf("target %s LUN %d: %w", target, l.Config.ID, err)
		}
	}
	t.log.Info("ALUA state changed", zap.Int("group", ch.Group), zap.String("state", st.String()), zap.Int("luns", len(luns)))
	return aluaInfos(t, c), nil
}
