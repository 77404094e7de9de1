package frpool

import (
	"testing"

	"github.com/srpd/srpd/internal/testutil"
)

// TestMRStateString pins mrState's stringer-generated String to the names the hand-written
// method returned (they appear in logs).
func TestMRStateString(t *testing.T) {
	testutil.Strings(t, map[mrState]string{
		mrFree: "free", mrInvalidating: "invalidating", mrRegistering: "registering", mrValid: "valid",
		mrQuarantined: "quarantined", mrDead: "dead", mrDead + 1: "mrState(6)",
	})
}
