package ctlapitest

import (
	"context"
	"fmt"
	"sync"

	"github.com/srpd/srpd/internal/ctlapi"
)

// StatsFake is a Fake that also answers GET /v1/stats (ctlapi.StatsService): each call
// returns the next of Snapshots (the last one again once they run out), with the LUNs and
// sessions of other targets left out when the filter names one.
type StatsFake struct {
	*Fake
	mu        sync.Mutex
	snapshots []ctlapi.Stats
	calls     int
}

// NewStatsFake returns a StatsFake over f answering the snapshots in turn.
func NewStatsFake(f *Fake, snapshots ...ctlapi.Stats) *StatsFake {
	return &StatsFake{Fake: f, snapshots: snapshots}
}

var _ ctlapi.StatsService = (*StatsFake)(nil)

// Calls is the number of Stats calls so far.
func (f *StatsFake) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// Stats implements ctlapi.StatsService.
func (f *StatsFake) Stats(ctx context.Context, filter ctlapi.StatsFilter) (*ctlapi.Stats, error) {
	if filter.Target != "" {
		if _, err := f.Fake.GetTarget(ctx, filter.Target); err != nil {
			return nil, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.snapshots) == 0 {
		return nil, fmt.Errorf("stats: no snapshot: %w", ctlapi.ErrUnavailable)
	}
	s := f.snapshots[min(f.calls, len(f.snapshots)-1)]
	f.calls++
	out := ctlapi.Stats{Time: s.Time, LUNs: []ctlapi.LUNStats{}, Sessions: []ctlapi.SessionStats{}}
	for _, l := range s.LUNs {
		if filter.Target == "" || l.Target == filter.Target {
			out.LUNs = append(out.LUNs, l)
		}
	}
	for _, ss := range s.Sessions {
		if filter.Target == "" || ss.Target == filter.Target {
			out.Sessions = append(out.Sessions, ss)
		}
	}
	return &out, nil
}
