package target

import (
	"net/netip"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/srpd/srpd/srp"
)

// TestRateLog: one line per source and cause per rejectLogInterval, the next one carrying how
// many were not logged; sources and causes are independent; a table full of fresh sources (a
// spoofed-address flood) logs nothing more until entries age out.
func TestRateLog(t *testing.T) {
	a := netip.MustParseAddr("127.0.0.7")
	b := netip.MustParseAddr("127.0.0.8")
	t0 := time.Unix(1000, 0)
	type step struct {
		addr       netip.Addr
		cause      RejectCause
		at         time.Duration
		ok         bool
		suppressed int
	}
	steps := []step{
		{a, CauseSessionLimit, 0, true, 0},
		{a, CauseSessionLimit, time.Second, false, 0},
		{a, CauseSessionLimit, 2 * time.Second, false, 0},
		{a, CauseMemoryBudget, 2 * time.Second, true, 0}, // another cause
		{b, CauseSessionLimit, 3 * time.Second, true, 0}, // another source
		{a, CauseSessionLimit, rejectLogInterval - time.Nanosecond, false, 0},
		{a, CauseSessionLimit, rejectLogInterval, true, 3},
		{a, CauseSessionLimit, rejectLogInterval + time.Second, false, 0},
		{a, CauseSessionLimit, 3 * rejectLogInterval, true, 1},
	}
	var r rateLog
	for i, s := range steps {
		ok, n := r.allow(s.addr, s.cause, t0.Add(s.at))
		if ok != s.ok || n != s.suppressed {
			t.Fatalf("step %d (%v %v at +%v): allow = %v, %d; want %v, %d", i, s.addr, s.cause, s.at, ok, n, s.ok, s.suppressed)
		}
	}

	// A full table: new sources are not logged while every entry is fresh...
	var f rateLog
	base := netip.MustParseAddr("10.0.0.0").As4()
	addr := func(i int) netip.Addr {
		v := base
		v[1], v[2], v[3] = byte(i>>16), byte(i>>8), byte(i)
		return netip.AddrFrom4(v)
	}
	for i := range maxSources {
		if ok, _ := f.allow(addr(i), CauseSessionLimit, t0); !ok {
			t.Fatalf("source %d of %d not logged", i, maxSources)
		}
	}
	if ok, _ := f.allow(addr(maxSources), CauseSessionLimit, t0.Add(time.Second)); ok {
		t.Fatal("a source beyond the full table was logged")
	}
	if len(f.last) > maxSources {
		t.Fatalf("table grew to %d entries, bound %d", len(f.last), maxSources)
	}
	// ...and are again once the old entries have aged out.
	if ok, _ := f.allow(addr(maxSources), CauseSessionLimit, t0.Add(rejectLogInterval)); !ok {
		t.Fatal("a new source was not logged after the table aged out")
	}
	if len(f.last) != 1 {
		t.Fatalf("%d entries after aging out, want 1", len(f.last))
	}
}

// TestLoginRejectLogged: a burst of rejected logins from one source is logged once, counted
// in full (Stats.LoginsRejected and Rejects by cause), and the established session is
// untouched.
func TestLoginRejectLogged(t *testing.T) {
	e := newEnv(t, envOpts{limits: Limits{QueueDepth: 4, MaxTransfer: 64 << 10, MaxSessions: 1}, defACL: anyACL})
	core, logs := observer.New(zapcore.InfoLevel)
	e.tgt.log = zap.New(core)
	info := ConnInfo{Remote: netip.MustParseAddrPort("127.0.0.9:1234")}
	pc, d, err := e.tgt.Login(e.tdev, loginAs(1), info)
	if err != nil || !d.Accepted {
		t.Fatalf("first login: %v %+v", err, d)
	}
	defer pc.Abort()
	const burst = 20
	for i := range burst {
		_, d, _ := e.tgt.Login(e.tdev, loginAs(uint64(2+i)), info)
		if d.Accepted || d.Cause != CauseSessionLimit || d.Rej.Reason != srp.RejInsufficientResources {
			t.Fatalf("login %d over the limit: %+v", i, d)
		}
	}
	rej := logs.FilterMessage("login rejected").All()
	if len(rej) != 1 {
		t.Fatalf("%d 'login rejected' lines for a burst of %d from one source, want 1", len(rej), burst)
	}
	if c := rej[0].ContextMap()["cause"]; c != CauseSessionLimit.String() {
		t.Fatalf("logged cause %v, want %v", c, CauseSessionLimit)
	}
	st := e.tgt.Stats()
	if st.LoginsRejected != burst || st.Rejects[CauseSessionLimit] != burst {
		t.Fatalf("counted %d rejected (%d session limit), want %d", st.LoginsRejected, st.Rejects[CauseSessionLimit], burst)
	}
	if st.Sessions != 1 {
		t.Fatalf("%d sessions after the burst, want the established one", st.Sessions)
	}
}
