package daemon

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/initiator"
	"github.com/srpd/srpd/initiator/nbd"
	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/stack"
	"github.com/srpd/srpd/srp"
)

// connRT is one of our initiator sessions to a remote target (a "connection" in the API), kept
// up by a goroutine: it logs in, serves the configured LUNs over NBD, and when the session is
// lost (dev_loss_tmo) or the first login fails it tries again after reconnect_delay. Channel
// failures inside a session are the initiator package's business (reconnect, fast_io_fail_tmo).
type connRT struct {
	cfg config.Session
	tr  *stack.Transport
	log *zap.Logger

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // run has returned
	first  chan struct{} // the first login attempt is over (firstErr says how)

	nbdShutdown time.Duration
	nbdGroup    string // the group of NBD sockets whose export names none: the control socket's

	mu          sync.Mutex
	firstErr    error
	sess        *initiator.Session
	lastErr     string
	failed      int       // failed logins since the last success
	nextRetry   time.Time // when the next login attempt starts (zero: none pending)
	attempts    uint64
	connectedAt time.Time
	exports     []*nbdExport
	retired     initiator.Stats // counters of sessions that ended
}

// nbdExport is one remote LUN served on its unix socket (x), or why it is not (err).
type nbdExport struct {
	lun    int
	socket string
	x      *stack.Export
	io     *ioTimes
	err    string
}

// observe records an NBD request's time in the export's histograms (nbd.ExportOptions.Observe).
func (t *ioTimes) observeNBD(op nbd.Op, d time.Duration, _ bool) {
	switch op {
	case nbd.OpRead:
		t.read.observe(d)
	case nbd.OpWrite:
		t.write.observe(d)
	case nbd.OpFlush:
		t.flush.observe(d)
	}
}

// startConn starts keeping session cfg up; its NBD sockets that name no group get nbdGroup.
func (d *Daemon) startConn(cfg config.Session, tr *stack.Transport, nbdGroup string) *connRT {
	c := &connRT{cfg: cfg, tr: tr, log: d.log.With(zap.String("connection", cfg.Name)),
		done: make(chan struct{}), first: make(chan struct{}), nbdShutdown: d.opts.drainTimeout() / 2,
		nbdGroup: nbdGroup}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	go c.run()
	return c
}

// retryDelay is the wait before the next login attempt: reconnect_delay (10 s when off),
// doubled per failure up to 16 times it.
func (c *connRT) retryDelay() time.Duration {
	d := stack.Timeout(c.cfg.ReconnectDelay, initiator.DefaultReconnectDelay)
	if d <= 0 {
		d = initiator.DefaultReconnectDelay
	}
	c.mu.Lock()
	n := c.failed
	c.mu.Unlock()
	for i := 1; i < n && i < 5; i++ {
		d *= 2
	}
	return d
}

func (c *connRT) run() {
	defer close(c.done)
	firstDone := false
	for {
		sess, err := c.dial()
		c.mu.Lock()
		c.attempts++
		if err != nil {
			c.failed++
			c.lastErr = err.Error()
		} else {
			c.failed, c.lastErr, c.sess, c.connectedAt = 0, "", sess, time.Now()
		}
		c.mu.Unlock()
		if err == nil {
			c.startExports(sess)
		}
		var delay time.Duration
		if err != nil && c.ctx.Err() == nil {
			// Known before the first attempt is reported, so that whoever waited for it
			// (Start, Connect) sees when the next one is.
			delay = c.retryDelay()
			c.mu.Lock()
			c.nextRetry = time.Now().Add(delay)
			c.mu.Unlock()
		}
		if !firstDone {
			c.mu.Lock()
			c.firstErr = err
			c.mu.Unlock()
			close(c.first)
			firstDone = true
		}
		if err != nil {
			if c.ctx.Err() != nil {
				return
			}
			c.log.Warn("login failed; retrying", zap.Error(err), zap.Duration("retry_in", delay))
			select {
			case <-c.ctx.Done():
				return
			case <-time.After(delay):
			}
			c.mu.Lock()
			c.nextRetry = time.Time{}
			c.mu.Unlock()
			continue
		}
		select {
		case <-sess.Done():
			c.log.Error("session lost; logging in again", zap.Error(sess.Err()))
			c.stopExports(context.Background())
			c.endSession(sess)
		case <-c.ctx.Done():
			// Drain: NBD clients get the answers to what they sent, then the session logs out.
			ctx, cancel := context.WithTimeout(context.Background(), 2*c.nbdShutdown)
			c.stopExports(ctx)
			if err := sess.Close(ctx); err != nil {
				c.log.Warn("logout did not finish in time", zap.Error(err))
			}
			cancel()
			c.endSession(sess)
			return
		}
	}
}

func (c *connRT) endSession(s *initiator.Session) {
	st := s.Stats()
	c.mu.Lock()
	if c.sess == s {
		c.sess = nil
		c.connectedAt = time.Time{}
	}
	addStats(&c.retired, st)
	c.mu.Unlock()
}

// dial logs in once (stack.Dial), bounded by the session's connect_timeout.
func (c *connRT) dial() (*initiator.Session, error) {
	return stack.Dial(c.ctx, c.cfg, c.tr, stack.SessionOptions{Logger: c.log})
}

