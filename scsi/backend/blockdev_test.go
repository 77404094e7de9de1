package backend

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestOpenBlockDevNotBlockDevice(t *testing.T) {
	dir := t.TempDir()
	regular := filepath.Join(dir, "regular")
	writeFile(t, regular, make([]byte, 4096))
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want error
	}{
		{"/dev/null", ErrNotBlockDevice},
		{regular, ErrNotBlockDevice},
		{dir, ErrNotBlockDevice},
		{fifo, ErrNotBlockDevice}, // must not block
		{filepath.Join(dir, "missing"), fs.ErrNotExist},
	} {
		b, err := OpenBlockDev(c.path, BlockDevOptions{})
		if err == nil {
			b.Close()
		}
		if !errors.Is(err, c.want) {
			t.Errorf("OpenBlockDev(%s) = %v; want %v", c.path, err, c.want)
		}
	}
}

// loopBacking creates a backing file of size bytes holding a recognisable pattern.
func loopBacking(t *testing.T, size int) (string, []byte) {
	path := filepath.Join(t.TempDir(), "backing.img")
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i / 512)
	}
	writeFile(t, path, data)
	return path, data
}

func sysfsOf(t *testing.T, dev, attr string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	v, err := sysfsQueueUint(unix.Major(st.Rdev), unix.Minor(st.Rdev), attr)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestBlockDevInfo checks what OpenBlockDev learns from the ioctls and sysfs against sysfs, on
// loop devices with 512-byte and 4096-byte logical blocks.
func TestBlockDevInfo(t *testing.T) {
	for _, bs := range []uint32{512, 4096} {
		t.Run(fmt.Sprint(bs), func(t *testing.T) {
			backing, data := loopBacking(t, 1<<20)
			dev := newLoop(t, backing, loopOpts{blockSize: bs})
			b, err := OpenBlockDev(dev, BlockDevOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			info := b.Info()
			t.Logf("%s: Info() = %+v, logical block %d", dev, info, b.LogicalBlockSize())
			if b.Size() != 1<<20 {
				t.Errorf("Size() = %d, want %d", b.Size(), 1<<20)
			}
			if b.LogicalBlockSize() != int(bs) || uint64(b.LogicalBlockSize()) != sysfsOf(t, dev, "logical_block_size") {
				t.Errorf("LogicalBlockSize() = %d, want %d", b.LogicalBlockSize(), bs)
			}
			if want := sysfsOf(t, dev, "physical_block_size"); uint64(info.PhysicalBlockSize) != want {
				t.Errorf("PhysicalBlockSize = %d, sysfs says %d", info.PhysicalBlockSize, want)
			}
			if want := sysfsOf(t, dev, "rotational") == 1; info.Rotational != want {
				t.Errorf("Rotational = %v, sysfs says %v", info.Rotational, want)
			}
			if want := sysfsOf(t, dev, "discard_max_bytes") > 0; info.CanDiscard != want {
				t.Errorf("CanDiscard = %v, want %v", info.CanDiscard, want)
			}
			if info.Kind != "blockdev" || info.Path != dev || info.ReadOnly || info.DiscardZeroes {
				t.Errorf("Info() = %+v", info)
			}
			got := make([]byte, len(data))
			if _, err := b.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
				t.Errorf("reading the device: %v, or content differs from the backing file", err)
			}
		})
	}
}

// TestBlockDevReadOnlyDevice: a device the kernel reports read-only (BLKROGET) forces ReadOnly.
func TestBlockDevReadOnlyDevice(t *testing.T) {
	backing, data := loopBacking(t, 256<<10)
	dev := newLoop(t, backing, loopOpts{readOnly: true})
	b, err := OpenBlockDev(dev, BlockDevOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !b.Info().ReadOnly {
		t.Fatal("Info().ReadOnly = false on a read-only device")
	}
	if _, err := b.WriteAt([]byte{1}, 0); !errors.Is(err, ErrReadOnly) {
		t.Errorf("WriteAt = %v; want ErrReadOnly", err)
	}
	if err := b.WriteZeroes(0, 4096); !errors.Is(err, ErrReadOnly) {
		t.Errorf("WriteZeroes = %v; want ErrReadOnly", err)
	}
	got := make([]byte, len(data))
	if _, err := b.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Errorf("ReadAt: %v, or content differs", err)
	}
}

func TestBlockDevBusy(t *testing.T) {
	backing, _ := loopBacking(t, 256<<10)
	dev := newLoop(t, backing, loopOpts{})
	a, err := OpenBlockDev(dev, BlockDevOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []BlockDevOptions{{}, {ReadOnly: true}} {
		if _, err := OpenBlockDev(dev, o); !errors.Is(err, ErrBusy) {
			t.Errorf("second OpenBlockDev(%+v) = %v; want ErrBusy", o, err)
		}
	}
	a.Close()
	b, err := OpenBlockDev(dev, BlockDevOptions{})
	if err != nil {
		t.Fatalf("open after Close: %v", err)
	}
	b.Close()
}

// TestBlockDevMounted: a device holding a mounted filesystem is refused with ErrBusy.
func TestBlockDevMounted(t *testing.T) {
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		t.Skip("SKIPPED: mkfs.ext4 not installed (e2fsprogs): cannot make a filesystem to mount")
	}
	backing := filepath.Join(t.TempDir(), "fs.img")
	writeFile(t, backing, nil)
	if err := os.Truncate(backing, 16<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mkfs, "-q", "-F", backing).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	dev := newLoop(t, backing, loopOpts{})
	mnt := t.TempDir()
	if err := unix.Mount(dev, mnt, "ext4", 0, ""); err != nil {
		t.Skipf("SKIPPED: cannot mount %s (%v)", dev, err)
	}
	t.Cleanup(func() { unmount(t, mnt) })
	b, err := OpenBlockDev(dev, BlockDevOptions{ReadOnly: true})
	if err == nil {
		b.Close()
	}
	if !errors.Is(err, ErrBusy) {
		t.Errorf("OpenBlockDev on a mounted device = %v; want ErrBusy", err)
	}
	t.Log(err)
}

// TestBlockDevDiscardDeallocates: BLKDISCARD reaches the device — a loop device turns it into a
// hole punched in its backing file, whose allocated blocks drop.
func TestBlockDevDiscardDeallocates(t *testing.T) {
	backing, _ := loopBacking(t, 4<<20)
	dev := newLoop(t, backing, loopOpts{})
	b, err := OpenBlockDev(dev, BlockDevOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !b.Info().CanDiscard {
		t.Skipf("SKIPPED: %s does not support discard (Info() = %+v)", dev, b.Info())
	}
	before := stBlocks(t, backing)
	// Unaligned: only the whole 512-byte blocks inside are discarded.
	if err := b.Discard(1<<20-100, 2<<20+200); err != nil {
		t.Fatal(err)
	}
	after := stBlocks(t, backing)
	t.Logf("backing file: %d blocks allocated before Discard of 2 MiB, %d after", before, after)
	if before-after < (2<<20)/512*9/10 {
		t.Errorf("Discard freed %d blocks of the backing file; want about %d", before-after, (2<<20)/512)
	}
	// The partial sectors at either end were left alone.
	got := make([]byte, 100)
	if _, err := b.ReadAt(got, 1<<20-100); err != nil {
		t.Fatal(err)
	}
	sector := (1<<20 - 100) / 512
	if !bytes.Equal(got, bytes.Repeat([]byte{byte(sector)}, 100)) {
		t.Error("Discard touched the partial block before the range")
	}
}

// TestBlockDevWriteZeroesUnaligned: BLKZEROOUT for whole blocks, plain writes for the rest, with
// 4096-byte logical blocks.
func TestBlockDevWriteZeroesUnaligned(t *testing.T) {
	backing, data := loopBacking(t, 1<<20)
	dev := newLoop(t, backing, loopOpts{blockSize: 4096})
	b, err := OpenBlockDev(dev, BlockDevOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, c := range []struct{ off, n int64 }{{100, 50}, {4000, 200}, {5000, 20000}, {8192, 4096}} {
		if err := b.WriteZeroes(c.off, c.n); err != nil {
			t.Fatal(err)
		}
		clear(data[c.off : c.off+c.n])
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := b.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Error("content differs after WriteZeroes")
	}
	// And it reached the backing file.
	onDisk, _ := os.ReadFile(backing)
	if !bytes.Equal(onDisk, data) {
		t.Error("backing file differs after WriteZeroes and Flush")
	}
}

// TestBlockDevUnbound: a loop device with nothing attached has size 0 and is refused.
func TestBlockDevUnbound(t *testing.T) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("SKIPPED: no /dev/loop-control (%v)", err)
	}
	defer ctl.Close()
	n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
	if err != nil {
		t.Skipf("SKIPPED: LOOP_CTL_GET_FREE: %v", err)
	}
	dev := loopNode(t, n)
	b, err := OpenBlockDev(dev, BlockDevOptions{})
	if err == nil {
		b.Close()
		t.Skipf("SKIPPED: %s got bound by someone else meanwhile", dev)
	}
	if !errors.Is(err, ErrInvalidSize) {
		t.Errorf("OpenBlockDev(unbound %s) = %v; want ErrInvalidSize", dev, err)
	}
}

func TestBlockDevNoAllocs(t *testing.T) {
	backing, _ := loopBacking(t, 1<<20)
	dev := newLoop(t, backing, loopOpts{})
	for _, direct := range []bool{false, true} {
		b, err := OpenBlockDev(dev, BlockDevOptions{Direct: direct})
		if err != nil {
			t.Fatal(err)
		}
		buf := alignedBuf(4096, 4096)
		if a := testing.AllocsPerRun(100, func() { b.WriteAt(buf, 8192) }); a != 0 {
			t.Errorf("direct=%v: WriteAt: %v allocs/op", direct, a)
		}
		if a := testing.AllocsPerRun(100, func() { b.ReadAt(buf, 8192) }); a != 0 {
			t.Errorf("direct=%v: ReadAt: %v allocs/op", direct, a)
		}
		b.Close()
	}
}
