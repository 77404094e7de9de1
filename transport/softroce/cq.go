package softroce

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/srpd/srpd/transport"
)

// cq implements transport.CQ: a fixed ring of WCs. Engine code pushes under dev.mu then cq.mu
// (lock order dev.mu → cq.mu); Poll takes only cq.mu. Completions pushed by the receive loop
// are notified when it releases dev.mu (Device.rxNotify).
type cq struct {
	dev    *Device
	mu     sync.Mutex
	ring   []transport.WC
	head   int
	n      int
	notify chan struct{}
	closed bool
	users  int // QPs (dev.mu)
	// deferred: a notification is owed at the end of the receive batch (dev.mu).
	deferred bool
	// owedH: the CQ is on dev.hOwed, its handler owed a run before rxHandle ends (dev.mu).
	owedH bool
	// handler is the consumer's completion handler (transport.CompletionHandler), run by the
	// receive loop instead of the notification token (atomic: set from any goroutine).
	handler atomic.Pointer[func() bool]
}

// SetCompletionHandler implements transport.CompletionHandler. Completions added by a receive
// path (the ones that end an idle consumer's wait at low queue depth), and those that posts
// add while it runs handlers (a LOCAL_INV a handler posts completes at once), run it; those of
// the transmit loop, timers and other posts give the token.
func (c *cq) SetCompletionHandler(fn func() bool) {
	if fn == nil {
		c.handler.Store(nil)
		return
	}
	c.handler.Store(&fn)
}

func (c *cq) Cap() int                { return len(c.ring) }
func (c *cq) Notify() <-chan struct{} { return c.notify }

func (c *cq) Poll(wcs []transport.WC) int {
	c.mu.Lock()
	k := 0
	for k < len(wcs) && c.n > 0 {
		wcs[k] = c.ring[c.head]
		c.head++
		if c.head == len(c.ring) {
			c.head = 0
		}
		c.n--
		k++
	}
	c.mu.Unlock()
	return k
}

// push queues a WC; false if the CQ is full (overrun) or closed.
func (c *cq) push(wc *transport.WC) bool {
	c.mu.Lock()
	if c.n == len(c.ring) || c.closed {
		c.mu.Unlock()
		return false
	}
	i := c.head + c.n
	if i >= len(c.ring) {
		i -= len(c.ring)
	}
	c.ring[i] = *wc
	c.n++
	c.mu.Unlock()
	if d := c.dev; d.rxHolds {
		// The receive loop notifies once it has released dev.mu (Device.rxNotify): a waiter
		// woken now would only block on dev.mu.
		if !c.deferred {
			c.deferred = true
			d.notifyCQs = append(d.notifyCQs, c)
		}
		return true
	}
	if d := c.dev; d.rxSending && c.handler.Load() != nil {
		// A receive path is running handlers (maybe this post's caller): the handler runs
		// once more before it finishes (rxHandle) rather than waking the consumer now.
		if !c.owedH {
			c.owedH = true
			d.hOwed = append(d.hOwed, c)
		}
		return true
	}
	c.wake()
	return true
}

// wake gives the notification token (at most one is pending).
func (c *cq) wake() {
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *cq) Wait(ctx context.Context) error {
	for {
		c.mu.Lock()
		n, closed := c.n, c.closed
		c.mu.Unlock()
		if n > 0 {
			return nil
		}
		if closed {
			return transport.ErrClosed
		}
		select {
		case <-c.notify:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *cq) Close() error {
	c.dev.mu.Lock()
	defer c.dev.mu.Unlock()
	if c.users > 0 {
		return transport.ErrBusy
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return transport.ErrClosed
	}
	c.closed = true
	c.dev.ncq-- // the slot is free again: a device lives through any number of CQs, MaxCQ at once
	select {
	case c.notify <- struct{}{}:
	default:
	}
	return nil
}
