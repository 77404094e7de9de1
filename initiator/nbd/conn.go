package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/srpd/srpd/internal/cbatch"
)

// readBufferSize is the size of a connection's bufio.Reader: many pipelined request headers
// per read syscall; WRITE payloads larger than it are read straight into their buffer.
const readBufferSize = 64 << 10

// errStopped ends the read loop when the connection is drained.
var errStopped = errors.New("nbd: connection stopped")

// request is one request read from the client, from the read loop through a worker to its
// reply. A connection preallocates MaxInFlight of them.
type request struct {
	typ    uint16
	flags  uint16
	handle uint64
	off    uint64
	length uint32
	errno  Errno  // set when the request was refused before reaching the Device
	msg    string // human-readable reason for errno, for structured error chunks
	buf    *buffer
	win    int64       // bytes charged to the connection's window
	out    []byte      // the encoded reply, set by serve, written by the reply writer
	async  bool        // posted to the AsyncDevice (answered from afn)
	afn    func(error) // the request's completion for the AsyncDevice, made once
	bsLen  int         // the length of a BLOCK_STATUS reply encoded in scratch
	start  time.Time   // when its header was read (ExportOptions.Observe)
	// scratch holds the reply of a request without a data payload: a simple reply, a
	// structured NONE chunk or an error chunk with its message.
	scratch [errorChunkHdrLen + maxErrorMessage]byte
}

// conn is one client connection.
type conn struct {
	srv    *Server
	nc     net.Conn
	id     uint64
	remote string
	log    *zap.Logger
	br     *bufio.Reader
	raw    *rawStream      // nc's raw syscalls (nil: not a socket); br reads through it
	rawIOV []syscall.Iovec // the reply batch's iovecs (rmu, writing)
	// adev is dev as an AsyncDevice (socket connections only): READs and WRITEs are posted
	// by the reader and answered from their completion; asyncWG counts those not yet
	// written back.
	adev    AsyncDevice
	asyncWG sync.WaitGroup
	// pb is adev as a PostBatcher: while the next request is already buffered, the reader
	// keeps a bracket open (plugged, rdMu held) so that the requests of one read reach the
	// target together; it ends it after the last one and before it waits for anything
	// (flushHeld).
	pb      PostBatcher
	plugged bool

	ctx    context.Context // passed to the Device; cancelled by kill and at the end
	cancel context.CancelFunc
	done   chan struct{} // closed when the connection is fully finished

	dlMu     sync.Mutex // orders setReadDeadline against drain
	draining bool
	stop     chan struct{} // closed by drain

	// Handshake results.
	optBuf     []byte
	noZeroes   bool
	structured bool
	exp        *export
	dev        Device
	size       int64
	bs         int64
	tflags     uint16
	readOnly   bool
	canTrim    bool
	since      time.Time
	// metaExp is the export base:allocation was selected for by NBD_OPT_SET_META_CONTEXT
	// (nil: none); blockStatus is whether it is the export in transmission, and bsDev the
	// Device's allocation map if it has one.
	metaExp     *export
	blockStatus bool
	bsDev       BlockStatuser

	// Transmission. The workers take turns reading (leader/followers): the one holding rdMu
	// reads the next request, lets go of rdMu and serves the request itself, so that a request
	// reaches the Device without a handoff to another goroutine; rdEnd and rdErr record the end
	// of the stream (guarded by rdMu).
	hdr     [requestHdrLen]byte
	free    chan *request
	rdMu    sync.Mutex
	rdEnd   bool
	rdErr   error
	workers sync.WaitGroup
	// Replies are written by whichever worker finds no write in progress (flat combining):
	// it sends every queued reply with one writev, then releases their requests, and loops
	// while more arrive; the other workers queue their reply and go on to the next request.
	//
	// While the reader is posting requests it already has in its buffer (held), replies are
	// only queued: the reader writes them all with one writev before it next waits for
	// anything (flushHeld), so that at queue depth 32 a batch of requests read with one read
	// is answered with one writev, not one per request (each a wake-up of the client). At
	// queue depth 1 the next request is never buffered and nothing is held.
	//
	// Likewise while the Device delivers a batch of asynchronous answers (cbatch: the
	// initiator's completion handling brackets them with BeginCompletions/EndCompletions):
	// their replies are queued and the end of the last open batch writes them with one writev.
	rmu      sync.Mutex
	rq       []*request // replies waiting to be written
	rspare   []*request // the other batch slice, swapped with rq
	writing  bool
	held     bool         // the reader will write rq before it waits (rdMu held)
	cbatches int          // completion batches open (BeginCompletions less EndCompletions)
	flushFn  func()       // flushHeld, as one func value for bufPool.get
	heldFn   func() int64 // heldBytes, as one func value for bufPool.get
	iov      net.Buffers
	iovStore [][]byte
	broken   atomic.Bool
	stalled  atomic.Bool // closed because replies were not read within Config.WriteTimeout
	// stalledBytes is what the connection held in buffers when it was found stalled.
	stalledBytes atomic.Int64
	inflight     atomic.Int64
	winBytes     atomic.Int64
	winWake      chan struct{}
	poolWake     chan struct{}
	debug        bool

	counters counters
}

