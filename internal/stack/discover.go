package stack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/initiator"
	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/srp"
)

// ProbeInitiatorExt is the initiator extension of the identity Discover logs in with
// ("SRPDPROB"), so that a target's logs and ACLs can tell a probe from a real initiator.
const ProbeInitiatorExt = 0x5352504450524f42

// discoverTimeout bounds each probe login.
const discoverTimeout = 10 * time.Second

// Discovered is what Discover learnt of a target.
type Discovered struct {
	Remote       netip.AddrPort
	TargetPortID srp.PortID
	FromHint     bool // the target named its port ID (an srpd target)
	ProbePortID  srp.PortID
	LUNs         []initiator.LUNInfo
}

// Discover logs in to the SRP target at host:port over tr with the probe identity, reads its
// LUNs (REPORT LUNS, INQUIRY, VPD pages, READ CAPACITY: what every login does) and logs out.
// Without a target port ID (id nil) it first logs in naming port ID 0: an srpd target rejects
// that naming its own (srp.ParsePortHint), and Discover logs in again with it; a target that
// names none (ib_srpt) gives an error that says to pass the ID.
func Discover(ctx context.Context, tr *Transport, host string, port int, id *srp.PortID, log *zap.Logger) (*Discovered, error) {
	if log == nil {
		log = zap.NewNop()
	}
	port = cmp.Or(port, config.DefaultCMPort)
	s := config.Session{
		Name: "discover", Address: host, Port: port, InitiatorExt: config.ID64(ProbeInitiatorExt),
		ChCount: 1, QueueDepth: 16, ConnectTimeout: config.Duration(discoverTimeout),
		ReconnectDelay: config.TimeoutOff(), FastIOFailTmo: config.TimeoutOff(), DevLossTmo: config.TimeoutOf(discoverTimeout),
	}
	d := &Discovered{}
	remote, err := Resolve(ctx, &s, tr)
	if err != nil {
		return nil, err
	}
	d.Remote = remote
	if id != nil {
		s.TargetPortID = config.PortID(*id)
	} else {
		sess, err := Dial(ctx, s, tr, SessionOptions{Logger: log})
		if err == nil {
			// The target's port ID is 0.
			return d.finish(ctx, sess)
		}
		var lre *initiator.LoginRejectError
		if !errors.As(err, &lre) || !lre.HasTargetPortHint {
			if errors.As(err, &lre) && lre.Reason == srp.RejUnableAssociateChannel {
				return nil, fmt.Errorf("the target does not say its port ID (not an srpd target?): give it (--target-port-id): %w", err)
			}
			return nil, err
		}
		s.TargetPortID = config.PortID(lre.TargetPortHint)
		d.FromHint = true
	}
	d.TargetPortID = s.TargetPortID.SRP()
	sess, err := Dial(ctx, s, tr, SessionOptions{Logger: log})
	if err != nil {
		return nil, err
	}
	return d.finish(ctx, sess)
}

// finish records what sess found and logs it out.
func (d *Discovered) finish(ctx context.Context, sess *initiator.Session) (*Discovered, error) {
	d.ProbePortID = sess.InitiatorPortID()
	for _, l := range sess.LUNs() {
		d.LUNs = append(d.LUNs, l.Info())
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), discoverTimeout)
	defer cancel()
	if err := sess.Close(cctx); err != nil {
		return d, fmt.Errorf("logout: %w", err)
	}
	return d, nil
}
