package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	testSize = 4 << 20
	testBS   = 512
)

// pattern returns n bytes derived from seed.
func pattern(seed uint64, n int) []byte {
	b := make([]byte, n+7)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n:n]
}

// fixture is a server with a read-write "disk" (discard capable) and a read-only "ro" export.
type fixture struct {
	ts   *testServer
	disk *ramDevice
	ro   *ramDevice
}

func newFixture(t testing.TB, cfg Config) *fixture {
	disk := newRAM(testSize, testBS)
	disk.fill(0, pattern(1, testSize))
	ro := newRAM(testSize, 4096)
	ro.ro = true
	ro.fill(0, pattern(2, testSize))
	return &fixture{ts: startServer(t, cfg, map[string]Device{"disk": disk, "ro": ro}), disk: disk, ro: ro}
}

func (f *fixture) client(t testing.TB, export string, structured bool) *client {
	c := dialUnix(t, f.ts.sock)
	c.connect(export, structured)
	return c
}

func TestCommands(t *testing.T) {
	f := newFixture(t, Config{MaxRequestSize: 1 << 20})
	maxReq := uint32(1 << 20)

	tests := []struct {
		name   string
		export string
		typ    uint16
		flags  uint16
		off    uint64
		length uint32
		write  []byte // WRITE payload (length bytes)
		errno  Errno
		check  func(t *testing.T, r reply)
	}{
		{name: "read", export: "disk", typ: cmdRead, off: 4096, length: 8192, check: func(t *testing.T, r reply) {
			if !bytes.Equal(r.data, f.disk.snapshot(4096, 8192)) {
				t.Fatal("read data differs")
			}
		}},
		{name: "read with FUA", export: "disk", typ: cmdRead, flags: cmdFlagFUA, off: 0, length: 512},
		{name: "read at the end", export: "disk", typ: cmdRead, off: testSize - 512, length: 512},
		{name: "read zero length", export: "disk", typ: cmdRead, off: 0, length: 0},
		{name: "read max size", export: "disk", typ: cmdRead, off: 0, length: maxReq},
		{name: "read beyond end", export: "disk", typ: cmdRead, off: testSize - 512, length: 1024, errno: EINVAL},
		{name: "read offset beyond end", export: "disk", typ: cmdRead, off: 1 << 62, length: 512, errno: EINVAL},
		{name: "read offset overflow", export: "disk", typ: cmdRead, off: ^uint64(0) - 100, length: 512, errno: EINVAL},
		{name: "read unaligned offset", export: "disk", typ: cmdRead, off: 100, length: 512, errno: EINVAL},
		{name: "read unaligned length", export: "disk", typ: cmdRead, off: 0, length: 100, errno: EINVAL},
		{name: "read too large", export: "disk", typ: cmdRead, off: 0, length: maxReq + 512, errno: EINVAL},
		{name: "read with NO_HOLE", export: "disk", typ: cmdRead, flags: cmdFlagNoHole, length: 512, errno: EINVAL},
		{name: "read with unknown flag", export: "disk", typ: cmdRead, flags: 1 << 9, length: 512, errno: EINVAL},
		{name: "read on read-only", export: "ro", typ: cmdRead, off: 4096, length: 4096},
		{name: "read-only unaligned to 4096", export: "ro", typ: cmdRead, off: 512, length: 4096, errno: EINVAL},
		{name: "write", export: "disk", typ: cmdWrite, off: 1 << 20, length: 4096, write: pattern(7, 4096), check: func(t *testing.T, r reply) {
			if !bytes.Equal(f.disk.snapshot(1<<20, 4096), pattern(7, 4096)) {
				t.Fatal("device content differs after write")
			}
		}},
		{name: "write FUA", export: "disk", typ: cmdWrite, flags: cmdFlagFUA, off: 0, length: 512, write: pattern(8, 512), check: func(t *testing.T, r reply) {
			if f.disk.fuaWrites.Load() == 0 {
				t.Fatal("FUA not passed to WriteAt")
			}
		}},
		{name: "write zero length", export: "disk", typ: cmdWrite, off: 0, length: 0},
		{name: "write beyond end", export: "disk", typ: cmdWrite, off: testSize - 512, length: 1024, write: make([]byte, 1024), errno: ENOSPC},
		{name: "write unaligned", export: "disk", typ: cmdWrite, off: 1, length: 512, write: make([]byte, 512), errno: EINVAL},
		{name: "write too large is skipped", export: "disk", typ: cmdWrite, off: 0, length: maxReq + 512, write: make([]byte, maxReq+512), errno: EINVAL},
		{name: "write on read-only", export: "ro", typ: cmdWrite, off: 0, length: 4096, write: make([]byte, 4096), errno: EPERM},
		{name: "write with DF", export: "disk", typ: cmdWrite, flags: cmdFlagDF, length: 512, write: make([]byte, 512), errno: EINVAL},
		{name: "flush", export: "disk", typ: cmdFlush},
		{name: "flush ignores offset and length", export: "disk", typ: cmdFlush, off: 5, length: 7},
		{name: "flush on read-only", export: "ro", typ: cmdFlush},
		{name: "trim", export: "disk", typ: cmdTrim, off: 2 << 20, length: 8192, check: func(t *testing.T, r reply) {
			if d := f.disk.lastDiscard.Load(); d == nil || *d != [2]int64{2 << 20, 8192} {
				t.Fatalf("discard %v", d)
			}
			if !bytes.Equal(f.disk.snapshot(2<<20, 8192), make([]byte, 8192)) {
				t.Fatal("discarded range not zero on the RAM device")
			}
		}},
		{name: "trim is rounded inwards", export: "disk", typ: cmdTrim, off: 3<<20 + 100, length: 2000, check: func(t *testing.T, r reply) {
			if d := f.disk.lastDiscard.Load(); d == nil || *d != [2]int64{3<<20 + 512, 1536} {
				t.Fatalf("discard %v", d)
			}
		}},
		{name: "trim beyond end", export: "disk", typ: cmdTrim, off: testSize, length: 512, errno: EINVAL},
		{name: "trim on read-only", export: "ro", typ: cmdTrim, off: 0, length: 4096, errno: EPERM},
		{name: "trim FUA flushes", export: "disk", typ: cmdTrim, flags: cmdFlagFUA, off: 0, length: 512},
		{name: "write zeroes", export: "disk", typ: cmdWriteZeroes, off: 4096, length: 4096, check: func(t *testing.T, r reply) {
			if !bytes.Equal(f.disk.snapshot(4096, 4096), make([]byte, 4096)) {
				t.Fatal("not zeroed")
			}
		}},
		{name: "write zeroes NO_HOLE", export: "disk", typ: cmdWriteZeroes, flags: cmdFlagNoHole | cmdFlagFUA, off: 0, length: 512, check: func(t *testing.T, r reply) {
			if f.disk.noUnmapZeroes.Load() == 0 {
				t.Fatal("NO_HOLE not passed as noUnmap")
			}
		}},
		{name: "write zeroes larger than the max request", export: "disk", typ: cmdWriteZeroes, off: 0, length: 2 * maxReq},
		{name: "write zeroes beyond end", export: "disk", typ: cmdWriteZeroes, off: testSize - 512, length: 1024, errno: ENOSPC},
		{name: "write zeroes FAST_ZERO", export: "disk", typ: cmdWriteZeroes, flags: cmdFlagFastZero, off: 0, length: 512, errno: EINVAL},
		{name: "write zeroes on read-only", export: "ro", typ: cmdWriteZeroes, off: 0, length: 4096, errno: EPERM},
		{name: "cache", export: "disk", typ: cmdCache, off: 0, length: 4096},
		{name: "cache beyond end", export: "disk", typ: cmdCache, off: testSize, length: 512, errno: EINVAL},
		{name: "block status is not negotiated", export: "disk", typ: cmdBlockStatus, off: 0, length: 512, errno: EINVAL},
		{name: "unknown command", export: "disk", typ: 42, off: 0, length: 512, errno: EINVAL},
	}
	for _, structured := range []bool{false, true} {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%s/structured=%v", tc.name, structured), func(t *testing.T) {
				c := f.client(t, tc.export, structured)
				r := c.do(tc.typ, tc.flags, tc.off, tc.length, tc.write)
				if r.errno != tc.errno {
					t.Fatalf("errno %d (%q), want %d", r.errno, r.message, tc.errno)
				}
				if tc.typ == cmdRead && tc.errno == 0 && len(r.data) != int(tc.length) {
					t.Fatalf("read %d bytes, want %d", len(r.data), tc.length)
				}
				if tc.typ == cmdRead && tc.errno != 0 && len(r.data) != 0 {
					t.Fatal("payload sent with an error")
				}
				if structured {
					switch {
					case tc.errno != 0 && (len(r.chunks) != 1 || r.chunks[0] != replyTypeError || r.message == ""):
						t.Fatalf("error reply chunks %v message %q", r.chunks, r.message)
					case tc.typ == cmdRead && tc.errno == 0 && tc.length > 0 && (len(r.chunks) != 1 || r.chunks[0] != replyTypeOffsetData || r.dataOff != tc.off):
						t.Fatalf("read reply chunks %v offset %d", r.chunks, r.dataOff)
					case tc.typ == cmdRead && tc.length == 0 && (len(r.chunks) != 1 || r.chunks[0] != replyTypeNone):
						t.Fatalf("empty read reply chunks %v", r.chunks)
					}
				}
				if tc.check != nil {
					tc.check(t, r)
				}
				// The connection is still usable.
				if r := c.do(cmdFlush, 0, 0, 0, nil); r.errno != 0 {
					t.Fatalf("flush afterwards: %+v", r)
				}
			})
		}
	}
}

