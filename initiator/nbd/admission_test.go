package nbd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// exportStats returns the stats of the export called name.
func exportStats(t testing.TB, s *Server, name string) ExportStats {
	t.Helper()
	for _, e := range s.Stats().Exports {
		if e.Name == name {
			return e
		}
	}
	t.Fatalf("no export %q", name)
	return ExportStats{}
}

// settle waits until the buffers in use have not changed for 300 ms (the slow readers have
// taken all they can).
func settle(t testing.TB, s *Server) {
	t.Helper()
	last, same := int64(-1), 0
	for i := 0; i < 200 && same < 6; i++ {
		time.Sleep(50 * time.Millisecond)
		if n := s.Stats().BufferInUse; n == last {
			same++
		} else {
			last, same = n, 0
		}
	}
	if same < 6 {
		t.Fatal("the buffers in use did not settle within 10 s")
	}
}

// TestSlowReadersDoNotBlockOthers is issue 23's finding: four connections that each pipeline
// two 32 MiB READs and never read a reply used to take the whole default budget (256 MiB),
// and every other client waited (for as long as they stayed). With the reserve, a fifth
// client's 4 KiB reads (and a 1 MiB one) are answered within a second each, and the slow
// readers stay connected (the write deadline is far off), holding no more than the
// unreserved part of the budget.
func TestSlowReadersDoNotBlockOthers(t *testing.T) {
	const big = 32 << 20
	disk := newRAM(2*big, 4096)
	want := pattern(23, 2<<20)
	disk.fill(0, want)
	ts := startServer(t, Config{}, map[string]Device{"disk": disk})
	for i := 0; i < 4; i++ {
		c := dialUnix(t, ts.sock)
		c.connect("disk", false)
		c.send(cmdRead, 0, 1, 0, big, nil)
		c.send(cmdRead, 0, 2, big, big, nil)
		// Never read: the replies fill the socket and the buffers stay held.
		if i < 3 {
			// One connection after the other: the fair share among holders decides what
			// each gets, so started together the four would hold 32 MiB each. In turn,
			// three get their 64 MiB and the fourth waits for the unreserved part
			// (192 MiB), the worst case for the other clients.
			want := int64(2 * (i + 1))
			waitFor(t, "the slow readers' reads in the device", func() bool { return disk.reads.Load() >= want })
		}
	}
	settle(t, ts.Server)
	st := ts.Stats()
	if st.BufferInUse < 3*2*big {
		t.Fatalf("slow readers hold %d bytes, want at least %d", st.BufferInUse, 3*2*big)
	}
	if st.Active != 4 {
		t.Fatalf("%d connections, want the 4 slow readers", st.Active)
	}

	c := dialUnix(t, ts.sock)
	c.connect("disk", false)
	for i, n := range []uint32{4096, 4096, 4096, 4096, 1 << 20, 4096} {
		c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		r := c.do(cmdRead, 0, uint64(i)*4096, n, nil)
		if d := time.Since(start); d > time.Second {
			t.Errorf("read %d (%d bytes) took %v with slow readers holding the budget", i, n, d)
		}
		if r.errno != 0 || !bytes.Equal(r.data, want[uint64(i)*4096:uint64(i)*4096+uint64(n)]) {
			t.Fatalf("read %d: errno %v, %d bytes", i, r.errno, len(r.data))
		}
	}
	if st := ts.Stats(); st.Active != 5 || st.BufferInUse > st.BufferBudget {
		t.Fatalf("after the reads: %d connections, %d of %d bytes in use", st.Active, st.BufferInUse, st.BufferBudget)
	}
}

