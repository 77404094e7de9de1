package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/srpd/srpd/internal/ctlapi"
)

// TestCompletion runs cobra's hidden __complete command (what the shell scripts call) against
// the fake daemon: the names come from the control socket.
func TestCompletion(t *testing.T) {
	h := newHarness(t)
	h.links.links = []rdmaLink{{Name: "rxe0"}, {Name: "rxe1"}}
	for _, tc := range []struct {
		name string
		args []string
		want []string // candidates, in order (descriptions after a tab included)
		dir  string   // the directive line
	}{
		{"targets", []string{"__complete", "lun", "list", ""}, []string{"demo\tlistening"}, ":4"},
		{"target show", []string{"__complete", "target", "show", ""}, []string{"demo\tlistening"}, ":4"},
		{"LUNs of a target", []string{"__complete", "lun", "remove", "demo", ""}, []string{"0\tram"}, ":4"},
		{"ACLs of a target", []string{"__complete", "acl", "remove", "demo", ""}, []string{"0x00000000000000000000000000000009"}, ":4"},
		{"nothing after the last argument", []string{"__complete", "lun", "remove", "demo", "0", ""}, nil, ":4"},
		{"sessions", []string{"__complete", "session", "kill", ""}, []string{"demo.1\tdemo"}, ":4"},
		{"connections", []string{"__complete", "disconnect", ""}, []string{"up\trunning"}, ":4"},
		{"--target flag", []string{"__complete", "session", "list", "--target", ""}, []string{"demo\tlistening"}, ":4"},
		{"-o values", []string{"__complete", "status", "-o", ""}, []string{"table", "json", "yaml"}, ":4"},
		{"ALUA states", []string{"__complete", "target", "alua", "demo", "--state", ""},
			[]string{"active/optimized", "active/non-optimized", "standby", "unavailable", "transitioning"}, ":4"},
		{"RDMA links (netlink)", []string{"__complete", "link", "delete", ""}, []string{"rxe0", "rxe1"}, ":4"},
		{"a new name is not completed", []string{"__complete", "target", "create", ""}, nil, ":0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := h.run("", tc.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
			got, dir := lines[:len(lines)-1], lines[len(lines)-1]
			if strings.Join(got, "|") != strings.Join(tc.want, "|") || dir != tc.dir {
				t.Fatalf("candidates %q, directive %q; want %q, %q", got, dir, tc.want, tc.dir)
			}
		})
	}
	// What is offered is what the commands take.
	if code, _, stderr := h.run("", "acl", "remove", "demo", "0x00000000000000000000000000000009"); code != 0 {
		t.Fatalf("acl remove with the completed initiator: exit %d: %s", code, stderr)
	}
	// A daemon that is not there completes nothing, with the error directive, and quickly.
	code, stdout, _ := h.run("", "--socket", filepath.Join(h.dir, "gone.sock"), "__complete", "lun", "list", "")
	if code != 0 || strings.TrimSpace(stdout) != ":1" {
		t.Fatalf("no daemon: exit %d, %q; want only the error directive :1", code, stdout)
	}
}

func TestYAMLOutput(t *testing.T) {
	h := newHarness(t)
	code, stdout, stderr := h.run("", "-o", "yaml", "lun", "list", "demo")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	// Same field names as JSON, block style, keys in the JSON order.
	var l ctlapi.LUNList
	var m map[string]any
	if err := yaml.Unmarshal([]byte(stdout), &m); err != nil {
		t.Fatalf("not YAML: %v\n%s", err, stdout)
	}
	b, _ := json.Marshal(m)
	if err := json.Unmarshal(b, &l); err != nil || len(l.LUNs) != 1 || l.LUNs[0].Capacity != 64<<20 || l.LUNs[0].Backend != "ram" {
		t.Fatalf("YAML does not carry the JSON fields: %v\n%s", err, stdout)
	}
	if !strings.HasPrefix(stdout, "luns:\n") || strings.ContainsAny(stdout, "{}") || !strings.Contains(stdout, "capacity: 67108864") {
		t.Fatalf("not block-style YAML with JSON names:\n%s", stdout)
	}
	// A string that reads as a number stays a string.
	code, stdout, _ = h.run("", "-o", "yaml", "acl", "list", "demo")
	if code != 0 || !strings.Contains(stdout, `initiator: "0x00000000000000000000000000000009"`) {
		t.Fatalf("acl list -o yaml: %d\n%s", code, stdout)
	}
}

