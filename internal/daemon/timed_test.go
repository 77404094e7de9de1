package daemon

import (
	"testing"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/scsi/backend"
)

// TestTimedWrappersKeepOptionalInterfaces: the metrics wrapper of a LUN's backend passes on
// what embedding an interface would hide: a RAM LUN stays backend.Nonblocking (so the target
// executes its commands inline) and lends its memory (backend.Viewer: READs sent as it lies);
// a file LUN is neither. (NBD exports are timed through nbd.ExportOptions.Observe, not
// a wrapper; TestNBDMapSparseFileLUN in cmd/srpd checks their block status.)
func TestTimedWrappersKeepOptionalInterfaces(t *testing.T) {
	tc := &config.Target{Name: "t"}
	for _, tt := range []struct {
		lun  config.LUN
		want bool
	}{
		{config.LUN{ID: 0, Backend: config.BackendRAM, Size: 1 << 20}, true},
		{config.LUN{ID: 1, Backend: config.BackendFile, Path: t.TempDir() + "/f.img", Create: true, Size: 1 << 20}, false},
	} {
		tt.lun.SetDefaults()
		l, err := openLUN(tc, tt.lun, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		nb, ok := l.SCSI.Backend().(backend.Nonblocking)
		if got := ok && nb.Nonblocking(); got != tt.want {
			t.Errorf("%s LUN: Nonblocking %v, want %v", tt.lun.Backend, got, tt.want)
		}
		if v, ok := l.SCSI.Backend().(backend.Viewer); !ok {
			t.Errorf("%s LUN: the wrapper hides backend.Viewer", tt.lun.Backend)
		} else if _, lent, err := v.ViewAt(make([][]byte, 0, 2), 0, 4096); lent != tt.want || err != nil {
			t.Errorf("%s LUN: ViewAt lent %v (%v), want %v", tt.lun.Backend, lent, err, tt.want)
		}
		_ = l.Close()
	}
}

// A view through the wrapper is the RAM's memory, and is timed as a read.
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
	tb := &timedBackend{Backend: ram, t: &times}
	views := make([][]byte, 0, 2)
	k, ok, err := tb.ViewAt(views, 4096, 4)
	if err != nil || !ok || k != 1 || string(views[:1][0]) != "lent" {
		t.Fatalf("ViewAt through the wrapper: %d, %v, %v", k, ok, err)
	}
	if s := times.read.snapshot(); s.Count() != 1 {
		t.Fatalf("%d reads timed, want 1", s.Count())
	}
}
