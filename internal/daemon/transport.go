package daemon

import (
	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/stack"
)

// transportInfo describes a running transport (stack.OpenTransport) for the control API.
func transportInfo(t *stack.Transport) ctlapi.TransportInfo {
	info := ctlapi.TransportInfo{Name: t.Config.Name, Driver: t.Config.Driver, Device: t.Device.Name(), State: ctlapi.StateUp}
	if t.Config.Driver == config.DriverVerbs {
		for _, a := range t.Addrs() {
			info.Addresses = append(info.Addresses, a.String())
		}
		return info
	}
	for _, a := range t.Device.Addrs() {
		info.Addresses = append(info.Addresses, a.String())
	}
	if len(info.Addresses) == 0 {
		info.Addresses = []string{t.Bound.String()}
	}
	return info
}
