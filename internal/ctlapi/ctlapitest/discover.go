package ctlapitest

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

var _ ctlapi.DiscoverService = (*Fake)(nil)

// Discover implements ctlapi.DiscoverService over the Fake's own configuration: the target
// whose cm_port is the request's port is found (the address is not looked at), as an srpd
// target answers a probe; a request naming another target port ID, or a port no target
// listens on, is not found.
func (f *Fake) Discover(_ context.Context, r ctlapi.DiscoverRequest) (*ctlapi.Discovery, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail("Discover"); err != nil {
		return nil, err
	}
	port := cmp.Or(r.Port, config.DefaultCMPort)
	for i := range f.cfg.Targets {
		t := &f.cfg.Targets[i]
		if cmp.Or(t.CMPort, config.DefaultCMPort) != port {
			continue
		}
		if r.TargetPortID != nil && *r.TargetPortID != t.PortID {
			break
		}
		d := &ctlapi.Discovery{
			Address:   netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)).String(),
			Transport: cmp.Or(r.Transport, t.Transport), TargetPortID: t.PortID, TargetPortIDFromHint: r.TargetPortID == nil,
			ProbeInitiatorPortID: config.MakePortID(0x5352504450524f42, 9), InitiatorExt: 1,
			LUNs: []ctlapi.DiscoveredLUN{},
		}
		for _, l := range t.LUNs {
			bs := cmp.Or(l.BlockSize, config.DefaultBlockSize)
			d.LUNs = append(d.LUNs, ctlapi.DiscoveredLUN{LUN: uint64(l.ID), Vendor: "SRPD", Product: l.Backend,
				Revision: "0001", Serial: t.Name + "-" + strconv.Itoa(l.ID), BlockSize: bs, Capacity: int64(l.Size), ReadOnly: l.ReadOnly})
		}
		return d, nil
	}
	return nil, fmt.Errorf("discover %s port %d: no target: %w", r.Address, port, ctlapi.ErrNotFound)
}
