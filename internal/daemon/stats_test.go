package daemon

import (
	"errors"
	"strings"
	"testing"

	"github.com/srpd/srpd/internal/ctlapi"
)

// TestStatsAPI: GET /v1/stats over the control socket after the initiator session wrote and
// read: the LUN's counters by operation, bytes and latency sums; the session's; the login's
// unit attention apart from the errors; the target filter.
func TestStatsAPI(t *testing.T) {
	h := startHarness(t)
	h.waitSessions("a", 1)
	lun := sessionLUN(t, h.d, "s", 0)
	buf := make([]byte, 8192)
	for range 4 {
		if err := lun.WriteAt(h.ctx(), buf, 0, false); err != nil {
			t.Fatal(err)
		}
		if err := lun.ReadAt(h.ctx(), buf, 0); err != nil {
			t.Fatal(err)
		}
	}
	st, err := h.c.Stats(h.ctx(), ctlapi.StatsFilter{Target: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.LUNs) != 1 || len(st.Sessions) != 1 || st.Time.IsZero() {
		t.Fatalf("stats of a: %+v", st)
	}
	l := st.LUNs[0]
	if l.Target != "a" || l.LUN != 0 || l.Commands.Write != 4 || l.Commands.Read < 4 || l.WriteBytes != 4*8192 || l.ReadBytes < 4*8192 ||
		l.LatencyNS.Write == 0 || l.LatencyNS.Read == 0 {
		t.Errorf("LUN stats %+v", l)
	}
	if l.Errors != 0 || l.ResetUnitAttentions != 1 || l.SenseErrors != nil || l.StatusErrors != nil {
		t.Errorf("LUN errors %d (%v, %v), reset unit attentions %d; want none and 1", l.Errors, l.SenseErrors, l.StatusErrors, l.ResetUnitAttentions)
	}
	s := st.Sessions[0]
	if !strings.HasPrefix(s.ID, "a.") || s.Responses < l.Commands.Total() || s.Commands < s.Responses || s.LatencyNS < l.LatencyNS.Total() ||
		s.WriteBytes != l.WriteBytes || s.Errors != 0 {
		t.Errorf("session stats %+v (LUN %+v)", s, l)
	}
	if ss, _ := h.c.ListSessions(h.ctx(), ctlapi.SessionFilter{Target: "a"}); len(ss) != 1 || ss[0].ID != s.ID {
		t.Errorf("session IDs of stats and list differ: %s, %+v", s.ID, ss)
	}
	all, err := h.c.Stats(h.ctx(), ctlapi.StatsFilter{})
	if err != nil || len(all.LUNs) != 2 || all.LUNs[1].Target != "b" || all.LUNs[1].Commands.Total() != 0 {
		t.Errorf("all stats: %+v, %v", all, err)
	}
	if _, err := h.c.Stats(h.ctx(), ctlapi.StatsFilter{Target: "zz"}); !errors.Is(err, ctlapi.ErrNotFound) {
		t.Errorf("stats of a missing target: %v", err)
	}
}
