package ctlapi

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/srpd/srpd/internal/config"
)

// Stats is the body of GET /v1/stats[?target=name]: the cumulative I/O counters of the LUNs
// of our targets and of the sessions logged in to them, as the daemon read them at Time. Rates
// (IOPS, bytes per second, mean latency) are the differences of two of them over the
// difference of their Times, which is what srpctl lun stats and srpctl session stats print.
// Counters start from zero when a LUN is opened again (a LUN whose backend changed) or a
// session logs in again.
type Stats struct {
	Time     time.Time      `json:"time"`
	LUNs     []LUNStats     `json:"luns"`
	Sessions []SessionStats `json:"sessions"`
}

// OpCounts are values by operation: reads (READ(6/10/12/16)), writes (WRITE(6/10/12/16),
// WRITE SAME, COMPARE AND WRITE) and every other command.
type OpCounts struct {
	Read  uint64 `json:"read"`
	Write uint64 `json:"write"`
	Other uint64 `json:"other"`
}

// Total is the sum over the operations.
func (o OpCounts) Total() uint64 { return o.Read + o.Write + o.Other }

// LUNStats are the I/O counters of one LUN of a target, over every session.
type LUNStats struct {
	Target string `json:"target"`
	LUN    int    `json:"lun"`
	// Commands answered, by operation.
	Commands OpCounts `json:"commands"`
	// LatencyNS is the sum of the commands' latencies (the SRP_CMD's arrival to its SRP_RSP)
	// in nanoseconds, by operation: its increase over Commands' is the mean latency.
	LatencyNS  OpCounts `json:"latency_ns"`
	ReadBytes  uint64   `json:"read_bytes"`
	WriteBytes uint64   `json:"write_bytes"`
	// Errors counts the commands answered with a status other than GOOD, the POWER ON/RESET
	// unit attention of each new login excepted (ResetUnitAttentions counts those).
	Errors uint64 `json:"errors"`
	// SenseErrors splits the CHECK CONDITION errors by sense key (snake case, e.g.
	// medium_error), StatusErrors the others by status (busy, reservation_conflict,
	// task_set_full, task_aborted, other); both list non-zero counts only.
	SenseErrors         map[string]uint64 `json:"sense_errors,omitempty"`
	StatusErrors        map[string]uint64 `json:"status_errors,omitempty"`
	ResetUnitAttentions uint64            `json:"reset_unit_attentions"`
}

// SessionStats are the I/O counters of a session logged in to one of our targets (an I_T
// nexus, all its channels, those closed included).
type SessionStats struct {
	ID        string        `json:"id"` // as in /v1/sessions/{id}
	Target    string        `json:"target"`
	Initiator config.PortID `json:"initiator"`
	Commands  uint64        `json:"commands"` // SRP_CMDs received
	// Responses counts the SRP_RSPs sent for them and LatencyNS the sum of their latencies:
	// the increase of one over the other's is the mean latency.
	Responses  uint64 `json:"responses"`
	LatencyNS  uint64 `json:"latency_ns"`
	ReadBytes  uint64 `json:"read_bytes"`
	WriteBytes uint64 `json:"write_bytes"`
	Errors     uint64 `json:"errors"` // as SessionInfo.Stats.Errors
}

// StatsFilter selects the stats of one target ("": all).
type StatsFilter struct {
	Target string
}

// StatsService is the optional part of Service that answers GET /v1/stats (a Service without
// it answers with ErrUnsupported).
type StatsService interface {
	Stats(ctx context.Context, f StatsFilter) (*Stats, error)
}

func (h *handler) stats(w http.ResponseWriter, r *http.Request, q query) error {
	var f StatsFilter
	if t := url.Values(q).Get("target"); t != "" {
		if !nameRE.MatchString(t) {
			return badRequest("target %q: not a target name", t)
		}
		f.Target = t
	}
	s, isStats := h.svc.(StatsService)
	if !isStats {
		return fmt.Errorf("stats: %w", ErrUnsupported)
	}
	st, err := s.Stats(r.Context(), f)
	if err == nil {
		if st == nil {
			st = &Stats{}
		}
		if st.LUNs == nil {
			st.LUNs = []LUNStats{}
		}
		if st.Sessions == nil {
			st.Sessions = []SessionStats{}
		}
	}
	return ok(w, st, err)
}

// Stats implements StatsService.
func (c *Client) Stats(ctx context.Context, f StatsFilter) (*Stats, error) {
	var q url.Values
	if f.Target != "" {
		q = url.Values{"target": {f.Target}}
	}
	return call[Stats](ctx, c, http.MethodGet, "/v1/stats", q, nil)
}
