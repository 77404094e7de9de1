package nbd

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/cbatch"
)

// asyncRAM is a ramDevice that is also an AsyncDevice: requests are completed, in order, by
// one goroutine (as a transport's receive goroutine completes an initiator's commands), which
// counts the completions it has delivered.
type asyncRAM struct {
	*ramDevice
	q         chan func()
	delivered atomic.Int64
	posted    atomic.Int64
}

func newAsyncRAM(t testing.TB, d *ramDevice) *asyncRAM {
	a := &asyncRAM{ramDevice: d, q: make(chan func(), 1024)}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case f := <-a.q:
				f()
			case <-stop:
				return
			}
		}
	}()
	t.Cleanup(func() { close(stop); wg.Wait() })
	return a
}

var errAsyncTest = errors.New("injected async failure")

func (a *asyncRAM) ReadAtAsync(ctx context.Context, p []byte, off int64, done func(error)) {
	a.posted.Add(1)
	a.q <- func() {
		err := a.ReadAt(ctx, p, off)
		if off == 3*4096 {
			err = errAsyncTest
		}
		done(err)
		a.delivered.Add(1)
	}
}

func (a *asyncRAM) WriteAtAsync(ctx context.Context, p []byte, off int64, fua bool, done func(error)) {
	a.posted.Add(1)
	a.q <- func() {
		done(a.WriteAt(ctx, p, off, fua))
		a.delivered.Add(1)
	}
}

func (a *asyncRAM) AsyncError(err error, write bool) error {
	if errors.Is(err, errAsyncTest) {
		return DeviceError(ENOSPC, err)
	}
	return err
}

// TestAsyncDevice: an AsyncDevice's READs and WRITEs are posted by the reader and answered from
// their completion. With a client that sends 48 reads of 256 KiB (12 MiB, far more than the
// socket holds) before reading any reply, every completion is still delivered promptly: the
// completing goroutine never waits for the socket (a goroutine finishes the replies that do not
// fit). Then every reply arrives, in full and correct; errors map through AsyncError; writes
// land; and a graceful shutdown waits for posted requests.
func TestAsyncDevice(t *testing.T) {
	disk := newRAM(testSize*4, testBS)
	disk.fill(0, pattern(7, testSize*4))
	ad := newAsyncRAM(t, disk)
	ts := startServer(t, Config{MaxRequestSize: 1 << 20, ConnMaxInFlightBytes: 64 << 20}, map[string]Device{"disk": ad})
	c := dialUnix(t, ts.sock)
	c.connect("disk", false)

	const n, size = 48, 256 << 10
	for h := uint64(0); h < n; h++ {
		c.send(cmdRead, 0, h, (h*size)%(testSize*4), size, nil)
	}
	waitFor(t, "every read completed by the device without the client reading", func() bool {
		return ad.delivered.Load() == n
	})
	for i := 0; i < n; i++ {
		r := c.mustReply()
		off := (r.handle * size) % (testSize * 4)
		if r.errno != 0 || !bytes.Equal(r.data, disk.snapshot(int64(off), size)) {
			t.Fatalf("reply %d: errno %v, %d bytes, data matches %v", r.handle, r.errno, len(r.data),
				bytes.Equal(r.data, disk.snapshot(int64(off), size)))
		}
	}
	// An error from the completion is mapped with AsyncError.
	if r := c.do(cmdRead, 0, 3*4096, 4096, nil); r.errno != ENOSPC {
		t.Fatalf("failed async read: errno %v", r.errno)
	}
	// Writes go through WriteAtAsync.
	w := pattern(9, 64<<10)
	if r := c.do(cmdWrite, cmdFlagFUA, 128<<10, uint32(len(w)), w); r.errno != 0 {
		t.Fatalf("write: %v", r.errno)
	}
	if !bytes.Equal(disk.snapshot(128<<10, int64(len(w))), w) {
		t.Fatal("async write did not land")
	}
	if p := ad.posted.Load(); p != n+2 {
		t.Fatalf("%d requests posted asynchronously, want %d", p, n+2)
	}
	// Requests in flight when the server stops are answered first.
	gate := make(chan struct{})
	disk.holdReads(gate)
	c.send(cmdRead, 0, 1000, 0, 4096, nil)
	waitFor(t, "read in the device", func() bool { return disk.active.Load() == 1 })
	stopped := make(chan struct{})
	go func() { ts.stop(t); close(stopped) }()
	notReady(t, stopped, 50*time.Millisecond, "the server stopped with a posted request unanswered")
	close(gate)
	if r := c.mustReply(); r.handle != 1000 || r.errno != 0 {
		t.Fatalf("in-flight reply %+v", r)
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not stop")
	}
}

