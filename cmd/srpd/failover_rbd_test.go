//go:build rbd && cgo

package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/initiator"
	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/stack"
	"github.com/srpd/srpd/internal/testutil"
)

// With -tags rbd the binaries these tests run are built with it too.
func init() { bins.Tags = "rbd" }

// TestRBDMultipathFailover is TestMultipathFailover on an RBD image of the test cluster (`make
// test-ceph` exports SRPD_CEPH_*): both gateways open the image through librbd with the
// managed exclusive lock (the default). gw1 owns it when it is killed; gw2's first write after
// the failover breaks it, blocklisting gw1's client; after the failback the restarted gw1
// takes it back from gw2 the same way. Both takeovers are in the gateways' logs.
func TestRBDMultipathFailover(t *testing.T) {
	conf, pool, image := os.Getenv("SRPD_CEPH_CONF"), os.Getenv("SRPD_CEPH_POOL"), os.Getenv("SRPD_CEPH_IMAGE")
	if conf == "" || pool == "" || image == "" {
		t.Skip("SKIPPED: no Ceph cluster: SRPD_CEPH_CONF, SRPD_CEPH_POOL and SRPD_CEPH_IMAGE are not set " +
			"(`make test-ceph` starts one with scripts/ceph-cluster.sh and sets them)")
	}
	dir := testutil.ShortTempDir(t, "srpd-mprbd-")
	lun := fmt.Sprintf("{id: 0, backend: rbd, block_size: 512, naa: %s, rbd: {cluster_config: %s, pool: %s, image: %s}}",
		failoverNAA, conf, pool, image)
	gws := multipathFailover(t, dir, lun)
	const over = `took the image's exclusive lock over: the previous owner was blocklisted`
	for i, gw := range gws {
		log := gw.stderr.String()
		if !strings.Contains(log, over) || !strings.Contains(log, `"owners_broken":1`) {
			t.Errorf("gw%d did not take the exclusive lock over (breaking the other's):\n%s", i+1, tail(log, 40))
		}
	}
}

