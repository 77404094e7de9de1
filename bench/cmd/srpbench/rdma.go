package main

// The transport benchmark (bench/bench.sh rdma, make bench-rdma): RDMA WRITE and RDMA READ
// streams between two processes over softroce, beside a TCP stream of the same bytes between
// two processes, in the same run.
//
//	srpbench rdma-server -ready FILE [-addr 127.0.0.1] [-mtu 0] [-mem 16m]
//	    A softroce device on ADDR (ephemeral UDP port) listening on RDMA CM port rdmaCMPort.
//	    Each connection gets a buffer of -mem bytes registered for remote read and write; its
//	    address, rkey and length go to the peer in the CM REP. The server then does nothing
//	    but let its engine answer: an RDMA WRITE or READ needs no work from the responder's
//	    application. Writes "udp=ADDR:PORT pid=PID" to FILE once listening.
//	srpbench tcp-server -ready FILE [-addr 127.0.0.1] [-max-size 16m]
//	    A TCP server on ADDR (ephemeral port) speaking tcpHeader's protocol: for a "write"
//	    stream it reads messages and acknowledges each with 8 bytes once it has all of it (as an
//	    RDMA WRITE's ACK comes once the responder placed the data); for a "read" stream it
//	    answers each 8-byte request with a message (as an RDMA READ request is answered).
//	    Writes "tcp=ADDR:PORT pid=PID" to FILE.
//	srpbench rdma -rdma-target ADDR:PORT -rdma-pid PID -tcp-target ADDR:PORT -tcp-pid PID
//	        [-addr LOCAL] [-mtu 0] [-ops write,read] [-sizes 64k,256k,1m] [-qds 1,16]
//	        [-time 5s] [-warmup 500ms] [-repeat 1]
//	    One RC QP connected to the rdma-server (RDMA CM), then, for every op, size and queue
//	    depth, -repeat interleaved rounds: an RDMA stream of that op with qd messages in flight
//	    for -time, then a TCP stream of the same bytes with qd messages in flight. Prints one
//	    line per stream and a summary of medians: GB/s (1e9 bytes/s), softroce/TCP, and the CPU
//	    seconds per GB of each side (this process by getrusage, the server's from
//	    /proc/PID/stat), measured over the same interval as the bytes (the warm-up excluded).
//
// No allocation and no goroutine per message: every stream reuses its work requests and
// buffers; a TCP stream has one sender and one receiver goroutine.

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce"
)

const (
	rdmaCMPort = 5556
	// rdmaPrivLen is the REP private data: buffer address, length (8 bytes each), rkey (4).
	rdmaPrivLen = 20
	// rdmaMaxRd is the RDMA READs kept outstanding (both ends' CM resources): the largest queue
	// depth the benchmark uses.
	rdmaMaxRd = 16
	// userHZ is the unit of utime and stime in /proc/PID/stat (USER_HZ, 100 on every Linux
	// architecture's ABI: torvalds/linux:include/asm-generic/param.h).
	userHZ = 100
	// tcpHeaderLen is the TCP stream's header: op ('W' or 'R'), a zero byte, the messages in
	// flight (uint16, big-endian), the message size (uint32, big-endian).
	tcpHeaderLen = 8
	tcpAckLen    = 8
)

// ---- rdma-server ----

func runRDMAServer(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("rdma-server", flag.ContinueOnError)
	addrS := fs.String("addr", "127.0.0.1", "loopback or private address to bind the RoCEv2 UDP socket on")
	mtuB := mtuFlag(fs)
	memS := fs.String("mem", "16m", "registered buffer per connection (the largest size × queue depth the client uses)")
	ready := fs.String("ready", "", "file to write \"udp=ADDR:PORT pid=PID\" to once listening")
	busyPoll := fs.Duration("busy-poll", config.DefaultBusyPoll, "receive busy poll of the softroce UDP socket (link.UDPOptions.BusyPoll; srpd's default for a target-only transport; 0: off)")
	verbose := fs.Bool("v", false, "info logs (default: warnings only)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	addr, err := parseBenchAddr(*addrS)
	if err != nil {
		return err
	}
	mtu, err := parseMTU(*mtuB)
	if err != nil {
		return err
	}
	memSize, err := parseSize(*memS)
	if err != nil {
		return err
	}
	log := newLog(*verbose)
	dev, udp, err := openDevice(ctx, "bench-rdma-server", addr, mtu, 0, *busyPoll, 1, log.Named("softroce"))
	if err != nil {
		return err
	}
	defer closeDevice(dev)
	sd := softroceOf(dev)
	ln, err := sd.Listen(addr, rdmaCMPort)
	if err != nil {
		return err
	}
	defer ln.Close()
	if err := writeReady(*ready, fmt.Sprintf("udp=%v pid=%d", udp, os.Getpid())); err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		req, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := serveRDMAConn(ctx, sd, req, int(memSize)); err != nil {
				log.Warn("rdma connection", zap.Error(err))
			}
		}()
	}
}