// inlineRAM is an AsyncDevice that completes every request inside ReadAtAsync/WriteAtAsync,
// on the reader's goroutine, as the SRP initiator does when the target is on its own softroce
// device (transport.Progresser).
type inlineRAM struct{ *ramDevice }

func (a inlineRAM) ReadAtAsync(ctx context.Context, p []byte, off int64, done func(error)) {
	done(a.ReadAt(ctx, p, off))
}

func (a inlineRAM) WriteAtAsync(ctx context.Context, p []byte, off int64, fua bool, done func(error)) {
	done(a.WriteAt(ctx, p, off, fua))
}

func (a inlineRAM) AsyncError(err error, write bool) error { return err }

// TestHeldReplies: replies to requests the reader already had in its buffer are written
// together, before the reader next waits. A burst of 32 reads sent with one write is answered
// with far fewer writes than replies (one per reply without holding), every reply correct.
// And the reader never waits with replies held: with fewer request slots than the burst
// (MaxInFlight), a connection window (ConnMaxInFlightBytes) or a server buffer budget
// (MaxInFlightBytes) smaller than it, each of which the held replies themselves occupy, the
// burst is still answered in full (without the flush before those waits, it hangs).
func TestHeldReplies(t *testing.T) {
	const n, size = 32, 4096
	for _, tc := range []struct {
		name     string
		cfg      Config
		maxWrite uint64 // most reply writes allowed for the burst
	}{
		{"burst", Config{}, n / 4},
		{"few-slots", Config{MaxInFlight: 4}, n},
		{"small-window", Config{ConnMaxInFlightBytes: 3 * size}, n},
		{"small-budget", Config{MaxInFlightBytes: 2 * size, ConnMaxInFlightBytes: 2 * size}, n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			disk := newRAM(testSize, testBS)
			disk.fill(0, pattern(5, testSize))
			ts := startServer(t, tc.cfg, map[string]Device{"disk": inlineRAM{disk}})
			c := dialUnix(t, ts.sock)
			c.connect("disk", false)
			c.nc.SetDeadline(time.Now().Add(10 * time.Second))
			burst := readBurst(c, n, size, 3)
			// A write in the burst, with its payload (at blocks no read of the burst reads): the
			// reader holds replies across it.
			w := pattern(6, 2*size)
			burst = append(burst, encodeRequest(cmdWrite, 0, n, size, uint32(len(w)), w)...)
			c.write(burst)
			seen := map[uint64]bool{}
			for i := 0; i <= n; i++ {
				r := c.mustReply()
				if r.errno != 0 || seen[r.handle] {
					t.Fatalf("reply %d: errno %v, duplicate %v", r.handle, r.errno, seen[r.handle])
				}
				seen[r.handle] = true
				if r.handle < n && !bytes.Equal(r.data, disk.snapshot(int64(r.handle*size*3%testSize), size)) {
					t.Fatalf("reply %d: wrong data", r.handle)
				}
			}
			if !bytes.Equal(disk.snapshot(size, int64(len(w))), w) {
				t.Fatal("the write in the burst did not land")
			}
			// A request on its own is answered at once (nothing is held for a next one).
			if r := c.do(cmdRead, 0, size, size, nil); r.errno != 0 || !bytes.Equal(r.data, w[:size]) {
				t.Fatalf("single read: errno %v", r.errno)
			}
			st := ts.Stats()
			if len(st.Conns) != 1 {
				t.Fatalf("%d connections in the stats", len(st.Conns))
			}
			cs := st.Conns[0].Counters
			if cs.Requests != n+2 {
				t.Fatalf("%d requests counted, want %d", cs.Requests, n+2)
			}
			// The single read's reply is one write of its own.
			if cs.ReplyWrites < 2 || cs.ReplyWrites-1 > tc.maxWrite {
				t.Fatalf("the burst of %d replies took %d writes, want at most %d", n+1, cs.ReplyWrites-1, tc.maxWrite)
			}
			t.Logf("%d replies in %d writes", cs.Requests, cs.ReplyWrites)
		})
	}
}

