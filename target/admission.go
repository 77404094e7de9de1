package target

import (
	"cmp"
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// Defaults of BudgetConfig's login controls (zero fields).
const (
	// DefaultMaxPendingLogins bounds the logins waiting for their RTU, in total.
	DefaultMaxPendingLogins = 256
	// DefaultMaxPendingPerSource bounds the logins of one source address waiting for their
	// RTU. A legitimate initiator has at most ch_count of them at once (ib_srp ≤ 256, usually
	// the number of CPUs).
	DefaultMaxPendingPerSource = 32
	// DefaultLoginRate is the connection requests per second one source address may send
	// (a token bucket of DefaultLoginBurst). ib_srp opens ch_count channels at once, then
	// nothing until a reconnect.
	DefaultLoginRate  = 50
	DefaultLoginBurst = 300
	// DefaultLoginTimeout bounds the wait for the RTU after our REP. The RTU follows the REP
	// by one round trip; ib_srpt has no bound of its own (the CM's REP retries, 15 × ~4 s).
	DefaultLoginTimeout = 10 * time.Second
	// minLoginTimeout is what the login timeout shrinks to under pressure (more than half
	// of the pending slots taken).
	minLoginTimeout = time.Second
	// maxSources bounds the per-source table; idle sources are forgotten first.
	maxSources = 4096
)

// BudgetConfig bounds what all the targets sharing a Budget (one daemon's) may hold. A zero
// count or size means no bound, except for the login controls, whose zero values select
// their defaults (a negative value turns one off).
type BudgetConfig struct {
	// MaxSessions is the most sessions (I_T nexuses) in total.
	MaxSessions int
	// MaxSessionsPerInitiator is the most sessions one initiator port may have, over all
	// targets.
	MaxSessionsPerInitiator int
	// MaxMemory is the most registered memory (bytes) the channels may hold in total: each
	// channel registers (queue depth + 1) × (max transfer + IU sizes). A login that does
	// not fit is rejected with "insufficient resources" before anything is allocated.
	MaxMemory int64
	// MaxPendingLogins bounds the logins waiting for their RTU (DefaultMaxPendingLogins).
	// When it is reached, a new connection request evicts the oldest pending login of the
	// source with the most of them, so that forged requests never hold the slots of other
	// sources.
	MaxPendingLogins int
	// MaxPendingPerSource bounds the pending logins of one source address
	// (DefaultMaxPendingPerSource); over it, the source's oldest pending login is evicted.
	MaxPendingPerSource int
	// LoginRate and LoginBurst are the per-source token bucket for connection requests
	// (DefaultLoginRate per second, DefaultLoginBurst). A request over it is rejected.
	LoginRate  float64
	LoginBurst int
	// LoginTimeout bounds the wait for the RTU (DefaultLoginTimeout); it shrinks to 1 s
	// while more than half of MaxPendingLogins are taken.
	LoginTimeout time.Duration
}

func (c BudgetConfig) withDefaults() BudgetConfig {
	c.MaxPendingLogins = cmp.Or(c.MaxPendingLogins, DefaultMaxPendingLogins)
	c.MaxPendingPerSource = cmp.Or(c.MaxPendingPerSource, DefaultMaxPendingPerSource)
	c.LoginRate = cmp.Or(c.LoginRate, DefaultLoginRate)
	c.LoginBurst = cmp.Or(c.LoginBurst, DefaultLoginBurst)
	positiveOr(&c.LoginTimeout, DefaultLoginTimeout)
	return c
}

// Budget is the resources several targets share: sessions, registered memory, and the
// connection requests waiting for their RTU, by source address. Safe for concurrent use. The
// zero value is not usable; see NewBudget.
type Budget struct {
	cfg BudgetConfig
	now func() time.Time

	mu           sync.Mutex
	sessions     int
	perInitiator map[srp.PortID]int
	memory       int64
	pending      int
	sources      map[netip.Addr]*source
	unrecorded   int // pending logins with memory reserved but not recorded yet (evictForMemory)

	stats budgetCounters
}

// source is one remote address's login state.
type source struct {
	tokens  float64
	last    time.Time
	pending []*pendingLogin // oldest first
}

// pendingLogin is an accepted connection request waiting for its RTU.
type pendingLogin struct {
	src     netip.Addr
	start   time.Time
	cancel  context.CancelFunc
	evicted bool
	// Memory: what its channel reserved (set by the login); whether an eviction handed that
	// to another login; and what evictions handed to this one, not yet used.
	mem        int64
	handedOff  bool
	credit     int64
	unrecorded bool // reserved by takeMemory, not yet recorded by setPendingMemory
}

// NewBudget returns a budget with cfg's bounds.
func NewBudget(cfg BudgetConfig) *Budget {
	return &Budget{cfg: cfg.withDefaults(), now: time.Now, perInitiator: map[srp.PortID]int{}, sources: map[netip.Addr]*source{}}
}

// Config is the budget's configuration with defaults filled in.
func (b *Budget) Config() BudgetConfig {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.cfg
}

// BudgetUsage is what a budget's holders hold now, and its counters.
type BudgetUsage struct {
	Sessions      int
	Memory        int64
	PendingLogins int
	// Evicted counts pending logins ended early to make room (per source, or globally).
	Evicted uint64
	// RateLimited counts connection requests rejected by the per-source rate.
	RateLimited uint64
	// TimedOut counts pending logins whose RTU did not come in time.
	TimedOut uint64
}

// Usage returns a snapshot.
func (b *Budget) Usage() BudgetUsage {
	b.mu.Lock()
	defer b.mu.Unlock()
	return BudgetUsage{Sessions: b.sessions, Memory: b.memory, PendingLogins: b.pending,
		Evicted: b.stats.evicted, RateLimited: b.stats.rateLimited, TimedOut: b.stats.timedOut}
}

type budgetCounters struct {
	evicted, rateLimited, timedOut uint64
}

// takeSession reserves a session of ini, or reports which bound stops it.
func (b *Budget) takeSession(ini srp.PortID) RejectCause {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cfg.MaxSessions > 0 && b.sessions >= b.cfg.MaxSessions {
		return CauseSessionLimit
	}
	if b.cfg.MaxSessionsPerInitiator > 0 && b.perInitiator[ini] >= b.cfg.MaxSessionsPerInitiator {
		return CauseSessionLimit
	}
	b.sessions++
	b.perInitiator[ini]++
	return CauseNone
}

func (b *Budget) putSession(ini srp.PortID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sessions--
	if b.perInitiator[ini]--; b.perInitiator[ini] <= 0 {
		delete(b.perInitiator, ini)
	}
}

// takeMemory reserves n bytes of registered memory for a login (pending login p, or nil):
// first from what evictions handed over to p, then from the bound.
func (b *Budget) takeMemory(n int64, p *pendingLogin) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p != nil && p.credit >= n {
		p.credit -= n // already counted in b.memory
	} else {
		if b.cfg.MaxMemory > 0 && b.memory+n > b.cfg.MaxMemory {
			return false
		}
		b.memory += n
	}
	if p != nil && !p.unrecorded {
		p.unrecorded = true
		b.unrecorded++
	}
	return true
}

