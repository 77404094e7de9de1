package cqpoll

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/srpd/srpd/transport"
)

// fakeCQ is a CQ with a fake engine: add queues completions and then does what an engine does
// after adding them (softroce's receive loop, the verbs poller): it runs the completion
// handler, never concurrently with itself, and gives the Notify token when the handler does
// not take them.
type fakeCQ struct {
	mu     sync.Mutex
	q      []transport.WC
	head   int
	notify chan struct{}

	handler atomic.Pointer[func() bool]
	engine  sync.Mutex // held while the engine runs the handler
	tokens  atomic.Int64
	runs    atomic.Int64 // handler calls
}

func newFakeCQ() *fakeCQ {
	return &fakeCQ{q: make([]transport.WC, 0, 1024), notify: make(chan struct{}, 1)}
}

// push queues completions without running the engine (what other engine contexts do, or a
// post that completes at once while the handler runs).
func (c *fakeCQ) push(wcs ...transport.WC) {
	c.mu.Lock()
	c.q = append(c.q, wcs...)
	c.mu.Unlock()
}

// add queues completions and runs the engine's handling of them.
func (c *fakeCQ) add(wcs ...transport.WC) {
	c.push(wcs...)
	c.kick()
}

// kick runs the handler as the engine does after adding completions.
func (c *fakeCQ) kick() {
	c.engine.Lock()
	ran := false
	if fn := c.handler.Load(); fn != nil {
		c.runs.Add(1)
		ran = (*fn)()
	}
	c.engine.Unlock()
	if !ran {
		c.wake()
	}
}

func (c *fakeCQ) wake() {
	c.tokens.Add(1)
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *fakeCQ) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.q) - c.head
}

func (c *fakeCQ) SetCompletionHandler(fn func() bool) {
	if fn == nil {
		c.handler.Store(nil)
		return
	}
	c.handler.Store(&fn)
}

func (c *fakeCQ) Poll(wcs []transport.WC) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := copy(wcs, c.q[c.head:])
	c.head += n
	if c.head == len(c.q) {
		c.q, c.head = c.q[:0], 0
	}
	return n
}

func (c *fakeCQ) Notify() <-chan struct{} { return c.notify }

func (c *fakeCQ) Wait(ctx context.Context) error {
	for c.len() == 0 {
		select {
		case <-c.notify:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (c *fakeCQ) Cap() int     { return cap(c.q) }
func (c *fakeCQ) Close() error { return nil }

// plainCQ is a CQ whose engine cannot run handlers (no transport.CompletionHandler).
type plainCQ struct{ transport.CQ }

// fakeDevice is a device that can progress on the caller's goroutine (transport.Progresser).
type fakeDevice struct {
	transport.Device
	holds, progresses int
}

func (d *fakeDevice) Hold()     { d.holds++ }
func (d *fakeDevice) Progress() { d.progresses++ }

// idError is the error the recorder's HandleCompletion gives for a completion it is told to
// fail.
type idError uint64

func (e idError) Error() string { return "completion refused" }

// recorder is a Handler that records what it is asked to do and checks the protocol as it
// goes: never two calls at once, and every run on the engine's goroutine that passed Ready ends
// with EndBatch then EndRun before anyone else gets the lock.
type recorder struct {
	inside  atomic.Int32
	ready   func() bool     // nil: always
	repoll  func() bool     // EndBatch's answer (nil: false)
	endRun  func() bool     // EndRun(true)'s answer (nil: true)
	fail    map[uint64]bool // HandleCompletion refuses these IDs (idError)
	onBatch func()          // runs in EndBatch (a post that completes at once)
	count   bool            // count handled completions only (no allocation)

	handled   []uint64 // IDs HandleCompletion was called with, in order
	nHandled  int
	batches   int
	ends      []bool // EndRun's took arguments
	sinceEnd  int    // completions handled since the last EndBatch
	lastBatch bool   // the last call was EndBatch
	inRun     bool   // an engine run passed Ready and has not ended
	needOwner bool   // EndRun declined: the owner has work (the property test clears it)
	violation error
}

func (r *recorder) enter() {
	if !r.inside.CompareAndSwap(0, 1) {
		r.violate(errors.New("two handler calls at once"))
	}
}

func (r *recorder) leave() { r.inside.Store(0) }

func (r *recorder) violate(err error) {
	if r.violation == nil {
		r.violation = err
	}
}

func (r *recorder) Ready() bool {
	r.enter()
	defer r.leave()
	if r.inRun {
		r.violate(errors.New("a run began inside another"))
	}
	ok := r.ready == nil || r.ready()
	r.inRun = ok
	return ok
}

func (r *recorder) HandleCompletion(wc *transport.WC) error {
	r.enter()
	defer r.leave()
	if wc.Status != transport.WCSuccess {
		r.violate(errors.New("a failed completion handed to HandleCompletion"))
	}
	r.nHandled++
	if !r.count {
		r.handled = append(r.handled, wc.ID)
	}
	r.sinceEnd++
	r.lastBatch = false
	if r.fail[wc.ID] {
		return idError(wc.ID)
	}
	return nil
}

func (r *recorder) EndBatch() bool {
	r.enter()
	defer r.leave()
	r.batches++
	r.sinceEnd = 0
	r.lastBatch = true
	if r.onBatch != nil {
		r.onBatch()
	}
	return r.repoll != nil && r.repoll()
}

func (r *recorder) EndRun(took bool) bool {
	r.enter()
	defer r.leave()
	if !r.inRun {
		r.violate(errors.New("EndRun outside a run"))
	}
	if !r.lastBatch || r.sinceEnd != 0 {
		r.violate(errors.New("a run ended without EndBatch after its last completion"))
	}
	r.inRun = false
	if !r.count {
		r.ends = append(r.ends, took)
	}
	res := !took || r.endRun == nil || r.endRun()
	if took && !res {
		r.needOwner = true
	}
	return res
}

// ownerWork is called by a test's owner while it holds the lock: a run must not be half done.
func (r *recorder) ownerWork() {
	r.enter()
	defer r.leave()
	if r.inRun {
		r.violate(errors.New("the owner got the lock inside a run"))
	}
}
