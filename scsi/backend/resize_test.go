package backend

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFileResize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lun.img")
	f, err := OpenFile(path, FileOptions{Create: true, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("head"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("x"), 1<<20); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("write past the end before the resize: %v", err)
	}
	if n, err := f.Resize(2 << 20); err != nil || n != 2<<20 || f.Size() != 2<<20 {
		t.Fatalf("Resize(2 MiB) = %d, %v; Size %d", n, err, f.Size())
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != 2<<20 {
		t.Fatalf("file after the resize: %v %v", fi, err)
	}
	if _, err := f.WriteAt([]byte("tail"), 2<<20-4); err != nil {
		t.Fatalf("write in the new range: %v", err)
	}
	b := make([]byte, 4)
	if _, err := f.ReadAt(b, 0); err != nil || string(b) != "head" {
		t.Fatalf("old data after the resize: %q %v", b, err)
	}
	if n, err := f.Resize(1 << 20); !errors.Is(err, ErrWouldShrink) || n != 2<<20 || f.Size() != 2<<20 {
		t.Fatalf("shrink: %d, %v", n, err)
	}
	// Extended by someone else: Resize(0) adopts the file's size.
	if err := os.Truncate(path, 3<<20); err != nil {
		t.Fatal(err)
	}
	if n, err := f.Resize(0); err != nil || n != 3<<20 || f.Size() != 3<<20 {
		t.Fatalf("Resize(0) after an outside extension: %d, %v", n, err)
	}

	ro, err := OpenFile(path, FileOptions{ReadOnly: true})
	if err != nil {
		if errors.Is(err, ErrBusy) { // the read-write open holds the exclusive lock
			f.Close()
			ro, err = OpenFile(path, FileOptions{ReadOnly: true})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	defer ro.Close()
	if _, err := ro.Resize(4 << 20); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("resize of a read-only file: %v", err)
	}
	ro.Close()
	if _, err := ro.Resize(4 << 20); !errors.Is(err, ErrClosed) {
		t.Fatalf("resize after close: %v", err)
	}
}

func TestRAMResize(t *testing.T) {
	const size = 1<<20 + 512 // the tail chunk is partial
	r, err := NewRAM(size, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fill := bytes.Repeat([]byte{0xAB}, 512)
	if _, err := r.WriteAt(fill, size-512); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Resize(4 << 20); err != nil || n != 4<<20 || r.Size() != 4<<20 {
		t.Fatalf("Resize = %d, %v", n, err)
	}
	b := make([]byte, 1024)
	if _, err := r.ReadAt(b, size-512); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b[:512], fill) || !bytes.Equal(b[512:], make([]byte, 512)) {
		t.Fatal("the old tail or the new range reads wrong")
	}
	if _, err := r.WriteAt(fill, 4<<20-512); err != nil {
		t.Fatalf("write at the new end: %v", err)
	}
	if _, err := r.Resize(2 << 20); !errors.Is(err, ErrWouldShrink) {
		t.Fatalf("shrink: %v", err)
	}
	// The table has room for 1 GiB (a small disk) and no more.
	if _, err := r.Resize(1<<30 + ramChunkSize); !errors.Is(err, ErrInvalidSize) || r.Size() != 4<<20 {
		t.Fatalf("beyond the table: %v (size %d)", err, r.Size())
	}
	if n, err := r.Resize(1 << 30); err != nil || n != 1<<30 {
		t.Fatalf("Resize(1 GiB) = %d, %v", n, err)
	}
	ro, _ := NewRAM(1<<20, true)
	if _, err := ro.Resize(2 << 20); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("read-only: %v", err)
	}
}

// TestBlockDevResize grows a loop device's backing file and its capacity (LOOP_SET_CAPACITY,
// what losetup -c does): Resize(0) finds the new size.
func TestBlockDevResize(t *testing.T) {
	backing, _ := loopBacking(t, 1<<20)
	dev := newLoop(t, backing, loopOpts{blockSize: 512})
	b, err := OpenBlockDev(dev, BlockDevOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.Resize(4 << 20); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Resize with a size: %v", err)
	}
	if err := os.Truncate(backing, 3<<20); err != nil {
		t.Fatal(err)
	}
	lf, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	if err := unix.IoctlSetInt(int(lf.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		t.Fatalf("LOOP_SET_CAPACITY: %v", err)
	}
	if n, err := b.Resize(0); err != nil || n != 3<<20 || b.Size() != 3<<20 {
		t.Fatalf("Resize(0) = %d, %v", n, err)
	}
	if _, err := b.WriteAt(make([]byte, 512), 3<<20-512); err != nil {
		t.Fatalf("write at the new end: %v", err)
	}
}
