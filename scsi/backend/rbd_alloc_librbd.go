//go:build rbd && cgo

package backend

/*
#cgo LDFLAGS: -lrbd -lrados
#include <errno.h>
#include <stdint.h>
#include <rbd/librbd.h>

// What one rbd_diff_iterate2 call collects: the first allocated extent at or after off (grown
// over the extents that continue it), or the sum of all allocated bytes.
struct srpd_rbd_alloc {
	uint64_t off, end;         // the range asked about
	uint64_t first, first_end; // the first allocated run found, clipped to [off, end)
	uint64_t used;             // sum mode: allocated bytes
	int found;
	int sum;
};

// srpd_rbd_alloc_cb is rbd_diff_iterate2's callback, on the calling thread. Diffing against
// no snapshot, "exists" extents are the allocated ones; the iteration stops (-ECANCELED, which
// the caller takes as success) once the first run has ended.
static int srpd_rbd_alloc_cb(uint64_t off, size_t len, int exists, void *arg) {
	struct srpd_rbd_alloc *a = arg;
	if (!exists)
		return 0;
	uint64_t s = off, e = off + len;
	if (s < a->off)
		s = a->off;
	if (e > a->end)
		e = a->end;
	if (s >= e)
		return 0;
	if (a->sum) {
		a->used += e - s;
		return 0;
	}
	if (!a->found) {
		a->first = s;
		a->first_end = e;
		a->found = 1;
		return 0;
	}
	if (s <= a->first_end) {
		if (e > a->first_end)
			a->first_end = e;
		return 0;
	}
	return -ECANCELED;
}

// srpd_rbd_allocated runs the iteration over [a->off, a->end) of the image and its parents,
// object by object (whole_object: cheap with the fast-diff feature, a stat per object without).
static int srpd_rbd_allocated(rbd_image_t img, struct srpd_rbd_alloc *a) {
	int r = rbd_diff_iterate2(img, NULL, a->off, a->end - a->off, 1, 1, srpd_rbd_alloc_cb, a);
	return r == -ECANCELED ? 0 : r;
}
*/
import "C"

import (
	"fmt"
	"syscall"
)

var _ Allocation = (*RBD)(nil)

// Allocated asks librbd (rbd_diff_iterate2 from the image's creation, parents included, whole
// objects) which objects exist: an object that exists counts as allocated in full, so the
// answer has the object's granularity (4 MiB by default) and errs on the side of "allocated".
func (r *RBD) Allocated(off, n int64) (bool, int64, error) {
	if n <= 0 {
		return false, 0, fmt.Errorf("backend rbd %s: allocation [%d, +%d): %w", r.name, off, n, ErrOutOfRange)
	}
	if err := r.beginAccess("allocation", off, n, false, false); err != nil {
		return false, 0, err
	}
	defer r.inflight.RUnlock()
	a := C.struct_srpd_rbd_alloc{off: C.uint64_t(off), end: C.uint64_t(off + n)}
	if ret := C.srpd_rbd_allocated(r.img, &a); ret < 0 {
		return false, 0, fmt.Errorf("backend rbd %s: allocation [%d, +%d): %w", r.name, off, n, syscall.Errno(-ret))
	}
	switch {
	case a.found == 0:
		return false, n, nil
	case int64(a.first) > off:
		return false, int64(a.first) - off, nil
	}
	return true, int64(a.first_end) - off, nil
}

// Usage sums the image's allocated objects (as `rbd du` does); what the pool could still hold
// is shared with every other image: unknown.
func (r *RBD) Usage() (int64, int64, error) {
	size := r.size.Load()
	if err := r.beginAccess("usage", 0, size, false, false); err != nil {
		return 0, 0, err
	}
	defer r.inflight.RUnlock()
	a := C.struct_srpd_rbd_alloc{off: 0, end: C.uint64_t(size), sum: 1}
	if ret := C.srpd_rbd_allocated(r.img, &a); ret < 0 {
		return 0, 0, fmt.Errorf("backend rbd %s: usage: %w", r.name, syscall.Errno(-ret))
	}
	return int64(a.used), -1, nil
}