// TestBufPoolReserve: a get by a connection that would hold more than smallMax is served only
// within the unreserved part (from the free list too); one holding little dips into the
// reserve, which has room for MaxConnections such connections.
func TestBufPoolReserve(t *testing.T) {
	// Budget 256 KiB, 64 KiB requests, 4 connections: reserve 64 KiB, small = 16 KiB.
	p := newBufPool(256<<10, 64<<10, 4, nil)
	if p.shared != 192<<10 || p.smallMax != 16<<10 {
		t.Fatalf("shared %d, smallMax %d", p.shared, p.smallMax)
	}
	wake := make(chan struct{}, 1)
	stop := make(chan struct{})
	var big []*buffer
	for i := 1; i <= 3; i++ {
		big = append(big, p.get(64<<10, holds(int64(i)*64<<10), wake, stop, nil))
	}
	// The unreserved part is in use: one more big get waits...
	got := make(chan *buffer, 1)
	go func() { got <- p.get(64<<10, holds(64<<10), wake, stop, nil) }()
	notReady(t, got, 30*time.Millisecond, "a big get took from the reserve")
	// ...while four connections holding 16 KiB each are served from the reserve at once.
	var small []*buffer
	for i := 0; i < 4; i++ {
		small = append(small, p.get(16<<10, holds(16<<10), make(chan struct{}, 1), stop, nil))
	}
	if _, inUse, _ := p.stats(); inUse != 256<<10 {
		t.Fatalf("in use %d", inUse)
	}
	// A free buffer of the reserve is not handed to a big holder either.
	p.put(small[0])
	notReady(t, got, 30*time.Millisecond, "a big get was served while the unreserved part is in use")
	// A connection that would hold 32 KiB (more than smallMax) asks for the 16 KiB class, of
	// which a free buffer is there: it waits, and gives up when stopped.
	stop2 := make(chan struct{})
	res := make(chan *buffer, 1)
	go func() { res <- p.get(16<<10, holds(32<<10), make(chan struct{}, 1), stop2, nil) }()
	select {
	case b := <-res:
		t.Fatalf("a big holder took a reserve buffer (%v)", b != nil)
	case <-time.After(30 * time.Millisecond):
	}
	close(stop2)
	if b := <-res; b != nil {
		t.Fatal("stopped get returned a buffer")
	}
	// Releasing a big buffer lets the waiting big get in.
	p.put(big[0])
	select {
	case b := <-got:
		big[0] = b
	case <-time.After(5 * time.Second):
		t.Fatal("the big get was not served after a put")
	}
	for _, b := range append(big, small[1:]...) {
		p.put(b)
	}
	if _, inUse, _ := p.stats(); inUse != 0 {
		t.Fatalf("in use %d after every put", inUse)
	}
	// A budget of one maximum-size buffer has no reserve (every request must fit).
	if q := newBufPool(64<<10, 64<<10, 4, nil); q.shared != 64<<10 || q.smallMax != 0 {
		t.Fatalf("tiny pool: shared %d, smallMax %d", q.shared, q.smallMax)
	}
}