// unixSocketBuffer is asked for as the send and receive buffer of unix socket connections: a
// few large replies (or WRITE payloads) fit, so a 128 KiB read reply goes out in one writev
// instead of several partial writes with a wait for the client in between. The kernel caps it
// at net.core.wmem_max / rmem_max. TCP connections keep the kernel's autotuning.
const unixSocketBuffer = 2 << 20

func newConn(s *Server, base context.Context, nc net.Conn) *conn {
	if uc, ok := nc.(*net.UnixConn); ok {
		uc.SetWriteBuffer(unixSocketBuffer)
		uc.SetReadBuffer(unixSocketBuffer)
	}
	ctx, cancel := context.WithCancel(base)
	id := s.nextID.Add(1)
	remote := ""
	if a := nc.RemoteAddr(); a != nil {
		remote = a.String()
	}
	var rd io.Reader = nc
	raw := newRawStream(nc)
	if raw != nil {
		rd = raw
	}
	c := &conn{
		srv:      s,
		nc:       nc,
		raw:      raw,
		id:       id,
		remote:   remote,
		log:      s.log.With(zap.Uint64("conn", id), zap.String("remote", remote)),
		br:       bufio.NewReaderSize(rd, readBufferSize),
		ctx:      ctx,
		cancel:   cancel,
		done:     make(chan struct{}),
		stop:     make(chan struct{}),
		winWake:  make(chan struct{}, 1),
		poolWake: make(chan struct{}, 1),
	}
	// The Device may tell us where a batch of its asynchronous answers begins and ends
	// (BeginCompletions): the replies of a batch then leave in one writev.
	c.ctx = cbatch.With(ctx, c)
	c.flushFn = c.flushHeld
	c.heldFn = c.heldBytes
	if raw != nil {
		raw.wrTimeout = max(s.cfg.WriteTimeout, 0)
		raw.waits = &c.counters.readWaits
		if s.cfg.ReadSpin > 0 {
			raw.spin = s.cfg.ReadSpin
			raw.spinOK = func() bool { return c.inflight.Load() == 0 }
			raw.spinHit = &c.counters.spinReads
		}
	}
	return c
}

// setReadDeadline sets the read deadline unless the connection is being drained (whose
// deadline in the past must stay).
func (c *conn) setReadDeadline(t time.Time) {
	c.dlMu.Lock()
	defer c.dlMu.Unlock()
	if !c.draining {
		c.nc.SetReadDeadline(t)
	}
}

// drain stops reading requests: the blocked read returns, as do waits for buffers and request
// slots. Requests already read are still answered.
func (c *conn) drain() {
	c.dlMu.Lock()
	defer c.dlMu.Unlock()
	if c.draining {
		return
	}
	c.draining = true
	c.nc.SetReadDeadline(time.Unix(1, 0))
	close(c.stop)
}

// discardMax bounds what discardUnread reads and drops.
const discardMax = 1 << 20

// discardUnread reads and drops, without waiting, what the client sent after the requests a
// drain left unread. Closing a socket with unread data resets the connection instead of ending
// it: an AF_UNIX peer's next read fails with ECONNRESET, a TCP peer gets an RST, which can make
// it drop replies it has not read yet (torvalds/linux:net/unix/af_unix.c unix_release_sock,
// net/ipv4/tcp.c __tcp_close). After a drain the client must see its replies, then the end of
// the stream. At most discardMax bytes; a socket without a raw descriptor is left as it is.
func (c *conn) discardUnread() {
	sc, ok := c.nc.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	c.nc.SetReadDeadline(time.Time{}) // drain's deadline in the past would refuse the read
	var buf [4096]byte
	_ = rc.Read(func(fd uintptr) bool {
		for n := 0; n < discardMax; {
			k, err := syscall.Read(int(fd), buf[:])
			if k <= 0 || err != nil {
				break // EAGAIN (nothing more queued), EOF or an error: done either way
			}
			n += k
		}
		return true // never wait for more
	})
}

