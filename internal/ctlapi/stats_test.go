package ctlapi_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/ctlapi/ctlapitest"
)

// TestStatsRoute: GET /v1/stats through the client (the target filter, the JSON shape), its
// bad requests, and a Service without stats.
func TestStatsRoute(t *testing.T) {
	at := time.Unix(1700000000, 0).UTC()
	snap := ctlapi.Stats{Time: at,
		LUNs: []ctlapi.LUNStats{
			{Target: "demo", LUN: 0, Commands: ctlapi.OpCounts{Read: 3, Write: 2, Other: 1}, LatencyNS: ctlapi.OpCounts{Read: 300},
				ReadBytes: 3 << 12, Errors: 1, SenseErrors: map[string]uint64{"medium_error": 1}, ResetUnitAttentions: 1},
			{Target: "other", LUN: 4},
		},
		Sessions: []ctlapi.SessionStats{{ID: "demo.1", Target: "demo", Commands: 6, Responses: 6, LatencyNS: 600}},
	}
	c := serve(t, ctlapitest.NewStatsFake(newFake(t), snap))
	got, err := c.Stats(t.Context(), ctlapi.StatsFilter{Target: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Time.Equal(at) || len(got.LUNs) != 1 || len(got.Sessions) != 1 || got.LUNs[0].Commands.Total() != 6 ||
		got.LUNs[0].SenseErrors["medium_error"] != 1 || got.Sessions[0].LatencyNS != 600 {
		t.Errorf("stats of demo: %+v", got)
	}
	if all, err := c.Stats(t.Context(), ctlapi.StatsFilter{}); err != nil || len(all.LUNs) != 2 {
		t.Errorf("all stats: %+v, %v", all, err)
	}
	if _, err := c.Stats(t.Context(), ctlapi.StatsFilter{Target: "nope"}); !errors.Is(err, ctlapi.ErrNotFound) {
		t.Errorf("stats of a missing target: %v", err)
	}
	if _, err := serve(t, newFake(t)).Stats(t.Context(), ctlapi.StatsFilter{}); !errors.Is(err, ctlapi.ErrUnsupported) {
		t.Errorf("stats of a Service without them: %v", err)
	}

	h := ctlapi.Handler(ctlapitest.NewStatsFake(newFake(t), ctlapi.Stats{Time: at}))
	for _, tc := range []struct {
		path     string
		status   int
		contains string
	}{
		{"/v1/stats", 200, `"luns": []`},
		{"/v1/stats?target=-x", 400, "not a target name"},
		{"/v1/stats?lun=1", 400, `unknown query parameter \"lun\"`},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
		if rec.Code != tc.status || !strings.Contains(rec.Body.String(), tc.contains) {
			t.Errorf("GET %s: %d %s; want %d and %q", tc.path, rec.Code, rec.Body, tc.status, tc.contains)
		}
	}
}
