package mpath_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/srpd/srpd/initiator"
	"github.com/srpd/srpd/initiator/mpath"
	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/stack"
	"github.com/srpd/srpd/internal/testutil"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/transport"
)

const naa = "6001405abcdef0123456789abcdef012"

// gateway is a target of the test fixture: its transport, target and LUN 0.
type gateway struct {
	tr  *stack.Transport
	tgt *stack.Target
	lun *stack.LUN
	cfg config.Target
}

// sessionPath is a Path over a fixed session (the daemon's follows its reconnecting one).
type sessionPath struct {
	name string
	mu   sync.Mutex
	sess *initiator.Session
}

func (p *sessionPath) Name() string { return p.name }
func (p *sessionPath) LUN() *initiator.LUN {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sess == nil {
		return nil
	}
	return p.sess.LUN(0)
}

type fixture struct {
	t     *testing.T
	ctx   context.Context
	log   *zap.Logger
	file  string
	gws   []*gateway
	itr   *stack.Transport
	paths []*sessionPath
}

func logger(t *testing.T) *zap.Logger {
	if testing.Verbose() {
		return zaptest.NewLogger(t)
	}
	return zap.NewNop()
}

// newFixture starts two gateways, gw1 (target port group 1, active/optimized) and gw2 (group
// 2, active/non-optimized), exporting one file as LUN 0 with one NAA, each on a transport of
// its own, and one session to each from a third transport.
func newFixture(t *testing.T, naas ...string) *fixture {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	f := &fixture{t: t, ctx: ctx, log: logger(t), file: filepath.Join(t.TempDir(), "lu.img")}
	f.itr = f.transport("i")
	for i := range 2 {
		n := naa
		if i < len(naas) {
			n = naas[i]
		}
		f.gateway(i, n)
	}
	for i, g := range f.gws {
		sess, err := stack.Dial(ctx, config.Session{Name: g.cfg.Name, Address: "127.0.0.1", Port: g.cfg.CMPort,
			TargetPortID: g.cfg.PortID, ConnectTimeout: config.Duration(10 * time.Second),
			ReconnectDelay: config.TimeoutOf(200 * time.Millisecond), FastIOFailTmo: config.TimeoutOf(500 * time.Millisecond),
			DevLossTmo: config.TimeoutOf(time.Minute)},
			f.itr, stack.SessionOptions{Logger: f.log, PeerUDPPort: g.tr.Bound.Port()})
		if err != nil {
			t.Fatalf("session to gw%d: %v", i+1, err)
		}
		t.Cleanup(func() { sess.Close(context.Background()) })
		f.paths = append(f.paths, &sessionPath{name: g.cfg.Name, sess: sess})
	}
	return f
}

func (f *fixture) transport(name string) *stack.Transport {
	tr, err := stack.OpenTransport(f.ctx, config.Transport{Name: name, Driver: config.DriverSoftRoCE, Address: "127.0.0.1"},
		stack.TransportOptions{Logger: f.log})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { tr.Close(context.Background()) })
	return tr
}

