package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
)

// TestConfigRoundTrip runs the real binaries: `srpctl config show | srpd --check -c -`
// accepts the running configuration, run-time changes included, and it parses back to what
// runs; `srpctl reload` refuses to discard a run-time change (exit 6) and --dry-run names it;
// `srpctl config save` and `--persist` keep the operator's comments and add only
// non-defaults; a SIGHUP afterwards discards nothing.
func TestConfigRoundTrip(t *testing.T) {
	srpd, srpctlBin := binaries(t)
	dir := testutil.ShortTempDir(t, "srpd-")
	sock := filepath.Join(dir, "ctl.sock")
	cfgPath := filepath.Join(dir, "srpd.yaml")
	src := "# srpd on the test host: one RAM LUN.\n" + strings.Replace(minimalConfig(dir, testutil.FreeUDPPort(t), sock),
		"        size: 1MiB\n", "        size: 1MiB              # scratch space\n", 1)
	if err := os.WriteFile(cfgPath, []byte(src), 0o640); err != nil {
		t.Fatal(err)
	}
	n := newNotifySocket(t, dir)
	d := startDaemon(t, cfgPath, n)
	n.wait(t, "READY=1", 60*time.Second)

	// Run-time changes: a LUN and an ACL.
	mustSrpctl(t, sock, nil, "lun", "add", "t", "1", "--backend", "ram", "--size", "2MiB")
	mustSrpctl(t, sock, nil, "acl", "add", "t", "*")

	pipe := exec.Command("bash", "-c", fmt.Sprintf("set -o pipefail; %q --socket %q config show | %q --check -c -", srpctlBin, sock, srpd))
	var out bytes.Buffer
	pipe.Stdout, pipe.Stderr = &out, &out
	if err := pipe.Run(); err != nil || !strings.Contains(out.String(), "<stdin>: configuration OK (1 transport(s), 1 target(s), 0 session(s))") {
		t.Fatalf("srpctl config show | srpd --check -c -: %v\n%s", err, out.String())
	}
	shown := mustSrpctl(t, sock, nil, "config", "show")
	var running ctlapi.ConfigInfo
	mustSrpctl(t, sock, &running, "-o", "json", "config", "show")
	back, err := config.Parse("shown.yaml", []byte(shown))
	if err != nil || !config.Equal(back, running.Config) || back.Target("t").LUN(1) == nil || len(running.Unsaved) != 2 {
		t.Fatalf("config show does not round-trip (%v; unsaved %q):\n%s", err, running.Unsaved, shown)
	}
	if strings.Contains(shown, "block_size") || strings.Contains(shown, "max_channels") {
		t.Errorf("config show writes defaults:\n%s", shown)
	}
	// srpd -c - runs nothing: it has no file to reload.
	if code, _, stderr := runSrpd(t, "", "-c", "-"); code != exitUsage || !strings.Contains(stderr, "--check only") {
		t.Errorf("srpd -c - without --check: exit %d\n%s", code, stderr)
	}

	dry := mustSrpctl(t, sock, nil, "reload", "--dry-run")
	for _, w := range []string{"  target t: LUN 1 removed", "  target t: ACL * removed", "would discard", "  target t: LUN 1 added"} {
		if !strings.Contains(dry, w) {
			t.Errorf("reload --dry-run lacks %q:\n%s", w, dry)
		}
	}
	if code, stdout, stderr := srpctl(t, sock, "reload"); code != 6 || !strings.Contains(stderr, "target t: ACL * added") {
		t.Fatalf("reload over run-time changes: exit %d\n%s%s", code, stdout, stderr)
	}
	mustSrpctl(t, sock, nil, "config", "save")
	data, _ := os.ReadFile(cfgPath)
	for _, w := range []string{"# srpd on the test host: one RAM LUN.\n", "        size: 1MiB              # scratch space\n",
		"      - id: 1\n        backend: ram\n        size: 2MiB\n", "    acls:\n      - initiator: '*'\n"} {
		if !strings.Contains(string(data), w) {
			t.Errorf("saved file lacks %q:\n%s", w, data)
		}
	}
	if fi, _ := os.Stat(cfgPath); fi.Mode().Perm() != 0o640 {
		t.Errorf("saved file mode %v, want 0640 (kept)", fi.Mode())
	}
	before := len(data)
	mustSrpctl(t, sock, nil, "lun", "add", "t", "2", "--backend", "ram", "--size", "4MiB", "--persist")
	data, _ = os.ReadFile(cfgPath)
	added := "      - id: 2\n        backend: ram\n        size: 4MiB\n"
	if len(data) != before+len(added) || !strings.Contains(string(data), added) {
		t.Errorf("--persist of one LUN: %d bytes became %d, want +%d:\n%s", before, len(data), len(added), data)
	}
	if code, stdout, stderr := runSrpd(t, "", "--check", "-c", cfgPath); code != 0 {
		t.Fatalf("srpd --check on the saved file: exit %d\n%s%s", code, stdout, stderr)
	}
	d.signal(t, syscall.SIGHUP)
	n.wait(t, "RELOADING=1", 20*time.Second)
	n.wait(t, "READY=1", 30*time.Second)
	var luns ctlapi.LUNList
	mustSrpctl(t, sock, &luns, "-o", "json", "lun", "list", "t")
	if len(luns.LUNs) != 3 {
		t.Fatalf("LUNs after SIGHUP: %+v", luns)
	}
	if strings.Contains(d.stderr.String(), "reload discarded") {
		t.Errorf("SIGHUP after save discarded something:\n%s", tail(d.stderr.String(), 20))
	}
}

// runSrpd runs the srpd binary with args (stdin as its standard input) and returns its exit
// code and outputs.
func runSrpd(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	srpd, _ := binaries(t)
	cmd := exec.Command(srpd, args...)
	var o, e bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), o.String(), e.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, o.String(), e.String()
}