// putMemory gives back n bytes reserved for the channel of pending login p (nil: a login
// without one, or nothing to hand over). If an eviction handed p's memory over to another
// login already, the budget keeps counting it: the evictor holds it now.
func (b *Budget) putMemory(n int64, p *pendingLogin) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p != nil {
		b.recordedLocked(p)
		handed := p.handedOff
		p.mem, p.handedOff = 0, false
		if handed {
			return
		}
	}
	b.memory -= n
}

// setPendingMemory records the memory a pending login's channel reserved.
func (b *Budget) setPendingMemory(p *pendingLogin, n int64) {
	b.mu.Lock()
	p.mem = n
	b.recordedLocked(p)
	b.mu.Unlock()
}

// unrecordedMemory reports whether some pending login has reserved memory that is not
// recorded (so not evictable) yet: its channel is being created right now.
func (b *Budget) unrecordedMemory() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.unrecorded > 0
}

// recordedLocked ends p's unrecorded reservation, if it has one.
func (b *Budget) recordedLocked(p *pendingLogin) {
	if p != nil && p.unrecorded {
		p.unrecorded = false
		b.unrecorded--
	}
}

// settle ends p's evictability once its connection is up: false if an eviction has handed
// its memory to another login meanwhile (the caller then drops the connection).
func (b *Budget) settle(p *pendingLogin) bool {
	if p == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if p.handedOff {
		return false
	}
	p.mem = 0
	return true
}

