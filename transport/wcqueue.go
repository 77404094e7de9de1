package transport

import (
	"context"
	"sync"
)

// WCQueue is the queue behind an engine's CQ: a fixed ring of work completions under its own
// lock, a closed flag, and the Notify channel, which holds at most one token. It implements
// the Poll, Notify, Wait and Cap of CQ; the engine decides when to give the token (Wake) and
// what closing means for its device. Both engines keep their completions in one.
type WCQueue struct {
	mu     sync.Mutex
	ring   []WC
	head   int
	n      int
	closed bool
	notify chan struct{}
}

// Init makes q an empty queue of entries completions; a CQ keeps its WCQueue by value and
// calls Init once, before any other method.
func (q *WCQueue) Init(entries int) {
	q.ring = make([]WC, entries)
	q.notify = make(chan struct{}, 1)
}

// Cap implements CQ.
func (q *WCQueue) Cap() int { return len(q.ring) }

// Notify implements CQ.
func (q *WCQueue) Notify() <-chan struct{} { return q.notify }

// Poll implements CQ.
func (q *WCQueue) Poll(wcs []WC) int {
	k, _ := q.PollFull(wcs)
	return k
}

// PollFull is Poll that also reports whether the ring was full before it: a producer that
// waits for room is owed a wake-up when k > 0.
func (q *WCQueue) PollFull(wcs []WC) (k int, wasFull bool) {
	q.mu.Lock()
	wasFull = q.n == len(q.ring)
	for k < len(wcs) && q.n > 0 {
		wcs[k] = q.ring[q.head]
		q.head++
		if q.head == len(q.ring) {
			q.head = 0
		}
		q.n--
		k++
	}
	q.mu.Unlock()
	return k, wasFull
}

// Wait implements CQ.
func (q *WCQueue) Wait(ctx context.Context) error {
	for {
		q.mu.Lock()
		n, closed := q.n, q.closed
		q.mu.Unlock()
		if n > 0 {
			return nil
		}
		if closed {
			return ErrClosed
		}
		select {
		case <-q.notify:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Push queues wcs in order, as many as there is room for, and returns how many it queued: the
// rest (wcs[k:]) overran the ring and are dropped, as all are once the queue is closed. It
// gives no token.
func (q *WCQueue) Push(wcs ...WC) (k int) {
	q.mu.Lock()
	if !q.closed {
		for ; k < len(wcs) && q.n < len(q.ring); k++ {
			i := q.head + q.n
			if i >= len(q.ring) {
				i -= len(q.ring)
			}
			q.ring[i] = wcs[k]
			q.n++
		}
	}
	q.mu.Unlock()
	return k
}

// Room is the free space in the ring.
func (q *WCQueue) Room() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.ring) - q.n
}

// Wake gives the notification token (at most one is pending).
func (q *WCQueue) Wake() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// Close marks the queue closed and gives the token, so that a Wait returns ErrClosed once the
// ring is drained; false if it was closed already.
func (q *WCQueue) Close() bool {
	q.mu.Lock()
	was := q.closed
	q.closed = true
	q.mu.Unlock()
	if !was {
		q.Wake()
	}
	return !was
}

// Closed reports whether Close has been called.
func (q *WCQueue) Closed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}