// TestRBDSharedPRThroughGateways: two srpd gateway processes export one RBD image of the test
// cluster (ALUA groups 1 and 2, one naa); SRP initiators log in to both over softroce and send
// PERSISTENT RESERVE commands through their sessions: I1 registers through gateway 1, then
// registers and reserves (Write Exclusive - Registrants Only) through gateway 2; a WRITE from
// I2 (not registered) through gateway 1 gets RESERVATION CONFLICT; READ FULL STATUS through
// gateway 1 lists both of I1's nexuses with their relative target ports (1, 2). The state
// goes between the two processes through the image's RADOS object.
func TestRBDSharedPRThroughGateways(t *testing.T) {
	conf, pool, image := os.Getenv("SRPD_CEPH_CONF"), os.Getenv("SRPD_CEPH_POOL"), os.Getenv("SRPD_CEPH_IMAGE")
	if conf == "" || pool == "" || image == "" {
		t.Skip("SKIPPED: no Ceph cluster: SRPD_CEPH_CONF, SRPD_CEPH_POOL and SRPD_CEPH_IMAGE are not set " +
			"(`make test-ceph` starts one with scripts/ceph-cluster.sh and sets them)")
	}
	binaries(t)
	dir := testutil.ShortTempDir(t, "srpd-prrbd-")
	udp := testutil.FreeUDPPort(t)
	lun := fmt.Sprintf("{id: 0, backend: rbd, block_size: 512, naa: %s, rbd: {cluster_config: %s, pool: %s, image: %s}}",
		failoverNAA, conf, pool, image)
	for i := range 2 {
		nd := filepath.Join(dir, fmt.Sprintf("n%d", i))
		if err := os.MkdirAll(nd, 0o700); err != nil {
			t.Fatal(err)
		}
		n := newNotifySocket(t, nd)
		startDaemon(t, writeConfig(t, dir, fmt.Sprintf("gw%d.yaml", i+1), gatewayConfig(dir, i, udp, lun)), n)
		n.wait(t, "READY=1", 60*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tr, err := stack.OpenTransport(ctx, config.Transport{Name: "i", Driver: config.DriverSoftRoCE, Address: "127.0.0.1", UDPPort: udp},
		stack.TransportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close(context.Background())
	// lunVia logs initiator (extension ext) in to gateway gw (0, 1) and returns its LUN 0.
	lunVia := func(ext uint64, gw int) *initiator.LUN {
		s, err := stack.Dial(ctx, config.Session{Name: fmt.Sprintf("i%d-gw%d", ext, gw+1), Address: fmt.Sprintf("127.0.0.%d", 2+gw),
			Port: 5555, TargetPortID: config.MakePortID(uint64(gw+1), 0x77), InitiatorExt: config.ID64(ext),
			ConnectTimeout: config.Duration(10 * time.Second)}, tr, stack.SessionOptions{})
		if err != nil {
			t.Fatalf("initiator %d to gateway %d: %v", ext, gw+1, err)
		}
		t.Cleanup(func() { s.Close(context.Background()) })
		return s.LUN(0)
	}
	i1g1, i1g2, i2g1 := lunVia(1, 0), lunVia(1, 1), lunVia(2, 0)
	prOut := func(l *initiator.LUN, sa, typ uint8, key, saKey uint64) error {
		c := make([]byte, 10)
		c[0], c[1], c[2] = 0x5F, sa, typ
		binary.BigEndian.PutUint32(c[5:], 24)
		p := make([]byte, 24)
		binary.BigEndian.PutUint64(p[0:], key)
		binary.BigEndian.PutUint64(p[8:], saKey)
		_, err := l.Command(ctx, c, nil, p)
		return err
	}
	mustPR := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	mustPR("REGISTER AND IGNORE (a clean slate)", prOut(i1g1, 0x06, 0, 0, 0x99))
	mustPR("CLEAR", prOut(i1g1, 0x03, 0, 0x99, 0))
	mustPR("REGISTER I1 through gateway 1", prOut(i1g1, 0x00, 0, 0, 0x11))
	mustPR("REGISTER I1 through gateway 2", prOut(i1g2, 0x00, 0, 0, 0x11))
	mustPR("RESERVE through gateway 2", prOut(i1g2, 0x01, 0x05, 0x11, 0))
	err = i2g1.WriteAt(ctx, make([]byte, 512), 0, false)
	if !errors.Is(err, initiator.ErrReservationConflict) {
		t.Fatalf("WRITE from unregistered I2 through gateway 1: %v, want a reservation conflict", err)
	}
	if err := i1g1.WriteAt(ctx, make([]byte, 512), 0, false); err != nil {
		t.Fatalf("WRITE from registered I1 through gateway 1: %v", err)
	}
	cdb := make([]byte, 10)
	cdb[0], cdb[1] = 0x5E, 0x03 // READ FULL STATUS
	binary.BigEndian.PutUint16(cdb[7:], 1024)
	d := make([]byte, 1024)
	n, err := i2g1.Command(ctx, cdb, d, nil)
	if err != nil || n != 8+2*48 {
		t.Fatalf("READ FULL STATUS through gateway 1: %d bytes, %v", n, err)
	}
	var rtps []uint16
	for k := range 2 {
		e := d[8+48*k:]
		if binary.BigEndian.Uint64(e) != 0x11 {
			t.Fatalf("descriptor %d: key %x", k, e[:8])
		}
		rtps = append(rtps, binary.BigEndian.Uint16(e[18:]))
	}
	if rtps[0] != 1 || rtps[1] != 2 {
		t.Fatalf("relative target ports %v, want [1 2]", rtps)
	}
	mustPR("RELEASE through gateway 2", prOut(i1g2, 0x02, 0x05, 0x11, 0))
	if err := i2g1.WriteAt(ctx, make([]byte, 512), 0, false); err != nil {
		t.Fatalf("WRITE from I2 after the release: %v", err)
	}
	mustPR("CLEAR", prOut(i1g2, 0x03, 0, 0x11, 0))
}
