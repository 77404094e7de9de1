package backend

import "errors"

// Errors returned by the constructors (OpenFile, OpenBlockDev, NewRAM), in addition to the ones
// in backend.go that the Backend methods return. Test them with errors.Is.
var (
	// ErrBusy: the file or device is already exported by another srpd instance (or, for a block
	// device, mounted or opened exclusively by someone else): the advisory flock(2) on the file
	// or the O_EXCL open of the device failed.
	ErrBusy = errors.New("backend: in use by another exporter")
	// ErrNotBlockDevice: OpenBlockDev was given a path that is not a block device node.
	ErrNotBlockDevice = errors.New("backend: not a block device")
	// ErrNotRegularFile: OpenFile was given a path that is not a regular file (a directory, a
	// device node, a FIFO...). Block devices are exported with OpenBlockDev.
	ErrNotRegularFile = errors.New("backend: not a regular file")
	// ErrWouldShrink: OpenFile was asked for a Size smaller than the existing file's without
	// FileOptions.Shrink; the file is left untouched.
	ErrWouldShrink = errors.New("backend: existing file is larger than the requested size")
	// ErrInvalidSize: a capacity that cannot be exported: zero or negative, an empty file, or a
	// RAM backend too large for its chunk table.
	ErrInvalidSize = errors.New("backend: invalid size")
	// ErrSymlink: FileOptions.NoSymlinks or BlockDevOptions.NoSymlinks is set and the path is a
	// symbolic link, or has one among its directories.
	ErrSymlink = errors.New("backend: symbolic link refused")
	// ErrNoExclusiveLock: OpenRBD with RBDOptions.ManagedLock on an image without the
	// exclusive-lock feature, which the managed lock (and so fencing) needs.
	ErrNoExclusiveLock = errors.New("backend: image has no exclusive-lock feature")
)

// inRange reports whether [off, off+n) lies inside [0, size), computed without overflow. An empty
// access is in range anywhere in [0, size].
func inRange(off, n, size int64) bool {
	return off >= 0 && n >= 0 && off <= size && n <= size-off
}
