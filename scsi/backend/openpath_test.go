package backend

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// symlinkTree makes dir/real/lun.img (4 KiB of 0x5a), dir/link.img -> real/lun.img,
// dir/linkdir -> real and dir/dangling -> real/missing.img.
func symlinkTree(t *testing.T) (dir string) {
	t.Helper()
	dir = t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "real"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "real", "lun.img"), bytes.Repeat([]byte{0x5a}, 4096))
	for link, to := range map[string]string{"link.img": "real/lun.img", "linkdir": "real", "dangling": "real/missing.img"} {
		if err := os.Symlink(to, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestOpenFileNoSymlinks: with NoSymlinks a symlink anywhere in the path is ErrSymlink and the
// file behind it is neither resized nor created; without it symlinks are followed as before.
func TestOpenFileNoSymlinks(t *testing.T) {
	dir := symlinkTree(t)
	real := filepath.Join(dir, "real", "lun.img")
	for _, c := range []struct {
		name string
		path string
		opts FileOptions
		want error // nil: opens
	}{
		{"plain path", real, FileOptions{NoSymlinks: true}, nil},
		{"last component", filepath.Join(dir, "link.img"), FileOptions{NoSymlinks: true}, ErrSymlink},
		{"last component, would extend", filepath.Join(dir, "link.img"), FileOptions{NoSymlinks: true, Size: 1 << 20}, ErrSymlink},
		{"directory", filepath.Join(dir, "linkdir", "lun.img"), FileOptions{NoSymlinks: true}, ErrSymlink},
		{"create through a directory", filepath.Join(dir, "linkdir", "new.img"), FileOptions{NoSymlinks: true, Create: true, Size: 4096}, ErrSymlink},
		{"create on a dangling link", filepath.Join(dir, "dangling"), FileOptions{NoSymlinks: true, Create: true, Size: 4096}, ErrSymlink},
		{"read-only, last component", filepath.Join(dir, "link.img"), FileOptions{NoSymlinks: true, ReadOnly: true}, ErrSymlink},
		{"followed without the option", filepath.Join(dir, "link.img"), FileOptions{}, nil},
		{"directory followed without the option", filepath.Join(dir, "linkdir", "lun.img"), FileOptions{}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := OpenFile(c.path, c.opts)
			if c.want == nil {
				if err != nil {
					t.Fatalf("OpenFile(%s): %v", c.path, err)
				}
				if f.Size() != 4096 {
					t.Errorf("Size() = %d, want 4096", f.Size())
				}
				f.Close()
				return
			}
			if err == nil {
				f.Close()
				t.Fatalf("OpenFile(%s) opened it; want %v", c.path, c.want)
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("OpenFile(%s) = %v; want %v", c.path, err, c.want)
			}
			if fi, err := os.Stat(real); err != nil || fi.Size() != 4096 {
				t.Errorf("the file behind the link changed: %v, %v", fi, err)
			}
			for _, p := range []string{"new.img", "missing.img"} {
				if _, err := os.Lstat(filepath.Join(dir, "real", p)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s was created through the link (%v)", p, err)
				}
			}
		})
	}
}

// TestOpenNoFollowFallback: the path without openat2 refuses the same symlinks.
func TestOpenNoFollowFallback(t *testing.T) {
	dir := symlinkTree(t)
	for _, c := range []struct {
		path string
		want error
	}{
		{filepath.Join(dir, "real", "lun.img"), nil},
		{filepath.Join(dir, "link.img"), ErrSymlink},
		{filepath.Join(dir, "linkdir", "lun.img"), ErrSymlink},
		{filepath.Join(dir, "missing.img"), fs.ErrNotExist},
	} {
		f, err := openNoFollow(c.path, os.O_RDONLY, 0)
		if err == nil {
			f.Close()
		}
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("openNoFollow(%s) = %v; want %v", c.path, err, c.want)
		}
	}
}