// evictForMemory makes room for pending login to (which needs n bytes of registered memory)
// when half-open logins hold the budget — a burst of forged requests reserves a channel each.
// It evicts pending logins holding memory, the oldest of the busiest source first, and hands
// their reservations to to at once, so that no other request can take the memory in
// between; it reports whether to got enough.
func (b *Budget) evictForMemory(n int64, to *pendingLogin) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for to.credit < n {
		// The busiest source's oldest pending login holding memory; among equally busy
		// sources the oldest (a real login settles within a round trip: it is the newest).
		var victim *pendingLogin
		best := 0
		for _, s := range b.sources {
			for _, p := range s.pending {
				if p != to && p.mem > 0 && !p.evicted {
					if len(s.pending) > best || (len(s.pending) == best && p.start.Before(victim.start)) {
						victim, best = p, len(s.pending)
					}
					break // the source's oldest holding memory
				}
			}
		}
		if victim == nil {
			break
		}
		to.credit += victim.mem
		victim.mem, victim.handedOff = 0, true
		b.evictLocked(victim)
	}
	return to.credit >= n
}

// admit decides whether a connection request from src may start a login: it takes a token of
// the source's rate, and a pending slot (evicting the oldest pending login of the source, or of
// the busiest source, when the bounds are reached). It returns the pending login (for its
// memory accounting), the context that bounds the wait for the RTU, and done, which must be
// called once the login has its RTU or failed.
func (b *Budget) admit(ctx context.Context, src netip.Addr) (_ *pendingLogin, actx context.Context, done func(), ok bool) {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.sources[src]
	if s == nil {
		if len(b.sources) >= maxSources {
			b.forgetIdleLocked(now)
		}
		s = &source{tokens: float64(b.cfg.LoginBurst), last: now}
		b.sources[src] = s
	}
	if b.cfg.LoginRate > 0 {
		s.tokens = min(float64(b.cfg.LoginBurst), s.tokens+now.Sub(s.last).Seconds()*b.cfg.LoginRate)
		s.last = now
		if s.tokens < 1 {
			b.stats.rateLimited++
			return nil, nil, nil, false
		}
		s.tokens--
	}
	timeout := b.cfg.LoginTimeout
	if b.cfg.MaxPendingLogins > 0 && 2*b.pending > b.cfg.MaxPendingLogins {
		timeout = min(timeout, minLoginTimeout)
		b.expireLocked(now, timeout)
	}
	if b.cfg.MaxPendingPerSource > 0 && len(s.pending) >= b.cfg.MaxPendingPerSource {
		b.evictLocked(s.pending[0])
	}
	if b.cfg.MaxPendingLogins > 0 && b.pending >= b.cfg.MaxPendingLogins {
		var busiest *source
		for _, o := range b.sources {
			if len(o.pending) > 0 && (busiest == nil || len(o.pending) > len(busiest.pending)) {
				busiest = o
			}
		}
		if busiest != nil {
			b.evictLocked(busiest.pending[0])
		}
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	p := &pendingLogin{src: src, start: now, cancel: cancel}
	s.pending = append(s.pending, p)
	b.pending++
	return p, actx, func() { b.finish(p, actx) }, true
}

// evictLocked ends a pending login early: its accept context is cancelled, and it leaves the
// tables at once (the login handler's done finds it gone).
func (b *Budget) evictLocked(p *pendingLogin) {
	if p.evicted {
		return
	}
	p.evicted = true
	p.cancel()
	b.removeLocked(p)
	b.stats.evicted++
}

// expireLocked evicts the pending logins older than timeout.
func (b *Budget) expireLocked(now time.Time, timeout time.Duration) {
	for _, s := range b.sources {
		for len(s.pending) > 0 && now.Sub(s.pending[0].start) >= timeout {
			b.evictLocked(s.pending[0])
		}
	}
}

func (b *Budget) removeLocked(p *pendingLogin) {
	s := b.sources[p.src]
	if s == nil {
		return
	}
	for i, q := range s.pending {
		if q == p {
			s.pending = append(s.pending[:i], s.pending[i+1:]...)
			b.pending--
			break
		}
	}
}

func (b *Budget) finish(p *pendingLogin, actx context.Context) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.memory -= p.credit // handed over, not used
	p.credit = 0
	b.recordedLocked(p)
	if !p.evicted {
		if actx.Err() == context.DeadlineExceeded {
			b.stats.timedOut++
		}
		p.evicted = true
		b.removeLocked(p)
	}
	p.cancel()
}

