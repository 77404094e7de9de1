package sdnotify

// Tests of the systemd files in systemd/ (the unit that uses this package's protocol).

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

const systemdDir = "../../systemd"

// needTool returns the path of a systemd tool, or skips the test loudly: CI must install the
// Debian package systemd for these checks to run.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		msg := fmt.Sprintf("SKIPPING %s: %s not found; install the Debian package systemd to check systemd/ (CI must)", t.Name(), name)
		fmt.Fprintln(os.Stderr, "!!! "+msg)
		t.Skip(msg)
	}
	return p
}

func readUnit(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(systemdDir, "srpd.service"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestUnitDirectives checks what the issue asks of the unit, without systemd.
func TestUnitDirectives(t *testing.T) {
	unit := readUnit(t)
	lines := map[string]bool{}
	for _, l := range strings.Split(unit, "\n") {
		lines[strings.TrimSpace(l)] = true
	}
	for _, want := range []string{
		"Type=notify",
		"ExecStart=/usr/sbin/srpd -c /etc/srpd/srpd.yaml",
		"ExecReload=/usr/bin/srpctl --timeout 60s reload",
		"Restart=on-failure",
		"LimitMEMLOCK=infinity",
		"ProtectSystem=strict",
		"ReadWritePaths=/etc/srpd",
		"StateDirectory=srpd",
		"RuntimeDirectory=srpd",
		"NoNewPrivileges=yes",
		"PrivateTmp=yes",
		"ProtectHome=yes",
		"User=srpd",
		"CapabilityBoundingSet=CAP_NET_ADMIN",
		"AmbientCapabilities=CAP_NET_ADMIN",
		"DevicePolicy=closed",
		"PrivateDevices=yes",
		"SystemCallFilter=@system-service",
		"SystemCallFilter=~@privileged @resources",
		"SystemCallErrorNumber=EPERM",
	} {
		if !lines[want] {
			t.Errorf("srpd.service lacks %q", want)
		}
	}
	if !strings.Contains(unit, "WatchdogSec=") {
		t.Error("srpd.service lacks WatchdogSec=")
	}
	for _, cap := range []string{"CAP_SYS_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK"} {
		for l := range lines {
			if strings.HasPrefix(l, "CapabilityBoundingSet=") && strings.Contains(l, cap) {
				t.Errorf("srpd.service grants %s: %s", cap, l)
			}
		}
	}
}

// TestUnitVerifies runs systemd-analyze verify on srpd.service, with ExecStart and ExecReload
// pointing at stand-in executables (verify checks that the binaries exist). Any warning fails
// the test: verify exits 0 on unknown directives and only prints them.
func TestUnitVerifies(t *testing.T) {
	analyze := needTool(t, "systemd-analyze")
	dir := t.TempDir()
	unit := readUnit(t)
	for _, bin := range []string{"/usr/sbin/srpd", "/usr/bin/srpctl"} {
		stub := filepath.Join(dir, filepath.Base(bin))
		if err := os.WriteFile(stub, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		unit = strings.ReplaceAll(unit, bin, stub)
	}
	path := filepath.Join(dir, "srpd.service")
	if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", "--man=no", path).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify srpd.service: %v\n%s", err, out)
	}

	// The check has teeth: a misspelt directive is reported.
	bad := strings.Replace(unit, "NoNewPrivileges=yes", "NoNewPrivilege=yes", 1)
	if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ = exec.Command(analyze, "verify", "--man=no", path).CombinedOutput()
	if !strings.Contains(string(out), "NoNewPrivilege") {
		t.Fatalf("systemd-analyze verify did not report a misspelt directive:\n%s", out)
	}
}

// TestUnitExposure: systemd-analyze security rates srpd.service's exposure 1.5 (the unit's
// comment says what the rest is and why); a change that loosens the sandbox fails here.
func TestUnitExposure(t *testing.T) {
	analyze := needTool(t, "systemd-analyze")
	path := filepath.Join(t.TempDir(), "srpd.service")
	if err := os.WriteFile(path, []byte(readUnit(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	// --threshold is in tenths: 15 is 1.5.
	out, err := exec.Command(analyze, "security", "--offline=yes", "--threshold=15", "--no-pager", path).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: exposure above 1.5 (%v):\n%s", err, out)
	}
	if !strings.Contains(string(out), "Overall exposure level for srpd.service: 1.5") {
		t.Errorf("systemd-analyze security: want an exposure of 1.5 (the unit's comment says so):\n%s", out)
	}
	// The check has teeth: without the system call filter the exposure is above 1.5.
	loose := strings.Replace(readUnit(t), "SystemCallFilter=@system-service", "", 1)
	if err := os.WriteFile(path, []byte(loose), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(analyze, "security", "--offline=yes", "--threshold=15", "--no-pager", path).CombinedOutput(); err == nil {
		t.Errorf("systemd-analyze security --threshold=15 passed a unit without SystemCallFilter=@system-service:\n%s", out)
	}
}

// TestSysusersAndTmpfiles applies srpd.sysusers.conf and srpd.tmpfiles.conf to a temporary root.
func TestSysusersAndTmpfiles(t *testing.T) {
	sysusers := needTool(t, "systemd-sysusers")
	tmpfiles := needTool(t, "systemd-tmpfiles")
	if os.Geteuid() != 0 {
		t.Skip("systemd-tmpfiles --root needs root to chown")
	}
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	abs := func(name string) string {
		p, err := filepath.Abs(filepath.Join(systemdDir, name))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if out, err := exec.Command(sysusers, "--root="+root, abs("srpd.sysusers.conf")).CombinedOutput(); err != nil {
		t.Fatalf("systemd-sysusers: %v\n%s", err, out)
	}
	group, _ := os.ReadFile(filepath.Join(root, "etc", "group"))
	passwd, _ := os.ReadFile(filepath.Join(root, "etc", "passwd"))
	if !strings.HasPrefix(string(group), "srpd:") || !strings.Contains(string(passwd), "srpd:x:") ||
		!strings.Contains(string(passwd), ":/var/lib/srpd:") {
		t.Fatalf("sysusers made:\n%s\n%s", passwd, group)
	}
	var gid uint32
	fmt.Sscanf(strings.SplitN(string(group), ":", 4)[2], "%d", &gid)

	if out, err := exec.Command(tmpfiles, "--root="+root, "--create", abs("srpd.tmpfiles.conf")).CombinedOutput(); err != nil {
		t.Fatalf("systemd-tmpfiles: %v\n%s", err, out)
	}
	fi, err := os.Stat(filepath.Join(root, "etc", "srpd"))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || fi.Mode().Perm() != 0o770 || st.Uid != 0 || st.Gid != gid {
		t.Fatalf("/etc/srpd: %v uid %d gid %d, want drwxrwx--- root:srpd(%d)", fi.Mode(), st.Uid, st.Gid, gid)
	}
}