// kill cancels the requests in flight and closes the socket.
func (c *conn) kill() {
	c.cancel()
	c.nc.Close()
}

// fail records that a reply could not be written: the client is gone or the connection is
// broken, so nothing more is sent, and the read loop is woken up by the close.
//
// A write that timed out (Config.WriteTimeout) marks the connection stalled: transmit returns
// ErrWriteStalled, which run logs once, and it is counted.
func (c *conn) fail(err error) {
	if c.broken.CompareAndSwap(false, true) {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.stalledBytes.Store(c.heldBytes())
			c.stalled.Store(true)
			c.counters.stalledClosed.Add(1)
		} else {
			c.log.Debug("reply write failed; closing", zap.Error(err))
		}
		c.drain() // also ends a wait of the read loop for a buffer or a request slot
		c.nc.Close()
	}
}

// cleanEnd maps the ways a connection ends normally to nil.
func cleanEnd(err error) error {
	switch {
	case err == nil, errors.Is(err, errAbort), errors.Is(err, errStopped), errors.Is(err, io.EOF):
		return nil
	}
	return err
}

func (c *conn) stats() ConnStats {
	return ConnStats{
		ID:         c.id,
		Remote:     c.remote,
		Export:     c.exp.name,
		Since:      c.since,
		Structured: c.structured,
		InFlight:   int(c.inflight.Load()),
		Counters:   c.counters.snapshot(),
	}
}

// transmit runs the transmission phase: the workers read requests in turn, call the Device
// and send the replies, until the stream ends; transmit returns once every request read has
// been answered.
func (c *conn) transmit() error {
	c.setReadDeadline(time.Time{})
	c.debug = c.log.Core().Enabled(zapcore.DebugLevel)
	cfg := &c.srv.cfg
	reqs := make([]request, cfg.MaxInFlight)
	c.free = make(chan *request, cfg.MaxInFlight)
	if ad, ok := c.dev.(AsyncDevice); ok && c.raw != nil {
		c.adev = ad
		c.pb, _ = ad.(PostBatcher)
	}
	for i := range reqs {
		r := &reqs[i]
		if c.adev != nil {
			r.afn = func(err error) { c.asyncDone(r, err) }
		}
		c.free <- r
	}
	c.workers.Add(cfg.Workers)
	for i := 0; i < cfg.Workers; i++ {
		go c.worker()
	}
	c.workers.Wait()
	c.asyncWG.Wait() // every posted request answered (or its reply given up)
	err := c.rdErr
	if c.stalled.Load() {
		return fmt.Errorf("%w (%v, %d bytes of buffers given back)", ErrWriteStalled, c.srv.cfg.WriteTimeout, c.stalledBytes.Load())
	}
	if err != nil && c.broken.Load() {
		// The read failed because a failed reply write closed the socket.
		err = nil
	}
	return err
}

// readErr turns a read error caused by drain (the deadline in the past) into errStopped.
func (c *conn) readErr(err error) error {
	c.dlMu.Lock()
	defer c.dlMu.Unlock()
	if c.draining {
		return errStopped
	}
	return err
}

// errDisc ends the stream at NBD_CMD_DISC (a clean end: transmit returns nil).
var errDisc = errors.New("nbd: NBD_CMD_DISC")

