package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/srp"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// interopEnv is what srp-interop kernel-target gives its command.
func interopEnv() map[string]string {
	return map[string]string{
		"SRP_INTEROP_ROLE":           "initiator",
		"SRP_INTEROP_TARGET_ADDR":    "10.77.0.1",
		"SRP_INTEROP_PORT":           "5555",
		"SRP_INTEROP_ID_EXT":         "505400fffe770001",
		"SRP_INTEROP_IOC_GUID":       "505400fffe770001",
		"SRP_INTEROP_TARGET_PORT_ID": "505400fffe770001505400fffe770001",
		"SRP_INTEROP_ADDR":           "10.77.0.3",
		"SRP_INTEROP_ROCE_PORT":      "4791",
		"SRP_INTEROP_LUN_BYTES":      "67108864",
	}
}

func TestParseArgsInteropEnv(t *testing.T) {
	o, err := parseArgs(nil, envOf(interopEnv()), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := options{
		addr: netip.MustParseAddr("10.77.0.3"), rocePort: 4791,
		target: netip.MustParseAddr("10.77.0.1"), port: 5555,
		portID:   srp.MakePortID(0x505400fffe770001, 0x505400fffe770001),
		lunBytes: 64 << 20, timeout: 120 * time.Second,
	}
	if o != want {
		t.Fatalf("from the environment %+v, want %+v", o, want)
	}
}

func TestParseArgsPortIDFromIDExtAndIOCGUID(t *testing.T) {
	env := interopEnv()
	delete(env, "SRP_INTEROP_TARGET_PORT_ID")
	env["SRP_INTEROP_IOC_GUID"] = "1111111111111111"
	o, err := parseArgs(nil, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := srp.MakePortID(0x505400fffe770001, 0x1111111111111111); o.portID != want {
		t.Fatalf("port ID %v, want %v", o.portID, want)
	}
}

func TestParseArgsFlagsOverrideEnv(t *testing.T) {
	o, err := parseArgs([]string{"-addr", "0.0.0.0", "-roce-port", "0", "-target", "192.0.2.7", "-port", "5556",
		"-port-id", "00000000000000010000000000000002", "-lun-bytes", "0", "-timeout", "5s", "-v"},
		envOf(interopEnv()), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := options{
		addr: netip.IPv4Unspecified(), rocePort: 0, target: netip.MustParseAddr("192.0.2.7"), port: 5556,
		portID: srp.MakePortID(1, 2), lunBytes: 0, timeout: 5 * time.Second, verbose: true,
	}
	if o != want {
		t.Fatalf("flags %+v, want %+v", o, want)
	}
}

func TestParseArgsDefaultsWithTargetOnly(t *testing.T) {
	o, err := parseArgs([]string{"-target", "10.0.0.1", "-port-id", "505400fffe770001505400fffe770001"},
		envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.addr != netip.IPv4Unspecified() || o.rocePort != 4791 || o.port != 5555 || o.lunBytes != 0 ||
		o.timeout != 120*time.Second || o.verbose {
		t.Fatalf("defaults %+v", o)
	}
}

func TestParseArgsErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  func(map[string]string)
		want string
	}{
		{"no target", nil, func(m map[string]string) { delete(m, "SRP_INTEROP_TARGET_ADDR") }, "-target"},
		{"no port ID", nil, func(m map[string]string) {
			delete(m, "SRP_INTEROP_TARGET_PORT_ID")
			delete(m, "SRP_INTEROP_IOC_GUID")
		}, "-port-id"},
		{"bad addr", []string{"-addr", "10.77.0"}, nil, "-addr"},
		{"bad target", []string{"-target", "nowhere"}, nil, "-target"},
		{"port zero", []string{"-port", "0"}, nil, "-port"},
		{"port too big", []string{"-port", "65536"}, nil, "-port"},
		{"bad roce port", []string{"-roce-port", "x"}, nil, "-roce-port"},
		{"short port ID", []string{"-port-id", "5054"}, nil, "-port-id"},
		{"zero port ID", []string{"-port-id", strings.Repeat("0", 32)}, nil, "-port-id"},
		{"bad LUN size", nil, func(m map[string]string) { m["SRP_INTEROP_LUN_BYTES"] = "-1" }, "-lun-bytes"},
		{"bad timeout", []string{"-timeout", "0s"}, nil, "-timeout"},
		{"extra argument", []string{"extra"}, nil, "unexpected arguments"},
		{"unknown flag", []string{"-nope"}, nil, "-nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := interopEnv()
			if tc.env != nil {
				tc.env(env)
			}
			_, err := parseArgs(tc.args, envOf(env), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one mentioning %q", err, tc.want)
			}
		})
	}
	if _, err := parseArgs([]string{"-h"}, envOf(interopEnv()), io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
}

func TestPlan(t *testing.T) {
	got := plan(64<<20, 512)
	want := []extent{{0, 4096}, {8192, 65536}, {4<<20 + 12<<10, 1 << 20}, {64<<20 - 4096, 4096}, {2<<20 + 512, 512}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("plan(64 MiB, 512) = %v, want %v", got, want)
	}
	// 4 KiB blocks: no 512-byte write.
	if got := plan(64<<20, 4096); len(got) != 4 {
		t.Fatalf("plan(64 MiB, 4096) = %v", got)
	}
	// A small LUN leaves out what does not fit.
	for _, e := range plan(1<<20, 512) {
		if e.off+e.n > 1<<20 {
			t.Fatalf("plan(1 MiB) has %v", e)
		}
	}
}

// memDev is a block device in memory; corrupt flips a byte on reads at that offset (-1: none).
type memDev struct {
	b       []byte
	corrupt int64
	flushed bool
}

func (m *memDev) WriteAt(_ context.Context, p []byte, off int64, _ bool) error {
	copy(m.b[off:], p)
	return nil
}

func (m *memDev) ReadAt(_ context.Context, p []byte, off int64) error {
	copy(p, m.b[off:])
	if m.corrupt >= off && m.corrupt < off+int64(len(p)) {
		p[m.corrupt-off] ^= 0xff
	}
	return nil
}

func (m *memDev) Flush(context.Context) error { m.flushed = true; return nil }

func TestExercise(t *testing.T) {
	const size = 8 << 20
	d := &memDev{b: make([]byte, size), corrupt: -1}
	exts := plan(size, 512)
	var out bytes.Buffer
	if err := exercise(context.Background(), d, exts, zap.NewNop(), &out); err != nil {
		t.Fatal(err)
	}
	if !d.flushed {
		t.Fatal("no flush")
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != len(exts) {
		t.Fatalf("%d hash lines for %d ranges:\n%s", len(lines), len(exts), out.String())
	}
	for i, e := range exts {
		want := fmt.Sprintf("SRP_INTEROP_SHA256=%x OFFSET=%d LEN=%d", sha256.Sum256(d.b[e.off:e.off+e.n]), e.off, e.n)
		if lines[i] != want {
			t.Fatalf("line %d %q, want %q", i, lines[i], want)
		}
	}

	// A read-back difference fails, naming the offset.
	d.corrupt = 8192 + 100
	err := exercise(context.Background(), d, exts, zap.NewNop(), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "offset 8292") {
		t.Fatalf("corrupted read-back: %v", err)
	}
}