// rdmaEnd is one side's verbs objects: a PD, one CQ for both queues, a buffer with its MR and
// an RC QP.
type rdmaEnd struct {
	pd  transport.PD
	cq  transport.CQ
	mem transport.Memory
	mr  transport.MR
	qp  transport.QP
}

func newRDMAEnd(dev transport.Device, memSize int, access transport.Access, sqDepth int) (*rdmaEnd, error) {
	e := &rdmaEnd{}
	var err error
	if e.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if e.cq, err = dev.CreateCQ(2 * sqDepth); err != nil {
		e.close()
		return nil, err
	}
	if e.mem, err = dev.AllocMemory(memSize); err != nil {
		e.close()
		return nil, err
	}
	if e.mr, err = e.pd.RegMR(e.mem.Addr(), uint64(e.mem.Len()), access); err != nil {
		e.close()
		return nil, err
	}
	e.qp, err = e.pd.CreateQP(transport.QPInitAttr{SendCQ: e.cq, RecvCQ: e.cq,
		Cap: transport.QPCap{MaxSendWR: sqDepth, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// close releases what was created, in reverse order; errors are of no use at teardown.
func (e *rdmaEnd) close() {
	if e.qp != nil {
		_ = e.qp.Close()
	}
	if e.mr != nil {
		_ = e.mr.Close()
	}
	if e.mem != nil {
		_ = e.mem.Free()
	}
	if e.cq != nil {
		_ = e.cq.Close()
	}
	if e.pd != nil {
		_ = e.pd.Close()
	}
}

// serveRDMAConn accepts req with a fresh buffer and waits until the peer disconnects (or ctx
// ends).
func serveRDMAConn(ctx context.Context, dev *softroce.Device, req transport.ConnRequest, memSize int) error {
	e, err := newRDMAEnd(dev, memSize, transport.AccessLocalWrite|transport.AccessRemoteWrite|transport.AccessRemoteRead, 16)
	if err != nil {
		_ = req.Reject(nil, transport.RejectNoResources)
		return err
	}
	defer e.close()
	priv := make([]byte, rdmaPrivLen)
	binary.BigEndian.PutUint64(priv[0:], e.mem.Addr())
	binary.BigEndian.PutUint64(priv[8:], uint64(e.mem.Len()))
	binary.BigEndian.PutUint32(priv[16:], e.mr.RKey())
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := req.Accept(actx, e.qp, priv, transport.ConnParam{ResponderResources: rdmaMaxRd})
	if err != nil {
		return fmt.Errorf("accept: %w", err)
	}
	defer func() { _ = conn.Disconnect(nil) }()
	for {
		select {
		case ev := <-conn.Events():
			if ev.Type == transport.CMEventDisconnected || ev.Type == transport.CMEventTimewaitExit {
				return nil
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// ---- tcp-server ----

func runTCPServer(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("tcp-server", flag.ContinueOnError)
	addrS := fs.String("addr", "127.0.0.1", "loopback or private address to listen on")
	ready := fs.String("ready", "", "file to write \"tcp=ADDR:PORT pid=PID\" to once listening")
	maxSizeS := fs.String("max-size", "16m", "largest buffer a stream may ask for (messages in flight × message size)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	addr, err := parseBenchAddr(*addrS)
	if err != nil {
		return err
	}
	maxSize, err := parseSize(*maxSizeS)
	if err != nil {
		return err
	}
	l, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(addr, 0)))
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		_ = l.Close()
	}()
	if err := writeReady(*ready, fmt.Sprintf("tcp=%v pid=%d", l.Addr(), os.Getpid())); err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex
	conns := map[net.Conn]struct{}{}
	for {
		c, err := l.AcceptTCP()
		if err != nil {
			mu.Lock()
			for c := range conns {
				_ = c.Close()
			}
			mu.Unlock()
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = serveTCPConn(c, int(maxSize)) // the client closes mid-stream when it has measured
			mu.Lock()
			delete(conns, c)
			mu.Unlock()
			_ = c.Close()
		}()
	}
}

func serveTCPConn(c *net.TCPConn, maxSize int) error {
	var hdr [tcpHeaderLen]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return err
	}
	qd := int(binary.BigEndian.Uint16(hdr[2:]))
	size := int(binary.BigEndian.Uint32(hdr[4:]))
	if size < 1 || qd < 1 || qd > rdmaMaxRd || qd*size > maxSize {
		return fmt.Errorf("%d messages of %d bytes", qd, size)
	}
	// qd slots in turn, as the RDMA server's buffer is used: the same memory footprint.
	slots := make([]byte, qd*size)
	var ack [tcpAckLen]byte
	switch hdr[0] {
	case 'W':
		for i := 0; ; i = (i + 1) % qd {
			if _, err := io.ReadFull(c, slots[i*size:(i+1)*size]); err != nil {
				return err
			}
			if _, err := c.Write(ack[:]); err != nil {
				return err
			}
		}
	case 'R':
		for i := 0; ; i = (i + 1) % qd {
			if _, err := io.ReadFull(c, ack[:]); err != nil {
				return err
			}
			if _, err := c.Write(slots[i*size : (i+1)*size]); err != nil {
				return err
			}
		}
	}
	return fmt.Errorf("op %q", hdr[0])
}

// ---- free-port ----

// runFreePort prints a TCP port that nothing listens on at -addr now, drawn at random below
// the ephemeral range (net.ipv4.ip_local_port_range), so that no outgoing connection takes it
// meanwhile. Another process may still bind it before the caller's server does: bench.sh
// retries with another port when its server fails to start.
func runFreePort(args []string) error {
	fs := flag.NewFlagSet("free-port", flag.ContinueOnError)
	addrS := fs.String("addr", "127.0.0.1", "loopback or private address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	addr, err := parseBenchAddr(*addrS)
	if err != nil {
		return err
	}
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 11000 {
				lo = n
			}
		}
	}
	for range 100 {
		p := uint16(10000 + rand.IntN(lo-10000))
		l, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(addr, p)))
		if err != nil {
			continue
		}
		_ = l.Close()
		fmt.Println(p)
		return nil
	}
	return fmt.Errorf("no free TCP port on %v in 100 tries", addr)
}

// ---- rdma (the client) ----

// streamCase is one stream of the benchmark.
type streamCase struct {
	write bool // RDMA WRITE / TCP client → server; otherwise RDMA READ / server → client
	size  int
	qd    int
}

func (c streamCase) op() string {
	if c.write {
		return "write"
	}
	return "read"
}

// streamResult is what one stream measured.
type streamResult struct {
	bytes     int64
	wall      time.Duration
	selfCPU   time.Duration // this process
	serverCPU time.Duration
	// retx and timeouts are the requester device's go-back-N retransmitted packets and local
	// ACK timeouts over the whole stream, warm-up included (softroce streams only).
	retx, timeouts uint64
}

func (r streamResult) gbps() float64 { return float64(r.bytes) / r.wall.Seconds() / 1e9 }

// cpuPerGB is CPU seconds per 1e9 bytes moved.
func cpuPerGB(cpu time.Duration, bytes int64) float64 {
	if bytes == 0 {
		return 0
	}
	return cpu.Seconds() / (float64(bytes) / 1e9)
}

// selfCPU is this process' user + system time.
func selfCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is process pid's user + system time from /proc/PID/stat (fields 14 and 15, in
// USER_HZ ticks), parsed after the command name's closing parenthesis.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// f[0] is field 3 (state): utime is field 14, stime 15.
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(ut+st) * time.Second / userHZ, nil
}

// measure runs a stream whose receiver counts completed bytes in moved: after warm it takes a
// snapshot of bytes, time and both processes' CPU, after dur another, then calls stop and
// waits (bounded) for done, which carries the stream's own error if it ended early.
func measure(ctx context.Context, moved *atomic.Int64, serverPID int, warm, dur time.Duration, stop func(), done <-chan error) (streamResult, error) {
	type snap struct {
		bytes     int64
		t         time.Time
		self, srv time.Duration
	}
	take := func() (snap, error) {
		s := snap{bytes: moved.Load(), t: time.Now(), self: selfCPU()}
		var err error
		s.srv, err = procCPU(serverPID)
		return s, err
	}
	finished := false
	// finish stops the stream (if it has not ended) and returns its error.
	finish := func() error {
		if finished {
			return nil
		}
		finished = true
		stop()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return errors.New("stream did not stop in 30 s")
		}
	}
	wait := func(d time.Duration) error {
		select {
		case <-time.After(d):
			return nil
		case err := <-done:
			finished = true
			if err == nil {
				err = errors.New("stream ended early")
			}
			return err
		case <-ctx.Done():
			return errors.Join(ctx.Err(), finish())
		}
	}
	fail := func(err error) (streamResult, error) {
		return streamResult{}, errors.Join(err, finish())
	}
	if err := wait(warm); err != nil {
		return fail(err)
	}
	s0, err := take()
	if err != nil {
		return fail(err)
	}
	if err := wait(dur); err != nil {
		return fail(err)
	}
	s1, err := take()
	if err != nil {
		return fail(err)
	}
	if err := finish(); err != nil {
		return streamResult{}, err
	}
	return streamResult{bytes: s1.bytes - s0.bytes, wall: s1.t.Sub(s0.t), selfCPU: s1.self - s0.self, serverCPU: s1.srv - s0.srv}, nil
}

