package frpool

import (
	"fmt"

	"github.com/srpd/srpd/transport"
)

// engine is what the model harness needs of a verbs engine: the double (fakeEngine) or softroce
// over its in-memory link (softEngine). The pool under test talks to the engine only through the
// transport API; the rest is the harness's own view (executing, delivering, remote peers).
type engine interface {
	attr() transport.DeviceAttr
	pd() transport.PD
	qp() transport.QP
	alloc(n int) transport.Memory
	// exec lets the engine execute up to n send-queue WRs (the double) or make some progress
	// (softroce runs by itself); it returns how many ran, if known.
	exec(n int) int
	// popSend / popRecv return the oldest undelivered completion of the pool's QP, if any.
	popSend() (transport.WC, bool)
	popRecv() (transport.WC, bool)
	// settle waits until the engine has done all it can without the harness (softroce: until
	// posted work is complete); idle reports whether no WR is waiting to execute.
	settle()
	idle() bool
	inError() bool
	setError()
	// failNextPost makes the next PostSend fail with err, if the engine supports injection.
	failNextPost(err error) bool
	// reconnect resets the pool's QP (or replaces it) after an error, discarding what the old QP
	// still had, and returns the QP to hand to Recover.
	reconnect() transport.QP
	// regQueued reports whether a REG_MR with key is posted and not executed (if knowable).
	regQueued(key uint32) bool
	// remoteAccess is a peer's RDMA READ or WRITE through (rkey, va) on any QP of the PD. touched
	// lists the memory reached, if the engine can tell (nil otherwise).
	remoteAccess(rkey uint32, va uint64, data []byte, write bool) (touched []span, ok bool)
	// remoteInvalidate is the connected peer's SEND_WITH_INV naming rkey.
	remoteInvalidate(rkey uint32)
	// violations reports rules broken so far (LOCAL_INV / REG_MR failures, page-list mutation).
	violations() error
	close()
}

// fakeEngine is the double.
type fakeEngine struct {
	dev *fakeDev
	p   *fakePD
	q   *fakeQP
	mem []fakeMemory
}

func newFakeEngine(seed uint32, depth int) *fakeEngine {
	dev := newFakeDev("fake0", seed)
	pdI, _ := dev.AllocPD()
	pd := pdI.(*fakePD)
	return &fakeEngine{dev: dev, p: pd, q: newFakeQP(pd, depth, 2)}
}

func (e *fakeEngine) attr() transport.DeviceAttr { return e.dev.attr }
func (e *fakeEngine) pd() transport.PD           { return e.p }
func (e *fakeEngine) qp() transport.QP           { return e.q }
func (e *fakeEngine) alloc(n int) transport.Memory {
	m := e.dev.alloc(n)
	e.mem = append(e.mem, m)
	return m
}
func (e *fakeEngine) exec(n int) int {
	k := 0
	for k < n && e.q.exec() {
		k++
	}
	return k
}
func (e *fakeEngine) popSend() (transport.WC, bool) { return e.q.popSend() }
func (e *fakeEngine) popRecv() (transport.WC, bool) { return e.q.popRecv() }
func (e *fakeEngine) settle() {
	for e.q.exec() {
	}
}
func (e *fakeEngine) idle() bool                  { return e.q.pending() == 0 }
func (e *fakeEngine) inError() bool               { return e.q.state == transport.QPSErr }
func (e *fakeEngine) setError()                   { e.q.setError() }
func (e *fakeEngine) failNextPost(err error) bool { e.q.failPost = err; return true }
func (e *fakeEngine) reconnect() transport.QP {
	e.q.reset()
	return e.q
}
func (e *fakeEngine) regQueued(key uint32) bool { return e.q.pendingRegKey(key) }
func (e *fakeEngine) remoteAccess(rkey uint32, va uint64, data []byte, write bool) ([]span, bool) {
	return e.dev.remoteAccess(rkey, va, data, write)
}
func (e *fakeEngine) remoteInvalidate(rkey uint32) { e.q.remoteInvalidate(rkey) }
func (e *fakeEngine) violations() error {
	d := e.dev
	switch {
	case d.invFail != 0:
		return fmt.Errorf("a LOCAL_INV failed its key check (%d)", d.invFail)
	case d.regFail != 0:
		return fmt.Errorf("a REG_MR failed (%d)", d.regFail)
	case d.pageMutation != 0:
		return fmt.Errorf("a REG_MR page list changed between post and execution (%d)", d.pageMutation)
	}
	return nil
}
func (e *fakeEngine) close() {}
