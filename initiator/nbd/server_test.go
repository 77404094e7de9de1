package nbd

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestGracefulShutdown: requests in flight when Serve's context ends are answered, then the
// connection is closed, the socket file removed and Serve returns.
func TestGracefulShutdown(t *testing.T) {
	f := newFixture(t, Config{})
	c := f.client(t, "disk", false)
	hc := dialUnix(t, f.ts.sock) // a connection still in the handshake
	hc.hello(clientFlagFixedNewstyle)
	release := make(chan struct{})
	f.disk.holdReads(release)
	for i := uint64(0); i < 4; i++ {
		c.send(cmdRead, 0, i, i*4096, 4096, nil)
	}
	waitFor(t, "reads in the device", func() bool { return f.disk.active.Load() == 4 })
	f.ts.cancel()
	// The listener closes at once: new connections are refused.
	waitFor(t, "listener closed", func() bool {
		nc, err := net.Dial("unix", f.ts.sock)
		if err == nil {
			nc.Close()
		}
		return err != nil
	})
	hc.expectClosed()
	time.Sleep(50 * time.Millisecond)
	close(release)
	for i := 0; i < 4; i++ {
		if r := c.mustReply(); r.errno != 0 || len(r.data) != 4096 {
			t.Fatalf("in-flight reply %+v", r)
		}
	}
	c.expectClosed()
	f.ts.stop(t)
	if _, err := os.Stat(f.ts.sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket file after shutdown: %v", err)
	}
	if _, err := f.ts.ListenTCP("127.0.0.1:0"); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("ListenTCP after shutdown: %v", err)
	}
	if err := f.ts.Serve(context.Background()); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve after shutdown: %v", err)
	}
}

// TestShutdownTimeout: a request stuck in the device is cancelled after ShutdownTimeout and
// Serve still returns.
func TestShutdownTimeout(t *testing.T) {
	f := newFixture(t, Config{ShutdownTimeout: 100 * time.Millisecond})
	c := f.client(t, "disk", true)
	var cancelled atomic.Bool
	f.disk.setHook(func(ctx context.Context, op string, off, n int64) error {
		<-ctx.Done()
		cancelled.Store(true)
		return ctx.Err()
	})
	c.send(cmdWrite, 0, 1, 0, 512, make([]byte, 512))
	waitFor(t, "write in the device", func() bool { return f.disk.active.Load() == 1 })
	start := time.Now()
	f.ts.stop(t)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("shutdown took %v", d)
	}
	if !cancelled.Load() {
		t.Fatal("the device call was not cancelled")
	}
	c.expectClosed()
}