// rdmaClient is the requester's QP connected to an rdma-server, and the server's buffer.
type rdmaClient struct {
	dev     *softroce.Device
	end     *rdmaEnd
	conn    transport.CMConn
	raddr   uint64
	rlen    uint64
	rkey    uint32
	wrs     []transport.SendWR
	sges    []transport.SGE
	wcs     []transport.WC
	pathMTU transport.MTU
	maxRd   uint8
}

func dialRDMA(ctx context.Context, dev *softroce.Device, to netip.AddrPort, memSize, sqDepth int) (*rdmaClient, error) {
	e, err := newRDMAEnd(dev, memSize, transport.AccessLocalWrite, sqDepth)
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	dev.SetPeerUDPPort(to.Addr(), to.Port())
	conn, err := dev.Dial(dctx, netip.AddrPortFrom(to.Addr(), rdmaCMPort), e.qp, nil,
		transport.ConnParam{InitiatorDepth: rdmaMaxRd, ResponderResources: rdmaMaxRd})
	if err != nil {
		e.close()
		return nil, fmt.Errorf("dial %v: %w", to, err)
	}
	priv := conn.PrivateData()
	if len(priv) < rdmaPrivLen {
		_ = conn.Disconnect(nil)
		e.close()
		return nil, fmt.Errorf("REP private data of %d bytes", len(priv))
	}
	a := e.qp.Query()
	return &rdmaClient{dev: dev, end: e, conn: conn,
		raddr: binary.BigEndian.Uint64(priv[0:]), rlen: binary.BigEndian.Uint64(priv[8:]),
		rkey: binary.BigEndian.Uint32(priv[16:]), pathMTU: a.PathMTU, maxRd: a.MaxRdAtomic,
		wrs: make([]transport.SendWR, sqDepth), sges: make([]transport.SGE, sqDepth),
		wcs: make([]transport.WC, 2*sqDepth)}, nil
}

