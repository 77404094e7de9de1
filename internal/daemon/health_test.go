package daemon

import (
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
)

// TestHealthCountsFailingLogins: a session whose login keeps failing (no such target port)
// makes the daemon degraded in /v1/status, in the status line and in srpd_failed_objects, and
// its connection says when it tries again.
func TestHealthCountsFailingLogins(t *testing.T) {
	dir := testutil.ShortTempDir(t, "srpd-d-")
	src := strings.Replace(testConfig(dir, testutil.FreeUDPPort(t)), "control:", `  - name: nowhere
    address: 127.0.0.1
    target_port_id: 0x000000000000000c000000000000000c
    reconnect_delay: 30s
control:`, 1)
	h := startHarnessWith(t, dir, src)
	st, err := h.c.Status(h.ctx())
	if err != nil {
		t.Fatal(err)
	}
	hl := st.Health
	if hl == nil || hl.State != ctlapi.HealthDegraded || hl.FailingLogins != 1 || len(hl.Failed) != 1 ||
		hl.Failed[0].Kind != "session" || hl.Failed[0].Name != "nowhere" || hl.Failed[0].Error == "" {
		t.Fatalf("health: %+v", hl)
	}
	if next := hl.Failed[0].NextRetryAt; next.Before(time.Now().Add(20*time.Second)) || next.After(time.Now().Add(31*time.Second)) {
		t.Errorf("next retry at %v, want about 30s from now", next)
	}
	ci, err := h.c.GetConnection(h.ctx(), "nowhere")
	if err != nil || ci.State != ctlapi.StateConnecting || ci.NextRetryAt.IsZero() || ci.FailedReconnects != 1 {
		t.Fatalf("connection: %+v, %v", ci, err)
	}
	if ok, _ := h.c.GetConnection(h.ctx(), "s"); !ok.NextRetryAt.IsZero() {
		t.Errorf("a logged-in connection has a next retry: %v", ok.NextRetryAt)
	}
	if line := h.d.StatusLine(); !strings.Contains(line, "1 object(s) failed (1 session(s) failing to log in)") {
		t.Errorf("status line %q", line)
	}
	if body := scrape(t, h.d); !strings.Contains(body, "\nsrpd_failed_objects 1\n") {
		t.Errorf("metrics:\n%s", body)
	}
	// Without the failing session the daemon is healthy again.
	if err := h.c.Disconnect(h.ctx(), "nowhere", ctlapi.MutateOptions{}); err != nil {
		t.Fatal(err)
	}
	if st, _ := h.c.Status(h.ctx()); st.Health.State != ctlapi.HealthOK || len(st.Health.Failed) != 0 {
		t.Fatalf("health after disconnect: %+v", st.Health)
	}
}
