package transport

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestWCQueueRing(t *testing.T) {
	var q WCQueue
	q.Init(3)
	if q.Cap() != 3 || q.Room() != 3 {
		t.Fatalf("cap %d room %d", q.Cap(), q.Room())
	}
	// Fill, overrun, drain part, wrap around.
	if k := q.Push(WC{ID: 1}, WC{ID: 2}); k != 2 {
		t.Fatalf("push 2: %d", k)
	}
	if k := q.Push(WC{ID: 3}, WC{ID: 4}, WC{ID: 5}); k != 1 {
		t.Fatalf("push into 1 free slot: %d queued, want 1", k)
	}
	var out [2]WC
	if k, full := q.PollFull(out[:]); k != 2 || !full || out[0].ID != 1 || out[1].ID != 2 {
		t.Fatalf("poll: %d full %v %+v", k, full, out)
	}
	if k := q.Push(WC{ID: 6}, WC{ID: 7}); k != 2 {
		t.Fatalf("push after poll: %d", k)
	}
	var all [4]WC
	if k, full := q.PollFull(all[:]); k != 3 || !full || all[0].ID != 3 || all[1].ID != 6 || all[2].ID != 7 {
		t.Fatalf("poll across the wrap: %d full %v %+v", k, full, all[:k])
	}
	if k := q.Poll(all[:]); k != 0 {
		t.Fatalf("poll empty: %d", k)
	}
	if k, full := q.PollFull(all[:]); k != 0 || full {
		t.Fatalf("poll empty: %d full %v", k, full)
	}
}

func TestWCQueueWaitAndClose(t *testing.T) {
	var q WCQueue
	q.Init(2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := q.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait on empty: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- q.Wait(context.Background()) }()
	q.Push(WC{ID: 9})
	q.Wake()
	if err := <-done; err != nil {
		t.Fatalf("wait after push: %v", err)
	}
	select { // the token of the Wake above, if Wait did not take it
	case <-q.Notify():
	default:
	}
	if !q.Close() || q.Close() || !q.Closed() {
		t.Fatal("Close: true the first time only")
	}
	if k := q.Push(WC{ID: 10}); k != 0 {
		t.Fatalf("push after close queued %d", k)
	}
	if err := q.Wait(context.Background()); err != nil {
		t.Fatalf("wait with a completion left after close: %v", err) // drained first
	}
	var out [2]WC
	if k := q.Poll(out[:]); k != 1 || out[0].ID != 9 {
		t.Fatalf("poll after close: %d %+v", k, out[0])
	}
	if err := q.Wait(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("wait on closed and drained: %v", err)
	}
	select {
	case <-q.Notify():
	default:
		t.Fatal("Close gave no token")
	}
}
