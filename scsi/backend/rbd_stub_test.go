//go:build !rbd || !cgo

package backend

import (
	"errors"
	"strings"
	"testing"
)

// TestOpenRBDNotBuilt: the default build has no librbd; OpenRBD says so and how to get it.
func TestOpenRBDNotBuilt(t *testing.T) {
	b, err := OpenRBD(RBDOptions{Pool: "rbd", Namespace: "ns", Image: "disk"})
	if err == nil {
		b.Close()
		t.Fatal("OpenRBD succeeded in a build without the rbd backend")
	}
	if !errors.Is(err, ErrRBDUnavailable) {
		t.Errorf("OpenRBD = %v, want ErrRBDUnavailable", err)
	}
	for _, want := range []string{"rbd/ns/disk", "-tags rbd"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}
