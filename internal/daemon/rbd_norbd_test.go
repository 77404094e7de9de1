//go:build !rbd || !cgo

package daemon

import (
	"errors"
	"strings"
	"testing"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/scsi/backend"
)

// TestOpenLUNRBDNotBuilt: an rbd LUN in a build without the backend fails at once, naming the
// LUN, the image and the build tag, as unsupported.
func TestOpenLUNRBDNotBuilt(t *testing.T) {
	if backend.RBDBuilt {
		t.Skip("this build has the rbd backend")
	}
	l := config.LUN{ID: 4, Backend: config.BackendRBD, BlockSize: 512,
		RBD: &config.RBD{ClusterConfig: "/etc/ceph/ceph.conf", Client: "client.admin", Pool: "rbd", Image: "disk"}}
	lr, err := openLUN(&config.Target{Name: "t"}, l, nil, nil)
	if err == nil {
		lr.close(nil)
		t.Fatal("openLUN succeeded without the rbd backend")
	}
	for _, want := range []string{"target t: LUN 4", "rbd/disk", "srpd was built without -tags rbd"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if !errors.Is(err, backend.ErrRBDUnavailable) || !errors.Is(err, ctlapi.ErrUnsupported) {
		t.Errorf("error %q: want both backend.ErrRBDUnavailable and ctlapi.ErrUnsupported", err)
	}
}
