package stack

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/initiator"
	"github.com/srpd/srpd/initiator/nbd"
	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

// Export is a remote LUN of a session served over NBD on a unix socket.
type Export struct {
	Config config.NBDExport
	Server *nbd.Server
	cancel context.CancelFunc
	done   chan struct{}
}

// NBDOptions are what serving an export takes beyond its configuration.
type NBDOptions struct {
	Logger *zap.Logger
	// Session names the session in the export's description.
	Session string
	// ShutdownTimeout bounds the answers to the requests in flight when the export stops
	// (0: the NBD server's default).
	ShutdownTimeout time.Duration
	// Names are the export names offered (nil: the default export "" and "lun<N>").
	Names []string
	// Observe, if set, is told how long each READ, WRITE and FLUSH took (nbd.ExportOptions;
	// the daemon's latency histograms).
	Observe func(op nbd.Op, d time.Duration, failed bool)
	// Workers and ReadSpin tune the server's connections (nbd.Config; 0: its defaults), and
	// HeapBuffers takes request buffers from the Go heap (copied through the initiator's slot
	// buffers) rather than the session's registered memory: srpbench compares them.
	Workers     int
	ReadSpin    time.Duration
	HeapBuffers bool
	// Group owns the socket when the export names none (the daemon passes the control
	// socket's group); empty: the daemon's own group.
	Group string
}

// NBDConfig maps an export's max_connections and write_timeout to the NBD server's Config
// (omitted: the server's defaults; write_timeout off: a negative WriteTimeout, no deadline).
func NBDConfig(e config.NBDExport) nbd.Config {
	cfg := nbd.Config{MaxConnections: e.MaxConnections}
	switch t := e.WriteTimeout; {
	case t == nil:
	case t.Off():
		cfg.WriteTimeout = -1
	default:
		cfg.WriteTimeout = t.Duration()
	}
	return cfg
}

// ServeNBD serves LUN e.LUN of sess on the unix socket e.Socket (its directory created if
// need be) until Stop. Request buffers come from the session's registered memory (mapped
// without a copy) unless o.HeapBuffers.
func ServeNBD(sess *initiator.Session, e config.NBDExport, o NBDOptions) (*Export, error) {
	l := sess.LUN(uint64(e.LUN))
	if l == nil {
		return nil, fmt.Errorf("the target reports no LUN %d: %w", e.LUN, ctlapi.ErrNotFound)
	}
	var alloc nbd.Allocator
	if !o.HeapBuffers {
		alloc = initiator.NBDAllocator(sess)
	}
	desc := fmt.Sprintf("srpd %s LUN %d %s", o.Session, e.LUN, l.Info().IDString())
	return ServeNBDDevice(initiator.NBDDevice(l), desc, alloc, e, o)
}

// ServeNBDDevice serves dev (a LUN's, or a multipath device's) on the unix socket e.Socket as
// ServeNBD does, its request buffers from alloc (nil: the heap).
func ServeNBDDevice(dev nbd.Device, desc string, alloc nbd.Allocator, e config.NBDExport, o NBDOptions) (*Export, error) {
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	ncfg := NBDConfig(e)
	ncfg.Logger, ncfg.ShutdownTimeout = log.Named("nbd").With(zap.Int("lun", e.LUN)), o.ShutdownTimeout
	ncfg.Workers, ncfg.ReadSpin = o.Workers, o.ReadSpin
	ncfg.Allocator = alloc
	srv, err := nbd.NewServer(ncfg)
	if err != nil {
		return nil, err
	}
	names := o.Names
	if names == nil {
		names = []string{"", "lun" + strconv.Itoa(e.LUN)}
	}
	for _, name := range names {
		if err := srv.AddExport(name, dev, nbd.ExportOptions{Description: desc, Observe: o.Observe}); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Dir(e.Socket), 0o750); err != nil {
		return nil, err
	}
	if _, err := srv.ListenUnix(e.Socket); err != nil {
		return nil, err
	}
	if err := SetSocketAccess(e.Socket, cmp.Or(e.Mode, config.DefaultNBDSocketMode), cmp.Or(e.Group, o.Group)); err != nil {
		// Serve on a cancelled context closes the listener (and removes the socket) at once.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = srv.Serve(ctx)
		return nil, fmt.Errorf("NBD export: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	x := &Export{Config: e, Server: srv, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(x.done)
		if err := srv.Serve(ctx); err != nil {
			log.Error("NBD server", zap.Error(err))
		}
	}()
	log.Info("NBD export up", zap.Int("lun", e.LUN), zap.String("socket", e.Socket), zap.Int64("size", dev.Size()))
	return x, nil
}

// Stop shuts the server down: it answers what is in flight (bounded by its ShutdownTimeout),
// closes its connections and the socket. Done is closed when it has.
func (x *Export) Stop() { x.cancel() }

// Done is closed when the server has stopped.
func (x *Export) Done() <-chan struct{} { return x.done }
