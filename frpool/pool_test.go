package frpool

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/srpd/srpd/transport"
)

// env is a pool on the double with a memory area for buffers.
type env struct {
	t    testing.TB
	dev  *fakeDev
	pd   *fakePD
	qp   *fakeQP
	p    *Pool
	mem  fakeMemory
	mu   sync.Mutex
	back map[rid]error // owner callbacks
	keys map[*Reg]uint32
	gens map[*Reg]uint32
	logs *observer.ObservedLogs
}

func newEnv(t testing.TB, cfg Config) *env {
	dev := newFakeDev("fake0", 42)
	pdI, _ := dev.AllocPD()
	pd := pdI.(*fakePD)
	depth := cfg.SQDepth
	if depth == 0 {
		depth = 32
	}
	qp := newFakeQP(pd, depth, 2)
	cfg.SQDepth = 0
	cfg.Attr, cfg.PD, cfg.QP = dev.attr, pd, qp
	if cfg.MaxPages == 0 {
		cfg.MaxPages = 4
	}
	if cfg.NumMRs == 0 {
		cfg.NumMRs = 2
	}
	core, logs := observer.New(zap.DebugLevel)
	cfg.Logger = zap.New(core)
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, dev: dev, pd: pd, qp: qp, p: p, mem: dev.alloc(64 * fakePage),
		back: map[rid]error{}, keys: map[*Reg]uint32{}, gens: map[*Reg]uint32{}, logs: logs}
}

// rid identifies one use of a (recycled) handle.
type rid struct {
	r   *Reg
	gen uint32
}

func (e *env) BufferReleased(r *Reg, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	k := rid{r, r.Gen()}
	if _, dup := e.back[k]; dup {
		e.t.Errorf("double release of %p", r)
	}
	e.back[k] = err
	e.keys[r] = r.RKey()
}

// released reports the owner callback of the latest use of r (as handed out by env.get).
func (e *env) released(r *Reg) (error, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	err, ok := e.back[rid{r, e.gens[r]}]
	return err, ok
}

// buf is page i of the memory area, n pages long.
func (e *env) buf(i, n int) []Seg {
	return []Seg{{Addr: e.mem.Addr() + uint64(i*fakePage), Len: n * fakePage}}
}

func (e *env) get(i, n int) *Reg {
	e.t.Helper()
	r, err := e.p.TryGet(e.buf(i, n), e)
	if err != nil {
		e.t.Fatalf("get: %v", err)
	}
	e.mu.Lock()
	e.gens[r] = r.Gen()
	e.mu.Unlock()
	return r
}

// registered is get and a Register that must succeed.
func (e *env) registered(i, n int) *Reg {
	e.t.Helper()
	r := e.get(i, n)
	if err := e.p.Register(r); err != nil {
		e.t.Fatalf("register: %v", err)
	}
	return r
}

func (e *env) execAll() {
	for e.qp.exec() {
	}
}

// deliver hands every queued send completion to the pool and returns those delivered to the ULP.
func (e *env) deliver() []transport.WC {
	e.t.Helper()
	var out []transport.WC
	for {
		wc, ok := e.qp.popSend()
		if !ok {
			return out
		}
		d, err := e.p.HandleSendCompletion(&wc)
		if err != nil {
			e.t.Fatalf("HandleSendCompletion(%#x): %v", wc.ID, err)
		}
		if d {
			out = append(out, wc)
		}
	}
}

func (e *env) noViolations() {
	e.t.Helper()
	if e.dev.invFail+e.dev.regFail+e.dev.pageMutation != 0 {
		e.t.Fatalf("LOCAL_INV failures %d, REG_MR failures %d, page-list mutations %d",
			e.dev.invFail, e.dev.regFail, e.dev.pageMutation)
	}
}

