package backend

import (
	"errors"
	"path/filepath"
	"testing"
)

// allocRuns walks a whole Allocation with Allocated and returns its runs as
// [start, end, allocated] triples.
func allocRuns(t *testing.T, a Allocation, size int64) [][3]int64 {
	t.Helper()
	var runs [][3]int64
	for off := int64(0); off < size; {
		alloc, n, err := a.Allocated(off, size-off)
		if err != nil {
			t.Fatal(err)
		}
		if n <= 0 || off+n > size {
			t.Fatalf("Allocated(%d) run %d", off, n)
		}
		v := int64(0)
		if alloc {
			v = 1
		}
		if k := len(runs); k > 0 && runs[k-1][2] == v {
			t.Fatalf("Allocated(%d): two runs in the same state in a row: %v", off, runs)
		}
		runs = append(runs, [3]int64{off, off + n, v})
		off += n
	}
	return runs
}

func TestFileAllocation(t *testing.T) {
	const mib = 1 << 20
	path := filepath.Join(t.TempDir(), "lun.img")
	f, err := OpenFile(path, FileOptions{Create: true, Size: 8 * mib})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if runs := allocRuns(t, f, 8*mib); len(runs) != 1 || runs[0] != [3]int64{0, 8 * mib, 0} {
		t.Fatalf("fresh sparse file: %v", runs)
	}
	data := make([]byte, mib)
	data[0] = 1
	for _, off := range []int64{mib, 5 * mib} {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	want := [][3]int64{{0, mib, 0}, {mib, 2 * mib, 1}, {2 * mib, 5 * mib, 0}, {5 * mib, 6 * mib, 1}, {6 * mib, 8 * mib, 0}}
	runs := allocRuns(t, f, 8*mib)
	if len(runs) != len(want) {
		t.Fatalf("runs %v; want %v", runs, want)
	}
	for i := range want {
		if runs[i] != want[i] {
			t.Fatalf("runs %v; want %v", runs, want)
		}
	}
	// A run is bounded by n.
	if alloc, n, err := f.Allocated(mib, 4096); err != nil || !alloc || n != 4096 {
		t.Fatalf("bounded run: %v %d %v", alloc, n, err)
	}
	if err := f.Discard(mib, mib); err != nil {
		t.Fatal(err)
	}
	if alloc, n, err := f.Allocated(0, 5*mib); err != nil || alloc || n != 5*mib {
		t.Fatalf("after discard: %v %d %v", alloc, n, err)
	}
	used, avail, err := f.Usage()
	if err != nil || used < mib || used > 2*mib || avail <= 0 {
		t.Fatalf("Usage %d %d %v", used, avail, err)
	}
	if _, _, err := f.Allocated(8*mib, 1); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("past the end: %v", err)
	}
	f.Close()
	if _, _, err := f.Allocated(0, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed: %v", err)
	}
}

func TestRAMAllocation(t *testing.T) {
	const size = 10*ramChunkSize + 512 // a partial tail chunk
	r, err := NewRAM(size, false)
	if err != nil {
		t.Fatal(err)
	}
	if runs := allocRuns(t, r, size); len(runs) != 1 || runs[0][2] != 0 {
		t.Fatalf("fresh: %v", runs)
	}
	b := []byte{1}
	for _, off := range []int64{2*ramChunkSize + 7, 3 * ramChunkSize, 10 * ramChunkSize} {
		if _, err := r.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	want := [][3]int64{{0, 2 * ramChunkSize, 0}, {2 * ramChunkSize, 4 * ramChunkSize, 1},
		{4 * ramChunkSize, 10 * ramChunkSize, 0}, {10 * ramChunkSize, size, 1}}
	if runs := allocRuns(t, r, size); len(runs) != len(want) || runs[0] != want[0] || runs[1] != want[1] ||
		runs[2] != want[2] || runs[3] != want[3] {
		t.Fatalf("runs %v; want %v", runs, want)
	}
	used, avail, err := r.Usage()
	if err != nil || used != 2*ramChunkSize+512 || avail != size-used {
		t.Fatalf("Usage %d %d %v", used, avail, err)
	}
	// Discarding a whole chunk deallocates it; zeroing part of one does not.
	if err := r.Discard(2*ramChunkSize, ramChunkSize); err != nil {
		t.Fatal(err)
	}
	if err := r.Discard(3*ramChunkSize, 100); err != nil {
		t.Fatal(err)
	}
	if alloc, n, _ := r.Allocated(0, size); alloc || n != 3*ramChunkSize {
		t.Fatalf("after discard: %v %d", alloc, n)
	}
	if alloc, n, _ := r.Allocated(3*ramChunkSize+5, 10); !alloc || n != 10 {
		t.Fatalf("partly zeroed chunk: %v %d", alloc, n)
	}
}
