//go:build rbd && cgo

package backend

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ceph/go-ceph/rados"
	"github.com/ceph/go-ceph/rbd"
)

// The RBD tests run against a Ceph cluster: the one `make test-ceph` started (its environment:
// SRPD_CEPH_CONF, SRPD_CEPH_POOL, ... from scripts/ceph-cluster.sh), or else one this test
// binary starts with that script and stops in TestMain. Without the ceph tools they skip,
// saying so.

// cephCluster is the cluster the tests use.
type cephCluster struct {
	conf, client, pool string
	conn               *rados.Conn // the tests' own connection: image creation, resize, blocklist
	ioctx              *rados.IOContext
	startedDir         string // set when this binary started the cluster (TestMain stops it)
}

var (
	clusterOnce sync.Once
	cluster     *cephCluster
	clusterErr  error // why there is none: a skip (errNoCephTools) or a failure
	imageSeq    atomic.Int64
)

var errNoCephTools = errors.New("no ceph tools")

func TestMain(m *testing.M) {
	code := m.Run()
	if cluster != nil {
		cluster.ioctx.Destroy()
		cluster.conn.Shutdown()
		if cluster.startedDir != "" {
			cmd := exec.Command("../../scripts/ceph-cluster.sh", "stop", cluster.startedDir)
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Run(); err != nil {
				fmt.Fprintf(os.Stderr, "stopping the test cluster in %s: %v\n", cluster.startedDir, err)
				code = 1
			}
		}
	}
	os.Exit(code)
}

// testCluster returns the cluster, starting it on first use; it skips the test, loudly, when
// there is no cluster and no ceph tools to start one.
func testCluster(t *testing.T) *cephCluster {
	t.Helper()
	clusterOnce.Do(func() { cluster, clusterErr = startCluster() })
	switch {
	case errors.Is(clusterErr, errNoCephTools):
		t.Skipf("SKIPPED: no Ceph cluster for the rbd backend: %v. Install ceph-mon ceph-osd ceph-common "+
			"(Debian 12) or run `make test-ceph`", clusterErr)
	case clusterErr != nil:
		t.Fatalf("Ceph test cluster: %v", clusterErr)
	}
	return cluster
}

func startCluster() (*cephCluster, error) {
	c := &cephCluster{conf: os.Getenv("SRPD_CEPH_CONF"), client: os.Getenv("SRPD_CEPH_CLIENT"),
		pool: os.Getenv("SRPD_CEPH_POOL")}
	if c.conf == "" {
		for _, tool := range []string{"ceph", "ceph-mon", "ceph-osd", "rbd"} {
			if _, err := exec.LookPath(tool); err != nil {
				return nil, fmt.Errorf("%w: %s not found and SRPD_CEPH_CONF not set", errNoCephTools, tool)
			}
		}
		dir, err := os.MkdirTemp("", "srpd-rbd-test.")
		if err != nil {
			return nil, err
		}
		c.startedDir = dir
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "../../scripts/ceph-cluster.sh", "start", dir)
		// Should this binary die before TestMain stops the cluster (a -timeout panic), the
		// script's watcher stops it.
		cmd.Env = append(os.Environ(), fmt.Sprintf("CEPH_CLUSTER_OWNER=%d", os.Getpid()))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("scripts/ceph-cluster.sh start: %w", err)
		}
		env := parseEnv(out.Bytes())
		c.conf, c.client, c.pool = env["SRPD_CEPH_CONF"], env["SRPD_CEPH_CLIENT"], env["SRPD_CEPH_POOL"]
	}
	if c.pool == "" {
		c.pool = "rbd"
	}
	if c.client == "" {
		c.client = DefaultRBDClient
	}
	conn, err := rados.NewConnWithClusterAndUser("ceph", c.client)
	if err == nil {
		err = conn.ReadConfigFile(c.conf)
	}
	if err == nil {
		err = conn.SetConfigOption("client_mount_timeout", "20")
	}
	if err == nil {
		err = conn.Connect()
	}
	if err == nil {
		c.conn = conn
		c.ioctx, err = conn.OpenIOContext(c.pool)
	}
	if err != nil {
		if c.conn != nil {
			c.conn.Shutdown()
		}
		if c.startedDir != "" {
			exec.Command("../../scripts/ceph-cluster.sh", "stop", c.startedDir).Run()
		}
		return nil, fmt.Errorf("connecting to the cluster of %s: %w", c.conf, err)
	}
	return c, nil
}