// readRequest reads the next request (rdMu held). It returns nil and why the stream ends at
// NBD_CMD_DISC (errDisc), the end of the stream, a protocol violation or drain.
func (c *conn) readRequest() (*request, error) {
	maxReq := uint32(c.srv.cfg.MaxRequestSize)
	skipLimit := uint64(maxReq) * 4
	for {
		c.flushBefore(requestHdrLen)
		if _, err := io.ReadFull(c.br, c.hdr[:]); err != nil {
			return nil, c.readErr(err)
		}
		h := c.hdr[:]
		if m := binary.BigEndian.Uint32(h[0:]); m != requestMagic {
			// No way to resynchronise on a byte stream: hard disconnect.
			return nil, protoErr("bad request magic %#x", m)
		}
		typ := binary.BigEndian.Uint16(h[6:])
		if typ == cmdDisc {
			// proto.md "NBD_CMD_DISC": answer everything outstanding, then close; no reply.
			return nil, errDisc
		}
		var r *request
		select {
		case r = <-c.free:
		default:
			c.flushHeld() // the replies held release requests
			select {
			case r = <-c.free:
			case <-c.stop:
				return nil, errStopped
			}
		}
		r.typ = typ
		r.flags = binary.BigEndian.Uint16(h[4:])
		r.handle = binary.BigEndian.Uint64(h[8:])
		r.off = binary.BigEndian.Uint64(h[16:])
		r.length = binary.BigEndian.Uint32(h[24:])
		if c.exp != nil && c.exp.obs != nil {
			r.start = time.Now()
		}
		r.errno, r.msg = c.check(r)

		switch {
		case typ == cmdWrite && (r.errno != 0 || r.length == 0):
			if r.length > maxReq && uint64(r.length) > skipLimit {
				c.free <- r
				return nil, protoErr("WRITE of %d bytes", r.length)
			}
			c.flushBefore(int(r.length))
			if _, err := c.br.Discard(int(r.length)); err != nil {
				c.free <- r
				return nil, c.readErr(err)
			}
		case typ == cmdWrite:
			if !c.acquire(r) {
				c.free <- r
				return nil, errStopped
			}
			c.flushBefore(int(r.length))
			if _, err := io.ReadFull(c.br, r.buf.payload(int(r.length))); err != nil {
				c.release(r)
				return nil, c.readErr(err)
			}
		case typ == cmdRead && r.errno == 0 && r.length > 0:
			if !c.acquire(r) {
				c.free <- r
				return nil, errStopped
			}
		}
		c.inflight.Add(1)
		return r, nil
	}
}

// check validates a request against the negotiated parameters and returns the error to answer
// it with (0 when the Device is to be called). See proto.md "Error values" and "Block size
// constraints" for the choice of errors.
func (c *conn) check(r *request) (Errno, string) {
	allowed := cmdFlagFUA // valid on every command once NBD_FLAG_SEND_FUA is advertised
	switch r.typ {
	case cmdRead:
		if c.structured {
			allowed |= cmdFlagDF
		}
	case cmdWriteZeroes:
		allowed |= cmdFlagNoHole
	case cmdWrite, cmdFlush, cmdTrim, cmdCache:
	case cmdBlockStatus:
		if !c.blockStatus {
			// proto.md "Metadata querying": servers SHOULD answer EINVAL.
			return EINVAL, "NBD_CMD_BLOCK_STATUS without a metadata context selected"
		}
		allowed |= cmdFlagReqOne
		if r.length == 0 {
			return EINVAL, "NBD_CMD_BLOCK_STATUS of zero bytes"
		}
	default:
		return EINVAL, "unknown or unsupported command"
	}
	if r.flags&^allowed != 0 {
		return EINVAL, "command flag not valid for this command"
	}
	switch r.typ {
	case cmdFlush:
		return 0, "" // offset and length are reserved; ignored
	case cmdWrite, cmdWriteZeroes, cmdTrim:
		if c.readOnly {
			return EPERM, "export is read-only"
		}
	}
	if r.typ == cmdTrim && !c.canTrim {
		return EINVAL, "NBD_CMD_TRIM was not advertised"
	}
	if (r.typ == cmdRead || r.typ == cmdWrite) && r.length > uint32(c.srv.cfg.MaxRequestSize) {
		return EINVAL, "request larger than the maximum block size"
	}
	size := uint64(c.size)
	if r.off > size || uint64(r.length) > size-r.off {
		if r.typ == cmdWrite || r.typ == cmdWriteZeroes {
			return ENOSPC, "write beyond the end of the export"
		}
		return EINVAL, "request beyond the end of the export"
	}
	// TRIM is a hint and is rounded inwards to whole blocks instead (proto.md "NBD_CMD_TRIM");
	// BLOCK_STATUS asks about a range and is widened to whole blocks for the Device.
	if r.typ != cmdTrim && r.typ != cmdBlockStatus {
		bs := uint64(c.bs)
		if r.off%bs != 0 || uint64(r.length)%bs != 0 {
			return EINVAL, "request not aligned to the minimum block size"
		}
	}
	return 0, ""
}

// acquire gets a data buffer for r.length bytes, waiting for the connection's window and the
// server's pool; false when the connection is drained meanwhile.
func (c *conn) acquire(r *request) bool {
	n := int(r.length)
	size := classBytes(sizeClass(n))
	// While it waits, the connection counts among the holders even when it holds no buffer at
	// the moment (a claim of waitClaim on its window): otherwise, when its last buffer is
	// released before its reader gets to run again, the others' fair share doubles for that
	// moment and they take more than their half.
	if c.winBytes.Add(waitClaim) == waitClaim {
		c.srv.holders.Add(1)
	}
	defer c.unhold(waitClaim)
	// Only this goroutine adds to winBytes, so the check below cannot be overtaken. While the
	// connection holds buffers, its own releases wake it (whatever happens to its share).
	for {
		cur := c.winBytes.Load() - waitClaim
		if cur == 0 || cur+size <= c.share() {
			break
		}
		c.flushHeld() // the replies held free window
		select {
		case <-c.winWake:
		case <-c.stop:
			return false
		}
	}
	c.winBytes.Add(size)
	b := c.srv.pool.get(n, c.heldFn, c.poolWake, c.stop, c.flushFn)
	if b == nil {
		c.unhold(size)
		return false
	}
	r.buf, r.win = b, size
	return true
}

