package daemon

import (
	"context"
	"sort"
	"time"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/target"
)

var _ ctlapi.StatsService = (*Daemon)(nil)

// Stats implements ctlapi.StatsService: the I/O counters of the LUNs and sessions of the
// running targets (of f.Target only, if set), read from the same counters as the metrics.
func (d *Daemon) Stats(_ context.Context, f ctlapi.StatsFilter) (*ctlapi.Stats, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if f.Target != "" && d.cfg.Target(f.Target) == nil {
		return nil, notFound("target", f.Target)
	}
	out := &ctlapi.Stats{Time: time.Now(), LUNs: []ctlapi.LUNStats{}, Sessions: []ctlapi.SessionStats{}}
	for _, name := range sortedKeys(d.targets) {
		if f.Target != "" && f.Target != name {
			continue
		}
		t := d.targets[name]
		for _, id := range sortedKeys(t.luns) {
			out.LUNs = append(out.LUNs, lunStatsInfo(name, id, t.lunStats(t.luns[id])))
		}
		sessions := t.Port.Sessions()
		sort.Slice(sessions, func(i, j int) bool { return sessions[i].ID < sessions[j].ID })
		names := t.sessionNames(sessions)
		for i, ss := range sessions {
			out.Sessions = append(out.Sessions, ctlapi.SessionStats{
				ID: names[i], Target: name, Initiator: config.PortID(ss.Initiator),
				Commands: ss.Commands, Responses: ss.Responses, LatencyNS: ss.ResponseLatencyNS,
				ReadBytes: ss.BytesIn, WriteBytes: ss.BytesOut, Errors: ss.Errors,
			})
		}
	}
	return out, nil
}

func lunStatsInfo(tgt string, id int, s target.LUNStats) ctlapi.LUNStats {
	l := ctlapi.LUNStats{Target: tgt, LUN: id,
		Commands: ctlapi.OpCounts{Read: s.Commands[target.LUNOpRead], Write: s.Commands[target.LUNOpWrite],
			Other: s.Commands[target.LUNOpOther]},
		LatencyNS: ctlapi.OpCounts{Read: s.Latency[target.LUNOpRead].SumNS, Write: s.Latency[target.LUNOpWrite].SumNS,
			Other: s.Latency[target.LUNOpOther].SumNS},
		ReadBytes: s.ReadBytes, WriteBytes: s.WriteBytes, Errors: s.Errors(), ResetUnitAttentions: s.ResetUAs,
	}
	for k, n := range s.SenseErrors {
		if n > 0 {
			if l.SenseErrors == nil {
				l.SenseErrors = map[string]uint64{}
			}
			l.SenseErrors[senseKeyNames[k]] = n
		}
	}
	for i, n := range s.StatusErrors {
		if n > 0 {
			if l.StatusErrors == nil {
				l.StatusErrors = map[string]uint64{}
			}
			l.StatusErrors[target.StatusErrName(i)] = n
		}
	}
	return l
}
