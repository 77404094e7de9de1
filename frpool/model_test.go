package frpool

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/srpd/srpd/transport"
)

// The model-based property test. A rapid state machine drives random interleavings of get,
// register (alone or chained with a SEND and a LOCAL_INV), cancel, execution of send-queue work,
// delayed in-order completion delivery, remote accesses, invalidation, remote invalidation (by a
// correct peer and by a buggy one), QP errors and recovery against a pool under test on the
// deterministic double, while an adversary replays remote READs and WRITEs with every rkey ever
// issued at random moments. Invariants, checked after every step:
//
//  1. An access through an rkey only ever touches the buffer of the latest registration issued
//     with that rkey value, and only while that registration's buffer has not been released to its
//     owner: a stale rkey never reads or writes memory of any later registration, nor a buffer its
//     owner has got back. (rkeys are 8-bit generations: after 256 registrations of one MR a value
//     comes back, and then it names the new registration; that is inherent in verbs keys.)
//  2. No LOCAL_INV ever fails its key check, no REG_MR fails, and no REG_MR page list changes
//     between post and execution.
//  3. No buffer is released before its invalidation is confirmed: when the owner gets it back the
//     device has no VALID mapping with that key and no REG_MR with that key is still queued.
//  4. Released with an error only after a QP error, a peer's failed invalidation, or a peer's
//     repeated invalidation of one registration (reported to the pool) happened.
//  5. After quiescing (invalidate everything, drain, recover if needed) every MR is free, every
//     handle is back, every buffer is back with its owner, and the pool closes cleanly.

// poolUT is the surface the harness drives; frpool.Pool and the naive 2021-style pool implement it.
type poolUT interface {
	get(segs []Seg) (h any, err error)
	cancel(h any) error
	// post posts REG_MR of h (if h != nil), then a SEND (if send), then LOCAL_INV of inv (if
	// inv != nil), in one all-or-nothing post.
	post(h any, send *transport.SendWR, inv any) error
	invalidate(h any) error
	rkey(h any) uint32
	flush() error
	sync() error
	sendWC(wc *transport.WC) (bool, error)
	recvWC(wc *transport.WC) error
	recover(qp transport.QP) error
	qpError() // the ULP learnt of a QP error out of band (async event, CM)
	// snapshot is compared before and after a failed post (nil: not checked).
	snapshot() any
	mrs() []transport.MR
	quiesced() error
	close() error
}

// ---- frpool adapter ----

type frAdapter struct {
	p     *Pool
	owner BufferOwner
}

func (a *frAdapter) get(segs []Seg) (any, error) {
	r, err := a.p.TryGet(segs, a.owner)
	if err != nil {
		return nil, err
	}
	return r, nil
}
func (a *frAdapter) cancel(h any) error     { return a.p.Cancel(h.(*Reg)) }
func (a *frAdapter) rkey(h any) uint32      { return h.(*Reg).RKey() }
func (a *frAdapter) invalidate(h any) error { return a.p.Invalidate(h.(*Reg)) }
func (a *frAdapter) flush() error           { return a.p.Flush() }
func (a *frAdapter) sync() error            { return a.p.Sync() }
func (a *frAdapter) sendWC(wc *transport.WC) (bool, error) {
	return a.p.HandleSendCompletion(wc)
}
func (a *frAdapter) recvWC(wc *transport.WC) error { return a.p.HandleRecvCompletion(wc) }
func (a *frAdapter) recover(qp transport.QP) error { return a.p.Recover(qp) }
func (a *frAdapter) close() error                  { return a.p.Close() }
func (a *frAdapter) qpError()                      { a.p.HandleQPError(nil) }
func (a *frAdapter) post(h any, send *transport.SendWR, inv any) error {
	var regs, invs [1]*Reg
	var wrs [1]transport.SendWR
	c := Chain{}
	if h != nil {
		regs[0] = h.(*Reg)
		c.Reg = regs[:]
	}
	if send != nil {
		wrs[0] = *send
		c.WRs = wrs[:]
	}
	if inv != nil {
		invs[0] = inv.(*Reg)
		c.Inv = invs[:]
	}
	return a.p.Post(&c)
}

type frSnapshot struct {
	st    Stats
	tail  uint64
	keys  string
	state string
}

