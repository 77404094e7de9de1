//go:build !verbs || !linux || !cgo

package verbs

import (
	"fmt"

	"github.com/srpd/srpd/transport"
)

// Built reports whether this binary contains the verbs engine (build tag `verbs`).
const Built = false

// DeviceNames lists the RDMA devices libibverbs sees; without the engine it fails with
// ErrUnavailable.
func DeviceNames() ([]string, error) {
	return nil, fmt.Errorf("%w: built without -tags verbs", ErrUnavailable)
}

// OpenDevice opens port cfg.Port of the named RDMA device; without the engine it fails with
// ErrUnavailable.
func OpenDevice(name string, cfg Config) (transport.Device, error) {
	cfg.fill()
	return nil, fmt.Errorf("%w: built without -tags verbs (device %q)", ErrUnavailable, name)
}
