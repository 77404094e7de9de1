package backend

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Block device ioctls, from torvalds/linux include/uapi/linux/fs.h (golang.org/x/sys/unix has the
// same numbers). The argument types are the ones block/ioctl.c reads or writes:
//
//	BLKROGET     _IO(0x12,94)              int: non-zero when the device is read-only
//	BLKSSZGET    _IO(0x12,104)             int: logical block size
//	BLKGETSIZE64 _IOR(0x12,114,size_t)     u64: size in bytes (the size_t in the macro is historic)
//	BLKDISCARD   _IO(0x12,119)             in: uint64_t[2] {start, len}, bytes, both 512-aligned
//	                                       (logical-block-aligned on newer kernels)
//	BLKPBSZGET   _IO(0x12,123)             unsigned int: physical block size
//	BLKZEROOUT   _IO(0x12,127)             in: uint64_t[2] {start, len}, same alignment rules
//
// The 4-byte results are read into a uint32 (IoctlGetUint32), never into a Go int, so the value
// is right on big-endian machines too.
const (
	ioctlBLKROGET     = unix.BLKROGET
	ioctlBLKSSZGET    = unix.BLKSSZGET
	ioctlBLKGETSIZE64 = unix.BLKGETSIZE64
	ioctlBLKDISCARD   = unix.BLKDISCARD
	ioctlBLKPBSZGET   = unix.BLKPBSZGET
	ioctlBLKZEROOUT   = unix.BLKZEROOUT
)

// BlockDevOptions configure OpenBlockDev.
type BlockDevOptions struct {
	// ReadOnly opens the device O_RDONLY; every mutating call fails with ErrReadOnly. A device
	// the kernel reports read-only (BLKROGET) is opened read-only whatever this says.
	ReadOnly bool
	// Direct adds an O_DIRECT descriptor for aligned ReadAt/WriteAt, as FileOptions.Direct
	// does; the alignment is STATX_DIOALIGN where the kernel reports it for block devices, else
	// the logical block size for offsets and lengths and 4096 for buffer addresses.
	Direct bool
	// NoSymlinks refuses (ErrSymlink) a path that is a symbolic link or has one among its
	// directories (so /dev/disk/by-id/... names are refused), as FileOptions.NoSymlinks does.
	NoSymlinks bool
	// Admit, when not nil, is called with the opened device node before anything is read
	// from or written to the device; an error refuses it, as for FileOptions.Admit.
	Admit func(Identity) error
}

// BlockDev is a Backend on a block device node (a disk, partition, LV, loop device...), read and
// written with pread/pwrite through the page cache (or O_DIRECT, see BlockDevOptions.Direct).
//
// The device is opened with O_EXCL, which the kernel refuses (EBUSY → ErrBusy) while the device
// is mounted, held by device-mapper/md/another exclusive opener — including another srpd
// exporting it — so a BlockDev is the device's only exclusive user for its lifetime.
//
// Discard is BLKDISCARD on the logical blocks lying entirely inside the range; partial blocks at
// either end are left alone (a discard is advisory and DiscardZeroes is false, so that is
// allowed). WriteZeroes is BLKZEROOUT on the whole blocks plus zero writes for the partial ones.
type BlockDev struct {
	fdio       // Size, ReadAt, WriteAt, Flush and Close
	lbs  int64 // logical block size
	info Info
}

var _ Backend = (*BlockDev)(nil)

// OpenBlockDev opens the block device at path (symlinks such as /dev/disk/by-id/... are
// followed unless opts.NoSymlinks). It fails with ErrNotBlockDevice for anything but a block device node, ErrBusy when
// the device is mounted or exclusively held, ErrInvalidSize for an empty device (e.g. an unbound
// loop device).
func OpenBlockDev(path string, opts BlockDevOptions) (*BlockDev, error) {
	fail := func(err error) (*BlockDev, error) {
		return nil, fmt.Errorf("backend blockdev %s: open: %w", path, withoutPath(err, path))
	}
	// Check the type before opening: opening a FIFO or a tty can block or have side effects.
	fi, err := preStat(path, opts.NoSymlinks)
	if err != nil {
		return fail(err)
	}
	if m := fi.Mode(); m&fs.ModeDevice == 0 || m&fs.ModeCharDevice != 0 {
		return fail(fmt.Errorf("mode %v: %w", m.Type(), ErrNotBlockDevice))
	}

	readOnly := opts.ReadOnly
	flags := os.O_RDWR
	if readOnly {
		flags = os.O_RDONLY
	}
	f, err := openPath(path, flags|unix.O_EXCL, 0, opts.NoSymlinks)
	if errors.Is(err, unix.EROFS) && !readOnly {
		readOnly, flags = true, os.O_RDONLY
		f, err = openPath(path, flags|unix.O_EXCL, 0, opts.NoSymlinks)
	}
	if err != nil {
		if errors.Is(err, unix.EBUSY) {
			return fail(fmt.Errorf("%w: the device is mounted, part of a device-mapper/md/"+
				"bcache stack, or opened exclusively by another process (%w)", ErrBusy, err))
		}
		return fail(err)
	}
	b := &BlockDev{}
	b.kind, b.path = "blockdev", path
	ok := false
	defer func() {
		if !ok {
			if b.df != nil {
				b.df.Close()
			}
			f.Close()
		}
	}()
	st, err := b.init(f, unix.S_IFBLK, ErrNotBlockDevice)
	if err != nil {
		return fail(err)
	}
	if err := admit(f, opts.Admit); err != nil {
		return fail(err)
	}

	var size uint64
	var lbs, pbs, ro uint32
	err = b.control(func(fd int) error {
		var err error
		if size, err = unix.IoctlGetUint64(fd, ioctlBLKGETSIZE64); err != nil {
			return fmt.Errorf("BLKGETSIZE64: %w", err)
		}
		if lbs, err = unix.IoctlGetUint32(fd, ioctlBLKSSZGET); err != nil {
			return fmt.Errorf("BLKSSZGET: %w", err)
		}
		if pbs, err = unix.IoctlGetUint32(fd, ioctlBLKPBSZGET); err != nil {
			return fmt.Errorf("BLKPBSZGET: %w", err)
		}
		if ro, err = unix.IoctlGetUint32(fd, ioctlBLKROGET); err != nil {
			return fmt.Errorf("BLKROGET: %w", err)
		}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	if size == 0 || size > 1<<62 {
		return fail(fmt.Errorf("device size %d: %w", size, ErrInvalidSize))
	}
	if lbs < 512 || lbs&(lbs-1) != 0 {
		return fail(fmt.Errorf("BLKSSZGET: implausible logical block size %d", lbs))
	}
	if ro != 0 {
		readOnly = true
	}
	b.size.Store(int64(size))
	b.readOnly, b.lbs = readOnly, int64(lbs)

	if opts.Direct {
		if err := b.setDirect(flags, int64(lbs)); err != nil {
			return fail(err)
		}
	}

	major, minor := unix.Major(st.Rdev), unix.Minor(st.Rdev)
	b.info = Info{
		Kind:              "blockdev",
		Path:              path,
		ReadOnly:          readOnly,
		Rotational:        rotational(major, minor),
		PhysicalBlockSize: int(pbs),
	}
	// discard_max_bytes: the largest discard the device takes; 0 = no discard support.
	if v, err := sysfsQueueUint(major, minor, "discard_max_bytes"); err == nil && v > 0 {
		b.info.CanDiscard = true
		// Since Linux 4.12 discard_zeroes_data always reads 0 (and BLKDISCARDZEROES returns
		// 0): the kernel no longer promises that a discarded range reads back as zeroes,
		// because devices that claimed it did not reliably honour it. So this is true only on
		// old kernels that still vouch for the device; callers that need zeroes use
		// WriteZeroes.
		if z, err := sysfsQueueUint(major, minor, "discard_zeroes_data"); err == nil && z == 1 {
			b.info.DiscardZeroes = true
		}
	}
	ok = true
	return b, nil
}

// LogicalBlockSize returns the device's logical block size (BLKSSZGET): the granularity of
// Discard and of the BLKZEROOUT part of WriteZeroes, and the smallest unit the device writes
// without a read-modify-write in the page cache.
func (b *BlockDev) LogicalBlockSize() int { return int(b.lbs) }

// Info describes the device: PhysicalBlockSize from BLKPBSZGET; Rotational from
// /sys/dev/block/MAJ:MIN/queue/rotational; CanDiscard when queue/discard_max_bytes > 0;
// DiscardZeroes from queue/discard_zeroes_data, which is always 0 on Linux ≥ 4.12.
func (b *BlockDev) Info() Info { return b.info }

// Discard issues BLKDISCARD for the logical blocks lying entirely inside [off, off+n).
func (b *BlockDev) Discard(off, n int64) error {
	return b.mutate("discard", off, n, func() error {
		if !b.info.CanDiscard {
			return b.rangeErr("discard", off, n, ErrNotSupported)
		}
		start, end := b.inner(off, n)
		if end <= start {
			return nil
		}
		if err := b.ioctlRange(ioctlBLKDISCARD, start, end-start); err != nil {
			if errors.Is(err, unix.EOPNOTSUPP) {
				err = fmt.Errorf("%w (%w)", ErrNotSupported, err)
			}
			return b.rangeErr("discard", off, n, fmt.Errorf("BLKDISCARD [%d, +%d): %w", start, end-start, err))
		}
		return nil
	})
}

// WriteZeroes zeroes the whole logical blocks of [off, off+n) with BLKZEROOUT (the kernel uses
// the device's WRITE ZEROES / WRITE SAME when it has one and writes zeroes otherwise) and the
// partial blocks at either end with plain writes.
func (b *BlockDev) WriteZeroes(off, n int64) error {
	return b.mutate("write zeroes", off, n, func() error {
		start, end := b.inner(off, n)
		if end <= start {
			return b.writeZeroBytes(off, n)
		}
		if err := b.ioctlRange(ioctlBLKZEROOUT, start, end-start); err != nil {
			if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOTTY) && !errors.Is(err, unix.EINVAL) {
				return b.rangeErr("write zeroes", off, n,
					fmt.Errorf("BLKZEROOUT [%d, +%d): %w", start, end-start, err))
			}
			if err := b.writeZeroBytes(start, end-start); err != nil {
				return err
			}
		}
		if start > off {
			if err := b.writeZeroBytes(off, start-off); err != nil {
				return err
			}
		}
		if off+n > end {
			return b.writeZeroBytes(end, off+n-end)
		}
		return nil
	})
}

// inner returns the largest logical-block-aligned range inside [off, off+n).
func (b *BlockDev) inner(off, n int64) (start, end int64) {
	mask := b.lbs - 1
	return (off + mask) &^ mask, (off + n) &^ mask
}

// ioctlRange issues an ioctl that takes a uint64_t[2] {start, len} (BLKDISCARD, BLKZEROOUT).
func (b *BlockDev) ioctlRange(req uintptr, off, n int64) error {
	return b.control(func(fd int) error {
		r := [2]uint64{uint64(off), uint64(n)}
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(unsafe.Pointer(&r)))
		if e != 0 {
			return e
		}
		return nil
	})
}

// rotational reads /sys/dev/block/MAJ:MIN/queue/rotational; false when there is none (major 0 is
// an anonymous device: tmpfs, overlayfs, btrfs...).
func rotational(major, minor uint32) bool {
	if major == 0 {
		return false
	}
	v, err := sysfsQueueUint(major, minor, "rotational")
	return err == nil && v == 1
}

// sysfsQueueUint reads a number from the block device's queue/ directory in sysfs. A partition
// has no queue/ of its own: its disk's is one level up.
func sysfsQueueUint(major, minor uint32, attr string) (uint64, error) {
	dir := fmt.Sprintf("/sys/dev/block/%d:%d", major, minor)
	data, err := os.ReadFile(dir + "/queue/" + attr)
	if errors.Is(err, fs.ErrNotExist) {
		data, err = os.ReadFile(dir + "/../queue/" + attr)
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
}
