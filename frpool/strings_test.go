package frpool

import "testing"

// TestMRStateString pins mrState's stringer-generated String to the names the hand-written
// method returned (they appear in logs).
func TestMRStateString(t *testing.T) {
	for s, want := range map[mrState]string{
		mrFree: "free", mrInvalidating: "invalidating", mrRegistering: "registering", mrValid: "valid",
		mrQuarantined: "quarantined", mrDead: "dead", mrDead + 1: "mrState(6)",
	} {
		if got := s.String(); got != want {
			t.Errorf("mrState %d: String() = %q; want %q", s, got, want)
		}
	}
}
