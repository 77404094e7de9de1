package stack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce"
	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/verbs"
)

// Transport is an open RDMA device: a softroce device on one UDP socket, or a kernel verbs
// device (transport/verbs, build tag `verbs`). Both implement transport.Device and
// transport.ConnManager; what only softroce has (per-peer UDP ports, engine counters) is
// reached through SoftRoCE.
type Transport struct {
	Config config.Transport
	Device transport.Device
	CM     transport.ConnManager
	// Bound is the softroce UDP socket's address (the port an ephemeral bind chose); invalid
	// for verbs.
	Bound netip.AddrPort
	log   *zap.Logger
}

// TransportOptions are what opening a transport takes beyond its configuration.
type TransportOptions struct {
	Logger *zap.Logger
	// MaxQP and MaxMR size the softroce engine (0: its defaults, 1024 QPs and 65536 MRs);
	// srpbench's memory probe logs in more sessions than that.
	MaxQP, MaxMR int
	// BusyPoll is the softroce receive busy poll (link.UDPOptions.BusyPoll; config.Config.BusyPoll
	// gives a configuration's); 0: off.
	BusyPoll time.Duration
	// OpenVerbs opens a kernel verbs device (nil: verbs.OpenDevice); tests stand in for the
	// engine with it.
	OpenVerbs func(name string, cfg verbs.Config) (transport.Device, error)
}

// OpenTransport opens the device of cfg with the engine its driver names.
func OpenTransport(ctx context.Context, cfg config.Transport, o TransportOptions) (*Transport, error) {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	switch cfg.Driver {
	case config.DriverSoftRoCE:
		return openSoftRoCE(ctx, cfg, o)
	case config.DriverVerbs:
		return openVerbs(cfg, o)
	default:
		return nil, fmt.Errorf("transport %s: unknown driver %q: %w", cfg.Name, cfg.Driver, ctlapi.ErrInvalidArgument)
	}
}

// openVerbs opens port cfg.Port of the RDMA device cfg.Device through libibverbs.
func openVerbs(cfg config.Transport, o TransportOptions) (*Transport, error) {
	log := o.Logger
	if cfg.Device == "" {
		return nil, fmt.Errorf("transport %s: the verbs driver needs an RDMA device (see `srpctl link list`): %w",
			cfg.Name, ctlapi.ErrInvalidArgument)
	}
	open := o.OpenVerbs
	if open == nil {
		open = verbs.OpenDevice
	}
	dev, err := open(cfg.Device, verbs.Config{Port: cfg.Port, Logger: log.Named("verbs")})
	if err != nil {
		switch {
		case errors.Is(err, verbs.ErrUnavailable) && !verbs.Built:
			return nil, fmt.Errorf("transport %s: driver verbs (device %s): srpd was built without -tags verbs "+
				"(rebuild with `go build -tags verbs`, cgo and libibverbs-dev/librdmacm-dev, or use driver softroce): %w (%w)",
				cfg.Name, cfg.Device, ctlapi.ErrUnsupported, verbs.ErrUnavailable)
		case errors.Is(err, verbs.ErrUnavailable):
			return nil, fmt.Errorf("transport %s: driver verbs: device %s port %d: %w (see `srpctl link list`) (%w)",
				cfg.Name, cfg.Device, cfg.Port, err, ctlapi.ErrUnavailable)
		}
		return nil, fmt.Errorf("transport %s: driver verbs: device %s port %d: %w", cfg.Name, cfg.Device, cfg.Port, err)
	}
	cm, ok := dev.(transport.ConnManager)
	if !ok {
		closeDevice(dev, log)
		return nil, fmt.Errorf("transport %s: device %s has no RDMA connection manager: %w", cfg.Name, cfg.Device, ctlapi.ErrUnsupported)
	}
	t := &Transport{Config: cfg, Device: dev, CM: cm, log: log}
	a := dev.Attr()
	var addrs []string
	for _, ip := range t.Addrs() {
		addrs = append(addrs, ip.String())
	}
	log.Info("transport up", zap.String("driver", cfg.Driver), zap.String("device", cfg.Device), zap.Int("port", cfg.Port),
		zap.Strings("addresses", addrs), zap.Stringer("active_mtu", a.ActiveMTU), zap.Int("max_qp_wr", a.MaxQPWR))
	if cfg.MTU != 0 {
		log.Info("verbs: the path MTU is the port's active MTU; the configured mtu is not applied",
			zap.Int("mtu", cfg.MTU), zap.Stringer("active_mtu", a.ActiveMTU))
	}
	return t, nil
}

