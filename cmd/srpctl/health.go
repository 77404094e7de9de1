package main

import (
	"fmt"
	"time"

	"github.com/srpd/srpd/internal/ctlapi"
)

// healthLine is the status's health: "ok", or "degraded: N object(s) not running, M of them
// sessions failing to log in".
func healthLine(h *ctlapi.Health) string {
	if len(h.Failed) == 0 {
		return h.State
	}
	s := fmt.Sprintf("%s: %d object(s) not running", h.State, len(h.Failed))
	if h.FailingLogins > 0 {
		s += fmt.Sprintf(", %d of them session(s) failing to log in", h.FailingLogins)
	}
	return s
}

// until is how long from now to t, in whole seconds ("now" when t has passed).
func until(now, t time.Time) string {
	d := t.Sub(now).Round(time.Second)
	if d <= 0 {
		return "now"
	}
	return d.String()
}
