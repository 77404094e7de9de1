package cm

import (
	"testing"

	"github.com/srpd/srpd/internal/testutil"
)

// TestEventKindString pins EventKind's stringer-generated String to what the hand-written
// method returned.
func TestEventKindString(t *testing.T) {
	testutil.Strings(t, map[EventKind]string{
		EventRequest: "REQUEST", EventEstablished: "ESTABLISHED", EventRejected: "REJECTED",
		EventUnreachable: "UNREACHABLE", EventDisconnected: "DISCONNECTED", EventTimewaitExit: "TIMEWAIT_EXIT",
		0: "EventKind(0)", 7: "EventKind(7)",
	})
}
