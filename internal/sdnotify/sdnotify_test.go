package sdnotify

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeSystemd is a NOTIFY_SOCKET listener.
type fakeSystemd struct {
	conn *net.UnixConn
	addr string
}

func listen(t *testing.T, name string) *fakeSystemd {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &fakeSystemd{conn: conn, addr: name}
}

func (f *fakeSystemd) recv(t *testing.T) []string {
	t.Helper()
	f.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	n, err := f.conn.Read(buf)
	if err != nil {
		t.Fatalf("no notification: %v", err)
	}
	msg := string(buf[:n])
	if !strings.HasSuffix(msg, "\n") {
		t.Errorf("datagram %q does not end in a newline", msg)
	}
	return strings.Split(strings.TrimSuffix(msg, "\n"), "\n")
}

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestNotifications(t *testing.T) {
	sd := listen(t, filepath.Join(t.TempDir(), "notify"))
	n := FromEnv(env(map[string]string{"NOTIFY_SOCKET": sd.addr}))
	if !n.Enabled() || n.Socket() != sd.addr {
		t.Fatalf("FromEnv: %+v", n)
	}
	tests := []struct {
		name string
		send func() error
		want []string
	}{
		{"ready", func() error { return n.Ready("serving 1 target") }, []string{"READY=1", "STATUS=serving 1 target"}},
		{"ready without status", func() error { return n.Ready("") }, []string{"READY=1"}},
		{"status on one line", func() error { return n.Status("a\nb") }, []string{"STATUS=a b"}},
		{"watchdog", n.Watchdog, []string{"WATCHDOG=1"}},
		{"stopping", func() error { return n.Stopping("bye") }, []string{"STOPPING=1", "STATUS=bye"}},
		{"extend", func() error { return n.ExtendTimeout(90 * time.Second) }, []string{"EXTEND_TIMEOUT_USEC=90000000"}},
		{"errno", func() error { return n.Errno(unix.EADDRINUSE) }, []string{"ERRNO=98"}},
	}
	for _, tt := range tests {
		if err := tt.send(); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got := sd.recv(t); fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}

	// RELOADING=1 carries MONOTONIC_USEC, the CLOCK_MONOTONIC time at sending.
	var before unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &before)
	if err := n.Reloading("reloading"); err != nil {
		t.Fatal(err)
	}
	got := sd.recv(t)
	if len(got) != 3 || got[0] != "RELOADING=1" || !strings.HasPrefix(got[1], "MONOTONIC_USEC=") || got[2] != "STATUS=reloading" {
		t.Fatalf("reloading: %q", got)
	}
	usec, err := strconv.ParseUint(strings.TrimPrefix(got[1], "MONOTONIC_USEC="), 10, 64)
	b := uint64(before.Sec)*1e6 + uint64(before.Nsec)/1e3
	if err != nil || usec < b || usec > b+10e6 {
		t.Errorf("MONOTONIC_USEC=%d, clock was %d", usec, b)
	}

	if err := n.Notify("BAD"); err == nil {
		t.Error("an assignment without = was sent")
	}
	if err := n.Notify("A=1\nB=2"); err == nil {
		t.Error("an assignment with a newline was sent")
	}
}

func TestAbstractSocket(t *testing.T) {
	name := fmt.Sprintf("@srpd-sdnotify-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	sd := listen(t, name)
	if err := New(name).Ready(""); err != nil {
		t.Fatal(err)
	}
	if got := sd.recv(t); len(got) != 1 || got[0] != "READY=1" {
		t.Fatalf("%q", got)
	}
}

func TestDisabled(t *testing.T) {
	for _, n := range []*Notifier{nil, {}, FromEnv(env(nil))} {
		if n.Enabled() {
			t.Fatal("enabled without NOTIFY_SOCKET")
		}
		if err := n.Ready("x"); err != nil {
			t.Fatal(err)
		}
		if err := n.Reloading(""); err != nil {
			t.Fatal(err)
		}
		n.RunWatchdog(context.Background(), time.Second, nil) // returns at once
	}
}

func TestSendErrors(t *testing.T) {
	if err := New("vsock:2:1234").Ready(""); !errors.Is(err, ErrUnsupportedSocket) {
		t.Errorf("vsock: %v", err)
	}
	missing := filepath.Join(t.TempDir(), "gone")
	err := New(missing).Ready("")
	if err == nil || !errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing socket: %v", err)
	}
}

func TestWatchdogInterval(t *testing.T) {
	pid := os.Getpid()
	tests := []struct {
		env  map[string]string
		want time.Duration
		err  bool
	}{
		{nil, 0, false},
		{map[string]string{"WATCHDOG_USEC": "30000000"}, 30 * time.Second, false},
		{map[string]string{"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": strconv.Itoa(pid)}, 30 * time.Second, false},
		{map[string]string{"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": strconv.Itoa(pid + 1)}, 0, false},
		{map[string]string{"WATCHDOG_USEC": "0"}, 0, true},
		{map[string]string{"WATCHDOG_USEC": "soon"}, 0, true},
		{map[string]string{"WATCHDOG_USEC": "1000", "WATCHDOG_PID": "x"}, 0, true},
		{map[string]string{"WATCHDOG_USEC": "9223372036854775807"}, 0, true},
	}
	for _, tt := range tests {
		got, err := WatchdogInterval(env(tt.env), pid)
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("%v: %v, %v; want %v (error %v)", tt.env, got, err, tt.want, tt.err)
		}
	}
}

func TestRunWatchdog(t *testing.T) {
	sd := listen(t, filepath.Join(t.TempDir(), "notify"))
	n := New(sd.addr)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.RunWatchdog(ctx, 20*time.Millisecond, func(err error) { t.Error(err) }); close(done) }()
	for range 3 {
		if got := sd.recv(t); len(got) != 1 || got[0] != "WATCHDOG=1" {
			t.Fatalf("%q", got)
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("RunWatchdog did not stop")
	}

	// Failed pings are reported and pinging goes on.
	gone := New(filepath.Join(t.TempDir(), "gone"))
	ctx, cancel = context.WithCancel(context.Background())
	errs := make(chan error, 1)
	done = make(chan struct{})
	go func() {
		gone.RunWatchdog(ctx, 10*time.Millisecond, func(err error) {
			select {
			case errs <- err:
			default:
			}
		})
		close(done)
	}()
	for range 2 {
		select {
		case <-errs:
		case <-time.After(5 * time.Second):
			t.Fatal("no error reported")
		}
	}
	cancel()
	<-done
}
