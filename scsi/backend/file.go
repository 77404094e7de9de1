package backend

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// FileOptions configure OpenFile.
type FileOptions struct {
	// ReadOnly opens the file O_RDONLY under a shared lock: several read-only exports of one
	// file can coexist, but not with a read-write one. Every mutating call fails with
	// ErrReadOnly. Incompatible with Create and Shrink.
	ReadOnly bool
	// Create creates the file (mode 0600) when it does not exist, as a sparse file of Size
	// bytes. Size is required with Create.
	Create bool
	// Size, when non-zero, is the capacity the file must have: a missing file is created with it
	// (with Create), a smaller existing file is extended to it (sparsely), and an existing
	// larger file is refused with ErrWouldShrink unless Shrink is set. Zero means: export the
	// file at its current size.
	Size int64
	// Shared opens the file read-write under a shared lock: it backs one logical unit that
	// other exporters (multipath gateways) open Shared too; an exclusive (default) exporter
	// and a Shared one exclude each other.
	Shared bool
	// Shrink allows truncating an existing file larger than Size down to Size, destroying the
	// data past Size.
	Shrink bool
	// Direct opens a second descriptor with O_DIRECT, bypassing the page cache for every
	// ReadAt/WriteAt whose buffer address, offset and length meet the filesystem's direct I/O
	// alignment (STATX_DIOALIGN; typically 512 or 4096 bytes, and page-aligned buffers are always
	// fine). Unaligned calls fall back to the buffered descriptor, so any access works and
	// stays coherent, just not direct. Filesystems without O_DIRECT (e.g. ramfs) fail the
	// open with ErrNotSupported.
	Direct bool
	// NoSymlinks refuses (ErrSymlink) a path that is a symbolic link or has one among its
	// directories, instead of following it: see openPath for how.
	NoSymlinks bool
	// Admit, when not nil, is called with what was opened, once the file is locked and before
	// it is resized or written; an error refuses the file (and removes it if this call created
	// it). It is how the caller refuses a file by identity (device and inode, real path) rather
	// than by the path it asked for.
	Admit func(Identity) error
}

// File is a Backend on a regular file, read and written with pread/pwrite.
//
// An advisory flock(2) is held for the File's lifetime — exclusive when read-write, shared when
// read-only — so two srpd instances cannot export the same file read-write: the second OpenFile
// fails with ErrBusy. (flock is advisory and, on some network filesystems, local to one host.)
//
// Discard punches holes (FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE): the file stays sparse and the
// range reads as zeroes; partial filesystem blocks at either end are zeroed by the filesystem.
// WriteZeroes uses FALLOC_FL_ZERO_RANGE (the range stays allocated), then hole punching, then
// plain zero writes, as the filesystem allows.
type File struct {
	fdio // Size, ReadAt, WriteAt, Flush and Close
	info Info
	// Per-instance memory of what the filesystem refused, so WriteZeroes stops asking.
	noZeroRange, noPunch atomic.Bool
}

var _ Backend = (*File)(nil)

// OpenFile opens (and with opts.Create, creates) the regular file at path as a Backend.
func OpenFile(path string, opts FileOptions) (*File, error) {
	fail := func(err error) (*File, error) {
		return nil, fmt.Errorf("backend file %s: open: %w", path, withoutPath(err, path))
	}
	switch {
	case opts.Size < 0:
		return fail(fmt.Errorf("size %d: %w", opts.Size, ErrInvalidSize))
	case opts.Create && opts.Size == 0:
		return fail(fmt.Errorf("Create needs a Size: %w", ErrInvalidSize))
	case opts.ReadOnly && (opts.Create || opts.Shrink):
		return fail(fmt.Errorf("Create and Shrink need write access: %w", ErrReadOnly))
	}
	// Refuse what is not a regular file before opening it: opening a FIFO would block.
	fi, err := preStat(path, opts.NoSymlinks)
	switch {
	case errors.Is(err, ErrSymlink):
		return fail(err)
	case err == nil && !fi.Mode().IsRegular():
		return fail(fmt.Errorf("mode %v: %w", fi.Mode().Type(), ErrNotRegularFile))
	}

	flags := os.O_RDWR
	if opts.ReadOnly {
		flags = os.O_RDONLY
	}
	f, created, err := openOrCreate(path, flags, opts.Create, opts.NoSymlinks)
	if err != nil {
		return fail(err)
	}
	b := &File{}
	b.kind, b.path, b.readOnly = "file", path, opts.ReadOnly
	ok, remove := false, false
	defer func() {
		if ok {
			return
		}
		if b.df != nil {
			b.df.Close()
		}
		if remove {
			os.Remove(path) // created by this call and still ours: under our lock
		}
		f.Close()
	}()
	st, err := b.init(f, unix.S_IFREG, ErrNotRegularFile)
	if err != nil {
		return fail(err)
	}
	how := unix.LOCK_EX
	if opts.ReadOnly || opts.Shared {
		how = unix.LOCK_SH
	}
	if err := b.control(func(fd int) error { return unix.Flock(fd, how|unix.LOCK_NB) }); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fail(fmt.Errorf("flock: %w (another process holds a lock on the file)", ErrBusy))
		}
		return fail(fmt.Errorf("flock: %w", err))
	}
	remove = created
	if err := admit(f, opts.Admit); err != nil {
		return fail(err)
	}
	// Stat again under the lock: the previous holder may have resized the file.
	if err := fstat(f, &st); err != nil {
		return fail(err)
	}
	size := st.Size
	if opts.Size != 0 && opts.Size != size {
		switch {
		case opts.Size > size && opts.ReadOnly:
			return fail(fmt.Errorf("file has %d bytes, %d requested, and cannot be extended read-only: %w",
				size, opts.Size, ErrInvalidSize))
		case opts.Size < size && !opts.Shrink:
			return fail(fmt.Errorf("file has %d bytes, %d requested: %w", size, opts.Size, ErrWouldShrink))
		}
		if err := f.Truncate(opts.Size); err != nil {
			return fail(err)
		}
		size = opts.Size
	}
	if size == 0 {
		return fail(fmt.Errorf("empty file: %w", ErrInvalidSize))
	}
	b.size.Store(size)

	blk := int64(st.Blksize)
	if blk <= 0 || blk&(blk-1) != 0 {
		blk = 4096
	}
	if opts.Direct {
		if err := b.setDirect(flags, blk); err != nil {
			return fail(err)
		}
	}
	b.info = Info{
		Kind:              "file",
		Path:              path,
		ReadOnly:          opts.ReadOnly,
		Rotational:        rotational(unix.Major(st.Dev), unix.Minor(st.Dev)),
		PhysicalBlockSize: int(blk),
	}
	if !opts.ReadOnly {
		b.info.CanDiscard = b.probePunchHole(blk)
		b.info.DiscardZeroes = b.info.CanDiscard
	}
	ok = true
	return b, nil
}

