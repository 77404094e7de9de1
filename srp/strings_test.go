package srp

import (
	"fmt"
	"testing"
)

// TestGeneratedStrings pins the String of the stringer-generated enums to what the
// hand-written methods returned (they appear in logs and errors).
func TestGeneratedStrings(t *testing.T) {
	for _, tc := range []struct {
		v    fmt.Stringer
		want string
	}{
		{DescNone, "none"}, {DescDirect, "direct"}, {DescIndirect, "indirect"}, {DescImmediate, "immediate"},
		{DescFormat(9), "DescFormat(9)"},
		{TLogoutNoReason, "no reason specified"},
		{TLogoutInactive, "inactive RDMA channel"},
		{TLogoutInvalidIUType, "invalid information unit type"},
		{TLogoutUnexpectedResponse, "unexpected response"},
		{TLogoutMultiChannelAction, "disconnected by multi-channel action"},
		{TLogoutUnsupportedDataOut, "unsupported data-out descriptor format"},
		{TLogoutUnsupportedDataIn, "unsupported data-in descriptor format"},
		{TLogoutInvalidIULength, "invalid IU length"},
		{TLogoutReason(7), "TLogoutReason(7)"},
		{TLogoutReason(1 << 31), "TLogoutReason(2147483648)"},
	} {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("%T %d: String() = %q; want %q", tc.v, tc.v, got, tc.want)
		}
	}
}
