package config

import (
	"errors"
	"strings"
	"testing"
)

// TestNBDExportLimits: max_connections and write_timeout of sessions[].nbd[] get their
// defaults when omitted, take "off" for the timeout, and out-of-range values are refused with
// ErrInvalid on the right path.
func TestNBDExportLimits(t *testing.T) {
	tests := []struct {
		name, extra string
		want        string // "" = valid
		path        string
		conns       int
		timeout     string
	}{
		{"defaults", "", "", "", DefaultNBDMaxConnections, "30s"},
		{"set", "max_connections: 8\n        write_timeout: 5s", "", "", 8, "5s"},
		{"off", "write_timeout: off", "", "", DefaultNBDMaxConnections, "off"},
		{"most", "max_connections: 4096\n        write_timeout: 1h", "", "", 4096, "1h0m0s"},
		{"too many", "max_connections: 4097", "out of range", "max_connections", 0, ""},
		{"negative", "max_connections: -1", "out of range", "max_connections", 0, ""},
		{"short", "write_timeout: 500ms", "must be off or between 1s and 1h", "write_timeout", 0, ""},
		{"zero", "write_timeout: 0s", "must be off or between 1s and 1h", "write_timeout", 0, ""},
		{"long", "write_timeout: 2h", "must be off or between 1s and 1h", "write_timeout", 0, ""},
		{"negative timeout", "write_timeout: -1s", "negative", "write_timeout", 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := minimal + "sessions:\n  - name: s\n    address: 127.0.0.1\n    target_port_id: 00000000000000010000000000000001\n" +
				"    nbd:\n      - lun: 0\n        socket: /run/srpd/s.nbd\n"
			if tt.extra != "" {
				src += "        " + tt.extra + "\n"
			}
			c, err := Parse("test.yaml", []byte(src))
			if tt.want != "" {
				if err == nil {
					t.Fatalf("no error, want %q", tt.want)
				}
				if !strings.Contains(err.Error(), `session "s": nbd[0].`+tt.path+": ") || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("error %q, want %q on %s", err, tt.want, tt.path)
				}
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("not ErrInvalid: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			e := c.Sessions[0].NBD[0]
			if e.MaxConnections != tt.conns || e.WriteTimeout == nil || e.WriteTimeout.String() != tt.timeout {
				t.Fatalf("max_connections %d, write_timeout %v; want %d, %s", e.MaxConnections, e.WriteTimeout, tt.conns, tt.timeout)
			}
			// Marshal and parse again: the same export.
			out, err := Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			c2, err := Parse("again.yaml", out)
			if err != nil || !Equal(c, c2) {
				t.Fatalf("round trip: %v\n%s", err, out)
			}
		})
	}
}