func TestKeyAdvancesAndLocalInvNamesRegisteredKey(t *testing.T) {
	e := newEnv(t, Config{NumMRs: 1})
	init := e.p.slots[0].mr.RKey()
	a := e.registered(0, 1)
	k1 := a.RKey()
	if k1 != init&^0xff|(init+1)&0xff {
		t.Fatalf("first key %#x, initial %#x", k1, init)
	}
	// Nothing about the MR changes until the REG_MR executes.
	if inf := e.p.slots[0].mr.Query(); inf.State != transport.MRFree || inf.Key != init {
		t.Fatalf("before execution: %+v", inf)
	}
	e.execAll()
	if inf := e.p.slots[0].mr.Query(); inf.State != transport.MRValid || inf.Key != k1 {
		t.Fatalf("after REG_MR: %+v", inf)
	}
	// Invalidate, then reuse the MR at once: the second REG_MR is posted behind the LOCAL_INV,
	// nothing executed yet.
	if err := e.p.Invalidate(a); err != nil {
		t.Fatal(err)
	}
	b := e.get(1, 1)
	if err := e.p.Post(&Chain{Reg: []*Reg{b}, WRs: []transport.SendWR{{ID: 7, Opcode: transport.WRSend}}}); err != nil {
		t.Fatal(err)
	}
	k2 := b.RKey()
	if k2 != k1&^0xff|(k1+1)&0xff || a.RKey() != k1 {
		t.Fatalf("keys %#x %#x", k1, k2)
	}
	if _, ok := e.released(a); ok {
		t.Fatal("buffer released before its LOCAL_INV executed")
	}
	st := e.p.Stats()
	if st.Invalidating != 1 || st.InUse != 1 || st.Registrations != 2 {
		t.Fatalf("stats %+v", st)
	}
	e.execAll()
	if _, ok := e.released(a); ok {
		t.Fatal("buffer released before the LOCAL_INV's completion was seen")
	}
	if got := e.deliver(); len(got) != 0 {
		t.Fatalf("ULP got %v (its SEND was unsignaled)", got)
	}
	if err, ok := e.released(a); !ok || err != nil {
		t.Fatalf("after completion: released=%v err=%v", ok, err)
	}
	if inf := e.p.slots[0].mr.Query(); inf.State != transport.MRValid || inf.Key != k2 {
		t.Fatalf("after both: %+v", inf)
	}
	e.noViolations()
	if st := e.p.Stats(); st.InvalidationsLocal != 1 || st.Invalidating != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestBatchedInvalidateNeedsFlush(t *testing.T) {
	e := newEnv(t, Config{NumMRs: 2, BatchInvalidates: true})
	a, b := e.get(0, 1), e.get(1, 1)
	if err := e.p.Post(&Chain{Reg: []*Reg{a, b}}); err != nil {
		t.Fatal(err)
	}
	e.execAll()
	if err := e.p.Post(&Chain{Inv: []*Reg{a, b}}); err != nil {
		t.Fatal(err)
	}
	e.execAll()
	e.deliver()
	if len(e.back) != 0 {
		t.Fatal("unsignaled LOCAL_INVs confirmed without a completion")
	}
	if err := e.p.Flush(); err != nil {
		t.Fatal(err)
	}
	if st := e.p.Stats(); st.Sentinels != 1 {
		t.Fatalf("stats %+v", st)
	}
	if err := e.p.Flush(); err != nil || e.p.Stats().Sentinels != 1 {
		t.Fatalf("second flush posted another sentinel: %v", err)
	}
	e.execAll()
	e.deliver()
	if len(e.back) != 2 {
		t.Fatalf("released %d", len(e.back))
	}
	// A signaled ULP SEND posted after LOCAL_INVs retires them without a sentinel.
	c := e.get(2, 1)
	_ = e.p.Register(c)
	_ = e.p.Invalidate(c)
	_ = e.p.Post(&Chain{WRs: []transport.SendWR{{ID: 9, Opcode: transport.WRSend, Flags: transport.SendSignaled}}})
	if err := e.p.Flush(); err != nil || e.p.Stats().Sentinels != 1 {
		t.Fatalf("flush posted a sentinel although a signaled WR covers the LOCAL_INV: %v", err)
	}
	e.execAll()
	got := e.deliver()
	if len(got) != 1 || got[0].ID != 9 {
		t.Fatalf("ULP completions %+v", got)
	}
	if _, ok := e.released(c); !ok {
		t.Fatal("LOCAL_INV not retired by the later signaled SEND")
	}
	e.noViolations()
}

func TestKeyWrapAndLiveKeysSkipped(t *testing.T) {
	e := newEnv(t, Config{NumMRs: 1, SQDepth: 1024})
	s := &e.p.slots[0]
	var keys []uint32
	// 255 registrations whose invalidations stay unconfirmed: their keys are all "maybe live".
	for i := 0; i < 255; i++ {
		r := e.registered(0, 1)
		if err := e.p.Invalidate(r); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, r.RKey())
	}
	seen := map[uint32]bool{}
	for _, k := range keys {
		if seen[k] {
			t.Fatalf("key %#x reused while possibly live", k)
		}
		seen[k] = true
	}
	if e.p.Stats().KeyWraps != 1 {
		t.Fatalf("wraps %d", e.p.Stats().KeyWraps)
	}
	// One byte is left (the MR's initial key byte, never registered); then the key space is full.
	r := e.registered(0, 1)
	if uint8(r.RKey()) != uint8(s.mr.RKey()) {
		t.Fatalf("last free byte: %#x, initial %#x", r.RKey(), s.mr.RKey())
	}
	if err := e.p.Invalidate(r); err != nil {
		t.Fatal(err)
	}
	before := e.p.Stats()
	if _, err := e.p.TryGet(e.buf(0, 1), e); !errors.Is(err, ErrKeySpace) {
		t.Fatalf("expected ErrKeySpace, got %v", err)
	}
	if after := e.p.Stats(); after != before {
		t.Fatalf("failed get changed stats: %+v → %+v", before, after)
	}
	// Confirm them: execution plus the one signaled completion (the last LOCAL_INV is signaled).
	e.execAll()
	e.deliver()
	if e.p.Stats().Invalidating != 0 {
		t.Fatalf("%+v", e.p.Stats())
	}
	r2 := e.registered(0, 1)
	e.noViolations()
	// 600 more registrations with prompt confirmation: keys cycle mod 256.
	prev := r2.RKey()
	for i := 0; i < 600; i++ {
		_ = e.p.Invalidate(r2)
		r2 = e.registered(0, 1)
		if want := prev&^0xff | (prev+1)&0xff; r2.RKey() != want {
			t.Fatalf("key %#x after %#x", r2.RKey(), prev)
		}
		prev = r2.RKey()
		e.execAll()
		e.deliver()
	}
	if w := e.p.Stats().KeyWraps; w < 3 {
		t.Fatalf("wraps %d", w)
	}
	e.noViolations()
}

