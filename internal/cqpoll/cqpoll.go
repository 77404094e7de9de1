// Package cqpoll owns the completion queue of one ULP channel (an SRP target or initiator
// channel): who polls it, when, and where each completion goes. It is the one place above the
// transport that uses the engine contracts transport.CompletionHandler and
// transport.Progresser.
//
// It follows torvalds/linux:drivers/infiniband/core/cq.c, where ib_alloc_cq takes a poll
// context (IB_POLL_DIRECT, IB_POLL_SOFTIRQ, IB_POLL_WORKQUEUE) and the ULP only supplies
// wr_cqe->done, and SPDK's lib/nvmf/rdma.c, whose poller dispatches on the type of the work
// request (enum spdk_nvmf_rdma_wr_type) a completion belongs to. Here the two poll contexts are
// the channel's own goroutine (the owner) and the engine's goroutine that has just added the
// completions (softroce's receive loop, the verbs poller): a Poller runs the channel's Handler
// on the latter while the owner is idle, and leaves everything else to the owner. Router
// dispatches a completion by the kind its work request ID carries (WRID).
//
// # The protocol
//
// The Poller's lock is held by the owner whenever it is not waiting: between Begin and End,
// released (Unlock) only around the owner's wait for the CQ's Notify token or other events.
// When the engine has added completions it calls the Poller's handler function, which:
//
//   - declines (the engine then gives the Notify token) when the lock is taken (the owner is
//     busy and polls again before it waits), when no owner has begun, when an earlier run left
//     completions or an error to the owner, or when Handler.Ready says no;
//   - otherwise polls the CQ and hands each successful completion of the owner's QP to
//     Handler.HandleCompletion, calling Handler.EndBatch after each poll that emptied the CQ
//     (and polling again, up to Config.Repolls times, when EndBatch asks: work it posted may
//     complete in the post itself), then Handler.EndRun;
//   - stops at the first failed completion, or the first HandleCompletion error: the failed
//     completion and those after it (or the error and the completions after the one that gave
//     it) are left, in order, to the owner (Take), EndBatch and EndRun still run, and the
//     handler declines so that the token wakes the owner.
//
// So every completion is handled exactly once, in CQ order, by one goroutine at a time, and a
// completion added while the owner is busy is found by the owner's next poll or token.
package cqpoll

import (
	"sync"
	"sync/atomic"

	"github.com/srpd/srpd/transport"
)

// DefaultBatch is the number of completions a run on the engine's goroutine polls at once.
const DefaultBatch = 64

// Handler is a channel's completion work, run by the Poller on the engine's goroutine (and by
// the owner itself, on its own, as it likes). The Poller never calls it concurrently with
// itself nor with the owner's work: both hold the Poller's lock.
type Handler interface {
	// Ready reports whether the engine's goroutine may handle completions now (the channel is
	// up). False leaves them to the owner.
	Ready() bool
	// HandleCompletion handles one successful completion. An error stops the run: the error
	// and the completions after wc go to the owner (Take).
	HandleCompletion(wc *transport.WC) error
	// EndBatch ends a batch: it runs after each poll that emptied the CQ, and when a run stops
	// early. repoll asks the Poller to poll again at once (bounded by Config.Repolls): work it
	// posted may complete in the post.
	EndBatch() (repoll bool)
	// EndRun ends a run on the engine's goroutine. took is false when the run stopped early
	// (a failed completion, an error): the Poller then declines whatever EndRun returns. With
	// took true, EndRun's result is the run's: false hands the owner the token (it has work
	// that needs its own goroutine).
	EndRun(took bool) bool
}

// Config configures a Poller.
type Config struct {
	CQ      transport.CQ // the channel's CQ (send and receive)
	Handler Handler
	// Device is the CQ's device: with a transport.Progresser, Hold and Progress use it.
	// Optional.
	Device transport.Device
	// Batch is the poll size of a run on the engine's goroutine (default DefaultBatch); Take
	// needs a buffer at least that long to take everything at once.
	Batch int
	// Repolls bounds the extra polls of one run that EndBatch may ask for.
	Repolls int
	// NoEngine keeps completions on the owner's goroutine even when the CQ could run the
	// handler on the engine's (Attach does nothing).
	NoEngine bool
	// Runs, when set, counts the runs on the engine's goroutine that took completions.
	Runs *atomic.Uint64
}

// Poller owns the completion dispatch of one channel's CQ. See the package documentation for
// the protocol between the owner and the engine.
type Poller struct {
	// Set by New.
	cq      transport.CQ
	h       Handler
	prog    transport.Progresser        // nil: the device cannot progress on our goroutine
	engine  transport.CompletionHandler // nil: not supported, or Config.NoEngine
	run     func() bool                 // p.onEngine, bound once
	repolls int
	runs    *atomic.Uint64

	// mu is held by the owner while it is not waiting, and by onEngine while it handles
	// completions in the owner's place. It guards the fields below and whatever the Handler's
	// methods touch.
	mu    sync.Mutex
	owned bool           // between Begin and End
	qpn   uint32         // the QP whose completions count (0: any)
	wcs   []transport.WC // onEngine's poll buffer
	pend  []transport.WC // completions onEngine left to the owner, in order
	err   error          // the error onEngine's last handled completion gave, for the owner
}

