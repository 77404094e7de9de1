package target

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// forgedReq is a connection request whose initiator never sends the RTU: Accept waits until
// its context ends (as softroce's Accept does while it resends the REP).
type forgedReq struct {
	pd       []byte
	info     transport.ConnRequestInfo
	rejected atomic.Bool
	gaveUp   chan struct{}
}

func (r *forgedReq) PrivateData() []byte             { return r.pd }
func (r *forgedReq) Info() transport.ConnRequestInfo { return r.info }
func (r *forgedReq) MRA(uint8, []byte) error         { return nil }
func (r *forgedReq) Reject([]byte, transport.RejectReason) error {
	r.rejected.Store(true)
	close(r.gaveUp)
	return nil
}
func (r *forgedReq) Accept(ctx context.Context, _ transport.QP, _ []byte, _ transport.ConnParam) (transport.CMConn, error) {
	<-ctx.Done()
	close(r.gaveUp)
	return nil, ctx.Err()
}

func loginPD(r srp.LoginReq) []byte {
	b := make([]byte, srp.LoginReqRDMALen)
	r.EncodeRDMA(b)
	return b
}

// serveLoginFrom is serveLogin from another source address, timed.
func (e *env) serveLoginFrom(ln *fakeListener, req srp.LoginReq, src string) (*tini, fakeOutcome, time.Duration) {
	e.t.Helper()
	in := e.newIni()
	in.login = req
	r := &fakeReq{e: e, in: in, pd: loginPD(req), result: make(chan fakeOutcome, 1),
		info: transport.ConnRequestInfo{RemoteAddr: netip.MustParseAddrPort(src),
			InitiatorDepth: 4, RNRRetryCount: 7, FlowControl: true}}
	t0 := time.Now()
	ln.reqs <- r
	select {
	case o := <-r.result:
		return in, o, time.Since(t0)
	case <-time.After(waitLong):
		e.t.Fatal("no answer to the connection request")
	}
	return nil, fakeOutcome{}, 0
}

// TestForgedLoginFlood is the login-slot finding: connection requests whose RTU never comes
// (a burst of 400 from one address and from ten, then 70 every half second) must not keep
// legitimate logins out — from another address or from the attacker's own — and each of
// those logins is answered within 2 s (main at 7251021 held 64 slots for 30 s each, and 4 of 4
// legitimate logins failed). Established sessions keep working, and the pending logins
// stay within the budget's bound.
func TestForgedLoginFlood(t *testing.T) {
	e := newEnv(t, envOpts{limits: Limits{QueueDepth: 4, MaxTransfer: 64 << 10}, defACL: anyACL})
	ln := &fakeListener{reqs: make(chan transport.ConnRequest, 1024)}
	go func() { _ = e.tgt.Serve(e.ctx, ln, e.tdev) }()
	var forged []*forgedReq
	var seq atomic.Uint64
	forge := func(src string) {
		r := &forgedReq{pd: loginPD(loginAs(1000 + seq.Add(1))), gaveUp: make(chan struct{}),
			info: transport.ConnRequestInfo{RemoteAddr: netip.MustParseAddrPort(src), InitiatorDepth: 4}}
		forged = append(forged, r)
		ln.reqs <- r
	}
	var legit []*tini
	login := func(what string, n uint64, src string) {
		in, o, took := e.serveLoginFrom(ln, loginAs(n), src)
		if !o.accepted {
			t.Fatalf("%s: legitimate login from %s rejected", what, src)
		}
		if took > 2*time.Second {
			t.Fatalf("%s: legitimate login from %s took %v", what, src, took)
		}
		legit = append(legit, in)
	}
	// A burst of 400: 200 from the address a legitimate initiator also uses, 200 from ten others.
	for i := 0; i < 200; i++ {
		forge("127.0.0.9:4791")
		forge(fmt.Sprintf("127.0.1.%d:4791", 1+i%10))
	}
	login("after the burst", 1, "127.0.0.2:40000")
	login("after the burst, attacker's address", 2, "127.0.0.9:40001")
	// A steady 70 every half second, with logins in between.
	for round := 0; round < 4; round++ {
		for i := 0; i < 70; i++ {
			forge(fmt.Sprintf("127.0.2.%d:4791", 1+i%7))
		}
		login(fmt.Sprintf("round %d", round), uint64(10+round), "127.0.0.2:40000")
		time.Sleep(500 * time.Millisecond)
	}
	if u := e.tgt.budget.Usage(); u.PendingLogins > DefaultMaxPendingLogins || u.Evicted == 0 {
		t.Fatalf("budget: %+v", u)
	}
	waitFor(t, func() bool { return e.tgt.Stats().Channels == int64(len(legit)) })
	for i, in := range legit {
		in.clearUA(0)
		if r, _ := in.simple(0, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, 0); r.Status() != 0 {
			t.Fatalf("session %d: TEST UNIT READY status %#x", i, r.Status())
		}
	}
	st := e.tgt.Stats()
	t.Logf("%d forged requests: %d logins unfinished, %d rejected; budget %+v", len(forged), st.LoginsUnfinished,
		st.LoginsRejected, e.tgt.budget.Usage())
}