func TestPostFailureRollsBack(t *testing.T) {
	e := newEnv(t, Config{NumMRs: 2})
	a := e.get(0, 1)
	_ = e.p.Register(a)
	e.execAll()
	b := e.get(1, 2)
	snap := func() string {
		return (&frAdapter{p: e.p}).snapshot().(frSnapshot).keys + (&frAdapter{p: e.p}).snapshot().(frSnapshot).state
	}
	before, beforeStats, tail := snap(), e.p.Stats(), e.p.t.tail
	wantByte, keyB := b.slot.keyByte+1, b.RKey()
	e.qp.failPost = transport.ErrSQFull
	err := e.p.Post(&Chain{Reg: []*Reg{b}, WRs: []transport.SendWR{{ID: 1, Opcode: transport.WRSend}}, Inv: []*Reg{a}})
	if !errors.Is(err, ErrSQFull) || !errors.Is(err, transport.ErrSQFull) {
		t.Fatalf("err %v", err)
	}
	if snap() != before || e.p.Stats() != beforeStats || e.p.t.tail != tail || b.RKey() != keyB || a.state != regPosted {
		t.Fatalf("state changed by a failed post:\n%s\n%s", before, snap())
	}
	// The same chain then succeeds, with the key the failed attempt would have used.
	if err := e.p.Post(&Chain{Reg: []*Reg{b}, WRs: []transport.SendWR{{ID: 1, Opcode: transport.WRSend}}, Inv: []*Reg{a}}); err != nil {
		t.Fatal(err)
	}
	if uint8(b.RKey()) != wantByte {
		t.Fatalf("key byte %#x, want %#x", uint8(b.RKey()), wantByte)
	}
	e.execAll()
	e.deliver()
	if _, ok := e.released(a); !ok {
		t.Fatal("a not released")
	}
	e.noViolations()
}

func TestSQReservation(t *testing.T) {
	e := newEnv(t, Config{NumMRs: 4, SQDepth: 4})
	// 4 slots: one is kept for the sentinel, so a chain of 4 never fits and 3 does.
	r := []*Reg{e.get(0, 1), e.get(1, 1), e.get(2, 1), e.get(3, 1)}
	if err := e.p.Post(&Chain{Reg: r}); !errors.Is(err, ErrSQFull) {
		t.Fatalf("err %v", err)
	}
	if e.qp.posted != 0 {
		t.Fatal("something was posted")
	}
	if err := e.p.Post(&Chain{Reg: r[:3]}); err != nil {
		t.Fatal(err)
	}
	if err := e.p.Register(r[3]); !errors.Is(err, ErrSQFull) {
		t.Fatalf("err %v", err)
	}
	// Executed but not retired: the slots stay taken until a completion retires them.
	e.execAll()
	if err := e.p.Register(r[3]); !errors.Is(err, ErrSQFull) {
		t.Fatalf("err %v", err)
	}
	if err := e.p.Sync(); err != nil { // the sentinel slot
		t.Fatal(err)
	}
	e.execAll()
	e.deliver()
	if err := e.p.Register(r[3]); err != nil {
		t.Fatal(err)
	}
}