func (c *rdmaClient) close() {
	_ = c.conn.Disconnect(nil)
	c.end.close()
}

// stream keeps c.qd WRs of the case's op in flight, slot i moving size bytes between local and
// remote offset i*size, until stop is set; every completed WR adds its bytes to moved.
func (c *rdmaClient) stream(ctx context.Context, sc streamCase, moved *atomic.Int64, stop *atomic.Bool) error {
	if uint64(sc.qd*sc.size) > c.rlen || sc.qd*sc.size > c.end.mem.Len() || sc.qd > len(c.wrs) {
		return fmt.Errorf("%d × %d bytes do not fit the buffers (local %d, remote %d, %d WRs)",
			sc.qd, sc.size, c.end.mem.Len(), c.rlen, len(c.wrs))
	}
	op := transport.WRRDMARead
	if sc.write {
		op = transport.WRRDMAWrite
	}
	for i := range sc.qd {
		c.sges[i] = transport.SGE{Addr: c.end.mem.Addr() + uint64(i*sc.size), Length: uint32(sc.size), LKey: c.end.mr.LKey()}
		c.wrs[i] = transport.SendWR{ID: uint64(i), Opcode: op, Flags: transport.SendSignaled, SGL: c.sges[i : i+1],
			RemoteAddr: c.raddr + uint64(i*sc.size), RKey: c.rkey}
	}
	if err := c.end.qp.PostSend(c.wrs[:sc.qd]); err != nil {
		return err
	}
	inflight := sc.qd
	for inflight > 0 {
		n := c.end.cq.Poll(c.wcs)
		if n == 0 {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := c.end.cq.Wait(wctx)
			cancel()
			if err != nil {
				return fmt.Errorf("waiting for completions (%d in flight): %w", inflight, err)
			}
			continue
		}
		stopping := stop.Load()
		for _, wc := range c.wcs[:n] {
			if wc.Status != transport.WCSuccess {
				return fmt.Errorf("completion of %v: %v (vendor %#x)", op, wc.Status, wc.VendorErr)
			}
			moved.Add(int64(sc.size))
			if stopping {
				inflight--
				continue
			}
			if err := c.end.qp.PostSend(c.wrs[wc.ID : wc.ID+1]); err != nil {
				return err
			}
		}
	}
	return nil
}