func (f *fixture) gateway(i int, naa string) {
	t := f.t
	states := []string{config.ALUAActiveOptimized, config.ALUAActiveNonOptimized}
	tc := config.Target{
		Name: []string{"gw1", "gw2"}[i], PortID: config.MakePortID(uint64(i+1), 0x77), CMPort: 5555 + i,
		ALUA: &config.ALUA{Group: i + 1, RelativePort: i + 1, State: states[i],
			Peers: []config.ALUAPeer{{Group: 2 - i, RelativePorts: []int{2 - i}, State: states[1-i]}}},
		LUNs: []config.LUN{{ID: 0, Backend: config.BackendFile, Path: f.file, Size: 4 << 20, Create: true, Shared: true, BlockSize: 512, NAA: naa}},
		ACLs: []config.ACL{{Initiator: config.AnyInitiator}},
	}
	l, err := stack.OpenLUN(&tc, tc.LUNs[0], stack.LUNOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr := f.transport(tc.Name)
	tgt, err := stack.StartTarget(tc, tr, map[int]*stack.LUN{0: l}, stack.TargetOptions{Logger: f.log})
	if err != nil {
		t.Fatal(err)
	}
	g := &gateway{tr: tr, tgt: tgt, lun: l, cfg: tc}
	t.Cleanup(func() { g.stop() })
	f.gws = append(f.gws, g)
}

func (g *gateway) stop() {
	if g.tgt != nil {
		g.tgt.Stop(context.Background(), nil)
		g.tgt = nil
	}
}

func (f *fixture) device(o mpath.Options) *mpath.Device {
	var ps []mpath.Path
	for _, p := range f.paths {
		ps = append(ps, p)
	}
	o.Logger = f.log
	if o.CheckInterval == 0 {
		o.CheckInterval = 50 * time.Millisecond
	}
	d, err := mpath.New(ps, o)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(d.Close)
	return d
}

func active(d *mpath.Device) string {
	for _, p := range d.Paths() {
		if p.Active {
			return p.Name
		}
	}
	return ""
}

func waitActive(t *testing.T, d *mpath.Device, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for active(d) != want {
		if time.Now().After(deadline) {
			t.Fatalf("active path %q, want %q: %+v", active(d), want, d.Paths())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ios(d *mpath.Device) map[string]uint64 {
	m := map[string]uint64{}
	for _, p := range d.Paths() {
		m[p.Name] = p.IOs
	}
	return m
}

// io writes and reads back n random blocks through d, checking the data.
func io(t *testing.T, d *mpath.Device, rng *rand.Rand, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	buf, got := make([]byte, 4096), make([]byte, 4096)
	for range n {
		off := int64(rng.IntN(int(d.Size()/4096))) * 4096
		for i := range buf {
			buf[i] = byte(rng.Uint32())
		}
		if err := d.WriteAt(ctx, buf, off, false); err != nil {
			t.Fatalf("write at %d: %v (paths %+v)", off, err, d.Paths())
		}
		if err := d.ReadAt(ctx, got, off); err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		if !bytes.Equal(buf, got) {
			t.Fatalf("read at %d differs from what was written", off)
		}
	}
}

// The ALUA choice: the active/optimized gateway's path carries the I/O; the other's group
// states show in Paths.
func TestChoosesActiveOptimized(t *testing.T) {
	f := newFixture(t)
	d := f.device(mpath.Options{})
	waitActive(t, d, "gw1")
	io(t, d, rand.New(rand.NewPCG(1, 2)), 50)
	ps := d.Paths()
	if ps[0].State != "active/optimized" || ps[0].Group != 1 || ps[1].State != "active/non-optimized" || ps[1].Group != 2 || !ps[1].Up {
		t.Fatalf("paths %+v", ps)
	}
	if m := ios(d); m["gw1"] != 100 || m["gw2"] != 0 {
		t.Fatalf("I/Os by path %v, want 100 through gw1", m)
	}
	if d.Size() != 4<<20 || d.BlockSize() != 512 {
		t.Fatalf("size %d, block size %d", d.Size(), d.BlockSize())
	}
}

// A transition to standby moves the I/O to the non-optimized path (I/O already sent gets NOT
// READY 04/0B and is retried there); back to active/optimized, the I/O fails back.
func TestALUATransitionAndFailback(t *testing.T) {
	f := newFixture(t)
	d := f.device(mpath.Options{})
	waitActive(t, d, "gw1")
	rng := rand.New(rand.NewPCG(3, 4))
	if err := f.gws[0].lun.SCSI.SetALUAState(1, scsi.ALUAStandby); err != nil {
		t.Fatal(err)
	}
	io(t, d, rng, 20) // through the transition: NOT READY on gw1 is retried on gw2
	waitActive(t, d, "gw2")
	before := ios(d)
	io(t, d, rng, 20)
	if m := ios(d); m["gw2"]-before["gw2"] != 40 || m["gw1"] != before["gw1"] {
		t.Fatalf("I/Os by path %v (before %v), want the 40 through gw2", m, before)
	}
	if err := f.gws[0].lun.SCSI.SetALUAState(1, scsi.ALUAActiveOptimized); err != nil {
		t.Fatal(err)
	}
	waitActive(t, d, "gw1")
	before = ios(d)
	io(t, d, rng, 10)
	if m := ios(d); m["gw1"]-before["gw1"] != 20 {
		t.Fatalf("after failback: I/Os by path %v (before %v)", m, before)
	}
}

// A gateway that stops answering: I/O in flight and new I/O go on through the other path,
// the data stays whole (one file behind both), asynchronous I/O included.
func TestFailoverOnPathLoss(t *testing.T) {
	f := newFixture(t)
	d := f.device(mpath.Options{NoPathTimeout: 20 * time.Second})
	waitActive(t, d, "gw1")
	rng := rand.New(rand.NewPCG(5, 6))
	io(t, d, rng, 10)
	// Asynchronous writes in flight while gw1 goes away.
	const n = 64
	var wg sync.WaitGroup
	errs := make([]error, n)
	data := make([][]byte, n)
	for i := range n {
		data[i] = bytes.Repeat([]byte{byte(i + 1)}, 4096)
	}
	for i := range n {
		wg.Add(1)
		d.WriteAtAsync(context.Background(), data[i], int64(i)*4096, false, func(err error) { errs[i] = err; wg.Done() })
		if i == n/4 {
			f.gws[0].stop()
		}
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("async write %d: %v", i, err)
		}
	}
	waitActive(t, d, "gw2")
	got := make([]byte, 4096)
	for i := range n {
		if err := d.ReadAt(context.Background(), got, int64(i)*4096); err != nil || !bytes.Equal(got, data[i]) {
			t.Fatalf("block %d after failover: %v", i, err)
		}
	}
	io(t, d, rng, 10)
	if ps := d.Paths(); ps[0].Up || ps[0].Why == "" {
		t.Fatalf("gw1's path after its target stopped: %+v", ps[0])
	}
}

// A path to another logical unit (another NAA) is never used.
func TestOtherUnitRefused(t *testing.T) {
	f := newFixture(t, naa, "6001405ffffffffffffffffffffffff0")
	d := f.device(mpath.Options{})
	waitActive(t, d, "gw1")
	deadline := time.Now().Add(10 * time.Second)
	for {
		ps := d.Paths()
		if !ps[1].Up && bytes.Contains([]byte(ps[1].Why), []byte("another logical unit")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("path to another unit: %+v", ps[1])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// With no usable path I/O waits NoPathTimeout, then fails with ErrNoPath.
func TestNoPathTimeout(t *testing.T) {
	f := newFixture(t)
	d := f.device(mpath.Options{NoPathTimeout: 300 * time.Millisecond})
	waitActive(t, d, "gw1")
	for _, g := range f.gws {
		if err := g.lun.SCSI.SetALUAState(uint16(g.cfg.ALUA.Group), scsi.ALUAUnavailable); err != nil {
			t.Fatal(err)
		}
	}
	waitActive(t, d, "")
	start := time.Now()
	err := d.ReadAt(context.Background(), make([]byte, 512), 0)
	if !errors.Is(err, mpath.ErrNoPath) || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("read without a path: %v after %v", err, time.Since(start))
	}
	done := make(chan error, 1)
	d.ReadAtAsync(context.Background(), make([]byte, 512), 0, func(err error) { done <- err })
	select {
	case err := <-done:
		if !errors.Is(err, mpath.ErrNoPath) {
			t.Fatalf("async read without a path: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("async read without a path never completed")
	}
}

// The asynchronous path through the multipath device allocates nothing per I/O in steady
// state (pooled requests, the completion bound once).
func TestAsyncAllocs(t *testing.T) {
	if testing.CoverMode() != "" || raceEnabled {
		t.Skip("SKIP: allocation counts are not meaningful with -race or -cover")
	}
	f := newFixture(t)
	d := f.device(mpath.Options{CheckInterval: time.Hour})
	waitActive(t, d, "gw1")
	buf := make([]byte, 4096)
	ch := make(chan error, 1)
	done := func(err error) { ch <- err }
	ctx := context.Background()
	for range 100 { // warm the pools
		d.ReadAtAsync(ctx, buf, 0, done)
		<-ch
	}
	n := testing.AllocsPerRun(500, func() {
		d.ReadAtAsync(ctx, buf, 4096, done)
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	})
	if n > 0 {
		t.Fatalf("%.1f allocations per asynchronous read", n)
	}
}

// countBatcher counts the brackets a Device opens on a transport.PostBatcher it wraps.
type countBatcher struct {
	transport.PostBatcher
	mu           sync.Mutex
	begins, ends int
}

func (b *countBatcher) BeginPosts() {
	b.mu.Lock()
	b.begins++
	b.mu.Unlock()
	b.PostBatcher.BeginPosts()
}

func (b *countBatcher) EndPosts() {
	b.mu.Lock()
	b.ends++
	b.mu.Unlock()
	b.PostBatcher.EndPosts()
}

// batchPath is a sessionPath that names its session's post-batching device (PostBatchPath).
type batchPath struct {
	*sessionPath
	b transport.PostBatcher
}

func (p batchPath) PostBatcher() transport.PostBatcher { return p.b }

// TestPostBatchAcrossPaths: the Device brackets posts on its paths' post-batching devices, once
// per distinct device (both paths here share the initiator's), and reads posted inside a
// bracket are held back by softroce, sent together, and answered with the right data.
func TestPostBatchAcrossPaths(t *testing.T) {
	f := newFixture(t)
	cb := &countBatcher{PostBatcher: f.itr.SoftRoCE()}
	var ps []mpath.Path
	for _, p := range f.paths {
		ps = append(ps, batchPath{p, cb})
	}
	d, err := mpath.New(ps, mpath.Options{Logger: f.log, CheckInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	waitActive(t, d, "gw1")
	const n, bs = 8, 4096
	want := make([]byte, n*bs)
	for i := range want {
		want[i] = byte(i*13 + i/bs)
	}
	if err := d.WriteAt(f.ctx, want, 0, false); err != nil {
		t.Fatal(err)
	}
	before := f.itr.SoftRoCE().Stats()
	got := make([]byte, n*bs)
	// A post that finds its QP with the transmit loop, or the receive loop running handlers
	// (the path checker's commands), is not held: a few rounds, of which one must hold.
	const rounds = 5
	st := before
	round := 0
	for ; round < rounds && st.HeldSends == before.HeldSends; round++ {
		clear(got)
		if err := testutil.ReadBracketed(f.ctx, d, got, bs); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("data read differs from what was written")
		}
		st = f.itr.SoftRoCE().Stats()
	}
	cb.mu.Lock()
	defer cb.mu.Unlock()
	if cb.begins != round || cb.ends != round {
		t.Fatalf("brackets on the shared device in %d rounds: %d begins, %d ends; want one each a round", round, cb.begins, cb.ends)
	}
	if st.HeldSends == before.HeldSends || st.HeldPackets == before.HeldPackets {
		t.Fatalf("nothing held in %d rounds: %d packets in %d sends", round, st.HeldPackets-before.HeldPackets, st.HeldSends-before.HeldSends)
	}
}