func TestSignalIntervalSwallowsForcedCompletions(t *testing.T) {
	e := newEnv(t, Config{SQDepth: 16, SignalInterval: 3})
	for i := 1; i <= 20; i++ {
		if err := e.p.Post(&Chain{WRs: []transport.SendWR{{ID: uint64(i), Opcode: transport.WRSend}}}); err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
		if unc := e.p.t.uncovered(); unc > 3 {
			t.Fatalf("uncovered %d > interval", unc)
		}
		e.execAll()
		if got := e.deliver(); len(got) != 0 {
			t.Fatalf("ULP got forced completions %v", got)
		}
	}
	if e.p.t.outstanding() > 3 {
		t.Fatalf("outstanding %d", e.p.t.outstanding())
	}
}

func TestRemoteInvalidation(t *testing.T) {
	e := newEnv(t, Config{NumMRs: 1})
	a := e.get(0, 1)
	_ = e.p.Post(&Chain{Reg: []*Reg{a}, WRs: []transport.SendWR{{ID: 1, Opcode: transport.WRSend}}})
	e.execAll()
	ka := a.RKey()
	e.qp.remoteInvalidate(ka)
	wc, _ := e.qp.popRecv()
	if err := e.p.HandleRecvCompletion(&wc); err != nil {
		t.Fatal(err)
	}
	if err, ok := e.released(a); !ok || err != nil {
		t.Fatalf("released %v %v", ok, err)
	}
	st := e.p.Stats()
	if st.InvalidationsRemote != 1 || st.Free != 1 || st.InUse != 0 {
		t.Fatalf("%+v", st)
	}
	// The ULP gives the handle back with Invalidate: nothing is posted.
	posted := e.qp.posted
	if err := e.p.Invalidate(a); err != nil || e.qp.posted != posted {
		t.Fatalf("giving back a remotely invalidated handle: %v (posted %d)", err, e.qp.posted-posted)
	}
	if err := e.p.Invalidate(a); !errors.Is(err, ErrState) {
		t.Fatalf("second give-back: %v", err)
	}
	// The report above was the registration's one report: a second report of the same key is
	// a second SEND_WITH_INV, a peer error (TestRemoteInvalidationReportOrder: the same whichever
	// completion was polled first).
	if err := e.p.HandleRecvInvalidate(ka); !errors.Is(err, ErrRKeyMismatch) {
		t.Fatalf("second report: %v", err)
	}
	if err := e.p.HandleRecvInvalidate(0xFFFFFF00); !errors.Is(err, ErrUnknownRKey) {
		t.Fatalf("unknown: %v", err)
	}
	e.noViolations()
}