func (a *frAdapter) snapshot() any {
	p := a.p
	st := p.Stats()
	p.mu.Lock()
	defer p.mu.Unlock()
	var k, s strings.Builder
	for i := range p.slots {
		fmt.Fprintf(&k, "%d/%x/%x ", p.slots[i].keyByte, p.slots[i].live, p.slots[i].pendInv)
		fmt.Fprintf(&s, "%v ", p.slots[i].state)
	}
	for i := range p.handles {
		fmt.Fprintf(&s, "%v/%x ", p.handles[i].state, p.handles[i].key)
	}
	return frSnapshot{st: st, tail: p.t.tail, keys: k.String(), state: s.String()}
}

func (a *frAdapter) mrs() []transport.MR {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	var out []transport.MR
	for i := range a.p.slots {
		if mr := a.p.slots[i].mr; mr != nil {
			out = append(out, mr)
		}
	}
	return out
}

func (a *frAdapter) quiesced() error {
	st := a.p.Stats()
	if st.InUse != 0 || st.Invalidating != 0 || st.Quarantined != 0 || st.Dead != 0 || st.Free != st.MRs ||
		st.SQOutstanding != 0 {
		return fmt.Errorf("pool not quiescent: %+v", st)
	}
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	if a.p.nFree != len(a.p.handles) {
		return fmt.Errorf("%d of %d handles leaked", len(a.p.handles)-a.p.nFree, len(a.p.handles))
	}
	return nil
}

// ---- harness ----

const (
	mMapped = iota
	mPosted
	mInvalidating
	mReleased
)

type modelReg struct {
	id     int
	h      any
	buf    int
	lo, hi uint64 // device address range of the buffer
	rkey   uint32
	iova   uint64
	length uint64
	segs   []Seg
	state  int
	given  bool // the harness gave the handle back (invalidate)
	// reports counts the receive completions reporting remote invalidation of rkey that were
	// handed to the pool while this was the latest registration with that rkey.
	reports int
}

// addrAt is the device address of byte off of the registration (through its segments).
func (m *modelReg) addrAt(off uint64) uint64 {
	for _, s := range m.segs {
		if off < uint64(s.Len) {
			return s.Addr + off
		}
		off -= uint64(s.Len)
	}
	return 0
}

// coverage counts what the sequences of one test did (logged at the end, to show that the
// interesting interleavings do happen).
type coverage struct {
	sequences, posts, failedPosts, accessOK, accessWhileInvalidating, accessDenied                                   int
	remoteInv, remoteInvFailed, buggyInv, dupReports, qpErrors, recoveries, releasedOK, releasedErr, staleWCs, wraps int
}

func (c *coverage) String() string {
	return fmt.Sprintf("%d sequences: %d posts (%d failed on purpose), adversary accesses %d ok (%d through a key "+
		"whose LOCAL_INV was posted but not confirmed) / %d denied, %d remote invalidations (%d failed: key "+
		"replaced meanwhile; +%d by a buggy peer), %d repeated reports of one registration, %d QP errors, %d recoveries, buffers released %d ok / %d with error, "+
		"%d stale completions",
		c.sequences, c.posts, c.failedPosts, c.accessOK, c.accessWhileInvalidating, c.accessDenied, c.remoteInv,
		c.remoteInvFailed, c.buggyInv, c.dupReports, c.qpErrors, c.recoveries, c.releasedOK, c.releasedErr, c.staleWCs)
}

type harness struct {
	cov  *coverage
	eng  engine
	pool poolUT
	mem  transport.Memory

	nMR      int
	bufPages int
	bufLent  []bool
	regs     []*modelReg
	byHandle map[any]*modelReg
	issued   []uint32             // every rkey ever issued
	latest   map[uint32]*modelReg // rkey value → latest registration issued with it
	ulpWant  map[uint64]bool      // signaled ULP SENDs whose completion is due
	accesses int
	toReturn []*modelReg // released handles the harness has not given back yet
	ulpID    uint64
	errors   int // QP errors / failed remote invalidations injected or caused
	// adversaryOnly disables the release-time checks (invariant 3), leaving the adversary's
	// accesses (invariant 1) to catch a pool that releases buffers early.
	adversaryOnly bool
	viol          []string
	logf          func(string, ...any)
}

func (h *harness) violate(format string, args ...any) {
	h.viol = append(h.viol, fmt.Sprintf(format, args...))
}

// BufferReleased is the owner callback (frpool); the naive pool calls it too.
func (h *harness) BufferReleased(r *Reg, err error) { h.released(r, err) }