func TestDeviceErrors(t *testing.T) {
	f := newFixture(t, Config{})
	tests := []struct {
		err   error
		errno Errno
	}{
		{errors.New("boom"), EIO},
		{EIO, EIO},
		{ENOSPC, ENOSPC},
		{fmt.Errorf("session: %w", ESHUTDOWN), ESHUTDOWN},
		{DeviceError(EPERM, errors.New("reservation conflict")), EPERM},
		{DeviceError(Errno(77), nil), EIO},
		{DeviceError(ENOTSUP, errors.New("no UNMAP")), EINVAL},
		{EOVERFLOW, EINVAL},
		{Errno(1234), EIO},
		{syscall.EROFS, EPERM},
		{fmt.Errorf("wrapped: %w", syscall.EDQUOT), ENOSPC},
		{syscall.EFBIG, ENOSPC},
		{syscall.EINVAL, EINVAL},
		{syscall.ESHUTDOWN, ESHUTDOWN},
		{syscall.ENOMEM, EIO},
		{context.Canceled, ESHUTDOWN},
		{context.DeadlineExceeded, EIO},
	}
	ops := []struct {
		op    string
		typ   uint16
		write bool
	}{
		{"read", cmdRead, false},
		{"write", cmdWrite, true},
		{"flush", cmdFlush, false},
		{"discard", cmdTrim, false},
		{"zeroes", cmdWriteZeroes, false},
	}
	for _, structured := range []bool{false, true} {
		c := f.client(t, "disk", structured)
		for _, tc := range tests {
			for _, op := range ops {
				t.Run(fmt.Sprintf("%s/%v/structured=%v", op.op, tc.err, structured), func(t *testing.T) {
					f.disk.setHook(func(_ context.Context, o string, _, _ int64) error {
						if o == op.op {
							return tc.err
						}
						return nil
					})
					defer f.disk.setHook(nil)
					var payload []byte
					if op.write {
						payload = make([]byte, 4096)
					}
					r := c.do(op.typ, 0, 8192, 4096, payload)
					if op.typ == cmdFlush {
						r = c.do(op.typ, 0, 0, 0, nil)
					}
					if r.errno != tc.errno {
						t.Fatalf("errno %d, want %d", r.errno, tc.errno)
					}
					if structured && !strings.Contains(r.message, tc.err.Error()) {
						t.Errorf("error message %q does not carry %q", r.message, tc.err)
					}
				})
			}
		}
	}
	if got := ErrnoOf(nil); got != 0 {
		t.Fatalf("ErrnoOf(nil) = %d", got)
	}
	if !errors.Is(DeviceError(ENOSPC, errors.New("x")), ENOSPC) {
		t.Fatal("errors.Is(*Error, code) is false")
	}
}