// forgetIdleLocked drops sources with nothing pending and a full bucket (they would start
// the same if seen again), then, if the table is still full, any without pending logins.
func (b *Budget) forgetIdleLocked(now time.Time) {
	for a, s := range b.sources {
		full := b.cfg.LoginRate <= 0 || s.tokens+now.Sub(s.last).Seconds()*b.cfg.LoginRate >= float64(b.cfg.LoginBurst)
		if len(s.pending) == 0 && full {
			delete(b.sources, a)
		}
	}
	if len(b.sources) < maxSources {
		return
	}
	for a, s := range b.sources {
		if len(s.pending) == 0 {
			delete(b.sources, a)
			if len(b.sources) < maxSources*3/4 {
				return
			}
		}
	}
}

// admitLocked reserves what a login needs: the registered memory of its channel and, when it
// opens a session, a session slot; bounded by the target's Limits and the shared Budget. It
// records the reservation in d. t.mu held.
func (t *Target) admitLocked(dev transport.Device, req *srp.LoginReq, d *LoginDecision, newSession bool, pl *pendingLogin) RejectCause {
	l, err := t.layout(dev.Attr(), d, dev.Name())
	if err != nil {
		return CauseNone // newChannel fails the same way and says why
	}
	n := int64(l.total)
	d.memNeed = n
	if t.limits().MaxMemory > 0 && t.memUsed+n > t.limits().MaxMemory {
		return CauseMemoryBudget
	}
	if newSession && t.limits().MaxSessions > 0 && t.nSess >= t.limits().MaxSessions {
		return CauseSessionLimit
	}
	if !t.budget.takeMemory(n, pl) {
		return CauseMemoryBudget
	}
	if newSession {
		if c := t.budget.takeSession(req.InitiatorPortID); c != CauseNone {
			t.budget.putMemory(n, nil)
			return c
		}
		t.nSess++
	}
	t.memUsed += n
	d.memory = n
	return CauseNone
}

// putMemory gives back a channel's memory reservation (p: the pending login it was made
// for, or nil).
func (t *Target) putMemory(n int64, p *pendingLogin) {
	if n == 0 {
		return
	}
	t.mu.Lock()
	t.memUsed -= n
	t.mu.Unlock()
	t.budget.putMemory(n, p)
}

// rejectLogInterval is how often one source's rejections of one cause are logged.
const rejectLogInterval = 10 * time.Second

// rateLog lets one log line through per key and interval, and counts the others.
type rateLog struct {
	mu   sync.Mutex
	last map[rateKey]*rateEntry
}

type rateKey struct {
	addr  netip.Addr
	cause RejectCause
}

type rateEntry struct {
	at         time.Time
	suppressed int
}

// allow reports whether the event may be logged now, and how many were not logged since the
// last one that was.
func (r *rateLog) allow(addr netip.Addr, cause RejectCause, now time.Time) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := rateKey{addr, cause}
	if e := r.last[k]; e != nil {
		if now.Sub(e.at) < rejectLogInterval {
			e.suppressed++
			return false, 0
		}
		n := e.suppressed
		e.at, e.suppressed = now, 0
		return true, n
	}
	if r.last == nil {
		r.last = map[rateKey]*rateEntry{}
	}
	if len(r.last) >= maxSources {
		for k, e := range r.last {
			if now.Sub(e.at) >= rejectLogInterval {
				delete(r.last, k)
			}
		}
		if len(r.last) >= maxSources {
			return false, 0 // a spoofed-address flood: the counters tell the story
		}
	}
	r.last[k] = &rateEntry{at: now}
	return true, 0
}

// SetConfig changes the budget's bounds. What is held already is not taken back: a bound
// lowered below the current use only stops new admissions until enough is given back.
func (b *Budget) SetConfig(cfg BudgetConfig) {
	b.mu.Lock()
	b.cfg = cfg.withDefaults()
	b.mu.Unlock()
}