func (h *harness) released(handle any, err error) {
	m := h.byHandle[handle]
	if m == nil {
		h.violate("release of an unknown handle %p", handle)
		return
	}
	delete(h.byHandle, handle)
	if m.state != mPosted && m.state != mInvalidating {
		h.violate("reg %d released in model state %d", m.id, m.state)
	}
	m.state = mReleased
	h.bufLent[m.buf] = false
	if err == nil {
		h.cov.releasedOK++
	} else {
		h.cov.releasedErr++
	}
	h.logf("released reg %d rkey %#x err=%v", m.id, m.rkey, err)
	if !m.given {
		// Released without the ULP having invalidated it (remote invalidation, teardown): the ULP
		// still has to give the handle back — from inside the callback, or later.
		if m.id%2 == 0 {
			m.given = true
			if err := h.pool.invalidate(handle); err != nil {
				h.violate("giving back released reg %d from its callback: %v", m.id, err)
			}
		} else {
			h.toReturn = append(h.toReturn, m)
		}
	}
	if h.adversaryOnly {
		return
	}
	// Invariant 3: the invalidation has executed (or the key never became valid, or the MR is gone).
	if h.keyInForce(m.rkey) {
		h.violate("reg %d (rkey %#x) released while the device still has its key VALID (err %v)", m.id, m.rkey, err)
	}
	if h.eng.regQueued(m.rkey) {
		h.violate("reg %d (rkey %#x) released while its REG_MR is still queued", m.id, m.rkey)
	}
	if err != nil && h.errors == 0 {
		h.violate("reg %d released with error %v although no error happened (engine QP in error: %v)", m.id, err,
			h.eng.inError())
	}
}

// keyInForce reports whether the device has rkey VALID (the MR's own view, MR.Query).
func (h *harness) keyInForce(rkey uint32) bool {
	for _, mr := range h.pool.mrs() {
		if mr.Index() == rkey>>8 {
			inf := mr.Query()
			return inf.State == transport.MRValid && inf.Key == rkey
		}
	}
	return false
}

func newHarness(t *rapid.T, eng engine, mk func(h *harness) poolUT, nMR, maxPages, nBuf int) *harness {
	h := &harness{
		eng: eng,
		nMR: nMR, bufPages: maxPages, bufLent: make([]bool, nBuf),
		byHandle: map[any]*modelReg{}, latest: map[uint32]*modelReg{}, ulpWant: map[uint64]bool{},
		logf: t.Logf,
	}
	h.mem = eng.alloc(nBuf * maxPages * fakePage)
	h.pool = mk(h)
	return h
}

func (h *harness) live(state int) []*modelReg {
	var out []*modelReg
	for _, m := range h.regs {
		if m.state == state {
			out = append(out, m)
		}
	}
	return out
}

func (h *harness) check(t *rapid.T) {
	if err := h.eng.violations(); err != nil && !h.adversaryOnly {
		t.Fatalf("%v", err)
	}
	if len(h.viol) > 0 {
		t.Fatalf("invariant violated: %s", strings.Join(h.viol, "; "))
	}
}

// ---- actions ----

func (h *harness) actGet(t *rapid.T) {
	var free []int
	for i, lent := range h.bufLent {
		if !lent {
			free = append(free, i)
		}
	}
	if len(free) == 0 {
		t.Skip("no buffer")
	}
	b := rapid.SampledFrom(free).Draw(t, "buf")
	base := h.mem.Addr() + uint64(b*h.bufPages*fakePage)
	// Pages [p0, p1) of the buffer, first byte offset off0, optionally two segments with a gap.
	p0 := rapid.IntRange(0, h.bufPages-1).Draw(t, "p0")
	p1 := rapid.IntRange(p0+1, h.bufPages).Draw(t, "p1")
	off0 := rapid.SampledFrom([]int{0, 1, 512, fakePage - 1}).Draw(t, "off0")
	endCut := rapid.SampledFrom([]int{0, 0, 7, fakePage - 1}).Draw(t, "endcut")
	var segs []Seg
	if p1-p0 >= 3 && rapid.Bool().Draw(t, "gap") {
		// [p0+off0, p0+1) and [p0+2, p1): page-aligned inner boundaries, a one-page hole
		segs = []Seg{
			{Addr: base + uint64(p0*fakePage+off0), Len: fakePage - off0},
			{Addr: base + uint64((p0+2)*fakePage), Len: (p1-p0-2)*fakePage - endCut},
		}
	} else {
		n := (p1-p0)*fakePage - off0 - endCut
		if n <= 0 {
			n = 1
		}
		segs = []Seg{{Addr: base + uint64(p0*fakePage+off0), Len: n}}
	}
	handle, err := h.pool.get(segs)
	if err != nil {
		if errors.Is(err, ErrExhausted) || errors.Is(err, ErrQPError) {
			h.logf("get: %v", err)
			return
		}
		t.Fatalf("get: %v", err)
	}
	var length uint64
	for _, s := range segs {
		length += uint64(s.Len)
	}
	m := &modelReg{id: len(h.regs), h: handle, buf: b, lo: base, hi: base + uint64(h.bufPages*fakePage),
		iova: segs[0].Addr, length: length, segs: segs, state: mMapped}
	h.regs = append(h.regs, m)
	h.byHandle[handle] = m
	h.bufLent[b] = true
	h.logf("get reg %d buf %d segs %v", m.id, b, segs)
}