// heldBytes is what the connection holds (or has been granted window for) in buffers.
func (c *conn) heldBytes() int64 { return c.winBytes.Load() &^ waitClaim }

// waitClaim is what a connection waiting in acquire adds to its window (winBytes) so that it
// counts as a holder; buffer sizes are multiples of the smallest class, so it stays apart.
const waitClaim = 1

// share is the most buffer bytes the connection may hold (while it holds some): its fair share
// of the pool's unreserved bytes among the connections holding or waiting for buffers, itself
// included, and at most Config.ConnMaxInFlightBytes.
func (c *conn) share() int64 {
	n := max(c.srv.holders.Load(), 1) // may lag a transition by a moment; never below one
	return min(c.srv.cfg.ConnMaxInFlightBytes, c.srv.pool.shared/n)
}

// unhold takes n bytes off the connection's window.
func (c *conn) unhold(n int64) {
	if c.winBytes.Add(-n) == 0 {
		c.srv.holders.Add(-1)
	}
}

// release returns r's buffer and r itself.
func (c *conn) release(r *request) {
	if r.buf != nil {
		c.srv.pool.put(r.buf)
		r.buf = nil
		c.unhold(r.win)
		r.win = 0
		select {
		case c.winWake <- struct{}{}:
		default:
		}
	}
	r.msg = ""
	c.free <- r
}

// worker reads requests in turn with the other workers and executes them (replying through
// send), until the stream ends.
func (c *conn) worker() {
	defer c.workers.Done()
	for {
		c.rdMu.Lock()
		var r *request
		for {
			if c.rdEnd {
				c.rdMu.Unlock()
				return
			}
			var err error
			r, err = c.readRequest()
			if r == nil {
				c.rdEnd = true
				if err != errDisc {
					c.rdErr = err
				}
				c.flushHeld()
				c.rdMu.Unlock()
				return
			}
			// A READ or WRITE for an AsyncDevice is posted here and answered from its
			// completion: this worker stays the reader (no other worker is woken to take
			// over), which at queue depth 1 saves two goroutine handoffs per request.
			if !c.postAsync(r) {
				break
			}
		}
		c.flushHeld()
		c.rdMu.Unlock()
		c.serve(r)
	}
}

// postAsync posts r to the AsyncDevice if it is a valid READ or WRITE (rdMu held).
func (c *conn) postAsync(r *request) bool {
	if c.adev == nil || r.errno != 0 || r.length == 0 || (r.typ != cmdRead && r.typ != cmdWrite) || c.broken.Load() {
		return false
	}
	r.async = true
	c.asyncWG.Add(1)
	// Hold the replies while the next request is already here; the last request of a batch
	// writes what is held first, and its own reply goes out from its completion at once (at
	// queue depth 1, before the device's work after the completion: with the target on the
	// same softroce device, its send completions and the ACKs run on this goroutine after it).
	// Only the reader sets held, so the unlocked reads are of its own value.
	more := c.br.Buffered() >= requestHdrLen
	if more {
		if !c.held {
			c.rmu.Lock()
			c.held = true
			c.rmu.Unlock()
		}
		if c.pb != nil && !c.plugged {
			c.pb.BeginPosts()
			c.plugged = true
		}
	} else {
		c.flushReplies()
	}
	p := r.buf.payload(int(r.length))
	if r.typ == cmdRead {
		c.adev.ReadAtAsync(c.ctx, p, int64(r.off), r.afn)
	} else {
		c.adev.WriteAtAsync(c.ctx, p, int64(r.off), r.flags&cmdFlagFUA != 0, r.afn)
	}
	if !more {
		c.unplug() // the last request of the read: the batch goes
	}
	return true
}

// unplug ends the reader's post bracket, if open: the requests posted in it are sent (rdMu held).
func (c *conn) unplug() {
	if c.plugged {
		c.plugged = false
		c.pb.EndPosts()
	}
}

