package stack

import (
	"context"
	"testing"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/scsi/backend"
)

// wrapped hides the backend's optional interfaces, as the daemon's timing wrapper does.
type wrapped struct{ backend.Backend }

// TestOpenLUNALUA opens a LUN of a target with an alua section: the scsi LUN gets the target
// port group of the target's port, the peers, the LUN's own state override and its naa, and
// keeps the backend's allocation information through a wrapper.
func TestOpenLUNALUA(t *testing.T) {
	pid, _ := config.ParsePortID("0x00000000000000010000000000000002")
	tc := config.Target{Name: "gw1", PortID: pid, ALUA: &config.ALUA{Group: 1, RelativePort: 1, State: config.ALUAActiveOptimized,
		Peers: []config.ALUAPeer{{Group: 2, RelativePorts: []int{2}, State: config.ALUAActiveNonOptimized}}}}
	l := config.LUN{ID: 3, Backend: config.BackendRAM, Size: 1 << 20, BlockSize: 512,
		NAA: "6001405abcdef0123456789abcdef012", ALUAStates: []config.ALUAGroupState{{Group: 1, State: config.ALUAStandby}}}
	sl, err := OpenLUN(&tc, l, LUNOptions{Wrap: func(b backend.Backend) backend.Backend { return wrapped{b} }})
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	gs := sl.SCSI.ALUAStates()
	if len(gs) != 2 || gs[0].ID != 1 || gs[0].State != scsi.ALUAStandby || gs[0].RelativePorts[0] != 1 ||
		gs[1].ID != 2 || gs[1].State != scsi.ALUAActiveNonOptimized || gs[1].RelativePorts[0] != 2 {
		t.Fatalf("%+v", gs)
	}
	if naa := sl.SCSI.NAA(); naa[0] != 0x60 || naa[15] != 0x12 {
		t.Fatalf("NAA %x", naa)
	}
	// Through the target's port the LUN is in standby: NOT READY after the power-on UA.
	nx := scsi.Nexus{TargetPortID: pid.SRP()}
	sense := make([]byte, scsi.MaxSenseLen)
	din := make([]byte, 64)
	run := func(cdb []byte) scsi.Result {
		return sl.SCSI.Execute(context.Background(), &scsi.Command{CDB: cdb, Nexus: nx, DataIn: din, Sense: sense})
	}
	run(make([]byte, 6))
	if r := run(make([]byte, 6)); !r.Sense.Match(scsi.NotReady, 0x04, 0x0B) {
		t.Fatalf("TEST UNIT READY in standby: %v %v", r.Status, r.Sense)
	}
	// GET LBA STATUS sees the RAM backend's allocation (nothing written: deallocated)
	// through the wrapper, from a port outside the groups (not refused).
	nx = scsi.Nexus{TargetPortID: [16]byte{9}}
	run(make([]byte, 6))
	cdb := make([]byte, 16)
	cdb[0], cdb[1], cdb[13] = scsi.OpServiceActionIn16, scsi.SAGetLBAStatus, 64
	r := run(cdb)
	// one descriptor: LBA 0, 2048 blocks (1 MiB), deallocated
	if r.Status != scsi.StatusGood || r.DataInLen != 24 || din[8+10] != 0x08 || din[8+11] != 0 || din[8+12] != 1 {
		t.Fatalf("GET LBA STATUS: %v % x", r.Sense, din[:r.DataInLen])
	}
}

func TestRBDDeviceIDStable(t *testing.T) {
	a := RBDDeviceID(&config.RBD{Pool: "rbd", Image: "vm1"})
	b := RBDDeviceID(&config.RBD{Pool: "rbd", Image: "vm1", ClusterConfig: "/other/ceph.conf", Client: "client.gw2"})
	c := RBDDeviceID(&config.RBD{Pool: "rbd", Namespace: "ns", Image: "vm1"})
	d := RBDDeviceID(&config.RBD{Pool: "rb", Image: "dvm1"})
	if a != b || a == c || a == d {
		t.Fatalf("%x %x %x %x", a, b, c, d)
	}
}