// TestRemoteInvalidationReportOrder replays, on the double, the interleaving that TestModelSoftroce
// hit about one run in four (1 MR, batched invalidations): a peer's SEND_WITH_INV of a live key
// races with the registration's own LOCAL_INV (both execute: rxe_invalidate_mr, and the double,
// accept a FREE MR whose key still matches), and the receive completion is polled either before
// or after the send completion that confirms the LOCAL_INV. Either way that is one legitimate
// report: no error, the buffer back exactly once, no quarantine. The peer then invalidates the
// same key again while the MR is still FREE with it; the next registration's REG_MR executes and
// the send queue drains before that receive completion is polled. That second report is a peer
// error in both orders (before, the pool accepted it silently if the first report had been
// polled first, and reported it otherwise): the MR is quarantined and, the send queue being
// empty, resolved at once, so the next registration goes back to its owner with ErrRKeyMismatch
// from inside HandleRecvCompletion. The model harness counted the peer's error only after that
// call returned and flagged the release as "an error although no error happened".
func TestRemoteInvalidationReportOrder(t *testing.T) {
	for _, recvFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "send completion first", true: "recv completion first"}[recvFirst], func(t *testing.T) {
			e := newEnv(t, Config{NumMRs: 1, BatchInvalidates: true})
			recv := func() error {
				t.Helper()
				wc, ok := e.qp.popRecv()
				if !ok {
					t.Fatal("no receive completion")
				}
				return e.p.HandleRecvCompletion(&wc)
			}
			a := e.registered(0, 1)
			e.execAll()
			ka := a.RKey()
			e.qp.remoteInvalidate(ka) // the peer's SEND_WITH_INV: a is VALID, accepted
			if err := e.p.Invalidate(a); err != nil {
				t.Fatal(err)
			}
			if err := e.p.Flush(); err != nil { // batched: a sentinel retires the LOCAL_INV
				t.Fatal(err)
			}
			e.execAll() // the LOCAL_INV finds the MR FREE with ka: accepted
			if recvFirst {
				if err := recv(); err != nil {
					t.Fatalf("report before the LOCAL_INV's completion: %v", err)
				}
				e.deliver()
			} else {
				e.deliver()
				if err, ok := e.released(a); !ok || err != nil {
					t.Fatalf("a not released by its LOCAL_INV's completion: %v %v", ok, err)
				}
				if err := recv(); err != nil {
					t.Fatalf("report after the LOCAL_INV's completion: %v", err)
				}
			}
			if err, ok := e.released(a); !ok || err != nil {
				t.Fatalf("a: released %v err %v", ok, err)
			}
			if st := e.p.Stats(); st.Errors != 0 || st.Quarantined != 0 || st.Free != 1 || st.Invalidating != 0 {
				t.Fatalf("after one report: %+v", st)
			}

			// The peer invalidates ka again; the MR is still FREE with ka, so the device accepts it.
			e.qp.remoteInvalidate(ka)
			if e.qp.state != transport.QPSRTS {
				t.Fatal("the double refused the second SEND_WITH_INV")
			}
			b := e.get(1, 1)
			kb := b.RKey()
			if kb == ka {
				t.Fatal("b got a's key")
			}
			if err := e.p.Post(&Chain{Reg: []*Reg{b}, WRs: []transport.SendWR{{ID: 7, Opcode: transport.WRSend, Flags: transport.SendSignaled}}}); err != nil {
				t.Fatal(err)
			}
			e.execAll()
			e.deliver()
			if st := e.p.Stats(); st.SQOutstanding != 0 {
				t.Fatalf("send queue not drained: %+v", st)
			}
			if _, ok := e.released(b); ok {
				t.Fatal("b released before the second report")
			}
			if err := recv(); !errors.Is(err, ErrRKeyMismatch) {
				t.Fatalf("second report of ka: %v", err)
			}
			// Resolved within the call: b was VALID, the MR was re-created, b is back with the error.
			if err, ok := e.released(b); !ok || !errors.Is(err, ErrRKeyMismatch) {
				t.Fatalf("b: released %v err %v", ok, err)
			}
			if _, ok := e.dev.remoteAccess(kb, e.buf(1, 1)[0].Addr, []byte{1}, true); ok {
				t.Fatal("b's key still valid after its release")
			}
			if st := e.p.Stats(); st.Errors != 1 || st.Quarantined != 0 || st.Free != 1 || st.InvalidationsRemote != map[bool]uint64{false: 0, true: 1}[recvFirst] {
				t.Fatalf("after the second report: %+v", st)
			}
			if err := e.p.Invalidate(b); err != nil { // give the handle back
				t.Fatal(err)
			}
			e.registered(2, 1)
			e.noViolations()
		})
	}
}

func TestRemoteInvalidationMismatchQuarantines(t *testing.T) {
	e := newEnv(t, Config{NumMRs: 1})
	a := e.get(0, 1)
	_ = e.p.Post(&Chain{Reg: []*Reg{a}, WRs: []transport.SendWR{{ID: 1, Opcode: transport.WRSend}}})
	e.execAll()
	if _, ok := e.dev.remoteAccess(a.RKey(), a.IOVA(), []byte{1}, true); !ok {
		t.Fatal("access through a valid key failed")
	}
	bogus := a.RKey()&^0xff | (a.RKey()+77)&0xff
	err := e.p.HandleRecvInvalidate(bogus)
	if !errors.Is(err, ErrRKeyMismatch) {
		t.Fatalf("err %v", err)
	}
	if st := e.p.Stats(); st.Quarantined != 1 || st.Errors != 1 {
		t.Fatalf("%+v", st)
	}
	if err := e.p.Invalidate(a); !errors.Is(err, ErrQuarantined) {
		t.Fatalf("invalidate of a quarantined MR: %v", err)
	}
	if _, err := e.p.TryGet(e.buf(1, 1), e); !errors.Is(err, ErrExhausted) {
		t.Fatalf("get: %v", err)
	}
	// The pool posted a sentinel to drain the SQ past the quarantine point; once it completes the
	// MR is resolved: still VALID on the device, so it is re-created, and a is handed back.
	e.execAll()
	e.deliver()
	err, ok := e.released(a)
	if !ok || !errors.Is(err, ErrRKeyMismatch) {
		t.Fatalf("released %v %v", ok, err)
	}
	if st := e.p.Stats(); st.Quarantined != 0 || st.Free != 1 {
		t.Fatalf("%+v", st)
	}
	if _, ok := e.dev.remoteAccess(e.keys[a], e.buf(0, 1)[0].Addr, []byte{1}, true); ok {
		t.Fatal("old key still valid after re-creation")
	}
	e.registered(1, 1)
	e.noViolations()
}

