package cqpoll

import (
	"slices"
	"sync/atomic"
	"testing"

	"github.com/srpd/srpd/transport"
)

const ownQPN = 0x11

func ok(id uint64) transport.WC { return transport.WC{ID: id, QPN: ownQPN} }
func failed(id uint64) transport.WC {
	return transport.WC{ID: id, QPN: ownQPN, Status: transport.WCWRFlushErr}
}
func stale(id uint64) transport.WC { return transport.WC{ID: id, QPN: ownQPN + 1} }

func ids(wcs []transport.WC) []uint64 {
	var out []uint64
	for _, wc := range wcs {
		out = append(out, wc.ID)
	}
	return out
}

func seq(from, to uint64) []transport.WC {
	var out []transport.WC
	for id := from; id < to; id++ {
		out = append(out, ok(id))
	}
	return out
}

// TestEngineRun: what one engine run does with the completions it finds, and what it leaves
// to the owner.
func TestEngineRun(t *testing.T) {
	type want struct {
		took     bool     // the run took the completions (no token)
		handled  []uint64 // HandleCompletion, in order
		batches  int      // EndBatch calls
		ends     []bool   // EndRun calls
		left     []uint64 // what Take gives the owner
		leftErr  error
		runs     uint64 // Config.Runs
		leftInCQ int    // completions nobody polled
	}
	cases := []struct {
		name    string
		add     []transport.WC
		noBegin bool // no owner yet
		busy    bool // the owner holds the lock
		h       *recorder
		batch   int
		repolls int
		want    want
	}{
		{
			name: "takes successful completions",
			add:  seq(1, 4),
			want: want{took: true, handled: []uint64{1, 2, 3}, batches: 1, ends: []bool{true}, runs: 1},
		},
		{
			name:    "no owner: declines",
			add:     seq(1, 3),
			noBegin: true,
			want:    want{leftInCQ: 2},
		},
		{
			name: "owner busy: declines",
			add:  seq(1, 3),
			busy: true,
			want: want{leftInCQ: 2},
		},
		{
			name: "not ready: declines",
			add:  seq(1, 3),
			h:    &recorder{ready: func() bool { return false }},
			want: want{leftInCQ: 2},
		},
		{
			name: "failed completion: it and the rest go to the owner",
			add:  []transport.WC{ok(1), ok(2), failed(3), ok(4), failed(5)},
			want: want{handled: []uint64{1, 2}, batches: 1, ends: []bool{false}, left: []uint64{3, 4, 5}},
		},
		{
			name: "handler error: the error and the rest go to the owner",
			add:  seq(1, 5),
			h:    &recorder{fail: map[uint64]bool{2: true}},
			want: want{handled: []uint64{1, 2}, batches: 1, ends: []bool{false}, left: []uint64{3, 4}, leftErr: idError(2)},
		},
		{
			name: "handler error on the last completion",
			add:  seq(1, 3),
			h:    &recorder{fail: map[uint64]bool{2: true}},
			want: want{handled: []uint64{1, 2}, batches: 1, ends: []bool{false}, leftErr: idError(2)},
		},
		{
			name: "completions of another QP are skipped",
			add:  []transport.WC{stale(1), ok(2), stale(3), ok(4)},
			want: want{took: true, handled: []uint64{2, 4}, batches: 1, ends: []bool{true}, runs: 1},
		},
		{
			name: "a failed completion of another QP is skipped too",
			add:  []transport.WC{ok(1), {ID: 2, QPN: ownQPN + 1, Status: transport.WCWRFlushErr}, ok(3)},
			want: want{took: true, handled: []uint64{1, 3}, batches: 1, ends: []bool{true}, runs: 1},
		},
		{
			name:  "more than a batch: EndBatch once, after the poll that emptied the CQ",
			add:   seq(1, 10),
			batch: 4,
			want:  want{took: true, handled: []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9}, batches: 1, ends: []bool{true}, runs: 1},
		},
		{
			name:  "exactly a batch: one more (empty) poll before EndBatch",
			add:   seq(1, 5),
			batch: 4,
			want:  want{took: true, handled: []uint64{1, 2, 3, 4}, batches: 1, ends: []bool{true}, runs: 1},
		},
		{
			name:    "repolls are bounded",
			add:     seq(1, 2),
			h:       &recorder{repoll: func() bool { return true }},
			repolls: 2,
			want:    want{took: true, handled: []uint64{1}, batches: 3, ends: []bool{true}, runs: 1},
		},
		{
			name: "no repolls configured: EndBatch's wish is ignored",
			add:  seq(1, 2),
			h:    &recorder{repoll: func() bool { return true }},
			want: want{took: true, handled: []uint64{1}, batches: 1, ends: []bool{true}, runs: 1},
		},
		{
			name: "EndRun declines: the token goes to the owner, the run is not counted",
			add:  seq(1, 3),
			h:    &recorder{endRun: func() bool { return false }},
			want: want{handled: []uint64{1, 2}, batches: 1, ends: []bool{true}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cq := newFakeCQ()
			var runs atomic.Uint64
			h := tc.h
			if h == nil {
				h = &recorder{}
			}
			p := New(Config{CQ: cq, Handler: h, Batch: tc.batch, Repolls: tc.repolls, Runs: &runs})
			p.Attach()
			defer p.Detach()
			if !tc.noBegin {
				p.Begin(ownQPN)
				if !tc.busy {
					p.Unlock()
				}
			}
			cq.add(tc.add...)
			if tc.busy {
				h.ownerWork()
			} else if !tc.noBegin {
				p.Lock()
			}
			w := tc.want
			if got := cq.tokens.Load() == 0; got != w.took {
				t.Errorf("took %v, want %v", got, w.took)
			}
			if !slices.Equal(h.handled, w.handled) {
				t.Errorf("handled %v, want %v", h.handled, w.handled)
			}
			if h.batches != w.batches {
				t.Errorf("%d EndBatch calls, want %d", h.batches, w.batches)
			}
			if !slices.Equal(h.ends, w.ends) {
				t.Errorf("EndRun calls %v, want %v", h.ends, w.ends)
			}
			if got := runs.Load(); got != w.runs {
				t.Errorf("%d runs counted, want %d", got, w.runs)
			}
			if n := cq.len(); n != w.leftInCQ {
				t.Errorf("%d completions left in the CQ, want %d", n, w.leftInCQ)
			}
			if !tc.noBegin {
				buf := make([]transport.WC, 64)
				n, err, left := p.Take(buf)
				if !slices.Equal(ids(buf[:n]), w.left) || err != w.leftErr || left != (len(w.left) > 0 || w.leftErr != nil) {
					t.Errorf("Take: %v, %v, %v; want %v, %v", ids(buf[:n]), err, left, w.left, w.leftErr)
				}
				p.End()
			}
			if h.violation != nil {
				t.Error(h.violation)
			}
		})
	}
}

