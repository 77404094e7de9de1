package daemon

import (
	"path/filepath"
	"testing"

	"github.com/srpd/srpd/scsi/backend"
)

// The timing wrapper keeps what the LUN relies on: a RAM backend's views (backend.Viewer)
// pass through, timed as reads; a backend without them lends nothing through the wrapper.
func TestTimedBackendViews(t *testing.T) {
	ram, err := backend.NewRAM(1<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	if _, err := ram.WriteAt([]byte("lent"), 4096); err != nil {
		t.Fatal(err)
	}
	var times ioTimes
	var be backend.Backend = &timedBackend{Backend: ram, t: &times}
	v, ok := be.(backend.Viewer)
	if !ok {
		t.Fatal("the wrapper hides backend.Viewer")
	}
	views := make([][]byte, 0, 2)
	k, ok, err := v.ViewAt(views, 4096, 4)
	if err != nil || !ok || k != 1 || string(views[:1][0]) != "lent" {
		t.Fatalf("ViewAt through the wrapper: %d, %v, %v", k, ok, err)
	}
	if s := times.read.snapshot(); s.Count() != 1 {
		t.Fatalf("%d reads timed, want 1", s.Count())
	}

	f, err := backend.OpenFile(filepath.Join(t.TempDir(), "f"), backend.FileOptions{Create: true, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tf := &timedBackend{Backend: f, t: &times}
	if k, ok, err := tf.ViewAt(views, 0, 4); ok || k != 0 || err != nil {
		t.Fatalf("a file backend lent views through the wrapper: %d, %v, %v", k, ok, err)
	}
}
