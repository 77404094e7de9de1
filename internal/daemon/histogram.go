package daemon

import (
	"sync/atomic"
	"time"

	"github.com/srpd/srpd/target"
)

// histogram counts durations in the target's latency buckets (target.LatencyBounds: 10 µs to
// 10 s), so that the daemon's histograms (backend I/O, NBD requests) and the target's per-LUN
// ones share their bounds. observe is lock-free and allocation-free.
type histogram struct {
	counts [target.NumLatencyBuckets]atomic.Uint64
	sumNS  atomic.Uint64
}

func (h *histogram) observe(d time.Duration) {
	h.counts[target.LatencyBucket(d)].Add(1)
	h.sumNS.Add(uint64(max(d, 0)))
}

// snapshot reads the counts (each atomically; a scrape racing observe may see the sum and the
// counts one observation apart, as client_golang's own histograms may).
func (h *histogram) snapshot() target.LatencyHistogram {
	var s target.LatencyHistogram
	for i := range h.counts {
		s.Buckets[i] = h.counts[i].Load()
	}
	s.SumNS = h.sumNS.Load()
	return s
}
