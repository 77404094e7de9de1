package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/testutil"
)

// TestNBDMapSparseFileLUN: a sparse file LUN exported by srpd's target and served back over NBD
// by srpd's own session: nbdinfo --map shows its holes (GET LBA STATUS from SEEK_DATA/SEEK_HOLE
// on the target, NBD_CMD_BLOCK_STATUS on the export), and nbdcopy of it stays sparse.
func TestNBDMapSparseFileLUN(t *testing.T) {
	for _, tool := range []string{"nbdinfo", "nbdcopy"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("SKIPPED: %s not installed (libnbd-bin)", tool)
		}
	}
	dir := testutil.ShortTempDir(t, "srpd-map-")
	img := filepath.Join(dir, "lun0.img")
	nbdSock := filepath.Join(dir, "c1.nbd")
	cfg := filepath.Join(dir, "srpd.yaml")
	writeFile(t, cfg, testutil.LoopbackConfig(testutil.FreeUDPPort(t))+fmt.Sprintf(`targets:
  - name: t1
    port_id: %s
    cm_port: 5555
    luns:
      - {id: 0, backend: file, path: %s, create: true, size: 16MiB}
    acls:
      - initiator: "*"
sessions:
  - name: c1
    address: 127.0.0.1
    port: 5555
    target_port_id: %s
    nbd:
      - {lun: 0, socket: %s}
control: {socket: %s/ctl.sock}
`, t1PortID, img, t1PortID, nbdSock, dir))
	n := newNotifySocket(t, dir)
	startDaemon(t, cfg, n)
	n.wait(t, "READY=1", 60*time.Second)
	uri := fmt.Sprintf("nbd+unix:///?socket=%s", nbdSock)
	// 64 KiB of data at 2 MiB, written through the export.
	nc, err := dialNBD(nbdSock, "")
	if err != nil {
		t.Fatal(err)
	}
	block := make([]byte, 64<<10)
	for i := range block {
		block[i] = byte(i%251) + 1
	}
	if err := nc.WriteAt(block, 2<<20); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	nc.Close()

	out, err := exec.Command("nbdinfo", "--map", "--json", uri).CombinedOutput()
	if err != nil {
		t.Fatalf("nbdinfo --map: %v\n%s", err, out)
	}
	var m []struct {
		Offset, Length int64
		Type           int
	}
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("nbdinfo --map --json: %v\n%s", err, out)
	}
	var data, holes int64
	for _, x := range m {
		if x.Type&1 != 0 { // NBD_STATE_HOLE
			holes += x.Length
			continue
		}
		data += x.Length
		if x.Offset > 2<<20 || x.Offset+x.Length < 2<<20+64<<10 {
			t.Errorf("data extent %+v does not cover the written 64 KiB at 2 MiB", x)
		}
	}
	if data < 64<<10 || data > 1<<20 || data+holes != 16<<20 {
		t.Fatalf("nbdinfo --map: %d bytes of data, %d of holes, want 64 KiB (filesystem blocks around it at most) in 16 MiB:\n%s", data, holes, out)
	}

	copyPath := filepath.Join(dir, "copy.img")
	if out, err := exec.Command("nbdcopy", uri, copyPath).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy: %v\n%s", err, out)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(copyPath, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 16<<20 || st.Blocks*512 > 1<<20 {
		t.Fatalf("nbdcopy's copy: %d bytes, %d allocated; want 16 MiB, sparse (at most 1 MiB allocated)", st.Size, st.Blocks*512)
	}
	got, err := os.ReadFile(copyPath)
	if err != nil {
		t.Fatal(err)
	}
	if string(got[2<<20:2<<20+64<<10]) != string(block) {
		t.Fatal("the copy lacks the written data")
	}
	t.Logf("map: %d data bytes, %d hole bytes; copy allocates %d of %d bytes", data, holes, st.Blocks*512, st.Size)
}