// TestWriteTimeout: a connection whose client stops reading is closed once a batch of replies
// has waited WriteTimeout for the socket; it is counted, logged once, and its buffers are back
// in the pool, while another client goes on being served. The same holds with an AsyncDevice
// (replies written from completions) and over a pipe (ServeConn, no raw socket), where
// ServeConn reports ErrWriteStalled.
func TestWriteTimeout(t *testing.T) {
	const wt = 300 * time.Millisecond
	for _, async := range []bool{false, true} {
		name := "sync"
		if async {
			name = "async"
		}
		t.Run(name, func(t *testing.T) {
			disk := newRAM(16<<20, 4096)
			disk.fill(0, pattern(5, 16<<20))
			var dev Device = disk
			if async {
				dev = newAsyncRAM(t, disk)
			}
			core, logs := observer.New(zapcore.InfoLevel)
			ts := startServer(t, Config{WriteTimeout: wt, Logger: zap.New(core)}, map[string]Device{"disk": dev})
			good := dialUnix(t, ts.sock)
			good.connect("disk", false)

			slow := dialUnix(t, ts.sock)
			slow.connect("disk", true)
			start := time.Now()
			slow.send(cmdRead, 0, 1, 0, 4<<20, nil) // far more than the socket buffers hold
			slow.send(cmdRead, 0, 2, 4<<20, 4<<20, nil)
			waitFor(t, "the stalled connection closed", func() bool { return ts.Stats().Active == 1 })
			if d := time.Since(start); d < wt {
				t.Fatalf("closed after %v, before the write timeout %v", d, wt)
			}
			slow.expectClosed() // the client sees the end of the stream after what was sent
			st := ts.Stats()
			if st.BufferInUse != 0 {
				t.Fatalf("%d bytes of buffers still in use after the stalled connection closed", st.BufferInUse)
			}
			if es := exportStats(t, ts.Server, "disk"); es.StalledClosed != 1 {
				t.Fatalf("StalledClosed %d, want 1", es.StalledClosed)
			}
			if r := good.do(cmdRead, 0, 0, 1<<20, nil); r.errno != 0 || len(r.data) != 1<<20 {
				t.Fatalf("the other client: %+v", r.errno)
			}
			if n := logs.FilterMessageSnippet("does not read its replies").Len(); n != 1 {
				t.Fatalf("%d log lines about the stalled connection, want 1", n)
			}
		})
	}
	t.Run("pipe", func(t *testing.T) {
		s, err := NewServer(Config{WriteTimeout: wt})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.AddExport("disk", newRAM(1<<20, 512), ExportOptions{}); err != nil {
			t.Fatal(err)
		}
		a, b := net.Pipe()
		done := make(chan error, 1)
		go func() { done <- s.ServeConn(context.Background(), a) }()
		c := newClient(t, b)
		c.connect("disk", false)
		c.send(cmdRead, 0, 1, 0, 4096, nil) // a pipe holds nothing: the reply waits at once
		select {
		case err := <-done:
			if !errors.Is(err, ErrWriteStalled) {
				t.Fatalf("ServeConn: %v, want ErrWriteStalled", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("ServeConn did not return after the write timeout")
		}
		if st := s.Stats(); st.BufferInUse != 0 || st.Exports[0].StalledClosed != 1 {
			t.Fatalf("in use %d, StalledClosed %d", st.BufferInUse, st.Exports[0].StalledClosed)
		}
	})
}

// TestWriteTimeoutSparesSlowAndIdle: the write deadline covers only a batch that waits for the
// socket. A client that reads a reply late, but within the timeout, keeps its connection; so
// does one idle for longer than the timeout before and after (no stale deadline fails the next
// write).
func TestWriteTimeoutSparesSlowAndIdle(t *testing.T) {
	const wt = 300 * time.Millisecond
	disk := newRAM(16<<20, 4096)
	want := pattern(9, 16<<20)
	disk.fill(0, want)
	ts := startServer(t, Config{WriteTimeout: wt}, map[string]Device{"disk": disk})
	c := dialUnix(t, ts.sock)
	c.connect("disk", false)
	for round := 0; round < 3; round++ {
		c.send(cmdRead, 0, 1, 0, 4<<20, nil)
		time.Sleep(wt / 3) // the reply waits for the socket meanwhile
		r := c.mustReply()
		if r.errno != 0 || !bytes.Equal(r.data, want[:4<<20]) {
			t.Fatalf("round %d: errno %v", round, r.errno)
		}
		time.Sleep(2 * wt) // idle, past the deadline armed for the reply above
		if r := c.do(cmdRead, 0, 4096, 4096, nil); r.errno != 0 || !bytes.Equal(r.data, want[4096:8192]) {
			t.Fatalf("round %d: small read after idling: errno %v", round, r.errno)
		}
	}
	if es := exportStats(t, ts.Server, "disk"); es.StalledClosed != 0 || es.Conns != 1 {
		t.Fatalf("StalledClosed %d, conns %d", es.StalledClosed, es.Conns)
	}
}

// TestMaxConnections: with MaxConnections established, NBD_OPT_GO is answered
// NBD_REP_ERR_POLICY with a message and NBD_OPT_EXPORT_NAME closes; both are counted, and the
// established connections keep working. A slot freed by a disconnect is taken by the next
// client. Connections beyond MaxConnections in their handshake are closed at accept. The
// refusals are logged at most once per interval.
func TestMaxConnections(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	ts := startServer(t, Config{MaxConnections: 2, Logger: zap.New(core)}, handshakeExports())
	var est []*client
	for i := 0; i < 2; i++ {
		c := dialUnix(t, ts.sock)
		c.connect("disk", false)
		est = append(est, c)
	}
	over := dialUnix(t, ts.sock)
	over.hello(clientFlagFixedNewstyle | clientFlagNoZeroes)
	res := over.info(optGo, "disk")
	if res.final.typ != repErrPolicy || !strings.Contains(string(res.final.data), "too many connections") {
		t.Fatalf("NBD_OPT_GO over the limit: reply %#x %q, want NBD_REP_ERR_POLICY", res.final.typ, res.final.data)
	}
	// The refused client may still ask for information, then goes away.
	if res := over.info(optInfo, "disk"); res.final.typ != repAck || !res.gotExport {
		t.Fatalf("NBD_OPT_INFO after the refusal: %#x", res.final.typ)
	}
	over.sendOpt(optAbort, nil)
	over.expectClosed()

	old := dialUnix(t, ts.sock)
	old.hello(clientFlagFixedNewstyle)
	old.sendOpt(optExportName, []byte("disk"))
	old.expectClosed()
	if st := ts.Stats(); st.Refused != 2 {
		t.Fatalf("Refused %d, want 2", st.Refused)
	}
	for i, c := range est {
		if r := c.do(cmdRead, 0, 0, 4096, nil); r.errno != 0 {
			t.Fatalf("established connection %d: %v", i, r.errno)
		}
	}
	// A disconnect frees a slot.
	est[0].send(cmdDisc, 0, 9, 0, 0, nil)
	est[0].expectClosed()
	waitFor(t, "the slot freed", func() bool { return exportStats(t, ts.Server, "disk").Conns == 1 })
	again := dialUnix(t, ts.sock)
	again.connect("disk", false)
	if r := again.do(cmdRead, 0, 0, 4096, nil); r.errno != 0 {
		t.Fatal(r.errno)
	}

	// Handshake phase: two connections that have not chosen an export fill it (the limit is
	// MaxConnections again); the next one is closed before the greeting.
	waitFor(t, "the refused connections gone", func() bool { return ts.Stats().Active == 2 })
	var waiting []*client
	for i := 0; i < 2; i++ {
		c := dialUnix(t, ts.sock)
		c.hello(clientFlagFixedNewstyle | clientFlagNoZeroes)
		waiting = append(waiting, c)
	}
	waitFor(t, "two handshakes", func() bool { return ts.Stats().Active == 4 })
	nc, err := net.Dial("unix", ts.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := io.Copy(io.Discard, nc); err != nil || n != 0 {
		t.Fatalf("connection over the handshake limit: %d bytes, %v; want closed at once", n, err)
	}
	if st := ts.Stats(); st.Refused != 3 {
		t.Fatalf("Refused %d, want 3", st.Refused)
	}
	// Three refusals in a row are logged once (rate-limited), whatever their phase.
	if n := logs.FilterMessageSnippet("refused a connection").Len(); n != 1 {
		t.Fatalf("%d log lines about refused connections, want 1", n)
	}
	// The waiting handshakes are unharmed (their GO is refused: both slots are taken).
	if res := waiting[0].info(optGo, "disk"); res.final.typ != repErrPolicy {
		t.Fatalf("GO: %#x", res.final.typ)
	}
	// ServeConn over the handshake limit fails with ErrTooManyConnections.
	a, b := net.Pipe()
	defer b.Close()
	if err := ts.ServeConn(context.Background(), a); !errors.Is(err, ErrTooManyConnections) {
		t.Fatalf("ServeConn: %v, want ErrTooManyConnections", err)
	}
}

// TestFairShare: a connection holds at most its share of the unreserved budget among the
// connections holding buffers. A first client alone takes the whole unreserved part; a second
// one then waits; as the first one's requests complete, each gets half (the first keeps fewer
// requests in the device, the second gets exactly half), not whatever is free.
func TestFairShare(t *testing.T) {
	const (
		n      = 64 << 10
		span   = 4 << 20 // each client's region
		budget = 4 << 20 // reserve 1 MiB, unreserved 3 MiB (48 requests), half 24
	)
	disk := newRAM(2*span, 4096)
	releaseA, releaseAll := make(chan struct{}), make(chan struct{})
	var inA, inB, seenA atomic.Int64
	disk.setHook(func(ctx context.Context, op string, off, _ int64) error {
		if op != "read" {
			return nil
		}
		wait := releaseAll
		ctr := &inB
		if off < span {
			ctr = &inA
			if seenA.Add(1) <= 48 {
				wait = releaseA
			}
		}
		ctr.Add(1)
		defer ctr.Add(-1)
		select {
		case <-wait:
		case <-ctx.Done():
		}
		return nil
	})
	ts := startServer(t, Config{MaxRequestSize: n, MaxInFlightBytes: budget, MaxInFlight: 128, Workers: 128},
		map[string]Device{"disk": disk})
	a := dialUnix(t, ts.sock)
	a.connect("disk", false)
	for h := uint64(0); h < 64; h++ {
		a.send(cmdRead, 0, h, h*n, n, nil)
	}
	waitFor(t, "A's first 48 reads in the device", func() bool { return inA.Load() == 48 })
	b := dialUnix(t, ts.sock)
	b.connect("disk", false)
	for h := uint64(0); h < 64; h++ {
		b.send(cmdRead, 0, h, span+h*n, n, nil)
	}
	time.Sleep(50 * time.Millisecond)
	if k := inB.Load(); k != 0 {
		t.Fatalf("B has %d reads in the device while A holds the unreserved budget", k)
	}
	close(releaseA)
	for i := 0; i < 48; i++ {
		if r := a.mustReply(); r.errno != 0 {
			t.Fatal(r.errno)
		}
	}
	waitFor(t, "B's share in the device", func() bool { return inB.Load() == 24 && inA.Load() == 16 })
	time.Sleep(50 * time.Millisecond)
	if ka, kb := inA.Load(), inB.Load(); ka != 16 || kb != 24 {
		t.Fatalf("A %d, B %d reads in the device; want 16 (the rest of A's) and 24 (half the unreserved budget)", ka, kb)
	}
	close(releaseAll)
	for i := 0; i < 16; i++ {
		if r := a.mustReply(); r.errno != 0 {
			t.Fatal(r.errno)
		}
	}
	for i := 0; i < 64; i++ {
		if r := b.mustReply(); r.errno != 0 {
			t.Fatal(r.errno)
		}
	}
}

// noReserve as newBufPool's connection count leaves no reserve (less than a 4 KiB buffer per
// connection): the whole budget is shared, for tests of the pool's other rules.
const noReserve = 1 << 30

// holds is a fixed holding for bufPool.get.
func holds(n int64) func() int64 { return func() int64 { return n } }

// TestBufPoolHoldingRechecked: a light connection's get that waits because, with a buffer not
// yet given back, it would hold more than smallMax is served from the reserve once that buffer
// is back: what it holds is asked again after the wait. (A fifth NBD client's 1 MiB read,
// sent right after its 4 KiB reply arrived but before that buffer was released, waited for
// as long as the slow readers stayed.)
func TestBufPoolHoldingRechecked(t *testing.T) {
	// Budget 256 KiB, 64 KiB requests, 4 connections: reserve 64 KiB, small = 16 KiB.
	p := newBufPool(256<<10, 64<<10, 4, nil)
	stop := make(chan struct{})
	defer close(stop)
	var big []*buffer
	for i := 1; i <= 3; i++ {
		big = append(big, p.get(64<<10, holds(64<<10), make(chan struct{}, 1), stop, nil))
	}
	var holding atomic.Int64
	holding.Store(8 << 10)
	first := p.get(8<<10, holding.Load, make(chan struct{}, 1), stop, nil) // from the reserve
	holding.Add(16 << 10)                                                  // 24 KiB with the next one: over smallMax
	got := make(chan *buffer, 1)
	go func() { got <- p.get(16<<10, holding.Load, make(chan struct{}, 1), stop, nil) }()
	select {
	case <-got:
		t.Fatal("a get over smallMax was served from the reserve")
	case <-time.After(30 * time.Millisecond):
	}
	holding.Add(-8 << 10) // the first buffer goes back: 16 KiB with the new one
	p.put(first)
	select {
	case b := <-got:
		if b == nil {
			t.Fatal("nil buffer")
		}
		p.put(b)
	case <-time.After(5 * time.Second):
		t.Fatal("the get was not served once the connection's own buffer was back")
	}
	for _, b := range big {
		p.put(b)
	}
}

// TestWriteTimeoutSparesSteadyReader: the write timeout bounds a wait in which the client
// takes nothing; a client that reads a 4 MiB reply in 256 KiB pieces with pauses shorter than
// the timeout, for several times the timeout in all, keeps its connection and gets every byte.
func TestWriteTimeoutSparesSteadyReader(t *testing.T) {
	const wt = 300 * time.Millisecond
	const n = 4 << 20
	disk := newRAM(n, 4096)
	want := pattern(11, n)
	disk.fill(0, want)
	ts := startServer(t, Config{WriteTimeout: wt}, map[string]Device{"disk": disk})
	c := dialUnix(t, ts.sock)
	c.connect("disk", false)
	c.send(cmdRead, 0, 7, 0, n, nil)
	got := make([]byte, simpleReplyLen+n)
	start := time.Now()
	for off := 0; off < len(got); {
		time.Sleep(wt / 3)
		c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, err := io.ReadAtLeast(c.nc, got[off:min(off+256<<10, len(got))], 1)
		if err != nil {
			t.Fatalf("after %d of %d bytes (%v): %v", off, len(got), time.Since(start), err)
		}
		off += k
	}
	if d := time.Since(start); d < 3*wt {
		t.Fatalf("the reply was read in %v; the test needs a read slower than 3× the timeout", d)
	}
	if !bytes.Equal(got[simpleReplyLen:], want) {
		t.Fatal("reply data differ")
	}
	if es := exportStats(t, ts.Server, "disk"); es.StalledClosed != 0 {
		t.Fatalf("StalledClosed %d", es.StalledClosed)
	}
	if r := c.do(cmdRead, 0, 0, 4096, nil); r.errno != 0 || !bytes.Equal(r.data, want[:4096]) {
		t.Fatalf("read after the slow one: errno %v", r.errno)
	}
}
