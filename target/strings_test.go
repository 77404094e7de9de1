package target

import (
	"fmt"
	"testing"

	"github.com/srpd/srpd/internal/testutil"
)

// TestStrings pins the String of the generated (stringer) enums to what the hand-written
// methods returned: RejectCause names are metrics labels (srpd_target_login_rejects_total
// {cause=...}), the others appear in logs.
func TestStrings(t *testing.T) {
	testutil.Strings(t, map[chState]string{chLive: "live", chLoggingOut: "logging-out", chDraining: "draining", chClosed: "closed"})
	testutil.Strings(t, map[cstate]string{
		csFree: "free", csTables: "tables", csFetch: "fetch", csExec: "exec", csTM: "tm", csWaitSQ: "waitsq", csSend: "send",
	})
	testutil.Strings(t, map[StallAction]string{StallClose: "close", StallLog: "log", StallAction(7): "StallAction(7)"})
	testutil.Strings(t, map[RejectCause]string{
		CauseNone:                    "none",
		CauseMalformed:               "malformed login request",
		CauseShuttingDown:            "target shutting down",
		CauseITIUTooSmall:            "requested IT IU length below 64",
		CauseITIUTooLarge:            "requested IT IU length too large",
		CauseTargetPortID:            "wrong target port identifier",
		CauseBufFormat:               "unsupported buffer format required",
		CauseNoACL:                   "no ACL for initiator",
		CauseMultiChannel:            "multiple channels not supported",
		CauseChannelLimit:            "channel limit reached",
		CauseNoRDMARead:              "peer accepts no RDMA READ",
		CauseResources:               "insufficient channel resources",
		CauseSessionLimit:            "session limit reached",
		CauseMemoryBudget:            "registered memory budget exhausted",
		CauseLoginRate:               "login rate limit of the source",
		RejectCause(NumRejectCauses): fmt.Sprintf("RejectCause(%d)", NumRejectCauses),
	})
}
