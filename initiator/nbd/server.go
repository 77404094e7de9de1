package nbd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
)

// Defaults for the zero values of Config.
const (
	DefaultMaxRequestSize       = 32 << 20 // 2^25, the largest payload proto.md says a client may expect to work
	DefaultMaxInFlightBytes     = 256 << 20
	DefaultReadSpin             = 50 * time.Microsecond
	DefaultConnMaxInFlightBytes = 64 << 20
	DefaultMaxInFlight          = 128
	DefaultWorkers              = 32
	DefaultHandshakeTimeout     = 30 * time.Second
	DefaultShutdownTimeout      = 10 * time.Second
	DefaultWriteTimeout         = 30 * time.Second
	DefaultMaxConnections       = 64
)

// Config configures a Server. The zero value is usable.
type Config struct {
	// Logger receives connection and listener events; nil means no logging.
	Logger *zap.Logger
	// MaxRequestSize is the largest READ or WRITE length served (advertised as the maximum block
	// size in NBD_INFO_BLOCK_SIZE); larger ones are answered EINVAL. A multiple of 64 KiB from
	// 64 KiB to 1 GiB; 0 means DefaultMaxRequestSize. A WRITE payload above the limit is read
	// and thrown away (and EINVAL sent) when it is at most 4×MaxRequestSize; beyond that the
	// connection is dropped, as proto.md allows for a payload large enough to be a denial of
	// service.
	MaxRequestSize int
	// MaxInFlightBytes bounds the memory of every request buffer of the server together (in
	// use and cached for reuse); requests wait for room. 0 means DefaultMaxInFlightBytes; it is
	// raised to the buffer size of one MaxRequestSize request when smaller.
	MaxInFlightBytes int64
	// ConnMaxInFlightBytes bounds the buffer bytes one connection holds (so a client that stops
	// reading replies cannot take the whole budget). 0 means DefaultConnMaxInFlightBytes, capped
	// to MaxInFlightBytes; a single request is always admitted when the connection holds none.
	//
	// Within it a connection gets a fair share of the budget: the part not reserved (below)
	// divided by the connections holding or waiting for buffers. A quarter of the budget (less
	// when the budget is under 4/3 of a MaxRequestSize buffer) is a reserve that only serves a
	// connection holding at most reserve/MaxConnections bytes with the new buffer (1 MiB at the
	// defaults): clients that stop reading replies keep their buffers until WriteTimeout closes
	// them, and whatever they hold, a connection with little in flight (a 4 KiB read at queue
	// depth 1, a new client) is served at once.
	ConnMaxInFlightBytes int64
	// MaxInFlight is the number of requests a connection may have read and not yet answered
	// (the pipeline window). Each worker reads the requests it executes, so the window is
	// in practice Workers plus the replies waiting for the socket. 0 means DefaultMaxInFlight.
	MaxInFlight int
	// Workers is the number of goroutines per connection calling the Device: the queue depth
	// the Device sees from one connection. 0 means DefaultWorkers; capped to MaxInFlight.
	Workers int
	// HandshakeTimeout bounds the whole handshake phase of a connection. 0 means
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// ShutdownTimeout bounds how long Serve's shutdown and RemoveExport wait for requests in
	// flight before they cancel them and close the connections. 0 means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// WriteTimeout bounds how long a batch of replies may wait for the socket: when the client
	// does not read them within it (counted from the first write that finds the socket full),
	// the connection is closed, its requests' buffers go back to the pool, and it is counted in
	// Counters.StalledClosed. A batch holds at most the connection's buffer window, so a client
	// must read at least ConnMaxInFlightBytes/WriteTimeout (about 2 MiB/s at the defaults) while
	// it has that much in flight. Idle time between requests does not count. 0 means
	// DefaultWriteTimeout; negative: no deadline.
	WriteTimeout time.Duration
	// MaxConnections bounds the connections of the server in transmission phase (every export
	// together): NBD_OPT_GO over the limit is answered NBD_REP_ERR_POLICY with a message saying
	// so (NBD_OPT_EXPORT_NAME, which cannot carry an error, closes the connection), counted in
	// Stats.Refused; established connections are not affected. As many connections again may
	// be in their handshake; one more is closed as soon as it is accepted (also counted). 0
	// means DefaultMaxConnections.
	MaxConnections int
	// AllowNonLoopback lets ListenTCP bind addresses other than loopback ones. NBD has no
	// authentication here: keep it off unless the network is trusted.
	AllowNonLoopback bool
	// Allocator, if not nil, provides the memory of request buffers of 32 KiB and more:
	// memory the Device transfers without copying it (initiator.NBDAllocator for a LUN of an
	// RDMA session). It is allocated as the budget above allows, counted like heap buffers
	// (plus a page each, not counted, in front of the payload), kept for reuse while the server
	// has connections and given back when it has none or shuts down. A failed allocation is
	// served from the heap.
	Allocator Allocator
	// ReadSpin is how long a connection with no request in flight keeps retrying a read that
	// finds no data before it waits for the socket in the runtime's netpoller. A client at
	// queue depth 1 sends its next request a few tens of microseconds after a reply; caught
	// by the spin, it costs no thread wake-up (on a small VM, a wake-up and the migration
	// that often follows cost more than a 4 KiB I/O). Busy connections (requests in flight)
	// never spin; an idle one spins once per wait. 0 means DefaultReadSpin; negative: off.
	ReadSpin time.Duration
}

