package main

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
)

// otherInitiator is an initiator that never logs in: its ACL comes and goes.
const otherInitiator = "0x00000000000000090000ffff7f000009"

// liveConfig: target t1 with a RAM LUN 0 and a file LUN 1, an ACL for our session c1, and c1
// exporting LUN 1 (the verified I/O) and LUN 0 (to look at its write protection) over NBD.
func liveConfig(dir string, udp int) string {
	return testutil.LoopbackConfig(udp) + fmt.Sprintf(`targets:
  - name: t1
    port_id: %s
    cm_port: 5557
    luns:
      - {id: 0, backend: ram, size: 8MiB}
      - {id: 1, backend: file, path: %s/lun1.img, create: true, size: 16MiB}
    acls:
      - initiator: "%s"
sessions:
  - name: c1
    address: 127.0.0.1
    port: 5557
    target_port_id: %s
    initiator_ext: 0x1
    reconnect_delay: 1s
    nbd:
      - {lun: 1, socket: %s/lun1.nbd}
      - {lun: 0, socket: %s/lun0.nbd}
control:
  socket: %s/ctl.sock
logging:
  level: debug
`, t1PortID, dir, c1Initiator, t1PortID, dir, dir, dir)
}

// verifiedIO writes random extents through an NBD export and reads each back, comparing
// SHA-256 checksums, until stopped; every failure is counted (and the first kept).
type verifiedIO struct {
	c      *testutil.NBDClient
	model  []byte
	ops    atomic.Int64
	errs   atomic.Int64
	first  atomic.Value // error
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex // model, after done
	region int        // bytes the stream writes in: the export's size at the start
}

func startVerifiedIO(c *testutil.NBDClient, size int) *verifiedIO {
	v := &verifiedIO{c: c, model: make([]byte, size), stop: make(chan struct{}), done: make(chan struct{}), region: size}
	go v.run()
	return v
}

func (v *verifiedIO) fail(err error) {
	v.errs.Add(1)
	v.first.CompareAndSwap(nil, err)
}

func (v *verifiedIO) run() {
	defer close(v.done)
	rng := rand.New(rand.NewPCG(21, 21))
	for {
		select {
		case <-v.stop:
			return
		default:
		}
		n := (1 + rng.IntN(64)) * 4096
		off := rng.IntN((v.region-n)/4096+1) * 4096
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(rng.Uint32())
		}
		if err := v.c.WriteAt(buf, int64(off)); err != nil {
			v.fail(fmt.Errorf("write of %d bytes at %d: %w", n, off, err))
			continue
		}
		copy(v.model[off:], buf)
		got := make([]byte, n)
		if err := v.c.ReadAt(got, int64(off)); err != nil {
			v.fail(fmt.Errorf("read of %d bytes at %d: %w", n, off, err))
			continue
		}
		if sha256.Sum256(got) != sha256.Sum256(buf) {
			v.fail(fmt.Errorf("read back %d bytes at %d: checksum differs", n, off))
		}
		v.ops.Add(1)
	}
}

func (v *verifiedIO) finish(t *testing.T) {
	t.Helper()
	close(v.stop)
	select {
	case <-v.done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the verified I/O did not stop")
	}
	if n := v.errs.Load(); n != 0 {
		t.Fatalf("verified I/O: %d errors in %d operations; first: %v", n, v.ops.Load()+n, v.first.Load())
	}
	if v.ops.Load() == 0 {
		t.Fatal("verified I/O: no operation completed")
	}
	t.Logf("verified I/O: %d write+read-back operations, 0 errors", v.ops.Load())
}

// waitOps waits until the verified I/O has done n more operations (so that each change
// happens under I/O, and its unit attention reaches the session).
func (v *verifiedIO) waitOps(t *testing.T, n int64) {
	t.Helper()
	want := v.ops.Load() + n
	waitFor(t, 60*time.Second, fmt.Sprintf("%d verified I/O operations", n), func() bool {
		return v.ops.Load() >= want || v.errs.Load() > 0
	})
}

