package stack

import (
	"testing"
	"time"

	"github.com/srpd/srpd/initiator/nbd"
	"github.com/srpd/srpd/internal/config"
)

// TestNBDConfig: sessions[].nbd[] limits reach the NBD server, "off" as no write deadline, and
// the config's documented defaults are the server's.
func TestNBDConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    config.NBDExport
		conns int
		wt    time.Duration
	}{
		{"omitted", config.NBDExport{}, 0, 0},
		{"set", config.NBDExport{MaxConnections: 3, WriteTimeout: config.TimeoutOf(5 * time.Second)}, 3, 5 * time.Second},
		{"off", config.NBDExport{WriteTimeout: config.TimeoutOff()}, 0, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := NBDConfig(tc.in)
			if got.MaxConnections != tc.conns || got.WriteTimeout != tc.wt {
				t.Fatalf("MaxConnections %d, WriteTimeout %v; want %d, %v", got.MaxConnections, got.WriteTimeout, tc.conns, tc.wt)
			}
			if _, err := nbd.NewServer(got); err != nil {
				t.Fatalf("NewServer: %v", err)
			}
		})
	}
	if config.DefaultNBDMaxConnections != nbd.DefaultMaxConnections || config.DefaultNBDWriteTimeout != nbd.DefaultWriteTimeout {
		t.Fatalf("config defaults %d, %v differ from the NBD server's %d, %v", config.DefaultNBDMaxConnections,
			config.DefaultNBDWriteTimeout, nbd.DefaultMaxConnections, nbd.DefaultWriteTimeout)
	}
	// A defaulted export passes the defaults explicitly.
	e := config.NBDExport{LUN: 0, Socket: "/run/x.nbd"}
	e.SetDefaults()
	if got := NBDConfig(e); got.MaxConnections != nbd.DefaultMaxConnections || got.WriteTimeout != nbd.DefaultWriteTimeout {
		t.Fatalf("defaulted export: %+v", got)
	}
}
