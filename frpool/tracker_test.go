package frpool

import (
	"errors"
	"testing"

	"pgregory.net/rapid"

	"github.com/srpd/srpd/transport"
)

func id(seq uint64) uint64 { return WRIDTag | seq&seqMask }

func TestTrackerRetireUpTo(t *testing.T) {
	tr := newSQTracker(8)
	for i := 0; i < 5; i++ {
		tr.push(sqEntry{kind: kindULP, ulpID: uint64(100 + i), signaled: i == 3})
	}
	if tr.outstanding() != 5 || tr.free() != 3 {
		t.Fatalf("outstanding %d free %d", tr.outstanding(), tr.free())
	}
	if got := tr.uncovered(); got != 1 {
		t.Fatalf("uncovered %d, want 1 (WR 4 after the signaled WR 3)", got)
	}
	seq, err := tr.resolve(id(3))
	if err != nil || seq != 3 {
		t.Fatalf("resolve: %d %v", seq, err)
	}
	first, last, err := tr.complete(seq, transport.WCSuccess)
	if err != nil || first != 0 || last != 3 {
		t.Fatalf("complete: [%d,%d] %v", first, last, err)
	}
	if tr.entry(1).ulpID != 101 {
		t.Fatal("entries must still be readable before retire")
	}
	tr.retire(last)
	if tr.outstanding() != 1 || tr.head != 4 {
		t.Fatalf("after retire: outstanding %d head %d", tr.outstanding(), tr.head)
	}
	if _, err := tr.resolve(id(2)); !errors.Is(err, ErrStaleCompletion) {
		t.Fatalf("retired seq: %v", err)
	}
	if _, err := tr.resolve(id(9)); !errors.Is(err, ErrBadCompletion) {
		t.Fatalf("never posted: %v", err)
	}
	if _, err := tr.resolve(4); !errors.Is(err, ErrForeignWR) {
		t.Fatalf("untagged: %v", err)
	}
	// A successful completion for the unsignaled WR 4 contradicts the SQ rules.
	if _, _, err := tr.complete(4, transport.WCSuccess); !errors.Is(err, ErrBadCompletion) {
		t.Fatalf("success for unsignaled: %v", err)
	}
	// ... but an error completion for it is normal (errors always complete).
	if _, last, err := tr.complete(4, transport.WCWRFlushErr); err != nil || last != 4 {
		t.Fatalf("flush of unsignaled: %v", err)
	}
}

func TestTrackerResetKeepsSequence(t *testing.T) {
	tr := newSQTracker(4)
	for i := 0; i < 3; i++ {
		tr.push(sqEntry{})
	}
	tr.reset()
	if tr.outstanding() != 0 || tr.tail != 3 || tr.head != 3 {
		t.Fatalf("reset: head %d tail %d", tr.head, tr.tail)
	}
	if _, err := tr.resolve(id(1)); !errors.Is(err, ErrStaleCompletion) {
		t.Fatalf("pre-reset completion: %v", err)
	}
	tr.reset() // empty reset is a no-op
	if tr.head != 3 {
		t.Fatal("empty reset moved head")
	}
}

// TestTrackerProperty checks the tracker against a trivial model: a list of posted WRs, each
// completion retiring a prefix; signaled-ness and uncovered counts; wrap-around of the ring.
func TestTrackerProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		capacity := rapid.IntRange(1, 8).Draw(rt, "cap")
		tr := newSQTracker(capacity)
		var model []sqEntry // outstanding, oldest first
		var base uint64     // seq of model[0]
		for step := 0; step < 60; step++ {
			if tr.outstanding() != len(model) || tr.free() != capacity-len(model) {
				rt.Fatalf("outstanding %d model %d", tr.outstanding(), len(model))
			}
			// uncovered = WRs after the last signaled one
			unc := 0
			for i := len(model) - 1; i >= 0 && !model[i].signaled; i-- {
				unc++
			}
			if tr.uncovered() != unc {
				rt.Fatalf("uncovered %d, model %d", tr.uncovered(), unc)
			}
			if len(model) < capacity && rapid.Bool().Draw(rt, "post") {
				e := sqEntry{ulpID: uint64(step), signaled: rapid.Bool().Draw(rt, "sig")}
				if s := tr.push(e); s != base+uint64(len(model)) {
					rt.Fatalf("seq %d", s)
				}
				model = append(model, e)
				continue
			}
			if len(model) == 0 {
				continue
			}
			// complete: a signaled WR successfully, or any WR with an error
			i := rapid.IntRange(0, len(model)-1).Draw(rt, "i")
			st := transport.WCSuccess
			if !model[i].signaled {
				st = transport.WCWRFlushErr
			}
			seq, err := tr.resolve(id(base + uint64(i)))
			if err != nil {
				rt.Fatal(err)
			}
			first, last, err := tr.complete(seq, st)
			if err != nil || first != base || last != base+uint64(i) {
				rt.Fatalf("complete %d: [%d,%d] %v", i, first, last, err)
			}
			for k := 0; k <= i; k++ {
				if tr.entry(base+uint64(k)).ulpID != model[k].ulpID {
					rt.Fatalf("entry %d", k)
				}
			}
			tr.retire(last)
			model = model[i+1:]
			base += uint64(i + 1)
		}
	})
}
