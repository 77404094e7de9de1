//go:build rbd && cgo

package stack

import (
	"context"
	"encoding/binary"
	"os"
	"testing"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/scsi"
)

// TestRBDSharedPR: two gateways (two targets with ALUA groups 1 and 2, each opening the test
// cluster's image with its own librbd client) are one logical unit for persistent reservations:
// REGISTER through gateway 1, REGISTER and RESERVE (Write Exclusive - Registrants Only)
// through gateway 2, a WRITE from an unregistered nexus through gateway 1 gets RESERVATION
// CONFLICT, READ FULL STATUS through either lists both nexuses with their relative target
// ports; after RELEASE through gateway 2 the WRITE through gateway 1 is allowed. The state
// travels through the image's RADOS object (compare-and-swap, watch/notify).
func TestRBDSharedPR(t *testing.T) {
	conf, pool, image := os.Getenv("SRPD_CEPH_CONF"), os.Getenv("SRPD_CEPH_POOL"), os.Getenv("SRPD_CEPH_IMAGE")
	if conf == "" || pool == "" || image == "" {
		t.Skip("SKIPPED: no Ceph cluster: SRPD_CEPH_CONF, SRPD_CEPH_POOL and SRPD_CEPH_IMAGE are not set " +
			"(`make test-ceph` starts one with scripts/ceph-cluster.sh and sets them)")
	}
	states := []string{config.ALUAActiveOptimized, config.ALUAActiveNonOptimized}
	var gws [2]*LUN
	var ports [2][16]byte
	for i := range 2 {
		tc := config.Target{Name: []string{"gw1", "gw2"}[i], PortID: config.MakePortID(uint64(i+1), 0x77),
			ALUA: &config.ALUA{Group: i + 1, RelativePort: i + 1, State: states[i],
				Peers: []config.ALUAPeer{{Group: 2 - i, RelativePorts: []int{2 - i}, State: states[1-i]}}}}
		l := config.LUN{ID: 0, Backend: config.BackendRBD, BlockSize: 512, NAA: "6001405a1b2c3d4e5f60718293a4b5c6",
			RBD: &config.RBD{ClusterConfig: conf, Pool: pool, Image: image}}
		sl, err := OpenLUN(&tc, l, LUNOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sl.Close() })
		gws[i], ports[i] = sl, tc.PortID.SRP()
	}
	nexus := func(ini byte, gw int) scsi.Nexus {
		return scsi.Nexus{InitiatorPortID: [16]byte{ini}, TargetPortID: ports[gw]}
	}
	run := func(gw int, n scsi.Nexus, cdb, out []byte, in int) (scsi.Result, []byte) {
		cmd := &scsi.Command{CDB: cdb, Nexus: n, DataOut: out, Sense: make([]byte, scsi.MaxSenseLen)}
		if in > 0 {
			cmd.DataIn = make([]byte, in)
		}
		r := gws[gw].SCSI.Execute(context.Background(), cmd)
		return r, cmd.DataIn[:r.DataInLen]
	}
	must := func(what string, gw int, n scsi.Nexus, cdb, out []byte, want scsi.Status) {
		t.Helper()
		if r, _ := run(gw, n, cdb, out, 0); r.Status != want {
			t.Fatalf("%s through gateway %d: %v %v, want %v", what, gw+1, r.Status, r.Sense, want)
		}
	}
	prOut := func(sa, typ uint8, key, saKey uint64) ([]byte, []byte) {
		c := make([]byte, 10)
		c[0], c[1], c[2] = 0x5F, sa, typ
		binary.BigEndian.PutUint32(c[5:], 24)
		p := make([]byte, 24)
		binary.BigEndian.PutUint64(p[0:], key)
		binary.BigEndian.PutUint64(p[8:], saKey)
		return c, p
	}
	i1a, i1b, i2a := nexus(0xA1, 0), nexus(0xA1, 1), nexus(0xB2, 0)
	for _, x := range []struct {
		gw int
		n  scsi.Nexus
	}{{0, i1a}, {1, i1b}, {0, i2a}} {
		for range 4 { // unit attentions of the power-on
			if r, _ := run(x.gw, x.n, make([]byte, 6), nil, 0); r.Status == scsi.StatusGood {
				break
			}
		}
	}
	// A clean slate (the image may keep a state from an earlier run): CLEAR through a fresh
	// registration.
	c, p := prOut(0x06, 0, 0, 0x99) // REGISTER AND IGNORE EXISTING KEY
	must("REGISTER AND IGNORE", 0, i1a, c, p, scsi.StatusGood)
	c, p = prOut(0x03, 0, 0x99, 0) // CLEAR
	must("CLEAR", 0, i1a, c, p, scsi.StatusGood)

	c, p = prOut(0x00, 0, 0, 0x11)
	must("REGISTER", 0, i1a, c, p, scsi.StatusGood)
	must("REGISTER", 1, i1b, c, p, scsi.StatusGood)
	c, p = prOut(0x01, 0x05, 0x11, 0) // RESERVE Write Exclusive - Registrants Only
	must("RESERVE", 1, i1b, c, p, scsi.StatusGood)
	write := make([]byte, 16)
	write[0], write[13] = 0x8A, 1
	must("WRITE from an unregistered nexus", 0, i2a, write, make([]byte, 512), scsi.StatusReservationConflict)
	must("WRITE from a registrant", 0, i1a, write, make([]byte, 512), scsi.StatusGood)
	for gw, n := range []scsi.Nexus{i1a, i1b} {
		cdb := make([]byte, 10)
		cdb[0], cdb[1] = 0x5E, 0x03 // READ FULL STATUS
		binary.BigEndian.PutUint16(cdb[7:], 1024)
		r, d := run(gw, n, cdb, nil, 1024)
		if r.Status != scsi.StatusGood || len(d) != 8+2*48 {
			t.Fatalf("READ FULL STATUS through gateway %d: %v % x", gw+1, r.Status, d)
		}
		for k, want := range []struct {
			rtp    uint16
			holder bool
		}{{1, false}, {2, true}} {
			e := d[8+48*k:]
			if binary.BigEndian.Uint64(e) != 0x11 || binary.BigEndian.Uint16(e[18:]) != want.rtp || e[32] != 0xA1 || (e[12]&1 == 1) != want.holder {
				t.Fatalf("READ FULL STATUS through gateway %d, descriptor %d: % x", gw+1, k, e[:48])
			}
		}
	}
	c, p = prOut(0x02, 0x05, 0x11, 0) // RELEASE
	must("RELEASE", 1, i1b, c, p, scsi.StatusGood)
	must("WRITE after the release", 0, i2a, write, make([]byte, 512), scsi.StatusGood)
	c, p = prOut(0x03, 0, 0x11, 0) // CLEAR: leave the image clean
	must("CLEAR", 1, i1b, c, p, scsi.StatusGood)
}