// TestQPErrorLogging: a QP error is routine for the pool (every channel failure is one) and is
// logged at Debug when the pool learns of it from flushed completions or out of band, Info for an
// error status from the wire, Warn only when a work request failed its local checks; the
// "recovered" line names the QP once (the new one, with the old one beside it).
func TestQPErrorLogging(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cause func(e *env)
		want  zapcore.Level
	}{
		{"flushed", func(e *env) { e.qp.setError() }, zapcore.DebugLevel},
		{"out of band", func(e *env) { e.p.HandleQPError(nil) }, zapcore.DebugLevel},
		{"remote access error", func(e *env) {
			// The double's QP has no peer memory: an RDMA WRITE with data completes with
			// REM_ACCESS_ERR, as a NAK from the responder would.
			wr := transport.SendWR{ID: 9, Opcode: transport.WRRDMAWrite, RKey: 0x1234, RemoteAddr: 4096,
				SGL: []transport.SGE{{Addr: e.mem.Addr(), Length: 8}}}
			_ = e.p.Post(&Chain{WRs: []transport.SendWR{wr}})
		}, zapcore.InfoLevel},
		{"local protection error", func(e *env) {
			wr := transport.SendWR{ID: 9, Opcode: transport.WRSend, SGL: []transport.SGE{{Addr: e.mem.Addr(), Length: 8, LKey: 0xdead00}}}
			_ = e.p.Post(&Chain{WRs: []transport.SendWR{wr}})
		}, zapcore.WarnLevel},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Config{NumMRs: 1})
			e.registered(0, 1)
			tc.cause(e)
			e.execAll()
			e.deliver()
			logs := e.logs.FilterMessage("QP error: MRs quarantined").All()
			if len(logs) != 1 {
				t.Fatalf("QP error logged %d times", len(logs))
			}
			if logs[0].Level != tc.want {
				t.Fatalf("QP error (%v) logged at %v, want %v", logs[0].ContextMap()["error"], logs[0].Level, tc.want)
			}
			e.qp.reset()
			q2 := newFakeQP(e.pd, 32, 2)
			q2.qpn = 0x22
			if err := e.p.Recover(q2); err != nil {
				t.Fatal(err)
			}
			rec := e.logs.FilterMessage("recovered").All()
			if len(rec) != 1 {
				t.Fatalf("recovered logged %d times", len(rec))
			}
			var qpns []any
			for _, f := range rec[0].Context {
				if f.Key == "qpn" {
					qpns = append(qpns, f.Integer)
				}
			}
			if len(qpns) != 1 || qpns[0] != int64(0x22) || rec[0].ContextMap()["old_qpn"] != uint32(0x11) {
				t.Fatalf("recovered: qpn fields %v, context %v", qpns, rec[0].ContextMap())
			}
		})
	}
}

