package backend

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"
)

// kind is one way of making a Backend, exercised by the conformance tests.
type kind struct {
	name string
	size int64
	// open returns a writable backend of size bytes holding init.
	open func(t *testing.T, init []byte) Backend
	// openRO returns a read-only backend of size bytes and the content it must read back: init
	// where the kind can be seeded, zeroes otherwise (RAM).
	openRO func(t *testing.T, init []byte) (Backend, []byte)
	// faulty returns a writable backend whose storage fails part-way through being filled
	// (ENOSPC/EIO from the OS); nil for kinds with no OS I/O path.
	faulty func(t *testing.T) Backend
	// faultErrnos are the errnos faulty's failure may carry; nil: ENOSPC or EIO.
	faultErrnos []syscall.Errno
}

func closeOnCleanup(t *testing.T, b Backend) Backend {
	t.Cleanup(func() { b.Close() }) // ErrClosed when the test closed it already
	return b
}

func ramKind() kind {
	const size = 4*ramChunkSize + 1000 // a partial tail chunk
	return kind{
		name: "ram",
		size: size,
		open: func(t *testing.T, init []byte) Backend {
			r, err := NewRAM(size, false)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.WriteAt(init, 0); err != nil {
				t.Fatal(err)
			}
			return closeOnCleanup(t, r)
		},
		openRO: func(t *testing.T, init []byte) (Backend, []byte) {
			r, err := NewRAM(size, true)
			if err != nil {
				t.Fatal(err)
			}
			return closeOnCleanup(t, r), make([]byte, size)
		},
	}
}

