//go:build rbd && cgo

package daemon

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/testutil"
	"github.com/srpd/srpd/scsi/backend"
)

// TestRBDLUNThroughNBD: srpd with an rbd LUN on the image of the test cluster (`make test-ceph`
// exports SRPD_CEPH_*) and an initiator session exporting it over NBD: a write through the
// export, read back through it, is in the image (read with a separate librbd handle).
func TestRBDLUNThroughNBD(t *testing.T) {
	conf, pool, image := os.Getenv("SRPD_CEPH_CONF"), os.Getenv("SRPD_CEPH_POOL"), os.Getenv("SRPD_CEPH_IMAGE")
	if conf == "" || pool == "" || image == "" {
		t.Skip("SKIPPED: no Ceph cluster: SRPD_CEPH_CONF, SRPD_CEPH_POOL and SRPD_CEPH_IMAGE are not set " +
			"(`make test-ceph` starts one with scripts/ceph-cluster.sh and sets them)")
	}
	dir := testutil.ShortTempDir(t, "srpd-rbd-")
	socket := filepath.Join(dir, "s.nbd")
	src := fmt.Sprintf(`version: 1
transports:
  - name: lo
    address: 127.0.0.1
    udp_port: %d
targets:
  - name: a
    port_id: %s
    luns:
      - id: 0
        backend: rbd
        block_size: 4096
        rbd:
          cluster_config: %s
          pool: %s
          image: %s
    acls:
      - initiator: "*"
sessions:
  - name: s
    address: 127.0.0.1
    target_port_id: %s
    reconnect_delay: 1s
    nbd:
      - lun: 0
        socket: %s
control:
  socket: %s/ctl.sock
`, testutil.FreeUDPPort(t), portA, conf, pool, image, portA, socket, dir)
	h := startHarnessWith(t, dir, src)
	c, ctx := h.c, h.ctx()

	// The image's size is the LUN's capacity.
	ref, err := backend.OpenRBD(backend.RBDOptions{ConfigFile: conf, Pool: pool, Image: image, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	ls, err := c.ListLUNs(ctx, "a")
	if err != nil || len(ls) != 1 || ls[0].Capacity != ref.Size() || ls[0].RBD == nil || ls[0].RBD.Image != image {
		t.Fatalf("LUNs of a: %+v, %v; want one of %d bytes on image %s", ls, err, ref.Size(), image)
	}

	// The session logs in and serves the export in the background: dial until it answers.
	var conn net.Conn
	var size int64
	for deadline := time.Now().Add(30 * time.Second); ; {
		if conn, size, err = testutil.DialNBD(socket, "", 10*time.Second); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("NBD export %s: %v", socket, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	if size != ref.Size() {
		t.Fatalf("NBD export size %d, image size %d", size, ref.Size())
	}

	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	off := int64(r.IntN(int(size/4096)-len(data)/4096)) * 4096
	nbdDo(t, conn, 1, off, data, nil) // NBD_CMD_WRITE
	nbdDo(t, conn, 3, 0, nil, nil)    // NBD_CMD_FLUSH
	got := make([]byte, len(data))
	nbdDo(t, conn, 0, off, nil, got) // NBD_CMD_READ
	if !bytes.Equal(got, data) {
		t.Fatal("NBD read back differs from what was written")
	}
	clear(got)
	if _, err := ref.ReadAt(got, off); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the image does not hold what was written through the NBD export")
	}
	t.Logf("1 MiB at %d written and read back through srpd (target, initiator, NBD) on rbd %s/%s", off, pool, image)
	// The managed exclusive lock (the default) is this gateway's now, and nobody fenced it.
	m := scrape(t, h.d)
	for _, want := range []string{`srpd_target_lun_lock_owner{lun="0",target="a"} 1`, `srpd_target_lun_fences_total{lun="0",target="a"} 0`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// nbdDo sends one NBD request (typ: 0 read, 1 write, 3 flush) and checks its simple reply; a
// read's data goes to out.
func nbdDo(t *testing.T, c net.Conn, typ uint16, off int64, in, out []byte) {
	t.Helper()
	length := len(in) + len(out)
	req := binary.BigEndian.AppendUint32(nil, 0x25609513) // NBD_REQUEST_MAGIC
	req = binary.BigEndian.AppendUint16(req, 0)
	req = binary.BigEndian.AppendUint16(req, typ)
	req = binary.BigEndian.AppendUint64(req, uint64(typ)+1) // handle
	req = binary.BigEndian.AppendUint64(req, uint64(off))
	req = binary.BigEndian.AppendUint32(req, uint32(length))
	if _, err := c.Write(append(req, in...)); err != nil {
		t.Fatal(err)
	}
	var rep [16]byte
	if _, err := io.ReadFull(c, rep[:]); err != nil {
		t.Fatal(err)
	}
	if m, e, h := binary.BigEndian.Uint32(rep[:]), binary.BigEndian.Uint32(rep[4:]), binary.BigEndian.Uint64(rep[8:]); m != 0x67446698 || e != 0 || h != uint64(typ)+1 {
		t.Fatalf("NBD command %d: reply magic %#x error %d handle %d", typ, m, e, h)
	}
	if out != nil {
		if _, err := io.ReadFull(c, out); err != nil {
			t.Fatal(err)
		}
	}
}