func openSoftRoCE(ctx context.Context, cfg config.Transport, o TransportOptions) (*Transport, error) {
	log := o.Logger
	addr, err := bindAddress(cfg)
	if err != nil {
		return nil, fmt.Errorf("transport %s: %w", cfg.Name, err)
	}
	bind := netip.AddrPortFrom(addr, uint16(cfg.UDPPort))
	// GRO takes coalesced datagrams from the kernel; GSO applies to loopback destinations
	// (initiator and target on one host) and to srpd peers that negotiated it (CM ECE), where
	// it cuts the per-packet stack cost (a capture on lo then shows the unsegmented
	// super-packets); kernel rxe peers never get it.
	lnks, err := link.ListenUDPQueues(ctx, bind, link.UDPOptions{SocketBuffer: int(cfg.SocketBuffer), GRO: true, GSO: true, BusyPoll: o.BusyPoll},
		max(cfg.Queues, 1))
	if err != nil {
		return nil, fmt.Errorf("transport %s: bind UDP %v: %w", cfg.Name, bind, ListenCause(err))
	}
	lnk := lnks[0]
	var queues []link.Link
	for _, q := range lnks[1:] {
		queues = append(queues, q)
	}
	var addrs []netip.AddrPort
	if addr.IsUnspecified() {
		// A wildcard socket answers on every address: give the device the host's addresses of
		// that family as its GIDs (the first one is GID 0, which makes the initiator port ID).
		for _, a := range hostAddrs(addr.Is4()) {
			addrs = append(addrs, netip.AddrPortFrom(a, lnk.LocalAddrPort().Port()))
		}
	}
	dev, err := softroce.Open(softroce.Config{Name: "srpd-" + cfg.Name, Link: lnk, Queues: queues, Addrs: addrs, Logger: log.Named("softroce"),
		MTU: transport.MTUFromBytes(cfg.MTU), MaxQP: o.MaxQP, MaxMR: o.MaxMR, KeepICRC: cfg.KeepICRC})
	if err != nil {
		for _, l := range lnks {
			_ = l.Close()
		}
		return nil, fmt.Errorf("transport %s: %w", cfg.Name, err)
	}
	if d := time.Duration(cfg.PacketLifeTime); d > 0 {
		c := dev.CMConfig()
		c.PacketLifeTime = LifeTimeExponent(d)
		if err := dev.ConfigureCM(c); err != nil {
			_ = dev.Close(context.Background())
			return nil, fmt.Errorf("transport %s: %w", cfg.Name, err)
		}
	}
	t := &Transport{Config: cfg, Device: dev, CM: dev, Bound: lnk.LocalAddrPort(), log: log}
	log.Info("transport up", zap.String("driver", cfg.Driver), zap.Stringer("udp", t.Bound), zap.Int("mtu", cfg.MTU),
		zap.Duration("busy_poll", o.BusyPoll), zap.Int("queues", len(lnks)))
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

// Addrs are the IP addresses the transport answers on. A verbs device's link-local IPv6 GIDs
// are left out (rdma_cm needs a scope to bind them, and RDMA CM peers use routable addresses).
func (t *Transport) Addrs() []netip.Addr {
	var out []netip.Addr
	for _, a := range t.Device.Addrs() {
		ip := a.Addr().Unmap()
		if t.Config.Driver == config.DriverVerbs && (ip.IsLinkLocalUnicast() || slices.Contains(out, ip)) {
			continue
		}
		out = append(out, ip)
	}
	if len(out) == 0 && t.Bound.IsValid() {
		out = append(out, t.Bound.Addr())
	}
	return out
}

// Prefers4 reports whether the transport's (first) address is IPv4: the family to prefer when
// a target's host name resolves to both.
func (t *Transport) Prefers4() bool {
	if t.Bound.IsValid() {
		return t.Bound.Addr().Is4()
	}
	as := t.Addrs()
	return len(as) == 0 || as[0].Is4()
}

// SoftRoCE returns the softroce device, or nil for another engine.
func (t *Transport) SoftRoCE() *softroce.Device {
	d, _ := t.Device.(*softroce.Device)
	return d
}

// peerPorter is softroce's per-peer UDP port (the kernel verbs stack is always on 4791).
type peerPorter interface {
	SetPeerUDPPort(addr netip.Addr, port uint16)
}

// SetPeerUDPPort tells a softroce device that the peer at ip has its RoCEv2 socket on port
// (two devices on ephemeral ports of one host: the demo, benchmarks). It reports false for an
// engine without per-peer ports.
func (t *Transport) SetPeerUDPPort(ip netip.Addr, port uint16) bool {
	pp, ok := t.Device.(peerPorter)
	if ok {
		pp.SetPeerUDPPort(ip, port)
	}
	return ok
}

// samePeerPort tells the device that a peer at ip uses our UDP port, when ours is not the
// RoCEv2 port 4791 (several daemons on one host, tests): a softroce peer on another port must
// be configured with the same udp_port; a kernel (rxe) peer is always on 4791, and so must we
// be.
func (t *Transport) samePeerPort(ip netip.Addr) {
	if t.Bound.IsValid() && t.Bound.Port() != link.UDPPort {
		t.SetPeerUDPPort(ip, t.Bound.Port())
	}
}

// SoftRoCEStats returns the softroce engine's counters, or ok false for another engine.
func (t *Transport) SoftRoCEStats() (s softroce.Stats, cm softroce.CMStats, ok bool) {
	d, ok := t.Device.(interface {
		Stats() softroce.Stats
		CMStats() softroce.CMStats
	})
	if !ok {
		return s, cm, false
	}
	return d.Stats(), d.CMStats(), true
}

// DefaultCloseTimeout bounds Close when ctx has no earlier deadline.
const DefaultCloseTimeout = 5 * time.Second

func closeDevice(dev transport.Device, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultCloseTimeout)
	defer cancel()
	if err := dev.Close(ctx); err != nil && !errors.Is(err, context.Canceled) {
		log.Warn("closing transport", zap.Error(err))
	}
}

