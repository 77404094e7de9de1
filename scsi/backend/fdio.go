package backend

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// zeroBuf is the source of the zeroes written when neither the filesystem nor the device can
// zero a range by itself. It is never written to.
var zeroBuf [256 << 10]byte

// fdio is the pread/pwrite machinery shared by File and BlockDev.
//
// In direct mode there are two descriptors on the same file: df, opened with O_DIRECT, carries
// every ReadAt/WriteAt whose buffer address, offset and length meet the direct I/O alignment;
// everything else (unaligned I/O, zero-filling, fallocate, ioctls) goes through the buffered f.
// Linux keeps the two coherent only when they do not run at the same time on the same pages: a
// direct read first writes back the dirty cached pages of its range, a direct write invalidates
// them afterwards — and when that invalidation fails because buffered I/O is busy on a page
// ("Page cache invalidation failure on direct I/O"), the kernel marks the file with EIO for the
// next fdatasync, and a buffered read racing a direct write can leave a stale page in the cache.
// So in direct mode the file is cut into 1 MiB regions, each guarded by one of dioStripes
// RWMutexes: direct writes hold their regions shared, buffered operations (reads included) and
// the zeroing/discard calls hold them exclusively, and direct reads need no lock.
type fdio struct {
	kind, path string
	// f is the buffered descriptor. It holds the exclusion (flock for files, O_EXCL for devices)
	// and is the one fallocate, ioctls and fdatasync are issued on.
	f  *os.File
	rc syscall.RawConn // f's: syscalls on the descriptor without racing Close
	// df is the O_DIRECT descriptor, nil unless direct.
	df      *os.File
	memMask uintptr                // direct: buffer address alignment - 1
	offMask int64                  // direct: offset and length alignment - 1
	stripes *[dioStripes]dioStripe // direct: region locks

	size     atomic.Int64 // Resize changes it
	readOnly bool
	closed   atomic.Bool
}

// init takes f as the buffered descriptor and checks with fstat that it is of the file type
// ifmt (unix.S_IFREG, unix.S_IFBLK), failing with notType otherwise; it returns the stat.
func (d *fdio) init(f *os.File, ifmt uint32, notType error) (unix.Stat_t, error) {
	var st unix.Stat_t
	rc, err := f.SyscallConn()
	if err != nil {
		return st, err
	}
	d.f, d.rc = f, rc
	if err := fstat(f, &st); err != nil {
		return st, err
	}
	if st.Mode&unix.S_IFMT != ifmt {
		return st, notType
	}
	return st, nil
}

// check validates a call in the order closed, read-only (for mutating calls), range.
func (d *fdio) check(op string, off, n int64, mutating bool) error {
	if d.closed.Load() {
		return d.rangeErr(op, off, n, ErrClosed)
	}
	if mutating && d.readOnly {
		return d.rangeErr(op, off, n, ErrReadOnly)
	}
	if !inRange(off, n, d.size.Load()) {
		return d.rangeErr(op, off, n, ErrOutOfRange)
	}
	return nil
}

const (
	dioRegionShift = 20 // 1 MiB: at least a page, so two users of one page share a region
	dioStripes     = 64
)

// dioStripe is padded to a cache line so that stripes do not share one.
type dioStripe struct {
	sync.RWMutex
	_ [64 - unsafe.Sizeof(sync.RWMutex{})%64]byte
}

// aligned reports whether a transfer of p at off can go through the O_DIRECT descriptor.
func (d *fdio) aligned(p []byte, off int64) bool {
	return (off|int64(len(p)))&d.offMask == 0 &&
		uintptr(unsafe.Pointer(unsafe.SliceData(p)))&d.memMask == 0
}

// lockRange locks the stripes of the regions [off, off+n) touches (n > 0), in ascending stripe
// order so that concurrent callers cannot deadlock. A no-op outside direct mode.
func (d *fdio) lockRange(off, n int64, exclusive bool) { d.stripeRange(off, n, exclusive, true) }

// unlockRange undoes lockRange.
func (d *fdio) unlockRange(off, n int64, exclusive bool) { d.stripeRange(off, n, exclusive, false) }

// stripeRange locks (lock) or unlocks the stripes of the regions [off, off+n) touches, exclusively
// or shared, in ascending stripe order.
func (d *fdio) stripeRange(off, n int64, exclusive, lock bool) {
	if d.stripes == nil {
		return
	}
	first, count := stripeSpan(off, n)
	for i := range d.stripes {
		if (i-first+dioStripes)%dioStripes >= count {
			continue
		}
		s := &d.stripes[i]
		switch {
		case lock && exclusive:
			s.Lock()
		case lock:
			s.RLock()
		case exclusive:
			s.Unlock()
		default:
			s.RUnlock()
		}
	}
}