// tcpStream runs the case over a new TCP connection to the tcp-server: a sender goroutine
// sends a message (write) or an 8-byte request (read) whenever fewer than qd are
// outstanding; the receiver reads the 8-byte acks (write) or the messages (read), adding each
// message's bytes to moved. stop closes the connection mid-stream; done then receives nil, or
// the error that ended the stream before.
func tcpStream(ctx context.Context, to netip.AddrPort, sc streamCase, moved *atomic.Int64, done chan<- error) (stop func(), err error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", to.String())
	if err != nil {
		return nil, err
	}
	c := nc.(*net.TCPConn)
	var hdr [tcpHeaderLen]byte
	hdr[0] = 'R'
	if sc.write {
		hdr[0] = 'W'
	}
	binary.BigEndian.PutUint16(hdr[2:], uint16(sc.qd))
	binary.BigEndian.PutUint32(hdr[4:], uint32(sc.size))
	if _, err := c.Write(hdr[:]); err != nil {
		_ = c.Close()
		return nil, err
	}
	tokens := make(chan struct{}, sc.qd)
	for range sc.qd {
		tokens <- struct{}{}
	}
	quit := make(chan struct{})
	var mu sync.Mutex
	var first error // what ended the stream before stop, if anything
	stopped := false
	end := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil && !stopped {
			first = err
		}
		select {
		case <-quit:
		default:
			close(quit)
			_ = c.Close()
		}
	}
	stop = func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		end(nil)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	// Messages come from (write) or go to (read) qd slots in turn, as the RDMA stream's do:
	// the same memory footprint on the client.
	slots := make([]byte, sc.qd*sc.size)
	go func() { // sender
		defer wg.Done()
		var req [tcpAckLen]byte
		for i := 0; ; i = (i + 1) % sc.qd {
			select {
			case <-tokens:
			case <-quit:
				return
			}
			out := req[:]
			if sc.write {
				out = slots[i*sc.size : (i+1)*sc.size]
			}
			if _, err := c.Write(out); err != nil {
				end(fmt.Errorf("send: %w", err))
				return
			}
		}
	}()
	go func() { // receiver
		defer wg.Done()
		var ack [tcpAckLen]byte
		for i := 0; ; i = (i + 1) % sc.qd {
			in := ack[:]
			if !sc.write {
				in = slots[i*sc.size : (i+1)*sc.size]
			}
			if _, err := io.ReadFull(c, in); err != nil {
				end(fmt.Errorf("receive: %w", err))
				return
			}
			moved.Add(int64(sc.size))
			tokens <- struct{}{} // never blocks: at most qd are outstanding
		}
	}()
	go func() {
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		done <- first
	}()
	return stop, nil
}

