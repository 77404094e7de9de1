package scsi

import (
	"context"
	"sync"
	"sync/atomic"
)

// TaskAttr is the SAM task attribute of a command. The values are those of the TASK ATTRIBUTE
// field of SRP_CMD (and FCP, iSCSI): a target can convert the field directly.
type TaskAttr uint8

const (
	TaskSimple      TaskAttr = 0 // runs concurrently with other SIMPLE commands
	TaskHeadOfQueue TaskAttr = 1 // runs at once, ahead of everything queued
	TaskOrdered     TaskAttr = 2 // waits for all earlier commands and holds back all later ones
	TaskACA         TaskAttr = 4 // not supported (NormACA=0): rejected with INVALID MESSAGE ERROR
)

func (a TaskAttr) String() string {
	switch a {
	case TaskSimple:
		return "SIMPLE"
	case TaskHeadOfQueue:
		return "HEAD OF QUEUE"
	case TaskOrdered:
		return "ORDERED"
	case TaskACA:
		return "ACA"
	}
	return "invalid"
}

// The task set orders commands by their task attributes (SAM-5 8.6, with the QUEUE ALGORITHM
// MODIFIER "unrestricted reordering allowed" for SIMPLE commands):
//
// Commands are grouped into epochs. Every ORDERED command starts a new epoch and is its head;
// the SIMPLE and HEAD OF QUEUE commands admitted after it, up to the next ORDERED one, are its
// members. The oldest epoch whose members have not all completed is the current one. An
// epoch's head may start once every earlier epoch has drained (all earlier commands done); its
// SIMPLE members may start once the head has completed; HEAD OF QUEUE commands start at once
// but, being members, still hold back the next ORDERED command until they complete.
//
// The common case, SIMPLE commands with no ORDERED command outstanding, takes no lock: a
// member joins the newest epoch with an atomic increment and re-checks that the epoch is still
// the newest (if an ORDERED command was admitted concurrently, it backs out and retries).
type taskSet struct {
	mu   sync.Mutex
	head *epoch                // oldest epoch still in the set; guarded by mu
	tail atomic.Pointer[epoch] // newest epoch; changed under mu
	// fence, for a backend.Fenceable backend, counts the commands per fence epoch (set once,
	// before the first admission).
	fence *fenceGate
}

type epoch struct {
	members atomic.Int64 // admitted and not yet completed SIMPLE/HEAD OF QUEUE commands
	active  atomic.Bool  // oldest epoch and head completed (or none): SIMPLE members run freely
	// guarded by taskSet.mu
	headDone bool
	next     *epoch
	// headGo is closed when the epoch becomes the oldest (its head may start); simpleGo when
	// the head completes. Both nil for the initial epoch, which has no head.
	headGo   chan struct{}
	simpleGo chan struct{}
}

func (t *taskSet) init() {
	e := &epoch{headDone: true}
	e.active.Store(true)
	t.head = e
	t.tail.Store(e)
}

// taskState is a command's membership in the task set.
type taskState struct {
	lun      *LUN
	ep       *epoch
	head     bool // the ORDERED head of ep
	badAttr  bool // ACA or a reserved attribute: not in the task set
	admitted bool
	fenced   bool   // counted by the task set's fenceGate
	fence    uint64 // the fence epoch it was admitted under
}

// admit enters a command into the task set. It never blocks.
func (t *taskSet) admit(ts *taskState, attr TaskAttr) {
	ts.admitted = true
	if t.fence != nil {
		ts.fenced, ts.fence = true, t.fence.enter()
	}
	switch attr {
	case TaskSimple, TaskHeadOfQueue:
		for {
			e := t.tail.Load()
			e.members.Add(1)
			if t.tail.Load() == e {
				ts.ep = e
				return
			}
			t.leave(e) // raced with an ORDERED admission: join the new epoch instead
		}
	case TaskOrdered:
		e := &epoch{headGo: make(chan struct{}), simpleGo: make(chan struct{})}
		t.mu.Lock()
		t.tail.Load().next = e
		t.tail.Store(e)
		t.advance()
		t.mu.Unlock()
		ts.ep, ts.head = e, true
	default:
		ts.badAttr = true
	}
}

// wait blocks until the command may start, or ctx ends (false).
func (t *taskSet) wait(ctx context.Context, ts *taskState, attr TaskAttr) bool {
	e := ts.ep
	if e == nil {
		return true
	}
	var ch chan struct{}
	switch {
	case ts.head:
		ch = e.headGo
	case attr == TaskHeadOfQueue || e.active.Load():
		return true
	default:
		ch = e.simpleGo
	}
	select {
	case <-ch:
		return true
	default:
	}
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// done takes a command out of the task set (completed, aborted or withdrawn).
func (t *taskSet) done(ts *taskState) {
	if ts.fenced {
		t.fence.leave(ts.fence)
	}
	e := ts.ep
	if e != nil {
		if ts.head {
			t.mu.Lock()
			e.headDone = true
			t.advance()
			t.mu.Unlock()
		} else {
			t.leave(e)
		}
	}
	*ts = taskState{}
}

func (t *taskSet) leave(e *epoch) {
	// While e is the newest epoch nobody waits for it to drain: an ORDERED command admitted
	// later checks the member count itself after publishing its epoch.
	if e.members.Add(-1) == 0 && t.tail.Load() != e {
		t.mu.Lock()
		t.advance()
		t.mu.Unlock()
	}
}

// advance activates the oldest epoch once its head is done (an ORDERED head aborted before its
// turn does not let its members overtake earlier commands), retires drained epochs and lets
// the next epoch's head start. Called with t.mu held.
func (t *taskSet) advance() {
	for {
		h := t.head
		if h.headDone && !h.active.Load() {
			h.active.Store(true)
			close(h.simpleGo)
		}
		if h.next == nil || !h.headDone || h.members.Load() != 0 {
			return
		}
		t.head = h.next
		close(t.head.headGo)
	}
}
