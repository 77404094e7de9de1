package stack

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/initiator"
	"github.com/srpd/srpd/internal/config"
)

// SessionOptions are what a login takes beyond the session's configuration.
type SessionOptions struct {
	Logger *zap.Logger
	// PeerUDPPort is the target's RoCEv2 UDP port when it is not ours (two softroce devices on
	// ephemeral ports of one host); 0: the target uses the same port as our transport.
	PeerUDPPort uint16
	// MaxIOSize caps one SCSI command's data (0: the initiator's default); srpbench sweeps it.
	MaxIOSize int
}

// Timeout maps an optional initiator timeout onto the initiator package's convention: def
// when omitted, initiator.Off when off.
func Timeout(t *config.Timeout, def time.Duration) time.Duration {
	switch {
	case t == nil:
		return def
	case t.Off():
		return initiator.Off
	}
	return t.Duration()
}

// Resolve returns the target's address of session s: its IP address, or the first address
// its host name resolves to, of the transport's family if there is one.
func Resolve(ctx context.Context, s *config.Session, tr *Transport) (netip.AddrPort, error) {
	ip, err := netip.ParseAddr(s.Address)
	if err != nil {
		ips, lerr := net.DefaultResolver.LookupNetIP(ctx, "ip", s.Address)
		if lerr != nil || len(ips) == 0 {
			return netip.AddrPort{}, fmt.Errorf("resolve %s: %w", s.Address, lerr)
		}
		ip = ips[0]
		for _, a := range ips {
			if a.Unmap().Is4() == tr.Prefers4() {
				ip = a
				break
			}
		}
	}
	return netip.AddrPortFrom(ip.Unmap(), uint16(s.Port)), nil
}

// SessionConfig maps session s onto the initiator package's configuration, logging in to
// remote through tr's RDMA CM.
func SessionConfig(s *config.Session, tr *Transport, remote netip.AddrPort, log *zap.Logger) initiator.Config {
	imm := s.ImmediateData == nil || *s.ImmediateData
	return initiator.Config{
		Name: s.Name, Device: tr.Device, Dialer: &initiator.CMDialer{CM: tr.CM, Remote: remote},
		LoginForm: initiator.LoginRDMACM, TargetPortID: s.TargetPortID.SRP(), InitiatorExt: uint64(s.InitiatorExt),
		ChCount: s.ChCount, QueueDepth: s.QueueDepth, MaxITIULen: uint32(s.MaxITIULen), DisableImmediateData: !imm,
		DisableRemoteInvalidate: s.RemoteInvalidate != nil && !*s.RemoteInvalidate,
		ConnectTimeout:          time.Duration(s.ConnectTimeout),
		ReconnectDelay:          Timeout(s.ReconnectDelay, initiator.DefaultReconnectDelay),
		FastIOFailTmo:           Timeout(s.FastIOFailTmo, initiator.DefaultFastIOFailTmo),
		DevLossTmo:              Timeout(s.DevLossTmo, initiator.DefaultDevLossTmo),
		Logger:                  log,
	}
}

// Dial logs session s in over tr: it resolves the target, opens every channel and discovers
// the LUNs. With a connect_timeout, one channel's login is bounded by it and the whole Dial by
// a little more than twice that; ctx bounds it in any case.
func Dial(ctx context.Context, s config.Session, tr *Transport, o SessionOptions) (*initiator.Session, error) {
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if ct := time.Duration(s.ConnectTimeout); ct > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*ct+5*time.Second)
		defer cancel()
	}
	remote, err := Resolve(ctx, &s, tr)
	if err != nil {
		return nil, err
	}
	if o.PeerUDPPort != 0 {
		tr.SetPeerUDPPort(remote.Addr(), o.PeerUDPPort)
	} else {
		tr.samePeerPort(remote.Addr())
	}
	cfg := SessionConfig(&s, tr, remote, log)
	cfg.MaxIOSize = o.MaxIOSize
	if s.Source != "" {
		log.Debug("source address: softroce connects from its transport's address", zap.String("source", s.Source))
	}
	sess, err := initiator.Dial(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("login to %v: %w", remote, err)
	}
	log.Info("connected", zap.Stringer("remote", remote), zap.Stringer("initiator_port", sess.InitiatorPortID()),
		zap.Int("luns", len(sess.LUNs())))
	return sess, nil
}