func (c *Config) setDefaults() error {
	c.MaxRequestSize = cmp.Or(c.MaxRequestSize, DefaultMaxRequestSize)
	c.ReadSpin = cmp.Or(c.ReadSpin, DefaultReadSpin)
	if c.MaxRequestSize < 64<<10 || c.MaxRequestSize > 1<<30 || c.MaxRequestSize%(64<<10) != 0 {
		return fmt.Errorf("nbd: MaxRequestSize %d is not a multiple of 64 KiB in [64 KiB, 1 GiB]", c.MaxRequestSize)
	}
	maxBuf := classBytes(sizeClass(c.MaxRequestSize))
	c.MaxInFlightBytes = cmp.Or(c.MaxInFlightBytes, DefaultMaxInFlightBytes)
	if c.MaxInFlightBytes < maxBuf {
		c.MaxInFlightBytes = maxBuf
	}
	c.ConnMaxInFlightBytes = cmp.Or(c.ConnMaxInFlightBytes, DefaultConnMaxInFlightBytes)
	if c.ConnMaxInFlightBytes > c.MaxInFlightBytes {
		c.ConnMaxInFlightBytes = c.MaxInFlightBytes
	}
	c.MaxInFlight = cmp.Or(c.MaxInFlight, DefaultMaxInFlight)
	c.Workers = cmp.Or(c.Workers, DefaultWorkers)
	if c.Workers > c.MaxInFlight {
		c.Workers = c.MaxInFlight
	}
	c.MaxConnections = cmp.Or(c.MaxConnections, DefaultMaxConnections)
	if c.MaxInFlight < 0 || c.Workers < 0 || c.MaxInFlightBytes < 0 || c.ConnMaxInFlightBytes < 0 || c.MaxConnections < 0 {
		return errors.New("nbd: negative limit in Config")
	}
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	c.HandshakeTimeout = cmp.Or(c.HandshakeTimeout, DefaultHandshakeTimeout)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return nil
}

// ExportOptions are the optional attributes of an export.
type ExportOptions struct {
	// Description is sent in NBD_INFO_DESCRIPTION and after the name in NBD_OPT_LIST replies.
	Description string
	// Observe, if set, is told how long each READ, WRITE and FLUSH request took, from its
	// header read to its reply queued, and whether it failed. It is called on the request's
	// path (the device's completion for an AsyncDevice) and must not block; it replaces
	// wrapping the Device for timing, which would hide AsyncDevice and BlockStatuser.
	Observe func(op Op, d time.Duration, failed bool)
}

// Op names a request kind for ExportOptions.Observe.
type Op uint8

const (
	OpRead Op = iota
	OpWrite
	OpFlush
)

// export is one named Device and the connections using it.
type export struct {
	name string
	desc string
	dev  Device
	obs  func(op Op, d time.Duration, failed bool)

	mu      sync.Mutex
	conns   map[*conn]struct{}
	removed bool
	retired Counters // counters of the connections that have ended
}

// attach adds c to the export unless it has been removed.
func (e *export) attach(c *conn) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.removed {
		return false
	}
	e.conns[c] = struct{}{}
	return true
}

// detach removes c, folding its counters into the export's.
func (e *export) detach(c *conn) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.conns[c]; ok {
		delete(e.conns, c)
		e.retired.add(c.counters.snapshot())
	}
}

