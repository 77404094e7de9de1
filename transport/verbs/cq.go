//go:build verbs && linux && cgo

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/srpd/srpd/transport"
)

// cq implements transport.CQ: the device CQ drained by one poller goroutine into a ring.
type cq struct {
	dev  *Device
	ib   *C.struct_ibv_cq
	ch   *C.struct_ibv_comp_channel
	stop int // eventfd

	q      transport.WCQueue
	users  int           // QPs (dev.mu)
	space  chan struct{} // Poll made room while the poller waited for it
	done   chan struct{} // poller exited
	stopCh chan struct{} // closed by destroy

	wcs *C.struct_shim_wc // poller scratch (C memory, SHIM_POLL_MAX entries)

	// handler is the consumer's completion handler (transport.CompletionHandler), run by the
	// poller after a batch it drained into this CQ instead of the notification; owed marks
	// such a batch (poller goroutine only).
	handler atomic.Pointer[func() bool]
	owed    bool
}

// SetCompletionHandler implements transport.CompletionHandler: the poller goroutine runs fn
// after each batch of device completions it queued on this CQ. Completions the engine makes
// itself (flushes) still give the Notify token.
func (c *cq) SetCompletionHandler(fn func() bool) {
	if fn == nil {
		c.handler.Store(nil)
		return
	}
	c.handler.Store(&fn)
}

// CreateCQ implements transport.Device.
func (d *Device) CreateCQ(entries int) (transport.CQ, error) {
	if entries <= 0 || (d.attr.MaxCQE > 0 && entries > d.attr.MaxCQE) {
		return nil, fmt.Errorf("verbs: CQ of %d entries (max %d): %w", entries, d.attr.MaxCQE, transport.ErrInvalidArgument)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, transport.ErrClosed
	}
	var ch *C.struct_ibv_comp_channel
	ib, err := C.shim_create_cq(d.ctx, C.int(entries), &ch)
	if ib == nil {
		return nil, fmt.Errorf("%w: %v", transport.ErrNoResources, errnoErr("ibv_create_cq", err))
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		C.shim_destroy_cq(ib, ch)
		return nil, fmt.Errorf("verbs: eventfd: %w", err)
	}
	c := &cq{dev: d, ib: ib, ch: ch, stop: efd,
		space: make(chan struct{}, 1), done: make(chan struct{}), stopCh: make(chan struct{}),
		wcs: (*C.struct_shim_wc)(C.calloc(C.SHIM_POLL_MAX, C.size_t(unsafe.Sizeof(C.struct_shim_wc{}))))}
	c.q.Init(max(entries, int(ib.cqe)))
	d.cqs[c] = struct{}{}
	go c.pollLoop()
	return c, nil
}

func (c *cq) Cap() int                       { return c.q.Cap() }
func (c *cq) Notify() <-chan struct{}        { return c.q.Notify() }
func (c *cq) Wait(ctx context.Context) error { return c.q.Wait(ctx) }

// Poll implements transport.CQ; it never enters C.
func (c *cq) Poll(wcs []transport.WC) int {
	k, full := c.q.PollFull(wcs)
	if full && k > 0 {
		select {
		case c.space <- struct{}{}:
		default:
		}
	}
	return k
}

// push queues WCs (the poller has checked the room; engine-made flushes may find the ring full
// and are then dropped, as a device CQ would overrun).
func (c *cq) push(wcs ...transport.WC) {
	if c.add(wcs...) {
		c.q.Wake()
	}
}

// pushFrom is push by the poller of CQ poller: a completion for the poller's own CQ waits for
// the end of its batch (the handler, or one notification).
func (c *cq) pushFrom(poller *cq, wc transport.WC) {
	if c != poller || c.handler.Load() == nil {
		c.push(wc)
		return
	}
	if c.add(wc) {
		c.owed = true
	}
}

// add queues WCs and reports whether any was.
func (c *cq) add(wcs ...transport.WC) bool {
	k := c.q.Push(wcs...)
	for _, wc := range wcs[k:] {
		c.dev.log.Error("CQ overrun: completion dropped", zap.Uint64("wr_id", wc.ID))
	}
	return k > 0
}

// pollLoop drains the device CQ into the ring: poll in batches while there are completions;
// when the CQ is empty, re-arm its notification, poll once more (a completion that arrived
// before the re-arm) and then sleep on the completion channel and the stop eventfd.
func (c *cq) pollLoop() {
	defer close(c.done)
	batch := unsafe.Slice(c.wcs, C.SHIM_POLL_MAX)
	drain := func(n C.int) {
		for i := 0; i < int(n); i++ {
			c.dev.translate(&batch[i], c)
		}
		if c.owed {
			c.owed = false
			if h := c.handler.Load(); h == nil || !(*h)() {
				c.q.Wake()
			}
		}
	}
	for {
		room := c.q.Room()
		if room == 0 {
			select {
			case <-c.space:
				continue
			case <-c.stopCh:
				return
			}
		}
		m := C.int(min(room, C.SHIM_POLL_MAX))
		if n := C.shim_poll(c.ib, c.wcs, m, C.uint(c.dev.invMask)); n > 0 {
			drain(n)
			continue
		} else if n < 0 {
			c.dev.log.Error("ibv_poll_cq failed", zap.Error(syscall.Errno(-n)))
		}
		if n := C.shim_arm_poll(c.ib, c.wcs, m, C.uint(c.dev.invMask)); n > 0 {
			drain(n)
			continue
		} else if n < 0 {
			c.dev.log.Error("ibv_req_notify_cq failed", zap.Error(syscall.Errno(-n)))
		}
		r := C.shim_cq_wait(c.ch, C.int(c.stop))
		if r == 0 {
			return
		}
		if r < 0 {
			c.dev.log.Error("completion channel failed", zap.Error(syscall.Errno(-r)))
			return
		}
	}
}

// Close implements transport.CQ.
func (c *cq) Close() error {
	d := c.dev
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return transport.ErrClosed
	}
	if c.users > 0 {
		d.mu.Unlock()
		return fmt.Errorf("verbs: close CQ: %d QPs use it: %w", c.users, transport.ErrBusy)
	}
	if c.q.Closed() {
		d.mu.Unlock()
		return transport.ErrClosed
	}
	delete(d.cqs, c)
	d.mu.Unlock()
	return c.destroy()
}

// destroy stops the poller and destroys the device CQ and its channel.
func (c *cq) destroy() error {
	if !c.q.Close() {
		return nil
	}
	close(c.stopCh)
	wake(c.stop)
	<-c.done
	unix.Close(c.stop)
	r := C.shim_destroy_cq(c.ib, c.ch)
	C.free(unsafe.Pointer(c.wcs))
	return posErrno("ibv_destroy_cq", r)
}