func TestNoHeaders(t *testing.T) {
	h := newHarness(t)
	_, with, _ := h.run("", "lun", "list", "demo")
	code, without, stderr := h.run("", "--no-headers", "lun", "list", "demo")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	wl, nl := strings.Split(strings.TrimSpace(with), "\n"), strings.Split(strings.TrimSpace(without), "\n")
	if len(wl) != len(nl)+1 || !strings.HasPrefix(wl[0], "LUN") || strings.HasPrefix(nl[0], "LUN") || strings.Fields(nl[0])[0] != "0" {
		t.Fatalf("with headers:\n%s\nwithout:\n%s", with, without)
	}
}

func TestStructuredErrors(t *testing.T) {
	h := newHarness(t)
	for _, format := range []string{"json", "yaml"} {
		code, stdout, stderr := h.run("", "-o", format, "--socket", filepath.Join(h.dir, "gone.sock"), "target", "list")
		var doc errorDoc
		var err error
		if format == "json" {
			err = json.Unmarshal([]byte(stderr), &doc)
		} else {
			var m map[string]any
			if err = yaml.Unmarshal([]byte(stderr), &m); err == nil {
				b, _ := json.Marshal(m)
				err = json.Unmarshal(b, &doc)
			}
		}
		if code != exitNotRunning || stdout != "" || err != nil || doc.ExitCode != exitNotRunning ||
			!strings.Contains(doc.Error, "srpd is not running") || !strings.Contains(doc.Hint, "start it") {
			t.Fatalf("-o %s: exit %d, stdout %q, stderr %q (%v)", format, code, stdout, stderr, err)
		}
	}
	// A usage error too.
	code, _, stderr := h.run("", "-o", "json", "lun", "list")
	var doc errorDoc
	if code != exitUsage || json.Unmarshal([]byte(stderr), &doc) != nil || doc.ExitCode != exitUsage {
		t.Fatalf("usage error -o json: exit %d, %q", code, stderr)
	}
}

func TestVersion(t *testing.T) {
	h := newHarness(t)
	code, stdout, stderr := h.run("", "version")
	if code != 0 || !strings.Contains(stdout, "Client: srpctl ") || !strings.Contains(stdout, "Daemon: srpd test (pid 4242, API v1") {
		t.Fatalf("exit %d: %s %s", code, stdout, stderr)
	}
	code, stdout, _ = h.run("", "-o", "json", "--socket", filepath.Join(h.dir, "gone.sock"), "version")
	var v versionInfo
	if code != 0 || json.Unmarshal([]byte(stdout), &v) != nil || v.Client.GoVersion == "" || v.Daemon != nil ||
		!strings.Contains(v.DaemonError, "not running") {
		t.Fatalf("no daemon, -o json: exit %d: %s", code, stdout)
	}
}

func TestDiscover(t *testing.T) {
	h := newHarness(t)
	code, stdout, stderr := h.run("", "discover", "192.0.2.20")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, w := range []string{
		"target port ID 0x00000000000000010000000000000001 (id_ext 0x0000000000000001, ioc_guid 0x0000000000000001), named by the target",
		// Not "192.0.2.20-5555" as-is: the name is free among the daemon's connections.
		"srpctl connect 192.0.2.20-5555 --address 192.0.2.20:5555 --target-port-id 0x00000000000000010000000000000001 --initiator-ext 0x1 --transport lo\n",
		"echo id_ext=0000000000000001,ioc_guid=0000000000000001,dest=192.0.2.20:5555 > ",
	} {
		if !strings.Contains(stdout, w) {
			t.Errorf("output lacks %q:\n%s", w, stdout)
		}
	}
	// A port no target listens on: the daemon's not-found, exit code and message.
	if code, _, stderr := h.run("", "discover", "192.0.2.20:6000"); code != exitNotFound || !strings.Contains(stderr, "no target") {
		t.Fatalf("unknown port: exit %d: %s", code, stderr)
	}
	if code, _, stderr := h.run("", "discover", "192.0.2.20", "--target-port-id", "zz"); code != exitUsage {
		t.Fatalf("bad port ID: exit %d: %s", code, stderr)
	}
	code, stdout, _ = h.run("", "-o", "json", "discover", "192.0.2.20")
	var d ctlapi.Discovery
	if code != 0 || json.Unmarshal([]byte(stdout), &d) != nil || len(d.LUNs) != 1 || d.LUNs[0].Capacity != 64<<20 {
		t.Fatalf("-o json: %d %s", code, stdout)
	}
}

func TestFreeConnName(t *testing.T) {
	d := &ctlapi.Discovery{Address: "[fe80::1]:5555"}
	taken := []ctlapi.ConnectionInfo{{Name: "fe80-1-5555"}, {Name: "fe80-1-5555-2"}}
	if got := freeConnName("fe80::1", d, taken); got != "fe80-1-5555-3" {
		t.Fatalf("got %q", got)
	}
	if got := shellQuote("/tmp/a b's"); got != `'/tmp/a b'\''s'` {
		t.Fatalf("shellQuote: %s", got)
	}
}
