package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
)

const (
	t1PortID = "0x00000000000000110000000000000011"
	t2PortID = "0x00000000000000220000000000000022"
	// Our initiator port ID on 127.0.0.1 with initiator_ext 1: the extension, then the low
	// 64 bits of GID 0 (::ffff:127.0.0.1).
	c1Initiator = "0x00000000000000010000ffff7f000001"
)

// e2eConfig: target t1 with a RAM LUN and no ACL (nobody may log in yet), target t2 open to
// any initiator, and the configured session c2 to t2.
func e2eConfig(dir string, udp, metrics int) string {
	return testutil.LoopbackConfig(udp) + fmt.Sprintf(`targets:
  - name: t1
    port_id: %s
    cm_port: 5555
    luns:
      - id: 0
        backend: ram
        size: 8MiB
  - name: t2
    port_id: %s
    cm_port: 5556
    luns:
      - id: 0
        backend: ram
        size: 8MiB
    acls:
      - initiator: "*"
sessions:
  - name: c2
    address: 127.0.0.1
    port: 5556
    target_port_id: %s
    initiator_ext: 0x2
    reconnect_delay: 1s
control:
  socket: %s/ctl.sock
logging:
  level: debug
metrics:
  listen: 127.0.0.1:%d
`, t1PortID, t2PortID, t2PortID, dir, metrics)
}