// fileKind exports files in the directory dir(t) returns.
func fileKind(name string, size int64, dir func(t *testing.T) string, direct bool) kind {
	openIn := func(t *testing.T, init []byte, ro bool) Backend {
		path := filepath.Join(dir(t), "lun.img")
		writeFile(t, path, init)
		f, err := OpenFile(path, FileOptions{ReadOnly: ro, Direct: direct})
		if direct && errors.Is(err, ErrNotSupported) {
			t.Skipf("SKIPPED: no O_DIRECT on the filesystem of %s: %v", path, err)
		}
		if err != nil {
			t.Fatal(err)
		}
		return closeOnCleanup(t, f)
	}
	return kind{
		name: name,
		size: size,
		open: func(t *testing.T, init []byte) Backend { return openIn(t, init, false) },
		openRO: func(t *testing.T, init []byte) (Backend, []byte) {
			return openIn(t, init, true), init
		},
		faulty: func(t *testing.T) Backend {
			dir := mountFS(t, "tmpfs", "size=1m")
			f, err := OpenFile(filepath.Join(dir, "lun.img"),
				FileOptions{Create: true, Size: 8 << 20, Direct: direct})
			if direct && errors.Is(err, ErrNotSupported) {
				t.Skipf("SKIPPED: no O_DIRECT on tmpfs before Linux 6.6: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			return closeOnCleanup(t, f)
		},
	}
}

func blockDevKind(name string, size int64, lo loopOpts, direct bool) kind {
	openOn := func(t *testing.T, init []byte, ro bool) Backend {
		backing := filepath.Join(t.TempDir(), "backing.img")
		writeFile(t, backing, init)
		dev := newLoop(t, backing, lo)
		b, err := OpenBlockDev(dev, BlockDevOptions{ReadOnly: ro, Direct: direct})
		if err != nil {
			t.Fatal(err)
		}
		return closeOnCleanup(t, b)
	}
	return kind{
		name: name,
		size: size,
		open: func(t *testing.T, init []byte) Backend { return openOn(t, init, false) },
		openRO: func(t *testing.T, init []byte) (Backend, []byte) {
			return openOn(t, init, true), init
		},
		faulty: func(t *testing.T) Backend {
			// A loop device of 8 MiB on a sparse file in a 1 MiB tmpfs: writeback into it fails
			// once the tmpfs is full, and the loop device reports the failure as an I/O error.
			dir := mountFS(t, "tmpfs", "size=1m")
			backing := filepath.Join(dir, "backing.img")
			writeFile(t, backing, nil)
			if err := syscall.Truncate(backing, 8<<20); err != nil {
				t.Fatal(err)
			}
			dev := newLoop(t, backing, lo)
			b, err := OpenBlockDev(dev, BlockDevOptions{Direct: direct})
			if err != nil {
				t.Fatal(err)
			}
			return closeOnCleanup(t, b)
		},
	}
}

func allKinds() []kind {
	tmp := func(t *testing.T) string { return t.TempDir() }
	tmpfs := func(t *testing.T) string { return mountFS(t, "tmpfs", "size=64m") }
	ramfs := func(t *testing.T) string { return mountFS(t, "ramfs", "") }
	const fsize = 512<<10 + 1000 // not a multiple of any block size
	return []kind{
		ramKind(),
		fileKind("file", fsize, tmp, false),
		fileKind("file-direct", 512<<10+4096, tmp, true),
		fileKind("file-tmpfs", fsize, tmpfs, false), // hole punching, no FALLOC_FL_ZERO_RANGE
		fileKind("file-ramfs", fsize, ramfs, false), // no fallocate at all: zero writes
		blockDevKind("blockdev", 512<<10, loopOpts{}, false),
		blockDevKind("blockdev-4k", 512<<10, loopOpts{blockSize: 4096}, false),
		blockDevKind("blockdev-direct", 512<<10, loopOpts{blockSize: 4096}, true),
	}
}

func TestConformance(t *testing.T) {
	for _, k := range allKinds() {
		t.Run(k.name, func(t *testing.T) { runConformance(t, k) })
	}
}

// runConformance runs every conformance test on kind k (also from rbd_test.go, build tag rbd).
func runConformance(t *testing.T, k kind) {
	t.Run("Info", func(t *testing.T) { testInfo(t, k) })
	t.Run("ReadWrite", func(t *testing.T) { testReadWrite(t, k) })
	t.Run("ZeroLength", func(t *testing.T) { testZeroLength(t, k) })
	t.Run("Bounds", func(t *testing.T) { testBounds(t, k) })
	t.Run("ReadOnly", func(t *testing.T) { testReadOnly(t, k) })
	t.Run("Discard", func(t *testing.T) { testZeroing(t, k, true) })
	t.Run("WriteZeroes", func(t *testing.T) { testZeroing(t, k, false) })
	t.Run("Close", func(t *testing.T) { testClose(t, k) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, k) })
	t.Run("CloseWhileBusy", func(t *testing.T) { testCloseWhileBusy(t, k) })
	t.Run("MixedAlignment", func(t *testing.T) { testMixedAlignment(t, k) })
	t.Run("IOError", func(t *testing.T) { testIOError(t, k) })
}

func rng(t *testing.T) *rand.Rand {
	var seed uint64
	for _, c := range t.Name() {
		seed = seed*31 + uint64(c)
	}
	return rand.New(rand.NewPCG(seed, 1))
}

// verify compares the whole backend with model, skipping the bytes marked in unknown (may be nil).
func verify(t *testing.T, b Backend, model []byte, unknown []bool) {
	t.Helper()
	if got := b.Size(); got != int64(len(model)) {
		t.Fatalf("Size() = %d, want %d", got, len(model))
	}
	buf := make([]byte, 99_999) // odd-sized reads: unaligned offsets
	for off := 0; off < len(model); off += len(buf) {
		p := buf[:min(len(buf), len(model)-off)]
		n, err := b.ReadAt(p, int64(off))
		if err != nil || n != len(p) {
			t.Fatalf("ReadAt(%d bytes at %d) = %d, %v", len(p), off, n, err)
		}
		for i := range p {
			if (unknown == nil || !unknown[off+i]) && p[i] != model[off+i] {
				t.Fatalf("byte %d = %#x, want %#x", off+i, p[i], model[off+i])
			}
		}
	}
}

func testInfo(t *testing.T, k kind) {
	init := make([]byte, k.size)
	b := k.open(t, init)
	info := b.Info()
	if info.Kind == "" || info.ReadOnly {
		t.Errorf("Info() = %+v: want a Kind and ReadOnly false", info)
	}
	if info.DiscardZeroes && !info.CanDiscard {
		t.Errorf("Info() = %+v: DiscardZeroes without CanDiscard", info)
	}
	if b.Size() != k.size {
		t.Errorf("Size() = %d, want %d", b.Size(), k.size)
	}
	if err := b.Flush(); err != nil {
		t.Errorf("Flush: %v", err)
	}
	t.Logf("Info() = %+v", info)
}

func testReadWrite(t *testing.T, k kind) {
	r := rng(t)
	model := randomBytes(r, int(k.size))
	b := k.open(t, model)
	verify(t, b, model, nil)
	for range 300 {
		var off, n int
		var p []byte
		if r.IntN(2) == 0 { // aligned: exercises O_DIRECT where enabled
			off = r.IntN(int(k.size)/4096) * 4096
			n = (1 + r.IntN(min(48, (int(k.size)-off)/4096))) * 4096
			p = alignedBuf(n, 4096)
		} else {
			off = r.IntN(int(k.size))
			n = r.IntN(min(200_000, int(k.size)-off) + 1)
			p = make([]byte, n)
		}
		copy(p, randomBytes(r, n))
		if w, err := b.WriteAt(p, int64(off)); err != nil || w != n {
			t.Fatalf("WriteAt(%d bytes at %d) = %d, %v", n, off, w, err)
		}
		copy(model[off:], p)
		q := alignedBuf(n, 4096)
		if got, err := b.ReadAt(q, int64(off)); err != nil || got != n {
			t.Fatalf("ReadAt(%d bytes at %d) = %d, %v", n, off, got, err)
		}
		if !bytes.Equal(q, model[off:off+n]) {
			t.Fatalf("read back [%d, +%d) differs from what was written", off, n)
		}
	}
	verify(t, b, model, nil)
}

func testZeroLength(t *testing.T, k kind) {
	b := k.open(t, make([]byte, k.size))
	for _, off := range []int64{0, 1, k.size} {
		if n, err := b.ReadAt(nil, off); n != 0 || err != nil {
			t.Errorf("ReadAt(nil, %d) = %d, %v", off, n, err)
		}
		if n, err := b.WriteAt([]byte{}, off); n != 0 || err != nil {
			t.Errorf("WriteAt(empty, %d) = %d, %v", off, n, err)
		}
		if err := b.WriteZeroes(off, 0); err != nil {
			t.Errorf("WriteZeroes(%d, 0) = %v", off, err)
		}
		if err := b.Discard(off, 0); err != nil {
			t.Errorf("Discard(%d, 0) = %v", off, err)
		}
	}
}

func testBounds(t *testing.T, k kind) {
	r := rng(t)
	model := randomBytes(r, int(k.size))
	b := k.open(t, model)
	size := k.size
	cases := []struct {
		name   string
		off, n int64
	}{
		{"negative offset", -1, 1},
		{"negative offset, empty", -1, 0},
		{"at end", size, 1},
		{"past end, empty", size + 1, 0},
		{"straddling end", size - 1, 2},
		{"whole plus one", 0, size + 1},
		{"far past end", 1 << 62, 4},
		{"offset+length overflows", math.MaxInt64 - 1, 4},
		{"max offset", math.MaxInt64, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := bytes.Repeat([]byte{0xA5}, int(min(c.n, 1<<20)))
			if n, err := b.ReadAt(p, c.off); n != 0 || !errors.Is(err, ErrOutOfRange) {
				t.Errorf("ReadAt(%d bytes at %d) = %d, %v; want 0, ErrOutOfRange", len(p), c.off, n, err)
			}
			if !bytes.Equal(p, bytes.Repeat([]byte{0xA5}, len(p))) {
				t.Errorf("ReadAt out of range wrote into the buffer")
			}
			if n, err := b.WriteAt(p, c.off); n != 0 || !errors.Is(err, ErrOutOfRange) {
				t.Errorf("WriteAt(%d bytes at %d) = %d, %v; want 0, ErrOutOfRange", len(p), c.off, n, err)
			}
			if err := b.WriteZeroes(c.off, c.n); !errors.Is(err, ErrOutOfRange) {
				t.Errorf("WriteZeroes(%d, %d) = %v; want ErrOutOfRange", c.off, c.n, err)
			}
			if err := b.Discard(c.off, c.n); !errors.Is(err, ErrOutOfRange) &&
				!(errors.Is(err, ErrNotSupported) && !b.Info().CanDiscard) {
				t.Errorf("Discard(%d, %d) = %v; want ErrOutOfRange", c.off, c.n, err)
			}
		})
	}
	for _, c := range []struct{ off, n int64 }{{0, -1}, {1, math.MaxInt64}, {size, math.MinInt64}} {
		if err := b.WriteZeroes(c.off, c.n); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("WriteZeroes(%d, %d) = %v; want ErrOutOfRange", c.off, c.n, err)
		}
		if err := b.Discard(c.off, c.n); !errors.Is(err, ErrOutOfRange) &&
			!(errors.Is(err, ErrNotSupported) && !b.Info().CanDiscard) {
			t.Errorf("Discard(%d, %d) = %v; want ErrOutOfRange", c.off, c.n, err)
		}
	}
	verify(t, b, model, nil) // nothing was transferred
}

