package daemon

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/testutil"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce"
	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/verbs"
)

// plainDevice hides everything softroce has beyond transport.Device and transport.ConnManager,
// as the kernel verbs engine does.
type plainDevice struct {
	transport.Device
	transport.ConnManager
	extra []netip.AddrPort // more addresses (a link-local GID, a duplicate)
}

func (p plainDevice) Addrs() []netip.AddrPort { return append(p.Device.Addrs(), p.extra...) }

// TestVerbsTransportInDaemon runs a target on a transport with driver verbs — its device a
// softroce device behind plainDevice, so without the softroce-only methods — and logs in to it
// from a session on a softroce transport: the daemon wiring (listen addresses, dial, metrics,
// transport info) must work with any transport.Device.
func TestVerbsTransportInDaemon(t *testing.T) {
	port := testutil.FreeUDPPort(t)
	vAddr := netip.MustParseAddr("127.0.0.2")
	openVerbs := func(name string, cfg verbs.Config) (transport.Device, error) {
		lnk, err := link.ListenUDP(context.Background(), netip.AddrPortFrom(vAddr, uint16(port)), link.UDPOptions{})
		if err != nil {
			return nil, err
		}
		dev, err := softroce.Open(softroce.Config{Name: name, Link: lnk, Logger: cfg.Logger})
		if err != nil {
			_ = lnk.Close()
			return nil, err
		}
		dev.SetPeerUDPPort(netip.MustParseAddr("127.0.0.1"), uint16(port))
		return plainDevice{Device: dev, ConnManager: dev, extra: []netip.AddrPort{
			netip.MustParseAddrPort("[fe80::5054:ff:fe77:1]:4791"), netip.AddrPortFrom(vAddr, 4791)}}, nil
	}

	dir := testutil.ShortTempDir(t, "srpd-d-")
	path := filepath.Join(dir, "srpd.yaml")
	if err := os.WriteFile(path, []byte(testConfig(dir, port)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	// Not through config.Load: a build without the tag refuses driver verbs in validation.
	cfg.Transports = append(cfg.Transports, config.Transport{Name: "v", Driver: config.DriverVerbs, Device: "fake0", Port: 1})
	cfg.Targets = cfg.Targets[:1]
	cfg.Targets[0].Transport = "v"
	cfg.Sessions[0].Address = vAddr.String()
	log := zap.NewNop()
	if testing.Verbose() {
		log = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	}
	d := New(Options{ConfigPath: path, Logger: log, DrainTimeout: 20 * time.Second})
	d.openVerbs = openVerbs
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Start(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	defer d.Shutdown(context.Background())

	d.mu.RLock()
	tr := d.transports["v"]
	tgt := d.targets["a"]
	d.mu.RUnlock()
	if tr == nil || tgt == nil {
		t.Fatalf("transport v %v, target a %v", tr, tgt)
	}
	if as := tr.Addrs(); !slices.Equal(as, []netip.Addr{vAddr}) {
		t.Errorf("addrs = %v, want [%v] (no link-local, no duplicate)", as, vAddr)
	}
	if want := []string{netip.AddrPortFrom(vAddr, 5555).String()}; !slices.Equal(tgt.Listen, want) {
		t.Errorf("target listens on %v, want %v", tgt.Listen, want)
	}
	if info := transportInfo(tr); info.Driver != config.DriverVerbs || info.Device != "fake0" || !slices.Equal(info.Addresses, []string{vAddr.String()}) {
		t.Errorf("info = %+v", info)
	}
	deadline := time.Now().Add(30 * time.Second)
	for tgt.Port.Stats().Sessions != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no session on the verbs transport's target: %s", d.StatusLine())
		}
		time.Sleep(50 * time.Millisecond)
	}
	body := scrape(t, d)
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "srpd_softroce_") && strings.Contains(line, `transport="v"`) {
			t.Errorf("a softroce counter for the verbs transport: %s", line)
		}
	}
	for _, m := range []string{"tx_packets", "busy_polls", "busy_poll_hits", "busy_poll_skips", "held_packets", "held_sends", "payload_refs"} {
		if !strings.Contains(body, "srpd_softroce_"+m+`_total{transport="lo"}`) {
			t.Errorf("no srpd_softroce_%s_total for transport lo", m)
		}
	}
}