func (h *harness) actCancel(t *rapid.T) {
	c := h.live(mMapped)
	if len(c) == 0 {
		t.Skip("nothing mapped")
	}
	m := rapid.SampledFrom(c).Draw(t, "reg")
	if err := h.pool.cancel(m.h); err != nil {
		t.Fatalf("cancel reg %d: %v", m.id, err)
	}
	delete(h.byHandle, m.h)
	m.state = mReleased
	h.bufLent[m.buf] = false
	h.logf("cancel reg %d", m.id)
}

// actPost posts REG_MR of a mapped registration, optionally with a SEND and the LOCAL_INV of
// another, posted, registration; or a bare SEND; sometimes with an injected post failure.
func (h *harness) actPost(t *rapid.T) {
	mapped := h.live(mMapped)
	var posted []*modelReg
	for _, m := range h.live(mPosted) {
		if !m.given {
			posted = append(posted, m)
		}
	}
	var reg, inv *modelReg
	if len(mapped) > 0 && rapid.IntRange(0, 9).Draw(t, "withreg") > 0 {
		reg = rapid.SampledFrom(mapped).Draw(t, "reg")
	}
	if len(posted) > 0 && rapid.IntRange(0, 3).Draw(t, "withinv") == 0 {
		inv = rapid.SampledFrom(posted).Draw(t, "inv")
	}
	var send *transport.SendWR
	if reg == nil || rapid.Bool().Draw(t, "withsend") {
		h.ulpID++
		send = &transport.SendWR{ID: h.ulpID, Opcode: transport.WRSend}
		if rapid.Bool().Draw(t, "signaled") {
			send.Flags = transport.SendSignaled
		}
	}
	fail := rapid.IntRange(0, 7).Draw(t, "fail") == 0
	var before any
	if fail {
		before = h.pool.snapshot()
		fail = h.eng.failNextPost(transport.ErrSQFull)
	}
	var rh, ih any
	if reg != nil {
		rh = reg.h
	}
	if inv != nil {
		ih = inv.h
	}
	err := h.pool.post(rh, send, ih)
	if fail {
		h.eng.failNextPost(nil)
	}
	h.logf("post reg=%v send=%v inv=%v fail=%v: %v", idOf(reg), send != nil, idOf(inv), fail, err)
	if err != nil {
		if fail || errors.Is(err, ErrSQFull) || errors.Is(err, ErrQPError) || errors.Is(err, ErrQuarantined) {
			if fail {
				h.cov.failedPosts++
			}
			if fail && before != nil {
				if after := h.pool.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
					t.Fatalf("failed post changed the pool:\nbefore %+v\nafter  %+v", before, after)
				}
			}
			return
		}
		t.Fatalf("post: %v", err)
	}
	if fail {
		t.Fatalf("post succeeded despite the injected failure")
	}
	h.cov.posts++
	if reg != nil {
		reg.state = mPosted
		reg.rkey = h.pool.rkey(reg.h)
		h.issued = append(h.issued, reg.rkey)
		h.latest[reg.rkey] = reg
	}
	if send != nil && send.Flags&transport.SendSignaled != 0 {
		h.ulpWant[send.ID] = true
	}
	if inv != nil {
		inv.given = true
		if inv.state == mPosted { // (a pool may release synchronously)
			inv.state = mInvalidating
		}
	}
}