func runRDMAStream(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("rdma", flag.ContinueOnError)
	rdmaS := fs.String("rdma-target", "", "the rdma-server's RoCEv2 UDP address (ADDR:PORT, from its ready file)")
	rdmaPID := fs.Int("rdma-pid", 0, "PID of the rdma-server (its CPU time from /proc/PID/stat)")
	tcpS := fs.String("tcp-target", "", "the tcp-server's address (ADDR:PORT)")
	tcpPID := fs.Int("tcp-pid", 0, "PID of the tcp-server")
	addrS := fs.String("addr", "", "address to bind the RoCEv2 UDP socket on (default: the rdma-server's)")
	mtuB := mtuFlag(fs)
	opsS := fs.String("ops", "write,read", "streams: write (RDMA WRITE; TCP client → server), read (RDMA READ; TCP server → client)")
	sizesS := fs.String("sizes", "64k,256k,1m", "message sizes")
	qdsS := fs.String("qds", "1,16", "messages in flight")
	dur := fs.Duration("time", 5*time.Second, "measured time of each stream")
	warm := fs.Duration("warmup", 500*time.Millisecond, "time each stream runs before it is measured")
	repeat := fs.Int("repeat", 1, "rounds of every stream, interleaved; the summary gives medians")
	label := fs.String("label", "", "label of the summary (e.g. the set-up)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rdmaTo, err := netip.ParseAddrPort(*rdmaS)
	if err != nil {
		return fmt.Errorf("-rdma-target %q: %w", *rdmaS, err)
	}
	tcpTo, err := netip.ParseAddrPort(*tcpS)
	if err != nil {
		return fmt.Errorf("-tcp-target %q: %w", *tcpS, err)
	}
	for _, a := range []netip.Addr{rdmaTo.Addr(), tcpTo.Addr()} {
		if err := benchAddr(a); err != nil {
			return err
		}
	}
	if *rdmaPID <= 0 || *tcpPID <= 0 {
		return errors.New("-rdma-pid and -tcp-pid are required")
	}
	mtu, err := parseMTU(*mtuB)
	if err != nil {
		return err
	}
	local := rdmaTo.Addr()
	if *addrS != "" {
		if local, err = parseBenchAddr(*addrS); err != nil {
			return err
		}
	}
	var cases []streamCase
	var sizes, qds []int
	for _, s := range strings.Split(*sizesS, ",") {
		n, err := parseSize(s)
		if err != nil {
			return err
		}
		sizes = append(sizes, int(n))
	}
	for _, s := range strings.Split(*qdsS, ",") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > rdmaMaxRd {
			return fmt.Errorf("-qds: %q is not in 1..%d", s, rdmaMaxRd)
		}
		qds = append(qds, n)
	}
	for _, op := range strings.Split(*opsS, ",") {
		if op != "write" && op != "read" {
			return fmt.Errorf("-ops: %q is neither write nor read", op)
		}
		for _, size := range sizes {
			for _, qd := range qds {
				cases = append(cases, streamCase{write: op == "write", size: size, qd: qd})
			}
		}
	}
	memSize := 0
	for _, c := range cases {
		memSize = max(memSize, c.size*c.qd)
	}

	log := newLog(false)
	dev, _, err := openDevice(ctx, "bench-rdma-client", local, mtu, 0, 0, 1, log.Named("softroce"))
	if err != nil {
		return err
	}
	defer closeDevice(dev)
	sd := softroceOf(dev)
	cl, err := dialRDMA(ctx, sd, rdmaTo, memSize, rdmaMaxRd)
	if err != nil {
		return err
	}
	defer cl.close()
	fmt.Printf("rdma connection: %v -> %v path_mtu=%v max_rd_atomic=%d server_buffer=%d\n",
		cl.conn.LocalAddr(), cl.conn.RemoteAddr(), cl.pathMTU, cl.maxRd, cl.rlen)

	type key struct {
		c   streamCase
		tcp bool
	}
	results := map[key][]streamResult{}
	for round := 1; round <= *repeat; round++ {
		for _, sc := range cases {
			for _, isTCP := range []bool{false, true} {
				var moved atomic.Int64
				done := make(chan error, 1)
				var res streamResult
				if isTCP {
					stop, err := tcpStream(ctx, tcpTo, sc, &moved, done)
					if err != nil {
						return fmt.Errorf("tcp %s: %w", sc.op(), err)
					}
					if res, err = measure(ctx, &moved, *tcpPID, *warm, *dur, stop, done); err != nil {
						return fmt.Errorf("tcp %s size %d qd %d: %w", sc.op(), sc.size, sc.qd, err)
					}
				} else {
					var stop atomic.Bool
					st0 := sd.Stats()
					go func() { done <- cl.stream(ctx, sc, &moved, &stop) }()
					if res, err = measure(ctx, &moved, *rdmaPID, *warm, *dur, func() { stop.Store(true) }, done); err != nil {
						return fmt.Errorf("rdma %s size %d qd %d: %w", sc.op(), sc.size, sc.qd, err)
					}
					st1 := sd.Stats()
					res.retx, res.timeouts = st1.Retransmits-st0.Retransmits, st1.Timeouts-st0.Timeouts
				}
				kind, extra := "softroce", fmt.Sprintf(" retx=%d timeouts=%d", res.retx, res.timeouts)
				if isTCP {
					kind, extra = "tcp", ""
				}
				if res.bytes <= 0 {
					return fmt.Errorf("%s %s size %d qd %d: no message completed in %v", kind, sc.op(), sc.size, sc.qd, res.wall)
				}
				k := key{sc, isTCP}
				results[k] = append(results[k], res)
				fmt.Printf("stream round=%d kind=%s op=%s size=%d qd=%d gbps=%.3f client_cpu_s_per_gb=%.3f server_cpu_s_per_gb=%.3f bytes=%d wall_s=%.2f%s\n",
					round, kind, sc.op(), sc.size, sc.qd, res.gbps(), cpuPerGB(res.selfCPU, res.bytes),
					cpuPerGB(res.serverCPU, res.bytes), res.bytes, res.wall.Seconds(), extra)
			}
		}
	}
	median := func(rs []streamResult, f func(streamResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	gb := func(r streamResult) float64 { return r.gbps() }
	ccpu := func(r streamResult) float64 { return cpuPerGB(r.selfCPU, r.bytes) }
	scpu := func(r streamResult) float64 { return cpuPerGB(r.serverCPU, r.bytes) }
	fmt.Println()
	what := fmt.Sprintf("%v s per stream", dur.Seconds())
	if *repeat > 1 {
		what += fmt.Sprintf(", median of %d rounds", *repeat)
	}
	if *label != "" {
		what = *label + ", " + what
	}
	fmt.Printf("== transport summary (%s; path MTU %v; GB/s = 1e9 B/s; CPU s/GB: client = requester, server = responder / TCP server; sr retx: softroce packets retransmitted, all rounds)\n", what, cl.pathMTU)
	fmt.Printf("%-6s %8s %4s | %9s %9s %8s | %12s %12s | %12s %12s | %8s\n", "op", "size", "qd",
		"softroce", "tcp", "sr/tcp", "sr cli s/GB", "sr srv s/GB", "tcp cli s/GB", "tcp srv s/GB", "sr retx")
	for _, sc := range cases {
		r, t := results[key{sc, false}], results[key{sc, true}]
		rg, tg := median(r, gb), median(t, gb)
		ratio := 0.0
		if tg > 0 {
			ratio = rg / tg
		}
		var retx uint64
		for _, x := range r {
			retx += x.retx
		}
		fmt.Printf("%-6s %8s %4d | %9.3f %9.3f %8.2f | %12.3f %12.3f | %12.3f %12.3f | %8d\n", sc.op(), fmtBytes(sc.size), sc.qd,
			rg, tg, ratio, median(r, ccpu), median(r, scpu), median(t, ccpu), median(t, scpu), retx)
	}
	return nil
}

// fmtBytes writes 65536 as 64KiB and 1048576 as 1MiB.
func fmtBytes(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.Itoa(n>>20) + "MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.Itoa(n>>10) + "KiB"
	}
	return strconv.Itoa(n)
}