// New returns a Poller for cfg.CQ. Nothing runs on the engine's goroutine until Attach.
func New(cfg Config) *Poller {
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	p := &Poller{cq: cfg.CQ, h: cfg.Handler, repolls: cfg.Repolls, runs: cfg.Runs}
	p.prog, _ = cfg.Device.(transport.Progresser)
	if e, ok := cfg.CQ.(transport.CompletionHandler); ok && !cfg.NoEngine {
		p.engine = e
		p.run = p.onEngine
		p.wcs = make([]transport.WC, cfg.Batch)
		p.pend = make([]transport.WC, 0, cfg.Batch)
	}
	return p
}

// Attach lets the engine run the Handler on its goroutine (when the CQ supports it and
// Config.NoEngine is off); Detach stops it. The owner attaches once for its lifetime.
func (p *Poller) Attach() {
	if p.engine != nil {
		p.engine.SetCompletionHandler(p.run)
	}
}

// Detach undoes Attach. A run already started may still be finishing.
func (p *Poller) Detach() {
	if p.engine != nil {
		p.engine.SetCompletionHandler(nil)
	}
}

// Begin makes the caller the owner, holding the lock, and forgets what an earlier owner left:
// from now on the engine's goroutine handles the completions of QP qpn (0: of any QP) while the
// owner waits (Unlock … Lock).
func (p *Poller) Begin(qpn uint32) {
	p.mu.Lock()
	p.owned, p.qpn, p.err = true, qpn, nil
	p.pend = p.pend[:0]
}

// End ends the ownership Begin started and releases the lock.
func (p *Poller) End() {
	p.owned = false
	p.mu.Unlock()
}

// Unlock releases the lock: the owner is about to wait (for Notify, or events of its own),
// and the engine's goroutine may handle completions meanwhile.
func (p *Poller) Unlock() { p.mu.Unlock() }

// Lock takes the lock back after a wait; outside Begin…End it serializes the owner's work
// with a run that may still be finishing.
func (p *Poller) Lock() { p.mu.Lock() }

// Take gives the owner (lock held) what a run on the engine's goroutine left: the error of the
// last completion it handled, if any, then the completions it did not handle, copied into wcs
// in CQ order. left reports whether there was anything; what does not fit in wcs stays for the
// next Take.
func (p *Poller) Take(wcs []transport.WC) (n int, err error, left bool) {
	if p.err == nil && len(p.pend) == 0 {
		return 0, nil, false
	}
	err, p.err = p.err, nil
	n = copy(wcs, p.pend)
	k := copy(p.pend, p.pend[n:])
	p.pend = p.pend[:k]
	return n, err, true
}

// Poll polls the CQ into wcs for the owner (lock held, or after End).
func (p *Poller) Poll(wcs []transport.WC) int { return p.cq.Poll(wcs) }

// Notify is the CQ's notification channel: the owner waits on it (unlocked) when a poll came
// back empty and nothing was left to Take.
func (p *Poller) Notify() <-chan struct{} { return p.cq.Notify() }

// Hold starts deferring the device's own deliveries (transport.Progresser) until Progress, if
// the device can run them on the caller's goroutine; it reports whether it did. A caller that
// posts while holding nothing the Handler takes brackets the post with Hold and Progress, so
// that with the peer on the same device the whole exchange, up to the Handler's run that
// completes it, happens on the posting goroutine.
func (p *Poller) Hold() bool {
	if p.prog == nil {
		return false
	}
	p.prog.Hold()
	return true
}

// Progress ends a Hold that returned true, doing the deferred deliveries here.
func (p *Poller) Progress() { p.prog.Progress() }

// onEngine is the CQ's completion handler (transport.CompletionHandler), run by the engine's
// goroutine after it added completions. It reports whether it took them; false makes the
// engine give the Notify token to the owner.
func (p *Poller) onEngine() bool {
	if !p.mu.TryLock() {
		return false // the owner is busy: it polls again before it waits
	}
	defer p.mu.Unlock()
	if !p.owned || p.err != nil || len(p.pend) > 0 || !p.h.Ready() {
		return false
	}
	extra := 0
	for {
		n := p.cq.Poll(p.wcs)
		for i := 0; i < n; i++ {
			wc := &p.wcs[i]
			if p.qpn != 0 && wc.QPN != p.qpn {
				continue // a completion of an earlier connection's QP
			}
			if wc.Status != transport.WCSuccess {
				// A flush or an error: the owner takes it, with what follows.
				p.pend = append(p.pend, p.wcs[i:n]...)
				return p.stop()
			}
			if err := p.h.HandleCompletion(wc); err != nil {
				p.err = err
				p.pend = append(p.pend, p.wcs[i+1:n]...)
				return p.stop()
			}
		}
		if n == len(p.wcs) {
			continue
		}
		if !p.h.EndBatch() || extra == p.repolls {
			break
		}
		extra++
	}
	if !p.h.EndRun(true) {
		return false
	}
	if p.runs != nil {
		p.runs.Add(1)
	}
	return true
}

// stop ends a run that left work to the owner.
func (p *Poller) stop() bool {
	p.h.EndBatch()
	p.h.EndRun(false)
	return false
}