// TestDaemonEndToEnd runs the real srpd and srpctl: LUN and ACL added with srpctl (persisted),
// the initiator connected with srpctl, verified I/O through the NBD export, sessions listed,
// bad API requests refused, a SIGHUP reload that adds a LUN to one target live (both targets'
// sessions survive), SIGTERM with exit 0, and nothing lost: the file backend holds every byte,
// and a new daemon started from the persisted configuration serves them again.
func TestDaemonEndToEnd(t *testing.T) {
	dir := testutil.ShortTempDir(t, "srpd-")
	cfgPath := filepath.Join(dir, "srpd.yaml")
	metricsPort := testutil.FreeTCPPort(t)
	if err := os.WriteFile(cfgPath, []byte(e2eConfig(dir, testutil.FreeUDPPort(t), metricsPort)), 0o640); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "ctl.sock")
	nbdSock := filepath.Join(dir, "c1-lun1.nbd")
	img := filepath.Join(dir, "lun1.img")
	const imgSize = 16 << 20

	n := newNotifySocket(t, dir)
	d := startDaemon(t, cfgPath, n)
	n.wait(t, "READY=1", 60*time.Second)

	// A file-backed LUN and an ACL for our initiator that shows it LUN 1 only, both persisted.
	var lun ctlapi.LUNInfo
	mustSrpctl(t, sock, &lun, "-o", "json", "lun", "add", "t1", "1", "--backend", "file", "--path", img,
		"--create", "--size", "16MiB", "--persist")
	if lun.ID != 1 || lun.Capacity != imgSize || lun.State != ctlapi.StateUp {
		t.Fatalf("lun add: %+v", lun)
	}
	if fi, err := os.Stat(img); err != nil || fi.Size() != imgSize {
		t.Fatalf("backing file: %v %v", fi, err)
	}
	mustSrpctl(t, sock, nil, "acl", "add", "t1", c1Initiator, "--luns", "1", "--persist")

	// Connect the initiator to t1, exporting LUN 1 over NBD.
	var conn ctlapi.ConnectionInfo
	mustSrpctl(t, sock, &conn, "-o", "json", "connect", "c1", "--address", "127.0.0.1:5555", "--target-port-id", t1PortID,
		"--initiator-ext", "1", "--reconnect-delay", "1s", "--nbd", "1="+nbdSock, "--persist")
	if conn.State != ctlapi.StateRunning || conn.InitiatorPortID.String() != c1Initiator {
		t.Fatalf("connect: %+v", conn)
	}
	if len(conn.LUNs) != 1 || conn.LUNs[0].LUN != 1 || conn.LUNs[0].NBDSocket != nbdSock || conn.LUNs[0].Capacity != imgSize {
		t.Fatalf("connect: the ACL's LUN masking should show LUN 1 only, exported on %s: %+v", nbdSock, conn.LUNs)
	}

	// Verified I/O through the NBD export.
	model := make([]byte, imgSize)
	nc, err := dialNBD(nbdSock, "")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if nc.Size != imgSize {
		t.Fatalf("NBD export size %d, want %d", nc.Size, imgSize)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	written := randomWrites(t, nc, model, rng, 48)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	verifyAll(t, nc, model)

	// Sessions on both targets.
	var sessions ctlapi.SessionList
	mustSrpctl(t, sock, &sessions, "-o", "json", "session", "list", "--target", "t1")
	if len(sessions.Sessions) != 1 {
		t.Fatalf("sessions of t1: %+v", sessions)
	}
	s1 := sessions.Sessions[0]
	if s1.Initiator.String() != c1Initiator || s1.Channels < 1 || s1.Remote == "" || s1.Stats.WriteBytes < uint64(written) ||
		len(s1.LUNs) != 1 || s1.LUNs[0] != 1 {
		t.Fatalf("session of t1: %+v (wrote %d bytes)", s1, written)
	}
	// The initiator side counts the same data: at least what went through the export (the
	// whole image was read back by verifyAll).
	var c1 ctlapi.ConnectionInfo
	mustSrpctl(t, sock, &c1, "-o", "json", "connections", "c1")
	if c1.Stats.WriteBytes < uint64(written) || c1.Stats.ReadBytes < uint64(imgSize) {
		t.Fatalf("connection c1 counts %d bytes written, %d read; want at least %d and %d", c1.Stats.WriteBytes,
			c1.Stats.ReadBytes, written, imgSize)
	}
	var s2 ctlapi.SessionInfo
	waitFor(t, 30*time.Second, "c2's session on t2", func() bool {
		var l ctlapi.SessionList
		mustSrpctl(t, sock, &l, "-o", "json", "session", "list", "--target", "t2")
		if len(l.Sessions) == 1 {
			s2 = l.Sessions[0]
			return true
		}
		return false
	})
	var show ctlapi.SessionInfo
	mustSrpctl(t, sock, &show, "-o", "json", "session", "show", s1.ID)
	if show.ID != s1.ID || show.Target != "t1" {
		t.Fatalf("session show %s: %+v", s1.ID, show)
	}
	table := mustSrpctl(t, sock, nil, "session", "list")
	if !strings.Contains(table, s1.ID) || !strings.Contains(table, s2.ID) {
		t.Fatalf("session list table lacks %s or %s:\n%s", s1.ID, s2.ID, table)
	}

	// Bad API requests: a clear message and the documented exit code.
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"lun", "add", "t1", "1", "--backend", "ram", "--size", "1MiB"}, 6, "already exists"},
		{[]string{"lun", "add", "nosuch", "0", "--backend", "ram", "--size", "1MiB"}, 5, `target "nosuch"`},
		{[]string{"lun", "add", "t1", "7", "--backend", "ram"}, 1, "needs a size"},
		{[]string{"lun", "add", "t1", "8", "--backend", "file", "--path", filepath.Join(dir, "missing.img")}, 1, "does not exist"},
		{[]string{"lun", "remove", "t1", "1"}, 6, "listed by the ACL"},
		{[]string{"session", "kill", "t1.999"}, 5, "not found"},
		{[]string{"connect", "c1", "--address", "127.0.0.1", "--target-port-id", t1PortID}, 6, "already exists"},
		{[]string{"target", "delete", "t1"}, 6, "logged-in session"},
	} {
		code, stdout, stderr := srpctl(t, sock, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.msg) {
			t.Errorf("srpctl %s: exit %d, stderr %q, stdout %q; want exit %d and %q", strings.Join(tc.args, " "), code, stderr, stdout, tc.code, tc.msg)
		}
	}

	// Metrics.
	body := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	for _, re := range []string{
		`(?m)^srpd_target_sessions\{target="t1"\} 1$`,
		`(?m)^srpd_nbd_written_bytes_total\{connection="c1",lun="1"\} [1-9][0-9.e+]*$`,
		`(?m)^srpd_target_backend_io_duration_seconds_bucket\{lun="1",op="write",target="t1",le="\+Inf"\} [1-9][0-9.e+]*$`,
		`(?m)^srpd_softroce_retransmits_total\{transport="lo"\} [0-9]+$`,
		// The sessions and targets share transport lo: their packets take softroce's
		// loopback path, none the UDP socket's.
		`(?m)^srpd_softroce_loopback_packets_total\{transport="lo"\} [1-9][0-9.e+]*$`,
		`(?m)^srpd_softroce_tx_packets_total\{transport="lo"\} 0$`,
		`(?m)^# TYPE srpd_nbd_request_duration_seconds histogram$`,
		// client_golang's Go collector and the per-LUN counters of the target (labels sorted).
		`(?m)^go_goroutines [1-9][0-9]*$`,
		`(?m)^srpd_target_lun_commands_total\{lun="1",op="write",target="t1"\} [1-9][0-9.e+]*$`,
		// Timed through nbd.ExportOptions.Observe (the export stays an AsyncDevice).
		`(?m)^srpd_nbd_request_duration_seconds_bucket\{connection="c1",lun="1",op="write",le="\+Inf"\} [1-9][0-9.e+]*$`,
		`(?m)^srpd_nbd_request_duration_seconds_bucket\{connection="c1",lun="1",op="read",le="\+Inf"\} [1-9][0-9.e+]*$`,
	} {
		if !regexp.MustCompile(re).MatchString(body) {
			t.Errorf("metrics lack %s", re)
		}
	}
	// The iostat-like views over the control API's stats (their rates may be 0: no I/O now).
	for _, args := range [][]string{{"lun", "stats", "t1", "1"}, {"session", "stats", "--target", "t1"}} {
		code, stdout, stderr := srpctl(t, sock, append(args, "-o", "json", "--interval", "200ms")...)
		var rep struct {
			Interval float64           `json:"interval_seconds"`
			LUNs     []json.RawMessage `json:"luns"`
			Sessions []json.RawMessage `json:"sessions"`
		}
		if err := json.Unmarshal([]byte(stdout), &rep); code != 0 || err != nil || rep.Interval < 0.15 || len(rep.LUNs)+len(rep.Sessions) != 1 {
			t.Errorf("srpctl %s: exit %d (%v), stdout %q, stderr %q", strings.Join(args, " "), code, err, stdout, stderr)
		}
	}

	// The configuration file was rewritten by --persist: change target t2 in it and reload.
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatalf("persisted configuration: %v", err)
	}
	if t1 := cfg.Target("t1"); t1 == nil || t1.LUN(1) == nil || len(t1.ACLs) != 1 || cfg.Session("c1") == nil {
		t.Fatalf("--persist did not write the LUN, the ACL and the session: %+v", cfg)
	}
	if err := cfg.AddLUN("t2", config.LUN{ID: 1, Backend: config.BackendRAM, Size: 4 << 20}); err != nil {
		t.Fatal(err)
	}
	if err := config.Save(cfgPath, cfg, 0o640); err != nil {
		t.Fatal(err)
	}
	d.signal(t, syscall.SIGHUP)
	msg, _ := n.wait(t, "RELOADING=1", 30*time.Second)
	if hasPrefix(msg, "MONOTONIC_USEC=") == "" {
		t.Errorf("RELOADING=1 without MONOTONIC_USEC: %q", msg)
	}
	msg, _ = n.wait(t, "READY=1", 60*time.Second)
	if st := hasPrefix(msg, "STATUS="); !strings.Contains(st, "reloaded") {
		t.Errorf("READY=1 after the reload: status %q", st)
	}
	var luns ctlapi.LUNList
	mustSrpctl(t, sock, &luns, "-o", "json", "lun", "list", "t2")
	if len(luns.LUNs) != 2 {
		t.Fatalf("t2 after the reload: %+v", luns)
	}
	// t1 did not change: its session is the same one, never logged out.
	mustSrpctl(t, sock, &sessions, "-o", "json", "session", "list", "--target", "t1")
	if len(sessions.Sessions) != 1 || sessions.Sessions[0].ID != s1.ID || !sessions.Sessions[0].LoginAt.Equal(s1.LoginAt) {
		t.Fatalf("t1's session did not survive the reload: before %+v, after %+v", s1, sessions.Sessions)
	}
	// t2 got a LUN, applied live: c2 stays logged in, the same session.
	mustSrpctl(t, sock, &sessions, "-o", "json", "session", "list", "--target", "t2")
	if len(sessions.Sessions) != 1 || sessions.Sessions[0].ID != s2.ID || !sessions.Sessions[0].LoginAt.Equal(s2.LoginAt) {
		t.Fatalf("t2's session did not survive the live LUN addition: before %+v, after %+v", s2, sessions.Sessions)
	}
	// Kill that session: the initiator is logged out, reconnects and gets a new session.
	if out := mustSrpctl(t, sock, nil, "session", "kill", s2.ID); !strings.Contains(out, s2.ID) {
		t.Errorf("session kill output %q", out)
	}
	waitFor(t, 60*time.Second, "c2 to log in again after the kill", func() bool {
		var l ctlapi.SessionList
		mustSrpctl(t, sock, &l, "-o", "json", "session", "list", "--target", "t2")
		return len(l.Sessions) == 1 && l.Sessions[0].ID != s2.ID
	})
	var c2 ctlapi.ConnectionInfo
	mustSrpctl(t, sock, &c2, "-o", "json", "connections", "c2")
	if c2.State != ctlapi.StateRunning || c2.Channels != 1 {
		t.Errorf("c2 after the kill: %+v", c2)
	}
	// The NBD connection opened before the reload still works.
	written += randomWrites(t, nc, model, rng, 8)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	verifyAll(t, nc, model)
	nc.Close()

	// SIGTERM: STOPPING=1, exit 0, sockets gone.
	d.signal(t, syscall.SIGTERM)
	n.wait(t, "STOPPING=1", 30*time.Second)
	if code := d.exit(t, 90*time.Second); code != 0 {
		t.Fatalf("srpd exited %d after SIGTERM", code)
	}
	for _, p := range []string{sock, nbdSock} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind after shutdown (%v)", p, err)
		}
	}
	if !strings.Contains(d.stderr.String(), `"srpd stopped"`) {
		t.Error(`no "srpd stopped" in the log`)
	}

	// Nothing lost: the backing file holds every byte written through NBD...
	got, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatalf("the file backend differs from what was written (%d bytes written through NBD)", written)
	}
	// ...and a new daemon started from the persisted configuration serves them again.
	n2 := newNotifySocket(t, testutil.ShortTempDir(t, "srpd-"))
	d2 := startDaemon(t, cfgPath, n2)
	n2.wait(t, "READY=1", 60*time.Second)
	var cs ctlapi.ConnectionList
	mustSrpctl(t, sock, &cs, "-o", "json", "connections")
	if len(cs.Connections) != 2 {
		t.Fatalf("connections after restart: %+v", cs)
	}
	nc2, err := dialNBD(nbdSock, "lun1")
	if err != nil {
		t.Fatalf("NBD export after restart: %v", err)
	}
	verifyAll(t, nc2, model)
	nc2.Close()
	d2.signal(t, syscall.SIGTERM)
	if code := d2.exit(t, 90*time.Second); code != 0 {
		t.Fatalf("second srpd exited %d after SIGTERM", code)
	}
}