func idOf(m *modelReg) any {
	if m == nil {
		return "-"
	}
	return m.id
}

func (h *harness) actInvalidate(t *rapid.T) {
	var c []*modelReg
	for _, m := range h.live(mPosted) {
		if !m.given {
			c = append(c, m)
		}
	}
	if len(c) == 0 {
		t.Skip("nothing posted")
	}
	m := rapid.SampledFrom(c).Draw(t, "reg")
	h.invalidate(t, m)
}

// invalidate gives a posted registration's handle back (posting its LOCAL_INV).
func (h *harness) invalidate(t *rapid.T, m *modelReg) {
	err := h.pool.invalidate(m.h)
	h.logf("invalidate reg %d rkey %#x: %v", m.id, m.rkey, err)
	switch {
	case err == nil:
		m.given = true
		if m.state == mPosted { // (a pool may release synchronously)
			m.state = mInvalidating
		}
	case errors.Is(err, ErrSQFull):
	case errors.Is(err, ErrQPError) || errors.Is(err, ErrQuarantined):
		m.given = true // being torn down; the callback will come
	default:
		t.Fatalf("invalidate: %v", err)
	}
}

// actReturn gives back handles of registrations released without an invalidate of ours.
func (h *harness) actReturn(t *rapid.T) {
	if len(h.toReturn) == 0 {
		t.Skip("nothing to give back")
	}
	h.returnHandles(t)
}

func (h *harness) returnHandles(t *rapid.T) {
	for len(h.toReturn) > 0 {
		m := h.toReturn[0]
		h.toReturn = h.toReturn[1:]
		m.given = true
		if err := h.pool.invalidate(m.h); err != nil {
			t.Fatalf("giving back released reg %d: %v", m.id, err)
		}
		h.logf("gave back reg %d", m.id)
	}
}

func (h *harness) actExec(t *rapid.T) {
	n := rapid.IntRange(1, 4).Draw(t, "n")
	k := h.eng.exec(n)
	if h.eng.inError() && k > 0 {
		h.errors++
	}
	h.logf("exec %d", k)
}

func (h *harness) deliverSend(t *rapid.T) bool {
	wc, ok := h.eng.popSend()
	if !ok {
		return false
	}
	orig := wc.ID
	if wc.Status != transport.WCSuccess {
		h.errors++ // before the pool sees it: it may release buffers with an error at once
		if wc.Status != transport.WCWRFlushErr {
			h.logf("send completion %#x failed: %v", orig, wc.Status)
		}
	}
	deliver, err := h.pool.sendWC(&wc)
	if errors.Is(err, ErrStaleCompletion) {
		h.cov.staleWCs++
		h.logf("stale send completion %#x %v", orig, wc.Status)
		return true
	}
	if err != nil {
		t.Fatalf("send completion %#x %v: %v", orig, wc.Status, err)
	}
	if deliver {
		if wc.Status == transport.WCSuccess && !h.ulpWant[wc.ID] {
			t.Fatalf("ULP got completion %d it did not ask for", wc.ID)
		}
		delete(h.ulpWant, wc.ID)
	}
	h.logf("deliver send %#x %v → deliver=%v id=%d", orig, wc.Status, deliver, wc.ID)
	return true
}

func (h *harness) actDeliver(t *rapid.T) {
	n := rapid.IntRange(1, 4).Draw(t, "n")
	for i := 0; i < n && h.deliverSend(t); i++ {
	}
}

