package daemon

import (
	"fmt"
	"slices"
	"strings"

	"github.com/srpd/srpd/internal/ctlapi"
)

// healthLocked sums up what does not run as configured (d.mu held, for reading at least): the
// objects whose start failed (d.failed) and our initiator sessions whose login fails (they
// keep retrying, so they are not in d.failed). The status line, /v1/status and the
// srpd_failed_objects metric all count these.
func (d *Daemon) healthLocked() *ctlapi.Health {
	h := &ctlapi.Health{State: ctlapi.HealthOK, Failed: []ctlapi.FailedObject{}}
	for _, k := range slices.Sorted(mapKeys(d.failed)) {
		kind, name, _ := strings.Cut(k, "/")
		h.Failed = append(h.Failed, ctlapi.FailedObject{Kind: kind, Name: name, Error: d.failed[k]})
	}
	for _, n := range slices.Sorted(mapKeys(d.conns)) {
		if _, recorded := d.failed["session/"+n]; recorded {
			continue
		}
		if why, next, ok := d.conns[n].failing(); ok {
			h.Failed = append(h.Failed, ctlapi.FailedObject{Kind: "session", Name: n, Error: why, NextRetryAt: next})
			h.FailingLogins++
		}
	}
	if len(h.Failed) > 0 {
		h.State = ctlapi.HealthDegraded
	}
	return h
}

// healthSummary is the status line's account of h: "" when healthy.
func healthSummary(h *ctlapi.Health) string {
	if len(h.Failed) == 0 {
		return ""
	}
	s := fmt.Sprintf("%d object(s) failed", len(h.Failed))
	if h.FailingLogins > 0 {
		s += fmt.Sprintf(" (%d session(s) failing to log in)", h.FailingLogins)
	}
	return s
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
