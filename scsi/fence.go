package scsi

import (
	"sync"

	"github.com/srpd/srpd/scsi/backend"
)

// fenceGate keeps the promise backend.Fenceable asks of its user: Resume is called for a fence
// epoch only once no command admitted to the task set under an older epoch is left. Such a
// command may be one an initiator gave up on before another gateway took the unit over; after
// the fence it can only fail (its backend calls get ErrFenced), never land late on a
// reconnected backend.
//
// Every command the task set admits notes the epoch at admission (enter) and gives it back when
// it leaves (leave). A LUN whose backend is not Fenceable has no gate and pays nothing.
type fenceGate struct {
	be backend.Fenceable

	mu      sync.Mutex
	cur     uint64 // the newest epoch seen
	live    int    // commands admitted under cur
	old     int    // commands admitted under older epochs, still in the task set
	resumed uint64 // the newest epoch Resume was called for
}

// enter admits a command: the epoch it runs under.
func (g *fenceGate) enter() uint64 {
	e := g.be.FenceEpoch()
	g.mu.Lock()
	g.advanceLocked(e)
	g.live++
	cur := g.cur
	resume := g.resumeLocked()
	g.mu.Unlock()
	if resume {
		g.be.Resume(cur)
	}
	return cur
}

// leave takes a command admitted under epoch e out.
func (g *fenceGate) leave(e uint64) {
	now := g.be.FenceEpoch()
	g.mu.Lock()
	if e == g.cur {
		g.live--
	} else {
		g.old--
	}
	g.advanceLocked(now)
	cur := g.cur
	resume := g.resumeLocked()
	g.mu.Unlock()
	if resume {
		g.be.Resume(cur)
	}
}

// advanceLocked moves to epoch e if it is newer: the commands of the epoch before become old.
func (g *fenceGate) advanceLocked(e uint64) {
	if e > g.cur {
		g.old += g.live
		g.live = 0
		g.cur = e
	}
}

// resumeLocked reports (once per epoch) whether Resume is due: a fence was seen and nothing
// from before it is left.
func (g *fenceGate) resumeLocked() bool {
	if g.cur > g.resumed && g.old == 0 {
		g.resumed = g.cur
		return true
	}
	return false
}
