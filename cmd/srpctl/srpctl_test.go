package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/ctlapi/ctlapitest"
	"github.com/srpd/srpd/transport/verbs"
)

// daemonConfig is ctlapitest.DemoConfig with an NBD export of session up's LUN 0.
const daemonConfig = ctlapitest.DemoConfig + `    nbd:
      - {lun: 0, socket: /run/srpd/up-lun0.nbd}
`

// fakeLinks is an in-memory linkManager.
type fakeLinks struct {
	links []rdmaLink
	err   error
	verbs []string // nil: the verbs engine is not built
}

func (f *fakeLinks) List() ([]rdmaLink, error) { return f.links, f.err }
func (f *fakeLinks) VerbsDevices() ([]string, error) {
	if f.verbs == nil {
		return nil, fmt.Errorf("%w: built without -tags verbs", verbs.ErrUnavailable)
	}
	return f.verbs, nil
}
func (f *fakeLinks) Add(name, typ, netdev string) error {
	if f.err != nil {
		return f.err
	}
	if netdev != "eth0" {
		return fmt.Errorf("network interface %q: %w", netdev, errNotFound)
	}
	for _, l := range f.links {
		if l.Name == name {
			return netlinkError("add RDMA link "+name, syscall.EEXIST)
		}
	}
	f.links = append(f.links, rdmaLink{Name: name, Index: uint32(len(f.links)), NodeGUID: "5054:00ff:fe00:0001", Ports: 1})
	return nil
}
func (f *fakeLinks) Delete(name string) error {
	for i, l := range f.links {
		if l.Name == name {
			f.links = append(f.links[:i], f.links[i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("RDMA link %q: %w", name, errNotFound)
}

type harness struct {
	t      *testing.T
	fake   *ctlapitest.Fake
	socket string
	links  *fakeLinks
	dir    string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	return startHarness(t, func(f *ctlapitest.Fake) ctlapi.Service {
		f.AddSession(ctlapi.SessionInfo{ID: "demo.1", Target: "demo", Initiator: config.MakePortID(0, 9), Remote: "127.0.0.1",
			Channels: 2, QueueDepth: 128, State: ctlapi.StateLoggedIn, LoginAt: time.Unix(1700000000, 0), LUNs: []int{0}})
		return f
	})
}

// startHarness serves, on a unix socket in a fresh directory, the service that svc makes of a fake
// daemon running daemonConfig.
func startHarness(t *testing.T, svc func(*ctlapitest.Fake) ctlapi.Service) *harness {
	t.Helper()
	dir, err := os.MkdirTemp("", "srpctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c, err := config.Parse("srpd.yaml", []byte(daemonConfig))
	if err != nil {
		t.Fatal(err)
	}
	f := ctlapitest.NewFake(c)
	sock := filepath.Join(dir, "srpd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: ctlapi.Handler(svc(f))}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return &harness{t: t, fake: f, socket: sock, links: &fakeLinks{}, dir: dir}
}

// run runs srpctl with args against the fake daemon and returns the exit code and outputs.
func (h *harness) run(stdin string, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	e := &env{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errb, links: h.links,
		getenv: func(k string) string {
			if k == "SRPCTL_SOCKET" {
				return h.socket
			}
			return ""
		},
		now: func() time.Time { return time.Unix(1700003600, 0) }}
	code := run(context.Background(), args, e)
	return code, out.String(), errb.String()
}

func TestCommands(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout []string
		stderr []string
	}{
		{"status", []string{"status"}, exitOK, []string{"srpd test (pid 4242), API v1", "up 1h0m0s", "lo", "softroce", "127.0.0.1"}, nil},
		{"target list", []string{"target", "list"}, exitOK, []string{"NAME", "PORT ID", "demo", "0x00000000000000010000000000000001", "127.0.0.1:5555"}, nil},
		{"target show", []string{"target", "show", "demo"}, exitOK, []string{"id_ext 0x0000000000000001", "LUNs (1):", "64MiB", "ACLs (1):", "Sessions (1):", "demo.1"}, nil},
		{"target show missing", []string{"target", "show", "nope"}, exitNotFound, nil, []string{`srpctl: target "nope": not found`}},
		{"target create", []string{"target", "create", "t2", "--port-id", "00000000000000010000000000000002", "--listen", "127.0.0.1", "--persist"}, exitOK,
			[]string{"target t2 created: port id 0x00000000000000010000000000000002, listening on 127.0.0.1:5555 (saved to the configuration file)"}, nil},
		{"target create existing", []string{"target", "create", "demo", "--port-id", "00000000000000010000000000000003"}, exitConflict, nil, []string{"already exists"}},
		{"target create invalid", []string{"target", "create", "t3", "--port-id", "00000000000000010000000000000003", "--cm-port", "70000"}, exitError, nil, []string{"cm_port: 70000 is out of range"}},
		{"target create bad port id", []string{"target", "create", "t3", "--port-id", "xyz"}, exitUsage, nil, []string{"--port-id: invalid port id"}},
		{"target create no port id", []string{"target", "create", "t3"}, exitUsage, nil, []string{"--port-id is required"}},
		{"target delete busy", []string{"target", "delete", "demo"}, exitConflict, nil, []string{"logged-in sessions"}},
		{"target delete force", []string{"target", "delete", "demo", "--force"}, exitOK, []string{"target demo deleted"}, nil},
		{"target delete missing", []string{"target", "rm", "nope"}, exitNotFound, nil, []string{"not found"}},
		{"lun list", []string{"lun", "list", "demo"}, exitOK, []string{"LUN", "BACKEND", "ram", "64MiB", "512"}, nil},
		{"lun add", []string{"lun", "add", "demo", "1", "--backend", "ram", "--size", "1GiB", "--block-size", "4096"}, exitOK, []string{"LUN 1 added to target demo: ram (1GiB, block size 4096)"}, nil},
		{"lun add bad size", []string{"lun", "add", "demo", "1", "--backend", "ram", "--size", "1000", "--block-size", "4096"}, exitError, nil, []string{"size: 1000 must be a multiple of the block size (4096)"}},
		{"lun add no backend", []string{"lun", "add", "demo", "1"}, exitUsage, nil, []string{"--backend is required"}},
		{"lun add bad id", []string{"lun", "add", "demo", "x", "--backend", "ram"}, exitUsage, nil, []string{`LUN "x"`}},
		{"lun add exists", []string{"lun", "add", "demo", "0", "--backend", "ram", "--size", "1MiB"}, exitConflict, nil, []string{"already exists"}},
		{"lun remove in use", []string{"lun", "remove", "demo", "0"}, exitConflict, nil, []string{"listed by the ACL"}},
		{"lun remove missing", []string{"lun", "remove", "demo", "7"}, exitNotFound, nil, []string{"LUN 7"}},
		{"acl list", []string{"acl", "list", "demo"}, exitOK, []string{"INITIATOR", "0x00000000000000000000000000000009", "0"}, nil},
		{"acl add any", []string{"acl", "add", "demo", "*", "--read-only"}, exitOK, []string{"initiator * may log in to target demo (LUNs: all, read-only: yes)"}, nil},
		{"acl add luns", []string{"acl", "add", "demo", "0x00000000000000000000000000000007", "--luns", "0"}, exitOK, []string{"(LUNs: 0, read-only: no)"}, nil},
		{"acl add bad lun", []string{"acl", "add", "demo", "*", "--luns", "3"}, exitError, nil, []string{"LUN 3 is not defined"}},
		{"acl add bad initiator", []string{"acl", "add", "demo", "bob"}, exitUsage, nil, []string{`invalid initiator "bob"`}},
		{"acl remove", []string{"acl", "remove", "demo", "00000000000000000000000000000009"}, exitOK, []string{"ACL of 0x00000000000000000000000000000009 removed"}, nil},
		{"acl remove missing", []string{"acl", "rm", "demo", "*"}, exitNotFound, nil, []string{"not found"}},
		{"session list", []string{"session", "list"}, exitOK, []string{"demo.1", "0x00000000000000000000000000000009", "logged-in", "1h0m0s"}, nil},
		{"session list target", []string{"session", "list", "--target", "nope"}, exitNotFound, nil, []string{"not found"}},
		{"session show", []string{"session", "show", "demo.1"}, exitOK, []string{"Channels:", "2", "Queue depth:", "128"}, nil},
		{"session kill", []string{"session", "kill", "demo.1"}, exitOK, []string{"session demo.1 killed"}, nil},
		{"session kill missing", []string{"session", "kill", "x"}, exitNotFound, nil, []string{`session "x": not found`}},
		{"connections", []string{"connections"}, exitOK, []string{"up", "127.0.0.1:5555", "running"}, nil},
		{"connection show", []string{"connections", "up"}, exitOK, []string{"Timeouts:", "reconnect_delay 10s, fast_io_fail_tmo 15s, dev_loss_tmo 10m0s", "/run/srpd/up-lun0.nbd"}, nil},
		{"connect", []string{"connect", "c2", "--address", "10.0.0.2:5556", "--target-port-id", "00000000000000010000000000000005",
			"--dev-loss-tmo", "off", "--nbd", "0=/run/srpd/c2.nbd"}, exitOK, []string{"connection c2 to 10.0.0.2:5556: running", "/run/srpd/c2.nbd"}, nil},
		{"connect ipv6", []string{"connect", "c6", "--address", "[fd00::2]", "--target-port-id", "00000000000000010000000000000006"}, exitOK, []string{"fd00::2"}, nil},
		{"connect bad tmo", []string{"connect", "c3", "--address", "10.0.0.2", "--target-port-id", "00000000000000010000000000000005", "--reconnect-delay", "soon"}, exitUsage, nil, []string{"invalid timeout"}},
		{"connect invalid tmo", []string{"connect", "c3", "--address", "10.0.0.2", "--target-port-id", "00000000000000010000000000000005", "--fast-io-fail-tmo", "20s", "--dev-loss-tmo", "10s"}, exitError, nil, []string{"fast_io_fail_tmo: 20s must be less than dev_loss_tmo"}},
		{"connect bad nbd", []string{"connect", "c3", "--address", "10.0.0.2", "--target-port-id", "00000000000000010000000000000005", "--nbd", "zero"}, exitUsage, nil, []string{"want LUN=SOCKET"}},
		{"connect duplicate", []string{"connect", "up", "--address", "10.0.0.2", "--target-port-id", "00000000000000010000000000000005"}, exitConflict, nil, []string{"already exists"}},
		{"disconnect", []string{"disconnect", "up", "--persist"}, exitOK, []string{"connection up closed (saved to the configuration file)"}, nil},
		{"disconnect missing", []string{"disconnect", "zz"}, exitNotFound, nil, []string{"not found"}},
		{"reload", []string{"reload"}, exitOK, []string{"no changes"}, nil},
		{"unknown command", []string{"frobnicate"}, exitUsage, nil, []string{`unknown command "frobnicate"`, "Run 'srpctl --help'"}},
		{"unknown subcommand", []string{"target", "frobnicate"}, exitUsage, nil, []string{`unknown command "frobnicate" for "srpctl target"`}},
		{"unknown flag", []string{"status", "--verbose"}, exitUsage, nil, []string{"unknown flag: --verbose"}},
		{"extra argument", []string{"status", "x"}, exitUsage, nil, []string{"want 0 argument(s), got 1"}},
		{"missing argument", []string{"lun", "list"}, exitUsage, nil, []string{"want 1 argument(s), got 0", "usage: srpctl lun list TARGET"}},
		{"bad output", []string{"-o", "xml", "status"}, exitUsage, nil, []string{`--output "xml": want table, json, yaml`}},
		{"help", []string{"--help"}, exitOK, []string{"Exit codes:", "3  srpd is not running", "7  unsupported by the kernel"}, nil},
		{"group help", []string{"target"}, exitOK, []string{"Available Commands:", "create"}, nil},
		{"completion", []string{"completion", "bash"}, exitOK, []string{"bash completion"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			code, stdout, stderr := h.run("", tt.args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.code, stdout, stderr)
			}
			for _, w := range tt.stdout {
				if !strings.Contains(stdout, w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout)
				}
			}
			for _, w := range tt.stderr {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
			if code == exitOK && stderr != "" {
				t.Errorf("stderr on success:\n%s", stderr)
			}
		})
	}
}

func TestJSONOutput(t *testing.T) {
	h := newHarness(t)
	for _, tt := range []struct {
		args []string
		v    any
		ok   func(any) bool
	}{
		{[]string{"status"}, &ctlapi.Status{}, func(v any) bool { return v.(*ctlapi.Status).PID == 4242 }},
		{[]string{"target", "list"}, &ctlapi.TargetList{}, func(v any) bool { return v.(*ctlapi.TargetList).Targets[0].Name == "demo" }},
		{[]string{"lun", "list", "demo"}, &ctlapi.LUNList{}, func(v any) bool { return v.(*ctlapi.LUNList).LUNs[0].Capacity == 64<<20 }},
		{[]string{"session", "list"}, &ctlapi.SessionList{}, func(v any) bool { return len(v.(*ctlapi.SessionList).Sessions) == 1 }},
		{[]string{"connections"}, &ctlapi.ConnectionList{}, func(v any) bool { return v.(*ctlapi.ConnectionList).Connections[0].Name == "up" }},
		{[]string{"lun", "add", "demo", "5", "--backend", "ram", "--size", "2MiB"}, &ctlapi.LUNInfo{}, func(v any) bool { return v.(*ctlapi.LUNInfo).ID == 5 }},
	} {
		code, stdout, stderr := h.run("", append([]string{"-o", "json"}, tt.args...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", tt.args, code, stderr)
		}
		if err := json.Unmarshal([]byte(stdout), tt.v); err != nil || !tt.ok(tt.v) {
			t.Errorf("%v: %v\n%s", tt.args, err, stdout)
		}
	}
	// Commands without a result print nothing in JSON mode.
	if code, stdout, _ := h.run("", "-o", "json", "session", "kill", "demo.1"); code != 0 || stdout != "" {
		t.Errorf("kill -o json: %d %q", code, stdout)
	}
}

func TestCreateFromFile(t *testing.T) {
	h := newHarness(t)
	spec := "name: big\nport_id: {id_ext: 1, ioc_guid: 7}\nluns:\n  - {id: 0, backend: ram, size: 1MiB}\n  - {id: 1, backend: ram, size: 2MiB}\nacls:\n  - {initiator: '*', luns: [1]}\n"
	path := filepath.Join(h.dir, "big.yaml")
	os.WriteFile(path, []byte(spec), 0o600)
	if code, out, errs := h.run("", "target", "create", "-f", path, "--persist"); code != 0 {
		t.Fatalf("exit %d: %s %s", code, out, errs)
	}
	tg := h.fake.Config().Target("big")
	if tg == nil || len(tg.LUNs) != 2 || len(tg.ACLs) != 1 || len(h.fake.Persisted()) != 1 {
		t.Fatalf("created %+v", tg)
	}
	// Standard input, and errors located in the file.
	code, _, stderr := h.run("name: bad\nport_id: 00000000000000010000000000000008\nluns:\n  - {id: 0, backend: ram}\n", "target", "create", "-f", "-")
	if code != exitError || !strings.Contains(stderr, "<stdin>:4: LUN 0: size: the ram backend needs a size") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if code, _, stderr := h.run("", "target", "create", "other", "-f", path); code != exitUsage || !strings.Contains(stderr, "differs") {
		t.Fatalf("name mismatch: %d %s", code, stderr)
	}
	if code, _, stderr := h.run("", "target", "create", "-f", path, "--cm-port", "1"); code != exitUsage || !strings.Contains(stderr, "cannot be combined") {
		t.Fatalf("flags with -f: %d %s", code, stderr)
	}
	sess := "name: s9\naddress: 10.9.9.9\ntarget_port_id: 00000000000000010000000000000009\ndev_loss_tmo: off\n"
	if code, out, errs := h.run(sess, "connect", "-f", "-"); code != 0 || !strings.Contains(out, "connection s9") {
		t.Fatalf("connect -f: %d %s %s", code, out, errs)
	}
}

func TestDaemonNotRunning(t *testing.T) {
	h := newHarness(t)
	missing := filepath.Join(h.dir, "gone.sock")
	code, _, stderr := h.run("", "--socket", missing, "target", "list")
	if code != exitNotRunning || !strings.Contains(stderr, "srpd is not running") || !strings.Contains(stderr, "hint: start it") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
}

func TestLinkCommands(t *testing.T) {
	h := newHarness(t)
	steps := []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"link", "list"}, exitOK, "no RDMA devices", ""},
		{[]string{"link", "add", "rxe0", "--netdev", "eth0"}, exitOK, "RDMA link rxe0 (rxe) created on eth0", ""},
		{[]string{"link", "add", "rxe0", "--netdev", "eth0"}, exitConflict, "", "file exists"},
		{[]string{"link", "add", "rxe1", "--netdev", "eth9"}, exitNotFound, "", `network interface "eth9"`},
		{[]string{"link", "add", "rxe1"}, exitUsage, "", "a network interface is required"},
		{[]string{"link", "add", "rxe1", "type", "rxe", "netdev", "eth0"}, exitOK, "RDMA link rxe1 (rxe) created on eth0", ""},
		{[]string{"link", "add", "rxe2", "netdev", "eth0", "type", "siw"}, exitOK, "RDMA link rxe2 (siw) created on eth0", ""},
		{[]string{"link", "add", "rxe3", "type", "rxe", "netdev"}, exitUsage, "", `"netdev" needs a value`},
		{[]string{"link", "add", "rxe3", "dev", "eth0"}, exitUsage, "", `unknown word "dev"`},
		{[]string{"link", "add", "rxe3", "type", "ib", "netdev", "eth0"}, exitUsage, "", `--type "ib"`},
		{[]string{"link", "add", "rxe3", "netdev", "eth0", "--netdev", "eth0"}, exitUsage, "", "netdev given twice"},
		{[]string{"link", "delete", "rxe1"}, exitOK, "RDMA link rxe1 deleted", ""},
		{[]string{"link", "delete", "rxe2"}, exitOK, "RDMA link rxe2 deleted", ""},
		{[]string{"link", "add", "rxe1", "--netdev", "eth0", "--type", "ib"}, exitUsage, "", `--type "ib"`},
		{[]string{"link", "list"}, exitOK, "rxe0", ""},
		{[]string{"link", "delete", "rxe0"}, exitOK, "RDMA link rxe0 deleted", ""},
		{[]string{"link", "delete", "rxe0"}, exitNotFound, "", "not found"},
	}
	for _, s := range steps {
		code, stdout, stderr := h.run("", s.args...)
		if code != s.code || !strings.Contains(stdout, s.stdout) || !strings.Contains(stderr, s.stderr) {
			t.Errorf("%v: exit %d (want %d)\nstdout: %s\nstderr: %s", s.args, code, s.code, stdout, stderr)
		}
	}
	// Without the verbs engine the VERBS column says "-"; with it, which links libibverbs sees,
	// and the devices it sees that RDMA netlink did not list.
	h.links.links = []rdmaLink{{Name: "rxe0", Index: 1, NodeGUID: "5054:00FF:FE77:0001", Ports: 1}, {Name: "siw0", Index: 2, Ports: 1}}
	if code, stdout, _ := h.run("", "link", "list"); code != exitOK || !strings.Contains(stdout, "VERBS") ||
		!regexpMatch(`(?m)^rxe0 .* -$`, stdout) {
		t.Errorf("no verbs engine: exit %d\n%s", code, stdout)
	}
	h.links.verbs = []string{"rxe0", "mlx5_0"}
	code, stdout, _ := h.run("", "link", "list")
	if code != exitOK || !regexpMatch(`(?m)^rxe0 .* yes$`, stdout) || !regexpMatch(`(?m)^siw0 .* no$`, stdout) ||
		!regexpMatch(`(?m)^mlx5_0 +- .* yes$`, stdout) {
		t.Errorf("verbs devices: exit %d\n%s", code, stdout)
	}
	code, stdout, _ = h.run("", "-o", "json", "link", "list")
	var js struct {
		Links        []rdmaLink `json:"links"`
		VerbsDevices []string   `json:"verbs_devices"`
	}
	if err := json.Unmarshal([]byte(stdout), &js); code != exitOK || err != nil || len(js.Links) != 2 || len(js.VerbsDevices) != 2 {
		t.Errorf("json: exit %d, %v\n%s", code, err, stdout)
	}
	// No RDMA netlink but libibverbs sees a device: listed, with a warning.
	h.links.err = netlinkError("list RDMA links", syscall.EPROTONOSUPPORT)
	code, stdout, stderr := h.run("", "link", "list")
	if code != exitOK || !regexpMatch(`(?m)^mlx5_0 .* yes$`, stdout) || !strings.Contains(stderr, "no RDMA netlink support") {
		t.Errorf("netlink error with verbs devices: exit %d\n%s\n%s", code, stdout, stderr)
	}
	// A kernel without RDMA netlink (and no verbs device): a clear message and exit 7.
	h.links.verbs = nil
	code, _, stderr = h.run("", "link", "list")
	if code != exitUnsupported || !strings.Contains(stderr, "no RDMA netlink support") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	h.links.err = netlinkError("add RDMA link rxe0", syscall.EPERM)
	if code, _, stderr := h.run("", "link", "add", "rxe0", "--netdev", "eth0"); code != exitPermission || !strings.Contains(stderr, "run as root") {
		t.Fatalf("EPERM: exit %d: %s", code, stderr)
	}
}

// TestRDMAGUID: netlink's little-endian GUID strings become what `rdma dev` prints.
func TestRDMAGUID(t *testing.T) {
	for in, want := range map[string]string{
		"02:00:77:fe:ff:00:54:50": "5054:00ff:fe77:0002", // rxe on 52:54:00:77:00:02, as seen in the guest
		"":                        "",
		"weird":                   "weird",
	} {
		if got := rdmaGUID(in); got != want {
			t.Errorf("rdmaGUID(%q) = %q, want %q", in, got, want)
		}
	}
}

func regexpMatch(re, s string) bool { return regexp.MustCompile(re).MatchString(s) }

// TestRealNetlinkAddDelete runs `link delete` and (only where the kernel has no RDMA netlink,
// so that nothing is created) `link add` against this machine's kernel: a kernel without RDMA
// netlink gives exit 7 and the explanation; one with it says the link does not exist.
func TestRealNetlinkAddDelete(t *testing.T) {
	runReal := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		e := &env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, links: netlinkLinks{}, getenv: func(string) string { return "" }, now: time.Now}
		return run(context.Background(), args, e), errb.String()
	}
	_, lerr := netlinkLinks{}.List()
	code, stderr := runReal("link", "delete", "srpdnone0")
	switch {
	case lerr != nil && errors.Is(lerr, errUnsupported):
		if code != exitUnsupported || !strings.Contains(stderr, "no RDMA netlink support") || !strings.Contains(stderr, "modprobe rdma_rxe") {
			t.Errorf("delete without RDMA netlink: exit %d: %s", code, stderr)
		}
		code, stderr = runReal("link", "add", "srpdnone0", "type", "rxe", "netdev", "lo")
		if code != exitUnsupported || !strings.Contains(stderr, "no RDMA netlink support") || !strings.Contains(stderr, "add RDMA link srpdnone0") {
			t.Errorf("add without RDMA netlink: exit %d: %s", code, stderr)
		}
		t.Logf("this kernel has no RDMA netlink: %s", strings.TrimSpace(stderr))
	case lerr != nil:
		t.Skipf("RDMA netlink: %v", lerr)
	default:
		if code != exitNotFound || !strings.Contains(stderr, `"srpdnone0"`) {
			t.Errorf("delete of a missing link: exit %d: %s", code, stderr)
		}
	}
	// A missing network interface is refused before netlink is asked.
	if code, stderr := runReal("link", "add", "srpdnone0", "netdev", "srpdnoif0"); code != exitNotFound || !strings.Contains(stderr, `network interface "srpdnoif0"`) {
		t.Errorf("add on a missing interface: exit %d: %s", code, stderr)
	}
}

