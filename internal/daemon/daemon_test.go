package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
)

const (
	portA = "0x000000000000000a000000000000000a"
	portB = "0x000000000000000b000000000000000b"
)

func testConfig(dir string, udp int) string {
	return testutil.LoopbackConfig(udp) + fmt.Sprintf(`targets:
  - name: a
    port_id: %s
    luns:
      - id: 0
        backend: ram
        size: 4MiB
    acls:
      - initiator: "*"
  - name: b
    port_id: %s
    cm_port: 5556
    luns:
      - id: 0
        backend: ram
        size: 4MiB
sessions:
  - name: s
    address: 127.0.0.1
    target_port_id: %s
    reconnect_delay: 1s
control:
  socket: %s/ctl.sock
`, portA, portB, portA, dir)
}

type harness struct {
	t    *testing.T
	d    *Daemon
	c    *ctlapi.Client
	path string
	dir  string
}

func startHarness(t *testing.T) *harness {
	t.Helper()
	dir := testutil.ShortTempDir(t, "srpd-d-")
	return startHarnessWith(t, dir, testConfig(dir, testutil.FreeUDPPort(t)))
}

// startHarnessWith starts a daemon in-process from the configuration src, written to
// dir/srpd.yaml; its control socket must be dir/ctl.sock.
func startHarnessWith(t *testing.T, dir, src string) *harness {
	t.Helper()
	path := filepath.Join(dir, "srpd.yaml")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	log := zap.NewNop()
	if testing.Verbose() {
		log = zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	}
	d := New(Options{ConfigPath: path, Logger: log, DrainTimeout: 20 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Start(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, d: d, c: ctlapi.NewClient(filepath.Join(dir, "ctl.sock")), path: path, dir: dir}
	t.Cleanup(func() {
		h.c.Close()
		d.Shutdown(context.Background())
	})
	return h
}

func (h *harness) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	h.t.Cleanup(cancel)
	return ctx
}

func (h *harness) waitSessions(target string, n int) []ctlapi.SessionInfo {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ss, err := h.c.ListSessions(h.ctx(), ctlapi.SessionFilter{Target: target})
		if err != nil {
			h.t.Fatal(err)
		}
		if len(ss) == n {
			return ss
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("target %s: %d sessions, want %d", target, len(ss), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestServiceInProcess drives the control API of an in-process daemon over its socket:
// status, target create/delete (with and without force), failed connects and LUN additions
// that leave nothing behind, a change that is not persisted and a reload that undoes it, an
// invalid file on reload, a persist failure that is rolled back, and the shutdown.
func TestServiceInProcess(t *testing.T) {
	h := startHarness(t)
	st, err := h.c.Status(h.ctx())
	if err != nil {
		t.Fatal(err)
	}
	if st.Targets != 2 || st.Connections != 1 || len(st.Transports) != 1 || st.Transports[0].State != ctlapi.StateUp {
		t.Fatalf("status: %+v", st)
	}
	ss := h.waitSessions("a", 1)
	if ss[0].Channels != 1 || ss[0].QueueDepth != config.DefaultTargetQueueDepth || !slices.Equal(ss[0].LUNs, []int{0}) {
		t.Fatalf("session: %+v", ss[0])
	}

	// Create and delete targets.
	pc, _ := config.ParsePortID("0x000000000000000c000000000000000c")
	info, err := h.c.CreateTarget(h.ctx(), config.Target{Name: "c", PortID: pc, CMPort: 5557,
		LUNs: []config.LUN{{ID: 0, Backend: config.BackendRAM, Size: 1 << 20}}}, ctlapi.MutateOptions{})
	if err != nil || info.State != ctlapi.StateListening || len(info.Listen) != 1 || info.Listen[0] != "127.0.0.1:5557" {
		t.Fatalf("create target: %+v %v", info, err)
	}
	if err := h.c.DeleteTarget(h.ctx(), "a", ctlapi.DeleteOptions{}); !errors.Is(err, ctlapi.ErrConflict) {
		t.Fatalf("delete a target with a session: %v, want conflict", err)
	}
	if err := h.c.DeleteTarget(h.ctx(), "c", ctlapi.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.GetTarget(h.ctx(), "c"); !errors.Is(err, ctlapi.ErrNotFound) {
		t.Fatalf("deleted target: %v", err)
	}

	// A connect the target refuses (wrong port ID; b has no ACL either) leaves nothing behind.
	pb, _ := config.ParsePortID(portB)
	bad := config.Session{Name: "x", Address: "127.0.0.1", Port: 5556, TargetPortID: pb}
	bad.SetDefaults()
	if _, err := h.c.Connect(h.ctx(), bad, ctlapi.MutateOptions{}); !errors.Is(err, ctlapi.ErrUnavailable) ||
		!strings.Contains(err.Error(), "reject") {
		t.Fatalf("connect to a target without an ACL: %v", err)
	}
	if h.d.Config().Session("x") != nil {
		t.Fatal("a failed connect stayed in the configuration")
	}
	// An NBD export of a LUN the target does not have: refused, undone.
	pa, _ := config.ParsePortID(portA)
	nolun := config.Session{Name: "y", Address: "127.0.0.1", TargetPortID: pa, InitiatorExt: 7,
		NBD: []config.NBDExport{{LUN: 5, Socket: filepath.Join(h.dir, "y.nbd")}}}
	nolun.SetDefaults()
	if _, err := h.c.Connect(h.ctx(), nolun, ctlapi.MutateOptions{}); !errors.Is(err, ctlapi.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "no LUN 5") {
		t.Fatalf("connect exporting a missing LUN: %v", err)
	}
	if cs, _ := h.c.ListConnections(h.ctx()); len(cs) != 1 {
		t.Fatalf("connections after failed connects: %+v", cs)
	}
	if _, err := h.c.AddLUN(h.ctx(), "a", config.LUN{ID: 3, Backend: config.BackendFile, Path: filepath.Join(h.dir, "nope"), BlockSize: 512},
		ctlapi.MutateOptions{}); !errors.Is(err, ctlapi.ErrInvalidArgument) {
		t.Fatalf("file LUN without its file: %v", err)
	}

	// A change that is not persisted; a reload from the file undoes it.
	if _, err := h.c.AddLUN(h.ctx(), "b", config.LUN{ID: 1, Backend: config.BackendRAM, Size: 1 << 20, BlockSize: 512}, ctlapi.MutateOptions{}); err != nil {
		t.Fatal(err)
	}
	if ls, _ := h.c.ListLUNs(h.ctx(), "b"); len(ls) != 2 || ls[1].Capacity != 1<<20 {
		t.Fatalf("LUNs of b: %+v", ls)
	}
	if f, _ := config.Load(h.path); f.Target("b").LUN(1) != nil {
		t.Fatal("a change without persist reached the file")
	}
	sBefore := h.waitSessions("a", 1)[0]
	res, err := h.c.Reload(h.ctx())
	if err != nil || !slices.Equal(res.Changes, []string{"target b: LUN 1 removed"}) {
		t.Fatalf("reload: %+v %v", res, err)
	}
	if sAfter := h.waitSessions("a", 1)[0]; sAfter.ID != sBefore.ID {
		t.Fatalf("target a did not change but its session did: %s → %s", sBefore.ID, sAfter.ID)
	}

	// An invalid file changes nothing.
	good, _ := os.ReadFile(h.path)
	if err := os.WriteFile(h.path, []byte("version: 1\ntargets: 12\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.Reload(h.ctx()); !errors.Is(err, ctlapi.ErrInvalidArgument) || !strings.Contains(err.Error(), "srpd.yaml:2") {
		t.Fatalf("reload of an invalid file: %v", err)
	}
	if len(h.d.Config().Targets) != 2 {
		t.Fatal("an invalid reload changed the configuration")
	}
	if err := os.WriteFile(h.path, good, 0o600); err != nil {
		t.Fatal(err)
	}

	// Persisted changes reach the file; a persist failure rolls the change back.
	ini, _ := config.ParseInitiatorID("0x00000000000000090000000000000009")
	if _, err := h.c.AddACL(h.ctx(), "b", config.ACL{Initiator: ini, LUNs: []int{0}}, ctlapi.MutateOptions{Persist: true}); err != nil {
		t.Fatal(err)
	}
	if f, err := config.Load(h.path); err != nil || f.Target("b").ACL(ini) == nil {
		t.Fatalf("persisted ACL: %v", err)
	}
	h.d.opMu.Lock()
	h.d.writeConfigFile = func(string, []byte, os.FileMode) error { return errors.New("disk full") }
	h.d.opMu.Unlock()
	if _, err := h.c.AddLUN(h.ctx(), "b", config.LUN{ID: 2, Backend: config.BackendRAM, Size: 1 << 20, BlockSize: 512},
		ctlapi.MutateOptions{Persist: true}); err == nil || !strings.Contains(err.Error(), "persisting it failed") {
		t.Fatalf("persist whose write fails: %v", err)
	}
	if h.d.Config().Target("b").LUN(2) != nil {
		t.Fatal("a change whose persist failed stayed")
	}
	if ls, _ := h.c.ListLUNs(h.ctx(), "b"); len(ls) != 1 {
		t.Fatalf("LUNs of b after the rollback: %+v", ls)
	}
	h.d.opMu.Lock()
	h.d.writeConfigFile = nil
	realPath := h.d.opts.ConfigPath
	h.d.opts.ConfigPath = filepath.Join(h.dir, "gone", "srpd.yaml") // a file that does not exist
	h.d.opMu.Unlock()
	// Persisting into a missing file would make it hold this change alone: refused, before
	// anything is applied.
	if _, err := h.c.AddLUN(h.ctx(), "b", config.LUN{ID: 2, Backend: config.BackendRAM, Size: 1 << 20, BlockSize: 512},
		ctlapi.MutateOptions{Persist: true}); !errors.Is(err, ctlapi.ErrConflict) || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("persist into a missing file: %v", err)
	}
	if h.d.Config().Target("b").LUN(2) != nil {
		t.Fatal("a change refused for its persist was applied")
	}
	h.d.opMu.Lock()
	h.d.opts.ConfigPath = realPath
	h.d.opMu.Unlock()

	// Metrics.
	body := scrape(t, h.d)
	for _, want := range []string{`srpd_target_sessions{target="a"} 1`, `srpd_connection_up{connection="s"} 1`,
		`srpd_config_reloads_total 2`, `srpd_config_api_changes_total 4`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	h.d.Shutdown(context.Background())
	if _, err := os.Lstat(filepath.Join(h.dir, "ctl.sock")); !os.IsNotExist(err) {
		t.Errorf("control socket after shutdown: %v", err)
	}
	if _, err := h.d.Reload(context.Background()); !errors.Is(err, ctlapi.ErrUnavailable) {
		t.Errorf("reload after shutdown: %v", err)
	}
}

func TestPrepareSocket(t *testing.T) {
	dir := testutil.ShortTempDir(t, "srpd-d-")
	log := zap.NewNop()
	// Missing: fine, and its directory is created.
	p := filepath.Join(dir, "sub", "s.sock")
	if err := prepareSocket(p, log); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Dir(p)); err != nil || !fi.IsDir() {
		t.Fatalf("directory not created: %v", err)
	}
	// Live.
	l, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	if err := prepareSocket(p, log); !errors.Is(err, ErrSocketInUse) {
		t.Fatalf("live socket: %v", err)
	}
	// Stale.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if err := prepareSocket(p, log); err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	if _, err := os.Lstat(p); !os.IsNotExist(err) {
		t.Fatalf("stale socket not removed: %v", err)
	}
	// Not a socket.
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := prepareSocket(p, log); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("regular file: %v", err)
	}
}

func TestMakePlan(t *testing.T) {
	parse := func(s string) *config.Config {
		c, err := config.Parse("t.yaml", []byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	base := testConfig("/run/x", 4791)
	old := parse(base)
	d := New(Options{})

	// LUN added to a: applied to the running a (live), nothing restarts.
	p := d.makePlan(old, parse(strings.Replace(base, "        size: 4MiB\n    acls:", "        size: 4MiB\n      - id: 1\n        backend: ram\n        size: 1MiB\n    acls:", 1)))
	if len(p.stopTargets) != 0 || len(p.startTargets) != 0 || len(p.stopConns) != 0 || len(p.openTransports) != 0 ||
		len(p.live) != 1 || p.live[0].Name != "a" || len(p.live[0].Ops) != 1 || p.live[0].Ops[0].Kind != config.LUNAdd {
		t.Fatalf("LUN added: %+v", p)
	}
	// The transport changes: everything on it restarts, LUNs kept.
	p = d.makePlan(old, parse(strings.Replace(base, "udp_port: 4791", "udp_port: 4792", 1)))
	if !slices.Equal(p.closeTransports, []string{"lo"}) || !slices.Equal(p.openTransports, []string{"lo"}) ||
		len(p.stopTargets) != 2 || len(p.startTargets) != 2 || !slices.Equal(p.stopConns, []string{"s"}) || !p.keepLUNs["b"][0] {
		t.Fatalf("transport changed: %+v", p)
	}
	// b's port ID changes: its LUN without a serial gets a new identity, so it is reopened.
	p = d.makePlan(old, parse(strings.Replace(base, "port_id: "+portB, "port_id: 0x000000000000000f000000000000000f", 1)))
	if !slices.Equal(p.stopTargets, []string{"b"}) || p.keepLUNs["b"][0] {
		t.Fatalf("port id changed: %+v", p)
	}
	// Nothing changed, but a target failed before: it is retried.
	d.failed["target/b"] = "boom"
	p = d.makePlan(old, old)
	if len(p.stopTargets) != 0 || !slices.Equal(p.startTargets, []string{"b"}) {
		t.Fatalf("retry: %+v", p)
	}
}

func TestParseSessionID(t *testing.T) {
	for _, tc := range []struct {
		id     string
		target string
		n      uint64
		ok     bool
	}{
		{"demo.1", "demo", 1, true},
		{"a.b.c.42", "a.b.c", 42, true},
		{"demo", "", 0, false},
		{".1", "", 0, false},
		{"demo.x", "", 0, false},
	} {
		target, n, ok := parseSessionID(tc.id)
		if ok != tc.ok || (ok && (target != tc.target || n != tc.n)) {
			t.Errorf("parseSessionID(%q) = %q, %d, %v", tc.id, target, n, ok)
		}
	}
}