// TestLeftBlocksRuns: while the owner has not taken what a run left, later runs decline (the
// order of completions is kept); after Take they run again. A new Begin forgets what an
// earlier owner did not take.
func TestLeftBlocksRuns(t *testing.T) {
	cq := newFakeCQ()
	h := &recorder{}
	p := New(Config{CQ: cq, Handler: h})
	p.Attach()
	p.Begin(ownQPN)
	p.Unlock()
	cq.add(ok(1), failed(2))
	cq.add(ok(3))
	if cq.len() != 1 || cq.tokens.Load() != 2 {
		t.Fatalf("after a run left work: %d in the CQ (want 1), %d tokens (want 2)", cq.len(), cq.tokens.Load())
	}
	p.Lock()
	buf := make([]transport.WC, 8)
	if n, err, left := p.Take(buf); n != 1 || buf[0].ID != 2 || err != nil || !left {
		t.Fatalf("Take: %v %v %v", ids(buf[:n]), err, left)
	}
	if n, err, left := p.Take(buf); n != 0 || err != nil || left {
		t.Fatalf("second Take: %d %v %v", n, err, left)
	}
	p.Unlock()
	cq.add(ok(4))
	if !slices.Equal(h.handled, []uint64{1, 3, 4}) {
		t.Fatalf("handled %v, want [1 3 4]", h.handled)
	}
	p.Lock()
	p.End()

	cq.add(failed(5))
	p.Begin(ownQPN)
	if _, _, left := p.Take(buf); left {
		t.Fatal("Begin kept what an earlier run left")
	}
	p.End()
}