func (h *harness) deliverRecv(t *rapid.T) bool {
	wc, ok := h.eng.popRecv()
	if !ok {
		return false
	}
	if wc.Status != transport.WCSuccess {
		h.errors++
	}
	// A report of remote invalidation names the registration whose key was in force when the
	// peer's SEND_WITH_INV executed: the latest one issued with that key (rxe_invalidate_mr, like
	// the double and softroce, compares the key with the MR's key in force and accepts a FREE MR
	// whose key still matches; any later REG_MR of the MR installs another key). Each
	// registration has at most one legitimate report, polled before or after the completion
	// that confirms its LOCAL_INV (send and receive completions are not ordered with respect to
	// each other). Another one means a (buggy) peer invalidated the key again while the MR was
	// FREE with it: a peer error, which the pool must report (ErrRKeyMismatch) and may act on at
	// once (quarantine, resolved within the call if its send queue is drained, releasing the
	// MR's current registration with the error). So the error is counted before the pool sees
	// the completion, as for failed send completions.
	var dup *modelReg
	if wc.Status == transport.WCSuccess && wc.Flags&transport.WCWithInvalidate != 0 &&
		(wc.QPN == 0 || wc.QPN == h.eng.qp().QPN()) { // (else stale: from a QP before Recover)
		if m := h.latest[wc.InvalidatedRKey]; m != nil {
			m.reports++
			if m.reports > 1 {
				dup = m
				h.errors++
				h.cov.dupReports++
			}
		}
	}
	err := h.pool.recvWC(&wc)
	h.logf("deliver recv %v inv=%#x: %v", wc.Status, wc.InvalidatedRKey, err)
	if errors.Is(err, ErrStaleCompletion) {
		return true
	}
	if dup != nil {
		_, strict := h.pool.(*frAdapter) // (the naive pool ignores receive completions)
		switch {
		case errors.Is(err, ErrRKeyMismatch):
		case err == nil && (!strict || h.eng.inError()): // a pool in QP error ignores reports
		default:
			t.Fatalf("report #%d of reg %d's rkey %#x (a peer error): %v, want %v", dup.reports, dup.id,
				wc.InvalidatedRKey, err, ErrRKeyMismatch)
		}
		return true
	}
	if err != nil {
		t.Fatalf("recv completion: %v", err)
	}
	return true
}

func (h *harness) actDeliverRecv(t *rapid.T) {
	if !h.deliverRecv(t) {
		t.Skip("no receive completion")
	}
}

// actAdversary replays a READ or WRITE with any rkey ever issued.
func (h *harness) actAdversary(t *rapid.T) {
	if len(h.issued) == 0 {
		t.Skip("no rkey issued yet")
	}
	// Half the time a key of a registration not yet released (the interesting window), else any.
	var rkey uint32
	var recent []uint32
	for _, m := range h.regs {
		if m.state == mPosted || m.state == mInvalidating {
			recent = append(recent, m.rkey)
		}
	}
	if len(recent) > 0 && rapid.Bool().Draw(t, "recent") {
		rkey = rapid.SampledFrom(recent).Draw(t, "rkey")
	} else {
		rkey = rapid.SampledFrom(h.issued).Draw(t, "rkey")
	}
	m := h.latest[rkey]
	off := rapid.Uint64Range(0, m.length-1).Draw(t, "off")
	n := rapid.IntRange(1, fakePage+64).Draw(t, "len")
	write := rapid.Bool().Draw(t, "write")
	data := make([]byte, n)
	h.accesses++
	for i := range data {
		data[i] = byte(h.accesses*31 + i)
	}
	touched, ok := h.eng.remoteAccess(rkey, m.iova+off, data, write)
	h.logf("adversary %s rkey %#x (reg %d, state %d) off %d len %d: ok=%v", map[bool]string{true: "WRITE", false: "READ"}[write],
		rkey, m.id, m.state, off, n, ok)
	if !ok {
		h.cov.accessDenied++
		return
	}
	h.cov.accessOK++
	if m.state == mInvalidating {
		h.cov.accessWhileInvalidating++
	}
	if m.state != mPosted && m.state != mInvalidating {
		t.Fatalf("access through rkey %#x reached memory although reg %d (its latest registration) is in state %d (buffer released to its owner)",
			rkey, m.id, m.state)
	}
	for _, s := range touched {
		if s.addr < m.lo || s.addr+s.n > m.hi {
			t.Fatalf("access through rkey %#x touched [%#x,+%d) outside reg %d's buffer [%#x,%#x)", rkey, s.addr, s.n, m.id, m.lo, m.hi)
		}
	}
	if touched == nil && write {
		// The engine cannot say what it touched: the bytes must be where reg m maps them.
		mb := h.mem.Bytes()
		for i := 0; i < n && off+uint64(i) < m.length; i++ {
			a := m.addrAt(off + uint64(i))
			if a < m.lo || a >= m.hi || mb[a-h.mem.Addr()] != data[i] {
				t.Fatalf("WRITE through rkey %#x (reg %d) did not land in its buffer at byte %d", rkey, m.id, i)
			}
		}
	}
}

