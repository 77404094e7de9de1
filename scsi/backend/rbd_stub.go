//go:build !rbd || !cgo

package backend

import "fmt"

// RBDBuilt reports whether this build has the rbd backend (build tag rbd, with cgo).
const RBDBuilt = false

// OpenRBD fails with ErrRBDUnavailable: this build has no librbd (see rbd_librbd.go).
func OpenRBD(opts RBDOptions) (Backend, error) {
	return nil, fmt.Errorf("backend rbd %s: srpd was built without -tags rbd (rebuild with "+
		"`go build -tags rbd`, cgo and librbd-dev/librados-dev): %w", opts.Name(), ErrRBDUnavailable)
}