// Server serves named exports over the NBD protocol (fixed newstyle handshake). Create it with
// NewServer, add exports and listeners, then call Serve. Safe for concurrent use.
type Server struct {
	cfg  Config
	log  *zap.Logger
	pool *bufPool

	mu        sync.Mutex
	exports   map[string]*export
	listeners []net.Listener
	conns     map[*conn]struct{}
	serving   bool
	closed    bool
	baseCtx   context.Context

	acceptWG sync.WaitGroup
	connWG   sync.WaitGroup

	// live counts the connections in transmission phase (s.mu), for Config.MaxConnections.
	live int
	// holders counts the connections holding or waiting for buffers: the divisor of the fair
	// share (conn.acquire).
	holders atomic.Int64

	nextID            atomic.Uint64
	accepted          atomic.Uint64
	handshakeFailures atomic.Uint64
	refused           atomic.Uint64
	refuseLog         atomic.Int64 // unix nanoseconds of the last refusal logged
}

// NewServer returns a server with no exports and no listeners.
func NewServer(cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		pool:    newBufPool(cfg.MaxInFlightBytes, cfg.MaxRequestSize, cfg.MaxConnections, cfg.Allocator),
		exports: make(map[string]*export),
		conns:   make(map[*conn]struct{}),
	}, nil
}

// validString reports whether s is an NBD string (proto.md "Conventions"): UTF-8, no NUL, at
// most 4096 bytes.
func validString(s string) bool {
	if len(s) > maxStringLen || !utf8.ValidString(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return false
		}
	}
	return true
}

// AddExport exports dev under name (the empty name is the default export of proto.md). The
// Device's Size must be a multiple of its BlockSize, a power of two from 512 to 65536.
func (s *Server) AddExport(name string, dev Device, opts ExportOptions) error {
	if !validString(name) || !validString(opts.Description) {
		return fmt.Errorf("%w: export name or description is not a UTF-8 string of at most 4096 bytes without NUL", ErrInvalidDevice)
	}
	if dev == nil {
		return fmt.Errorf("%w: nil Device", ErrInvalidDevice)
	}
	bs, size := dev.BlockSize(), dev.Size()
	if bs < 512 || bs > 65536 || bs&(bs-1) != 0 {
		return fmt.Errorf("%w: block size %d is not a power of two in [512, 65536]", ErrInvalidDevice, bs)
	}
	if size < 0 || size%int64(bs) != 0 {
		return fmt.Errorf("%w: size %d is not a multiple of the block size %d", ErrInvalidDevice, size, bs)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrServerClosed
	}
	if _, ok := s.exports[name]; ok {
		return fmt.Errorf("%w: %q", ErrExportExists, name)
	}
	s.exports[name] = &export{name: name, desc: opts.Description, dev: dev, obs: opts.Observe, conns: make(map[*conn]struct{})}
	return nil
}

// RemoveExport withdraws an export: new handshakes no longer see it, and its connections stop
// reading requests, finish the ones in flight and close (clients see the connection end, as
// at server shutdown). It waits for that until ctx is done or Config.ShutdownTimeout passes,
// then cancels the remaining requests and closes the connections. When it returns, no method
// of the export's Device is running or will be called by this server.
func (s *Server) RemoveExport(ctx context.Context, name string) error {
	s.mu.Lock()
	e, ok := s.exports[name]
	if ok {
		delete(s.exports, name)
	}
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q", ErrNoExport, name)
	}
	e.mu.Lock()
	e.removed = true
	conns := make([]*conn, 0, len(e.conns))
	for c := range e.conns {
		conns = append(conns, c)
	}
	e.mu.Unlock()
	s.stopConns(ctx, conns)
	return nil
}

// Exports returns the export names, sorted.
func (s *Server) Exports() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.exports))
	for n := range s.exports {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// lookup returns the export called name, or nil.
func (s *Server) lookup(name string) *export {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exports[name]
}

// exportList returns the exports sorted by name.
func (s *Server) exportList() []*export {
	s.mu.Lock()
	list := make([]*export, 0, len(s.exports))
	for _, e := range s.exports {
		list = append(list, e)
	}
	s.mu.Unlock()
	sort.Slice(list, func(i, j int) bool { return list[i].name < list[j].name })
	return list
}

// ListenUnix listens on a unix socket at path. A socket file left by a server that is gone
// (nobody answers a connect) is removed first; a socket someone answers on is a live server,
// and ListenUnix fails with ErrSocketInUse without touching it. Any other existing file is an
// error. The socket file is removed when the server shuts down.
func (s *Server) ListenUnix(path string) (net.Addr, error) {
	l, err := net.Listen("unix", path)
	if err != nil && errors.Is(err, syscall.EADDRINUSE) {
		fi, serr := os.Lstat(path)
		if serr != nil || fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("nbd: listen on %s: the path exists and is not a socket: %w", path, err)
		}
		probe, derr := net.DialTimeout("unix", path, time.Second)
		if derr == nil {
			probe.Close()
			return nil, fmt.Errorf("%w: %s", ErrSocketInUse, path)
		}
		if !errors.Is(derr, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("nbd: listen on %s: cannot tell whether the existing socket is live: %w", path, derr)
		}
		if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return nil, fmt.Errorf("nbd: listen on %s: removing the stale socket: %w", path, rerr)
		}
		s.log.Info("removed a stale unix socket", zap.String("path", path))
		l, err = net.Listen("unix", path)
	}
	if err != nil {
		return nil, fmt.Errorf("nbd: listen on unix socket: %w", err)
	}
	if err := s.addListener(l); err != nil {
		return nil, err
	}
	return l.Addr(), nil
}

