package transport

import (
	"fmt"
	"testing"
)

// TestGeneratedStrings pins CMEventType's stringer-generated String to what the hand-written
// method returned.
func TestGeneratedStrings(t *testing.T) {
	for _, tc := range []struct {
		v    fmt.Stringer
		want string
	}{
		{CMEventEstablished, "ESTABLISHED"}, {CMEventRejected, "REJECTED"}, {CMEventUnreachable, "UNREACHABLE"},
		{CMEventDisconnected, "DISCONNECTED"}, {CMEventTimewaitExit, "TIMEWAIT_EXIT"},
		{CMEventType(0), "CMEventType(0)"}, {CMEventType(6), "CMEventType(6)"},
	} {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("%T %d: String() = %q; want %q", tc.v, tc.v, got, tc.want)
		}
	}
}