// mutate is the frame of Discard and WriteZeroes: it checks the call (closed, read-only, range),
// does nothing for n == 0, and otherwise runs fn with the regions of [off, off+n) locked
// exclusively.
func (d *fdio) mutate(op string, off, n int64, fn func() error) error {
	if err := d.check(op, off, n, true); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	d.lockRange(off, n, true)
	defer d.unlockRange(off, n, true)
	return fn()
}

// stripeSpan returns the cyclic run of stripes covering the regions of [off, off+n): the first
// stripe and how many follow (all of them when the range spans dioStripes regions or more).
func stripeSpan(off, n int64) (first, count int) {
	r0, r1 := off>>dioRegionShift, (off+max(n, 1)-1)>>dioRegionShift
	return int(r0 % dioStripes), int(min(r1-r0+1, dioStripes))
}

// Size returns the capacity in bytes (fixed at open; Resize changes it).
func (d *fdio) Size() int64 { return d.size.Load() }

// ReadAt reads len(p) bytes at off with pread(2). It does not allocate.
func (d *fdio) ReadAt(p []byte, off int64) (int, error) { return d.transfer("read", p, off, false) }

// WriteAt writes len(p) bytes at off with pwrite(2). It does not allocate.
func (d *fdio) WriteAt(p []byte, off int64) (int, error) { return d.transfer("write", p, off, true) }

// transfer is pread (write false) or pwrite (write true) of p at off. Without df everything goes
// through f unlocked; an aligned transfer goes through df, a write holding its regions shared and a
// read with no lock; an unaligned one goes through f holding its regions exclusively.
func (d *fdio) transfer(op string, p []byte, off int64, write bool) (int, error) {
	if err := d.check(op, off, int64(len(p)), write); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	f, lock, exclusive := d.f, false, false
	switch {
	case d.df == nil:
	case d.aligned(p, off):
		f, lock = d.df, write
	default:
		lock, exclusive = true, true
	}
	if lock {
		d.lockRange(off, int64(len(p)), exclusive)
	}
	var n int
	var err error
	if write {
		n, err = f.WriteAt(p, off)
	} else {
		n, err = f.ReadAt(p, off)
	}
	if lock {
		d.unlockRange(off, int64(len(p)), exclusive)
	}
	if err != nil {
		// A read's io.EOF inside [0, size): the file shrank under us.
		return n, d.ioErr(op, off, len(p), n, err)
	}
	return n, nil
}

// Flush calls fdatasync(2), which writes back the page cache (and, for a block device, flushes
// the device's volatile write cache). It flushes the whole inode, so it covers writes through df
// too. A no-op when read-only.
func (d *fdio) Flush() error {
	if d.closed.Load() {
		return d.opErr("flush", ErrClosed)
	}
	if d.readOnly {
		return nil
	}
	if err := d.control(unix.Fdatasync); err != nil {
		return d.opErr("flush", err)
	}
	return nil
}

// Close releases the descriptors (and with them the flock of a File, the O_EXCL of a BlockDev).
func (d *fdio) Close() error {
	if !d.closed.CompareAndSwap(false, true) {
		return d.opErr("close", ErrClosed)
	}
	err := d.f.Close()
	if d.df != nil {
		err = errors.Join(err, d.df.Close())
	}
	if err != nil {
		return d.opErr("close", err)
	}
	return nil
}

// control runs fn on f's descriptor, retrying on EINTR. The descriptor stays valid throughout
// even if Close runs concurrently; after Close it fails with ErrClosed.
func (d *fdio) control(fn func(fd int) error) error {
	var opErr error
	err := d.rc.Control(func(fd uintptr) {
		for {
			if opErr = fn(int(fd)); opErr != unix.EINTR {
				return
			}
		}
	})
	if err != nil {
		// Control fails only when Close won the race; it returns internal/poll's "use of closed
		// file", not os.ErrClosed.
		if d.closed.Load() || errors.Is(err, os.ErrClosed) {
			return ErrClosed
		}
		return err
	}
	return opErr
}

// writeZeroBytes writes zeroes over [off, off+n) from zeroBuf through the buffered descriptor.
// In direct mode the caller holds the range exclusively (lockRange).
func (d *fdio) writeZeroBytes(off, n int64) error {
	for n > 0 {
		m := min(n, int64(len(zeroBuf)))
		if w, err := d.f.WriteAt(zeroBuf[:m], off); err != nil {
			return d.ioErr("write zeroes", off, int(m), w, err)
		}
		off, n = off+m, n-m
	}
	return nil
}

