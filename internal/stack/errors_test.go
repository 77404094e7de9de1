package stack

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
)

// TestListenErrorsSayTheAddressOnce: a transport on a busy UDP port, and a target on a busy CM
// port, say the address once, not "bind UDP a:p: listen udp4 a:p: bind: ..." nor "listen on a
// port p: listen on a port p: ...".
func TestListenErrorsSayTheAddressOnce(t *testing.T) {
	ctx := context.Background()
	busy, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	port := busy.LocalAddr().(*net.UDPAddr).Port
	cfg := config.Transport{Name: "lo", Driver: config.DriverSoftRoCE, Address: "127.0.0.1", UDPPort: port}
	_, err = OpenTransport(ctx, cfg, TransportOptions{Logger: zap.NewNop()})
	bind := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
	if want := "transport lo: bind UDP " + bind.String() + ": address already in use"; err == nil || err.Error() != want {
		t.Fatalf("OpenTransport on a busy port = %v, want %q", err, want)
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("errors.Is(%v, EADDRINUSE) = false", err)
	}

	cfg.UDPPort = 0
	tr, err := OpenTransport(ctx, cfg, TransportOptions{Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close(ctx)
	tc := config.Target{Name: "a", PortID: config.MakePortID(1, 1), CMPort: 5555, Listen: []string{"127.0.0.1"}}
	a, err := StartTarget(tc, tr, nil, TargetOptions{Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop(ctx, nil)
	tc.Name, tc.PortID = "b", config.MakePortID(2, 2)
	b, err := StartTarget(tc, tr, nil, TargetOptions{Logger: zap.NewNop()})
	if err == nil {
		b.Stop(ctx, nil)
		t.Fatal("a second target on the same CM port started")
	}
	if want := "target b: listen on 127.0.0.1 port 5555: "; !strings.HasPrefix(err.Error(), want) || strings.Count(err.Error(), "listen on") != 1 {
		t.Fatalf("StartTarget on a busy CM port = %q, want it to start with %q and say listen on once", err, want)
	}
}