func TestBadRequestMagicCloses(t *testing.T) {
	f := newFixture(t, Config{})
	c := f.client(t, "disk", false)
	b := encodeRequest(cmdRead, 0, 1, 0, 512, nil)
	b[0] ^= 0xff
	c.write(b)
	c.expectClosed()
}

func TestHugeWriteCloses(t *testing.T) {
	f := newFixture(t, Config{MaxRequestSize: 64 << 10})
	c := f.client(t, "disk", false)
	// More than 4×MaxRequestSize: not worth skipping; the server drops the connection.
	c.write(encodeRequest(cmdWrite, 0, 1, 0, 4*(64<<10)+512, nil))
	c.expectClosed()
}

func TestDisconnectCommand(t *testing.T) {
	f := newFixture(t, Config{})
	c := f.client(t, "disk", false)
	release := make(chan struct{})
	f.disk.holdReads(release)
	defer f.disk.setHook(nil)
	// Requests in flight when NBD_CMD_DISC arrives are still answered.
	c.send(cmdRead, 0, 1, 0, 512, nil)
	c.send(cmdRead, 0, 2, 512, 512, nil)
	c.send(cmdDisc, 0, 3, 0, 0, nil)
	time.Sleep(20 * time.Millisecond)
	close(release)
	got := map[uint64]bool{}
	for i := 0; i < 2; i++ {
		r := c.mustReply()
		got[r.handle] = r.errno == 0
	}
	if !got[1] || !got[2] {
		t.Fatalf("replies %v", got)
	}
	c.expectClosed()
}