// randomWrites writes count random extents through c, mirroring them in model, and returns
// the bytes written.
func randomWrites(t *testing.T, c *testutil.NBDClient, model []byte, rng *rand.Rand, count int) int {
	t.Helper()
	total := 0
	for range count {
		n := (1 + rng.IntN(256)) * 2048 // 2 KiB .. 512 KiB
		off := rng.IntN((len(model)-n)/512+1) * 512
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(rng.Uint32())
		}
		if err := c.WriteAt(buf, int64(off)); err != nil {
			t.Fatalf("NBD write of %d bytes at %d: %v", n, off, err)
		}
		copy(model[off:], buf)
		total += n
	}
	return total
}

// verifyAll reads the whole export and compares it with model.
func verifyAll(t *testing.T, c *testutil.NBDClient, model []byte) {
	t.Helper()
	const chunk = 1 << 20
	buf := make([]byte, chunk)
	for off := 0; off < len(model); off += chunk {
		if err := c.ReadAt(buf, int64(off)); err != nil {
			t.Fatalf("NBD read at %d: %v", off, err)
		}
		if !bytes.Equal(buf, model[off:off+chunk]) {
			for i := range buf {
				if buf[i] != model[off+i] {
					t.Fatalf("NBD read: byte %d is %#x, wrote %#x", off+i, buf[i], model[off+i])
				}
			}
		}
	}
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %v %v", url, resp.Status, err)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("metrics Content-Type %q", ct)
	}
	return string(b)
}