// TestTakeInParts: what does not fit the owner's buffer stays for the next Take, in order.
func TestTakeInParts(t *testing.T) {
	cq := newFakeCQ()
	h := &recorder{fail: map[uint64]bool{1: true}}
	p := New(Config{CQ: cq, Handler: h})
	p.Attach()
	p.Begin(ownQPN)
	p.Unlock()
	cq.add(seq(1, 7)...)
	p.Lock()
	defer p.End()
	buf := make([]transport.WC, 2)
	var got []uint64
	var errs []error
	for {
		n, err, left := p.Take(buf)
		if !left {
			break
		}
		got = append(got, ids(buf[:n])...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	if !slices.Equal(got, []uint64{2, 3, 4, 5, 6}) || len(errs) != 1 || errs[0] != idError(1) {
		t.Fatalf("took %v with errors %v; want [2 3 4 5 6] and one error", got, errs)
	}
}

// TestRepollFindsPostedWork: completions a post adds during EndBatch (a LOCAL_INV the engine
// executes in the post) are handled in the same run.
func TestRepollFindsPostedWork(t *testing.T) {
	cq := newFakeCQ()
	posted := false
	h := &recorder{}
	h.onBatch = func() {
		if !posted {
			posted = true
			cq.push(ok(100))
		}
	}
	h.repoll = func() bool { return cq.len() > 0 }
	p := New(Config{CQ: cq, Handler: h, Repolls: 2})
	p.Attach()
	p.Begin(ownQPN)
	p.Unlock()
	cq.add(ok(1))
	p.Lock()
	p.End()
	if !slices.Equal(h.handled, []uint64{1, 100}) || cq.tokens.Load() != 0 {
		t.Fatalf("handled %v with %d tokens; want [1 100] and none", h.handled, cq.tokens.Load())
	}
}

// TestAttach: the handler is installed only on a CQ that supports it and when not disabled;
// Detach removes it.
func TestAttach(t *testing.T) {
	for _, tc := range []struct {
		name     string
		noEngine bool
		plain    bool
		want     bool
	}{
		{"handler CQ", false, false, true},
		{"NoEngine", true, false, false},
		{"CQ without CompletionHandler", false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCQ()
			var cq transport.CQ = f
			if tc.plain {
				cq = plainCQ{f}
			}
			p := New(Config{CQ: cq, Handler: &recorder{}, NoEngine: tc.noEngine})
			p.Attach()
			if got := f.handler.Load() != nil; got != tc.want {
				t.Fatalf("handler installed: %v, want %v", got, tc.want)
			}
			p.Detach()
			if f.handler.Load() != nil {
				t.Fatal("handler still installed after Detach")
			}
			// The owner's side works the same either way.
			p.Begin(ownQPN)
			f.add(ok(1))
			buf := make([]transport.WC, 4)
			if n := p.Poll(buf); n != 1 {
				t.Fatalf("owner polled %d completions, want 1", n)
			}
			p.End()
		})
	}
}

// TestHoldProgress: Hold and Progress reach the device's Progresser, and Hold reports false
// without one.
func TestHoldProgress(t *testing.T) {
	d := &fakeDevice{}
	p := New(Config{CQ: newFakeCQ(), Handler: &recorder{}, Device: d})
	if !p.Hold() {
		t.Fatal("Hold with a Progresser returned false")
	}
	p.Progress()
	if d.holds != 1 || d.progresses != 1 {
		t.Fatalf("holds %d, progresses %d; want 1, 1", d.holds, d.progresses)
	}
	for _, dev := range []transport.Device{nil, struct{ transport.Device }{}} {
		if New(Config{CQ: newFakeCQ(), Handler: &recorder{}, Device: dev}).Hold() {
			t.Fatalf("Hold without a Progresser (%T) returned true", dev)
		}
	}
}

// TestEngineRunAllocs: a run on the engine's goroutine allocates nothing per completion, nor
// does taking what it left.
func TestEngineRunAllocs(t *testing.T) {
	cq := newFakeCQ()
	h := &recorder{count: true}
	var runs atomic.Uint64
	p := New(Config{CQ: cq, Handler: h, Runs: &runs, Repolls: 1})
	p.Attach()
	p.Begin(ownQPN)
	p.Unlock()
	batch := seq(1, 200)
	batch = append(batch, failed(200), ok(201))
	buf := make([]transport.WC, 64)
	allocs := testing.AllocsPerRun(50, func() {
		cq.add(batch...)
		p.Lock()
		for {
			if _, _, left := p.Take(buf); !left {
				break
			}
		}
		p.Unlock()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per run of %d completions", allocs, len(batch))
	}
	if h.nHandled == 0 {
		t.Fatal("nothing handled")
	}
}

// TestRunsNeverNest is a guard for the fake engine itself: the recorder notices a run that
// begins inside another, so the property test's checks can fail.
func TestRunsNeverNest(t *testing.T) {
	h := &recorder{}
	h.Ready()
	h.Ready()
	if h.violation == nil {
		t.Fatal("nested runs not noticed")
	}
	h2 := &recorder{}
	h2.Ready()
	_ = h2.HandleCompletion(&transport.WC{ID: 1})
	h2.EndRun(true)
	if h2.violation == nil {
		t.Fatal("a run ended without EndBatch not noticed")
	}
}
