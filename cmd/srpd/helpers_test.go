package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/testutil"
)

// Tests of the real binaries: srpd and srpctl are built once per test run into a temporary
// directory (with -race when the tests run with it), started as processes on loopback with
// every socket and file in t.TempDir(), and ended by PID.

var bins = testutil.Builder{Race: raceEnabled, Prefix: "srpd-"}

func TestMain(m *testing.M) {
	code := m.Run()
	bins.Remove()
	os.Exit(code)
}

// binaries returns the paths of srpd and srpctl, building them on first use (with
// interop/cmd/nbdcheck beside them, for TestInteropScript).
func binaries(t *testing.T) (srpd, srpctl string) {
	t.Helper()
	dir := bins.Build(t, "github.com/srpd/srpd/cmd/srpd", "github.com/srpd/srpd/cmd/srpctl", "github.com/srpd/srpd/interop/cmd/nbdcheck")
	return filepath.Join(dir, "srpd"), filepath.Join(dir, "srpctl")
}

// ---------------------------------------------------------------------------------------------
// A fake systemd: the NOTIFY_SOCKET end.

type notifySocket struct {
	path string
	conn *net.UnixConn
	msgs chan []string
	mu   sync.Mutex
	all  [][]string
}

func newNotifySocket(t *testing.T, dir string) *notifySocket {
	t.Helper()
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	n := &notifySocket{path: path, conn: conn, msgs: make(chan []string, 1024)}
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := conn.Read(buf)
			if err != nil {
				close(n.msgs)
				return
			}
			lines := strings.Split(strings.TrimSuffix(string(buf[:k]), "\n"), "\n")
			n.mu.Lock()
			n.all = append(n.all, lines)
			n.mu.Unlock()
			n.msgs <- lines
		}
	}()
	t.Cleanup(func() { conn.Close() })
	return n
}

// wait returns the next datagram that has assignment want (e.g. "READY=1"), failing the test
// after d. Datagrams before it are skipped (and returned in skipped).
func (n *notifySocket) wait(t *testing.T, want string, d time.Duration) (msg []string, skipped [][]string) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case m, ok := <-n.msgs:
			if !ok {
				t.Fatalf("notify socket closed while waiting for %s", want)
			}
			for _, a := range m {
				if a == want {
					return m, skipped
				}
			}
			skipped = append(skipped, m)
		case <-deadline:
			t.Fatalf("no %s from srpd within %v (got %q)", want, d, skipped)
		}
	}
}

func hasPrefix(m []string, p string) string {
	for _, a := range m {
		if strings.HasPrefix(a, p) {
			return a
		}
	}
	return ""
}

// ---------------------------------------------------------------------------------------------
// srpd processes.

type daemonProc struct {
	*testutil.Proc
	stderr *testutil.SyncBuffer
	notify *notifySocket
	start  time.Time
}

// startDaemon starts srpd -c cfg with NOTIFY_SOCKET set to n (if not nil) and extra
// environment. The process is killed (by PID) at the end of the test if it still runs.
func startDaemon(t *testing.T, cfg string, n *notifySocket, env ...string) *daemonProc {
	t.Helper()
	srpd, _ := binaries(t)
	p := &daemonProc{stderr: &testutil.SyncBuffer{}, notify: n}
	cmd := exec.Command(srpd, "-c", cfg, "--log-format", "json", "--log-level", "debug")
	cmd.Env = append(os.Environ(), env...)
	if n != nil {
		cmd.Env = append(cmd.Env, "NOTIFY_SOCKET="+n.path)
	}
	cmd.Stderr = p.stderr
	cmd.Stdout = p.stderr
	p.start = time.Now()
	p.Proc = testutil.StartProc(t, cmd, func() string { return tail(p.stderr.String(), 200) })
	return p
}

