package main

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
)

// TestDiscoverAndCompletion runs the real binaries on the demo configuration (the README's
// first command): `srpctl __complete lun list ""` (what the shell's completion script runs)
// lists the daemon's target; `srpctl discover 127.0.0.1:5555` finds the target, its port ID
// (named by the target) and its LUN; the connect line it prints, pasted into a shell, logs in,
// without taking the demo's own session's I_T nexus over.
func TestDiscoverAndCompletion(t *testing.T) {
	dir := testutil.ShortTempDir(t, "srpd-")
	path := writeDemoConfig(t, dir)
	_, srpctlBin := binaries(t)
	sock := filepath.Join(dir, "ctl.sock")
	n := newNotifySocket(t, dir)
	startDaemon(t, path, n)
	n.wait(t, "READY=1", 60*time.Second)

	code, stdout, stderr := srpctl(t, sock, "__complete", "lun", "list", "")
	if code != 0 || stdout != "demo\tlistening\n:4\n" {
		t.Fatalf("srpctl __complete lun list '': exit %d, %q (stderr %q); want the target demo and directive 4", code, stdout, stderr)
	}
	code, stdout, _ = srpctl(t, sock, "__complete", "lun", "remove", "demo", "")
	if code != 0 || stdout != "0\tram\n:4\n" {
		t.Fatalf("srpctl __complete lun remove demo '': exit %d, %q; want LUN 0", code, stdout)
	}

	out := mustSrpctl(t, sock, nil, "discover", "127.0.0.1:5555")
	t.Logf("srpctl discover 127.0.0.1:5555:\n%s", out)
	for _, w := range []string{
		"Target 127.0.0.1:5555 (through transport lo)",
		"target port ID 0x00000000000000010000000000000001 (id_ext 0x0000000000000001, ioc_guid 0x0000000000000001), named by the target",
		"probed as initiator 0x5352504450524f42",
		"echo id_ext=0000000000000001,ioc_guid=0000000000000001,dest=127.0.0.1:5555 > /sys/class/infiniband_srp/",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("discover output lacks %q", w)
		}
	}
	var lunRow []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 6 && f[0] == "0" {
			lunRow = f
		}
	}
	if lunRow == nil || !strings.Contains(strings.Join(lunRow, " "), "64MiB 512") {
		t.Fatalf("no row for LUN 0 of 64MiB, block 512:\n%s", out)
	}
	var line string
	for _, l := range strings.Split(out, "\n") {
		if s := strings.TrimSpace(l); strings.HasPrefix(s, "srpctl ") && strings.Contains(s, " connect ") {
			line = s
		}
	}
	// The demo's session uses initiator extension 0 to this target: the line must not.
	if !strings.Contains(line, "--socket "+sock+" connect 127.0.0.1-5555 --address 127.0.0.1:5555 --target-port-id 0x00000000000000010000000000000001 --initiator-ext 0x1 --transport lo") {
		t.Fatalf("connect line %q", line)
	}
	// Pasted into a shell that has srpctl on its PATH.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sh := exec.CommandContext(ctx, "bash", "-c", line)
	sh.Env = append(sh.Environ(), "PATH="+filepath.Dir(srpctlBin)+":/usr/bin:/bin")
	var o bytes.Buffer
	sh.Stdout, sh.Stderr = &o, &o
	if err := sh.Run(); err != nil {
		t.Fatalf("the pasted connect line failed: %v\n%s", err, o.String())
	}
	var cs ctlapi.ConnectionList
	mustSrpctl(t, sock, &cs, "-o", "json", "connections")
	got := map[string]ctlapi.ConnectionInfo{}
	for _, c := range cs.Connections {
		got[c.Name] = c
	}
	c, demo := got["127.0.0.1-5555"], got["demo"]
	if c.State != ctlapi.StateRunning || len(c.LUNs) != 1 || c.LUNs[0].Capacity != 64<<20 {
		t.Fatalf("the new connection: %+v", c)
	}
	if demo.State != ctlapi.StateRunning || c.InitiatorPortID == demo.InitiatorPortID {
		t.Fatalf("the demo's session: %+v; new connection's initiator %v", demo, c.InitiatorPortID)
	}
	// The probe logged out: the target has the demo's session and the new one only.
	var ss ctlapi.SessionList
	mustSrpctl(t, sock, &ss, "-o", "json", "session", "list")
	if len(ss.Sessions) != 2 {
		t.Fatalf("%d target sessions, want 2 (the probe logged out): %+v", len(ss.Sessions), ss.Sessions)
	}
}