// Close closes the device, bounded by ctx and DefaultCloseTimeout; a drain that does not
// finish in time is logged, not returned.
func (t *Transport) Close(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, DefaultCloseTimeout)
	defer cancel()
	if err := t.Device.Close(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.log.Warn("closing transport", zap.Error(err))
	}
	t.log.Info("transport closed")
}

// ListenCause is what a failed net listen says beyond the operation and address a caller's own
// message names: "address already in use" out of "listen udp4 127.0.0.1:4791: bind: address
// already in use", which under "bind UDP 127.0.0.1:4791: " would say the address twice. A
// failed bind gives its errno (errors.Is(err, syscall.EADDRINUSE) holds); another system
// call (a socket option) keeps its name. An error that is not a *net.OpError is returned as is.
func ListenCause(err error) error {
	oe, ok := err.(*net.OpError)
	if !ok {
		return err
	}
	if se, ok := oe.Err.(*os.SyscallError); ok && se.Syscall == "bind" {
		return se.Err
	}
	return oe.Err
}

// LifeTimeExponent is the IB time exponent n (4.096 µs × 2^n, IBA 12.7.34) of the shortest
// packet life time not below d, within 1..31.
func LifeTimeExponent(d time.Duration) uint8 {
	n := uint8(1)
	for n < 31 && time.Duration(4096)<<n < d {
		n++
	}
	return n
}
