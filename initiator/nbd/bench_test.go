package nbd

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// benchClient is an allocation-free pipelining client for benchmarks, so that -benchmem's
// allocs/op (counted process-wide) measure the server alone.
type benchClient struct {
	nc  net.Conn
	br  *bufio.Reader
	req []byte
	hdr [offsetDataHdrLen]byte
	buf []byte
}

func newBenchClient(b testing.TB, ts *testServer, structured bool, maxLen int) *benchClient {
	b.Helper()
	c := dialUnix(b, ts.sock)
	c.connect("disk", structured)
	c.nc.SetDeadline(time.Time{})
	return &benchClient{nc: c.nc, br: bufio.NewReaderSize(c.nc, 256<<10), req: make([]byte, requestHdrLen+maxLen), buf: make([]byte, maxLen)}
}

func (c *benchClient) send(b testing.TB, typ uint16, handle, off uint64, n uint32) {
	binary.BigEndian.PutUint32(c.req[0:], requestMagic)
	binary.BigEndian.PutUint16(c.req[4:], 0)
	binary.BigEndian.PutUint16(c.req[6:], typ)
	binary.BigEndian.PutUint64(c.req[8:], handle)
	binary.BigEndian.PutUint64(c.req[16:], off)
	binary.BigEndian.PutUint32(c.req[24:], n)
	msg := c.req[:requestHdrLen]
	if typ == cmdWrite {
		msg = c.req[:requestHdrLen+int(n)]
	}
	if _, err := c.nc.Write(msg); err != nil {
		b.Fatal(err)
	}
}

// recv reads one simple reply; n is the payload length expected on success.
func (c *benchClient) recv(b testing.TB, n int) { c.recvHdr(b, simpleReplyLen, n) }

// recvHdr reads a reply of hdr header bytes (a simple reply, or a structured OFFSET_DATA
// chunk with its offset) and n payload bytes.
func (c *benchClient) recvHdr(b testing.TB, hdr, n int) {
	if _, err := io.ReadFull(c.br, c.hdr[:hdr]); err != nil {
		b.Fatal(err)
	}
	if m := binary.BigEndian.Uint32(c.hdr[0:]); m == simpleReplyMagic && binary.BigEndian.Uint32(c.hdr[4:]) != 0 {
		b.Fatalf("error %d", binary.BigEndian.Uint32(c.hdr[4:]))
	} else if m != simpleReplyMagic && m != structuredReplyMagic {
		b.Fatalf("magic %#x", m)
	}
	if n > 0 {
		if _, err := io.ReadFull(c.br, c.buf[:n]); err != nil {
			b.Fatal(err)
		}
	}
}

func benchServer(b testing.TB) *testServer {
	dev := newRAM(64<<20, 512)
	dev.fill(0, pattern(1, 64<<20))
	return startServer(b, Config{}, map[string]Device{"disk": dev})
}

// benchIO runs b.N requests of n bytes at queue depth qd over a unix socket.
func benchIO(b *testing.B, typ uint16, n int, qd int) {
	ts := benchServer(b)
	c := newBenchClient(b, ts, false, n)
	const span = 64 << 20
	replyLen := 0
	if typ == cmdRead {
		replyLen = n
	}
	off := func(i int) uint64 { return uint64(i*n*7) % (span - uint64(n)) / 512 * 512 }
	// Warm up the buffer pool and the connection's goroutines.
	for i := 0; i < 2*qd; i++ {
		c.send(b, typ, uint64(i), off(i), uint32(n))
	}
	for i := 0; i < 2*qd; i++ {
		c.recv(b, replyLen)
	}
	b.SetBytes(int64(n))
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	sent := 0
	for ; sent < qd && sent < b.N; sent++ {
		c.send(b, typ, uint64(sent), off(sent), uint32(n))
	}
	for i := 0; i < b.N; i++ {
		c.recv(b, replyLen)
		if sent < b.N {
			c.send(b, typ, uint64(sent), off(sent), uint32(n))
			sent++
		}
	}
	b.StopTimer()
	// CPU time of the whole process (client and server) per request: steadier than ns/op on a
	// shared machine.
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

// cpuTime returns the process's user+system CPU time in nanoseconds.
func cpuTime() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkRead4KQD1 is the 4 KiB read round trip over a unix socket; allocs/op must be 0.
func BenchmarkRead4KQD1(b *testing.B)    { benchIO(b, cmdRead, 4096, 1) }
func BenchmarkRead4KQD32(b *testing.B)   { benchIO(b, cmdRead, 4096, 32) }
func BenchmarkWrite4KQD1(b *testing.B)   { benchIO(b, cmdWrite, 4096, 1) }
func BenchmarkWrite4KQD32(b *testing.B)  { benchIO(b, cmdWrite, 4096, 32) }
func BenchmarkRead128KQD8(b *testing.B)  { benchIO(b, cmdRead, 128<<10, 8) }
func BenchmarkWrite128KQD8(b *testing.B) { benchIO(b, cmdWrite, 128<<10, 8) }

// TestZeroAllocs asserts that the steady-state read and write paths allocate nothing, server
// and client together (testing.AllocsPerRun counts every allocation of the process).
func TestZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	ts := benchServer(t)
	for _, tc := range []struct {
		typ     uint16
		n, qd   int
		structd bool
	}{
		{cmdRead, 4096, 1, false},
		{cmdRead, 4096, 16, false},
		{cmdWrite, 4096, 16, false},
		{cmdRead, 128 << 10, 4, false},
		{cmdWrite, 128 << 10, 4, false},
		{cmdRead, 4096, 16, true},
	} {
		c := newBenchClient(t, ts, tc.structd, tc.n)
		replyLen, hdr := 0, simpleReplyLen
		if tc.typ == cmdRead {
			replyLen = tc.n
		}
		if tc.structd && tc.typ == cmdRead {
			hdr = offsetDataHdrLen
		}
		round := func() {
			for i := 0; i < tc.qd; i++ {
				c.send(t, tc.typ, uint64(i), uint64(i*tc.n), uint32(tc.n))
			}
			for i := 0; i < tc.qd; i++ {
				c.recvHdr(t, hdr, replyLen)
			}
		}
		round() // warm up: buffers, goroutines
		if a := testing.AllocsPerRun(200, round); a != 0 {
			t.Errorf("%s %d bytes QD%d structured=%v: %.2f allocs per round", cmdName(tc.typ), tc.n, tc.qd, tc.structd, a)
		}
	}
}
