package target

import (
	"context"
	"sync"
	"time"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/scsi/backend"
)

// lunQueue runs the commands of one logical unit, from every channel and session, on at most
// Limits.LUNWorkers goroutines (started on demand, gone when idle), so that a slow LUN holds
// only its own workers. It also is the registry that task management searches: every command
// admitted to the LUN's task set is in active until it has executed or been withdrawn.
//
// Dispatch order and deadlock freedom. scsi.LUNSet.Execute may block waiting for the command's
// turn in the task set (ORDERED, or SIMPLE behind an ORDERED one), and it waits for commands
// admitted earlier. Commands become ready (data-out fetched) in any order, so a worker blocked
// in Execute must never wait for a command that has no worker yet. The queue keeps the
// undispatched commands in admission order and dispatches a ready command only if it cannot
// wait for an undispatched one:
//
//   - HEAD OF QUEUE (and invalid attributes, which Execute fails at once): always;
//   - SIMPLE: when no ORDERED command admitted before it is undispatched;
//   - ORDERED: when every command admitted before it has been dispatched.
//
// Then a running command waits only for dispatched commands, and the earliest admitted
// command that has not completed never waits, so every command completes. Admission (Admit)
// and the queue order are taken under the same lock, so the queue order is the task set's.
//
// Inline execution. On a fast LUN (see fastLUN: a RAM backend, or the commands to LUN numbers
// outside the view, which touch no backend) a SIMPLE or HEAD OF QUEUE command that becomes
// ready while no ORDERED command is active in the queue executes at once on its channel's loop
// goroutine (ready returns readyInline, the channel calls execInline) instead of being handed
// to a worker and its result handed back: two goroutine handoffs fewer per command. Such a
// command never waits in the task set (no ORDERED command was admitted before it and not
// finished), its backend operation is a memory copy, and it holds one of the queue's max
// execution slots while it runs (running counts it like a worker), so the per-LUN concurrency
// bound holds. Everything else takes the worker path above: ORDERED commands and every
// command that becomes ready while one is active, commands that find every slot taken, and
// every command of a LUN that may block (file, block device), so a slow LUN still holds only
// its own workers and never a channel's loop. Task management sees an inline command as a
// dispatched one (an abort that finds it executing waits for it to end, as for a worker), and
// the channel hears of the execution before the task management requests waiting for it, as
// with a worker.
type lunQueue struct {
	t    *Target
	lun  *scsi.LUN // nil: commands to LUN numbers outside the view, REPORT LUNS without a LUN
	max  int
	fast bool // commands may execute inline (see above)
	// stats are the LUN's I/O counters (lunstats.go), updated without mu.
	stats lunCounters

	mu      sync.Mutex
	pending ctxList // admitted, not yet dispatched, in admission order (qLink)
	active  ctxList // admitted and not yet finished (aLink)
	running int     // workers (busy or idle) and inline executions
	idle    int     // workers waiting for work
	ordered int     // ORDERED commands in active
	kick    chan struct{}
}

// workerLinger is how long an idle LUN worker waits for more work before it exits: long enough
// that a steady stream of commands does not start a goroutine per command, short enough that an
// idle target has no workers.
const workerLinger = 100 * time.Millisecond

func newLUNQueue(t *Target, l *scsi.LUN) *lunQueue {
	q := &lunQueue{t: t, lun: l, max: t.limits().LUNWorkers, fast: !t.limits().NoInline && fastLUN(l),
		kick: make(chan struct{}, t.limits().LUNWorkers)}
	if l != nil {
		// PERSISTENT RESERVE OUT PREEMPT AND ABORT aborts the preempted nexuses' commands here
		// (on any gateway of the unit): as task management would, without status.
		l.SetTaskAborter(q, q.abortNexuses)
	}
	return q
}

// abortNexuses aborts the queue's commands whose I_T nexus match selects but except (the
// scsi.LUN's TaskAborter).
func (q *lunQueue) abortNexuses(match func(*scsi.Nexus) bool, except *scsi.Command) {
	q.abort(func(c *ioCtx) bool { return &c.cmd != except && match(&c.cmd.Nexus) }, nil)
}

// fastLUN tells whether l's commands may execute inline (see lunQueue), which may be on the
// transport's receive goroutine (Limits.NoCompletionHandler): the commands of no LUN (REPORT
// LUNS, a LUN number outside the view: answered from memory), and those of a LUN whose backend
// says it is backend.Nonblocking (RAM). File and block device backends wait for the kernel.
func fastLUN(l *scsi.LUN) bool {
	if l == nil {
		return true
	}
	nb, ok := l.Backend().(backend.Nonblocking)
	return ok && nb.Nonblocking()
}

// ctxList is an intrusive doubly linked list of ioCtx.
type ctxList struct{ head, tail *ioCtx }