// openOrCreate opens path, creating it when create is set and it does not exist; created tells
// whether this call created it. O_EXCL never creates through a symlink in the last component
// (the kernel fails it with EEXIST), so an existing symlink goes to the plain open.
func openOrCreate(path string, flags int, create, noSymlinks bool) (f *os.File, created bool, err error) {
	if create {
		f, err = openPath(path, flags|os.O_CREATE|os.O_EXCL, 0o600, noSymlinks)
		if err == nil {
			return f, true, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return nil, false, err
		}
	}
	f, err = openPath(path, flags, 0, noSymlinks)
	return f, false, err
}

// probePunchHole tells whether the filesystem punches holes, by punching one block past the end
// of the file: with KEEP_SIZE that changes neither the size nor the data, while a filesystem
// without the operation still refuses it (EOPNOTSUPP).
func (b *File) probePunchHole(blk int64) bool {
	off := (b.size.Load() + blk - 1) &^ (blk - 1)
	err := b.control(func(fd int) error {
		return unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, blk)
	})
	return err == nil
}

// Info describes the file. CanDiscard is what the filesystem answered to a hole punch at open;
// it is false for a read-only File (the probe needs a writable descriptor). DiscardZeroes equals
// CanDiscard: holes read as zeroes. PhysicalBlockSize is the filesystem block size (st_blksize),
// and Rotational is the queue/rotational of the block device holding the filesystem (false when
// there is none, e.g. tmpfs or network filesystems).
func (b *File) Info() Info { return b.info }

// Discard punches a hole over [off, off+n); the range reads as zeroes afterwards.
func (b *File) Discard(off, n int64) error {
	return b.mutate("discard", off, n, func() error {
		if !b.info.CanDiscard || b.noPunch.Load() {
			return b.rangeErr("discard", off, n, ErrNotSupported)
		}
		if err := b.fallocate(unix.FALLOC_FL_PUNCH_HOLE, off, n); err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) {
				b.noPunch.Store(true)
				err = fmt.Errorf("%w (%w)", ErrNotSupported, err)
			}
			return b.rangeErr("discard", off, n, err)
		}
		return nil
	})
}

// WriteZeroes makes [off, off+n) read as zeroes: FALLOC_FL_ZERO_RANGE where the filesystem has
// it, else a hole punch, else writing zeroes.
func (b *File) WriteZeroes(off, n int64) error {
	return b.mutate("write zeroes", off, n, func() error {
		// Each fallocate mode is tried until the filesystem refuses it once (EOPNOTSUPP).
		for _, m := range [...]struct {
			mode        uint32
			usable      bool
			unsupported *atomic.Bool
		}{
			{unix.FALLOC_FL_ZERO_RANGE, true, &b.noZeroRange},
			{unix.FALLOC_FL_PUNCH_HOLE, b.info.CanDiscard, &b.noPunch},
		} {
			if !m.usable || m.unsupported.Load() {
				continue
			}
			err := b.fallocate(m.mode, off, n)
			if err == nil {
				return nil
			}
			if !errors.Is(err, unix.EOPNOTSUPP) {
				return b.rangeErr("write zeroes", off, n, err)
			}
			m.unsupported.Store(true)
		}
		return b.writeZeroBytes(off, n)
	})
}

func (b *File) fallocate(mode uint32, off, n int64) error {
	return b.control(func(fd int) error {
		return unix.Fallocate(fd, mode|unix.FALLOC_FL_KEEP_SIZE, off, n)
	})
}
