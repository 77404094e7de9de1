package backend

import (
	"bytes"
	"errors"
	"path/filepath"
	"sync"
	"testing"
)

func TestNewRAMInvalidSize(t *testing.T) {
	for _, size := range []int64{0, -1, (ramMaxChunks + 1) << ramChunkShift} {
		if _, err := NewRAM(size, false); !errors.Is(err, ErrInvalidSize) {
			t.Errorf("NewRAM(%d) = %v; want ErrInvalidSize", size, err)
		}
	}
}

func TestRAMSparse(t *testing.T) {
	const size = 8*ramChunkSize + 100 // chunk 8 is a 100-byte tail
	r, err := NewRAM(size, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	want := func(n int) {
		t.Helper()
		if got := r.allocatedChunks(); got != n {
			t.Fatalf("%d chunks allocated, want %d", got, n)
		}
	}

	// Reading never-written memory returns zeroes and allocates nothing.
	buf := bytes.Repeat([]byte{0xFF}, size)
	if _, err := r.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, make([]byte, size)) {
		t.Fatal("fresh RAM does not read as zeroes")
	}
	want(0)

	// A write allocates exactly the chunks it touches.
	if _, err := r.WriteAt([]byte{1}, 2*ramChunkSize+5); err != nil {
		t.Fatal(err)
	}
	want(1)
	if _, err := r.WriteAt(make([]byte, 10), 4*ramChunkSize-5); err != nil { // chunks 3 and 4
		t.Fatal(err)
	}
	want(3)

	// Discarding a whole chunk frees it; a partial discard keeps (and zeroes part of) it.
	if err := r.Discard(2*ramChunkSize, ramChunkSize); err != nil {
		t.Fatal(err)
	}
	want(2)
	if err := r.Discard(3*ramChunkSize+1, ramChunkSize); err != nil { // partial 3, partial 4
		t.Fatal(err)
	}
	want(2)
	if err := r.WriteZeroes(3*ramChunkSize, 2*ramChunkSize); err != nil {
		t.Fatal(err)
	}
	want(0)

	// The partial tail chunk is freed when the range runs to the end of the backend.
	if _, err := r.WriteAt([]byte{7}, size-1); err != nil {
		t.Fatal(err)
	}
	want(1)
	if err := r.Discard(size-50, 50); err != nil { // part of the tail: kept, zeroed
		t.Fatal(err)
	}
	want(1)
	if err := r.Discard(8*ramChunkSize, 100); err != nil {
		t.Fatal(err)
	}
	want(0)

	// Partial zeroing zeroes exactly the range.
	pattern := bytes.Repeat([]byte{0xAB}, 3*ramChunkSize)
	if _, err := r.WriteAt(pattern, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteZeroes(100, 2*ramChunkSize); err != nil {
		t.Fatal(err)
	}
	want(2) // chunk 1 dropped, 0 and 2 partially zeroed
	got := make([]byte, 3*ramChunkSize)
	if _, err := r.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	exp := bytes.Clone(pattern)
	clear(exp[100 : 100+2*ramChunkSize])
	if !bytes.Equal(got, exp) {
		t.Fatal("partial zeroing: content differs")
	}

	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	want(0) // Close drops the memory
}

// TestRAMNoAllocs checks that ReadAt and WriteAt do not allocate once the chunks exist, and that
// ReadAt of never-written memory does not allocate at all.
func TestRAMNoAllocs(t *testing.T) {
	r, err := NewRAM(1<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	buf := make([]byte, 4096)
	if a := testing.AllocsPerRun(100, func() { r.ReadAt(buf, 8192) }); a != 0 {
		t.Errorf("ReadAt of unwritten memory: %v allocs/op", a)
	}
	r.WriteAt(buf, ramChunkSize-2048) // allocate chunks 0 and 1
	if a := testing.AllocsPerRun(100, func() { r.WriteAt(buf, ramChunkSize-2048) }); a != 0 {
		t.Errorf("WriteAt: %v allocs/op", a)
	}
	if a := testing.AllocsPerRun(100, func() { r.ReadAt(buf, ramChunkSize-2048) }); a != 0 {
		t.Errorf("ReadAt: %v allocs/op", a)
	}
}

// TestRAMDiscardRacesWrite hammers one chunk with writers and discarders: under -race this checks
// the chunk locking, and afterwards every byte must be either what a writer wrote or zero.
func TestRAMDiscardRacesWrite(t *testing.T) {
	r, err := NewRAM(2*ramChunkSize, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			p := bytes.Repeat([]byte{0x5A}, 3000)
			buf := make([]byte, 3000)
			for i := range 2000 {
				off := int64((i*997 + w*5000) % (ramChunkSize - 3000))
				switch (i + w) % 3 {
				case 0:
					r.WriteAt(p, off)
				case 1:
					r.Discard(0, ramChunkSize)
				case 2:
					r.ReadAt(buf, off)
					for _, c := range buf {
						if c != 0 && c != 0x5A {
							t.Errorf("read %#x: neither written nor zero", c)
							return
						}
					}
				}
			}
		})
	}
	wg.Wait()
}