// actRemoteInvalidate: a correct peer's SEND_WITH_INV for a key in force, or (rarely) a buggy
// peer naming a stale key (the responder fails it and the QP errors).
func (h *harness) actRemoteInvalidate(t *rapid.T) {
	var c []*modelReg
	for _, m := range h.regs {
		if m.state == mPosted || m.state == mInvalidating {
			if h.keyInForce(m.rkey) {
				c = append(c, m)
			}
		}
	}
	if len(h.issued) > 0 && rapid.IntRange(0, 9).Draw(t, "buggy") == 0 {
		rkey := rapid.SampledFrom(h.issued).Draw(t, "rkey")
		before := h.eng.inError()
		h.cov.buggyInv++
		h.eng.remoteInvalidate(rkey)
		if !before && h.eng.inError() {
			h.errors++
		}
		h.logf("buggy peer invalidates %#x: qp in error %v", rkey, h.eng.inError())
		return
	}
	if len(c) == 0 {
		t.Skip("no key in force")
	}
	m := rapid.SampledFrom(c).Draw(t, "reg")
	// On softroce the send queue executes by itself: a LOCAL_INV of this key and the REG_MR of the
	// MR's next registration can both execute between the check above and the SEND_WITH_INV's
	// arrival, which then fails (the key in force is another) and puts our QP in ERR. That is
	// a failed remote invalidation like a buggy peer's, and is counted the same way.
	before := h.eng.inError()
	h.eng.remoteInvalidate(m.rkey)
	h.cov.remoteInv++
	if !before && h.eng.inError() {
		h.errors++
		h.cov.remoteInvFailed++
	}
	h.logf("peer invalidates reg %d rkey %#x: qp in error %v", m.id, m.rkey, h.eng.inError())
}

func (h *harness) actFlush(t *rapid.T) {
	err := h.pool.flush()
	h.logf("flush: %v", err)
	if err != nil && !errors.Is(err, ErrSQFull) {
		t.Fatalf("flush: %v", err)
	}
}

func (h *harness) actQPError(t *rapid.T) {
	if h.eng.inError() {
		t.Skip("already in error")
	}
	if rapid.IntRange(0, 3).Draw(t, "now") != 0 {
		return // errors are rarer than the rest
	}
	h.eng.setError()
	h.errors++
	h.cov.qpErrors++
	tell := rapid.Bool().Draw(t, "tell")
	if tell { // the ULP hears of it at once (async event), not only through flushed completions
		h.pool.qpError()
	}
	h.logf("QP error (pool told: %v)", tell)
}

// actRecover reconnects the QP (after delivering the flushes, or discarding them as a reset
// does) and calls Recover.
func (h *harness) actRecover(t *rapid.T) {
	if !h.eng.inError() {
		t.Skip("QP healthy")
	}
	drain := rapid.Bool().Draw(t, "drain")
	h.recoverQP(t, drain)
}

func (h *harness) recoverQP(t *rapid.T, drain bool) {
	if drain {
		for h.deliverRecv(t) || h.deliverSend(t) {
		}
	}
	qp := h.eng.reconnect()
	h.cov.recoveries++
	h.ulpWant = map[uint64]bool{} // completions of the old QP are gone
	if err := h.pool.recover(qp); err != nil {
		t.Fatalf("recover: %v", err)
	}
	h.logf("recovered (drained=%v)", drain)
}

// quiesce gives everything back and checks that nothing leaked.
func (h *harness) quiesce(t *rapid.T) {
	for round := 0; ; round++ {
		if round > 200 {
			t.Fatalf("could not quiesce")
		}
		if h.eng.inError() {
			h.recoverQP(t, round%2 == 0)
		}
		for _, m := range h.live(mMapped) {
			if err := h.pool.cancel(m.h); err != nil {
				t.Fatalf("cancel: %v", err)
			}
			delete(h.byHandle, m.h)
			m.state = mReleased
			h.bufLent[m.buf] = false
		}
		for _, m := range h.live(mPosted) {
			if !m.given {
				h.invalidate(t, m)
			}
		}
		h.returnHandles(t)
		if err := h.pool.sync(); err != nil && !errors.Is(err, ErrSQFull) {
			t.Fatalf("sync: %v", err)
		}
		h.eng.settle()
		for h.deliverRecv(t) || h.deliverSend(t) {
		}
		h.check(t)
		if h.eng.inError() {
			continue
		}
		if len(h.live(mMapped))+len(h.live(mPosted))+len(h.live(mInvalidating)) == 0 && h.eng.idle() &&
			len(h.toReturn) == 0 && h.pool.quiesced() == nil {
			break
		}
	}
	if err := h.pool.quiesced(); err != nil {
		t.Fatalf("after quiescing: %v", err)
	}
	for i, lent := range h.bufLent {
		if lent {
			t.Fatalf("buffer %d never given back", i)
		}
	}
	for _, mr := range h.pool.mrs() {
		if inf := mr.Query(); inf.State == transport.MRValid {
			t.Fatalf("MR %d still VALID with key %#x after quiescing", mr.Index(), inf.Key)
		}
	}
	if err := h.pool.close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}

