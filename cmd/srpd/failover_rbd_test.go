//go:build rbd && cgo

package main

import (
	"fmt"
	"os"
	"testing"

	"github.com/srpd/srpd/internal/testutil"
)

// With -tags rbd the binaries these tests run are built with it too.
func init() { bins.Tags = "rbd" }

// TestRBDMultipathFailover is TestMultipathFailover on an RBD image of the test cluster (`make
// test-ceph` exports SRPD_CEPH_*): both gateways open the image through librbd; when the
// killed gateway held its exclusive lock, the other takes it over once the cluster has noticed
// the dead client (the test cluster's osd_client_watch_timeout).
func TestRBDMultipathFailover(t *testing.T) {
	conf, pool, image := os.Getenv("SRPD_CEPH_CONF"), os.Getenv("SRPD_CEPH_POOL"), os.Getenv("SRPD_CEPH_IMAGE")
	if conf == "" || pool == "" || image == "" {
		t.Skip("SKIPPED: no Ceph cluster: SRPD_CEPH_CONF, SRPD_CEPH_POOL and SRPD_CEPH_IMAGE are not set " +
			"(`make test-ceph` starts one with scripts/ceph-cluster.sh and sets them)")
	}
	dir := testutil.ShortTempDir(t, "srpd-mprbd-")
	lun := fmt.Sprintf("{id: 0, backend: rbd, block_size: 512, naa: %s, rbd: {cluster_config: %s, pool: %s, image: %s}}",
		failoverNAA, conf, pool, image)
	multipathFailover(t, dir, lun)
}