func tail(s string, lines int) string {
	var l []string
	for _, x := range strings.Split(s, "\n") {
		if !strings.Contains(x, `"msg":"API call"`) || !strings.Contains(x, `"method":"GET"`) {
			l = append(l, x)
		}
	}
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

func (p *daemonProc) signal(t *testing.T, s syscall.Signal) {
	t.Helper()
	if err := p.Cmd.Process.Signal(s); err != nil {
		t.Fatalf("signal %v to srpd: %v", s, err)
	}
}

// exit waits (bounded) for the process to end and returns its exit code.
func (p *daemonProc) exit(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.Done:
	case <-time.After(d):
		t.Fatalf("srpd did not exit within %v", d)
	}
	var ee *exec.ExitError
	if errors.As(p.Err, &ee) {
		return ee.ExitCode()
	}
	if p.Err != nil {
		t.Fatalf("srpd: %v", p.Err)
	}
	return 0
}

// srpctl runs the real srpctl with args against socket and returns its exit code and output.
func srpctl(t *testing.T, socket string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	_, bin := binaries(t)
	return runCommand(t, 90*time.Second, append([]string{bin, "--socket", socket, "--timeout", "60s"}, args...))
}

// runCommand runs argv (for at most timeout) and returns its exit code and output; it fails the
// test when the command cannot be run at all.
func runCommand(t *testing.T, timeout time.Duration, argv []string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("%s: %v", strings.Join(argv, " "), err)
	}
	return code, o.String(), e.String()
}

func mustSrpctl(t *testing.T, socket string, out any, args ...string) string {
	t.Helper()
	code, stdout, stderr := srpctl(t, socket, args...)
	if code != 0 {
		t.Fatalf("srpctl %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, stdout, stderr)
	}
	if out != nil {
		if err := json.Unmarshal([]byte(stdout), out); err != nil {
			t.Fatalf("srpctl %s: output is not JSON: %v\n%s", strings.Join(args, " "), err, stdout)
		}
	}
	return stdout
}

// ---------------------------------------------------------------------------------------------
// A minimal NBD client (fixed newstyle, NBD_OPT_EXPORT_NAME, simple replies), enough to do
// verified I/O against the daemon's exports without external tools.

// dialNBD connects to the export with a deadline of a minute on the test's whole use of it.
func dialNBD(socket, export string) (*testutil.NBDClient, error) {
	c, err := testutil.DialNBDClient(socket, export, 60*time.Second)
	if err != nil {
		return nil, err
	}
	_ = c.Conn.SetDeadline(time.Now().Add(60 * time.Second))
	return c, nil
}

// t1TargetConfig is the configuration of a target daemon on loopback (UDP port udp): target t1 on
// CM port 5555 with LUN 0 (RAM, 8 MiB) and the LUN lines extraLUNs, open to any initiator;
// rest follows (the control section and whatever else the test needs).
func t1TargetConfig(udp int, extraLUNs, rest string) string {
	return testutil.LoopbackConfig(udp) + fmt.Sprintf(`targets:
  - name: t1
    port_id: %s
    cm_port: 5555
    luns:
      - {id: 0, backend: ram, size: 8MiB}
%s    acls:
      - initiator: "*"
`, t1PortID, extraLUNs) + rest
}

// c1InitiatorConfig is the configuration of an initiator daemon on 127.0.0.2 (UDP port udp): session
// c1 to t1TargetConfig's t1, reconnecting after 1s, exporting its LUN lun over NBD on nbdSock; rest
// follows (the control section).
func c1InitiatorConfig(udp, lun int, nbdSock, rest string) string {
	return fmt.Sprintf(`version: 1
transports:
  - {name: lo, address: 127.0.0.2, udp_port: %d}
sessions:
  - name: c1
    address: 127.0.0.1
    port: 5555
    target_port_id: %s
    initiator_ext: 0x1
    reconnect_delay: 1s
    nbd:
      - {lun: %d, socket: %s}
`, udp, t1PortID, lun, nbdSock) + rest
}