// TestOpenFileAdmit: Admit sees the opened file's device, inode and real path, and its refusal
// fails the open before the file is resized, removing a file the call created.
func TestOpenFileAdmit(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "lun.img")
	writeFile(t, path, make([]byte, 4096))
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	var got Identity
	f, err := OpenFile(path, FileOptions{Admit: func(id Identity) error { got = id; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	realDir, _ := filepath.EvalSymlinks(dir)
	if got.Dev != st.Dev || got.Ino != st.Ino || got.Mode&unix.S_IFMT != unix.S_IFREG ||
		got.RealPath != filepath.Join(realDir, "lun.img") {
		t.Errorf("Admit saw %+v; want dev %d ino %d, a regular file, %s", got, st.Dev, st.Ino, path)
	}

	errNo := errors.New("not this one")
	refuse := func(Identity) error { return errNo }
	if f, err := OpenFile(path, FileOptions{Size: 1 << 20, Admit: refuse}); !errors.Is(err, errNo) {
		if err == nil {
			f.Close()
		}
		t.Fatalf("OpenFile with a refusing Admit = %v; want %v", err, errNo)
	}
	if fi, _ := os.Stat(path); fi.Size() != 4096 {
		t.Errorf("a refused file was resized to %d bytes", fi.Size())
	}
	created := filepath.Join(dir, "new.img")
	if _, err := OpenFile(created, FileOptions{Create: true, Size: 4096, Admit: refuse}); !errors.Is(err, errNo) {
		t.Fatalf("OpenFile(Create) with a refusing Admit = %v; want %v", err, errNo)
	}
	if _, err := os.Lstat(created); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused, newly created file was left behind (%v)", err)
	}
}

// TestOpenBlockDevNoSymlinks: a symlink to a device node is ErrSymlink with NoSymlinks (checked
// before the type), and without it the node behind is judged as before.
func TestOpenBlockDevNoSymlinks(t *testing.T) {
	link := filepath.Join(t.TempDir(), "null")
	if err := os.Symlink("/dev/null", link); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenBlockDev(link, BlockDevOptions{NoSymlinks: true}); !errors.Is(err, ErrSymlink) {
		t.Errorf("OpenBlockDev(symlink, NoSymlinks) = %v; want ErrSymlink", err)
	}
	if _, err := OpenBlockDev(link, BlockDevOptions{}); !errors.Is(err, ErrNotBlockDevice) {
		t.Errorf("OpenBlockDev(symlink to /dev/null) = %v; want ErrNotBlockDevice", err)
	}
}

// TestBlockDevAdmit: a real device through a symlink is refused with NoSymlinks and opened
// without; Admit sees the node and can refuse it.
func TestBlockDevAdmit(t *testing.T) {
	backing, _ := loopBacking(t, 1<<20)
	node := newLoop(t, backing, loopOpts{})
	link := filepath.Join(t.TempDir(), "disk")
	if err := os.Symlink(node, link); err != nil {
		t.Fatal(err)
	}
	if b, err := OpenBlockDev(link, BlockDevOptions{NoSymlinks: true}); !errors.Is(err, ErrSymlink) {
		if err == nil {
			b.Close()
		}
		t.Fatalf("OpenBlockDev(link, NoSymlinks) = %v; want ErrSymlink", err)
	}
	var got Identity
	b, err := OpenBlockDev(link, BlockDevOptions{Admit: func(id Identity) error { got = id; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if got.Mode&unix.S_IFMT != unix.S_IFBLK || (got.RealPath != "" && got.RealPath != node) {
		t.Errorf("Admit saw %+v; want the block device %s", got, node)
	}
	errNo := errors.New("not this one")
	if b, err := OpenBlockDev(node, BlockDevOptions{Admit: func(Identity) error { return errNo }}); !errors.Is(err, errNo) {
		if err == nil {
			b.Close()
		}
		t.Fatalf("OpenBlockDev with a refusing Admit = %v; want %v", err, errNo)
	}
}
