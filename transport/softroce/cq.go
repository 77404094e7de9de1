package softroce

import (
	"context"
	"sync/atomic"

	"github.com/srpd/srpd/transport"
)

// cq implements transport.CQ: a fixed ring of WCs (transport.WCQueue). Engine code pushes
// under dev.mu (lock order dev.mu → the queue's lock); Poll takes only the queue's lock.
// Completions pushed by the receive loop are notified when it releases dev.mu
// (Device.rxNotify).
type cq struct {
	dev   *Device
	q     transport.WCQueue
	users int // QPs (dev.mu)
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

func (c *cq) Cap() int                       { return c.q.Cap() }
func (c *cq) Notify() <-chan struct{}        { return c.q.Notify() }
func (c *cq) Poll(wcs []transport.WC) int    { return c.q.Poll(wcs) }
func (c *cq) Wait(ctx context.Context) error { return c.q.Wait(ctx) }

// push queues a WC; false if the CQ is full (overrun) or closed.
func (c *cq) push(wc *transport.WC) bool {
	if c.q.Push(*wc) == 0 {
		return false
	}
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
	c.q.Wake()
	return true
}

func (c *cq) Close() error {
	c.dev.mu.Lock()
	defer c.dev.mu.Unlock()
	if c.users > 0 {
		return transport.ErrBusy
	}
	if !c.q.Close() {
		return transport.ErrClosed
	}
	c.dev.ncq-- // the slot is free again: a device lives through any number of CQs, MaxCQ at once
	return nil
}
