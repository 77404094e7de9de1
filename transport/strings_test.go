package transport

import (
	"testing"

	"github.com/srpd/srpd/internal/testutil"
)

// TestGeneratedStrings pins CMEventType's stringer-generated String to what the hand-written
// method returned.
func TestGeneratedStrings(t *testing.T) {
	testutil.Strings(t, map[CMEventType]string{
		CMEventEstablished: "ESTABLISHED", CMEventRejected: "REJECTED", CMEventUnreachable: "UNREACHABLE",
		CMEventDisconnected: "DISCONNECTED", CMEventTimewaitExit: "TIMEWAIT_EXIT",
		CMEventType(0): "CMEventType(0)", CMEventType(6): "CMEventType(6)",
	})
}
