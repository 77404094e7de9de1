package daemon

import (
	"context"
	"testing"

	"github.com/srpd/srpd/initiator/nbd"
	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/scsi/backend"
)

// TestTimedWrappersKeepOptionalInterfaces: the metrics wrappers pass on what embedding an
// interface would hide: a RAM LUN stays backend.Nonblocking (so the target executes its
// commands inline), and an NBD export keeps its block status.
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
		l, err := openLUN(tc, tt.lun, nil)
		if err != nil {
			t.Fatal(err)
		}
		nb, ok := l.SCSI.Backend().(backend.Nonblocking)
		if got := ok && nb.Nonblocking(); got != tt.want {
			t.Errorf("%s LUN: Nonblocking %v, want %v", tt.lun.Backend, got, tt.want)
		}
		_ = l.Close()
	}
	var d nbd.Device = &timedDevice{Device: statusDevice{}, t: &ioTimes{}}
	bs, ok := d.(nbd.BlockStatuser)
	if !ok {
		t.Fatal("timedDevice is not an nbd.BlockStatuser")
	}
	exts, err := bs.BlockStatus(context.Background(), 0, 8192)
	if err != nil || len(exts) != 2 || !exts[1].Hole {
		t.Fatalf("BlockStatus through the wrapper: %+v %v", exts, err)
	}
}

// statusDevice is an nbd.Device of 8 KiB whose second 4 KiB are a hole.
type statusDevice struct{ nbd.Device }

func (statusDevice) BlockStatus(context.Context, int64, int64) ([]nbd.Extent, error) {
	return []nbd.Extent{{Length: 4096}, {Length: 4096, Hole: true}}, nil
}
