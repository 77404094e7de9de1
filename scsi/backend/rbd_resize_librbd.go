//go:build rbd && cgo

package backend

/*
#cgo LDFLAGS: -lrbd
#include <stdint.h>
#include <rbd/librbd.h>
*/
import "C"

import (
	"fmt"
	"syscall"
)

var _ Resizer = (*RBD)(nil)

// Resize grows the image to size bytes (rbd_resize, which every other client of the image
// sees through its header watch), or with 0 reads the image's size again (rbd_get_size).
// Shrinking is ErrWouldShrink: srpd never discards an image's tail under its initiators. A
// resize by `rbd resize` elsewhere needs no call: the header watch reads the size and calls
// RBDOptions.OnResize.
func (r *RBD) Resize(size int64) (int64, error) {
	if r.closed.Load() {
		return 0, fmt.Errorf("backend rbd %s: resize: %w", r.name, ErrClosed)
	}
	r.inflight.RLock()
	defer r.inflight.RUnlock()
	cur := r.size.Load()
	if size == 0 {
		n, err := r.readSize()
		if err != nil {
			return cur, fmt.Errorf("backend rbd %s: rbd_get_size: %w", r.name, err)
		}
		size = n
	}
	switch {
	case size < cur:
		return cur, fmt.Errorf("backend rbd %s: resize to %d bytes: the image has %d: %w", r.name, size, cur, ErrWouldShrink)
	case size == cur:
		return cur, nil
	case r.info.ReadOnly:
		return cur, fmt.Errorf("backend rbd %s: resize: %w", r.name, ErrReadOnly)
	}
	if n, err := r.readSize(); err == nil && n >= size {
		size = n // grown already (elsewhere, or the header watch is behind)
	} else if ret := C.rbd_resize(r.img, C.uint64_t(size)); ret < 0 {
		return cur, fmt.Errorf("backend rbd %s: rbd_resize to %d bytes: %w", r.name, size, syscall.Errno(-ret))
	}
	r.size.Store(size)
	return size, nil
}