// TestRealNetlink runs `link list` against this machine's kernel: either it lists devices, or
// the kernel has no RDMA netlink and the exit code is 7.
func TestRealNetlink(t *testing.T) {
	var out, errb bytes.Buffer
	e := &env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, links: netlinkLinks{}, getenv: func(string) string { return "" }, now: time.Now}
	code := run(context.Background(), []string{"link", "list"}, e)
	switch code {
	case exitOK:
		t.Logf("this kernel has RDMA netlink:\n%s", out.String())
	case exitUnsupported:
		if !strings.Contains(errb.String(), "no RDMA netlink support") {
			t.Fatalf("exit 7 without the explanation: %s", errb.String())
		}
	default:
		t.Fatalf("exit %d: %s", code, errb.String())
	}
}

func TestConfigValidate(t *testing.T) {
	h := newHarness(t)
	good := filepath.Join("..", "..", "configs", "srpd.reference.yaml")
	code, stdout, _ := h.run("", "config", "validate", good)
	if code != 0 || !strings.Contains(stdout, "valid (1 transports, 1 targets, 3 LUNs, 3 sessions)") {
		t.Fatalf("exit %d: %s", code, stdout)
	}
	bad := "transports:\n  - name: lo\n    address: 127.0.0.1\n    colour: blue\nlogging:\n  level: loud\n"
	code, _, stderr := h.run(bad, "config", "validate", "-")
	if code != exitError || !strings.Contains(stderr, "<stdin> is not valid (2 problems)") ||
		!strings.Contains(stderr, `<stdin>:4: transport "lo": colour: unknown field`) || !strings.Contains(stderr, `<stdin>:6: logging.level: "loud"`) {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	code, stdout, stderr = h.run(bad, "-o", "json", "config", "validate", "-")
	var res validateResult
	if code != exitError || stderr != "" || json.Unmarshal([]byte(stdout), &res) != nil || res.Valid || len(res.Errors) != 2 ||
		res.Errors[0].Line != 4 || res.Errors[0].Path != "transports[0].colour" || res.Errors[0].Kind != "unknown field" {
		t.Fatalf("json: exit %d %+v\n%s%s", code, res, stdout, stderr)
	}
	code, stdout, _ = h.run("", "config", "validate", "--print", filepath.Join("..", "..", "configs", "demo-loopback.yaml"))
	if code != 0 || !strings.Contains(stdout, "max_it_iu_len: 8276") {
		t.Fatalf("--print: %d %s", code, stdout)
	}
	if code, _, stderr := h.run("", "config", "validate", filepath.Join(h.dir, "missing.yaml")); code != exitError || !strings.Contains(stderr, "no such file") {
		t.Fatalf("missing file: %d %s", code, stderr)
	}
}

func TestExitCodeMapping(t *testing.T) {
	for _, tt := range []struct {
		err  error
		code int
	}{
		{nil, 0},
		{fmt.Errorf("x"), 1},
		{usagef("x"), 2},
		{&ctlapi.SocketError{Kind: ctlapi.ErrDaemonNotRunning, Err: syscall.ENOENT}, 3},
		{&ctlapi.SocketError{Kind: ctlapi.ErrPermission, Err: syscall.EACCES}, 4},
		{&ctlapi.APIError{Code: ctlapi.CodePermissionDenied}, 4},
		{&ctlapi.APIError{Code: ctlapi.CodeNotFound}, 5},
		{&ctlapi.APIError{Code: ctlapi.CodeAlreadyExists}, 6},
		{&ctlapi.APIError{Code: ctlapi.CodeConflict}, 6},
		{&ctlapi.APIError{Code: ctlapi.CodeUnsupported}, 7},
		{&ctlapi.APIError{Code: ctlapi.CodeInvalidArgument}, 1},
		{fmt.Errorf("target %q: %w", "a", config.ErrExists), 6},
		{fmt.Errorf("LUN 0 is listed by an ACL: %w", config.ErrInUse), 6},
		{fmt.Errorf("target busy: %w", ctlapi.ErrConflict), 6},
		{netlinkError("x", syscall.EPROTONOSUPPORT), 7},
		{netlinkError("x", syscall.EACCES), 4},
		{netlinkError("x", syscall.ENODEV), 5},
		{netlinkError("x", syscall.EEXIST), 6},
		{netlinkError("x", syscall.EINVAL), 1},
	} {
		if got := exitCode(tt.err); got != tt.code {
			t.Errorf("exitCode(%v) = %d, want %d", tt.err, got, tt.code)
		}
	}
	// Permission denied on the socket gets the group hint.
	err := &ctlapi.SocketError{Socket: "/run/srpd/srpd.sock", Kind: ctlapi.ErrPermission, Err: syscall.EACCES}
	if h := hint(err, "/run/srpd/srpd.sock"); !strings.Contains(h, "member of the control socket's group") {
		t.Errorf("hint %q", h)
	}
}