// parseEnv reads the `export NAME=value` lines scripts/ceph-cluster.sh prints.
func parseEnv(b []byte) map[string]string {
	env := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, value, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "=")
		if ok {
			env[name] = value
		}
	}
	return env
}

var nonName = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// newImage creates an image of size bytes named after the test; it is removed when the test
// ends (after the backends opened on it, registered later, are closed).
func (c *cephCluster) newImage(t *testing.T, size int64) string {
	t.Helper()
	name := fmt.Sprintf("%s.%d", nonName.ReplaceAllString(t.Name(), "_"), imageSeq.Add(1))
	if len(name) > 90 {
		name = name[len(name)-90:]
	}
	if err := rbd.CreateImage(c.ioctx, name, uint64(size), rbd.NewRbdImageOptions()); err != nil {
		t.Fatalf("creating image %s/%s: %v", c.pool, name, err)
	}
	t.Cleanup(func() {
		if err := rbd.RemoveImage(c.ioctx, name); err != nil {
			t.Logf("removing image %s/%s: %v", c.pool, name, err)
		}
	})
	return name
}

func (c *cephCluster) opts(image string) RBDOptions {
	return RBDOptions{ConfigFile: c.conf, Client: c.client, Pool: c.pool, Image: image,
		ConnectTimeout: 20 * time.Second}
}

func (c *cephCluster) open(t *testing.T, o RBDOptions) *RBD {
	t.Helper()
	b, err := OpenRBD(o)
	if err != nil {
		t.Fatal(err)
	}
	closeOnCleanup(t, b)
	return b.(*RBD)
}

// rbdKind is the conformance kind on images of the test cluster. A small QueueDepth makes the
// concurrent tests wait for request slots too.
func rbdKind(c *cephCluster) kind {
	const size = 512<<10 + 1000 // not a multiple of any block size
	openImage := func(t *testing.T, init []byte, ro bool) Backend {
		image := c.newImage(t, size)
		if len(init) > 0 {
			w := c.open(t, c.opts(image))
			if _, err := w.WriteAt(init, 0); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
		}
		o := c.opts(image)
		o.ReadOnly, o.QueueDepth = ro, 4
		return c.open(t, o)
	}
	return kind{
		name: "rbd",
		size: size,
		open: func(t *testing.T, init []byte) Backend { return openImage(t, init, false) },
		openRO: func(t *testing.T, init []byte) (Backend, []byte) {
			return openImage(t, init, true), init
		},
		// A fenced client: the cluster blocklists the backend's connection, as it does a gateway
		// that lost its lock. Its writes fail with EBLOCKLISTED (ESHUTDOWN).
		faulty: func(t *testing.T) Backend {
			r := c.open(t, c.opts(c.newImage(t, 8<<20)))
			c.blocklist(t, r)
			return r
		},
		faultErrnos: []syscall.Errno{syscall.ESHUTDOWN},
	}
}