// asyncDone answers a posted request (from its completion: must not block).
func (c *conn) asyncDone(r *request, err error) {
	write := r.typ == cmdWrite
	var e Errno
	if err != nil {
		err = c.adev.AsyncError(err, write)
		e = ErrnoOf(err)
		if c.debug {
			c.log.Debug("device error", zap.String("cmd", cmdName(r.typ)), zap.Uint64("offset", r.off),
				zap.Uint32("length", r.length), zap.Error(err), zap.Uint32("nbd_errno", uint32(e)))
		}
	}
	c.counters.count(r.typ, e, int(r.length))
	c.observe(r, e)
	c.replyMsg(r, e, err)
	c.sendMsg(r, false)
}

// send queues r's reply (r.out) and, unless another worker is writing, writes every queued
// reply and releases the requests. r must not be touched after send.
func (c *conn) send(r *request) { c.sendMsg(r, true) }

// sendMsg is send; without mayBlock the caller is not held up by a full socket: what does not
// fit is written by a goroutine started for it, which goes on as the writer.
func (c *conn) sendMsg(r *request, mayBlock bool) {
	c.rmu.Lock()
	c.rq = append(c.rq, r)
	if c.writing || ((c.held || c.cbatches > 0) && len(c.rq) < maxHeldReplies) {
		c.rmu.Unlock()
		return
	}
	c.writing = true
	c.writeLoop(mayBlock)
}

// BeginCompletions implements cbatch.Batcher: replies are held until the batch ends.
func (c *conn) BeginCompletions() {
	c.rmu.Lock()
	c.cbatches++
	c.rmu.Unlock()
}

// EndCompletions implements cbatch.Batcher: the end of the last open batch writes the replies
// held (unless a write is in progress, whose writer takes them, or the reader holds them for
// its own flush), without waiting for a full socket, as from a completion.
func (c *conn) EndCompletions() {
	c.rmu.Lock()
	c.cbatches--
	if c.cbatches > 0 || c.writing || c.held || len(c.rq) == 0 {
		c.rmu.Unlock()
		return
	}
	c.writing = true
	c.writeLoop(false)
}

// maxHeldReplies bounds the replies held for the reader's next flush (held): one writev's
// worth (rawio.go maxIOV allows more).
const maxHeldReplies = 64

// flushBefore is flushHeld unless the reader's buffer already holds n bytes: reading them
// will not wait.
func (c *conn) flushBefore(n int) {
	if (c.held || c.plugged) && c.br.Buffered() < n {
		c.flushHeld()
	}
}

// flushHeld is what the reader does before it waits for anything (rdMu held): it ends its post
// bracket (unplug) and the held replies (flushReplies).
func (c *conn) flushHeld() {
	c.unplug()
	c.flushReplies()
}

// flushReplies ends held (rdMu held): the queued replies are written now (without waiting for
// a full socket: what does not fit is left to a goroutine, as from a completion) unless a
// write is in progress, whose writer takes them.
func (c *conn) flushReplies() {
	if !c.held {
		return
	}
	c.rmu.Lock()
	c.held = false
	if c.writing || len(c.rq) == 0 {
		c.rmu.Unlock()
		return
	}
	c.writing = true
	c.writeLoop(false)
}

// writeLoop writes the queued replies in batches until none is left (rmu held, writing set;
// returns with rmu released).
func (c *conn) writeLoop(mayBlock bool) {
	for len(c.rq) > 0 {
		batch := c.rq
		c.rq, c.rspare = c.rspare[:0], batch
		c.rmu.Unlock()
		if !c.broken.Load() {
			c.iov = c.iovStore[:0]
			for _, q := range batch {
				c.iov = append(c.iov, q.out)
			}
			c.iovStore = c.iov[:0]
			c.counters.replyWrites.Add(1)
			var err error
			if c.raw != nil {
				var more bool
				c.rawIOV, more, err = c.raw.writeBuffers(c.iov, c.rawIOV, mayBlock)
				if more {
					// The socket is full and the caller must not wait: a goroutine finishes
					// this batch and carries on as the writer.
					go c.finishBatch(batch)
					return
				}
			} else {
				// Not a socket (a pipe): the deadline covers every batch (rawStream arms it
				// only when the socket is full).
				if wt := c.srv.cfg.WriteTimeout; wt > 0 {
					c.nc.SetWriteDeadline(time.Now().Add(wt))
				}
				_, err = c.iov.WriteTo(c.nc)
			}
			if err != nil {
				c.fail(err)
			}
		}
		c.releaseBatch(batch)
		c.rmu.Lock()
	}
	c.writing = false
	c.rmu.Unlock()
}

