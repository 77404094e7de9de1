//go:build verbs && linux && cgo

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
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

	mu     sync.Mutex
	ring   []transport.WC
	head   int
	n      int
	closed bool
	users  int // QPs (dev.mu)
	notify chan struct{}
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
	n := max(entries, int(ib.cqe))
	c := &cq{dev: d, ib: ib, ch: ch, stop: efd, ring: make([]transport.WC, n),
		notify: make(chan struct{}, 1), space: make(chan struct{}, 1), done: make(chan struct{}), stopCh: make(chan struct{}),
		wcs: (*C.struct_shim_wc)(C.calloc(C.SHIM_POLL_MAX, C.size_t(unsafe.Sizeof(C.struct_shim_wc{}))))}
	d.cqs[c] = struct{}{}
	go c.pollLoop()
	return c, nil
}

func (c *cq) Cap() int                { return len(c.ring) }
func (c *cq) Notify() <-chan struct{} { return c.notify }

// Poll implements transport.CQ; it never enters C.
func (c *cq) Poll(wcs []transport.WC) int {
	c.mu.Lock()
	k := 0
	full := c.n == len(c.ring)
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
	if full && k > 0 {
		select {
		case c.space <- struct{}{}:
		default:
		}
	}
	return k
}

// Wait implements transport.CQ.
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

// room is the free space in the ring.
func (c *cq) room() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ring) - c.n
}

// push queues WCs (the poller has checked the room; engine-made flushes may find the ring full
// and are then dropped, as a device CQ would overrun).
func (c *cq) push(wcs ...transport.WC) {
	if c.add(wcs...) {
		c.signal()
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

// signal gives the notification token.
func (c *cq) signal() {
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// add queues WCs and reports whether any was.
func (c *cq) add(wcs ...transport.WC) bool {
	if len(wcs) == 0 {
		return false
	}
	added := false
	c.mu.Lock()
	for i := range wcs {
		if c.n == len(c.ring) || c.closed {
			c.dev.log.Error("CQ overrun: completion dropped", zap.Uint64("wr_id", wcs[i].ID))
			continue
		}
		j := c.head + c.n
		if j >= len(c.ring) {
			j -= len(c.ring)
		}
		c.ring[j] = wcs[i]
		c.n++
		added = true
	}
	c.mu.Unlock()
	return added
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
				c.signal()
			}
		}
	}
	for {
		room := c.room()
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
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		d.mu.Unlock()
		return transport.ErrClosed
	}
	delete(d.cqs, c)
	d.mu.Unlock()
	return c.destroy()
}

// destroy stops the poller and destroys the device CQ and its channel.
func (c *cq) destroy() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
	close(c.stopCh)
	wake(c.stop)
	<-c.done
	unix.Close(c.stop)
	r := C.shim_destroy_cq(c.ib, c.ch)
	C.free(unsafe.Pointer(c.wcs))
	return posErrno("ibv_destroy_cq", r)
}
