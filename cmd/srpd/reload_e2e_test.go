package main

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
)

// TestReloadThroughSrpctl: what srpd.service's ExecReload= (its srpctl arguments, read from
// the unit) does. A reload of a changed file exits 0 once srpd has applied it (synchronous:
// the LUN is there when srpctl returns); an invalid file makes srpctl exit 1 with srpd's
// error (file:line) and changes nothing; a run-time change made without --persist that the
// file would undo makes it exit 6 naming the change, and changes nothing; --force discards
// it and says so; SIGHUP still reloads.
func TestReloadThroughSrpctl(t *testing.T) {
	dir := testutil.ShortTempDir(t, "srpd-")
	cfgPath := filepath.Join(dir, "srpd.yaml")
	sock := filepath.Join(dir, "ctl.sock")
	orig := minimalConfig(dir, testutil.FreeUDPPort(t), sock)
	writeFile(t, cfgPath, orig)
	n := newNotifySocket(t, dir)
	d := startDaemon(t, cfgPath, n)
	n.wait(t, "READY=1", 60*time.Second)
	reload := unitExecReload(t)
	lunIDs := func() []int {
		t.Helper()
		var l ctlapi.LUNList
		mustSrpctl(t, sock, &l, "-o", "json", "lun", "list", "t")
		var ids []int
		for _, x := range l.LUNs {
			ids = append(ids, int(x.ID))
		}
		return ids
	}

	// A change: applied by the time srpctl exits.
	withLUN1 := strings.Replace(orig, "    luns:\n", "    luns:\n      - {id: 1, backend: ram, size: 2MiB}\n", 1)
	writeFile(t, cfgPath, withLUN1)
	if out := mustSrpctl(t, sock, nil, reload...); !strings.Contains(out, "configuration reloaded:") || !strings.Contains(out, "LUN 1 added") {
		t.Errorf("srpctl reload output:\n%s", out)
	}
	if ids := lunIDs(); len(ids) != 2 {
		t.Fatalf("LUNs after the reload: %v, want 0 and 1", ids)
	}
	n.wait(t, "READY=1", 30*time.Second)
	before := mustSrpctl(t, sock, nil, "config", "show")

	// An invalid file: exit 1, srpd's error naming the file and line, nothing changed.
	writeFile(t, cfgPath, withLUN1+"colour: blue\n")
	code, stdout, stderr := srpctl(t, sock, reload...)
	if code != 1 || !strings.Contains(stderr, cfgPath+":") || !strings.Contains(stderr, "colour") {
		t.Errorf("srpctl reload of an invalid file: exit %d, want 1 and %s:LINE ... colour\nstdout: %s\nstderr: %s", code, cfgPath, stdout, stderr)
	}
	msg, _ := n.wait(t, "READY=1", 30*time.Second)
	if st := hasPrefix(msg, "STATUS="); !strings.Contains(st, "reload failed") {
		t.Errorf("READY=1 after the failed reload: status %q", st)
	}
	if after := mustSrpctl(t, sock, nil, "config", "show"); after != before {
		t.Errorf("the failed reload changed the running configuration:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if ids := lunIDs(); len(ids) != 2 {
		t.Fatalf("LUNs after the failed reload: %v, want 0 and 1", ids)
	}

	// A run-time change without --persist: refused (exit 6, named), nothing changed; --force
	// discards it and says so.
	writeFile(t, cfgPath, withLUN1)
	mustSrpctl(t, sock, nil, "lun", "add", "t", "2", "--backend", "ram", "--size", "1MiB")
	code, stdout, stderr = srpctl(t, sock, reload...)
	if code != 6 || !strings.Contains(stderr, "LUN 2 added") {
		t.Errorf("srpctl reload over a run-time change: exit %d, want 6 and the change named\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if ids := lunIDs(); len(ids) != 3 {
		t.Fatalf("LUNs after the refused reload: %v, want 0, 1 and 2", ids)
	}
	if out := mustSrpctl(t, sock, nil, append(reload, "--force")...); !strings.Contains(out, "LUN 2 removed") || !strings.Contains(out, "discarded") {
		t.Errorf("srpctl reload --force over a run-time change:\n%s", out)
	}
	if ids := lunIDs(); len(ids) != 2 {
		t.Fatalf("LUNs after reload --force: %v, want 0 and 1", ids)
	}

	// SIGHUP still reloads.
	writeFile(t, cfgPath, orig)
	d.signal(t, syscall.SIGHUP)
	n.wait(t, "RELOADING=1", 30*time.Second)
	n.wait(t, "READY=1", 30*time.Second)
	if ids := lunIDs(); len(ids) != 1 {
		t.Fatalf("LUNs after SIGHUP: %v, want 0", ids)
	}
	d.signal(t, syscall.SIGTERM)
	if code := d.exit(t, 60*time.Second); code != 0 {
		t.Fatalf("srpd exited %d after SIGTERM", code)
	}
}