// ListenTCP listens on a TCP address ("127.0.0.1:10809", "[::1]:0", "localhost:0"). Unless
// Config.AllowNonLoopback is set the host must be a loopback address or "localhost".
func (s *Server) ListenTCP(address string) (net.Addr, error) {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("nbd: listen on %q: %w", address, err)
	}
	if !s.cfg.AllowNonLoopback {
		ip := net.ParseIP(host)
		if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, fmt.Errorf("%w: %q", ErrNotLoopback, address)
		}
	}
	network := "tcp"
	if host == "localhost" {
		network = "tcp4"
	}
	l, err := net.Listen(network, address)
	if err != nil {
		return nil, fmt.Errorf("nbd: listen on tcp: %w", err)
	}
	if err := s.addListener(l); err != nil {
		return nil, err
	}
	return l.Addr(), nil
}

// addListener registers l, and starts accepting on it if Serve is running.
func (s *Server) addListener(l net.Listener) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		l.Close()
		return ErrServerClosed
	}
	s.listeners = append(s.listeners, l)
	if s.serving {
		s.acceptWG.Add(1)
		go s.acceptLoop(l)
	}
	return nil
}

// Addrs returns the addresses of the listeners.
func (s *Server) Addrs() []net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	addrs := make([]net.Addr, len(s.listeners))
	for i, l := range s.listeners {
		addrs[i] = l.Addr()
	}
	return addrs
}

// Serve accepts connections on every listener (including ones added later) until ctx is done,
// then shuts down gracefully: it closes the listeners, lets every connection finish the
// requests it has read (for up to Config.ShutdownTimeout, then cancels them), closes the
// connections and returns nil once every goroutine and every Device call has returned. The
// server cannot be used afterwards.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return ErrServerClosed
	case s.serving:
		s.mu.Unlock()
		return ErrAlreadyServing
	}
	s.serving = true
	s.baseCtx = context.WithoutCancel(ctx)
	for _, l := range s.listeners {
		s.acceptWG.Add(1)
		go s.acceptLoop(l)
	}
	s.mu.Unlock()

	<-ctx.Done()
	s.shutdown()
	return nil
}

// shutdown closes the listeners and stops every connection.
func (s *Server) shutdown() {
	s.mu.Lock()
	s.closed = true
	ls := s.listeners
	s.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	s.acceptWG.Wait()
	// No connection can register any more: the set is final.
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	s.stopConns(context.Background(), conns)
	s.connWG.Wait()
	s.pool.releaseFree()
	s.log.Info("nbd server stopped")
}

// stopConns drains conns (no more requests are read; the ones in flight are answered), waits
// until they have closed, ctx is done or ShutdownTimeout passes, then kills the rest and waits
// for them to close.
func (s *Server) stopConns(ctx context.Context, conns []*conn) {
	if len(conns) == 0 {
		return
	}
	for _, c := range conns {
		c.drain()
	}
	timer := time.NewTimer(s.cfg.ShutdownTimeout)
	defer timer.Stop()
	for _, c := range conns {
		select {
		case <-c.done:
			continue
		case <-ctx.Done():
		case <-timer.C:
		}
		// Out of time: cancel and close whatever is left, then wait for it.
		for _, k := range conns {
			k.kill()
		}
		break
	}
	for _, c := range conns {
		<-c.done
	}
}

// acceptLoop accepts connections on l until it is closed.
func (s *Server) acceptLoop(l net.Listener) {
	defer s.acceptWG.Done()
	var delay time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE, ECONNABORTED and friends: back off and retry.
			if delay == 0 {
				delay = 5 * time.Millisecond
			} else if delay *= 2; delay > time.Second {
				delay = time.Second
			}
			s.log.Warn("accept failed; retrying", zap.Stringer("listener", l.Addr()), zap.Error(err), zap.Duration("delay", delay))
			time.Sleep(delay)
			continue
		}
		delay = 0
		s.mu.Lock()
		base := s.baseCtx
		s.mu.Unlock()
		c, err := s.newConn(base, nc)
		if err != nil {
			nc.Close()
			if errors.Is(err, ErrTooManyConnections) {
				s.logRefusal("accept", nc.RemoteAddr())
			}
			continue
		}
		go s.run(c, true)
	}
}

