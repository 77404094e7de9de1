package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
)

// TestSyscallFilter checks that srpd stays inside the unit's SystemCallFilter=@system-service
// (systemd/srpd.service) through its end-to-end scenario: systemd is not PID 1 on the test
// machines, so srpd runs under `strace -f -c` and every system call it made is looked up in
// the set `systemd-analyze syscall-filter` gives for @system-service (nested groups expanded),
// read at test time. The scenario: the demo configuration (a target with a RAM LUN, a session
// to it over softroce, an NBD export), verified I/O through the export, srpctl status, stats,
// lun add/resize, config save (which keeps the file's owner: chown), discover, a reload
// (SIGHUP), then SIGTERM. A call outside the set would fail with EPERM under systemd.
func TestSyscallFilter(t *testing.T) {
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Skip("SKIP: strace is not installed (CI installs it: .ci/run)")
	}
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("SKIP: systemd-analyze is not installed (Debian package systemd)")
	}
	allowed := syscallFilterSet(t, "@system-service")
	srpdBin, _ := binaries(t)
	dir := testutil.ShortTempDir(t, "srpd-")
	cfg := writeDemoConfig(t, dir)
	sock := filepath.Join(dir, "ctl.sock")
	out := filepath.Join(dir, "strace.txt")
	n := newNotifySocket(t, dir)
	cmd := exec.Command(strace, "-f", "-qq", "-c", "-o", out, srpdBin, "-c", cfg)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+n.path)
	var logs testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	p := testutil.StartProc(t, cmd, func() string { return tail(logs.String(), 100) })
	n.wait(t, "READY=1", 90*time.Second)

	var st ctlapi.Status
	mustSrpctl(t, sock, &st, "-o", "json", "status")
	c, err := testutil.DialNBDClient(filepath.Join(dir, "lun0.nbd"), "", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	model := make([]byte, 4<<20)
	randomWrites(t, c, model, rand.New(rand.NewPCG(7, 8)), 200)
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	verifyAll(t, c, model)
	c.Close()
	mustSrpctl(t, sock, nil, "lun", "stats", "demo")
	mustSrpctl(t, sock, nil, "lun", "add", "demo", "1", "--backend", "ram", "--size", "1MiB")
	mustSrpctl(t, sock, nil, "lun", "resize", "demo", "1", "--size", "2MiB")
	mustSrpctl(t, sock, nil, "config", "save")
	mustSrpctl(t, sock, nil, "discover", "127.0.0.1:5555")
	if err := syscall.Kill(st.PID, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	n.wait(t, "RELOADING=1", 30*time.Second)
	n.wait(t, "READY=1", 30*time.Second)
	if err := syscall.Kill(st.PID, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done:
	case <-time.After(60 * time.Second):
		t.Fatal("srpd under strace did not exit within 60 s of SIGTERM")
	}
	if p.Err != nil {
		t.Fatalf("strace srpd: %v\n%s", p.Err, tail(logs.String(), 50))
	}
	used := straceSummary(t, out)
	// The softroce link's receive loop, the control and NBD sockets' accepts and the config
	// save's rename must be in it (the demo's session to its own target goes through the
	// device's loopback path, not sendmmsg).
	if len(used) < 40 || !slices.Contains(used, "recvmmsg") || !slices.Contains(used, "accept4") || !slices.Contains(used, "renameat") {
		t.Fatalf("strace saw %d system calls (%v): the scenario did not run as meant", len(used), used)
	}
	var outside []string
	for _, s := range used {
		if !allowed[s] {
			outside = append(outside, s)
		}
	}
	t.Logf("%d distinct system calls, all checked against @system-service (%d calls)", len(used), len(allowed))
	if len(outside) > 0 {
		t.Fatalf("system calls outside SystemCallFilter=@system-service (EPERM under systemd): %v", outside)
	}
}

// syscallFilterSet expands a systemd system call group into the names it allows.
func syscallFilterSet(t *testing.T, group string) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := exec.CommandContext(ctx, "systemd-analyze", "syscall-filter").Output()
	if err != nil {
		t.Fatalf("systemd-analyze syscall-filter: %v", err)
	}
	// The output: "@group" at the start of a line, then its members indented ("# ..."
	// comments, blank lines between groups).
	groups := map[string][]string{}
	var cur string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		f := strings.TrimSpace(line)
		switch {
		case f == "" || strings.HasPrefix(f, "#"):
		case !strings.HasPrefix(line, " ") && strings.HasPrefix(f, "@"):
			cur = f
		case cur != "":
			groups[cur] = append(groups[cur], f)
		}
	}
	if len(groups[group]) == 0 {
		t.Fatalf("systemd-analyze syscall-filter lists no group %s", group)
	}
	set := map[string]bool{}
	var add func(g string, depth int)
	add = func(g string, depth int) {
		if depth > 10 {
			t.Fatalf("syscall groups nested too deep at %s", g)
		}
		for _, m := range groups[g] {
			if strings.HasPrefix(m, "@") {
				add(m, depth+1)
			} else {
				set[m] = true
			}
		}
	}
	add(group, 0)
	return set
}

// straceSummary reads the syscall names of an `strace -c` table.
func straceSummary(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || strings.HasPrefix(f[0], "%") || strings.HasPrefix(f[0], "-") || f[len(f)-1] == "total" {
			continue
		}
		if _, err := fmt.Sscanf(f[0], "%f", new(float64)); err != nil {
			continue
		}
		names = append(names, f[len(f)-1])
	}
	slices.Sort(names)
	return slices.Compact(names)
}