type qlink struct{ prev, next *ioCtx }

func (l *ctxList) push(c *ioCtx, lk func(*ioCtx) *qlink) {
	x := lk(c)
	x.prev, x.next = l.tail, nil
	if l.tail != nil {
		lk(l.tail).next = c
	} else {
		l.head = c
	}
	l.tail = c
}

func (l *ctxList) remove(c *ioCtx, lk func(*ioCtx) *qlink) {
	x := lk(c)
	if x.prev != nil {
		lk(x.prev).next = x.next
	} else {
		l.head = x.next
	}
	if x.next != nil {
		lk(x.next).prev = x.prev
	} else {
		l.tail = x.prev
	}
	x.prev, x.next = nil, nil
}

func qLink(c *ioCtx) *qlink { return &c.qLink }
func aLink(c *ioCtx) *qlink { return &c.aLink }

// Queue states of a command.
const (
	qNone       uint8 = iota // not in a queue
	qUnready                 // admitted, data not there yet
	qReady                   // ready, waiting for a worker
	qDispatched              // executing
)

// admit enters c into the LUN's task set (through its view's LUNSet) and the queue.
func (q *lunQueue) admit(c *ioCtx, set *scsi.LUNSet) {
	q.mu.Lock()
	set.Admit(&c.cmd)
	c.lq = q
	c.qstate = qUnready
	if c.cmd.Attr == scsi.TaskOrdered {
		q.ordered++
	}
	q.pending.push(c, qLink)
	q.active.push(c, aLink)
	q.mu.Unlock()
}

// What ready decided.
const (
	readyQueued  = iota // queued for a worker
	readyAborted        // aborted meanwhile: withdrawn and finished, not to be executed
	readyInline         // dispatched to the caller: execute it now (execInline)
)

// ready marks c's data as present: c is queued for a worker, or dispatched to the caller for
// inline execution (see lunQueue), or, if it was aborted meanwhile, withdrawn and finished.
func (q *lunQueue) ready(c *ioCtx) int {
	q.mu.Lock()
	if c.aborted.Load() {
		q.pending.remove(c, qLink)
		ws := q.finishLocked(c, true)
		q.mu.Unlock()
		notifyWaiters(ws)
		return readyAborted
	}
	if q.fast && q.ordered == 0 && c.cmd.Attr != scsi.TaskOrdered && q.running < q.max {
		q.pending.remove(c, qLink)
		c.qstate = qDispatched
		q.running++
		q.mu.Unlock()
		q.t.stats.inline.Add(1)
		return readyInline
	}
	c.qstate = qReady
	q.spawnLocked()
	q.mu.Unlock()
	return readyQueued
}

// execInline executes c, which ready dispatched to the calling channel's loop, and hands the
// result to the channel (then to the task management requests waiting for c, as a worker
// does).
func (q *lunQueue) execInline(c *ioCtx) {
	c.exec()
	q.mu.Lock()
	ws := q.finishLocked(c, false)
	q.running--
	q.spawnLocked() // a command that found every slot taken meanwhile
	q.mu.Unlock()
	c.ch.onEvent(event{kind: evExecuted, c: c})
	notifyWaiters(ws)
}

// withdraw takes an admitted, undispatched command out (its data transfer failed, or its
// channel is closing).
func (q *lunQueue) withdraw(c *ioCtx) {
	q.mu.Lock()
	if c.qstate == qNone || c.qstate == qDispatched {
		q.mu.Unlock()
		return
	}
	q.pending.remove(c, qLink)
	ws := q.finishLocked(c, true)
	q.spawnLocked() // a later command may have been waiting for c to be dispatched
	q.mu.Unlock()
	notifyWaiters(ws)
}

// finishLocked takes c out of the registry and returns the task management requests waiting
// for it.
func (q *lunQueue) finishLocked(c *ioCtx, withdraw bool) []*ioCtx {
	if withdraw {
		c.ch.view.set.Withdraw(&c.cmd)
	}
	q.active.remove(c, aLink)
	if c.cmd.Attr == scsi.TaskOrdered {
		q.ordered--
	}
	c.qstate = qNone
	ws := c.waiters
	c.waiters = nil
	return ws
}

// spawnLocked makes sure a worker will look at the queue if a command in it is ready: it kicks
// an idle worker, or starts one if the slots allow.
func (q *lunQueue) spawnLocked() {
	if !q.hasReadyLocked() {
		return
	}
	if q.idle > 0 {
		select {
		case q.kick <- struct{}{}:
		default:
		}
		return
	}
	if q.running < q.max {
		q.running++
		q.t.workers.Add(1)
		q.t.stats.workers.Add(1)
		go q.work()
	}
}

