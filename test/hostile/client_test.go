//go:build hostile

package hostile

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/srpd/srpd/initiator"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport/softroce"
	"github.com/srpd/srpd/transport/softroce/link"
)

// The attackers' side: softroce devices of this test process on 127.0.0.x (x ≥ 2), told where
// srpd's RoCEv2 socket is, and SRP sessions that log in through them with the initiator package.

func targetPortID() srp.PortID { return srp.MakePortID(0xaa, 0xaa) }

// clientDevice opens a softroce device on addr (ephemeral UDP port) aimed at srpd's port.
// maxQP 0 keeps softroce's default.
func clientDevice(t *testing.T, d *daemon, addr string, maxQP int) *softroce.Device {
	t.Helper()
	lnk, err := link.ListenUDP(context.Background(), netip.AddrPortFrom(netip.MustParseAddr(addr), 0), link.UDPOptions{})
	if err != nil {
		t.Fatalf("client link on %s: %v", addr, err)
	}
	dev, err := softroce.Open(softroce.Config{Name: "hostile-" + addr, Link: lnk, MaxQP: maxQP})
	if err != nil {
		lnk.Close()
		t.Fatalf("client device on %s: %v", addr, err)
	}
	dev.SetPeerUDPPort(netip.MustParseAddr("127.0.0.1"), uint16(d.udpPort))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = dev.Close(ctx)
	})
	return dev
}

// sessionConfig is a small initiator session: what a flooding client would use to hold many
// sessions cheaply (queue depth 2, 4 KiB I/O, no immediate data) and bounded timeouts.
func sessionConfig(dev *softroce.Device, ext uint64, channels int) initiator.Config {
	return initiator.Config{
		Name:                 fmt.Sprintf("hostile-%x", ext),
		Device:               dev,
		Dialer:               &initiator.CMDialer{CM: dev, Remote: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), targetCMPort)},
		LoginForm:            initiator.LoginRDMACM,
		TargetPortID:         targetPortID(),
		InitiatorExt:         ext,
		ChCount:              channels,
		QueueDepth:           2,
		MaxIOSize:            4096,
		DisableImmediateData: true,
		CommandTimeout:       10 * time.Second,
		ConnectTimeout:       5 * time.Second,
		ReconnectDelay:       5 * time.Second,
		FastIOFailTmo:        10 * time.Second,
		DevLossTmo:           20 * time.Second,
	}
}

func closeSession(s *initiator.Session) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = s.Close(ctx)
}
