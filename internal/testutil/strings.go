package testutil

import (
	"fmt"
	"testing"
)

// Strings checks that every value's String is the name want gives it. It pins the names of
// enums (stringer-generated ones especially) that appear in logs, errors and metric labels.
func Strings[T interface {
	comparable
	fmt.Stringer
}](t testing.TB, want map[T]string) {
	t.Helper()
	for v, name := range want {
		if got := v.String(); got != name {
			t.Errorf("%T %d: String() = %q; want %q", v, any(v), got, name)
		}
	}
}
