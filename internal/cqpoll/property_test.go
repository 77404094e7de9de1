package cqpoll

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/srpd/srpd/transport"
)

// TestProtocolProperty runs an owner goroutine (the shape of the channels' loops: Take, else
// Poll, handle, EndBatch, wait on Notify unlocked) against a fake engine that adds completions
// from its own goroutine and runs the handler after each addition, with random batch sizes,
// failed completions, handler errors, completions of another QP, runs the Handler declines
// (Ready, EndRun) and repolls. Whatever the interleaving:
//
//   - every completion of the owner's QP is handled (or, failed, seen by the owner) exactly
//     once and in CQ order, and none of another QP is; every handler error reaches the owner
//     exactly once;
//   - nothing is lost: the owner is always woken for what the engine did not take, and after
//     a run that declined;
//   - the Handler is never called concurrently, a run ends with EndBatch after its last
//     completion and then EndRun before anyone else gets the lock.
func TestProtocolProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, 300).Draw(rt, "completions")
		batch := rapid.IntRange(1, 16).Draw(rt, "batch")
		repolls := rapid.IntRange(0, 2).Draw(rt, "repolls")
		notReadyEvery := rapid.IntRange(0, 5).Draw(rt, "notReadyEvery")
		declineEvery := rapid.IntRange(0, 5).Draw(rt, "declineEvery")
		repollEvery := rapid.IntRange(0, 3).Draw(rt, "repollEvery")
		ownerYield := rapid.Bool().Draw(rt, "ownerYield")

		var wcs []transport.WC
		var want []uint64    // the owner's QP's completions, in order
		var wantErr []uint64 // the IDs whose handling fails
		fail := map[uint64]bool{}
		for i := 0; i < n; i++ {
			id := uint64(i + 1)
			wc := transport.WC{ID: id, QPN: ownQPN}
			switch rapid.IntRange(0, 19).Draw(rt, fmt.Sprintf("kind%d", i)) {
			case 0:
				wc.Status = transport.WCWRFlushErr
			case 1:
				wc.QPN = ownQPN + 1
			case 2:
				fail[id] = true
			}
			if wc.QPN == ownQPN {
				want = append(want, id)
				if fail[id] && wc.Status == transport.WCSuccess {
					wantErr = append(wantErr, id)
				}
			}
			wcs = append(wcs, wc)
		}
		var chunks []int
		for left := n; left > 0; {
			k := rapid.IntRange(1, min(left, 20)).Draw(rt, "chunk")
			chunks = append(chunks, k)
			left -= k
		}

		cq := newFakeCQ()
		h := &recorder{fail: fail}
		calls := 0 // under the Poller's lock (Ready, EndRun, EndBatch)
		every := func(k int) func() bool {
			return func() bool {
				calls++
				return k == 0 || calls%k != 0
			}
		}
		h.ready = every(notReadyEvery)
		h.endRun = every(declineEvery)
		if repollEvery > 0 {
			h.repoll = func() bool { calls++; return calls%repollEvery == 0 }
		}
		p := New(Config{CQ: cq, Handler: h, Batch: batch, Repolls: repolls})

		// What the owner sees; guarded by the Poller's lock like the Handler's state.
		var ownerFailed, ownerErrs []uint64
		seen := func() int { return h.nHandled + len(ownerFailed) }
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		buf := make([]transport.WC, 32) // at least Batch: Take takes everything at once
		go func() {
			defer wg.Done()
			p.Attach()
			defer p.Detach()
			p.Begin(ownQPN)
			defer p.End()
			for {
				h.ownerWork()
				h.needOwner = false
				k, err, left := p.Take(buf)
				if err != nil {
					var ie idError
					if errors.As(err, &ie) {
						ownerErrs = append(ownerErrs, uint64(ie))
					}
				}
				if !left {
					k = p.Poll(buf)
				}
				for i := range buf[:k] {
					wc := &buf[i]
					if wc.QPN != ownQPN {
						continue
					}
					if wc.Status != transport.WCSuccess {
						ownerFailed = append(ownerFailed, wc.ID)
						h.handled = append(h.handled, wc.ID) // the order across both
						continue
					}
					if err := h.HandleCompletion(wc); err != nil {
						ownerErrs = append(ownerErrs, uint64(err.(idError)))
					}
					if ownerYield {
						runtime.Gosched()
					}
				}
				h.EndBatch()
				if k > 0 || left {
					continue
				}
				p.Unlock()
				select {
				case <-p.Notify():
				case <-stop:
					p.Lock()
					return
				}
				p.Lock()
			}
		}()

		off := 0
		for _, k := range chunks {
			cq.add(wcs[off : off+k]...)
			off += k
			if k%3 == 0 {
				runtime.Gosched()
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			p.Lock()
			done := seen() == len(want)
			p.Unlock()
			if done || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Microsecond)
		}
		close(stop)
		wg.Wait()

		if h.violation != nil {
			rt.Fatal(h.violation)
		}
		if !slices.Equal(h.handled, want) {
			rt.Fatalf("handled (and failed) in this order:\n%v\nwant\n%v", h.handled, want)
		}
		if !slices.Equal(ownerErrs, wantErr) {
			rt.Fatalf("errors reached the owner for %v, want %v", ownerErrs, wantErr)
		}
		if n := cq.len(); n != 0 {
			rt.Fatalf("%d completions never polled", n)
		}
		if h.needOwner {
			rt.Fatal("a run declined (EndRun false) but the owner was never woken")
		}
	})
}
