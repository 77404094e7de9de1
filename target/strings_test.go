package target

import (
	"fmt"
	"testing"
)

// TestStrings pins the String of the generated (stringer) enums to what the hand-written
// methods returned: RejectCause names are metrics labels (srpd_target_login_rejects_total
// {cause=...}), the others appear in logs.
func TestStrings(t *testing.T) {
	for _, tc := range []struct {
		v    fmt.Stringer
		want string
	}{
		{chLive, "live"}, {chLoggingOut, "logging-out"}, {chDraining, "draining"}, {chClosed, "closed"},
		{csFree, "free"}, {csTables, "tables"}, {csFetch, "fetch"}, {csExec, "exec"}, {csTM, "tm"},
		{csWaitSQ, "waitsq"}, {csSend, "send"},
		{StallClose, "close"}, {StallLog, "log"}, {StallAction(7), "StallAction(7)"},
		{CauseNone, "none"},
		{CauseMalformed, "malformed login request"},
		{CauseShuttingDown, "target shutting down"},
		{CauseITIUTooSmall, "requested IT IU length below 64"},
		{CauseITIUTooLarge, "requested IT IU length too large"},
		{CauseTargetPortID, "wrong target port identifier"},
		{CauseBufFormat, "unsupported buffer format required"},
		{CauseNoACL, "no ACL for initiator"},
		{CauseMultiChannel, "multiple channels not supported"},
		{CauseChannelLimit, "channel limit reached"},
		{CauseNoRDMARead, "peer accepts no RDMA READ"},
		{CauseResources, "insufficient channel resources"},
		{CauseSessionLimit, "session limit reached"},
		{CauseMemoryBudget, "registered memory budget exhausted"},
		{CauseLoginRate, "login rate limit of the source"},
		{RejectCause(NumRejectCauses), fmt.Sprintf("RejectCause(%d)", NumRejectCauses)},
	} {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("%T %d: String() = %q; want %q", tc.v, tc.v, got, tc.want)
		}
	}
}