func TestQPErrorQuarantineAndRecover(t *testing.T) {
	e := newEnv(t, Config{NumMRs: 4})
	// a: valid (executed); b: LOCAL_INV executed, unconfirmed; c: LOCAL_INV posted, not executed;
	// d: mapped only.
	a, b, c, d := e.get(0, 1), e.get(1, 1), e.get(2, 1), e.get(3, 1)
	_ = e.p.Post(&Chain{Reg: []*Reg{a, b, c}})
	_ = e.p.Post(&Chain{Inv: []*Reg{b}})
	e.execAll()
	_ = e.p.Post(&Chain{Inv: []*Reg{c}})
	e.qp.setError()
	if got := e.deliver(); len(got) != 0 {
		t.Fatalf("ULP got %v", got)
	}
	// b's LOCAL_INV executed and its completion arrived (success); c's was flushed.
	if err, ok := e.released(b); !ok || err != nil {
		t.Fatalf("b: %v %v", ok, err)
	}
	for _, r := range []*Reg{a, c} {
		if err, ok := e.released(r); !ok || !errors.Is(err, ErrQPError) {
			t.Fatalf("%v: released %v err %v", r.RKey(), ok, err)
		}
	}
	if _, err := e.p.TryGet(e.buf(4, 1), e); !errors.Is(err, ErrQPError) {
		t.Fatalf("get in error: %v", err)
	}
	if err := e.p.Register(d); !errors.Is(err, ErrQPError) {
		t.Fatalf("post in error: %v", err)
	}
	for i, k := range []uint32{e.keys[a], e.keys[c]} {
		if _, ok := e.dev.remoteAccess(k, e.buf(2*i, 1)[0].Addr, []byte{1}, true); ok {
			t.Fatal("key valid after teardown")
		}
	}
	if len(e.logs.FilterMessage("QP error: MRs quarantined").All()) != 1 {
		t.Fatal("QP error not logged")
	}
	e.qp.reset()
	if err := e.p.Recover(e.qp); err != nil {
		t.Fatal(err)
	}
	if err := e.p.Close(); !errors.Is(err, ErrBusy) {
		t.Fatalf("close with handles not given back: %v", err)
	}
	// a was torn down without an Invalidate of the ULP: give its handle back (c's LOCAL_INV was
	// posted, so c's handle is already the pool's).
	if err := e.p.Invalidate(a); err != nil {
		t.Fatalf("give back: %v", err)
	}
	if err := e.p.Invalidate(c); !errors.Is(err, ErrState) {
		t.Fatalf("c given back twice: %v", err)
	}
	if err := e.p.Register(d); err != nil {
		t.Fatalf("d after recovery: %v", err)
	}
	_ = e.p.Invalidate(d)
	e.execAll()
	e.deliver()
	st := e.p.Stats()
	if st.Free != 4 || st.Quarantined != 0 || st.InUse != 0 || st.Invalidating != 0 {
		t.Fatalf("%+v", st)
	}
	if err := e.p.Close(); err != nil {
		t.Fatal(err)
	}
	e.noViolations()
}

// TestRecreateFailureLeavesDeadMR: a quarantined MR that is still VALID is deregistered; if the
// new allocation fails the slot is dead (no leak, no reuse of the old key) until Recover succeeds.
func TestRecreateFailureLeavesDeadMR(t *testing.T) {
	e := newEnv(t, Config{NumMRs: 1})
	a := e.get(0, 1)
	_ = e.p.Register(a)
	e.execAll()
	ka := a.RKey()
	e.dev.allocFail = 2
	e.qp.setError() // the send queue is empty: no completion will tell the pool
	e.deliver()
	if _, ok := e.released(a); ok {
		t.Fatal("released without any news of the error")
	}
	e.p.HandleQPError(errors.New("async event: QP fatal"))
	if err, ok := e.released(a); !ok || !errors.Is(err, ErrQPError) {
		t.Fatalf("a: %v %v", ok, err)
	}
	if st := e.p.Stats(); st.Dead != 1 || st.Errors < 2 {
		t.Fatalf("%+v", st)
	}
	if _, ok := e.dev.remoteAccess(ka, e.buf(0, 1)[0].Addr, []byte{1}, true); ok {
		t.Fatal("old key valid")
	}
	_ = e.p.Invalidate(a)
	e.qp.reset()
	if err := e.p.Recover(e.qp); !errors.Is(err, transport.ErrNoResources) {
		t.Fatalf("recover with allocation failing: %v", err)
	}
	if _, err := e.p.TryGet(e.buf(0, 1), e); !errors.Is(err, ErrExhausted) {
		t.Fatalf("get with the only MR dead: %v", err)
	}
	if err := e.p.Recover(e.qp); err != nil {
		t.Fatal(err)
	}
	if st := e.p.Stats(); st.Dead != 0 || st.Free != 1 {
		t.Fatalf("%+v", st)
	}
	e.registered(1, 1)
	e.noViolations()
}

func TestRecoverWithoutDrainingCompletions(t *testing.T) {
	e := newEnv(t, Config{NumMRs: 2})
	a := e.get(0, 1)
	_ = e.p.Register(a)
	_ = e.p.Post(&Chain{WRs: []transport.SendWR{{ID: 5, Opcode: transport.WRSend, Flags: transport.SendSignaled}}})
	e.execAll()
	wc, _ := e.qp.popSend() // the SEND's completion, polled after the reset
	e.qp.setError()
	e.qp.reset() // the flushes are discarded
	if err := e.p.Recover(e.qp); err != nil {
		t.Fatal(err)
	}
	if err, ok := e.released(a); !ok || !errors.Is(err, ErrQPError) {
		t.Fatalf("a: %v %v", ok, err)
	}
	if _, err := e.p.HandleSendCompletion(&wc); !errors.Is(err, ErrStaleCompletion) {
		t.Fatalf("stale: %v", err)
	}
	if st := e.p.Stats(); st.Free != 2 || st.SQOutstanding != 0 {
		t.Fatalf("%+v", st)
	}
	e.noViolations()
}