// TestSessionLimits: a target's MaxSessions and a shared Budget's session and per-initiator
// bounds reject logins with "insufficient resources" (CauseSessionLimit) without touching the
// sessions that exist; a SINGLE login that replaces its initiator's session is not a new
// session; a slot comes back when its session ends.
func TestSessionLimits(t *testing.T) {
	b := NewBudget(BudgetConfig{MaxSessions: 3, MaxSessionsPerInitiator: 1})
	e := newEnv(t, envOpts{limits: Limits{QueueDepth: 4, MaxTransfer: 64 << 10, MaxSessions: 2}, defACL: anyACL})
	e.tgt.budget = b
	login := func(tgt *Target, n uint64) (*PendingChannel, LoginDecision) {
		req := loginAs(n)
		req.TargetPortID = tgt.PortID()
		pc, d, _ := tgt.Login(e.tdev, req, ConnInfo{})
		return pc, d
	}
	p1, d := login(e.tgt, 1)
	p2, d2 := login(e.tgt, 2)
	if !d.Accepted || !d2.Accepted {
		t.Fatal("logins under the limit rejected")
	}
	if _, d := login(e.tgt, 3); d.Accepted || d.Cause != CauseSessionLimit || d.Rej.Reason != srp.RejInsufficientResources {
		t.Fatalf("third session: %+v", d)
	}
	// The same initiator again (SINGLE): takes over its session's slot.
	p1b, d := login(e.tgt, 1)
	if !d.Accepted {
		t.Fatalf("SINGLE re-login of an existing initiator rejected: %v", d.Cause)
	}
	// Another target sharing the budget: initiator 2 already has its one session.
	t2, err := New(Config{Name: "t1", PortID: srp.MakePortID(9, 9), DefaultACL: anyACL(e.luns), Budget: b,
		Limits: Limits{QueueDepth: 4, MaxTransfer: 64 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	defer t2.Close(context.Background())
	if _, d := login(t2, 2); d.Accepted || d.Cause != CauseSessionLimit {
		t.Fatalf("second session of one initiator: %+v", d)
	}
	p4, d := login(t2, 4)
	if !d.Accepted {
		t.Fatalf("third session in the budget: %v", d.Cause)
	}
	if _, d := login(t2, 5); d.Accepted || d.Cause != CauseSessionLimit {
		t.Fatalf("fourth session in a budget of 3: %+v", d)
	}
	if u := b.Usage(); u.Sessions != 3 {
		t.Fatalf("budget sessions %d, want 3", u.Sessions)
	}
	p2.Abort()
	if _, d := login(t2, 5); !d.Accepted {
		t.Fatalf("a slot given back is not reused: %v", d.Cause)
	}
	for _, p := range []*PendingChannel{p1, p1b, p4} {
		p.Abort()
	}
}

// TestMemoryBudget: logins whose channels' registered memory would not fit the target's or
// the budget's bound are rejected (CauseMemoryBudget) before anything is allocated, and the
// reservation comes back when a channel goes.
func TestMemoryBudget(t *testing.T) {
	e := newEnv(t, envOpts{limits: Limits{QueueDepth: 4, MaxTransfer: 64 << 10}, defACL: anyACL})
	pc, d, err := e.tgt.Login(e.tdev, loginAs(1), ConnInfo{})
	if err != nil || !d.Accepted {
		t.Fatal(err)
	}
	per := e.tgt.budget.Usage().Memory
	if per <= 0 || per != e.tgt.Stats().MemoryBytes {
		t.Fatalf("reserved %d, registered %d", per, e.tgt.Stats().MemoryBytes)
	}
	pc.Abort()
	if u := e.tgt.budget.Usage(); u.Memory != 0 {
		t.Fatalf("memory reserved after abort: %d", u.Memory)
	}
	for _, c := range []struct {
		name string
		set  func()
	}{
		{"budget", func() { e.tgt.budget = NewBudget(BudgetConfig{MaxMemory: 2*per + per/2}) }},
		{"target", func() {
			e.tgt.budget = NewBudget(BudgetConfig{})
			l := e.tgt.Limits()
			l.MaxMemory = 2*per + per/2
			mustSetLimits(t, e.tgt, l)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.set()
			var pcs []*PendingChannel
			for i := 0; i < 2; i++ {
				pc, d, _ := e.tgt.Login(e.tdev, loginAs(uint64(10+i)), ConnInfo{})
				if !d.Accepted {
					t.Fatalf("login %d: %v", i, d.Cause)
				}
				pcs = append(pcs, pc)
			}
			before := e.tgt.Stats()
			_, d, _ := e.tgt.Login(e.tdev, loginAs(20), ConnInfo{})
			if d.Accepted || d.Cause != CauseMemoryBudget || d.Rej.Reason != srp.RejInsufficientResources {
				t.Fatalf("over budget: %+v", d)
			}
			if after := e.tgt.Stats(); after.MRs != before.MRs || after.MemoryBytes != before.MemoryBytes {
				t.Fatal("a rejected login allocated memory")
			}
			pcs[0].Abort()
			pc, d, _ := e.tgt.Login(e.tdev, loginAs(20), ConnInfo{})
			if !d.Accepted {
				t.Fatalf("after a channel went: %v", d.Cause)
			}
			pc.Abort()
			pcs[1].Abort()
			if e.tgt.memUsed != 0 || e.tgt.budget.Usage().Memory != 0 {
				t.Fatalf("left reserved: target %d, budget %d", e.tgt.memUsed, e.tgt.budget.Usage().Memory)
			}
		})
	}
	l := e.tgt.Limits()
	l.MaxMemory = 0
	mustSetLimits(t, e.tgt, l)
}

func mustSetLimits(t *testing.T, tg *Target, l Limits) {
	t.Helper()
	if err := tg.SetLimits(l); err != nil {
		t.Fatal(err)
	}
}

// TestAdmitRequest checks the pending-login table with a fake clock: the per-source rate,
// eviction of a source's oldest pending login at its bound, eviction from the busiest source
// at the total bound, the timeout that shrinks under pressure, and the table's bookkeeping.
func TestAdmitRequest(t *testing.T) {
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	b := NewBudget(BudgetConfig{MaxPendingLogins: 8, MaxPendingPerSource: 3, LoginRate: 10, LoginBurst: 5, LoginTimeout: 10 * time.Second})
	b.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	a := netip.MustParseAddr("10.0.0.1")
	type adm struct {
		ctx  context.Context
		done func()
	}
	// admit admits n requests from src (each must be); refuse checks that the next is not.
	admit := func(src netip.Addr, n int, what string) []adm {
		t.Helper()
		var as []adm
		for i := 0; i < n; i++ {
			ctx, done, ok := admitCtx(b, src)
			if !ok {
				t.Fatalf("%s: request %d refused", what, i)
			}
			as = append(as, adm{ctx, done})
		}
		return as
	}
	refuse := func(src netip.Addr, what string) {
		t.Helper()
		if _, _, ok := admitCtx(b, src); ok {
			t.Fatalf("%s: admitted", what)
		}
	}
	got := admit(a, 5, "within the burst")
	refuse(a, "over the burst")
	// Three pending at most: the first two were evicted, oldest first.
	for i, g := range got {
		if evicted := g.ctx.Err() != nil; evicted != (i < 2) {
			t.Fatalf("request %d evicted=%v", i, evicted)
		}
	}
	if u := b.Usage(); u.PendingLogins != 3 || u.Evicted != 2 || u.RateLimited != 1 {
		t.Fatalf("usage %+v", u)
	}
	advance(200 * time.Millisecond) // two tokens
	got = append(got, admit(a, 2, "refill")...)
	refuse(a, "beyond the refill")
	// Fill the table from other sources: the busiest (a, 3 pending) loses its oldest.
	var others []adm
	for i := 0; i < 5; i++ {
		others = append(others, admit(netip.AddrFrom4([4]byte{10, 0, 1, byte(i)}), 1, "another source")...)
	}
	if u := b.Usage(); u.PendingLogins != 8 {
		t.Fatalf("pending %d, want 8", u.PendingLogins)
	}
	for _, o := range others {
		if o.ctx.Err() != nil {
			t.Fatal("a source with one pending login was evicted")
		}
	}
	ctx, done, ok := admitCtx(b, netip.MustParseAddr("10.0.2.1"))
	if !ok {
		t.Fatal("a new source refused at the total bound")
	}
	if dl, _ := ctx.Deadline(); dl.Sub(time.Now()) > 2*time.Second {
		t.Fatalf("timeout under pressure %v, want ~1s", time.Until(dl))
	}
	// Evicted: 2 at the burst, 2 at the refill (a's bound), 1 from the busiest source now;
	// the shrunk timeout expired nothing (every pending login is younger than 1 s).
	if u := b.Usage(); u.PendingLogins != 8 || u.Evicted != 5 || u.RateLimited != 2 {
		t.Fatalf("usage %+v", u)
	}
	// Under pressure, pending logins older than the shrunk timeout expire at the next request.
	advance(1500 * time.Millisecond)
	ctx2, done2, ok := admitCtx(b, netip.MustParseAddr("10.0.2.2"))
	if !ok {
		t.Fatal("refused after expiry")
	}
	// All eight were older than 1 s: expired (evicted), leaving the new one.
	if u := b.Usage(); u.PendingLogins != 1 || u.Evicted != 5+8 {
		t.Fatalf("after expiry: %+v", u)
	}
	if ctx.Err() == nil || ctx2.Err() != nil {
		t.Fatal("expiry took the wrong pending logins")
	}
	done2()
	for _, o := range others {
		o.done()
	}
	done()
	for _, g := range got {
		g.done()
	}
	if u := b.Usage(); u.PendingLogins != 0 || len(b.sources[a].pending) != 0 {
		t.Fatalf("pending after every done: %+v", u)
	}
}

// TestForgedLoginsDoNotHoldMemory: half-open logins that fill the registered-memory budget
// (each forged request reserves a channel) are evicted to make room for a login that needs
// the memory, so it succeeds within 2 s instead of being rejected "insufficient resources"
// (found by test/hostile's REQ flood against srpd with the default budget).
func TestForgedLoginsDoNotHoldMemory(t *testing.T) {
	e := newEnv(t, envOpts{limits: Limits{QueueDepth: 4, MaxTransfer: 64 << 10}, defACL: anyACL})
	probe, d, _ := e.tgt.Login(e.tdev, loginAs(9999), ConnInfo{})
	if !d.Accepted {
		t.Fatal(d.Cause)
	}
	per := e.tgt.budget.Usage().Memory
	probe.Abort()
	e.tgt.budget = NewBudget(BudgetConfig{MaxMemory: 3 * per})
	ln := &fakeListener{reqs: make(chan transport.ConnRequest, 64)}
	go func() { _ = e.tgt.Serve(e.ctx, ln, e.tdev) }()
	var forged []*forgedReq
	for i := 0; i < 12; i++ {
		r := &forgedReq{pd: loginPD(loginAs(uint64(100 + i))), gaveUp: make(chan struct{}),
			info: transport.ConnRequestInfo{RemoteAddr: netip.MustParseAddrPort(fmt.Sprintf("127.0.3.%d:4791", 1+i%3)), InitiatorDepth: 4}}
		forged = append(forged, r)
		ln.reqs <- r
	}
	waitFor(t, func() bool { return e.tgt.budget.Usage().Memory == 3*per })
	for i := 0; i < 3; i++ {
		in, o, took := e.serveLoginFrom(ln, loginAs(uint64(1+i)), "127.0.0.2:40000")
		if !o.accepted || took > 2*time.Second {
			b := e.tgt.budget
			b.mu.Lock()
			for a, s := range b.sources {
				for _, p := range s.pending {
					t.Logf("pending %v mem %d evicted %v", a, p.mem, p.evicted)
				}
			}
			b.mu.Unlock()
			t.Fatalf("login %d with the budget held by half-open logins: accepted %v after %v; budget %+v, %d channels, rejects %v", i, o.accepted, took, b.Usage(), e.tgt.Stats().Channels, e.tgt.Stats().Rejects)
		}
		in.clearUA(0)
	}
	// Three established sessions now hold the whole budget: nothing evictable is left.
	_, o, _ := e.serveLoginFrom(ln, loginAs(50), "127.0.0.2:40000")
	if o.accepted {
		t.Fatal("a login beyond a budget held by established sessions was accepted")
	}
	if lr, err := srp.ParseLoginRej(o.priv); err != nil || lr.Reason() != srp.RejInsufficientResources {
		t.Fatalf("REJ %x: %v", o.priv, err)
	}
	if s := e.tgt.Stats(); s.Rejects[CauseMemoryBudget] == 0 {
		t.Fatal("memory rejections not counted")
	}
}

// admitCtx is Budget.admit without the pending login.
func admitCtx(b *Budget, src netip.Addr) (context.Context, func(), bool) {
	_, ctx, done, ok := b.admit(context.Background(), src)
	return ctx, done, ok
}
