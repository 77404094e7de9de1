package backend

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Resizer is implemented by the backends whose capacity may change while they are open: a
// LUN resized live (srpctl lun resize, a reload with a new size) grows its backend first and
// then tells the SCSI layer (scsi.LUN.Resize), which reports CAPACITY DATA HAS CHANGED.
type Resizer interface {
	// Resize makes the capacity size bytes (> 0) and returns it; a size of 0 instead reads
	// the capacity again from the storage, for storage resized by other means (lvextend under
	// a block device; a file extended by hand). A backend never shrinks here: a smaller size
	// is ErrWouldShrink, as the data past it would be lost under initiators that use it.
	// Accesses in flight are unaffected; from the return on, Size and the range checks use
	// the new capacity.
	Resize(size int64) (int64, error)
}

var (
	_ Resizer = (*File)(nil)
	_ Resizer = (*BlockDev)(nil)
	_ Resizer = (*RAM)(nil)
)

// Resize extends the file to size bytes (sparsely: ftruncate), or with 0 adopts the file's
// current size (fstat) when that is not smaller. Read-only files cannot be extended.
func (b *File) Resize(size int64) (int64, error) {
	d := &b.fdio
	if d.closed.Load() {
		return 0, fmt.Errorf("backend file %s: resize: %w", d.path, ErrClosed)
	}
	cur := d.size.Load()
	if size == 0 {
		var st unix.Stat_t
		if err := fstat(d.f, &st); err != nil {
			return cur, fmt.Errorf("backend file %s: resize: %w", d.path, err)
		}
		size = st.Size
	}
	switch {
	case size < cur:
		return cur, fmt.Errorf("backend file %s: resize to %d bytes: the file has %d: %w", d.path, size, cur, ErrWouldShrink)
	case size == cur:
		return cur, nil
	case d.readOnly:
		return cur, fmt.Errorf("backend file %s: resize: %w", d.path, ErrReadOnly)
	case d.df != nil && size&d.offMask != 0:
		return cur, fmt.Errorf("backend file %s: resize to %d bytes: not a multiple of the direct I/O alignment %d: %w",
			d.path, size, d.offMask+1, ErrInvalidSize)
	}
	if err := d.f.Truncate(size); err != nil {
		return cur, fmt.Errorf("backend file %s: resize: %w", d.path, withoutPath(err, d.path))
	}
	d.size.Store(size)
	return size, nil
}

// Resize reads the device's size again (BLKGETSIZE64): a block device is resized by whoever
// owns it (lvextend, a grown RBD or iSCSI disk), never by srpd, so a size other than 0 is
// ErrNotSupported. A device that shrank is ErrWouldShrink and keeps its old capacity.
func (b *BlockDev) Resize(size int64) (int64, error) {
	d := &b.fdio
	cur := d.size.Load()
	if size != 0 {
		return cur, fmt.Errorf("backend blockdev %s: resize to %d bytes: a block device has its own size: %w", d.path, size, ErrNotSupported)
	}
	if d.closed.Load() {
		return 0, fmt.Errorf("backend blockdev %s: resize: %w", d.path, ErrClosed)
	}
	var n uint64
	err := d.control(func(fd int) error {
		var err error
		n, err = unix.IoctlGetUint64(fd, ioctlBLKGETSIZE64)
		return err
	})
	if err != nil {
		return cur, fmt.Errorf("backend blockdev %s: BLKGETSIZE64: %w", d.path, err)
	}
	switch {
	case int64(n) < cur:
		return cur, fmt.Errorf("backend blockdev %s: the device shrank from %d to %d bytes: %w", d.path, cur, n, ErrWouldShrink)
	case n > 1<<62 || (d.df != nil && int64(n)&d.offMask != 0):
		return cur, fmt.Errorf("backend blockdev %s: device size %d: %w", d.path, n, ErrInvalidSize)
	}
	d.size.Store(int64(n))
	return int64(n), nil
}

// ramTableLen is the chunk table of a RAM backend of n chunks: room to double (and at least
// to 1 GiB), within ramMaxChunks. The table costs 8 bytes per 64 KiB chunk, allocated or not;
// the room lets Resize grow the disk without replacing the table under concurrent accesses.
func ramTableLen(n int64) int64 {
	return min(max(2*n, 1<<30>>ramChunkShift), ramMaxChunks)
}

// Resize grows the RAM disk to size bytes: the new range reads as zeroes. It can grow to
// twice its size at creation (or 1 GiB, whichever is more); beyond that it must be created
// anew (ErrInvalidSize). Size 0 returns the size.
func (r *RAM) Resize(size int64) (int64, error) {
	if r.closed.Load() {
		return 0, fmt.Errorf("backend ram: resize: %w", ErrClosed)
	}
	cur := r.size.Load()
	switch {
	case size == 0 || size == cur:
		return cur, nil
	case size < cur:
		return cur, fmt.Errorf("backend ram: resize to %d bytes: the disk has %d: %w", size, cur, ErrWouldShrink)
	case r.readOnly:
		return cur, fmt.Errorf("backend ram: resize: %w", ErrReadOnly)
	case size > int64(len(r.chunks))<<ramChunkShift:
		return cur, fmt.Errorf("backend ram: resize to %d bytes: a RAM disk grows to at most %d bytes (twice its size at creation, or 1 GiB): %w",
			size, int64(len(r.chunks))<<ramChunkShift, ErrInvalidSize)
	}
	// The tail chunk of the old size may hold stale bytes past it (a write never reaches
	// there, but a partial-chunk discard only clears what was in range): zero them before
	// they become part of the disk.
	if tail := cur & (ramChunkSize - 1); tail != 0 {
		r.clearChunk(cur>>ramChunkShift, int(tail), ramChunkSize)
	}
	r.size.Store(size)
	return size, nil
}
