package main

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
)

// TestMultiQueueDaemons: a target daemon and an initiator daemon (two addresses, as two
// hosts), both with two softroce receive queues; the session's two channels land on the two
// queues at both ends (each queue carries packets; the target's second queue never receives
// another queue's packet, as the CM pairs the queues), and verified I/O passes through the
// NBD export.
func TestMultiQueueDaemons(t *testing.T) {
	if !loopbackAddr(t, "127.0.0.2") {
		t.Skip("SKIPPED: 127.0.0.2 is not usable on this host")
	}
	dirT := testutil.ShortTempDir(t, "srpd-t-")
	dirI := testutil.ShortTempDir(t, "srpd-i-")
	udp := testutil.FreeUDPPort(t)
	metrics := testutil.FreeTCPPort(t)
	nbdSock := filepath.Join(dirI, "c1.nbd")
	cfgT := filepath.Join(dirT, "srpd.yaml")
	cfgI := filepath.Join(dirI, "srpd.yaml")
	writeFile(t, cfgT, fmt.Sprintf(`version: 1
transports:
  - {name: lo, address: 127.0.0.1, udp_port: %d, queues: 2}
targets:
  - name: t1
    port_id: %s
    cm_port: 5555
    luns:
      - {id: 0, backend: ram, size: 8MiB}
    acls:
      - initiator: "*"
control: {socket: %s/ctl.sock}
metrics: {listen: 127.0.0.1:%d}
`, udp, t1PortID, dirT, metrics))
	writeFile(t, cfgI, fmt.Sprintf(`version: 1
transports:
  - {name: lo, address: 127.0.0.2, udp_port: %d, queues: 2}
sessions:
  - name: c1
    address: 127.0.0.1
    port: 5555
    target_port_id: %s
    initiator_ext: 0x1
    ch_count: 2
    reconnect_delay: 1s
    nbd:
      - {lun: 0, socket: %s}
control: {socket: %s/ctl.sock}
`, udp, t1PortID, nbdSock, dirI))
	nT := newNotifySocket(t, dirT)
	startDaemon(t, cfgT, nT)
	nT.wait(t, "READY=1", 60*time.Second)
	nI := newNotifySocket(t, dirI)
	startDaemon(t, cfgI, nI)
	nI.wait(t, "READY=1", 60*time.Second)
	sockI := filepath.Join(dirI, "ctl.sock")
	waitFor(t, 30*time.Second, "c1 logged in with 2 channels", func() bool {
		var c ctlapi.ConnectionInfo
		mustSrpctl(t, sockI, &c, "-o", "json", "connections", "c1")
		return c.State == ctlapi.StateRunning && c.Channels == 2
	})
	nc, err := dialNBD(nbdSock, "")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	model := make([]byte, nc.Size)
	rng := rand.New(rand.NewPCG(19, 19))
	randomWrites(t, nc, model, rng, 64)
	verifyAll(t, nc, model)

	m := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics))
	q := func(metric string, queue int) uint64 {
		re := regexp.MustCompile(fmt.Sprintf(`(?m)^%s\{queue="%d",transport="lo"\} (\d+)$`, metric, queue))
		mm := re.FindStringSubmatch(m)
		if mm == nil {
			t.Fatalf("no %s for queue %d in the metrics:\n%s", metric, queue, m)
		}
		v, _ := strconv.ParseUint(mm[1], 10, 64)
		return v
	}
	for i := range 2 {
		if rx, tx := q("srpd_softroce_queue_rx_packets_total", i), q("srpd_softroce_queue_tx_packets_total", i); rx < 100 || tx < 100 {
			t.Errorf("target queue %d: %d packets received, %d sent; the channels should use both queues", i, rx, tx)
		}
	}
	if f := q("srpd_softroce_queue_forwarded_total", 1); f != 0 {
		t.Errorf("target queue 1 handed %d packets over: the queues should pair", f)
	}
}
