package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/ctlapi/ctlapitest"
)

// newStatsHarness is newHarness with a daemon that answers GET /v1/stats with snaps in turn.
func newStatsHarness(t *testing.T, snaps ...ctlapi.Stats) (*harness, *ctlapitest.StatsFake) {
	t.Helper()
	var sf *ctlapitest.StatsFake
	h := startHarness(t, func(f *ctlapitest.Fake) ctlapi.Service {
		sf = ctlapitest.NewStatsFake(f, snaps...)
		return sf
	})
	return h, sf
}

// statsSnaps are three snapshots 2 s apart: LUN 0 of demo reads 200 blocks of 4 KiB at 1 ms and
// writes 100 of 8 KiB at 2 ms in the first interval, with one error; in the second its counters
// start again from zero (the LUN was opened again) with 10 reads.
func statsSnaps() []ctlapi.Stats {
	t0 := time.Unix(1700000000, 0).UTC()
	sess := func(cmds, rsps, lat uint64) []ctlapi.SessionStats {
		return []ctlapi.SessionStats{{ID: "demo.1", Target: "demo", Initiator: config.MakePortID(0, 9),
			Commands: cmds, Responses: rsps, LatencyNS: lat, ReadBytes: cmds * 1024, WriteBytes: 0}}
	}
	return []ctlapi.Stats{
		{Time: t0, LUNs: []ctlapi.LUNStats{{Target: "demo", LUN: 0, Commands: ctlapi.OpCounts{Other: 1}, ResetUnitAttentions: 1}},
			Sessions: sess(1, 1, 1000)},
		{Time: t0.Add(2 * time.Second), LUNs: []ctlapi.LUNStats{{Target: "demo", LUN: 0,
			Commands:  ctlapi.OpCounts{Read: 200, Write: 100, Other: 1},
			LatencyNS: ctlapi.OpCounts{Read: 200 * 1e6, Write: 100 * 2e6},
			ReadBytes: 200 * 4096, WriteBytes: 100 * 8192, Errors: 1, SenseErrors: map[string]uint64{"medium_error": 1}}},
			Sessions: sess(301, 301, 1000+300*1.5e6)},
		{Time: t0.Add(4 * time.Second), LUNs: []ctlapi.LUNStats{{Target: "demo", LUN: 0,
			Commands: ctlapi.OpCounts{Read: 10}, LatencyNS: ctlapi.OpCounts{Read: 10 * 5e5}, ReadBytes: 10 * 4096}},
			Sessions: sess(401, 401, 1000+300*1.5e6+100*1e6)},
	}
}

func TestLUNStats(t *testing.T) {
	h, _ := newStatsHarness(t, statsSnaps()...)
	code, out, errOut := h.run("", "lun", "stats", "demo", "--interval", "100ms")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitOK || len(lines) != 2 {
		t.Fatalf("lun stats: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != "TARGET LUN R/S W/S O/S R_MIB/S W_MIB/S R_AWAIT_MS W_AWAIT_MS ERRORS" {
		t.Errorf("header %q", lines[0])
	}
	// 200 reads and 100 writes in 2 s; 800 KiB each way: 0.39 MiB/s; 1 and 2 ms.
	if got := strings.Join(strings.Fields(lines[1]), " "); got != "demo 0 100.0 50.0 0.0 0.39 0.39 1.000 2.000 1" {
		t.Errorf("row %q", got)
	}

	h, _ = newStatsHarness(t, statsSnaps()...)
	code, out, errOut = h.run("", "lun", "stats", "demo", "0", "-o", "json", "--interval", "100ms")
	var rep lunStatsReport
	if err := json.Unmarshal([]byte(out), &rep); code != exitOK || err != nil {
		t.Fatalf("lun stats -o json: exit %d, %v, stdout %q, stderr %q", code, err, out, errOut)
	}
	if len(rep.LUNs) != 1 || rep.IntervalSeconds != 2 || rep.LUNs[0].ReadIOPS != 100 || rep.LUNs[0].WriteAwaitMS == nil ||
		*rep.LUNs[0].WriteAwaitMS != 2 || rep.LUNs[0].OtherAwaitMS != nil || rep.LUNs[0].Errors != 1 {
		t.Errorf("lun stats -o json: %s", out)
	}
	if !strings.Contains(out, `"other_await_ms": null`) {
		t.Errorf("no command of a kind: want null, got %s", out)
	}

	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"lun", "stats", "demo", "7", "--interval", "100ms"}, exitNotFound, "LUN 7 of target demo: not found"},
		{[]string{"lun", "stats", "nope"}, exitNotFound, `target "nope": not found`},
		{[]string{"lun", "stats", "demo", "--interval", "1ms"}, exitUsage, "--interval 1ms: want 100ms to 1h0m0s"},
		{[]string{"lun", "stats", "demo", "--watch=10ms"}, exitUsage, "--watch 10ms: want 1s to 1h0m0s"},
		{[]string{"lun", "stats", "demo", "--count", "2"}, exitUsage, "--count needs --watch"},
		{[]string{"lun", "stats"}, exitUsage, "want 1 to 2 arguments"},
	} {
		h, _ := newStatsHarness(t, statsSnaps()...)
		code, out, errOut := h.run("", tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.msg) {
			t.Errorf("srpctl %s: exit %d, stdout %q, stderr %q; want exit %d and %q", strings.Join(tc.args, " "), code, out, errOut, tc.code, tc.msg)
		}
	}
}

// TestStatsWatch: --watch reports every interval the rates since the previous report (a
// counter that went back started again from zero), --count ends it.
func TestStatsWatch(t *testing.T) {
	h, f := newStatsHarness(t, statsSnaps()...)
	code, out, errOut := h.run("", "lun", "stats", "demo", "--watch=1s", "--count", "2", "-o", "json")
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	var reps []lunStatsReport
	for dec.More() {
		var r lunStatsReport
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("%v in %s", err, out)
		}
		reps = append(reps, r)
	}
	if len(reps) != 2 || f.Calls() != 3 {
		t.Fatalf("%d reports from %d snapshots, want 2 from 3:\n%s", len(reps), f.Calls(), out)
	}
	if r := reps[1].LUNs[0]; r.ReadIOPS != 5 || r.WriteIOPS != 0 || r.ReadAwaitMS == nil || *r.ReadAwaitMS != 0.5 || r.Errors != 0 {
		t.Errorf("second report (after a counter reset): %+v", r)
	}

	h, _ = newStatsHarness(t, statsSnaps()...)
	code, out, errOut = h.run("", "session", "stats", "--watch=1s", "--count", "2")
	if code != exitOK || strings.Count(out, "--- ") != 2 || strings.Count(out, "SESSION") != 2 {
		t.Fatalf("session stats --watch: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	var rows []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "demo.1") {
			rows = append(rows, strings.Join(strings.Fields(l), " "))
		}
	}
	// 300 commands in 2 s at 1.5 ms, 300 KiB read (0.146 MiB/s); then 100 at 1 ms, 100 KiB.
	want := []string{
		"demo.1 demo 0x00000000000000000000000000000009 150.0 0.15 0.00 1.500 0",
		"demo.1 demo 0x00000000000000000000000000000009 50.0 0.05 0.00 1.000 0",
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("session rows:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
}
