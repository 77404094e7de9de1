package frpool

import (
	"github.com/srpd/srpd/transport"
)

// WRIDTag is set in the ID of every work request the pool posts on its QP's send queue. The rest
// of the ID is the WR's sequence number on that send queue (seqMask bits). The ULP keeps its own
// IDs: the pool stores them and puts them back into the completions it hands on.
const WRIDTag uint64 = 1 << 63

const seqMask = WRIDTag - 1

// wrKind says what a posted WR was for.
type wrKind uint8

const (
	kindULP      wrKind = iota // a ULP work request (SEND, ...)
	kindReg                    // REG_MR of a registration
	kindInv                    // LOCAL_INV of a registration
	kindSentinel               // signaled zero-length RDMA WRITE retiring earlier unsignaled WRs
	kindRW                     // RDMA READ / WRITE of an RW context
)

// sqEntry is the bookkeeping of one posted WR.
type sqEntry struct {
	ulpID    uint64 // kindULP: the ULP's WR ID
	reg      *Reg   // kindReg, kindInv
	rw       *RWCtx // kindRW (and a chained response SEND)
	gen      uint32 // generation of reg / rw when posted
	kind     wrKind
	ulp      bool // the WR is the ULP's (ulpID, ulpWants valid)
	op       transport.WROpcode
	signaled bool // posted with SendSignaled: a successful completion will be produced
	ulpWants bool // kindULP: the ULP asked for the completion
	waveEnd  bool // kindRW: last WR of a wave (or the response SEND ending a transfer)
}

// sqTracker is the pool's model of one send queue: the WRs posted and not yet known complete, by
// sequence number. It encodes the verbs send-queue rules the pool relies on:
//
//   - WRs on one SQ execute and complete in order, so a completion for WR n retires every
//     earlier WR of that SQ, including unsignaled ones that never produce a completion of their own
//     (IBA: completions are returned in WR order on an RC send queue; ib_srp and ib_srpt rely on
//     the same rule for their unsignaled WRs).
//   - An unsignaled WR produces a completion only on error; after an error every later WR completes
//     individually with a flush error, still in order.
//
// Slots: the tracker has a fixed capacity (the SQ depth). A WR occupies a slot from post until it
// is retired, which is at least as long as the engine holds it, so staying within the tracker's
// capacity never overruns the SQ. It is a plain data structure with no locking and no allocation
// after construction.
type sqTracker struct {
	ring []sqEntry
	head uint64 // oldest unretired sequence number
	tail uint64 // next sequence number
	// lastSig is one past the sequence number of the most recently posted signaled WR (0: none
	// since the start). WRs at or after max(head, lastSig) are "uncovered": no completion that is
	// already due would retire them.
	lastSig uint64
}

func newSQTracker(capacity int) *sqTracker {
	if capacity < 1 {
		capacity = 1
	}
	return &sqTracker{ring: make([]sqEntry, capacity)}
}

// capacity is the number of slots.
func (t *sqTracker) capacity() int { return len(t.ring) }

// outstanding is the number of posted, unretired WRs.
func (t *sqTracker) outstanding() int { return int(t.tail - t.head) }

// free is the number of slots available.
func (t *sqTracker) free() int { return len(t.ring) - t.outstanding() }

// seqAt is the sequence number the i-th WR of the next post will get.
func (t *sqTracker) seqAt(i int) uint64 { return t.tail + uint64(i) }

// push records the next WR (the caller has checked free() > 0) and returns its sequence number.
func (t *sqTracker) push(e sqEntry) uint64 {
	s := t.tail
	t.ring[s%uint64(len(t.ring))] = e
	t.tail++
	if e.signaled {
		t.lastSig = t.tail
	}
	return s
}

// uncovered is the number of outstanding WRs after the last signaled one: nothing already posted
// would retire them.
func (t *sqTracker) uncovered() int {
	from := t.head
	if t.lastSig > from {
		from = t.lastSig
	}
	return int(t.tail - from)
}

// entry returns the entry of an outstanding sequence number.
func (t *sqTracker) entry(seq uint64) *sqEntry { return &t.ring[seq%uint64(len(t.ring))] }

// resolve maps a WR ID (with WRIDTag) back to an outstanding sequence number. It reports
// ErrForeignWR for an ID without the tag, ErrStaleCompletion for a sequence number already
// retired (e.g. from before a reset) and ErrBadCompletion for one never posted.
func (t *sqTracker) resolve(id uint64) (uint64, error) {
	if id&WRIDTag == 0 {
		return 0, ErrForeignWR
	}
	low := id & seqMask
	// The full sequence number is the one congruent to low (mod 2^63) closest above head-2^62.
	d := (low - t.head) & seqMask
	if d < t.tail-t.head {
		return t.head + d, nil
	}
	if d > seqMask/2 { // behind head
		return 0, ErrStaleCompletion
	}
	return 0, ErrBadCompletion
}

// complete checks a completion for seq against the send-queue rules and returns the range of
// sequence numbers it retires, [head, seq]. A successful completion must be for a signaled WR
// (ErrBadCompletion otherwise).
func (t *sqTracker) complete(seq uint64, status transport.WCStatus) (first, last uint64, err error) {
	if seq < t.head || seq >= t.tail {
		return 0, 0, ErrBadCompletion
	}
	if status == transport.WCSuccess && !t.entry(seq).signaled {
		return 0, 0, ErrBadCompletion
	}
	return t.head, seq, nil
}

// retire drops every entry up to and including seq.
func (t *sqTracker) retire(seq uint64) {
	for s := t.head; s <= seq; s++ {
		*t.entry(s) = sqEntry{}
	}
	t.head = seq + 1
}

// reset forgets every outstanding entry (after a QP reset or replacement). Sequence numbers keep
// increasing so that late completions from before are recognised as stale.
func (t *sqTracker) reset() {
	if t.tail > t.head {
		t.retire(t.tail - 1)
	}
}