// minimalConfig is one RAM target and no session.
func minimalConfig(dir string, udp int, socket string) string {
	return testutil.LoopbackConfig(udp) + fmt.Sprintf(`targets:
  - name: t
    port_id: %s
    luns:
      - id: 0
        backend: ram
        size: 1MiB
control:
  socket: %s
`, t1PortID, socket)
}

// TestNotifyProtocol checks the sd_notify protocol of the real binary against a fake
// NOTIFY_SOCKET: READY=1 (with STATUS=) once the control socket and the target listen,
// WATCHDOG=1 at half of WATCHDOG_USEC, RELOADING=1 with MONOTONIC_USEC then READY=1 around a
// SIGHUP, STOPPING=1 on SIGTERM, exit 0.
func TestNotifyProtocol(t *testing.T) {
	dir := testutil.ShortTempDir(t, "srpd-")
	sock := filepath.Join(dir, "ctl.sock")
	cfg := filepath.Join(dir, "srpd.yaml")
	if err := os.WriteFile(cfg, []byte(minimalConfig(dir, testutil.FreeUDPPort(t), sock)), 0o600); err != nil {
		t.Fatal(err)
	}
	n := newNotifySocket(t, dir)
	d := startDaemon(t, cfg, n, "WATCHDOG_USEC=400000")
	msg, _ := n.wait(t, "READY=1", 60*time.Second)
	// READY=1 means the listeners are up: the control socket answers at once.
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatalf("READY=1 sent before the control socket listens: %v", err)
	}
	c.Close()
	if st := hasPrefix(msg, "STATUS="); !strings.Contains(st, "1 target(s)") {
		t.Errorf("READY=1 status %q", st)
	}
	var targets ctlapi.TargetList
	mustSrpctl(t, sock, &targets, "-o", "json", "target", "list")
	if len(targets.Targets) != 1 || targets.Targets[0].State != ctlapi.StateListening {
		t.Fatalf("target after READY=1: %+v", targets)
	}
	t0 := time.Now()
	n.wait(t, "WATCHDOG=1", 5*time.Second)
	n.wait(t, "WATCHDOG=1", 5*time.Second)
	if el := time.Since(t0); el > 2*time.Second {
		t.Errorf("two watchdog pings took %v with WATCHDOG_USEC=400000 (want one per 200ms)", el)
	}
	d.signal(t, syscall.SIGHUP)
	msg, _ = n.wait(t, "RELOADING=1", 20*time.Second)
	usec := hasPrefix(msg, "MONOTONIC_USEC=")
	if v, err := strconv.ParseUint(strings.TrimPrefix(usec, "MONOTONIC_USEC="), 10, 64); err != nil || v == 0 {
		t.Errorf("RELOADING=1 with %q", msg)
	}
	n.wait(t, "READY=1", 30*time.Second)
	d.signal(t, syscall.SIGTERM)
	n.wait(t, "STOPPING=1", 20*time.Second)
	if code := d.exit(t, 60*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
}

