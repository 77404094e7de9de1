package daemon

import (
	"os"
	"strings"
	"testing"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/testutil"
)

// TestLimitsAndALUAChangeLive: a reload that changes a target's limits and gives it an alua
// section keeps its session logged in (same ID and login time): the limits apply to new logins,
// and the LUNs are reopened with the new port group.
func TestLimitsAndALUAChangeLive(t *testing.T) {
	dir := testutil.ShortTempDir(t, "srpd-d-")
	src := testConfig(dir, testutil.FreeUDPPort(t))
	h := startHarnessWith(t, dir, src)
	ctx := h.ctx()
	s0 := h.waitSessions("a", 1)[0]
	const anchor = "    acls:\n      - initiator: \"*\"\n  - name: b"
	if !strings.Contains(src, anchor) {
		t.Fatal("test configuration changed: anchor not found")
	}
	src = strings.Replace(src, anchor, "    alua: {group: 3, relative_port: 7, state: active/non-optimized}\n"+
		"    limits: {queue_depth: 32}\n"+anchor, 1)
	if err := os.WriteFile(h.path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := h.d.Reload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var plan *config.TargetPlan
	for i := range res.Plans {
		if res.Plans[i].Name == "a" {
			plan = &res.Plans[i]
		}
	}
	if plan == nil || plan.Restart {
		t.Fatalf("plans %+v: want target a changed live", res.Plans)
	}
	kinds := map[config.LiveOpKind]bool{}
	for _, op := range plan.Ops {
		kinds[op.Kind] = true
	}
	if !kinds[config.LimitsChange] || !kinds[config.LUNReopen] {
		t.Fatalf("target a's plan %+v: want a limits change and the LUN reopened", plan.Ops)
	}
	ss := h.waitSessions("a", 1)
	if ss[0].ID != s0.ID || !ss[0].LoginAt.Equal(s0.LoginAt) {
		t.Fatalf("session after the reload %+v, want %s logged in at %v", ss[0], s0.ID, s0.LoginAt)
	}
	h.d.mu.RLock()
	qd := h.d.targets["a"].Port.Limits().QueueDepth
	h.d.mu.RUnlock()
	if qd != 32 {
		t.Fatalf("target a's queue depth for new logins %d, want 32", qd)
	}
	al, err := h.c.GetALUA(ctx, "a")
	if err != nil || len(al) != 1 {
		t.Fatalf("alua of a: %+v %v", al, err)
	}
	var local bool
	for _, g := range al[0].Groups {
		if g.Local {
			local = true
			if g.Group != 3 || g.State != "active/non-optimized" || len(g.RelativePorts) != 1 || g.RelativePorts[0] != 7 {
				t.Fatalf("local group after the reload %+v", g)
			}
		}
	}
	if !local {
		t.Fatalf("alua of a: %+v: no local group", al)
	}
}
