package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/transport/softroce"
	"github.com/srpd/srpd/transport/softroce/link"
)

// transportRT is a running transport: one softroce device on one UDP socket.
type transportRT struct {
	cfg   config.Transport
	dev   *softroce.Device
	bound netip.AddrPort // the UDP socket's address
	log   *zap.Logger
}

// openTransport opens the transport's device. The verbs driver is not wired into the daemon
// yet (there is no transport/verbs package): it is refused with ErrUnsupported.
func openTransport(ctx context.Context, cfg config.Transport, log *zap.Logger) (*transportRT, error) {
	switch cfg.Driver {
	case config.DriverSoftRoCE:
	case config.DriverVerbs:
		return nil, fmt.Errorf("transport %s: the verbs driver is not available in this srpd yet (use driver softroce): %w",
			cfg.Name, ctlapi.ErrUnsupported)
	default:
		return nil, fmt.Errorf("transport %s: unknown driver %q: %w", cfg.Name, cfg.Driver, ctlapi.ErrInvalidArgument)
	}
	addr, err := bindAddress(cfg)
	if err != nil {
		return nil, fmt.Errorf("transport %s: %w", cfg.Name, err)
	}
	bind := netip.AddrPortFrom(addr, uint16(cfg.UDPPort))
	// GRO takes coalesced datagrams from the kernel; GSO only ever applies to loopback
	// destinations (initiator and target on one host), where it cuts the per-packet stack cost
	// (a capture on lo then shows the unsegmented super-packets).
	lnk, err := link.ListenUDP(ctx, bind, link.UDPOptions{SocketBuffer: int(cfg.SocketBuffer), GRO: true, GSO: true})
	if err != nil {
		return nil, fmt.Errorf("transport %s: bind UDP %v: %w", cfg.Name, bind, err)
	}
	var addrs []netip.AddrPort
	if addr.IsUnspecified() {
		// A wildcard socket answers on every address: give the device the host's addresses of
		// that family as its GIDs (the first one is GID 0, which makes the initiator port ID).
		for _, a := range hostAddrs(addr.Is4()) {
			addrs = append(addrs, netip.AddrPortFrom(a, lnk.LocalAddrPort().Port()))
		}
	}
	dev, err := softroce.Open(softroce.Config{Name: "srpd-" + cfg.Name, Link: lnk, Addrs: addrs, Logger: log.Named("softroce")})
	if err != nil {
		_ = lnk.Close()
		return nil, fmt.Errorf("transport %s: %w", cfg.Name, err)
	}
	t := &transportRT{cfg: cfg, dev: dev, bound: lnk.LocalAddrPort(), log: log}
	log.Info("transport up", zap.String("driver", cfg.Driver), zap.Stringer("udp", t.bound), zap.Int("mtu", cfg.MTU))
	return t, nil
}

// bindAddress is the address to bind: the configured one, or the first address of the
// configured interface (IPv4 preferred).
func bindAddress(cfg config.Transport) (netip.Addr, error) {
	if cfg.Address != "" {
		a, err := netip.ParseAddr(cfg.Address)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("address %q: %w", cfg.Address, err)
		}
		return a.Unmap(), nil
	}
	ifi, err := net.InterfaceByName(cfg.Interface)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("interface %s: %w", cfg.Interface, err)
	}
	as, err := ifi.Addrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("interface %s: addresses: %w", cfg.Interface, err)
	}
	var v6 netip.Addr
	for _, a := range as {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := p.Addr().Unmap()
		switch {
		case ip.Is4():
			return ip, nil
		case !v6.IsValid() && !ip.IsLinkLocalUnicast():
			v6 = ip
		}
	}
	if v6.IsValid() {
		return v6, nil
	}
	return netip.Addr{}, fmt.Errorf("interface %s has no usable IP address", cfg.Interface)
}

// hostAddrs lists the host's unicast addresses of one family.
func hostAddrs(v4 bool) []netip.Addr {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range as {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := p.Addr().Unmap()
		if ip.Is4() == v4 && !ip.IsMulticast() && !(ip.Is6() && ip.IsLinkLocalUnicast()) {
			out = append(out, ip)
		}
	}
	return out
}

// addrs are the IP addresses the transport answers on.
func (t *transportRT) addrs() []netip.Addr {
	var out []netip.Addr
	for _, a := range t.dev.Addrs() {
		out = append(out, a.Addr())
	}
	if len(out) == 0 {
		out = append(out, t.bound.Addr())
	}
	return out
}

// peerPort tells the device that a peer at ip uses our UDP port, when ours is not the RoCEv2
// port 4791 (several daemons on one host, tests): a softroce peer on another port must be
// configured with the same udp_port; a kernel (rxe) peer is always on 4791, and so must we be.
func (t *transportRT) peerPort(ip netip.Addr) {
	if t.bound.Port() != link.UDPPort {
		t.dev.SetPeerUDPPort(ip, t.bound.Port())
	}
}

func (t *transportRT) close(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := t.dev.Close(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.log.Warn("closing transport", zap.Error(err))
	}
	t.log.Info("transport closed")
}

func (t *transportRT) info() ctlapi.TransportInfo {
	info := ctlapi.TransportInfo{Name: t.cfg.Name, Driver: t.cfg.Driver, Device: t.dev.Name(), State: ctlapi.StateUp}
	for _, a := range t.dev.Addrs() {
		info.Addresses = append(info.Addresses, a.String())
	}
	if len(info.Addresses) == 0 {
		info.Addresses = []string{t.bound.String()}
	}
	return info
}
