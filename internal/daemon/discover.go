package daemon

import (
	"context"
	"fmt"
	"slices"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/stack"
	"github.com/srpd/srpd/srp"
)

var _ ctlapi.DiscoverService = (*Daemon)(nil)

// Discover implements ctlapi.DiscoverService: a probe login through one of our transports
// (stack.Discover), and an initiator extension that none of our connections to that target
// port uses, for the connection the operator makes next.
func (d *Daemon) Discover(ctx context.Context, r ctlapi.DiscoverRequest) (*ctlapi.Discovery, error) {
	d.mu.RLock()
	name := r.Transport
	if name == "" {
		names := make([]string, 0, len(d.transports))
		for n := range d.transports {
			names = append(names, n)
		}
		slices.Sort(names)
		if len(names) > 0 {
			name = names[0]
		}
	}
	tr := d.transports[name]
	d.mu.RUnlock()
	if tr == nil {
		if r.Transport == "" {
			return nil, fmt.Errorf("discover: no transport is up: %w", ctlapi.ErrUnavailable)
		}
		return nil, fmt.Errorf("discover: transport %q: %w", r.Transport, ctlapi.ErrNotFound)
	}
	var id *srp.PortID
	if r.TargetPortID != nil {
		p := r.TargetPortID.SRP()
		id = &p
	}
	found, err := stack.Discover(ctx, tr, r.Address, r.Port, id, d.log.Named("discover"))
	if found == nil {
		// The target is not there, refuses the probe or does not say its port ID.
		return nil, ctlapi.WithCode(fmt.Errorf("discover %s: %w", r.Address, err), ctlapi.ErrUnavailable)
	}
	if err != nil {
		d.log.Warn("discover: " + err.Error())
	}
	out := &ctlapi.Discovery{Address: found.Remote.String(), Transport: name,
		TargetPortID: config.PortID(found.TargetPortID), TargetPortIDFromHint: found.FromHint,
		ProbeInitiatorPortID: config.PortID(found.ProbePortID), LUNs: []ctlapi.DiscoveredLUN{}}
	// The lowest initiator extension no connection of ours to this target port uses.
	used := map[uint64]bool{}
	d.mu.RLock()
	for _, s := range d.cfg.Sessions {
		if s.TargetPortID == out.TargetPortID {
			used[uint64(s.InitiatorExt)] = true
		}
	}
	d.mu.RUnlock()
	for used[out.InitiatorExt] {
		out.InitiatorExt++
	}
	for _, l := range found.LUNs {
		out.LUNs = append(out.LUNs, ctlapi.DiscoveredLUN{LUN: l.Number, Vendor: l.Vendor, Product: l.Product,
			Revision: l.Revision, Serial: l.Serial, ID: l.IDString(), BlockSize: l.BlockSize,
			Capacity: int64(l.Blocks) * int64(l.BlockSize), ReadOnly: l.ReadOnly})
	}
	return out, nil
}