// ServeConn serves one already established connection (a socketpair end, an inherited socket,
// a net.Pipe) until the client disconnects, ctx is done (then it stops like RemoveExport does)
// or the server shuts down, and closes it. It returns nil when the connection ended cleanly
// (NBD_CMD_DISC, NBD_OPT_ABORT, end of stream between requests, shutdown) and the protocol or
// I/O error otherwise.
func (s *Server) ServeConn(ctx context.Context, nc net.Conn) error {
	c, err := s.newConn(context.WithoutCancel(ctx), nc)
	if err != nil {
		nc.Close()
		return err
	}
	stop := context.AfterFunc(ctx, func() { s.stopConns(context.Background(), []*conn{c}) })
	defer stop()
	return s.run(c, false)
}

// newConn registers a connection, unless Config.MaxConnections connections are in their
// handshake already (a flood of clients that never finish it must not hold the server's
// memory and goroutines without bound).
func (s *Server) newConn(base context.Context, nc net.Conn) (*conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrServerClosed
	}
	if len(s.conns)-s.live >= s.cfg.MaxConnections {
		s.refused.Add(1)
		return nil, fmt.Errorf("%w: %d connections are in their handshake", ErrTooManyConnections, len(s.conns)-s.live)
	}
	if base == nil {
		base = context.Background()
	}
	c := newConn(s, base, nc)
	s.conns[c] = struct{}{}
	s.connWG.Add(1)
	s.accepted.Add(1)
	return c, nil
}

// admit takes one of the Config.MaxConnections transmission slots; false when none is left.
func (s *Server) admit() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live >= s.cfg.MaxConnections {
		s.refused.Add(1)
		return false
	}
	s.live++
	return true
}

// leave gives back the slot admit took.
func (s *Server) leave() {
	s.mu.Lock()
	s.live--
	s.mu.Unlock()
}

// refuseLogInterval is the least time between two log lines about refused connections: a
// flood of them must not flood the log as well (Stats.Refused counts them all).
const refuseLogInterval = 10 * time.Second

// logRefusal logs a connection refused for Config.MaxConnections, at most once per
// refuseLogInterval.
func (s *Server) logRefusal(phase string, remote net.Addr) {
	now := time.Now().UnixNano()
	last := s.refuseLog.Load()
	if (last != 0 && now-last < int64(refuseLogInterval)) || !s.refuseLog.CompareAndSwap(last, now) {
		return
	}
	addr := ""
	if remote != nil {
		addr = remote.String()
	}
	s.log.Warn("refused a connection: max_connections reached (further refusals are counted, logged at most every 10s)",
		zap.String("phase", phase), zap.String("remote", addr), zap.Int("max_connections", s.cfg.MaxConnections),
		zap.Uint64("refused_total", s.refused.Load()))
}

// run serves c to the end and unregisters it; with logEnd it logs how the connection ended
// (ServeConn returns that to its caller instead).
func (s *Server) run(c *conn, logEnd bool) (err error) {
	defer func() {
		if logEnd {
			switch {
			case errors.Is(err, ErrTooManyConnections):
				// logRefusal has said so (rate-limited).
			case errors.Is(err, ErrWriteStalled):
				c.log.Warn("closed a connection whose client does not read its replies", zap.Error(err),
					zap.Duration("write_timeout", s.cfg.WriteTimeout))
			case err != nil:
				c.log.Info("connection ended", zap.Error(err))
			default:
				c.log.Debug("connection closed")
			}
		}
		c.dlMu.Lock()
		drained := c.draining && !c.broken.Load()
		c.dlMu.Unlock()
		if drained {
			c.discardUnread()
		}
		c.nc.Close()
		c.cancel()
		s.mu.Lock()
		delete(s.conns, c)
		idle := len(s.conns) == 0
		s.mu.Unlock()
		if idle {
			s.pool.releaseFree()
		}
		close(c.done)
		s.connWG.Done()
	}()
	e, err := c.handshake()
	if err != nil {
		err = c.readErr(err) // a handshake cut short by shutdown or RemoveExport is no error
	}
	if c.exp != nil {
		defer s.leave()
		defer c.exp.detach(c)
	}
	if err != nil || e == nil {
		s.handshakeFailures.Add(1)
		return cleanEnd(err)
	}
	return cleanEnd(c.transmit())
}