// TestOutOfOrder blocks one read in the device and checks that later requests are answered
// first, each with its own handle and data.
func TestOutOfOrder(t *testing.T) {
	for _, structured := range []bool{false, true} {
		t.Run(fmt.Sprintf("structured=%v", structured), func(t *testing.T) {
			f := newFixture(t, Config{})
			c := f.client(t, "disk", structured)
			release := make(chan struct{})
			f.disk.setHook(func(ctx context.Context, op string, off, n int64) error {
				if op == "read" && off == 0 {
					select {
					case <-release:
					case <-ctx.Done():
					}
				}
				return nil
			})
			defer f.disk.setHook(nil)
			want := pattern(1, testSize)
			c.send(cmdRead, 0, 100, 0, 4096, nil)
			for i := uint64(1); i <= 10; i++ {
				c.send(cmdRead, 0, 100+i, i*4096, 4096, nil)
			}
			for i := 0; i < 10; i++ {
				r := c.mustReply()
				if r.handle == 100 {
					t.Fatal("blocked request answered first")
				}
				off := (r.handle - 100) * 4096
				if r.errno != 0 || !bytes.Equal(r.data, want[off:off+4096]) {
					t.Fatalf("reply %d: errno %d, data ok %v", r.handle, r.errno, bytes.Equal(r.data, want[off:off+4096]))
				}
			}
			close(release)
			if r := c.mustReply(); r.handle != 100 || !bytes.Equal(r.data, want[:4096]) {
				t.Fatalf("blocked reply %+v", r.handle)
			}
		})
	}
}

