package stack

import (
	"errors"
	"fmt"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/scsi/backend"
)

// openRBD opens the Ceph RBD image of an rbd LUN. In a build without the rbd backend (no
// -tags rbd, or no cgo) it fails with backend.ErrRBDUnavailable and ctlapi.ErrUnsupported;
// config validation refuses such a LUN before it gets here (config.RBDSupported).
func openRBD(l config.LUN, onResize func(int64)) (backend.Backend, error) {
	if l.RBD == nil {
		return nil, fmt.Errorf("backend rbd: no rbd settings (pool, image): %w", ctlapi.ErrInvalidArgument)
	}
	be, err := backend.OpenRBD(backend.RBDOptions{
		ConfigFile: l.RBD.ClusterConfig,
		Client:     l.RBD.Client,
		Keyring:    l.RBD.Keyring,
		Pool:       l.RBD.Pool,
		Namespace:  l.RBD.Namespace,
		Image:      l.RBD.Image,
		ReadOnly:   l.ReadOnly,
		OnResize:   onResize,
	})
	if errors.Is(err, backend.ErrRBDUnavailable) {
		return nil, fmt.Errorf("%w (%w)", err, ctlapi.ErrUnsupported)
	}
	return be, err
}