// finishBatch completes a batch writeLoop left unfinished and goes on writing.
func (c *conn) finishBatch(batch []*request) {
	if err := c.raw.finishWrite(); err != nil {
		c.fail(err)
	}
	c.releaseBatch(batch)
	c.rmu.Lock()
	c.writeLoop(true)
}

// releaseBatch releases the requests of a written (or given up) batch.
func (c *conn) releaseBatch(batch []*request) {
	for i, q := range batch {
		q.out = nil
		async := q.async
		q.async = false
		c.inflight.Add(-1)
		c.release(q)
		batch[i] = nil
		if async {
			c.asyncWG.Done()
		}
	}
}

// serve executes one request and replies to it.
func (c *conn) serve(r *request) {
	if c.broken.Load() {
		// The client is gone: nobody would see the result.
		c.inflight.Add(-1)
		c.release(r)
		return
	}
	e := r.errno
	var err error
	n := int64(r.length)
	off := int64(r.off)
	if e == 0 {
		switch r.typ {
		case cmdRead:
			if n > 0 {
				err = c.dev.ReadAt(c.ctx, r.buf.payload(int(n)), off)
			}
		case cmdWrite:
			if n > 0 {
				err = c.dev.WriteAt(c.ctx, r.buf.payload(int(n)), off, r.flags&cmdFlagFUA != 0)
			}
		case cmdFlush:
			err = c.dev.Flush(c.ctx)
		case cmdTrim:
			lo := (off + c.bs - 1) / c.bs * c.bs
			hi := (off + n) / c.bs * c.bs
			if hi > lo {
				err = c.dev.Discard(c.ctx, lo, hi-lo)
			}
			if err == nil && r.flags&cmdFlagFUA != 0 {
				err = c.dev.Flush(c.ctx)
			}
		case cmdWriteZeroes:
			if n > 0 {
				err = c.dev.WriteZeroes(c.ctx, off, n, r.flags&cmdFlagNoHole != 0)
			}
			if err == nil && r.flags&cmdFlagFUA != 0 {
				err = c.dev.Flush(c.ctx)
			}
		case cmdCache:
			// A hint; nothing to prefetch into (proto.md "NBD_CMD_CACHE" allows a no-op).
		case cmdBlockStatus:
			err = c.blockStatusReply(r)
		}
		if err != nil {
			e = ErrnoOf(err)
			if c.debug {
				c.log.Debug("device error", zap.String("cmd", cmdName(r.typ)), zap.Uint64("offset", r.off),
					zap.Uint32("length", r.length), zap.Error(err), zap.Uint32("nbd_errno", uint32(e)))
			}
		}
	}
	c.counters.count(r.typ, e, int(n))
	c.observe(r, e)
	c.reply(r, e, err)
}

// observe tells the export's ExportOptions.Observe how long r took.
func (c *conn) observe(r *request, e Errno) {
	if c.exp == nil || c.exp.obs == nil || r.start.IsZero() {
		return
	}
	var op Op
	switch r.typ {
	case cmdRead:
		op = OpRead
	case cmdWrite:
		op = OpWrite
	case cmdFlush:
		op = OpFlush
	default:
		return
	}
	c.exp.obs(op, time.Since(r.start), e != 0)
}

// reply sends the reply to r: a simple reply, or with structured replies negotiated a single
// chunk (proto.md "Simple reply message", "Structured reply chunk message").
func (c *conn) reply(r *request, e Errno, cause error) {
	c.replyMsg(r, e, cause)
	c.send(r)
}

