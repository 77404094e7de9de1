package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/stack"
)

// ErrSocketInUse: the control socket answers: another srpd runs with it.
var ErrSocketInUse = errors.New("another srpd is already running on this control socket")

// controlServer serves the control API on its unix socket.
type controlServer struct {
	cfg  config.Control
	ln   *net.UnixListener
	srv  *http.Server
	done chan struct{}
	once sync.Once
	log  *zap.Logger
}

// prepareSocket makes path available for a new listener: a missing path is fine (its
// directory is created), a socket nobody answers on is a leftover of a daemon that died and is
// removed, a socket that answers belongs to a live srpd (ErrSocketInUse), anything else is an
// error and is left alone.
func prepareSocket(path string, log *zap.Logger) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("control socket %s: %w", path, err)
	}
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("control socket %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("control socket %s: the path exists and is not a socket (%s); remove it or set control.socket", path, fi.Mode().Type())
	}
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("control socket %s: %w (stop it first, or give this one another control.socket)", path, ErrSocketInUse)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("control socket %s: cannot tell whether the existing socket is live: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("control socket %s: removing the stale socket: %w", path, err)
	}
	log.Warn("removed a stale control socket (left by an srpd that did not stop cleanly)", zap.String("socket", path))
	return nil
}

// setSocketAccess gives the control socket its mode and group.
func setSocketAccess(c config.Control) error {
	if err := stack.SetSocketAccess(c.Socket, c.Mode, c.Group); err != nil {
		return fmt.Errorf("control %w", err)
	}
	return nil
}

// listenControl listens on the control socket and serves the API over d.
func (d *Daemon) listenControl(c config.Control) (*controlServer, error) {
	log := d.log.Named("ctlapi")
	if err := prepareSocket(c.Socket, log); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: c.Socket, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control socket %s: listen: %w", c.Socket, stack.ListenCause(err))
	}
	ln.SetUnlinkOnClose(true)
	if err := setSocketAccess(c); err != nil {
		ln.Close()
		return nil, err
	}
	s := &controlServer{cfg: c, ln: ln, done: make(chan struct{}), log: log}
	s.srv = &http.Server{
		Handler:           logRequests(ctlapi.Handler(d), log),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          zap.NewStdLog(log),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("control API", zap.Error(err))
		}
	}()
	log.Info("control API listening", zap.String("socket", c.Socket), zap.Stringer("mode", c.Mode), zap.String("group", c.Group))
	return s, nil
}

// statusRecorder remembers the status of a response.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// logRequests logs each API call (debug; mutations and failures at info).
func logRequests(h http.Handler, log *zap.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		t0 := time.Now()
		h.ServeHTTP(rec, r)
		lvl := log.Debug
		if r.Method != http.MethodGet || rec.status >= 400 {
			lvl = log.Info
		}
		lvl("API call", zap.String("method", r.Method), zap.String("path", r.URL.RequestURI()),
			zap.Int("status", rec.status), zap.Duration("took", time.Since(t0)))
	})
}

// close stops accepting and waits (bounded by ctx) for the calls in progress. Idempotent.
func (s *controlServer) close(ctx context.Context) {
	s.once.Do(func() {
		if err := s.srv.Shutdown(ctx); err != nil {
			s.srv.Close()
		}
		<-s.done
		s.log.Info("control API closed", zap.String("socket", s.cfg.Socket))
	})
}

// updateControl applies a changed control section on reload: new mode and group on the same
// socket, or a new socket (the old one is closed once the calls in progress, such as the
// reload that asked for it, are answered).
func (d *Daemon) updateControl(c config.Control) error {
	d.mu.RLock()
	cur := d.ctl
	d.mu.RUnlock()
	if cur != nil && cur.cfg.Socket == c.Socket {
		if err := setSocketAccess(c); err != nil {
			return err
		}
		cur.cfg = c
		return nil
	}
	ns, err := d.listenControl(c)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.ctl = ns
	d.mu.Unlock()
	if cur != nil {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cur.close(ctx)
		}()
	}
	return nil
}

// ---------------------------------------------------------------------------------------------
// Metrics endpoint

type metricsServer struct {
	ln   net.Listener
	srv  *http.Server
	done chan struct{}
}

// restartMetrics replaces the metrics listener with one for m (none when m.Listen is empty).
func (d *Daemon) restartMetrics(m config.Metrics) error {
	d.mu.Lock()
	old := d.metrics
	d.metrics = nil
	d.mu.Unlock()
	if old != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		old.close(ctx)
		cancel()
	}
	if m.Listen == "" {
		d.mu.Lock()
		delete(d.failed, "metrics")
		d.mu.Unlock()
		return nil
	}
	ln, err := net.Listen("tcp", m.Listen)
	if err != nil {
		err = fmt.Errorf("metrics: listen on %s: %w", m.Listen, stack.ListenCause(err))
		d.mu.Lock()
		d.failed["metrics"] = err.Error()
		d.mu.Unlock()
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", d.metricsHandler())
	s := &metricsServer{ln: ln, done: make(chan struct{}),
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: zap.NewStdLog(d.log)}}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	d.mu.Lock()
	d.metrics = s
	delete(d.failed, "metrics")
	d.mu.Unlock()
	d.log.Info("metrics listening", zap.Stringer("addr", ln.Addr()))
	return nil
}

func (s *metricsServer) close(ctx context.Context) {
	if err := s.srv.Shutdown(ctx); err != nil {
		s.srv.Close()
	}
	<-s.done
}