func testReadOnly(t *testing.T, k kind) {
	init := randomBytes(rng(t), int(k.size))
	b, want := k.openRO(t, init)
	if !b.Info().ReadOnly {
		t.Errorf("Info().ReadOnly = false on a read-only backend")
	}
	p := randomBytes(rng(t), 8192)
	for _, off := range []int64{0, 1, k.size - int64(len(p))} {
		if n, err := b.WriteAt(p, off); n != 0 || !errors.Is(err, ErrReadOnly) {
			t.Errorf("WriteAt(%d bytes at %d) = %d, %v; want 0, ErrReadOnly", len(p), off, n, err)
		}
	}
	for _, c := range []struct{ off, n int64 }{{0, k.size}, {1, 3}, {4096, 8192}, {0, 0}} {
		if err := b.Discard(c.off, c.n); !errors.Is(err, ErrReadOnly) {
			t.Errorf("Discard(%d, %d) = %v; want ErrReadOnly", c.off, c.n, err)
		}
		if err := b.WriteZeroes(c.off, c.n); !errors.Is(err, ErrReadOnly) {
			t.Errorf("WriteZeroes(%d, %d) = %v; want ErrReadOnly", c.off, c.n, err)
		}
	}
	if err := b.Flush(); err != nil {
		t.Errorf("Flush on a read-only backend: %v", err)
	}
	verify(t, b, want, nil)
}

