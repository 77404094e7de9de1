package backend

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestOpenFileCreateSparse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lun.img")
	f, err := OpenFile(path, FileOptions{Create: true, Size: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Size() != 1<<30 {
		t.Errorf("Size() = %d", f.Size())
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != 1<<30 || fi.Mode().Perm() != 0o600 {
		t.Errorf("created file: size %d, mode %v; want 1 GiB, 0600", fi.Size(), fi.Mode())
	}
	if b := stBlocks(t, path); b > 64 {
		t.Errorf("created file has %d blocks allocated; want it sparse", b)
	}
	if info := f.Info(); info.Kind != "file" || info.Path != path || info.ReadOnly {
		t.Errorf("Info() = %+v", info)
	}
}

func TestOpenFileSize(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "lun.img")
	data := bytes.Repeat([]byte{0x42}, 1<<20)
	writeFile(t, path, data)

	// Existing file, no Size: exported as it is.
	f, err := OpenFile(path, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if f.Size() != 1<<20 {
		t.Errorf("Size() = %d", f.Size())
	}
	f.Close()

	// Create on an existing file opens it (no truncation).
	f, err = OpenFile(path, FileOptions{Create: true, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	f.Close()

	// Smaller Size without Shrink: refused, file untouched.
	if _, err := OpenFile(path, FileOptions{Size: 4096}); !errors.Is(err, ErrWouldShrink) {
		t.Fatalf("shrinking without Shrink: %v; want ErrWouldShrink", err)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, data) {
		t.Fatal("refused shrink changed the file")
	}

	// Larger Size: extended sparsely, old data kept.
	f, err = OpenFile(path, FileOptions{Size: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 2<<20)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:1<<20], data) || !bytes.Equal(got[1<<20:], make([]byte, 1<<20)) {
		t.Error("extended file: content differs")
	}
	f.Close()

	// Shrink: truncated.
	f, err = OpenFile(path, FileOptions{Size: 8192, Shrink: true})
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if fi, _ := os.Stat(path); fi.Size() != 8192 {
		t.Errorf("after Shrink: size %d, want 8192", fi.Size())
	}

	// Read-only cannot resize.
	if _, err := OpenFile(path, FileOptions{ReadOnly: true, Size: 1 << 20}); !errors.Is(err, ErrInvalidSize) {
		t.Errorf("read-only extend: %v; want ErrInvalidSize", err)
	}
	if _, err := OpenFile(path, FileOptions{ReadOnly: true, Size: 4096, Shrink: true}); !errors.Is(err, ErrReadOnly) {
		t.Errorf("read-only shrink: %v; want ErrReadOnly", err)
	}
}

func TestOpenFileErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	writeFile(t, empty, nil)
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		path string
		opts FileOptions
		want error
	}{
		{"missing", filepath.Join(dir, "nope"), FileOptions{}, fs.ErrNotExist},
		{"empty file", empty, FileOptions{}, ErrInvalidSize},
		{"negative size", empty, FileOptions{Size: -1}, ErrInvalidSize},
		{"create without size", filepath.Join(dir, "new"), FileOptions{Create: true}, ErrInvalidSize},
		{"create read-only", filepath.Join(dir, "new"), FileOptions{Create: true, Size: 4096, ReadOnly: true}, ErrReadOnly},
		{"directory", dir, FileOptions{}, ErrNotRegularFile},
		{"char device", "/dev/null", FileOptions{}, ErrNotRegularFile},
		{"fifo", fifo, FileOptions{}, ErrNotRegularFile}, // must not block
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, err := OpenFile(c.path, c.opts)
			if err == nil {
				f.Close()
			}
			if !errors.Is(err, c.want) {
				t.Errorf("OpenFile(%s, %+v) = %v; want %v", c.path, c.opts, err, c.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "new")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused Create left a file behind: %v", err)
	}
}

func TestOpenFileBusy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lun.img")
	writeFile(t, path, make([]byte, 8192))
	rw := FileOptions{}
	ro := FileOptions{ReadOnly: true}
	open := func(o FileOptions) (*File, error) { return OpenFile(path, o) }

	a, err := open(rw)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []FileOptions{rw, ro, {Create: true, Size: 8192}} {
		if _, err := open(o); !errors.Is(err, ErrBusy) {
			t.Errorf("second open %+v while exported read-write: %v; want ErrBusy", o, err)
		}
	}
	a.Close()

	// Read-only exports share the file, and keep read-write ones out.
	a, err = open(ro)
	if err != nil {
		t.Fatal(err)
	}
	b, err := open(ro)
	if err != nil {
		t.Fatalf("second read-only open: %v", err)
	}
	if _, err := open(rw); !errors.Is(err, ErrBusy) {
		t.Errorf("read-write open while exported read-only: %v; want ErrBusy", err)
	}
	a.Close()
	b.Close()

	// Shared exports (multipath gateways of one unit) coexist, write, and keep exclusive ones
	// out; an exclusive one keeps them out.
	sh := FileOptions{Shared: true}
	a, err = open(sh)
	if err != nil {
		t.Fatal(err)
	}
	b, err = open(sh)
	if err != nil {
		t.Fatalf("second shared open: %v", err)
	}
	if _, err := open(rw); !errors.Is(err, ErrBusy) {
		t.Errorf("exclusive open while exported shared: %v; want ErrBusy", err)
	}
	if _, err := a.WriteAt(bytes.Repeat([]byte{7}, 512), 0); err != nil {
		t.Fatalf("write through a shared export: %v", err)
	}
	got := make([]byte, 512)
	if _, err := b.ReadAt(got, 0); err != nil || got[0] != 7 || got[511] != 7 {
		t.Fatalf("the other shared export reads %v: %v", got[:4], err)
	}
	a.Close()
	b.Close()
	a, err = open(rw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open(sh); !errors.Is(err, ErrBusy) {
		t.Errorf("shared open while exported exclusively: %v; want ErrBusy", err)
	}
	a.Close()

	// Closing releases the lock.
	c, err := open(rw)
	if err != nil {
		t.Fatalf("open after the others closed: %v", err)
	}
	c.Close()
}

// TestFileDiscardPunchesHoles checks that Discard deallocates: the file's allocated blocks drop.
func TestFileDiscardPunchesHoles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lun.img")
	f, err := OpenFile(path, FileOptions{Create: true, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !f.Info().CanDiscard || !f.Info().DiscardZeroes {
		t.Skipf("SKIPPED: the filesystem of %s does not punch holes: Info() = %+v", path, f.Info())
	}
	data := bytes.Repeat([]byte{0x77}, 4<<20)
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Flush(); err != nil {
		t.Fatal(err)
	}
	before := stBlocks(t, path)
	if err := f.Discard(1<<20, 2<<20); err != nil {
		t.Fatal(err)
	}
	after := stBlocks(t, path)
	t.Logf("allocated 512-byte blocks: %d before Discard of 2 MiB, %d after", before, after)
	if before-after < (2<<20)/512*9/10 {
		t.Errorf("Discard of 2 MiB freed %d blocks of 512 bytes; want about %d", before-after, (2<<20)/512)
	}
	if fi, _ := os.Stat(path); fi.Size() != 4<<20 {
		t.Errorf("Discard changed the file size to %d", fi.Size())
	}

	// WriteZeroes keeps the size too, and zeroes.
	if err := f.WriteZeroes(5, 3<<20); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4<<20)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	clear(data[1<<20 : 3<<20])
	clear(data[5 : 5+3<<20])
	if !bytes.Equal(got, data) {
		t.Error("content differs after Discard and WriteZeroes")
	}
}

// TestFileShrunkUnderneath: when the file is truncated behind the backend's back, a read of the
// missing part is an error (short read), not a silent success or a sentinel.
func TestFileShrunkUnderneath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lun.img")
	writeFile(t, path, make([]byte, 64<<10))
	f, err := OpenFile(path, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Truncate(path, 32<<10+100); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, err := f.ReadAt(buf, 32<<10)
	if err == nil || n != 100 {
		t.Fatalf("ReadAt across the new end = %d, %v; want 100 and an error", n, err)
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) || isSentinel(err) {
		t.Errorf("error %v: want io.ErrUnexpectedEOF and no sentinel", err)
	}
	t.Log(err)
}

func TestFileDirect(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lun.img")
	f, err := OpenFile(path, FileOptions{Create: true, Size: 1 << 20, Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.df == nil || f.offMask == 0 {
		t.Fatalf("no O_DIRECT descriptor (offMask %d)", f.offMask)
	}
	fl, err := unix.FcntlInt(f.df.Fd(), unix.F_GETFL, 0)
	if err != nil || fl&unix.O_DIRECT == 0 {
		t.Fatalf("direct descriptor flags %#x, %v: O_DIRECT missing", fl, err)
	}
	t.Logf("direct I/O alignment: memory %d, offset %d", f.memMask+1, f.offMask+1)
	buf := alignedBuf(8192, 4096)
	if !f.aligned(buf, 4096) || f.aligned(buf[1:4097], 4096) || f.aligned(buf, 4097) {
		t.Error("aligned() is wrong")
	}

	// A size that is not a multiple of the alignment is refused in direct mode, and a file this
	// call created is removed again.
	odd := filepath.Join(t.TempDir(), "odd.img")
	if _, err := OpenFile(odd, FileOptions{Create: true, Size: 4096 + 512 + 1, Direct: true}); !errors.Is(err, ErrNotSupported) {
		t.Errorf("Direct with an unaligned size: %v; want ErrNotSupported", err)
	}
	if _, err := os.Stat(odd); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused file was left behind: %v", err)
	}
}

func TestFileDirectUnsupported(t *testing.T) {
	dir := mountFS(t, "ramfs", "")
	path := filepath.Join(dir, "lun.img")
	_, err := OpenFile(path, FileOptions{Create: true, Size: 1 << 20, Direct: true})
	if !errors.Is(err, ErrNotSupported) {
		t.Errorf("Direct on ramfs: %v; want ErrNotSupported", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused file was left behind: %v", err)
	}
}

func TestFileRotational(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lun.img")
	f, err := OpenFile(path, FileOptions{Create: true, Size: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	v, err := sysfsQueueUint(unix.Major(st.Dev), unix.Minor(st.Dev), "rotational")
	if err != nil {
		t.Skipf("SKIPPED: %s is on a filesystem without a block device in sysfs (%v)", path, err)
	}
	if f.Info().Rotational != (v == 1) {
		t.Errorf("Info().Rotational = %v, sysfs says %d", f.Info().Rotational, v)
	}
}

func TestFileNoAllocs(t *testing.T) {
	for _, direct := range []bool{false, true} {
		f, err := OpenFile(filepath.Join(t.TempDir(), "lun.img"),
			FileOptions{Create: true, Size: 1 << 20, Direct: direct})
		if err != nil {
			t.Fatal(err)
		}
		buf := alignedBuf(4096, 4096)
		if a := testing.AllocsPerRun(100, func() { f.WriteAt(buf, 8192) }); a != 0 {
			t.Errorf("direct=%v: WriteAt: %v allocs/op", direct, a)
		}
		if a := testing.AllocsPerRun(100, func() { f.ReadAt(buf, 8192) }); a != 0 {
			t.Errorf("direct=%v: ReadAt: %v allocs/op", direct, a)
		}
		if a := testing.AllocsPerRun(100, func() { f.ReadAt(buf[1:], 8193) }); a != 0 {
			t.Errorf("direct=%v: unaligned ReadAt: %v allocs/op", direct, a)
		}
		f.Close()
	}
}

// TestOpenErrorsSayThePathOnce checks that a failed open names the backend, the path and the
// operation once: not "open: open /x: ...", as an *os.PathError wrapped under our own prefix
// read.
func TestOpenErrorsSayThePathOnce(t *testing.T) {
	p := filepath.Join(t.TempDir(), "missing", "disk.img")
	_, err := OpenFile(p, FileOptions{Create: true, Size: 1 << 20})
	if want := "backend file " + p + ": open: no such file or directory"; err == nil || err.Error() != want {
		t.Fatalf("OpenFile = %v, want %q", err, want)
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("errors.Is(%v, os.ErrNotExist) = false", err)
	}
	_, err = OpenBlockDev(p, BlockDevOptions{})
	if err == nil || strings.Count(err.Error(), p) != 1 || strings.Contains(err.Error(), "open: open") {
		t.Fatalf("OpenBlockDev = %v, want the path once and no doubled open", err)
	}
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("errors.Is(%v, os.ErrNotExist) = false", err)
	}
}
