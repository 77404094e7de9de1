package cm

import "testing"

// TestEventKindString pins EventKind's stringer-generated String to what the hand-written
// method returned.
func TestEventKindString(t *testing.T) {
	for k, want := range map[EventKind]string{
		EventRequest: "REQUEST", EventEstablished: "ESTABLISHED", EventRejected: "REJECTED",
		EventUnreachable: "UNREACHABLE", EventDisconnected: "DISCONNECTED", EventTimewaitExit: "TIMEWAIT_EXIT",
		0: "EventKind(0)", 7: "EventKind(7)",
	} {
		if got := k.String(); got != want {
			t.Errorf("EventKind %d: String() = %q; want %q", k, got, want)
		}
	}
}