// testZeroing checks Discard (discard=true) or WriteZeroes on unaligned ranges: the range reads as
// zeroes afterwards (for Discard: when Info().DiscardZeroes) and everything else is untouched.
func testZeroing(t *testing.T, k kind, discard bool) {
	r := rng(t)
	b := k.open(t, make([]byte, k.size))
	info := b.Info()
	size := k.size
	cases := []struct{ off, n int64 }{
		{1000, 200_000},
		{ramChunkSize - 1, 2},
		{0, 1},
		{size - 1, 1},
		{4096, 8192},
		{3, 2*ramChunkSize + 17},
		{ramChunkSize, ramChunkSize},
		{size - 5000, 5000},
		{511, 513},
		{0, size},
	}
	for _, c := range cases {
		model := randomBytes(r, int(size))
		if _, err := b.WriteAt(model, 0); err != nil {
			t.Fatal(err)
		}
		var unknown []bool
		var err error
		if discard {
			err = b.Discard(c.off, c.n)
		} else {
			err = b.WriteZeroes(c.off, c.n)
		}
		switch {
		case discard && !info.CanDiscard:
			if !errors.Is(err, ErrNotSupported) {
				t.Fatalf("Discard(%d, %d) = %v with CanDiscard false; want ErrNotSupported", c.off, c.n, err)
			}
		case err != nil:
			t.Fatalf("[%d, +%d): %v", c.off, c.n, err)
		case discard && !info.DiscardZeroes:
			unknown = make([]bool, size) // the discarded range may read as anything
			for i := c.off; i < c.off+c.n; i++ {
				unknown[i] = true
			}
		default:
			clear(model[c.off : c.off+c.n])
		}
		verify(t, b, model, unknown)
		// The range is usable again afterwards.
		p := randomBytes(r, int(min(c.n, 70_000)))
		if _, err := b.WriteAt(p, c.off); err != nil {
			t.Fatal(err)
		}
		copy(model[c.off:], p)
		if unknown != nil {
			clear(unknown[c.off : c.off+int64(len(p))])
		}
		verify(t, b, model, unknown)
	}
}