// TestBadConfig: an invalid file is reported as file:line: field: message, one line per
// problem, with exit code 1; nothing starts.
func TestBadConfig(t *testing.T) {
	srpd, _ := binaries(t)
	dir := testutil.ShortTempDir(t, "srpd-")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(`version: 1
transports:
  - name: lo
    address: 127.0.0.1
    udp_port: 70000
targets:
  - name: t
    port_id: 0x1
    luns:
      - id: 0
        backend: ram
    colour: blue
logging:
  format: xml
`), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (int, string) {
		var out bytes.Buffer
		cmd := exec.Command(srpd, args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if ee, ok := err.(interface{ ExitCode() int }); ok {
			return ee.ExitCode(), out.String()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, out.String()
	}
	code, out := run("-c", bad)
	if code != 1 {
		t.Fatalf("srpd -c bad.yaml: exit %d, want 1\n%s", code, out)
	}
	for _, want := range []string{
		bad + `:5: transport "lo": udp_port: `,
		bad + `:8: target "t": port_id: `,
		bad + `:10: target "t" LUN 0: size: the ram backend needs a size`,
		bad + `:12: target "t": colour: `,
		bad + `:14: logging.format: "xml" must be auto, json or console`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if code, out := run("-c", filepath.Join(dir, "missing.yaml")); code != 1 || !strings.Contains(out, "no such file") {
		t.Errorf("missing file: exit %d\n%s", code, out)
	}
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(minimalConfig(dir, 4791, filepath.Join(dir, "c.sock"))), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := run("-c", good, "--check"); code != 0 || !strings.Contains(out, "configuration OK") {
		t.Errorf("--check on a good file: exit %d\n%s", code, out)
	}
	if code, out := run("-c", good, "--log-level", "loud"); code != 2 || !strings.Contains(out, "--log-level") {
		t.Errorf("bad --log-level: exit %d\n%s", code, out)
	}
	// A start-up failure (a file LUN whose file is missing) is an error too.
	fail := filepath.Join(dir, "fail.yaml")
	cfg := minimalConfig(dir, testutil.FreeUDPPort(t), filepath.Join(dir, "f.sock"))
	cfg = strings.Replace(cfg, "        backend: ram\n        size: 1MiB\n",
		"        backend: file\n        path: "+filepath.Join(dir, "nope.img")+"\n", 1)
	if err := os.WriteFile(fail, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// Said once (logged, not also printed), without a doubled "open: open".
	if code, out := run("-c", fail); code != 1 || strings.Count(out, "nope.img") != 1 || strings.Contains(out, "open: open") {
		t.Errorf("start-up failure: exit %d, want 1 and the path said once\n%s", code, out)
	}
	if _, err := os.Lstat(filepath.Join(dir, "f.sock")); !os.IsNotExist(err) {
		t.Errorf("a failed start left its control socket behind (%v)", err)
	}
	// A busy metrics port: said once (not again by the shutdown), without "listen tcp" after
	// our own "listen on".
	busy, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	metrics := filepath.Join(dir, "metrics.yaml")
	cfg = minimalConfig(dir, testutil.FreeUDPPort(t), filepath.Join(dir, "m.sock")) + "metrics:\n  listen: " + busy.Addr().String() + "\n"
	if err := os.WriteFile(metrics, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	want := "metrics: listen on " + busy.Addr().String() + ": address already in use"
	if code, out := run("-c", metrics); code != 1 || strings.Count(out, "address already in use") != 1 || !strings.Contains(out, want) {
		t.Errorf("busy metrics port: exit %d, want 1 and %q once\n%s", code, want, out)
	}
}

// TestControlSocket: a leftover socket nobody listens on is replaced; a live one makes a
// second srpd exit non-zero with a clear message (the first keeps running); a path that is
// not a socket is refused and left alone.
func TestControlSocket(t *testing.T) {
	dir := testutil.ShortTempDir(t, "srpd-")
	sock := filepath.Join(dir, "ctl.sock")
	// A stale socket: bound, then closed without unlinking (a daemon that was killed).
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	if _, err := os.Lstat(sock); err != nil {
		t.Fatal(err)
	}
	cfgA := filepath.Join(dir, "a.yaml")
	if err := os.WriteFile(cfgA, []byte(minimalConfig(dir, testutil.FreeUDPPort(t), sock)), 0o600); err != nil {
		t.Fatal(err)
	}
	n := newNotifySocket(t, dir)
	a := startDaemon(t, cfgA, n)
	n.wait(t, "READY=1", 60*time.Second)
	// The log line reaches the test through exec's stderr copier, which may still hold it
	// when READY=1 arrives on the notify socket.
	waitFor(t, 10*time.Second, "the stale socket's removal in the log", func() bool {
		return strings.Contains(a.stderr.String(), "removed a stale control socket")
	})
	var st ctlapi.Status
	mustSrpctl(t, sock, &st, "-o", "json", "status")
	if st.PID != a.Cmd.Process.Pid {
		t.Fatalf("status answered by pid %d, want %d", st.PID, a.Cmd.Process.Pid)
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("control socket mode %v (%v), want 0660", fi.Mode(), err)
	}

	// A second daemon on the same socket (its own UDP port) must refuse to start.
	cfgB := filepath.Join(dir, "b.yaml")
	if err := os.WriteFile(cfgB, []byte(minimalConfig(dir, testutil.FreeUDPPort(t), sock)), 0o600); err != nil {
		t.Fatal(err)
	}
	b := startDaemon(t, cfgB, nil)
	if code := b.exit(t, 60*time.Second); code == 0 {
		t.Fatal("a second srpd on a live control socket exited 0")
	}
	if out := b.stderr.String(); !strings.Contains(out, "another srpd is already running") || !strings.Contains(out, sock) {
		t.Errorf("second srpd's message:\n%s", out)
	}
	mustSrpctl(t, sock, &st, "-o", "json", "status") // the first one is unharmed
	if st.PID != a.Cmd.Process.Pid {
		t.Fatalf("status answered by pid %d after the second start, want %d", st.PID, a.Cmd.Process.Pid)
	}

	// A regular file where the socket should be.
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgC := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(cfgC, []byte(minimalConfig(dir, testutil.FreeUDPPort(t), plain)), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startDaemon(t, cfgC, nil)
	if code := c.exit(t, 60*time.Second); code == 0 || !strings.Contains(c.stderr.String(), "is not a socket") {
		t.Errorf("control socket path is a regular file: exit %d\n%s", code, c.stderr.String())
	}
	if b, err := os.ReadFile(plain); err != nil || string(b) != "keep me" {
		t.Errorf("the regular file was touched: %q %v", b, err)
	}

	a.signal(t, syscall.SIGTERM)
	if code := a.exit(t, 60*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
}

// TestReadyTimeAndRSS measures the demo configuration (configs/demo-loopback.yaml, with its
// sockets moved to a temporary directory and a free UDP port): the time from exec to READY=1
// (target: under 1 s) and the resident set size once idle after READY (target: under 50 MB).
// With -race the figures are printed but not checked (the race detector's shadow memory and
// slowdown are not what ships).
//
//	go test -run TestReadyTimeAndRSS -v ./cmd/srpd/
func TestReadyTimeAndRSS(t *testing.T) {
	dir := testutil.ShortTempDir(t, "srpd-")
	path := writeDemoConfig(t, dir)
	binaries(t) // build outside the measurement
	n := newNotifySocket(t, dir)
	d := startDaemon(t, path, n)
	n.wait(t, "READY=1", 60*time.Second)
	ready := time.Since(d.start)
	// READY=1 with the demo config means the session to the local target is logged in and
	// its NBD export is up.
	var cs ctlapi.ConnectionList
	mustSrpctl(t, filepath.Join(dir, "ctl.sock"), &cs, "-o", "json", "connections")
	if len(cs.Connections) != 1 || cs.Connections[0].State != ctlapi.StateRunning {
		t.Fatalf("demo connection at READY: %+v", cs)
	}
	time.Sleep(2 * time.Second) // idle
	rss := vmRSS(t, d.Cmd.Process.Pid)
	fmt.Printf("srpd with configs/demo-loopback.yaml: READY=1 after %v, idle RSS %.1f MB (race build: %v)\n",
		ready.Round(time.Millisecond), float64(rss)/1e6, raceEnabled)
	if !raceEnabled {
		if ready > time.Second {
			t.Errorf("READY=1 after %v, want < 1s", ready)
		}
		if rss > 50e6 {
			t.Errorf("idle RSS %d bytes, want < 50 MB", rss)
		}
	}
	d.signal(t, syscall.SIGTERM)
	if code := d.exit(t, 60*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
}

// vmRSS reads a process's resident set size in bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestStopDuringStart: SIGTERM while srpd waits for a session's first login (to an address
// nobody answers on) cuts the start-up short: no READY=1, STOPPING=1, exit 0, well before the
// login would have timed out.
func TestStopDuringStart(t *testing.T) {
	dir := testutil.ShortTempDir(t, "srpd-")
	sock := filepath.Join(dir, "ctl.sock")
	cfg := minimalConfig(dir, testutil.FreeUDPPort(t), sock) + `sessions:
  - name: nowhere
    address: 127.0.0.2
    target_port_id: ` + t1PortID + `
    connect_timeout: 30s
`
	path := filepath.Join(dir, "srpd.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	n := newNotifySocket(t, dir)
	d := startDaemon(t, path, n)
	waitFor(t, 30*time.Second, "the control socket", func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	t0 := time.Now()
	d.signal(t, syscall.SIGTERM)
	_, skipped := n.wait(t, "STOPPING=1", 20*time.Second)
	for _, m := range skipped {
		for _, a := range m {
			if a == "READY=1" {
				t.Errorf("READY=1 sent after SIGTERM during start-up: %q", skipped)
			}
		}
	}
	if code := d.exit(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	t.Logf("stopped %v after SIGTERM", time.Since(t0))
	if el := time.Since(t0); el > 15*time.Second {
		t.Errorf("stopping during start-up took %v", el)
	}
}

// writeDemoConfig writes configs/demo-loopback.yaml (the README's first command) into dir with its
// sockets in dir (control: dir/ctl.sock, NBD: dir/lun0.nbd) and a free UDP port, and returns
// its path.
func writeDemoConfig(t *testing.T, dir string) string {
	t.Helper()
	data, err := os.ReadFile("../../configs/demo-loopback.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(data)
	cfg = strings.ReplaceAll(cfg, "/tmp/srpd-demo.sock", filepath.Join(dir, "ctl.sock"))
	cfg = strings.ReplaceAll(cfg, "/tmp/srpd-demo-lun0.nbd", filepath.Join(dir, "lun0.nbd"))
	cfg = strings.Replace(cfg, "    address: 127.0.0.1\n", fmt.Sprintf("    address: 127.0.0.1\n    udp_port: %d\n", testutil.FreeUDPPort(t)), 1)
	if cfg == string(data) {
		t.Fatal("could not rewrite the demo configuration")
	}
	path := filepath.Join(dir, "demo.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