func TestRemoveExport(t *testing.T) {
	f := newFixture(t, Config{ShutdownTimeout: time.Second})
	c := f.client(t, "disk", false)
	other := f.client(t, "ro", false)
	release := make(chan struct{})
	f.disk.holdReads(release)
	c.send(cmdRead, 0, 7, 0, 4096, nil)
	waitFor(t, "read in the device", func() bool { return f.disk.active.Load() == 1 })
	done := make(chan error)
	go func() { done <- f.ts.RemoveExport(context.Background(), "disk") }()
	// New handshakes no longer see the export.
	waitFor(t, "export gone", func() bool {
		for _, n := range f.ts.Exports() {
			if n == "disk" {
				return false
			}
		}
		return true
	})
	nc := dialUnix(t, f.ts.sock)
	nc.hello(clientFlagFixedNewstyle)
	if res := nc.info(optGo, "disk"); res.final.typ != repErrUnknown {
		t.Fatalf("GO for a removed export: %#x", res.final.typ)
	}
	notReady(t, done, 20*time.Millisecond, "RemoveExport returned while a device call was running")
	close(release)
	if r := c.mustReply(); r.handle != 7 || r.errno != 0 {
		t.Fatalf("in-flight reply %+v", r)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c.expectClosed()
	if f.disk.active.Load() != 0 {
		t.Fatal("device call running after RemoveExport returned")
	}
	// Other exports are untouched.
	if r := other.do(cmdRead, 0, 0, 4096, nil); r.errno != 0 {
		t.Fatalf("other export: %+v", r)
	}
	if err := f.ts.RemoveExport(context.Background(), "disk"); !errors.Is(err, ErrNoExport) {
		t.Fatalf("second remove: %v", err)
	}
	// The name can be reused.
	if err := f.ts.AddExport("disk", newRAM(1<<20, 512), ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	if c2 := f.client(t, "disk", false); c2.size != 1<<20 {
		t.Fatalf("new export size %d", c2.size)
	}
}

// TestRemoveExportCancels: RemoveExport's context bounds the wait; the stuck call is cancelled.
func TestRemoveExportCancels(t *testing.T) {
	f := newFixture(t, Config{})
	c := f.client(t, "disk", false)
	f.disk.setHook(func(ctx context.Context, op string, off, n int64) error {
		<-ctx.Done()
		return ctx.Err()
	})
	c.send(cmdFlush, 0, 1, 0, 0, nil)
	waitFor(t, "flush in the device", func() bool { return f.disk.active.Load() == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := f.ts.RemoveExport(ctx, "disk"); err != nil {
		t.Fatal(err)
	}
	if f.disk.active.Load() != 0 {
		t.Fatal("device call still running")
	}
	c.expectClosed()
}

func TestAddExportValidation(t *testing.T) {
	s, err := NewServer(Config{})
	if err != nil {
		t.Fatal(err)
	}
	bad := []struct {
		name string
		dev  Device
	}{
		{"bs", newRAM(1<<20, 1000)},
		{"bs-small", newRAM(1<<20, 256)},
		{"bs-large", newRAM(1<<20, 1<<17)},
		{"size", newRAM(1000, 512)},
		{"nil", nil},
		{"nul\x00name", newRAM(1<<20, 512)},
		{string(make([]byte, 4097)), newRAM(1<<20, 512)},
	}
	for _, b := range bad {
		if err := s.AddExport(b.name, b.dev, ExportOptions{}); !errors.Is(err, ErrInvalidDevice) {
			t.Errorf("AddExport(%.10q): %v", b.name, err)
		}
	}
	if err := s.AddExport("x", newRAM(1<<20, 512), ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddExport("x", newRAM(1<<20, 512), ExportOptions{}); !errors.Is(err, ErrExportExists) {
		t.Fatalf("duplicate: %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{
		{MaxRequestSize: 1000},
		{MaxRequestSize: 32 << 10},
		{MaxRequestSize: 2 << 30},
		{MaxInFlight: -1},
	} {
		if _, err := NewServer(cfg); err == nil {
			t.Errorf("NewServer(%+v) accepted", cfg)
		}
	}
	s, err := NewServer(Config{MaxRequestSize: 1 << 20, MaxInFlightBytes: 1, Workers: 1000, MaxInFlight: 8})
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.MaxInFlightBytes != 1<<20 || s.cfg.ConnMaxInFlightBytes != 1<<20 || s.cfg.Workers != 8 {
		t.Fatalf("defaults %+v", s.cfg)
	}
}

func TestListenUnix(t *testing.T) {
	dir := t.TempDir()
	s, err := NewServer(Config{})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("stale socket is replaced", func(t *testing.T) {
		path := filepath.Join(dir, "stale.sock")
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		l.Close()
		if _, err := os.Stat(path); err != nil {
			t.Fatal("stale socket not left behind")
		}
		if _, err := s.ListenUnix(path); err != nil {
			t.Fatalf("ListenUnix over a stale socket: %v", err)
		}
	})
	t.Run("live socket is refused", func(t *testing.T) {
		path := filepath.Join(dir, "live.sock")
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if _, err := s.ListenUnix(path); !errors.Is(err, ErrSocketInUse) {
			t.Fatalf("ListenUnix over a live socket: %v", err)
		}
		// Still the other server's socket.
		nc, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("the live socket was disturbed: %v", err)
		}
		nc.Close()
	})
	t.Run("regular file is left alone", func(t *testing.T) {
		path := filepath.Join(dir, "file")
		if err := os.WriteFile(path, []byte("keep"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ListenUnix(path); err == nil {
			t.Fatal("ListenUnix over a regular file succeeded")
		}
		if b, _ := os.ReadFile(path); string(b) != "keep" {
			t.Fatal("regular file changed")
		}
	})
	t.Run("second server on our own socket", func(t *testing.T) {
		path := filepath.Join(dir, "ours.sock")
		if _, err := s.ListenUnix(path); err != nil {
			t.Fatal(err)
		}
		s2, _ := NewServer(Config{})
		if _, err := s2.ListenUnix(path); !errors.Is(err, ErrSocketInUse) {
			t.Fatalf("got %v", err)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Serve(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestListenTCP(t *testing.T) {
	s, err := NewServer(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"0.0.0.0:0", ":0", "192.0.2.1:0", "example.com:0", "nonsense"} {
		if _, err := s.ListenTCP(a); err == nil {
			t.Errorf("ListenTCP(%q) accepted", a)
		}
	}
	for _, a := range []string{"127.0.0.1:0", "localhost:0"} {
		if _, err := s.ListenTCP(a); err != nil {
			t.Errorf("ListenTCP(%q): %v", a, err)
		}
	}
	if len(s.Addrs()) != 2 {
		t.Fatalf("addrs %v", s.Addrs())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Serve(ctx) }()
	waitFor(t, "serving", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.serving
	})
	if err := s.Serve(ctx); !errors.Is(err, ErrAlreadyServing) {
		t.Fatalf("second Serve: %v", err)
	}
	// A listener added while serving is served at once.
	addr, err := s.ListenTCP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AddExport("e", newRAM(1<<20, 512), ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, nc)
	c.connect("e", false)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c.expectClosed()
}

// TestServeConn serves a net.Pipe end, and stops it through its context.
func TestServeConn(t *testing.T) {
	s, err := NewServer(Config{ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AddExport("e", newRAM(1<<20, 512), ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.ServeConn(ctx, a) }()
	c := newClient(t, b)
	c.connect("e", true)
	if r := c.do(cmdWrite, cmdFlagFUA, 0, 4096, pattern(3, 4096)); r.errno != 0 {
		t.Fatal(r.errno)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ServeConn: %v", err)
	}
	c.expectClosed()

	// A protocol violation is reported.
	a, b = net.Pipe()
	go func() { done <- s.ServeConn(context.Background(), a) }()
	c = newClient(t, b)
	c.hello(clientFlagFixedNewstyle | 1<<7)
	if err := <-done; err == nil {
		t.Fatal("ServeConn returned nil after bad client flags")
	}
}

func TestBufPool(t *testing.T) {
	p := newBufPool(64<<10, 32<<10, noReserve, nil)
	wake := make(chan struct{}, 1)
	stop := make(chan struct{})
	a := p.get(32<<10, holds(0), wake, stop, nil)
	b := p.get(20<<10, holds(0), wake, stop, nil) // class 32 KiB too
	if len(a.payload(32<<10)) != 32<<10 || a.class != b.class {
		t.Fatalf("classes %d %d", a.class, b.class)
	}
	if alloc, _, _ := p.stats(); alloc != 64<<10 {
		t.Fatalf("allocated %d", alloc)
	}
	// The budget is used up: a third get waits until a put.
	got := make(chan *buffer)
	go func() { got <- p.get(4096, holds(0), wake, stop, nil) }()
	notReady(t, got, 20*time.Millisecond, "get did not wait")
	p.put(a)
	c := <-got // a (32 KiB, free) is dropped to make room for a 4 KiB buffer
	if c.class != 0 {
		t.Fatalf("class %d", c.class)
	}
	if alloc, _, _ := p.stats(); alloc != 32<<10+4096 {
		t.Fatalf("allocated %d", alloc)
	}
	// Reuse: a put buffer comes back for the same class without allocating.
	p.put(c)
	if d := p.get(100, holds(0), wake, stop, nil); d != c {
		t.Fatal("free buffer not reused")
	}
	// A waiter gives up when stopped.
	p2 := newBufPool(4096, 4096, noReserve, nil)
	x := p2.get(4096, holds(0), wake, stop, nil)
	close(stop)
	if y := p2.get(4096, holds(0), wake, stop, nil); y != nil {
		t.Fatal("get returned a buffer after stop")
	}
	p2.put(x)
	for _, tc := range []struct{ n, class int }{{1, 0}, {4096, 0}, {4097, 1}, {8192, 1}, {32 << 20, 13}} {
		if c := sizeClass(tc.n); c != tc.class {
			t.Errorf("sizeClass(%d) = %d, want %d", tc.n, c, tc.class)
		}
	}
}

func TestAppendMessage(t *testing.T) {
	long := string(make([]byte, 1000))
	if m := appendMessage(nil, long); len(m) != maxErrorMessage || m[0] != '?' {
		t.Fatalf("len %d", len(m))
	}
	m := appendMessage(nil, "é"+string([]byte{0xff})+"ok")
	if string(m) != "é?ok" {
		t.Fatalf("%q", m)
	}
	// A multi-byte rune that would cross the limit is dropped whole.
	s := string(make([]byte, maxErrorMessage-1)) + "é"
	if m := appendMessage(nil, s); len(m) != maxErrorMessage-1 {
		t.Fatalf("len %d", len(m))
	}
}

// TestConnWindow: a connection holds at most ConnMaxInFlightBytes of buffers; further reads
// wait (without reaching the device) until earlier ones are answered.
func TestConnWindow(t *testing.T) {
	f := newFixture(t, Config{MaxRequestSize: 64 << 10, ConnMaxInFlightBytes: 128 << 10, MaxInFlightBytes: 1 << 20})
	release := make(chan struct{})
	f.disk.holdReads(release)
	c := f.client(t, "disk", false)
	for h := uint64(0); h < 4; h++ {
		c.send(cmdRead, 0, h, h*(64<<10), 64<<10, nil)
	}
	waitFor(t, "two reads in the device", func() bool { return f.disk.active.Load() == 2 })
	time.Sleep(50 * time.Millisecond)
	if a := f.disk.active.Load(); a != 2 {
		t.Fatalf("%d reads in the device, window allows 2", a)
	}
	close(release)
	for i := 0; i < 4; i++ {
		if r := c.mustReply(); r.errno != 0 {
			t.Fatal(r.errno)
		}
	}
	// Draining while the read loop waits for the window ends the connection cleanly.
	block := make(chan struct{})
	f.disk.setHook(func(ctx context.Context, op string, off, n int64) error {
		select {
		case <-block:
		case <-ctx.Done():
		}
		return nil
	})
	for h := uint64(0); h < 3; h++ {
		c.send(cmdRead, 0, h, 0, 64<<10, nil)
	}
	waitFor(t, "two reads in the device", func() bool { return f.disk.active.Load() == 2 })
	// One more while the read loop waits for the window: it stays unread in the socket. The
	// server must still end the stream (EOF), not reset it (ECONNRESET), after its replies.
	time.Sleep(20 * time.Millisecond)
	c.send(cmdRead, 0, 3, 0, 64<<10, nil)
	time.Sleep(20 * time.Millisecond)
	done := make(chan error)
	go func() { done <- f.ts.RemoveExport(context.Background(), "disk") }()
	time.Sleep(20 * time.Millisecond)
	close(block)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if r := c.mustReply(); r.errno != 0 {
			t.Fatal(r.errno)
		}
	}
	c.expectClosed()
}

func TestErrnoStrings(t *testing.T) {
	for _, e := range []Errno{EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN, 99} {
		if !strings.HasPrefix(e.Error(), "nbd: ") {
			t.Errorf("%d: %q", e, e.Error())
		}
	}
	cause := errors.New("cause")
	err := DeviceError(EIO, cause)
	if !errors.Is(err, cause) || err.Error() != EIO.Error()+": cause" || (&Error{Code: EPERM}).Error() != EPERM.Error() {
		t.Fatalf("%v", err)
	}
	for _, typ := range []uint16{cmdRead, cmdWrite, cmdDisc, cmdFlush, cmdTrim, cmdCache, cmdWriteZeroes, cmdBlockStatus, 99} {
		if cmdName(typ) == "" {
			t.Fatal("empty command name")
		}
	}
}