// startExports serves the configured LUNs of sess over NBD, one server per socket. The socket
// offers the LUN as the default export ("") and as "lun<N>".
func (c *connRT) startExports(sess *initiator.Session) {
	var exps []*nbdExport
	for _, e := range c.cfg.NBD {
		x := &nbdExport{lun: e.LUN, socket: e.Socket, io: &ioTimes{}}
		exps = append(exps, x)
		var err error
		x.x, err = stack.ServeNBD(sess, e, stack.NBDOptions{Logger: c.log, Session: c.cfg.Name, ShutdownTimeout: c.nbdShutdown, Group: c.nbdGroup,
			Observe: x.io.observeNBD})
		if err != nil {
			x.err = err.Error()
			c.log.Error("NBD export failed", zap.Int("lun", e.LUN), zap.String("socket", e.Socket), zap.Error(err))
		}
	}
	c.mu.Lock()
	c.exports = exps
	c.mu.Unlock()
}

// stopExports shuts the NBD servers down (each answers what is in flight, bounded by its
// ShutdownTimeout) and waits for them, or for ctx.
func (c *connRT) stopExports(ctx context.Context) {
	c.mu.Lock()
	exps := c.exports
	c.exports = nil
	c.mu.Unlock()
	for _, x := range exps {
		if x.x != nil {
			x.x.Stop()
		}
	}
	for _, x := range exps {
		if x.x == nil {
			continue
		}
		select {
		case <-x.x.Done():
		case <-ctx.Done():
			c.log.Warn("NBD server did not stop in time", zap.String("socket", x.socket))
		}
	}
}

// failing returns why the connection is not logged in and when it tries again, when its
// last login failed (ok false while logged in, or before the first attempt ends).
func (c *connRT) failing() (why string, next time.Time, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess != nil || c.failed == 0 {
		return "", time.Time{}, false
	}
	return c.lastErr, c.nextRetry, true
}

// waitFirst waits for the first login attempt and returns its error.
func (c *connRT) waitFirst(ctx context.Context) error {
	select {
	case <-c.first:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.firstErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stop ends the connection: NBD exports drained, logout, bounded by ctx.
func (c *connRT) stop(ctx context.Context) {
	c.cancel()
	select {
	case <-c.done:
		c.log.Info("disconnected")
	case <-ctx.Done():
		c.log.Warn("disconnect did not finish in time")
	}
}

func stateOf(s initiator.State) string {
	switch s {
	case initiator.StateRunning:
		return ctlapi.StateRunning
	case initiator.StateBlocked:
		return ctlapi.StateBlocked
	case initiator.StateFailFast:
		return ctlapi.StateFailFast
	case initiator.StateLost:
		return ctlapi.StateLost
	}
	return ctlapi.StateDisconnected
}

// addStats adds the counters the daemon reports of s to dst.
func addStats(dst *initiator.Stats, s initiator.Stats) {
	dst.Commands += s.Commands
	dst.Retries += s.Retries
	dst.Timeouts += s.Timeouts
	dst.Aborts += s.Aborts
	dst.TaskMgmt += s.TaskMgmt
	dst.Reconnects += s.Reconnects
	dst.CreditWaits += s.CreditWaits
	dst.BytesRead += s.BytesRead
	dst.BytesWritten += s.BytesWritten
}

// stats sums the counters of the current and past sessions.
func (c *connRT) stats() (initiator.Stats, *initiator.Session) {
	c.mu.Lock()
	st, sess := c.retired, c.sess
	c.mu.Unlock()
	if sess != nil {
		s := sess.Stats()
		addStats(&st, s)
		st.LiveChannels = s.LiveChannels
	}
	return st, sess
}

func (c *connRT) info() ctlapi.ConnectionInfo {
	st, sess := c.stats()
	c.mu.Lock()
	defer c.mu.Unlock()
	info := ctlapi.ConnectionInfo{
		Name: c.cfg.Name, Address: net.JoinHostPort(c.cfg.Address, strconv.Itoa(c.cfg.Port)), TargetPortID: c.cfg.TargetPortID,
		State: ctlapi.StateConnecting, Error: c.lastErr, QueueDepth: c.cfg.QueueDepth, FailedReconnects: c.failed, NextRetryAt: c.nextRetry,
		ConnectedAt: c.connectedAt, Config: c.cfg, LUNs: []ctlapi.RemoteLUN{},
		Stats: ctlapi.IOStats{Commands: st.Commands, ReadBytes: st.BytesRead, WriteBytes: st.BytesWritten, Errors: st.Timeouts, TaskMgmt: st.TaskMgmt, CreditStalls: st.CreditWaits},
	}
	if sess == nil {
		var guid uint64
		if g := c.tr.Device.GIDs(); len(g) > 0 {
			guid = uint64(g[0][8])<<56 | uint64(g[0][9])<<48 | uint64(g[0][10])<<40 | uint64(g[0][11])<<32 |
				uint64(g[0][12])<<24 | uint64(g[0][13])<<16 | uint64(g[0][14])<<8 | uint64(g[0][15])
		}
		info.InitiatorPortID = config.PortID(srp.MakePortID(uint64(c.cfg.InitiatorExt), guid))
		return info
	}
	info.InitiatorPortID = config.PortID(sess.InitiatorPortID())
	info.State = stateOf(sess.State())
	info.Channels = st.LiveChannels
	sockets := map[int]string{}
	for _, x := range c.exports {
		if x.err == "" {
			sockets[x.lun] = x.socket
		}
	}
	for _, l := range sess.LUNs() {
		li := l.Info()
		info.LUNs = append(info.LUNs, ctlapi.RemoteLUN{LUN: int(li.Number), Capacity: l.Size(), BlockSize: li.BlockSize,
			ReadOnly: li.ReadOnly, Vendor: li.Vendor, Product: li.Product, NBDSocket: sockets[int(li.Number)]})
	}
	for _, x := range c.exports {
		if x.err != "" {
			info.Error = fmt.Sprintf("NBD export of LUN %d on %s: %s", x.lun, x.socket, x.err)
		}
	}
	return info
}