func (h *harness) actions() map[string]func(*rapid.T) {
	// rapid picks actions uniformly by name: weights are given by repeating names.
	acts := map[string]func(*rapid.T){"": h.check}
	for name, w := range map[string]struct {
		f func(*rapid.T)
		n int
	}{
		"get": {h.actGet, 3}, "post": {h.actPost, 3}, "invalidate": {h.actInvalidate, 2},
		"exec": {h.actExec, 3}, "deliver": {h.actDeliver, 3}, "adversary": {h.actAdversary, 3},
		"cancel": {h.actCancel, 1}, "deliverRecv": {h.actDeliverRecv, 1}, "remoteInvalidate": {h.actRemoteInvalidate, 1},
		"flush": {h.actFlush, 1}, "qpError": {h.actQPError, 1}, "recover": {h.actRecover, 1}, "return": {h.actReturn, 1},
	} {
		for i := 0; i < w.n; i++ {
			acts[fmt.Sprintf("%s%d", name, i)] = w.f
		}
	}
	return acts
}

// runModel is one rapid sequence against the pool built by mk.
func runModel(t *rapid.T, cov *coverage, mk func(h *harness) poolUT) { runModelOpt(t, cov, mk, false) }

func runModelOpt(t *rapid.T, cov *coverage, mk func(h *harness) poolUT, adversaryOnly bool) {
	nMR := rapid.IntRange(1, 4).Draw(t, "nMR")
	depth := rapid.IntRange(4, 16).Draw(t, "depth")
	eng := newFakeEngine(rapid.Uint32().Draw(t, "keyseed"), depth)
	runModelOn(t, cov, eng, mk, nMR, adversaryOnly)
}

// runModelOn runs one sequence on eng.
func runModelOn(t *rapid.T, cov *coverage, eng engine, mk func(h *harness) poolUT, nMR int, adversaryOnly bool) {
	h := newHarness(t, eng, mk, nMR, 4, nMR+2)
	h.cov = cov
	cov.sequences++
	h.adversaryOnly = adversaryOnly
	t.Repeat(h.actions())
	h.quiesce(t)
	h.check(t)
}

func newFRAdapter(t *rapid.T, batch bool) func(h *harness) poolUT {
	return func(h *harness) poolUT {
		p, err := New(Config{Attr: h.eng.attr(), PD: h.eng.pd(), QP: h.eng.qp(), MaxPages: h.bufPages, NumMRs: h.nMR,
			BatchInvalidates: batch, SignalInterval: rapid.IntRange(0, 8).Draw(t, "sig")})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		return &frAdapter{p: p, owner: h}
	}
}

// withRapidChecks runs f with -rapid.checks set to n unless the flag was given explicitly.
func withRapidChecks(t *testing.T, n int, f func()) {
	explicit := false
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "rapid.checks" {
			explicit = true
		}
	})
	if explicit || testing.Short() {
		f()
		return
	}
	fl := flag.Lookup("rapid.checks")
	old := fl.Value.String()
	_ = fl.Value.Set(fmt.Sprint(n))
	defer func() { _ = fl.Value.Set(old) }()
	f()
}

// modelChecks is the number of sequences CI runs (each is cheap: a few MRs, ~30 steps).
const modelChecks = 10000

func TestModelFake(t *testing.T) {
	withRapidChecks(t, modelChecks/2, func() {
		t.Run("signaled", func(t *testing.T) {
			cov := &coverage{}
			rapid.Check(t, func(rt *rapid.T) { runModel(rt, cov, newFRAdapter(rt, false)) })
			t.Log(cov)
		})
		t.Run("batched", func(t *testing.T) {
			cov := &coverage{}
			rapid.Check(t, func(rt *rapid.T) { runModel(rt, cov, newFRAdapter(rt, true)) })
			t.Log(cov)
		})
	})
}