func testClose(t *testing.T, k kind) {
	b := k.open(t, make([]byte, k.size))
	info := b.Info()
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	p := make([]byte, 512)
	if n, err := b.ReadAt(p, 0); n != 0 || !errors.Is(err, ErrClosed) {
		t.Errorf("ReadAt after Close = %d, %v; want ErrClosed", n, err)
	}
	if n, err := b.WriteAt(p, 0); n != 0 || !errors.Is(err, ErrClosed) {
		t.Errorf("WriteAt after Close = %d, %v; want ErrClosed", n, err)
	}
	if err := b.Flush(); !errors.Is(err, ErrClosed) {
		t.Errorf("Flush after Close = %v; want ErrClosed", err)
	}
	if err := b.Discard(0, 512); !errors.Is(err, ErrClosed) {
		t.Errorf("Discard after Close = %v; want ErrClosed", err)
	}
	if err := b.WriteZeroes(0, 512); !errors.Is(err, ErrClosed) {
		t.Errorf("WriteZeroes after Close = %v; want ErrClosed", err)
	}
	if err := b.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close = %v; want ErrClosed", err)
	}
	if b.Size() != k.size || b.Info() != info {
		t.Errorf("Size/Info changed after Close")
	}
}

// testConcurrent runs verifying workers on disjoint regions next to chaos workers that read,
// write, zero and discard one shared region, all at once (meant for -race).
func testConcurrent(t *testing.T, k kind) {
	const workers = 6
	b := k.open(t, make([]byte, k.size))
	canZeroByDiscard := b.Info().DiscardZeroes
	region := (k.size / (workers + 1)) &^ 4095
	const maxLen = 20_000
	var wg sync.WaitGroup
	errc := make(chan error, 64)
	fail := func(format string, args ...any) {
		select {
		case errc <- fmt.Errorf(format, args...):
		default:
		}
	}
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			base := int64(w) * region
			got := make([]byte, maxLen)
			for it := range 150 {
				n := 1 + r.IntN(maxLen)
				off := base + r.Int64N(region-int64(n))
				data := randomBytes(r, n)
				if _, err := b.WriteAt(data, off); err != nil {
					fail("worker %d: WriteAt: %v", w, err)
					return
				}
				if _, err := b.ReadAt(got[:n], off); err != nil {
					fail("worker %d: ReadAt: %v", w, err)
					return
				}
				if !bytes.Equal(got[:n], data) {
					fail("worker %d: read back [%d, +%d) differs", w, off, n)
					return
				}
				if it%10 == 0 {
					var err error
					if canZeroByDiscard && it%20 == 0 {
						err = b.Discard(off, int64(n))
					} else {
						err = b.WriteZeroes(off, int64(n))
					}
					if err != nil {
						fail("worker %d: zeroing: %v", w, err)
						return
					}
					if _, err := b.ReadAt(got[:n], off); err != nil {
						fail("worker %d: ReadAt: %v", w, err)
						return
					}
					if !bytes.Equal(got[:n], make([]byte, n)) {
						fail("worker %d: [%d, +%d) not zero after zeroing", w, off, n)
						return
					}
				}
			}
		})
	}
	shared := int64(workers) * region
	for c := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(c), 99))
			buf := make([]byte, maxLen)
			for range 150 {
				n := 1 + r.IntN(maxLen)
				off := shared + r.Int64N(k.size-shared-int64(n))
				var err error
				switch r.IntN(5) {
				case 0, 1:
					_, err = b.ReadAt(buf[:n], off)
				case 2:
					_, err = b.WriteAt(buf[:n], off)
				case 3:
					err = b.WriteZeroes(off, int64(n))
				case 4:
					if err = b.Discard(off, int64(n)); errors.Is(err, ErrNotSupported) && !b.Info().CanDiscard {
						err = nil
					}
				}
				if err != nil {
					fail("chaos %d: %v", c, err)
					return
				}
				// Readers anywhere, racing the verifying workers.
				if _, err := b.ReadAt(buf[:n], r.Int64N(k.size-int64(n))); err != nil {
					fail("chaos %d: ReadAt: %v", c, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

// testCloseWhileBusy closes the backend under concurrent I/O: every call must succeed or fail
// with ErrClosed, and nothing may crash or race.
func testCloseWhileBusy(t *testing.T, k kind) {
	b := k.open(t, make([]byte, k.size))
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for w := range 4 {
		wg.Go(func() {
			buf := alignedBuf(8192, 4096)
			for i := int64(0); ; i++ {
				off := (i * 8192 * int64(w+1)) % (k.size - 8192) &^ 4095
				var err error
				switch i % 4 {
				case 0:
					_, err = b.ReadAt(buf, off)
				case 1:
					_, err = b.WriteAt(buf, off)
				case 2:
					err = b.WriteZeroes(off+1, 5000)
				case 3:
					err = b.Flush()
				}
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					errc <- err
					return
				}
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	if err := b.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Errorf("I/O racing Close: %v (want success or ErrClosed)", err)
	}
}

// testMixedAlignment writes the same pages concurrently with aligned buffers and offsets (O_DIRECT
// where enabled) and unaligned ones (the buffered fallback), then flushes. Unserialised, that
// collision makes Linux fail the page cache invalidation after the direct write and report EIO
// on the next fdatasync.
func testMixedAlignment(t *testing.T, k kind) {
	b := k.open(t, make([]byte, k.size))
	const span = 64 << 10
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for w := range 4 {
		wg.Go(func() {
			aligned := alignedBuf(8192, 4096)
			unaligned := alignedBuf(4096+1, 4096)[1:]
			for i := range int64(200) {
				off := (i * 4096 * int64(w+1)) % (span - 8192)
				var err error
				switch (i + int64(w)) % 4 {
				case 0, 1:
					_, err = b.WriteAt(aligned, off)
				case 2:
					_, err = b.WriteAt(unaligned[:1000], off+100)
				case 3:
					_, err = b.ReadAt(unaligned[:3000], off+7)
				}
				if err != nil {
					errc <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if err := b.Flush(); err != nil {
		t.Errorf("Flush after mixed aligned/unaligned writes: %v", err)
	}
}

// testIOError fills a backend whose storage gives out: the failure must surface as an error (from
// WriteAt or at the latest from Flush) that is none of the sentinels, so the SCSI layer reports a
// MEDIUM ERROR, and a short write must say how much was written.
func testIOError(t *testing.T, k kind) {
	if k.faulty == nil {
		t.Skipf("SKIPPED: %s has no OS I/O path to fail", k.name)
	}
	b := k.faulty(t)
	buf := alignedBuf(1<<20, 4096)
	copy(buf, randomBytes(rng(t), len(buf)))
	var err error
	for off := int64(0); off+int64(len(buf)) <= b.Size(); off += int64(len(buf)) {
		var n int
		if n, err = b.WriteAt(buf, off); err != nil {
			if n >= len(buf) {
				t.Errorf("WriteAt failed with n = %d of %d", n, len(buf))
			}
			t.Logf("WriteAt at %d: n = %d: %v", off, n, err)
			break
		}
	}
	if err == nil {
		err = b.Flush()
		t.Logf("Flush: %v", err)
	}
	if err == nil {
		t.Fatal("filling a backend on a full filesystem reported no error")
	}
	if isSentinel(err) {
		t.Errorf("error %v is a sentinel; want a medium error", err)
	}
	want := k.faultErrnos
	if want == nil {
		want = []syscall.Errno{syscall.ENOSPC, syscall.EIO}
	}
	if !slices.ContainsFunc(want, func(e syscall.Errno) bool { return errors.Is(err, e) }) {
		t.Errorf("error %v: want the errno (one of %v) reachable with errors.Is", err, want)
	}
}