// replyMsg encodes r's reply into r.out.
func (c *conn) replyMsg(r *request, e Errno, cause error) {
	var msg []byte
	switch {
	case r.typ == cmdBlockStatus && e == 0:
		msg = r.scratch[:r.bsLen] // encoded by blockStatusReply
	case c.structured && r.typ == cmdRead && e == 0 && r.length > 0:
		// One NBD_REPLY_TYPE_OFFSET_DATA chunk marked done: the data is all read already, so
		// no error can follow it.
		n := int(r.length)
		msg = r.buf.b[replyHeadroom-offsetDataHdrLen : replyHeadroom+n]
		putChunkHeader(msg, replyFlagDone, replyTypeOffsetData, r.handle, uint32(8+n))
		binary.BigEndian.PutUint64(msg[structuredHdrLen:], r.off)
	case c.structured && r.typ == cmdRead && e == 0:
		msg = r.scratch[:structuredHdrLen]
		putChunkHeader(msg, replyFlagDone, replyTypeNone, r.handle, 0)
	case c.structured && e != 0:
		// NBD_REPLY_TYPE_ERROR: error(4), message length(2), message.
		text := r.msg
		if cause != nil {
			text = cause.Error()
		}
		m := r.scratch[errorChunkHdrLen:errorChunkHdrLen]
		m = appendMessage(m, text)
		msg = r.scratch[:errorChunkHdrLen+len(m)]
		putChunkHeader(msg, replyFlagDone, replyTypeError, r.handle, uint32(6+len(m)))
		binary.BigEndian.PutUint32(msg[structuredHdrLen:], uint32(e))
		binary.BigEndian.PutUint16(msg[structuredHdrLen+4:], uint16(len(m)))
	case r.typ == cmdRead && e == 0 && r.length > 0:
		n := int(r.length)
		msg = r.buf.b[replyHeadroom-simpleReplyLen : replyHeadroom+n]
		putSimpleReply(msg, 0, r.handle)
	default:
		// Simple reply without payload (also for failed reads: proto.md "Simple replies" says
		// no payload follows an error).
		msg = r.scratch[:simpleReplyLen]
		putSimpleReply(msg, e, r.handle)
	}
	r.out = msg
}

// blockStatusReply encodes the NBD_REPLY_TYPE_BLOCK_STATUS chunk answering r into r.scratch
// (proto.md "NBD_REPLY_TYPE_BLOCK_STATUS"): the base:allocation context ID, then one
// descriptor per extent, together covering at most the request. Without a BlockStatuser the
// whole range is one allocated data extent (flags 0), with no allocation.
func (c *conn) blockStatusReply(r *request) error {
	b := r.scratch[:]
	binary.BigEndian.PutUint32(b[structuredHdrLen:], metaAllocationID)
	n := 0 // descriptors
	put := func(length uint32, flags uint32) {
		d := b[blockStatusHdrLen+n*extentDescLen:]
		binary.BigEndian.PutUint32(d[0:], length)
		binary.BigEndian.PutUint32(d[4:], flags)
		n++
	}
	if c.bsDev == nil {
		put(r.length, 0)
	} else {
		// check kept [off, off+length) inside the export, whose size is a multiple of the
		// block size: the widened range is inside too.
		off, end := int64(r.off), int64(r.off)+int64(r.length)
		lo := off / c.bs * c.bs
		hi := (end + c.bs - 1) / c.bs * c.bs
		exts, err := c.bsDev.BlockStatus(c.ctx, lo, hi-lo)
		if err != nil {
			return err
		}
		limit := maxExtents
		if r.flags&cmdFlagReqOne != 0 {
			limit = 1
		}
		pos := lo
		for _, x := range exts {
			if x.Length <= 0 || n == limit || pos >= end {
				break
			}
			s, t := max(pos, off), min(pos+x.Length, end)
			pos += x.Length
			if t <= s {
				continue // wholly before off (the widening)
			}
			var flags uint32
			if x.Hole {
				flags |= stateHole
			}
			if x.Zero {
				flags |= stateZero
			}
			put(uint32(t-s), flags)
		}
		if n == 0 {
			return fmt.Errorf("nbd: device reported no extent at offset %d: %w", off, EIO)
		}
	}
	r.bsLen = blockStatusHdrLen + n*extentDescLen
	putChunkHeader(b, replyFlagDone, replyTypeBlockStatus, r.handle, uint32(r.bsLen-structuredHdrLen))
	return nil
}

func putSimpleReply(b []byte, e Errno, handle uint64) {
	binary.BigEndian.PutUint32(b[0:], simpleReplyMagic)
	binary.BigEndian.PutUint32(b[4:], uint32(e))
	binary.BigEndian.PutUint64(b[8:], handle)
}

func putChunkHeader(b []byte, flags, typ uint16, handle uint64, length uint32) {
	binary.BigEndian.PutUint32(b[0:], structuredReplyMagic)
	binary.BigEndian.PutUint16(b[4:], flags)
	binary.BigEndian.PutUint16(b[6:], typ)
	binary.BigEndian.PutUint64(b[8:], handle)
	binary.BigEndian.PutUint32(b[16:], length)
}

// appendMessage appends at most maxErrorMessage bytes of s to b, cut at a rune boundary and
// without NUL bytes, so that it stays a valid NBD string.
func appendMessage(b []byte, s string) []byte {
	for _, r := range s {
		if r == 0 || r == utf8.RuneError {
			r = '?'
		}
		if len(b)+utf8.RuneLen(r) > maxErrorMessage {
			break
		}
		b = utf8.AppendRune(b, r)
	}
	return b
}
