//go:build hostile

package hostile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/testutil"
)

// TestNBDAbuse abuses the daemon's NBD export (sessions[].nbd of the session "keep") while
// another connection of the same export does verified I/O: a bad handshake, bad request
// magic, oversize lengths, offsets past the end, disconnects in the middle of a request and of
// a reply, connection churn and clients that never read their replies. Each answer is checked
// against the NBD protocol (NetworkBlockDevice/nbd:doc/proto.md), a sentinel block at the end of
// the export must never change, and after each class srpd is alive, within budget, and the
// prober's I/O went on.
func TestNBDAbuse(t *testing.T) {
	d := startDaemon(t)
	p := startProber(t, d.nbdSocket, lunSize/2)
	sock := d.nbdSocket

	// The sentinel: the last 1 MiB of the export, outside the prober's region.
	sentinel := bytes.Repeat([]byte("sentinel block, must never change. "), (1<<20)/35+1)[:1<<20]
	sentOff := int64(lunSize - len(sentinel))
	c, err := nbdHandshake(sock)
	if err != nil {
		t.Fatal(err)
	}
	if c.Size != lunSize {
		t.Fatalf("NBD export is %d bytes, want %d", c.Size, lunSize)
	}
	if err := c.WriteAt(sentinel, sentOff); err != nil {
		t.Fatal(err)
	}
	c.Close()
	checkSentinel := func(t *testing.T) {
		t.Helper()
		c, err := nbdHandshake(sock)
		if err != nil {
			t.Fatalf("sentinel check: %v", err)
		}
		defer c.Close()
		got := make([]byte, len(sentinel))
		if err := c.ReadAt(got, sentOff); err != nil {
			t.Fatalf("sentinel check: %v", err)
		}
		if !bytes.Equal(got, sentinel) {
			i := 0
			for i < len(got) && got[i] == sentinel[i] {
				i++
			}
			t.Errorf("the sentinel block at %d changed (first difference at +%d): a rejected or cut request modified the export", sentOff, i)
		}
	}
	abuse := func(name string, run func(t *testing.T)) {
		d.attack(t, p, name, func(t *testing.T) {
			run(t)
			checkSentinel(t)
		})
	}

	abuse("BadHandshake", func(t *testing.T) {
		cases := []struct {
			name string
			send []byte
		}{
			{"unknown client flags", binary.BigEndian.AppendUint32(nil, 0xFFFFFFF0)},
			{"bad option magic", append(binary.BigEndian.AppendUint32(nil, testutil.NBDFlagFixed), bytes.Repeat([]byte{0xEE}, 16)...)},
			{"random bytes", randomBytes(1024, 7)},
		}
		for _, tc := range cases {
			for range 20 {
				nc := dialHello(t, sock)
				_, _ = nc.Write(tc.send)
				if err := expectClose(nc, 10*time.Second); err != nil {
					t.Errorf("handshake with %s: %v", tc.name, err)
				}
				nc.Close()
			}
		}
		// An option claiming 4 GiB of data: the server must not wait for (or allocate) it
		// forever — closing or refusing is fine; either way the connection must end once we
		// hang up, which the churn below and the prober show.
		nc := dialHello(t, sock)
		opt := binary.BigEndian.AppendUint32(nil, testutil.NBDFlagFixed)
		opt = binary.BigEndian.AppendUint64(opt, testutil.NBDOptMagic)
		opt = binary.BigEndian.AppendUint32(opt, 0x7FFF)
		opt = binary.BigEndian.AppendUint32(opt, 0xFFFFFFFF)
		_, _ = nc.Write(append(opt, randomBytes(64<<10, 8)...))
		nc.Close()
	})

	abuse("BadRequestMagic", func(t *testing.T) {
		for i := range 50 {
			c, err := nbdHandshake(sock)
			if err != nil {
				t.Fatal(err)
			}
			req := testutil.NBDRequest(testutil.NBDCmdRead, 1, 0, 4096)
			binary.BigEndian.PutUint32(req, 0xDEADBEEF^uint32(i))
			_, _ = c.Conn.Write(req)
			// No way to resynchronise a byte stream: the server must hang up, not answer.
			if err := expectClose(c.Conn, 10*time.Second); err != nil {
				t.Errorf("request with bad magic: %v", err)
			}
			c.Conn.Close()
		}
	})

	abuse("OversizeLength", func(t *testing.T) {
		c, err := nbdHandshake(sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for _, n := range []uint32{0xFFFFFFFF, 1 << 30, 64<<20 + 4096} {
			if err := c.Send(testutil.NBDCmdRead, 0, n, nil); err != nil {
				t.Fatal(err)
			}
			err := c.Reply(nil)
			var ne *testutil.NBDError
			if !errors.As(err, &ne) || ne.Code != uint32(syscall.EINVAL) {
				t.Errorf("READ of %d bytes: %v; want an EINVAL reply", n, err)
			}
		}
		// A WRITE over the maximum with its payload: refused with EINVAL (the payload read and
		// thrown away), the connection still in sync.
		big := make([]byte, 40<<20)
		if err := c.Send(testutil.NBDCmdWrite, uint64(sentOff), uint32(len(big)), big); err != nil {
			t.Fatal(err)
		}
		var ne *testutil.NBDError
		if err := c.Reply(nil); !errors.As(err, &ne) || ne.Code != uint32(syscall.EINVAL) {
			t.Errorf("WRITE of %d bytes: %v; want an EINVAL reply", len(big), err)
		}
		if err := c.ReadAt(make([]byte, 4096), 0); err != nil {
			t.Errorf("the connection is unusable after refused oversize requests: %v", err)
		}
		// A WRITE announcing 4 GiB and sending nothing: no reply is possible before the data;
		// the server must refuse it (close) rather than wait to buffer 4 GiB.
		c2, err := nbdHandshake(sock)
		if err != nil {
			t.Fatal(err)
		}
		_ = c2.Send(testutil.NBDCmdWrite, uint64(sentOff), 0xFFFFFFFF, randomBytes(1<<20, 9))
		err = expectClose(c2.Conn, 10*time.Second)
		c2.Conn.Close()
		if err != nil {
			t.Errorf("WRITE announcing 4 GiB: %v", err)
		}
	})

	abuse("PastTheEnd", func(t *testing.T) {
		c, err := nbdHandshake(sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		end := uint64(c.Size)
		for _, tc := range []struct {
			typ  uint16
			off  uint64
			n    uint32
			want []syscall.Errno
		}{
			{testutil.NBDCmdRead, end, 4096, []syscall.Errno{syscall.EINVAL}},
			{testutil.NBDCmdRead, end - 4096, 8192, []syscall.Errno{syscall.EINVAL}},
			{testutil.NBDCmdRead, 1<<64 - 4096, 8192, []syscall.Errno{syscall.EINVAL}}, // offset + length overflows
			{testutil.NBDCmdRead, 1 << 62, 4096, []syscall.Errno{syscall.EINVAL}},
			{testutil.NBDCmdWrite, end, 4096, []syscall.Errno{syscall.ENOSPC, syscall.EINVAL}},
			{testutil.NBDCmdWrite, end - 4096, 8192, []syscall.Errno{syscall.ENOSPC, syscall.EINVAL}}, // would overwrite the sentinel's tail
			{testutil.NBDCmdWrite, 1<<64 - 4096, 8192, []syscall.Errno{syscall.ENOSPC, syscall.EINVAL}},
		} {
			var data []byte
			if tc.typ == testutil.NBDCmdWrite {
				data = randomBytes(int(tc.n), tc.off)
			}
			if err := c.Send(tc.typ, tc.off, tc.n, data); err != nil {
				t.Fatal(err)
			}
			err := c.Reply(nil)
			var ne *testutil.NBDError
			if !errors.As(err, &ne) || !errnoIn(ne.Code, tc.want) {
				t.Errorf("%s of %d bytes at %d (export %d bytes): %v; want an error reply %v", cmdName(tc.typ), tc.n, tc.off, end, err, tc.want)
			}
		}
		if err := c.ReadAt(make([]byte, 4096), int64(end)-4096); err != nil {
			t.Errorf("the last block is not readable after refused requests past the end: %v", err)
		}
	})

	abuse("DisconnectMidRequest", func(t *testing.T) {
		for i := range 40 {
			c, err := nbdHandshake(sock)
			if err != nil {
				t.Fatal(err)
			}
			switch i % 4 {
			case 0: // half a request header
				_, _ = c.Conn.Write(testutil.NBDRequest(testutil.NBDCmdWrite, 1, uint64(sentOff), 4096)[:13])
			case 1: // a WRITE over the sentinel, cut in its payload: nothing of it may land
				_, _ = c.Conn.Write(append(testutil.NBDRequest(testutil.NBDCmdWrite, 1, uint64(sentOff), 1<<20), randomBytes(300<<10, uint64(i))...))
			case 2: // a full 32 MiB WRITE header and 1 byte
				_, _ = c.Conn.Write(append(testutil.NBDRequest(testutil.NBDCmdWrite, 1, uint64(sentOff)-31<<20, 32<<20), 0))
			case 3: // hang up during the handshake
				c.Conn.Close()
				nc := dialHello(t, sock)
				_, _ = nc.Write(binary.BigEndian.AppendUint32(nil, testutil.NBDFlagFixed))
				nc.Close()
			}
			abortConn(c.Conn)
		}
	})

	abuse("DisconnectMidReply", func(t *testing.T) {
		for i := range 20 {
			c, err := nbdHandshake(sock)
			if err != nil {
				t.Fatal(err)
			}
			if i%2 == 0 {
				// One 32 MiB READ: take 100 bytes of the reply, hang up.
				_ = c.Send(testutil.NBDCmdRead, 0, 32<<20, nil)
				_, _ = io.ReadFull(c.Conn, make([]byte, 100))
			} else {
				// 64 pipelined 1 MiB READs, none of the replies read.
				for j := range 64 {
					_ = c.Send(testutil.NBDCmdRead, uint64(j)<<20, 1<<20, nil)
				}
			}
			abortConn(c.Conn)
		}
	})

	abuse("ConnectionChurn", func(t *testing.T) {
		for range 200 {
			c, err := nbdHandshake(sock)
			if err != nil {
				t.Fatalf("handshake during churn: %v", err)
			}
			if err := c.ReadAt(make([]byte, 512), 0); err != nil {
				t.Fatalf("READ during churn: %v", err)
			}
			c.Close()
		}
	})

	abuse("SlowReaders", func(t *testing.T) {
		// Four clients pipeline 2 × 32 MiB READs each and never read a reply (issue 23); a
		// fifth client's 4 KiB READ must still be answered within a second.
		var slow []*testutil.NBDClient
		defer func() {
			for _, c := range slow {
				abortConn(c.Conn)
			}
		}()
		for i := range 4 {
			c, err := nbdHandshake(sock)
			if err != nil {
				t.Fatal(err)
			}
			slow = append(slow, c)
			for j := range 2 {
				_ = c.Send(testutil.NBDCmdRead, uint64(i*2+j)<<20, 32<<20, nil)
			}
		}
		time.Sleep(time.Second) // let the server fill their replies
		c, err := nbdHandshake(sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for i := range 5 {
			t0 := time.Now()
			err := c.ReadAt(make([]byte, 4096), int64(i)*4096)
			lat := time.Since(t0)
			t.Logf("slow readers: a fifth client's 4 KiB READ took %v (%v)", lat.Round(time.Microsecond), err)
			if err != nil || lat > time.Second {
				t.Errorf("slow readers: a fifth client's 4 KiB READ took %v: %v; want an answer within 1 s", lat, err)
				break
			}
		}
	})
}

// dialHello connects to an NBD socket and reads the server's greeting.
func dialHello(t *testing.T, sock string) net.Conn {
	t.Helper()
	nc, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.SetDeadline(time.Now().Add(nbdOpTimeout))
	if _, err := io.ReadFull(nc, make([]byte, 18)); err != nil {
		nc.Close()
		t.Fatalf("NBD greeting: %v", err)
	}
	return nc
}

// expectClose reads until the server closes the connection (what it sends first, e.g. an
// option reply, is allowed) and fails after d.
func expectClose(nc net.Conn, d time.Duration) error {
	_ = nc.SetReadDeadline(time.Now().Add(d))
	n, err := io.Copy(io.Discard, io.LimitReader(nc, 1<<20))
	var ne net.Error
	switch {
	case err == nil && n < 1<<20, errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF):
		return nil
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("the server kept the connection open for %v (read %d bytes)", d, n)
	case err == nil:
		return fmt.Errorf("the server sent more than %d bytes", n)
	}
	return fmt.Errorf("reading until close: %w", err)
}

// abortConn hangs up at once, with unread data in both directions.
func abortConn(nc net.Conn) { _ = nc.Close() }

func randomBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return b
}

func errnoIn(code uint32, want []syscall.Errno) bool {
	for _, w := range want {
		if code == uint32(w) {
			return true
		}
	}
	return false
}

func cmdName(typ uint16) string {
	switch typ {
	case testutil.NBDCmdRead:
		return "READ"
	case testutil.NBDCmdWrite:
		return "WRITE"
	}
	return fmt.Sprintf("command %d", typ)
}