// setDirect opens the O_DIRECT descriptor on the file f refers to (not whatever path names now:
// it goes through /proc/self/fd when available) and works out the alignment it needs.
// fallbackAlign is used for offsets and lengths when the kernel does not report
// STATX_DIOALIGN (before Linux 6.1).
func (d *fdio) setDirect(flags int, fallbackAlign int64) error {
	df, err := reopen(d.f, d.path, (flags|unix.O_DIRECT)&^(os.O_CREATE|os.O_EXCL|os.O_TRUNC))
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("O_DIRECT: %w (%w)", ErrNotSupported, err)
		}
		return fmt.Errorf("O_DIRECT: %w", err)
	}
	memAlign, offAlign := uint32(4096), uint32(max(fallbackAlign, 512))
	var stx unix.Statx_t
	err = statxFd(df, unix.STATX_DIOALIGN, &stx)
	if err == nil && stx.Mask&unix.STATX_DIOALIGN != 0 {
		if stx.Dio_offset_align == 0 {
			df.Close()
			return fmt.Errorf("O_DIRECT: the filesystem does not support direct I/O on this file: %w",
				ErrNotSupported)
		}
		memAlign, offAlign = stx.Dio_mem_align, stx.Dio_offset_align
	}
	if memAlign&(memAlign-1) != 0 || offAlign&(offAlign-1) != 0 {
		df.Close()
		return fmt.Errorf("O_DIRECT: alignment %d/%d is not a power of two: %w",
			memAlign, offAlign, ErrNotSupported)
	}
	if d.size.Load()&int64(offAlign-1) != 0 {
		df.Close()
		// A direct write of the last, partial block would extend the file.
		return fmt.Errorf("O_DIRECT: size %d is not a multiple of the direct I/O alignment %d: %w",
			d.size.Load(), offAlign, ErrNotSupported)
	}
	d.df, d.memMask, d.offMask = df, uintptr(memAlign-1), int64(offAlign-1)
	d.stripes = new([dioStripes]dioStripe)
	return nil
}

// reopen opens a second, independent open file description of the file f refers to, checking
// that it is the same inode (device) when it has to fall back to the path.
func reopen(f *os.File, path string, flags int) (*os.File, error) {
	var st0 unix.Stat_t
	if err := fstat(f, &st0); err != nil {
		return nil, err
	}
	g, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), flags, 0)
	if err != nil && !errors.Is(err, unix.EINVAL) {
		g, err = os.OpenFile(path, flags, 0) // no /proc
	}
	if err != nil {
		return nil, err
	}
	var st1 unix.Stat_t
	if err := fstat(g, &st1); err != nil {
		g.Close()
		return nil, err
	}
	if st0.Dev != st1.Dev || st0.Ino != st1.Ino || st0.Rdev != st1.Rdev {
		g.Close()
		return nil, fmt.Errorf("%s was replaced while being opened", path)
	}
	return g, nil
}

func fstat(f *os.File, st *unix.Stat_t) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var opErr error
	if err := rc.Control(func(fd uintptr) { opErr = unix.Fstat(int(fd), st) }); err != nil {
		return err
	}
	return opErr
}

func statxFd(f *os.File, mask int, stx *unix.Statx_t) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var opErr error
	if err := rc.Control(func(fd uintptr) {
		opErr = unix.Statx(int(fd), "", unix.AT_EMPTY_PATH, mask, stx)
	}); err != nil {
		return err
	}
	return opErr
}

// ioErr wraps an error from the OS on a transfer of want bytes at off, of which got were done.
// It never returns one of the package's sentinels except ErrClosed (Close raced the call), so the
// SCSI layer can map everything else to a MEDIUM ERROR; the errno stays reachable with
// errors.Is (syscall.EIO, syscall.ENOSPC...).
func (d *fdio) ioErr(op string, off int64, want, got int, err error) error {
	var pe *os.PathError
	switch {
	case errors.Is(err, os.ErrClosed) || d.closed.Load():
		err = ErrClosed
	case err == io.EOF:
		err = io.ErrUnexpectedEOF
	case errors.As(err, &pe):
		err = pe.Err // the path is in our prefix already
	}
	if got > 0 {
		return fmt.Errorf("backend %s %s: %s at %d: short transfer, %d of %d bytes: %w",
			d.kind, d.path, op, off, got, want, err)
	}
	return fmt.Errorf("backend %s %s: %s [%d, +%d): %w", d.kind, d.path, op, off, want, err)
}

func (d *fdio) rangeErr(op string, off, n int64, err error) error {
	return fmt.Errorf("backend %s %s: %s [%d, +%d): %w", d.kind, d.path, op, off, n, err)
}

func (d *fdio) opErr(op string, err error) error {
	return fmt.Errorf("backend %s %s: %s: %w", d.kind, d.path, op, err)
}
