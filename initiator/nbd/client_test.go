package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

// testServer is a Server serving on a unix socket (and optionally TCP) for one test.
type testServer struct {
	*Server
	sock   string
	tcp    string
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// startServer starts a server with the given exports on a unix socket in t.TempDir() and on
// 127.0.0.1:0; it is shut down at the end of the test.
func startServer(t testing.TB, cfg Config, exports map[string]Device) *testServer {
	t.Helper()
	if cfg.Logger == nil {
		if tt, ok := t.(*testing.T); ok && testing.Verbose() {
			cfg.Logger = zaptest.NewLogger(tt, zaptest.Level(zap.DebugLevel))
		}
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for name, dev := range exports {
		if err := s.AddExport(name, dev, ExportOptions{Description: "test export " + name}); err != nil {
			t.Fatal(err)
		}
	}
	ts := &testServer{Server: s, sock: filepath.Join(t.TempDir(), "nbd.sock"), done: make(chan error, 1)}
	if _, err := s.ListenUnix(ts.sock); err != nil {
		t.Fatal(err)
	}
	addr, err := s.ListenTCP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts.tcp = addr.String()
	ctx, cancel := context.WithCancel(context.Background())
	ts.cancel = cancel
	go func() { ts.done <- s.Serve(ctx) }()
	t.Cleanup(func() { ts.stop(t) })
	return ts
}

// stop shuts the server down and waits for Serve to return (idempotent).
func (ts *testServer) stop(t testing.TB) {
	t.Helper()
	ts.cancel()
	ts.once.Do(func() {
		select {
		case err := <-ts.done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Serve did not return after shutdown")
		}
	})
}

// client is a minimal NBD client for protocol tests. It is not safe for concurrent use except
// that one goroutine may send while another reads replies.
type client struct {
	t          testing.TB
	nc         net.Conn
	br         *bufio.Reader
	structured bool
	size       int64
	tflags     uint16

	mu      sync.Mutex
	pending map[uint64]uint32 // READ handles → length, for simple replies
}

func dialUnix(t testing.TB, path string) *client {
	t.Helper()
	nc, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	return newClient(t, nc)
}

func newClient(t testing.TB, nc net.Conn) *client {
	c := &client{t: t, nc: nc, br: bufio.NewReaderSize(nc, 1<<20), pending: map[uint64]uint32{}}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(60 * time.Second))
	return c
}

// hello reads the server greeting and sends the client flags.
func (c *client) hello(flags uint32) uint16 {
	c.t.Helper()
	var b [18]byte
	c.read(b[:])
	if m := binary.BigEndian.Uint64(b[0:]); m != nbdMagic {
		c.t.Fatalf("magic %#x", m)
	}
	if m := binary.BigEndian.Uint64(b[8:]); m != optMagic {
		c.t.Fatalf("IHAVEOPT %#x", m)
	}
	var f [4]byte
	binary.BigEndian.PutUint32(f[:], flags)
	c.write(f[:])
	return binary.BigEndian.Uint16(b[16:])
}

func (c *client) read(b []byte) {
	c.t.Helper()
	if _, err := io.ReadFull(c.br, b); err != nil {
		c.t.Fatalf("read: %v", err)
	}
}

func (c *client) write(b []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *client) sendOpt(opt uint32, data []byte) {
	c.t.Helper()
	b := make([]byte, optHeaderLen, optHeaderLen+len(data))
	binary.BigEndian.PutUint64(b[0:], optMagic)
	binary.BigEndian.PutUint32(b[8:], opt)
	binary.BigEndian.PutUint32(b[12:], uint32(len(data)))
	c.write(append(b, data...))
}

type optReply struct {
	opt, typ uint32
	data     []byte
}

func (c *client) readOptReply() optReply {
	c.t.Helper()
	var h [optReplyHdrLen]byte
	c.read(h[:])
	if m := binary.BigEndian.Uint64(h[0:]); m != optReplyMagic {
		c.t.Fatalf("option reply magic %#x", m)
	}
	r := optReply{opt: binary.BigEndian.Uint32(h[8:]), typ: binary.BigEndian.Uint32(h[12:])}
	r.data = make([]byte, binary.BigEndian.Uint32(h[16:]))
	c.read(r.data)
	return r
}

// infoData builds NBD_OPT_INFO/GO data.
func infoData(name string, reqs ...uint16) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(reqs)))
	for _, r := range reqs {
		b = binary.BigEndian.AppendUint16(b, r)
	}
	return b
}

