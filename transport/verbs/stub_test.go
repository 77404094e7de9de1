//go:build !verbs || !linux || !cgo

package verbs

import (
	"errors"
	"testing"
)

// Without the tag the package is a stub; the engine's tests (and the conformance suite on
// kernel rxe) run with `go test -tags verbs` where a device exists, and in `make test-verbs`.
func TestStubUnavailable(t *testing.T) {
	if Built {
		t.Fatal("stub build claims the engine")
	}
	if _, err := OpenDevice("rxe0", Config{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("OpenDevice: %v; want ErrUnavailable", err)
	}
	if _, err := DeviceNames(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("DeviceNames: %v; want ErrUnavailable", err)
	}
	t.Log("transport/verbs built without -tags verbs: engine tests not run here (see make test-verbs)")
}
