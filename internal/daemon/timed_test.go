package daemon

import (
	"testing"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/scsi/backend"
)

// TestTimedWrappersKeepOptionalInterfaces: the metrics wrapper of a LUN's backend passes on
// what embedding an interface would hide: a RAM LUN stays backend.Nonblocking (so the target
// executes its commands inline). (NBD exports are timed through nbd.ExportOptions.Observe, not
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
		_ = l.Close()
	}
}
