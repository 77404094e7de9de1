package backend

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mountFS mounts a fresh fstype (tmpfs, ramfs) on a temporary directory for the test's lifetime.
// It skips, saying so loudly, where mounting is not permitted.
func mountFS(t testing.TB, fstype, data string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount(fstype, dir, fstype, unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		t.Skipf("SKIPPED: cannot mount a %s for this test (mount(2): %v). It needs root or "+
			"CAP_SYS_ADMIN; run the tests as root to cover it", fstype, err)
	}
	t.Cleanup(func() { unmount(t, dir) })
	return dir
}

func unmount(t testing.TB, dir string) {
	// A loop device on a file in dir may take a moment to let go of it after detaching.
	for i := 0; ; i++ {
		err := unix.Unmount(dir, 0)
		if err == nil {
			return
		}
		if !errors.Is(err, unix.EBUSY) || i == 50 {
			t.Errorf("unmount %s: %v (detaching it lazily)", dir, err)
			unix.Unmount(dir, unix.MNT_DETACH)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type loopOpts struct {
	blockSize uint32 // logical block size; 0 = 512
	readOnly  bool   // LO_FLAGS_READ_ONLY: the kernel reports the device read-only
}

// newLoop attaches a loop device to the file backing and returns its node. The device is
// detached when the test ends (and, with LO_FLAGS_AUTOCLEAR, by the kernel if the test binary
// dies). It skips, loudly, only when the machine cannot give a loop device at all.
func newLoop(t testing.TB, backing string, o loopOpts) string {
	t.Helper()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("SKIPPED: no block device to test with: cannot open /dev/loop-control (%v). "+
			"Needs the loop driver (CONFIG_BLK_DEV_LOOP, modprobe loop) and root", err)
	}
	defer ctl.Close()
	flags := os.O_RDWR
	if o.readOnly {
		flags = os.O_RDONLY
	}
	bf, err := os.OpenFile(backing, flags, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer bf.Close() // the loop device holds its own reference
	var lastErr error
	for attempt := 0; attempt < 20; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			t.Skipf("SKIPPED: no block device to test with: LOOP_CTL_GET_FREE: %v", err)
		}
		node := loopNode(t, n)
		lf, err := os.OpenFile(node, os.O_RDWR, 0)
		if err != nil {
			t.Skipf("SKIPPED: no block device to test with: open %s: %v", node, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(bf.Fd()), Size: o.blockSize}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		if o.readOnly {
			cfg.Info.Flags |= unix.LO_FLAGS_READ_ONLY
		}
		err = unix.IoctlLoopConfigure(int(lf.Fd()), &cfg)
		if err == nil {
			t.Cleanup(func() {
				unix.IoctlSetInt(int(lf.Fd()), unix.LOOP_CLR_FD, 0)
				lf.Close()
			})
			return node
		}
		lf.Close()
		lastErr = err
		if !errors.Is(err, unix.EBUSY) {
			break // EBUSY: someone took that device between GET_FREE and CONFIGURE
		}
	}
	t.Skipf("SKIPPED: no block device to test with: LOOP_CONFIGURE: %v (needs Linux >= 5.8)", lastErr)
	return ""
}

// loopNode returns a device node for loop device n: /dev/loopN, or one made with mknod when /dev
// is static and lacks it.
func loopNode(t testing.TB, n int) string {
	node := fmt.Sprintf("/dev/loop%d", n)
	if _, err := os.Stat(node); err == nil {
		return node
	}
	node = filepath.Join(t.TempDir(), fmt.Sprintf("loop%d", n))
	if err := unix.Mknod(node, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err != nil {
		t.Skipf("SKIPPED: no block device to test with: /dev/loop%d missing and mknod: %v", n, err)
	}
	return node
}

// writeFile creates path with the given content.
func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// randomBytes returns n pseudo-random bytes from r.
func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// alignedBuf returns an n-byte slice whose address is a multiple of align.
func alignedBuf(n, align int) []byte {
	b := make([]byte, n+align)
	o := int(uintptr(unsafe.Pointer(&b[0])) % uintptr(align))
	if o != 0 {
		o = align - o
	}
	return b[o : o+n : o+n]
}

func stBlocks(t testing.TB, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks
}

// isSentinel reports whether err is one of the errors a caller treats as something other than a
// medium error.
func isSentinel(err error) bool {
	for _, s := range []error{ErrReadOnly, ErrOutOfRange, ErrNotSupported, ErrClosed} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}