// TestConcurrentMixed pipelines many random requests from several goroutines on several
// connections and checks every reply against a model; run it with -race.
func TestConcurrentMixed(t *testing.T) {
	f := newFixture(t, Config{MaxInFlight: 16, Workers: 4, MaxInFlightBytes: 1 << 20, ConnMaxInFlightBytes: 512 << 10, MaxRequestSize: 256 << 10})
	f.disk.setHook(func(ctx context.Context, op string, off, n int64) error {
		if off%3 == 0 {
			time.Sleep(time.Duration(off%7) * 50 * time.Microsecond)
		}
		return nil
	})
	const conns, perConn = 3, 300
	// Each connection owns a disjoint region, so the expected content is known.
	region := int64(testSize / conns / 4096 * 4096)
	var wg sync.WaitGroup
	for ci := 0; ci < conns; ci++ {
		wg.Add(1)
		go func(ci int) {
			defer wg.Done()
			c := f.client(t, "disk", ci%2 == 0)
			base := int64(ci) * region
			model := f.disk.snapshot(base, region)
			rng := rand.New(rand.NewPCG(uint64(ci), 7))
			type op struct {
				typ    uint16
				off, n int64
			}
			// One writer goroutine, the test goroutine reads replies. Writes to a block are
			// only issued after the previous request on that block has been answered, so the
			// model stays exact.
			var mu sync.Mutex
			busy := map[int64]bool{} // block index (64 KiB) → request in flight
			inflight := map[uint64]op{}
			sent := make(chan struct{}, 64)
			errc := make(chan error, 1)
			go func() {
				for h := uint64(1); h <= perConn; h++ {
					sent <- struct{}{}
					var o op
					for {
						o = op{typ: []uint16{cmdRead, cmdRead, cmdWrite, cmdWriteZeroes, cmdFlush}[rng.IntN(5)]}
						blk := rng.Int64N(region / (64 << 10))
						o.off = blk*(64<<10) + rng.Int64N(32)*512
						o.n = (1 + rng.Int64N(64)) * 512
						mu.Lock()
						if !busy[blk] {
							busy[blk] = true
							inflight[h] = o
							mu.Unlock()
							break
						}
						mu.Unlock()
					}
					var payload []byte
					if o.typ == cmdWrite {
						payload = pattern(h+uint64(ci)<<32, int(o.n))
						mu.Lock()
						copy(model[o.off:], payload)
						mu.Unlock()
					}
					if o.typ == cmdWriteZeroes {
						mu.Lock()
						clear(model[o.off : o.off+o.n])
						mu.Unlock()
					}
					off, n := uint64(base+o.off), uint32(o.n)
					if o.typ == cmdFlush {
						off, n = 0, 0
					}
					c.mu.Lock()
					if o.typ == cmdRead {
						c.pending[h] = n
					}
					c.mu.Unlock()
					if _, err := c.nc.Write(encodeRequest(o.typ, 0, h, off, n, payload)); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
			for i := 0; i < perConn; i++ {
				r, err := c.readReply()
				if err != nil {
					t.Errorf("conn %d: %v", ci, err)
					return
				}
				mu.Lock()
				o, ok := inflight[r.handle]
				delete(inflight, r.handle)
				var want []byte
				if o.typ == cmdRead {
					want = append([]byte(nil), model[o.off:o.off+o.n]...)
				}
				busy[o.off/(64<<10)] = false
				mu.Unlock()
				<-sent
				if !ok || r.errno != 0 {
					t.Errorf("conn %d: reply handle %d known %v errno %d", ci, r.handle, ok, r.errno)
					return
				}
				if o.typ == cmdRead && !bytes.Equal(r.data, want) {
					t.Errorf("conn %d: read %d at %d differs from the model", ci, r.handle, o.off)
					return
				}
			}
			if err := <-errc; err != nil {
				t.Errorf("conn %d: send: %v", ci, err)
			}
		}(ci)
	}
	wg.Wait()
	if m := f.disk.maxActive.Load(); m < 2 {
		t.Errorf("device never saw concurrent calls (max %d)", m)
	}
	st := f.ts.Stats()
	for _, e := range st.Exports {
		if e.Name == "disk" && e.Requests < conns*perConn {
			t.Errorf("export requests %d < %d", e.Requests, conns*perConn)
		}
	}
	if st.BufferBytes > st.BufferBudget {
		t.Errorf("buffers %d over budget %d", st.BufferBytes, st.BufferBudget)
	}
}

// TestDisconnectMidRequest closes the client in the middle of a WRITE payload and while reads
// are blocked in the device: the server must clean up without leaking connections.
func TestDisconnectMidRequest(t *testing.T) {
	f := newFixture(t, Config{})
	t.Run("partial write payload", func(t *testing.T) {
		c := f.client(t, "disk", false)
		c.write(encodeRequest(cmdWrite, 0, 1, 0, 8192, make([]byte, 1000)))
		c.nc.Close()
	})
	t.Run("partial header", func(t *testing.T) {
		c := f.client(t, "disk", true)
		c.write(encodeRequest(cmdRead, 0, 1, 0, 512, nil)[:11])
		c.nc.Close()
	})
	t.Run("reads in flight", func(t *testing.T) {
		release := make(chan struct{})
		f.disk.setHook(func(ctx context.Context, op string, off, n int64) error {
			<-release
			return nil
		})
		defer f.disk.setHook(nil)
		c := f.client(t, "disk", false)
		for i := uint64(0); i < 8; i++ {
			c.send(cmdRead, 0, i, i*4096, 4096, nil)
		}
		waitFor(t, "reads in the device", func() bool { return f.disk.active.Load() == 8 })
		c.nc.Close()
		close(release)
	})
	waitFor(t, "connections to close", func() bool { return f.ts.Stats().Active == 0 })
	st := f.ts.Stats()
	for _, e := range st.Exports {
		if e.Conns != 0 {
			t.Fatalf("export %s still has %d connections", e.Name, e.Conns)
		}
	}
}

// TestMultiConn writes on one connection, flushes on another and reads on a third.
func TestMultiConn(t *testing.T) {
	f := newFixture(t, Config{})
	a, b, c := f.client(t, "disk", false), f.client(t, "disk", true), f.client(t, "disk", false)
	if a.tflags&tflagCanMultiConn == 0 {
		t.Fatal("NBD_FLAG_CAN_MULTI_CONN not advertised")
	}
	data := pattern(99, 65536)
	if r := a.do(cmdWrite, 0, 1<<20, 65536, data); r.errno != 0 {
		t.Fatal(r.errno)
	}
	flushes := f.disk.flushes.Load()
	if r := b.do(cmdFlush, 0, 0, 0, nil); r.errno != 0 || f.disk.flushes.Load() != flushes+1 {
		t.Fatal("flush on another connection did not reach the device")
	}
	if r := c.do(cmdRead, 0, 1<<20, 65536, nil); !bytes.Equal(r.data, data) {
		t.Fatal("write not visible on another connection")
	}
}

func TestStatsCounters(t *testing.T) {
	f := newFixture(t, Config{ReadSpin: -1}) // SpinReads 0 (TestReadSpin counts them)
	c := f.client(t, "disk", false)
	c.do(cmdRead, 0, 0, 4096, nil)
	c.do(cmdWrite, 0, 0, 1024, make([]byte, 1024))
	c.do(cmdFlush, 0, 0, 0, nil)
	c.do(cmdTrim, 0, 0, 512, nil)
	c.do(cmdWriteZeroes, 0, 0, 512, nil)
	c.do(cmdCache, 0, 0, 512, nil)
	c.do(cmdRead, 0, testSize, 512, nil) // EINVAL
	c.do(99, 0, 0, 0, nil)               // EINVAL
	want := Counters{Requests: 8, Reads: 2, Writes: 1, Flushes: 1, Trims: 1, WriteZeroes: 1, Caches: 1, Invalid: 1,
		BytesRead: 4096, BytesWritten: 1024, Errors: 2, ReplyWrites: 8} // one request at a time: a write each
	// A reply can reach the client before its writer has released the request.
	waitFor(t, "no request in flight", func() bool {
		st := f.ts.Stats()
		return len(st.Conns) == 1 && st.Conns[0].InFlight == 0
	})
	// ReadWaits depends on how fast the client is (each request it sends before the server
	// reads does not wait): at most one per read of the connection.
	noWaits := func(c Counters) Counters {
		if c.ReadWaits > 32 {
			t.Errorf("ReadWaits %d for 8 requests", c.ReadWaits)
		}
		c.ReadWaits = 0
		return c
	}
	st := f.ts.Stats()
	if len(st.Conns) != 1 || noWaits(st.Conns[0].Counters) != want || st.Conns[0].Export != "disk" || st.Conns[0].InFlight != 0 {
		t.Fatalf("conn stats %+v", st.Conns)
	}
	c.send(cmdDisc, 0, 0, 0, 0, nil)
	c.expectClosed()
	waitFor(t, "connection retired", func() bool { return f.ts.Stats().Active == 0 })
	st = f.ts.Stats()
	for _, e := range st.Exports {
		if e.Name == "disk" && (noWaits(e.Counters) != want || e.Conns != 0 || e.Size != testSize || e.BlockSize != testBS) {
			t.Fatalf("export stats %+v", e)
		}
	}
	if st.Accepted != 1 || st.HandshakeFailures != 0 {
		t.Fatalf("server stats %+v", st)
	}
}

// TestPoolBackPressure runs large reads with a buffer budget of a few requests.
func TestPoolBackPressure(t *testing.T) {
	f := newFixture(t, Config{MaxRequestSize: 256 << 10, MaxInFlightBytes: 512 << 10})
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := f.client(t, "disk", false)
			for h := uint64(0); h < 32; h++ {
				c.send(cmdRead, 0, h, h*(64<<10)%testSize, 256<<10, nil)
			}
			for h := 0; h < 32; h++ {
				if r := c.mustReply(); r.errno != 0 || len(r.data) != 256<<10 {
					t.Errorf("reply %+v", r.handle)
				}
			}
		}()
	}
	wg.Wait()
	if st := f.ts.Stats(); st.BufferBytes > 512<<10 {
		t.Fatalf("buffers %d over the budget", st.BufferBytes)
	}
}

