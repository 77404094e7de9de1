package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
	"github.com/srpd/srpd/scsi/backend"
)

// pathFixture is a directory laid out like a host running srpd:
//
//	etc/srpd.yaml                 the configuration file (srpd -c)
//	etc/.srpd.yaml.tmp-1          a leftover of a configuration save
//	run/ctl.sock                  the control socket's place (run/ is the run directory)
//	luns/data.img                 a legitimate LUN (8 KiB)
//	luns/config-hardlink.img      a hard link to etc/srpd.yaml
//	luns/config-symlink.img       -> ../etc/srpd.yaml
//	luns/data-symlink.img         -> data.img
//	luns/sock-symlink             -> ../run/ctl.sock
//	luns/outside-symlink.img      -> ../other/secret.img
//	luns/linkdir                  -> ../other
//	other/secret.img              a file outside allowed_paths (8 KiB)
type pathFixture struct {
	dir, config, ctl, luns, other string
	configData                    []byte
}

func newPathFixture(t *testing.T) *pathFixture {
	t.Helper()
	f := &pathFixture{dir: testutil.ShortTempDir(t, "srpd-d-")}
	for _, d := range []string{"etc", "run", "luns", "other"} {
		if err := os.Mkdir(filepath.Join(f.dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	f.config = filepath.Join(f.dir, "etc", "srpd.yaml")
	f.ctl = filepath.Join(f.dir, "run", "ctl.sock")
	f.luns = filepath.Join(f.dir, "luns")
	f.other = filepath.Join(f.dir, "other")
	f.configData = []byte("# srpd's own configuration: must never become a LUN\nversion: 1\n")
	write := func(p string, data []byte) {
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(f.config, f.configData)
	write(filepath.Join(f.dir, "etc", ".srpd.yaml.tmp-1"), make([]byte, 8192))
	write(filepath.Join(f.luns, "data.img"), make([]byte, 8192))
	write(filepath.Join(f.other, "secret.img"), make([]byte, 8192))
	if err := os.Link(f.config, filepath.Join(f.luns, "config-hardlink.img")); err != nil {
		t.Fatal(err)
	}
	for link, to := range map[string]string{"config-symlink.img": "../etc/srpd.yaml", "data-symlink.img": "data.img",
		"sock-symlink": "../run/ctl.sock", "outside-symlink.img": "../other/secret.img", "linkdir": "../other"} {
		if err := os.Symlink(to, filepath.Join(f.luns, link)); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// configUnchanged fails the test when srpd's configuration file is not byte for byte what the
// fixture wrote: a LUN opened on it with a size would have zero-extended it.
func (f *pathFixture) configUnchanged(t *testing.T) {
	t.Helper()
	if got, err := os.ReadFile(f.config); err != nil || !bytes.Equal(got, f.configData) {
		t.Fatalf("srpd's configuration file changed (%d bytes, %v)", len(got), err)
	}
}

// TestOpenLUNPaths: every way of naming one of srpd's own files, a symlink without
// follow_symlinks and a path escaping allowed_paths is refused before anything is resized or
// created, with a LUNPathError of the right kind that is also config.ErrInvalid and
// ctlapi.ErrInvalidArgument; the legitimate paths open.
func TestOpenLUNPaths(t *testing.T) {
	f := newPathFixture(t)
	ln, err := net.Listen("unix", f.ctl) // the control socket exists, as it does under a daemon
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lun := func(path string, mod ...func(*config.LUN)) config.LUN {
		l := config.LUN{ID: 1, Backend: config.BackendFile, Path: path, BlockSize: 512}
		for _, m := range mod {
			m(&l)
		}
		return l
	}
	follow := func(l *config.LUN) { l.FollowSymlinks = true }
	sized := func(l *config.LUN) { l.Size = 1 << 20 }
	create := func(l *config.LUN) { l.Create, l.Size = true, 1<<20 }
	in := func(p string) string { return filepath.Join(f.luns, p) }
	noAllowed, allowed := []string(nil), []string{f.luns}
	tests := []struct {
		name    string
		l       config.LUN
		allowed []string
		want    error // nil: opens
		reason  string
	}{
		{"data file", lun(in("data.img")), allowed, nil, ""},
		{"data file, no allowed_paths", lun(in("data.img")), noAllowed, nil, ""},
		{"own config by path", lun(f.config, sized), noAllowed, ErrReservedPath, "is srpd's configuration file"},
		{"own config through a symlink", lun(in("config-symlink.img"), sized), noAllowed, backend.ErrSymlink, "set follow_symlinks: true"},
		{"own config through a followed symlink", lun(in("config-symlink.img"), sized, follow), noAllowed, ErrReservedPath, "is srpd's configuration file"},
		{"own config through a hard link", lun(in("config-hardlink.img"), sized), noAllowed, ErrReservedPath, "a hard link or another path to it"},
		{"own config through a hard link in allowed_paths", lun(in("config-hardlink.img"), sized), allowed, ErrReservedPath, "same file as"},
		{"temporary file of a save", lun(filepath.Join(f.dir, "etc", ".srpd.yaml.tmp-1")), noAllowed, ErrReservedPath, "temporary file of a configuration save"},
		{"control socket by path", lun(f.ctl), noAllowed, ErrReservedPath, "control socket"},
		{"control socket through a followed symlink", lun(in("sock-symlink"), follow), noAllowed, ErrReservedPath, "control socket"},
		{"run directory", lun(filepath.Join(f.dir, "run", "x.img"), create), noAllowed, ErrReservedPath, "run directory"},
		{"symlink to a data file", lun(in("data-symlink.img")), allowed, backend.ErrSymlink, "follow_symlinks"},
		{"followed symlink to a data file", lun(in("data-symlink.img"), follow), allowed, nil, ""},
		{"symlinked directory", lun(in("linkdir/secret.img")), noAllowed, backend.ErrSymlink, "resolves to " + f.other},
		{"create through a symlinked directory", lun(in("linkdir/new.img"), create), noAllowed, backend.ErrSymlink, "symbolic link"},
		{"followed symlink out of allowed_paths", lun(in("outside-symlink.img"), follow), allowed, ErrPathNotAllowed, "outside allowed_paths"},
		{"followed symlinked directory out of allowed_paths", lun(in("linkdir/secret.img"), follow), allowed, ErrPathNotAllowed, "outside allowed_paths"},
		{"followed symlink, no allowed_paths", lun(in("outside-symlink.img"), follow), noAllowed, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := New(Options{ConfigPath: f.config, RunDirs: []string{filepath.Join(f.dir, "run")}})
			c := &config.Config{AllowedPaths: tt.allowed, Control: config.Control{Socket: f.ctl}}
			tgt := &config.Target{Name: "t"}
			lr, err := openLUN(tgt, tt.l, d.newLUNGuard(c), nil)
			f.configUnchanged(t)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("openLUN(%s): %v", tt.l.Path, err)
				}
				lr.close(zap.NewNop())
				return
			}
			if err == nil {
				lr.close(zap.NewNop())
				t.Fatalf("openLUN(%s) opened it; want %v", tt.l.Path, tt.want)
			}
			var pe *LUNPathError
			if !errors.As(err, &pe) || !errors.Is(err, tt.want) || !errors.Is(err, config.ErrInvalid) ||
				!errors.Is(err, ctlapi.ErrInvalidArgument) {
				t.Fatalf("openLUN(%s) = %v (%T); want a LUNPathError of kind %v", tt.l.Path, err, err, tt.want)
			}
			if pe.Target != "t" || pe.LUN != 1 || pe.Path != tt.l.Path || !strings.Contains(err.Error(), tt.reason) ||
				!strings.Contains(err.Error(), "LUN 1") || !strings.Contains(err.Error(), tt.l.Path) {
				t.Errorf("error %q (%+v) should name target t, LUN 1, %s and say %q", err, pe, tt.l.Path, tt.reason)
			}
			for _, p := range []string{filepath.Join(f.dir, "run", "x.img"), filepath.Join(f.other, "new.img")} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("%s was created for a refused LUN", p)
				}
			}
		})
	}
}

// TestLUNGuardAdmitByIdentity: a hard link to srpd's configuration file is refused by the
// check before opening (by inode), and, swapped in after a check passed, by the Admit hook
// before the backend resizes it.
func TestLUNGuardAdmitByIdentity(t *testing.T) {
	f := newPathFixture(t)
	d := New(Options{ConfigPath: f.config})
	g := d.newLUNGuard(&config.Config{})
	tgt := &config.Target{Name: "t"}
	l := config.LUN{ID: 2, Backend: config.BackendFile, Path: filepath.Join(f.luns, "swapped.img"), Size: 1 << 20, BlockSize: 512}
	// Before the swap the path is a data file: the checks before opening pass.
	if err := os.WriteFile(l.Path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := g.check(tgt, &l); err != nil {
		t.Fatalf("check of a data file: %v", err)
	}
	if err := os.Remove(l.Path); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(f.config, l.Path); err != nil {
		t.Fatal(err)
	}
	// A check now sees the inode, before anything is opened (so the API restarts nothing).
	if err := g.check(tgt, &l); !errors.Is(err, ErrReservedPath) {
		t.Fatalf("check of a hard link to the config = %v; want ErrReservedPath", err)
	}
	_, err := backend.OpenFile(l.Path, backend.FileOptions{Size: int64(l.Size), NoSymlinks: true, Admit: g.admit(tgt, &l)})
	if !errors.Is(err, ErrReservedPath) {
		t.Fatalf("OpenFile with the guard's Admit = %v; want ErrReservedPath", err)
	}
	f.configUnchanged(t)
}

// startPathDaemon runs a daemon on a one-target configuration with extra top-level YAML,
// written to f.config, and returns a client of its control API.
func startPathDaemon(t *testing.T, f *pathFixture, extra string) (*Daemon, *ctlapi.Client) {
	t.Helper()
	src := testutil.LoopbackConfig(testutil.FreeUDPPort(t)) + fmt.Sprintf(`targets:
  - name: a
    port_id: %s
    luns:
      - {id: 0, backend: ram, size: 1MiB}
control:
  socket: %s
%s`, portA, f.ctl, extra)
	f.configData = []byte(src)
	if err := os.WriteFile(f.config, f.configData, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(f.config)
	if err != nil {
		t.Fatal(err)
	}
	d := New(Options{ConfigPath: f.config, Logger: zap.NewNop(), DrainTimeout: 10 * time.Second, RunDirs: []string{}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.Start(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	c := ctlapi.NewClient(f.ctl)
	t.Cleanup(func() {
		c.Close()
		d.Shutdown(context.Background())
	})
	return d, c
}

// TestAddLUNPathsRefused: the control API (LUN add, target create) refuses the same paths as
// the configuration file, with 400 invalid_argument, without touching srpd's configuration
// file or keeping the LUN; a followed symlink inside allowed_paths is accepted.
func TestAddLUNPathsRefused(t *testing.T) {
	f := newPathFixture(t)
	d, c := startPathDaemon(t, f, "allowed_paths: ["+f.luns+"]\n")
	// startPathDaemon rewrote the hard link's inode's content: re-link so it is the config.
	if err := os.Remove(filepath.Join(f.luns, "config-hardlink.img")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(f.config, filepath.Join(f.luns, "config-hardlink.img")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in := func(p string) string { return filepath.Join(f.luns, p) }
	for _, tt := range []struct {
		name   string
		l      config.LUN
		reason string
	}{
		{"own config by path", config.LUN{Path: f.config, Size: 1 << 20}, "configuration file"},
		{"own config through a symlink", config.LUN{Path: in("config-symlink.img"), Size: 1 << 20}, "follow_symlinks"},
		{"own config through a followed symlink", config.LUN{Path: in("config-symlink.img"), Size: 1 << 20, FollowSymlinks: true}, "configuration file"},
		{"own config through a hard link", config.LUN{Path: in("config-hardlink.img"), Size: 1 << 20}, "hard link"},
		{"control socket", config.LUN{Path: f.ctl}, "control socket"},
		{"outside allowed_paths", config.LUN{Path: filepath.Join(f.other, "secret.img")}, "outside allowed_paths"},
		{"followed symlink out of allowed_paths", config.LUN{Path: in("outside-symlink.img"), FollowSymlinks: true}, "outside allowed_paths"},
		{"symlinked directory", config.LUN{Path: in("linkdir/secret.img")}, "symbolic link"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := tt.l
			l.ID, l.Backend, l.BlockSize = 5, config.BackendFile, 512
			_, err := c.AddLUN(ctx, "a", l, ctlapi.MutateOptions{Persist: true})
			var ae *ctlapi.APIError
			if !errors.As(err, &ae) || ae.Code != ctlapi.CodeInvalidArgument || ae.StatusCode != 400 {
				t.Fatalf("AddLUN(%s) = %v; want 400 invalid_argument", l.Path, err)
			}
			if !strings.Contains(err.Error(), tt.reason) || !strings.Contains(err.Error(), l.Path) {
				t.Errorf("AddLUN(%s): %q should name the path and say %q", l.Path, err, tt.reason)
			}
			f.configUnchanged(t)
			if d.Config().Target("a").LUN(5) != nil {
				t.Fatal("a refused LUN stayed in the configuration")
			}
			// The same LUN in a new target's body.
			pc, _ := config.ParsePortID("0x000000000000000c000000000000000c")
			_, err = c.CreateTarget(ctx, config.Target{Name: "c", PortID: pc, CMPort: 5557, LUNs: []config.LUN{l}}, ctlapi.MutateOptions{})
			if !errors.As(err, &ae) || ae.Code != ctlapi.CodeInvalidArgument {
				t.Fatalf("CreateTarget with LUN %s = %v; want 400 invalid_argument", l.Path, err)
			}
			f.configUnchanged(t)
		})
	}
	ok := config.LUN{ID: 6, Backend: config.BackendFile, Path: in("data-symlink.img"), FollowSymlinks: true, BlockSize: 512}
	if li, err := c.AddLUN(ctx, "a", ok, ctlapi.MutateOptions{}); err != nil || li.Capacity != 8192 {
		t.Fatalf("AddLUN of a followed symlink inside allowed_paths: %+v, %v", li, err)
	}
}

// TestStartRefusesOwnConfig: srpd -c FILE with a LUN on FILE itself (the reported case: with
// size: 1MiB the file was zero-extended and the next start failed) is refused by Load and by
// the daemon, and the file is left intact.
func TestStartRefusesOwnConfig(t *testing.T) {
	f := newPathFixture(t)
	src := fmt.Sprintf(`transports:
  - {name: lo, address: 127.0.0.1, udp_port: %d}
targets:
  - name: a
    port_id: %s
    luns:
      - {id: 0, backend: file, path: %s, size: 1MiB}
control:
  socket: %s
`, testutil.FreeUDPPort(t), portA, f.config, f.ctl)
	f.configData = []byte(src)
	if err := os.WriteFile(f.config, f.configData, 0o600); err != nil {
		t.Fatal(err)
	}
	// srpd -c FILE: Load names the LUN as the file itself.
	if _, err := config.Load(f.config); !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), "this configuration file") {
		t.Fatalf("Load of a config exporting itself = %v; want ErrInvalid", err)
	}
	// The daemon refuses it on its own too (a configuration built in code, as the API's
	// mutations are, has no file name to compare with).
	cfg, err := config.Parse("elsewhere.yaml", f.configData)
	if err != nil {
		t.Fatal(err)
	}
	d := New(Options{ConfigPath: f.config, Logger: zap.NewNop(), DrainTimeout: 10 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = d.Start(ctx, cfg)
	d.Shutdown(context.Background())
	if !errors.Is(err, ErrReservedPath) || !strings.Contains(err.Error(), "configuration file") {
		t.Fatalf("Start with a LUN on its own config = %v; want ErrReservedPath", err)
	}
	f.configUnchanged(t)
	data, _ := os.ReadFile(f.config)
	if _, err := config.Parse("elsewhere.yaml", data); err != nil {
		t.Fatalf("the configuration no longer parses: %v", err)
	}
}

// TestReloadNarrowedAllowedPaths: a reload that narrows allowed_paths reopens the LUNs that
// follow symlinks, so one whose real path is now outside is closed and its target reported in
// error; the previous list again brings it back.
func TestReloadNarrowedAllowedPaths(t *testing.T) {
	f := newPathFixture(t)
	lun := fmt.Sprintf("  - name: b\n    port_id: %s\n    cm_port: 5556\n    luns:\n"+
		"      - {id: 0, backend: file, path: %s, follow_symlinks: true}\n", portB, filepath.Join(f.luns, "outside-symlink.img"))
	wide := "allowed_paths: [" + f.luns + ", " + f.other + "]\n"
	_, c := startPathDaemon(t, f, wide)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Add target b through the file and a reload, as an operator would.
	src := strings.Replace(string(f.configData), "control:", lun+"control:", 1)
	if err := os.WriteFile(f.config, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if ti, err := c.GetTarget(ctx, "b"); err != nil || ti.State != ctlapi.StateListening {
		t.Fatalf("target b with allowed_paths covering its LUN: %+v, %v", ti, err)
	}
	narrow := strings.Replace(src, wide, "allowed_paths: ["+f.luns+"]\n", 1)
	if err := os.WriteFile(f.config, []byte(narrow), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := c.Reload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The change is live: target b keeps running, its LUN 0 is closed and in error.
	ti, err := c.GetTarget(ctx, "b")
	if err != nil || ti.State != ctlapi.StateListening || len(ti.LUNs) != 1 || ti.LUNs[0].State != ctlapi.StateError ||
		!strings.Contains(ti.LUNs[0].Error, "outside allowed_paths") {
		t.Fatalf("target b after narrowing allowed_paths (changes %q): %+v, %v", res.Changes, ti, err)
	}
	if ta, _ := c.GetTarget(ctx, "a"); ta.State != ctlapi.StateListening {
		t.Errorf("target a (RAM only) was affected: %+v", ta)
	}
	if err := os.WriteFile(f.config, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if ti, _ := c.GetTarget(ctx, "b"); ti.State != ctlapi.StateListening || len(ti.LUNs) != 1 || ti.LUNs[0].State != ctlapi.StateUp {
		t.Fatalf("target b after widening again: %+v", ti)
	}
}

// TestClassifyOpenError: the backend's refusals of a LUN get an API kind (so the control API
// answers 400 or 409, not 500) without a change of message; other failures stay unclassified.
func TestClassifyOpenError(t *testing.T) {
	for _, c := range []struct {
		err  error
		kind error // nil: neither kind
	}{
		{fmt.Errorf("flock: %w", backend.ErrBusy), ctlapi.ErrConflict},
		{fmt.Errorf("x: %w", backend.ErrWouldShrink), ctlapi.ErrInvalidArgument},
		{fmt.Errorf("x: %w", backend.ErrNotRegularFile), ctlapi.ErrInvalidArgument},
		{fmt.Errorf("x: %w", backend.ErrNotBlockDevice), ctlapi.ErrInvalidArgument},
		{fmt.Errorf("x: %w", backend.ErrInvalidSize), ctlapi.ErrInvalidArgument},
		{&os.PathError{Op: "open", Path: "/x", Err: os.ErrNotExist}, ctlapi.ErrInvalidArgument},
		{&os.PathError{Op: "open", Path: "/x", Err: errors.New("input/output error")}, nil},
	} {
		got := classifyOpenError(c.err)
		if got.Error() != c.err.Error() || !errors.Is(got, c.err) {
			t.Errorf("classifyOpenError(%v) = %v: message or chain changed", c.err, got)
		}
		for _, k := range []error{ctlapi.ErrConflict, ctlapi.ErrInvalidArgument} {
			if errors.Is(got, k) != (k == c.kind) {
				t.Errorf("classifyOpenError(%v): errors.Is(%v) = %v, want kind %v", c.err, k, errors.Is(got, k), c.kind)
			}
		}
	}
}
