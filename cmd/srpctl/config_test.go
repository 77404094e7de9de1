package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

// TestRunningConfigCommands: config show prints YAML without defaults that parses back to the
// running configuration; a run-time change makes reload refuse (exit 6, naming it) unless
// --force; reload --dry-run and config diff say what would change and be discarded; config
// save makes the change part of the file, after which reload has nothing to discard.
func TestRunningConfigCommands(t *testing.T) {
	h := newHarness(t)
	must := func(args ...string) string {
		t.Helper()
		code, stdout, stderr := h.run("", args...)
		if code != exitOK || stderr != "" {
			t.Fatalf("srpctl %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout, stderr)
		}
		return stdout
	}
	out := must("config", "show")
	c, err := config.Parse("shown.yaml", []byte(out))
	if err != nil || !config.Equal(c, h.fake.Config()) {
		t.Fatalf("config show does not parse back to the running configuration (%v):\n%s", err, out)
	}
	for _, d := range []string{"block_size", "cm_port", "queue_depth", "control:", "logging:", "transport: lo"} {
		if strings.Contains(out, d) {
			t.Errorf("config show writes the default %q:\n%s", d, out)
		}
	}
	if full := must("config", "show", "--full"); !strings.Contains(full, "block_size: 512") {
		t.Errorf("config show --full lacks the defaults:\n%s", full)
	}
	if got := must("reload", "--dry-run"); !strings.Contains(got, "a reload would change nothing") {
		t.Errorf("reload --dry-run with nothing to do:\n%s", got)
	}

	must("lun", "add", "demo", "1", "--backend", "ram", "--size", "1MiB")
	if out := must("config", "show"); !strings.Contains(out, "1 run-time change(s) not in the file") || !strings.Contains(out, "id: 1") {
		t.Errorf("config show after a run-time change:\n%s", out)
	}
	for _, args := range [][]string{{"config", "diff"}, {"reload", "--dry-run"}} {
		got := must(args...)
		for _, w := range []string{"a reload would:\n  target demo: LUN 1 removed\n",
			"run-time changes made without --persist it would discard (srpctl config save keeps them):\n  target demo: LUN 1 added\n"} {
			if !strings.Contains(got, w) {
				t.Errorf("%s lacks %q:\n%s", strings.Join(args, " "), w, got)
			}
		}
	}
	code, stdout, stderr := h.run("", "reload")
	if code != exitConflict || !strings.Contains(stderr, "target demo: LUN 1 added") {
		t.Fatalf("reload over a run-time change: exit %d, want %d\n%s%s", code, exitConflict, stdout, stderr)
	}
	if h.fake.Config().Target("demo").LUN(1) == nil {
		t.Fatal("the refused reload discarded the LUN")
	}
	if got := must("config", "save"); !strings.Contains(got, "saved") || !strings.Contains(got, "target demo: LUN 1 added") {
		t.Errorf("config save:\n%s", got)
	}
	if got := must("reload"); !strings.Contains(got, "no changes") {
		t.Errorf("reload after save:\n%s", got)
	}

	// --force discards, and says what it discarded.
	must("lun", "add", "demo", "2", "--backend", "ram", "--size", "1MiB")
	if got := must("reload", "--force"); !strings.Contains(got, "target demo: LUN 2 removed") ||
		!strings.Contains(got, "run-time changes made without --persist it discarded") {
		t.Errorf("reload --force:\n%s", got)
	}
	if h.fake.Config().Target("demo").LUN(2) != nil {
		t.Fatal("reload --force kept the run-time LUN")
	}
}

// TestWatch: --watch repeats a list until the context ends (Ctrl-C), and bounds its interval.
func TestWatch(t *testing.T) {
	h := newHarness(t)
	var out, errb bytes.Buffer
	e := &env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, links: h.links,
		getenv: func(k string) string {
			if k == "SRPCTL_SOCKET" {
				return h.socket
			}
			return ""
		},
		now: time.Now}
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if code := run(ctx, []string{"target", "list", "--watch=1s"}, e); code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, out.String(), errb.String())
	}
	if el := time.Since(t0); el < 2*time.Second || el > 10*time.Second {
		t.Errorf("the watch ended after %v, want when the context did (2.5s)", el)
	}
	if n := strings.Count(out.String(), "every 1s (Ctrl-C stops)"); n != 3 || strings.Count(out.String(), "demo ") != 3 {
		t.Errorf("%d rounds, want 3:\n%s", n, out.String())
	}
	for _, args := range [][]string{{"target", "list", "--watch=10ms"}, {"session", "list", "--watch=2h"}} {
		if code, _, stderr := h.run("", args...); code != exitUsage || !strings.Contains(stderr, "want 1s to 1h0m0s") {
			t.Errorf("srpctl %s: exit %d\n%s", strings.Join(args, " "), code, stderr)
		}
	}
	if code, stdout, _ := h.run("", "connections", "--watch=1s", "--help"); code != exitOK || !strings.Contains(stdout, "--watch") {
		t.Errorf("connections lacks --watch:\n%s", stdout)
	}
}

// TestStatusHealth: status prints the health line and each object that does not run.
func TestStatusHealth(t *testing.T) {
	h := newHarness(t)
	code, stdout, stderr := h.run("", "status")
	if code != exitOK || !strings.Contains(stdout, "Health:") || !strings.Contains(stdout, "ok") {
		t.Fatalf("status: exit %d\n%s%s", code, stdout, stderr)
	}
	got := healthLine(&ctlapi.Health{State: ctlapi.HealthDegraded, FailingLogins: 1,
		Failed: []ctlapi.FailedObject{{Kind: "session", Name: "x", Error: "login rejected"}, {Kind: "target", Name: "t", Error: "listen: in use"}}})
	if got != "degraded: 2 object(s) not running, 1 of them session(s) failing to log in" {
		t.Errorf("health line %q", got)
	}
	if until(time.Unix(100, 0), time.Unix(112, 400e6)) != "12s" || until(time.Unix(100, 0), time.Unix(90, 0)) != "now" {
		t.Error("until")
	}
}
