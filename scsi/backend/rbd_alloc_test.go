//go:build rbd && cgo

package backend

import "testing"

// TestRBDAllocation checks Allocated and Usage on a fresh image: nothing allocated, then the
// objects written to (4 MiB, the default object size) and nothing else.
func TestRBDAllocation(t *testing.T) {
	const obj = 4 << 20
	c := testCluster(t)
	r := c.open(t, c.opts(c.newImage(t, 8*obj)))
	if runs := allocRuns(t, r, 8*obj); len(runs) != 1 || runs[0] != [3]int64{0, 8 * obj, 0} {
		t.Fatalf("fresh image: %v", runs)
	}
	b := []byte{1}
	for _, off := range []int64{obj + 5, 2 * obj, 6*obj + 100} {
		if _, err := r.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	want := [][3]int64{{0, obj, 0}, {obj, 3 * obj, 1}, {3 * obj, 6 * obj, 0}, {6 * obj, 7 * obj, 1}, {7 * obj, 8 * obj, 0}}
	runs := allocRuns(t, r, 8*obj)
	if len(runs) != len(want) {
		t.Fatalf("runs %v; want %v", runs, want)
	}
	for i := range want {
		if runs[i] != want[i] {
			t.Fatalf("runs %v; want %v", runs, want)
		}
	}
	if used, avail, err := r.Usage(); err != nil || used != 3*obj || avail != -1 {
		t.Fatalf("Usage %d %d %v", used, avail, err)
	}
	if alloc, n, err := r.Allocated(obj+obj/2, 10); err != nil || !alloc || n != 10 {
		t.Fatalf("bounded: %v %d %v", alloc, n, err)
	}
}
