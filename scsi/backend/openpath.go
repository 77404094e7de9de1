package backend

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Identity is what a backend's path turned out to be once opened. OpenFile and OpenBlockDev
// hand it to FileOptions.Admit / BlockDevOptions.Admit, so that the caller decides on the
// object actually opened (a hard link or another path to a file it protects has the same Dev
// and Ino) rather than on a path that may have changed since it looked.
type Identity struct {
	// Dev and Ino are st_dev and st_ino of the opened file or device node.
	Dev, Ino uint64
	// Mode is st_mode (type and permission bits).
	Mode uint32
	// RealPath is the absolute path the descriptor refers to, every symbolic link resolved
	// (readlink of /proc/self/fd/N); empty when /proc is not mounted.
	RealPath string
}

// identify describes the opened f.
func identify(f *os.File) (Identity, error) {
	var st unix.Stat_t
	if err := fstat(f, &st); err != nil {
		return Identity{}, err
	}
	id := Identity{Dev: st.Dev, Ino: st.Ino, Mode: st.Mode}
	if p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(f.Fd()))); err == nil && filepath.IsAbs(p) {
		id.RealPath = p
	}
	return id, nil
}

// admit runs the caller's check on the opened f.
func admit(f *os.File, fn func(Identity) error) error {
	if fn == nil {
		return nil
	}
	id, err := identify(f)
	if err != nil {
		return err
	}
	if err := fn(id); err != nil {
		return fmt.Errorf("refused: %w", err)
	}
	return nil
}

// preStat looks at path before it is opened (to refuse a FIFO or a tty, whose open can block
// or have side effects): through symlinks, or, with noSymlinks, without following the last
// component, which must then not be a symlink.
func preStat(path string, noSymlinks bool) (os.FileInfo, error) {
	if !noSymlinks {
		return os.Stat(path)
	}
	fi, err := os.Lstat(path)
	if err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return nil, fmt.Errorf("%s is a symbolic link: %w", path, ErrSymlink)
	}
	return fi, err
}

// openPath opens path with flags (and perm when creating). With noSymlinks a symbolic link in
// any component of path fails the open with ErrSymlink: openat2(2) with RESOLVE_NO_SYMLINKS
// (Linux 5.6) refuses it atomically, during the lookup. Where openat2 is missing (ENOSYS) or
// filtered (EPERM from a seccomp profile), the last component is opened with O_NOFOLLOW and
// the directories are checked twice: before the open (EvalSymlinks of the directory must be
// the directory itself) and after it (the descriptor's real path must be path), so a directory
// swapped for a symlink in between is refused too.
func openPath(path string, flags int, perm os.FileMode, noSymlinks bool) (*os.File, error) {
	if !noSymlinks {
		return os.OpenFile(path, flags, perm)
	}
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: unix.RESOLVE_NO_SYMLINKS}
	if flags&os.O_CREATE != 0 {
		how.Mode = uint64(perm.Perm())
	}
	// EINTR (a signal during a slow open, e.g. on a network filesystem) is retried, a bounded
	// number of times, as os.OpenFile retries it.
	for attempt := 0; ; attempt++ {
		fd, err := unix.Openat2(unix.AT_FDCWD, path, &how)
		switch {
		case err == nil:
			return os.NewFile(uintptr(fd), path), nil
		case errors.Is(err, unix.EINTR) && attempt < 100:
			continue
		case errors.Is(err, unix.ELOOP):
			return nil, fmt.Errorf("%s has a symbolic link in its path: %w", path, ErrSymlink)
		case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM):
			return openNoFollow(path, flags, perm)
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
}

// openNoFollow is openPath's fallback without openat2.
func openNoFollow(path string, flags int, perm os.FileMode) (*os.File, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(abs)
	if real, err := filepath.EvalSymlinks(dir); err != nil {
		return nil, err
	} else if real != dir {
		return nil, fmt.Errorf("%s has a symbolic link in its path (%s is %s): %w", path, dir, real, ErrSymlink)
	}
	f, err := os.OpenFile(path, flags|unix.O_NOFOLLOW, perm)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s is a symbolic link: %w", path, ErrSymlink)
	}
	if err != nil {
		return nil, err
	}
	if id, err := identify(f); err == nil && id.RealPath != "" && id.RealPath != abs {
		f.Close()
		return nil, fmt.Errorf("%s has a symbolic link in its path (it opened %s): %w", path, id.RealPath, ErrSymlink)
	}
	return f, nil
}

// withoutPath drops the operation and path of an *os.PathError about path itself, which an
// error message prefixed with the path and "open" would otherwise say twice
// ("backend file /x: open: open /x: no such file or directory"); an operation other than open
// is kept. errors.Is still sees the errno.
func withoutPath(err error, path string) error {
	pe, ok := err.(*os.PathError)
	switch {
	case !ok || pe.Path != path:
		return err
	case pe.Op == "open":
		return pe.Err
	}
	return fmt.Errorf("%s: %w", pe.Op, pe.Err)
}