// blocklist fences r's cluster connection (found among the image's watchers by its global id)
// and waits until r's connection knows it, so that its next request is refused. The entry is
// removed when the test ends.
func (c *cephCluster) blocklist(t *testing.T, r *RBD) {
	t.Helper()
	img, err := rbd.OpenImageReadOnly(c.ioctx, strings.TrimPrefix(r.name, c.pool+"/"), rbd.NoSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := img.ListWatchers()
	img.Close()
	if err != nil {
		t.Fatal(err)
	}
	id := int64(r.conn.GetInstanceID())
	addr := ""
	for _, w := range ws {
		if w.Id == id {
			addr = w.Addr
		}
	}
	if addr == "" {
		t.Fatalf("client.%d is not among the watchers of %s: %+v", id, r.name, ws)
	}
	c.monCommand(t, map[string]string{"prefix": "osd blocklist", "blocklistop": "add", "addr": addr})
	t.Cleanup(func() {
		c.monCommand(t, map[string]string{"prefix": "osd blocklist", "blocklistop": "rm", "addr": addr})
	})
	if err := r.conn.WaitForLatestOSDMap(); err != nil {
		t.Fatal(err)
	}
	t.Logf("blocklisted client.%d at %s", id, addr)
}

func (c *cephCluster) monCommand(t *testing.T, cmd map[string]string) {
	t.Helper()
	b, _ := json.Marshal(cmd)
	if _, info, err := c.conn.MonCommand(b); err != nil {
		t.Fatalf("ceph %s: %v (%s)", b, err, info)
	}
}

func TestRBDConformance(t *testing.T) {
	runConformance(t, rbdKind(testCluster(t)))
}

// TestRBDResize: an image grown elsewhere while open shows in Size and OnResize, and the new
// range is usable.
func TestRBDResize(t *testing.T) {
	c := testCluster(t)
	image := c.newImage(t, 4<<20)
	resized := make(chan int64, 4)
	o := c.opts(image)
	o.OnResize = func(size int64) { resized <- size }
	r := c.open(t, o)
	if got := r.Size(); got != 4<<20 {
		t.Fatalf("Size() = %d, want %d", got, 4<<20)
	}
	p := bytes.Repeat([]byte{0x5a}, 4096)
	if _, err := r.WriteAt(p, 6<<20); !errors.Is(err, ErrOutOfRange) {
		t.Fatalf("WriteAt past the end before the resize = %v, want ErrOutOfRange", err)
	}

	img, err := rbd.OpenImage(c.ioctx, image, rbd.NoSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	err = img.Resize(8 << 20)
	img.Close()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case size := <-resized:
		if size != 8<<20 {
			t.Fatalf("OnResize(%d), want %d", size, 8<<20)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("no OnResize within 15 s of the resize; Size() = %d", r.Size())
	}
	if got := r.Size(); got != 8<<20 {
		t.Fatalf("Size() = %d after the resize, want %d", got, 8<<20)
	}
	if _, err := r.WriteAt(p, 6<<20); err != nil {
		t.Fatalf("WriteAt in the grown range: %v", err)
	}
	q := make([]byte, len(p))
	if _, err := r.ReadAt(q, 6<<20); err != nil || !bytes.Equal(p, q) {
		t.Fatalf("ReadAt in the grown range: %v, equal %v", err, bytes.Equal(p, q))
	}
}

// TestRBDOpenErrors: what a wrong LUN configuration gets, each within a bounded time.
func TestRBDOpenErrors(t *testing.T) {
	c := testCluster(t)
	image := c.newImage(t, 1<<20)
	unreachable := filepath.Join(t.TempDir(), "ceph.conf")
	// A monitor address nobody listens on (port 1 of 127.0.0.1: connection refused).
	if err := os.WriteFile(unreachable, []byte("[global]\nmon host = v2:127.0.0.1:1\n"+
		"auth cluster required = none\nauth service required = none\nauth client required = none\n"+
		"[client]\nlog file = /dev/null\nadmin socket =\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		edit func(*RBDOptions)
		want error
	}{
		{"missing image", func(o *RBDOptions) { o.Image = "no-such-image" }, fs.ErrNotExist},
		{"missing pool", func(o *RBDOptions) { o.Pool = "no-such-pool" }, fs.ErrNotExist},
		{"missing namespace", func(o *RBDOptions) { o.Namespace = "no-such-ns" }, fs.ErrNotExist},
		{"missing config", func(o *RBDOptions) { o.ConfigFile = "/nonexistent/ceph.conf" }, fs.ErrNotExist},
		{"unreachable monitor", func(o *RBDOptions) {
			o.ConfigFile, o.ConnectTimeout = unreachable, 2*time.Second
		}, syscall.ETIMEDOUT},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := c.opts(image)
			tc.edit(&o)
			t0 := time.Now()
			b, err := OpenRBD(o)
			if err == nil {
				b.Close()
				t.Fatal("OpenRBD succeeded")
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("OpenRBD = %v; want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), o.Name()) {
				t.Errorf("error %q does not name the image %s", err, o.Name())
			}
			if d := time.Since(t0); d > 15*time.Second {
				t.Errorf("OpenRBD took %v", d)
			}
		})
	}
}

// TestRBDNoAllocs: reads and writes allocate nothing on the Go heap (the target calls them
// for every command).
func TestRBDNoAllocs(t *testing.T) {
	c := testCluster(t)
	r := c.open(t, c.opts(c.newImage(t, 1<<20)))
	p := make([]byte, 4096)
	for _, op := range []struct {
		name string
		f    func() error
	}{
		{"WriteAt", func() error { _, err := r.WriteAt(p, 8192); return err }},
		{"ReadAt", func() error { _, err := r.ReadAt(p, 8192); return err }},
		{"WriteZeroes", func() error { return r.WriteZeroes(8192, 4096) }},
		{"Flush", r.Flush},
	} {
		var err error
		allocs := testing.AllocsPerRun(200, func() {
			if e := op.f(); e != nil {
				err = e
			}
		})
		if err != nil {
			t.Fatalf("%s: %v", op.name, err)
		}
		if allocs > 0 {
			t.Errorf("%s: %.1f allocations per call, want 0", op.name, allocs)
		}
	}
}

// lockEvents records an RBD backend's managed-lock events.
type lockEvents struct {
	mu  sync.Mutex
	evs []LockEvent
}

func (l *lockEvents) add(ev LockEvent) {
	l.mu.Lock()
	l.evs = append(l.evs, ev)
	l.mu.Unlock()
}

func (l *lockEvents) count(k LockEventKind) (n int, last LockEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ev := range l.evs {
		if ev.Kind == k {
			n++
			last = ev
		}
	}
	return n, last
}

// TestRBDManagedLockFencing: two gateways (two cluster connections) on one image with the
// managed lock. The second one's first write breaks the first one's lock, which blocklists
// it: the first one's later write fails with ErrFenced and does not land. After Resume the
// fenced gateway reconnects (a call made meanwhile waits for it), takes the lock back the same
// way, and its shared state works through the new connection.
func TestRBDManagedLockFencing(t *testing.T) {
	c := testCluster(t)
	image := c.newImage(t, 8<<20)
	var evA, evB lockEvents
	oa := c.opts(image)
	oa.ManagedLock, oa.SharedState, oa.OnLock = true, true, evA.add
	ob := c.opts(image)
	ob.ManagedLock, ob.OnLock = true, evB.add
	a, b := c.open(t, oa), c.open(t, ob)
	blk := func(v byte) []byte { return bytes.Repeat([]byte{v}, 4096) }
	if _, err := a.WriteAt(blk(0xA1), 0); err != nil {
		t.Fatal(err)
	}
	if n, ev := evA.count(LockAcquired); n != 1 || ev.Broken != 0 {
		t.Fatalf("A took the lock %d times (last broke %d owners), want once, breaking none", n, ev.Broken)
	}
	// B takes over: A's lock is broken and A blocklisted.
	if _, err := b.WriteAt(blk(0xB1), 4096); err != nil {
		t.Fatal(err)
	}
	if n, ev := evB.count(LockAcquired); n != 1 || ev.Broken != 1 {
		t.Fatalf("B took the lock %d times (last broke %d owners), want once, breaking A's", n, ev.Broken)
	}
	// A's write after the takeover: refused, fenced.
	_, err := a.WriteAt(blk(0xA2), 0)
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("A's write after B took the lock: %v, want ErrFenced", err)
	}
	if a.FenceEpoch() != 1 {
		t.Fatalf("A's fence epoch %d, want 1", a.FenceEpoch())
	}
	if n, _ := evA.count(LockFenced); n != 1 {
		t.Fatalf("A saw %d fences, want 1", n)
	}
	// Fenced, without Resume: every call fails at once, reads too.
	if _, err := a.ReadAt(make([]byte, 512), 0); !errors.Is(err, ErrFenced) {
		t.Fatalf("A's read while fenced: %v, want ErrFenced", err)
	}
	got := make([]byte, 8192)
	if _, err := b.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:4096], blk(0xA1)) || !bytes.Equal(got[4096:], blk(0xB1)) {
		t.Fatalf("through B: %x… %x…, want a1… b1… (the fenced write must not land)", got[0], got[4096])
	}
	// Resume: A reconnects; its write waits for that, then takes the lock back from B.
	a.Resume(1)
	a.Resume(1) // once is enough; a second call changes nothing
	if _, err := a.WriteAt(blk(0xA3), 0); err != nil {
		t.Fatalf("A's write after Resume: %v", err)
	}
	if n, ev := evA.count(LockResumed); n != 1 || ev.Err != nil {
		t.Fatalf("A resumed %d times, last error %v", n, ev.Err)
	}
	if n, ev := evA.count(LockAcquired); n != 2 || ev.Broken != 1 || ev.Epoch != 1 {
		t.Fatalf("A took the lock %d times (last broke %d owners, epoch %d), want twice, breaking B's", n, ev.Broken, ev.Epoch)
	}
	if _, err := b.WriteAt(blk(0xB2), 4096); !errors.Is(err, ErrFenced) {
		t.Fatalf("B's write after A took the lock back: %v, want ErrFenced", err)
	}
	if _, err := a.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:4096], blk(0xA3)) || !bytes.Equal(got[4096:], blk(0xB1)) {
		t.Fatalf("through A: %x… %x…, want a3… b1…", got[0], got[4096])
	}
	// A's shared state moved to the new connection.
	st := a.SharedState()
	_, ver, err := st.Load()
	if err != nil {
		t.Fatalf("shared state after the reconnect: %v", err)
	}
	if err := st.CompareAndSwap(ver, []byte("after the fence")); err != nil {
		t.Fatalf("shared state write after the reconnect: %v", err)
	}
	// A stale Resume (an older epoch) does nothing.
	b.Resume(0)
	if _, err := b.ReadAt(got[:512], 0); !errors.Is(err, ErrFenced) {
		t.Fatalf("B after a stale Resume: %v, want ErrFenced", err)
	}
}