func remoteLUN(c ctlapi.ConnectionInfo, id int) *ctlapi.RemoteLUN {
	for i := range c.LUNs {
		if c.LUNs[i].LUN == id {
			return &c.LUNs[i]
		}
	}
	return nil
}

// TestLiveChanges: with our initiator logged in to t1 and verified I/O running through its NBD
// export, srpctl adds a LUN, grows the LUN under I/O, toggles another's write protection, and
// adds and removes an ACL for a different initiator. The session is the same one throughout
// (ID and login time), the I/O has no error, the initiator finds the new LUN and the new
// capacity (a new NBD handshake offers it) without logging out.
func TestLiveChanges(t *testing.T) {
	dir := testutil.ShortTempDir(t, "srpd-")
	cfgPath := filepath.Join(dir, "srpd.yaml")
	if err := os.WriteFile(cfgPath, []byte(liveConfig(dir, testutil.FreeUDPPort(t))), 0o640); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "ctl.sock")
	n := newNotifySocket(t, dir)
	startDaemon(t, cfgPath, n)
	n.wait(t, "READY=1", 60*time.Second)

	var s1 ctlapi.SessionInfo
	waitFor(t, 30*time.Second, "c1's session on t1", func() bool {
		var l ctlapi.SessionList
		mustSrpctl(t, sock, &l, "-o", "json", "session", "list", "--target", "t1")
		if len(l.Sessions) == 1 {
			s1 = l.Sessions[0]
			return true
		}
		return false
	})
	sameSession := func(when string) {
		t.Helper()
		var l ctlapi.SessionList
		mustSrpctl(t, sock, &l, "-o", "json", "session", "list", "--target", "t1")
		if len(l.Sessions) != 1 || l.Sessions[0].ID != s1.ID || !l.Sessions[0].LoginAt.Equal(s1.LoginAt) {
			t.Fatalf("%s: the session is not the same: before %s at %v, now %+v", when, s1.ID, s1.LoginAt, l.Sessions)
		}
	}
	conn := func() ctlapi.ConnectionInfo {
		var c ctlapi.ConnectionInfo
		mustSrpctl(t, sock, &c, "-o", "json", "connections", "c1")
		return c
	}

	nc, err := dialNBD(filepath.Join(dir, "lun1.nbd"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if nc.Size != 16<<20 {
		t.Fatalf("NBD export of LUN 1: %d bytes, want 16 MiB", nc.Size)
	}
	io := startVerifiedIO(nc, 16<<20)
	io.waitOps(t, 20)

	// 1. A LUN added: the initiator finds it (REPORTED LUNS DATA HAS CHANGED, rescan).
	mustSrpctl(t, sock, nil, "lun", "add", "t1", "2", "--backend", "ram", "--size", "4MiB")
	io.waitOps(t, 5)
	waitFor(t, 30*time.Second, "the initiator to find LUN 2", func() bool {
		l := remoteLUN(conn(), 2)
		return l != nil && l.Capacity == 4<<20
	})
	sameSession("after lun add")

	// 2. The LUN under I/O grown to 32 MiB: the initiator sees the new capacity.
	var li ctlapi.LUNInfo
	mustSrpctl(t, sock, &li, "-o", "json", "lun", "resize", "t1", "1", "--size", "32MiB")
	if li.Capacity != 32<<20 {
		t.Fatalf("lun resize: %+v", li)
	}
	if fi, err := os.Stat(filepath.Join(dir, "lun1.img")); err != nil || fi.Size() != 32<<20 {
		t.Fatalf("backing file after the resize: %v %v", fi, err)
	}
	io.waitOps(t, 5)
	waitFor(t, 30*time.Second, "the initiator to see LUN 1 at 32 MiB", func() bool {
		l := remoteLUN(conn(), 1)
		return l != nil && l.Capacity == 32<<20
	})
	sameSession("after lun resize")

	// 3. LUN 0 write-protected, then writable again (MODE PARAMETERS CHANGED).
	nc0, err := dialNBD(filepath.Join(dir, "lun0.nbd"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer nc0.Close()
	block := bytes.Repeat([]byte{0x5A}, 4096)
	if err := nc0.WriteAt(block, 0); err != nil {
		t.Fatalf("write to LUN 0: %v", err)
	}
	var ro ctlapi.LUNInfo
	mustSrpctl(t, sock, &ro, "-o", "json", "lun", "set", "t1", "0", "--read-only")
	if !ro.ReadOnly {
		t.Fatalf("lun set --read-only: %+v", ro)
	}
	waitFor(t, 30*time.Second, "the initiator to see LUN 0 write-protected", func() bool {
		got := make([]byte, 4096)
		if err := nc0.ReadAt(got, 0); err != nil || !bytes.Equal(got, block) {
			t.Fatalf("read of LUN 0 while write-protected: %v", err)
		}
		l := remoteLUN(conn(), 0)
		return l != nil && l.ReadOnly
	})
	var ne *testutil.NBDError
	if err := nc0.WriteAt(block, 4096); !errors.As(err, &ne) {
		t.Fatalf("write to the write-protected LUN 0: %v, want an NBD error", err)
	}
	var rw ctlapi.LUNInfo // a fresh one: read_only is omitted when false
	mustSrpctl(t, sock, &rw, "-o", "json", "lun", "set", "t1", "0", "--read-only=false")
	if rw.ReadOnly || rw.ID != 0 {
		t.Fatalf("lun set --read-only=false: %+v", rw)
	}
	waitFor(t, 30*time.Second, "the initiator to see LUN 0 writable", func() bool {
		got := make([]byte, 4096)
		_ = nc0.ReadAt(got, 0)
		l := remoteLUN(conn(), 0)
		return l != nil && !l.ReadOnly
	})
	if err := nc0.WriteAt(block, 4096); err != nil {
		t.Fatalf("write to LUN 0 writable again: %v", err)
	}
	io.waitOps(t, 5)
	sameSession("after the read-only toggle")

	// 4. An ACL for a different initiator added and removed: c1 is not touched.
	mustSrpctl(t, sock, nil, "acl", "add", "t1", otherInitiator, "--luns", "0")
	io.waitOps(t, 5)
	var acls ctlapi.ACLList
	mustSrpctl(t, sock, &acls, "-o", "json", "acl", "list", "t1")
	if len(acls.ACLs) != 2 {
		t.Fatalf("ACLs after acl add: %+v", acls)
	}
	mustSrpctl(t, sock, nil, "acl", "remove", "t1", otherInitiator)
	io.waitOps(t, 5)
	sameSession("after acl add and remove")

	io.finish(t)
	c := conn()
	if c.State != ctlapi.StateRunning || c.FailedReconnects != 0 {
		t.Fatalf("connection c1 after the changes: %+v", c)
	}
	// The NBD export's next handshake offers the new capacity, and the data is intact.
	nc.Close()
	nc2, err := dialNBD(filepath.Join(dir, "lun1.nbd"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	if nc2.Size != 32<<20 {
		t.Fatalf("NBD export of LUN 1 after the resize: %d bytes, want 32 MiB", nc2.Size)
	}
	verifyAll(t, nc2, append(io.model, make([]byte, 16<<20)...))
	tail := bytes.Repeat([]byte{0xC3}, 1<<20)
	if err := nc2.WriteAt(tail, 31<<20); err != nil {
		t.Fatalf("write in the grown range: %v", err)
	}
	got := make([]byte, len(tail))
	if err := nc2.ReadAt(got, 31<<20); err != nil || !bytes.Equal(got, tail) {
		t.Fatalf("read back in the grown range: %v", err)
	}
	sameSession("at the end")
}