// TestReadSpin: with nothing in flight, a read that finds no data retries for ReadSpin before it
// waits in the netpoller (ReadWaits). A client sending its next request right after each reply
// is caught by the spin: no read waits. One pausing longer than the spin makes every read wait,
// as does any client with the spin off; the replies are right in every case. The device
// completes requests inside the call (as the SRP initiator does at queue depth 1 with the target
// in the same process), so nothing is in flight when the reader reads the next request.
func TestReadSpin(t *testing.T) {
	const n = 40
	for _, tc := range []struct {
		name             string
		spin             time.Duration
		pause            time.Duration
		minWait, maxWait uint64
	}{
		{"back to back", 500 * time.Millisecond, 0, 0, 1},
		{"pausing", time.Millisecond, 20 * time.Millisecond, n * 3 / 4, 1000},
		{"off", -1, 20 * time.Millisecond, n * 3 / 4, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			disk := newRAM(testSize, testBS)
			disk.fill(0, pattern(7, testSize))
			ts := startServer(t, Config{ReadSpin: tc.spin}, map[string]Device{"disk": inlineRAM{disk}})
			c := dialUnix(t, ts.sock)
			c.connect("disk", false)
			for i := uint64(0); i < n; i++ {
				if tc.pause > 0 {
					time.Sleep(tc.pause)
				}
				r := c.do(cmdRead, 0, i*4096, 4096, nil)
				if r.errno != 0 || !bytes.Equal(r.data, disk.snapshot(int64(i*4096), 4096)) {
					t.Fatalf("read %d: errno %d or data differs", i, r.errno)
				}
			}
			st := ts.Stats()
			if len(st.Conns) != 1 {
				t.Fatalf("%d connections", len(st.Conns))
			}
			cs := st.Conns[0].Counters
			if cs.ReadWaits < tc.minWait || cs.ReadWaits > tc.maxWait {
				t.Fatalf("ReadWaits %d, want %d..%d (%d requests; SpinReads %d)", cs.ReadWaits, tc.minWait, tc.maxWait, n, cs.SpinReads)
			}
			if tc.spin < 0 && cs.SpinReads != 0 {
				t.Fatalf("SpinReads %d with the spin off", cs.SpinReads)
			}
		})
	}
}