// TestRBDManagedLockNeedsFeature: the managed lock on an image created without the
// exclusive-lock feature is refused at open (ErrNoExclusiveLock, naming the fix), not left to
// fail every I/O later; librbd's automatic mode opens it.
func TestRBDManagedLockNeedsFeature(t *testing.T) {
	c := testCluster(t)
	name := fmt.Sprintf("nolock.%d", imageSeq.Add(1))
	ro := rbd.NewRbdImageOptions()
	defer ro.Destroy()
	if err := ro.SetUint64(rbd.ImageOptionFeatures, rbd.FeatureLayering); err != nil {
		t.Fatal(err)
	}
	if err := rbd.CreateImage(c.ioctx, name, 1<<20, ro); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rbd.RemoveImage(c.ioctx, name) })
	o := c.opts(name)
	o.ManagedLock = true
	b, err := OpenRBD(o)
	if err == nil {
		b.Close()
		t.Fatal("OpenRBD with the managed lock succeeded on an image without exclusive-lock")
	}
	if !errors.Is(err, ErrNoExclusiveLock) || !strings.Contains(err.Error(), "rbd feature enable") {
		t.Fatalf("OpenRBD = %v; want ErrNoExclusiveLock naming the fix", err)
	}
	o.ManagedLock = false
	a := c.open(t, o)
	if _, err := a.WriteAt(make([]byte, 512), 0); err != nil {
		t.Fatalf("automatic mode: %v", err)
	}
}
