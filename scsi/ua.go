package scsi

import (
	"sync"
	"sync/atomic"
)

// Nexus identifies an I_T nexus: the SCSI initiator port and the SCSI target port a command
// came through. For SRP these are the 16-byte initiator and target port identifiers of the
// login (SRP_LOGIN_REQ). Unit attention conditions and persistent reservation registrations
// are kept per Nexus.
type Nexus struct {
	InitiatorPortID [16]byte
	TargetPortID    [16]byte
}

const uaQueueLen = 8

// uaTable holds the pending unit attention conditions of each I_T nexus that has sent this LUN
// a command (SPC-4 5.14 / SAM-5 5.14). A nexus seen for the first time gets POWER ON, RESET,
// OR BUS DEVICE RESET OCCURRED. The per-command check takes no lock and writes no shared
// memory: the nexus map is copied on write (nexuses are few and arrive rarely) and read
// through an atomic pointer, and a nexus with nothing pending is told so by an atomic load.
type uaTable struct {
	mu   sync.Mutex // serializes changes: map copies and queue updates
	snap atomic.Pointer[map[Nexus]*nexusUA]
}

type nexusUA struct {
	pending atomic.Int32       // number of queued conditions, readable without the lock
	queue   [uaQueueLen]uaCode // guarded by uaTable.mu
	n       int
}

func (u *uaTable) init() {
	m := make(map[Nexus]*nexusUA)
	u.snap.Store(&m)
}

func (u *uaTable) get(n *Nexus) *nexusUA { return (*u.snap.Load())[*n] }

// take reports and clears the highest-priority unit attention pending for n.
func (u *uaTable) take(n *Nexus) (uaCode, bool) {
	if s := u.get(n); s != nil && s.pending.Load() == 0 {
		return 0, false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.lookup(n)
	if s.n == 0 {
		return 0, false
	}
	c := s.queue[0]
	copy(s.queue[:], s.queue[1:s.n])
	s.n--
	s.pending.Store(int32(s.n))
	return c, true
}

// lookup returns n's state, creating it with a power-on unit attention. Called with mu held.
func (u *uaTable) lookup(n *Nexus) *nexusUA {
	if s := u.get(n); s != nil {
		return s
	}
	s := &nexusUA{}
	s.push(uaPowerOnReset)
	old := *u.snap.Load()
	m := make(map[Nexus]*nexusUA, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[*n] = s
	u.snap.Store(&m)
	return s
}

// push queues c. A 29h (reset class) condition replaces everything queued; duplicates are not
// queued twice; a full queue drops the new condition.
func (s *nexusUA) push(c uaCode) {
	if c>>8 == 0x29 {
		s.queue[0], s.n = c, 1
		s.pending.Store(1)
		return
	}
	for _, q := range s.queue[:s.n] {
		if q == c {
			return
		}
	}
	if s.n < uaQueueLen {
		s.queue[s.n] = c
		s.n++
		s.pending.Store(int32(s.n))
	}
}

// remove clears a pending condition c for n, if any.
func (u *uaTable) remove(n *Nexus, c uaCode) {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.get(n)
	if s == nil {
		return
	}
	k := 0
	for _, q := range s.queue[:s.n] {
		if q != c {
			s.queue[k] = q
			k++
		}
	}
	s.n = k
	s.pending.Store(int32(k))
}

// establish queues c for n (creating n's state, and so its power-on condition, if new).
func (u *uaTable) establish(n *Nexus, c uaCode) {
	u.mu.Lock()
	u.lookup(n).push(c)
	u.mu.Unlock()
}

// establishAll queues c for every known nexus except one (nil: none excepted). Nexuses not yet
// seen need nothing: they will get the power-on condition, which supersedes c.
func (u *uaTable) establishAll(c uaCode, except *Nexus) {
	u.mu.Lock()
	for k, s := range *u.snap.Load() {
		if except != nil && k == *except {
			continue
		}
		s.push(c)
	}
	u.mu.Unlock()
}

// establishWhere queues c for every known nexus that match selects.
func (u *uaTable) establishWhere(c uaCode, match func(*Nexus) bool) {
	u.mu.Lock()
	for k, s := range *u.snap.Load() {
		if match(&k) {
			s.push(c)
		}
	}
	u.mu.Unlock()
}