func TestGetWaitsAndTimesOut(t *testing.T) {
	e := newEnv(t, Config{NumMRs: 1})
	a := e.get(0, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := e.p.Get(ctx, e.buf(1, 1), e); !errors.Is(err, ErrExhausted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v", err)
	}
	if st := e.p.Stats(); st.Waits != 1 {
		t.Fatalf("%+v", st)
	}
	// A waiter is woken when the MR becomes reusable (LOCAL_INV posted), before it is confirmed.
	done := make(chan *Reg)
	go func() {
		r, err := e.p.Get(context.Background(), e.buf(1, 1), e)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	for e.p.Stats().Waiting == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := e.p.Register(a); err != nil {
		t.Fatal(err)
	}
	if err := e.p.Invalidate(a); err != nil {
		t.Fatal(err)
	}
	b := <-done
	if b.slot != a.slot && a.state == regInvalidating {
		t.Fatal("waiter got another MR")
	}
	if _, ok := e.released(a); ok {
		t.Fatal("a released early")
	}
	// Close wakes waiters with ErrClosed (after the outstanding work is done).
	_ = e.p.Cancel(b)
	e.execAll()
	e.deliver()
	if err := e.p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Get(context.Background(), e.buf(1, 1), e); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}

func TestCloseBusy(t *testing.T) {
	e := newEnv(t, Config{NumMRs: 1})
	a := e.get(0, 1)
	if err := e.p.Close(); !errors.Is(err, ErrBusy) {
		t.Fatalf("close with a handle out: %v", err)
	}
	_ = e.p.Cancel(a)
	if err := e.p.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestMapping(t *testing.T) {
	ps := uint64(fakePage)
	for _, tc := range []struct {
		segs  []Seg
		pages int
		ok    bool
	}{
		{[]Seg{{0x10000, 1}}, 1, true},
		{[]Seg{{0x10FFF, 2}}, 2, true},                         // straddles a page boundary
		{[]Seg{{0x10800, 0x800}, {0x20000, 0x1000}}, 2, true},  // gap between pages is fine
		{[]Seg{{0x10800, 0x700}, {0x20000, 0x1000}}, 0, false}, // first does not end on a page
		{[]Seg{{0x10000, 0x1000}, {0x20010, 0x10}}, 0, false},  // second does not start on a page
		{[]Seg{{0x10000, 5 * 0x1000}}, 0, false},               // too many pages
		{nil, 0, false},
		{[]Seg{{0x10000, 0}}, 0, false},
	} {
		n, _, err := mapSegs(tc.segs, ps, 4)
		if (err == nil) != tc.ok || n != tc.pages {
			t.Errorf("%v: %d pages, %v", tc.segs, n, err)
		}
	}
}

func TestForeignCompletion(t *testing.T) {
	e := newEnv(t, Config{})
	wc := transport.WC{ID: 12}
	if _, err := e.p.HandleSendCompletion(&wc); !errors.Is(err, ErrForeignWR) {
		t.Fatalf("err %v", err)
	}
}

// TestNoAllocSteadyState: Get, Post (REG_MR + SEND), completion handling and Invalidate do not
// allocate once warmed up.
func TestNoAllocSteadyState(t *testing.T) {
	e := newEnv(t, Config{NumMRs: 2, SQDepth: 64})
	segs := e.buf(0, 2)
	var chain Chain
	regs := make([]*Reg, 1)
	wrs := []transport.SendWR{{ID: 1, Opcode: transport.WRSend, Flags: transport.SendSignaled}}
	step := func() {
		r, err := e.p.TryGet(segs, nopOwner{})
		if err != nil {
			t.Fatal(err)
		}
		regs[0] = r
		chain = Chain{Reg: regs, WRs: wrs}
		if err := e.p.Post(&chain); err != nil {
			t.Fatal(err)
		}
		if err := e.p.Invalidate(r); err != nil {
			t.Fatal(err)
		}
		e.drain(t)
	}
	for i := 0; i < 10; i++ {
		step()
	}
	if n := testing.AllocsPerRun(200, step); n != 0 {
		t.Fatalf("%v allocations per I/O", n)
	}
}

type nopOwner struct{}

func (nopOwner) BufferReleased(*Reg, error) {}
