package softroce_test

// The engine-independent conformance suite (transport/transporttest) on softroce: the same
// checks transport/verbs runs on kernel rxe inside the interop harness' guest (make test-verbs).

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce"
	"github.com/srpd/srpd/transport/softroce/cm"
	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/transporttest"
)

// quickCM shortens the CM's retry timers so that a lossy link does not make the CM subtests
// wait for the kernel's multi-second defaults.
var quickCM = cm.Config{PacketLifeTime: 9, CMResponseTimeout: 14, AckDelay: 12, MaxCMRetries: 8}

func openDev(t *testing.T, lnk link.Link, name string) *softroce.Device {
	t.Helper()
	return openDevConfig(t, softroce.Config{Link: lnk, Name: name})
}

// openDevConfig opens a device with cfg and quickCM, closed when the test ends.
func openDevConfig(t *testing.T, cfg softroce.Config) *softroce.Device {
	t.Helper()
	name := cfg.Name
	d, err := softroce.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Close(ctx); err != nil && !errors.Is(err, transport.ErrClosed) {
			t.Errorf("close %s: %v", name, err)
		}
	})
	if err := d.ConfigureCM(quickCM); err != nil {
		t.Fatal(err)
	}
	return d
}

func pipeFactory(faults link.Faults) transporttest.Factory {
	return func(t *testing.T) transporttest.Pair {
		a, b := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
		la, lb := link.NewPipe(a, b, link.PipeConfig{Seed: 7, AtoB: faults, BtoA: faults, QueueLen: 1024})
		da, db := openDev(t, la, "pipeA"), openDev(t, lb, "pipeB")
		return transporttest.Pair{
			A:     transporttest.Endpoint{Dev: da, Addr: a},
			B:     transporttest.Endpoint{Dev: db, Addr: b},
			Lossy: faults != link.Faults{},
		}
	}
}

func udpFactory(t *testing.T) transporttest.Pair {
	la, lb := softroce.ListenUDPPair(t, netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"), link.UDPOptions{})
	da, db := openDev(t, la, "udpA"), openDev(t, lb, "udpB")
	pa, pb := la.LocalAddrPort(), lb.LocalAddrPort()
	// Two devices on one host, each on an ephemeral port: tell each where the other listens.
	da.SetPeerUDPPort(pb.Addr(), pb.Port())
	db.SetPeerUDPPort(pa.Addr(), pa.Port())
	return transporttest.Pair{
		A: transporttest.Endpoint{Dev: da, Addr: pa.Addr(), Port: pa.Port()},
		B: transporttest.Endpoint{Dev: db, Addr: pb.Addr(), Port: pb.Port()},
	}
}

var allMTUsConf = []transport.MTU{transport.MTU256, transport.MTU512, transport.MTU1024, transport.MTU2048, transport.MTU4096}

func TestTransportConformancePipe(t *testing.T) {
	transporttest.RunConfig(t, pipeFactory(link.Faults{}), transporttest.Config{MTUs: allMTUsConf, LocalACKTimeout: 10})
}

func TestTransportConformancePipeLossy(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED in -short")
	}
	lossy := link.Faults{Drop: 0.02, Duplicate: 0.02, Reorder: 0.02, ReorderDistance: 3}
	transporttest.RunConfig(t, pipeFactory(lossy), transporttest.Config{LocalACKTimeout: 10})
}

func TestTransportConformanceUDP(t *testing.T) {
	transporttest.RunConfig(t, udpFactory, transporttest.Config{LocalACKTimeout: 10})
}

// loopFactory puts both endpoints on one device over UDP on 127.0.0.1: every packet goes to
// the device itself, so (loopback on) none may reach the link, or (noLoopback) all do.
func loopFactory(noLoopback bool) transporttest.Factory {
	return func(t *testing.T) transporttest.Pair {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l, err := link.ListenUDP(ctx, netip.MustParseAddrPort("127.0.0.1:0"), link.UDPOptions{})
		if err != nil {
			t.Skipf("SKIPPED: no UDP link on 127.0.0.1: %v", err)
		}
		d := openDevConfig(t, softroce.Config{Link: l, Name: "loop", NoLoopback: noLoopback})
		t.Cleanup(func() { // runs before the Close above
			s := d.Stats()
			if noLoopback {
				if s.LoopPackets != 0 {
					t.Errorf("loopback off: %d packets looped back, want 0", s.LoopPackets)
				}
			} else if s.TxPackets != 0 || s.RxPackets != 0 || s.LoopDrops != 0 {
				t.Errorf("loopback: %d packets sent and %d received on the link, %d dropped; want none (looped back: %d)",
					s.TxPackets, s.RxPackets, s.LoopDrops, s.LoopPackets)
			}
		})
		ap := l.LocalAddrPort()
		d.SetPeerUDPPort(ap.Addr(), ap.Port()) // the CM's MADs to itself: its own ephemeral port
		ep := transporttest.Endpoint{Dev: d, Addr: ap.Addr(), Port: ap.Port()}
		return transporttest.Pair{A: ep, B: ep}
	}
}

// TestTransportConformanceLoopback runs the suite with both endpoints on one device: the
// packets take the loopback path (loop.go), as between QPs of one kernel rxe device.
func TestTransportConformanceLoopback(t *testing.T) {
	transporttest.RunConfig(t, loopFactory(false), transporttest.Config{MTUs: allMTUsConf, LocalACKTimeout: 10})
}

// TestTransportConformanceLoopbackOff is the same through the link (Config.NoLoopback).
func TestTransportConformanceLoopbackOff(t *testing.T) {
	transporttest.RunConfig(t, loopFactory(true), transporttest.Config{LocalACKTimeout: 10})
}