// infoResult is the parsed answer to NBD_OPT_INFO/GO.
type infoResult struct {
	final                optReply
	size                 int64
	tflags               uint16
	name, desc           string
	minBS, prefBS, maxBS uint32
	gotExport, gotBS     bool
}

func (c *client) info(opt uint32, name string, reqs ...uint16) infoResult {
	c.t.Helper()
	c.sendOpt(opt, infoData(name, reqs...))
	var res infoResult
	for {
		r := c.readOptReply()
		if r.opt != opt {
			c.t.Fatalf("reply for option %d, want %d", r.opt, opt)
		}
		if r.typ != repInfo {
			res.final = r
			return res
		}
		switch binary.BigEndian.Uint16(r.data) {
		case infoExport:
			if len(r.data) != 12 {
				c.t.Fatalf("NBD_INFO_EXPORT length %d", len(r.data))
			}
			res.gotExport = true
			res.size = int64(binary.BigEndian.Uint64(r.data[2:]))
			res.tflags = binary.BigEndian.Uint16(r.data[10:])
		case infoName:
			res.name = string(r.data[2:])
		case infoDescription:
			res.desc = string(r.data[2:])
		case infoBlockSize:
			if len(r.data) != 14 {
				c.t.Fatalf("NBD_INFO_BLOCK_SIZE length %d", len(r.data))
			}
			res.gotBS = true
			res.minBS = binary.BigEndian.Uint32(r.data[2:])
			res.prefBS = binary.BigEndian.Uint32(r.data[6:])
			res.maxBS = binary.BigEndian.Uint32(r.data[10:])
		}
	}
}

// connect does the whole handshake with NBD_OPT_GO (and structured replies if asked).
func (c *client) connect(name string, structured bool) {
	c.t.Helper()
	c.hello(clientFlagFixedNewstyle | clientFlagNoZeroes)
	if structured {
		c.sendOpt(optStructuredReply, nil)
		if r := c.readOptReply(); r.typ != repAck {
			c.t.Fatalf("NBD_OPT_STRUCTURED_REPLY: reply %#x", r.typ)
		}
		c.structured = true
	}
	res := c.info(optGo, name, infoBlockSize)
	if res.final.typ != repAck {
		c.t.Fatalf("NBD_OPT_GO %q: reply %#x %q", name, res.final.typ, res.final.data)
	}
	c.size, c.tflags = res.size, res.tflags
}

// encodeRequest builds a request header (+ payload).
func encodeRequest(typ, flags uint16, handle, off uint64, length uint32, payload []byte) []byte {
	b := make([]byte, requestHdrLen, requestHdrLen+len(payload))
	binary.BigEndian.PutUint32(b[0:], requestMagic)
	binary.BigEndian.PutUint16(b[4:], flags)
	binary.BigEndian.PutUint16(b[6:], typ)
	binary.BigEndian.PutUint64(b[8:], handle)
	binary.BigEndian.PutUint64(b[16:], off)
	binary.BigEndian.PutUint32(b[24:], length)
	return append(b, payload...)
}

// send sends a request; for WRITE, payload is the data.
func (c *client) send(typ, flags uint16, handle, off uint64, length uint32, payload []byte) {
	c.t.Helper()
	if typ == cmdRead {
		c.mu.Lock()
		c.pending[handle] = length
		c.mu.Unlock()
	}
	c.write(encodeRequest(typ, flags, handle, off, length, payload))
}

// reply is a whole reply to one request.
type reply struct {
	handle  uint64
	errno   Errno
	data    []byte // READ data, reassembled
	chunks  []uint16
	message string
	dataOff uint64 // offset of the OFFSET_DATA chunk
	metaID  uint32 // context ID of a BLOCK_STATUS chunk
	extents [][2]uint32
}

