package main

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
)

// startServer runs mode (rdma-server or tcp-server) in this process until the test ends and
// returns the address from its ready file.
func startServer(t *testing.T, run func(context.Context, []string) error, key string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := filepath.Join(t.TempDir(), "ready")
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, []string{"-ready", ready}) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("%s server: %v", key, err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s server did not stop", key)
		}
	})
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(ready)
		if err != nil {
			select {
			case err := <-errc:
				t.Fatalf("%s server: %v", key, err)
			default:
			}
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if v, ok := strings.CutPrefix(f, key+"="); ok {
				return v
			}
		}
		t.Fatalf("ready file %q has no %s=", b, key)
	}
	t.Fatalf("%s server not ready in 20 s", key)
	return ""
}

// TestRDMAStreamLoopback runs the transport benchmark end to end on loopback, servers and
// client in this process, and checks that every stream moved bytes (a stream that moves
// nothing, or fails, makes runRDMAStream return an error).
func TestRDMAStreamLoopback(t *testing.T) {
	udp := startServer(t, runRDMAServer, "udp")
	tcp := startServer(t, runTCPServer, "tcp")
	pid := strconv.Itoa(os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := runRDMAStream(ctx, []string{"-rdma-target", udp, "-rdma-pid", pid, "-tcp-target", tcp, "-tcp-pid", pid,
		"-sizes", "64k", "-qds", "1,4", "-time", "150ms", "-warmup", "50ms", "-repeat", "2"})
	if err != nil {
		t.Fatal(err)
	}
}

// TestTCPStreamServerGone: a TCP stream whose server closes the connection mid-stream ends
// with an error, which measure returns instead of a figure.
func TestTCPStreamServerGone(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 8+64<<10)
		_, _ = c.Read(buf) // the header and some data, then gone
		_ = c.Close()
	}()
	var moved atomic.Int64
	done := make(chan error, 1)
	to := netip.MustParseAddrPort(l.Addr().String())
	stop, err := tcpStream(context.Background(), to, streamCase{write: true, size: 64 << 10, qd: 2}, &moved, done)
	if err != nil {
		t.Fatal(err)
	}
	_, err = measure(context.Background(), &moved, os.Getpid(), 2*time.Second, time.Second, stop, done)
	if err == nil {
		t.Fatal("measure returned no error for a stream whose server went away")
	}
}

func TestProcCPU(t *testing.T) {
	end := time.Now().Add(30 * time.Millisecond)
	for x := 0; time.Now().Before(end); x++ {
		_ = x * x
	}
	d, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d <= 0 || d > selfCPU()+time.Second/userHZ {
		t.Fatalf("procCPU = %v, getrusage = %v", d, selfCPU())
	}
	if _, err := procCPU(0); err == nil {
		t.Fatal("procCPU(0): no error")
	}
}

func TestBenchAddrAndMTU(t *testing.T) {
	for a, ok := range map[string]bool{"127.0.0.1": true, "::1": true, "10.213.4.2": true, "192.168.1.1": true,
		"fd00::2": true, "192.0.2.2": false, "8.8.8.8": false} {
		if err := benchAddr(netip.MustParseAddr(a)); (err == nil) != ok {
			t.Errorf("benchAddr(%s) = %v, want ok %v", a, err, ok)
		}
	}
	for n, want := range map[int]transport.MTU{0: 0, 1024: transport.MTU1024, 4096: transport.MTU4096} {
		if m, err := parseMTU(n); err != nil || m != want {
			t.Errorf("parseMTU(%d) = %v, %v; want %v", n, m, err, want)
		}
	}
	if _, err := parseMTU(1500); err == nil {
		t.Error("parseMTU(1500): no error")
	}
	if err := benchAddr(netip.Addr{}); err == nil {
		t.Error("benchAddr(invalid): no error")
	}
}