// batchRAM is an AsyncDevice that keeps the requests posted to it until release, which
// completes them all on one goroutine, as one batch of a transport's receive goroutine: with
// brackets, between the BeginCompletions and EndCompletions of the Batcher their context
// carries (internal/cbatch, as the initiator's completion handling does).
type batchRAM struct {
	*ramDevice
	brackets bool
	mu       sync.Mutex
	held     []func()
	ctx      context.Context
}

func (a *batchRAM) hold(ctx context.Context, f func()) {
	a.mu.Lock()
	a.held, a.ctx = append(a.held, f), ctx
	a.mu.Unlock()
}

func (a *batchRAM) ReadAtAsync(ctx context.Context, p []byte, off int64, done func(error)) {
	a.hold(ctx, func() { done(a.ReadAt(ctx, p, off)) })
}

func (a *batchRAM) WriteAtAsync(ctx context.Context, p []byte, off int64, fua bool, done func(error)) {
	a.hold(ctx, func() { done(a.WriteAt(ctx, p, off, fua)) })
}

func (a *batchRAM) AsyncError(err error, _ bool) error { return err }

func (a *batchRAM) posted() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.held)
}

// release completes every held request in one batch, on a goroutine of its own.
func (a *batchRAM) release() {
	a.mu.Lock()
	fs, ctx := a.held, a.ctx
	a.held = nil
	a.mu.Unlock()
	go func() {
		b := cbatch.From(ctx)
		if a.brackets && b != nil {
			b.BeginCompletions()
		}
		for _, f := range fs {
			f()
		}
		if a.brackets && b != nil {
			b.EndCompletions()
		}
	}()
}

// TestAsyncCompletionBatch: the replies of a batch of answers the Device brackets with
// BeginCompletions/EndCompletions leave in one write (one wake-up of the client); without the
// brackets each answer writes its own reply. Every reply is right either way.
func TestAsyncCompletionBatch(t *testing.T) {
	const n, size = 16, 4096
	for _, tc := range []struct {
		name       string
		brackets   bool
		wantWrites uint64
	}{
		{"bracketed", true, 1},
		{"unbracketed", false, n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			disk := newRAM(testSize, testBS)
			disk.fill(0, pattern(3, testSize))
			dev := &batchRAM{ramDevice: disk, brackets: tc.brackets}
			ts := startServer(t, Config{}, map[string]Device{"disk": dev})
			c := dialUnix(t, ts.sock)
			c.connect("disk", false)
			c.nc.SetDeadline(time.Now().Add(10 * time.Second))
			burst := readBurst(c, n, size, 5)
			c.write(burst)
			waitFor(t, "every read posted", func() bool { return dev.posted() == n })
			before := ts.Stats().Conns[0].Counters.ReplyWrites
			dev.release()
			for i := 0; i < n; i++ {
				r := c.mustReply()
				if r.errno != 0 || !bytes.Equal(r.data, disk.snapshot(int64(r.handle*size*5%testSize), size)) {
					t.Fatalf("reply %d: errno %v or wrong data", r.handle, r.errno)
				}
			}
			if w := ts.Stats().Conns[0].Counters.ReplyWrites - before; w != tc.wantWrites {
				t.Fatalf("%d replies took %d writes, want %d", n, w, tc.wantWrites)
			}
		})
	}
}

// readBurst registers n reads of size bytes with c as pending (handles 0 to n-1, read h at
// h*size*stride modulo testSize) and returns their requests, for one write.
func readBurst(c *client, n, size, stride uint64) []byte {
	var burst []byte
	c.mu.Lock()
	defer c.mu.Unlock()
	for h := uint64(0); h < n; h++ {
		c.pending[h] = uint32(size)
		burst = append(burst, encodeRequest(cmdRead, 0, h, h*size*stride%testSize, uint32(size), nil)...)
	}
	return burst
}