// TestNonblocking: RAM says it never waits; a file backend (pread/pwrite) does not claim it.
func TestNonblocking(t *testing.T) {
	r, err := NewRAM(ramChunkSize, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var b Backend = r
	if nb, ok := b.(Nonblocking); !ok || !nb.Nonblocking() {
		t.Errorf("RAM: Nonblocking implemented %v; want implemented and true", ok)
	}
	f, err := OpenFile(filepath.Join(t.TempDir(), "lun.img"), FileOptions{Create: true, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b = f
	if nb, ok := b.(Nonblocking); ok && nb.Nonblocking() {
		t.Error("file backend says it is Nonblocking")
	}
}

// TestRAMViewAt: the views of a range hold its bytes (written chunks lent as they lie, never
// written ones as zeroes), one per chunk, without allocating; a range needing more views than
// there is room for lends nothing; a discard or write after the views were taken never makes
// them show another range's data; errors are ReadAt's.
func TestRAMViewAt(t *testing.T) {
	r, err := NewRAM(4*ramChunkSize, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	data := make([]byte, 2*ramChunkSize)
	for i := range data {
		data[i] = byte(i*7 + 1)
	}
	if _, err := r.WriteAt(data, ramChunkSize); err != nil { // chunks 1 and 2
		t.Fatal(err)
	}
	views := make([][]byte, 0, 4)
	off, n := int64(ramChunkSize/2), 3*ramChunkSize // chunk 0 (zeroes) .. chunk 3 (zeroes)
	k, ok, err := r.ViewAt(views, off, n)
	if err != nil || !ok || k != 4 {
		t.Fatalf("ViewAt: %d views, ok %v, %v; want 4, true", k, ok, err)
	}
	want := make([]byte, n)
	if _, err := r.ReadAt(want, off); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for _, v := range views[:k] {
		got = append(got, v...)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("views differ from ReadAt")
	}
	if &views[:k][1][0] != &r.chunks[1].Load().data[0] {
		t.Fatal("a written chunk was copied, not lent")
	}
	if a := testing.AllocsPerRun(100, func() { r.ViewAt(views, off, n) }); a != 0 {
		t.Errorf("ViewAt: %v allocs/op", a)
	}
	if _, ok, err := r.ViewAt(views[:0:3], off, n); ok || err != nil {
		t.Fatalf("4 pieces into room for 3: ok %v, %v; want false, nil", ok, err)
	}

	// Taken, then the range is discarded and written again: the views keep the old bytes
	// (the new write goes to a new chunk), never anything else.
	k, _, _ = r.ViewAt(views, ramChunkSize, ramChunkSize)
	v := views[:k]
	old := append([]byte(nil), v[0]...)
	if err := r.Discard(ramChunkSize, ramChunkSize); err != nil {
		t.Fatal(err)
	}
	if _, err := r.WriteAt(bytes.Repeat([]byte{0xee}, ramChunkSize), ramChunkSize); err != nil {
		t.Fatal(err)
	}
	if k != 1 || !bytes.Equal(v[0], old) {
		t.Fatal("a view changed after its chunk was discarded and the range written anew")
	}

	if _, _, err := r.ViewAt(views, 4*ramChunkSize-10, 11); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("past the end: %v, want ErrOutOfRange", err)
	}
}