// hasReadyLocked tells whether an undispatched command is ready (a worker could have
// something to do; commands still waiting for their data need none).
func (q *lunQueue) hasReadyLocked() bool {
	for c := q.pending.head; c != nil; c = c.qLink.next {
		if c.qstate == qReady {
			return true
		}
	}
	return false
}

// nextLocked removes and returns the first dispatchable command (see lunQueue), or nil.
func (q *lunQueue) nextLocked() *ioCtx {
	orderedBefore, allBefore := false, true
	for c := q.pending.head; c != nil; c = c.qLink.next {
		attr := c.cmd.Attr
		if c.qstate == qReady {
			ok := false
			switch attr {
			case scsi.TaskSimple:
				ok = !orderedBefore
			case scsi.TaskOrdered:
				ok = allBefore
			default: // HEAD OF QUEUE runs at once; ACA and reserved values fail at once
				ok = true
			}
			if ok {
				q.pending.remove(c, qLink)
				c.qstate = qDispatched
				return c
			}
		}
		if attr == scsi.TaskOrdered {
			orderedBefore = true
		}
		allBefore = false
	}
	return nil
}

// work is a worker: it executes dispatchable commands until there are none.
func (q *lunQueue) work() {
	defer q.t.workers.Done()
	defer q.t.stats.workers.Add(-1)
	var timer *time.Timer
	q.mu.Lock()
	for {
		c := q.nextLocked()
		if c == nil {
			// Linger a little for more work, unless the target is closing.
			if timer == nil {
				timer = time.NewTimer(workerLinger)
			} else {
				timer.Reset(workerLinger)
			}
			q.idle++
			q.mu.Unlock()
			woken := false
			select {
			case <-q.kick:
				woken = true
			case <-timer.C:
			case <-q.t.closeCh:
			}
			timer.Stop()
			q.mu.Lock()
			q.idle--
			if !woken { // a kick sent while we were timing out is ours to take
				select {
				case <-q.kick:
					woken = true
				default:
				}
			}
			if woken {
				continue
			}
			q.running--
			q.mu.Unlock()
			return
		}
		// Another worker for the rest, if any may be dispatchable.
		q.spawnLocked()
		q.mu.Unlock()

		c.exec()

		q.mu.Lock()
		ws := q.finishLocked(c, false)
		// The owner hears first, so that an aborted command's credit is owed before the
		// task management response that waited for it is built (same channel: same queue).
		c.ch.post(event{kind: evExecuted, c: c})
		if len(ws) > 0 {
			q.mu.Unlock()
			notifyWaiters(ws)
			q.mu.Lock()
		}
	}
}

// abort marks the active commands that match as aborted (SAM: the task is ended without
// status). Undispatched ready commands are withdrawn at once and their channel told; commands
// whose data is still moving or that are executing finish by themselves and then release tm,
// whose wait count is incremented for each. It returns the number of commands aborted.
func (q *lunQueue) abort(match func(*ioCtx) bool, tm *ioCtx) int {
	var ws []*ioCtx
	n := 0
	q.mu.Lock()
	for c := q.active.head; c != nil; {
		next := c.aLink.next
		if !match(c) || c.aborted.Load() && tm == nil {
			c = next
			continue
		}
		if !c.aborted.Swap(true) {
			n++
		}
		c.cctx.cancel()
		if c.qstate == qReady {
			q.pending.remove(c, qLink)
			ws = append(ws, q.finishLocked(c, true)...)
			c.ch.post(event{kind: evAborted, c: c})
		} else if tm != nil {
			tm.tmWait.Add(1)
			c.waiters = append(c.waiters, tm)
		}
		c = next
	}
	q.spawnLocked() // a command may have been waiting for a withdrawn one to be dispatched
	q.mu.Unlock()
	notifyWaiters(ws)
	return n
}

func notifyWaiters(ws []*ioCtx) {
	for _, tm := range ws {
		tm.tmRelease()
	}
}

// cmdCtx is the context a command executes under: cancelled when the command is aborted. It is
// reused from command to command and allocates its Done channel only if someone waits on it
// (the task set does, only when the command has to wait for its turn).
type cmdCtx struct {
	mu   sync.Mutex
	done chan struct{}
	err  error
}

var _ context.Context = (*cmdCtx)(nil)

func (c *cmdCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *cmdCtx) Value(any) any               { return nil }

func (c *cmdCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		}
	}
	return c.done
}

func (c *cmdCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *cmdCtx) cancel() {
	c.mu.Lock()
	if c.err == nil {
		c.err = context.Canceled
		if c.done != nil {
			close(c.done)
		}
	}
	c.mu.Unlock()
}

func (c *cmdCtx) reset() {
	c.mu.Lock()
	c.done, c.err = nil, nil
	c.mu.Unlock()
}
