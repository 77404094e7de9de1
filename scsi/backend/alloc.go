package backend

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Allocation is implemented by a backend that knows which of its bytes are allocated (hold
// data) and which are not (holes, never-written or discarded ranges, reading as zeroes): the
// SCSI layer answers GET LBA STATUS and the logical block provisioning log page from it. A
// backend without it reports everything mapped.
type Allocation interface {
	// Allocated reports whether the byte at off is allocated, and the length of the run from
	// off in that same state, at most n (n > 0, [off, off+n) inside [0, Size())). run is at
	// least 1. A backend may report allocated what it cannot tell about; it must never report
	// a byte that holds data as unallocated.
	Allocated(off, n int64) (allocated bool, run int64, err error)
	// Usage reports the bytes allocated and the bytes that could still be allocated (-1:
	// unknown, e.g. the free space of a pool that others share too).
	Usage() (used, available int64, err error)
}

var (
	_ Allocation = (*File)(nil)
	_ Allocation = (*RAM)(nil)
)

// checkAllocated validates the arguments of Allocated.
func checkAllocated(kind string, closed bool, off, n, size int64) error {
	if closed {
		return fmt.Errorf("backend %s: allocation: %w", kind, ErrClosed)
	}
	if n <= 0 || !inRange(off, n, size) {
		return fmt.Errorf("backend %s: allocation [%d, +%d): %w", kind, off, n, ErrOutOfRange)
	}
	return nil
}

// Allocated asks the filesystem with lseek(SEEK_DATA) and lseek(SEEK_HOLE) (Linux 3.1+; a
// filesystem without them reports the whole file as data, which is the truth as far as it
// goes). The descriptor's file position changes, which pread/pwrite do not use.
func (b *File) Allocated(off, n int64) (bool, int64, error) {
	d := &b.fdio
	if err := checkAllocated(d.kind, d.closed.Load(), off, n, d.size.Load()); err != nil {
		return false, 0, err
	}
	var data, hole int64
	err := d.control(func(fd int) error {
		var err error
		data, err = unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // no data at or after off
			data, err = d.size.Load(), nil
		}
		if err != nil || data > off {
			return err
		}
		hole, err = unix.Seek(fd, off, unix.SEEK_HOLE)
		return err
	})
	if err != nil {
		return false, 0, d.opErr("allocation", err)
	}
	if data > off {
		return false, min(data-off, n), nil
	}
	if hole <= off { // cannot be: a hole is always found, at EOF at the latest
		hole = off + n
	}
	return true, min(hole-off, n), nil
}

// Usage is the file's allocated blocks (st_blocks) and the free space of its filesystem for
// unprivileged users (statfs f_bavail), which others share.
func (b *File) Usage() (int64, int64, error) {
	d := &b.fdio
	var st unix.Stat_t
	var fs unix.Statfs_t
	err := d.control(func(fd int) error {
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		return unix.Fstatfs(fd, &fs)
	})
	if err != nil {
		return 0, 0, d.opErr("usage", err)
	}
	return st.Blocks * 512, int64(fs.Bavail) * fs.Bsize, nil
}

// Allocated reports the 64 KiB chunks that hold memory as allocated and the others (never
// written, or discarded whole) as not. A chunk zeroed in part only stays allocated.
func (r *RAM) Allocated(off, n int64) (bool, int64, error) {
	size := r.size.Load()
	if err := checkAllocated("ram", r.closed.Load(), off, n, size); err != nil {
		return false, 0, err
	}
	i := off >> ramChunkShift
	state := r.chunks[i].Load() != nil
	end := off + n
	pos := (i + 1) << ramChunkShift
	for i++; pos < end && (r.chunks[i].Load() != nil) == state; i++ {
		pos += ramChunkSize
	}
	return state, min(pos, end) - off, nil
}

// Usage counts the chunks holding memory; what is not allocated yet could all be.
func (r *RAM) Usage() (int64, int64, error) {
	if r.closed.Load() {
		return 0, 0, fmt.Errorf("backend ram: usage: %w", ErrClosed)
	}
	var used int64
	size := r.size.Load()
	for i := range r.chunks {
		if r.chunks[i].Load() != nil {
			start := int64(i) << ramChunkShift
			used += min(start+ramChunkSize, size) - start
		}
	}
	return used, size - used, nil
}
