package srp

import (
	"testing"

	"github.com/srpd/srpd/internal/testutil"
)

// TestGeneratedStrings pins the String of the stringer-generated enums to what the
// hand-written methods returned (they appear in logs and errors).
func TestGeneratedStrings(t *testing.T) {
	testutil.Strings(t, map[DescFormat]string{
		DescNone: "none", DescDirect: "direct", DescIndirect: "indirect", DescImmediate: "immediate",
		DescFormat(9): "DescFormat(9)",
	})
	testutil.Strings(t, map[TLogoutReason]string{
		TLogoutNoReason:           "no reason specified",
		TLogoutInactive:           "inactive RDMA channel",
		TLogoutInvalidIUType:      "invalid information unit type",
		TLogoutUnexpectedResponse: "unexpected response",
		TLogoutMultiChannelAction: "disconnected by multi-channel action",
		TLogoutUnsupportedDataOut: "unsupported data-out descriptor format",
		TLogoutUnsupportedDataIn:  "unsupported data-in descriptor format",
		TLogoutInvalidIULength:    "invalid IU length",
		TLogoutReason(7):          "TLogoutReason(7)",
		TLogoutReason(1 << 31):    "TLogoutReason(2147483648)",
	})
}