// readReply reads one complete reply (all chunks of a structured one; chunks of different
// requests are not interleaved by this server).
func (c *client) readReply() (reply, error) {
	var m [4]byte
	if _, err := io.ReadFull(c.br, m[:]); err != nil {
		return reply{}, err
	}
	switch binary.BigEndian.Uint32(m[:]) {
	case simpleReplyMagic:
		var h [12]byte
		if _, err := io.ReadFull(c.br, h[:]); err != nil {
			return reply{}, err
		}
		r := reply{errno: Errno(binary.BigEndian.Uint32(h[0:])), handle: binary.BigEndian.Uint64(h[4:])}
		c.mu.Lock()
		n, isRead := c.pending[r.handle]
		delete(c.pending, r.handle)
		c.mu.Unlock()
		if isRead && r.errno == 0 {
			r.data = make([]byte, n)
			if _, err := io.ReadFull(c.br, r.data); err != nil {
				return r, err
			}
		}
		return r, nil
	case structuredReplyMagic:
		if !c.structured {
			return reply{}, errors.New("structured reply without negotiation")
		}
		var r reply
		first := true
		for {
			if !first {
				if _, err := io.ReadFull(c.br, m[:]); err != nil {
					return r, err
				}
				if binary.BigEndian.Uint32(m[:]) != structuredReplyMagic {
					return r, fmt.Errorf("chunk magic %#x", m)
				}
			}
			first = false
			var h [16]byte
			if _, err := io.ReadFull(c.br, h[:]); err != nil {
				return r, err
			}
			flags := binary.BigEndian.Uint16(h[0:])
			typ := binary.BigEndian.Uint16(h[2:])
			r.handle = binary.BigEndian.Uint64(h[4:])
			p := make([]byte, binary.BigEndian.Uint32(h[12:]))
			if _, err := io.ReadFull(c.br, p); err != nil {
				return r, err
			}
			r.chunks = append(r.chunks, typ)
			switch typ {
			case replyTypeOffsetData:
				c.mu.Lock()
				n := c.pending[r.handle]
				c.mu.Unlock()
				if r.data == nil {
					r.data = make([]byte, n)
				}
				// This server sends one data chunk covering the whole request.
				r.dataOff = binary.BigEndian.Uint64(p)
				copy(r.data, p[8:])
			case replyTypeError:
				r.errno = Errno(binary.BigEndian.Uint32(p))
				ml := binary.BigEndian.Uint16(p[4:])
				r.message = string(p[6 : 6+ml])
			case replyTypeBlockStatus:
				if len(p) < 12 || (len(p)-4)%8 != 0 {
					return r, fmt.Errorf("block status chunk of %d bytes", len(p))
				}
				r.metaID = binary.BigEndian.Uint32(p)
				for d := p[4:]; len(d) > 0; d = d[8:] {
					r.extents = append(r.extents, [2]uint32{binary.BigEndian.Uint32(d), binary.BigEndian.Uint32(d[4:])})
				}
			case replyTypeNone:
			default:
				return r, fmt.Errorf("chunk type %d", typ)
			}
			if flags&replyFlagDone != 0 {
				c.mu.Lock()
				delete(c.pending, r.handle)
				c.mu.Unlock()
				return r, nil
			}
		}
	default:
		return reply{}, fmt.Errorf("reply magic %#x", m)
	}
}

func (c *client) mustReply() reply {
	c.t.Helper()
	r, err := c.readReply()
	if err != nil {
		c.t.Fatalf("reading reply: %v", err)
	}
	return r
}

// do sends one request and waits for its reply.
func (c *client) do(typ, flags uint16, off uint64, length uint32, payload []byte) reply {
	c.t.Helper()
	c.send(typ, flags, 0x1234, off, length, payload)
	r := c.mustReply()
	if r.handle != 0x1234 {
		c.t.Fatalf("reply handle %#x", r.handle)
	}
	return r
}

// expectClosed checks that the server closes the connection (EOF) soon.
func (c *client) expectClosed() {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, c.br)
	if err != nil {
		c.t.Fatalf("expected the server to close the connection, got %v", err)
	}
}

// waitFor polls cond for up to 10 s.
// notReady fails t with msg if ch delivers (or is closed) within d: what it guards has to wait.
func notReady[T any](t testing.TB, ch <-chan T, d time.Duration, msg string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatal(msg)
	case <-time.After(d):
	}
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
