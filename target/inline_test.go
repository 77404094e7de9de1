package target

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/scsi/backend"
	"github.com/srpd/srpd/srp"
)

// TestInlineFastLUNs: commands to a plain RAM LUN execute inline on the channel's goroutine
// or the transport's (no LUN worker is ever started), with every descriptor format;
// Limits.NoInline and a LUN whose backend is not known to be nonblocking use the workers;
// Limits.NoCompletionHandler keeps the completions on the channel's goroutine.
func TestInlineFastLUNs(t *testing.T) {
	for _, tc := range []struct {
		name       string
		o          envOpts
		wantInline bool
	}{
		{"ram", envOpts{plainRAM: true}, true},
		{"ram-nohandler", envOpts{plainRAM: true, limits: Limits{NoCompletionHandler: true}}, true},
		{"ram-noinline", envOpts{plainRAM: true, limits: Limits{NoInline: true}}, false},
		{"gate", envOpts{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.limits.QueueDepth = 16
			e := newEnv(t, tc.o)
			in := e.mustLogin(defaultLogin())
			in.clearUA(0)
			rng := rand.New(rand.NewPCG(21, 22))
			maxWorkers := int64(0)
			for round := 0; round < 6; round++ {
				var xs []*xfer
				for i := 0; i < 6; i++ {
					x := &xfer{write: (round+i)%2 == 0, lba: uint64(64 * i), blocks: uint32(1 + rng.IntN(32)),
						mode: descMode(rng.IntN(int(nModes)))}
					if x.mode == modeImmediate && (!x.write || int(x.blocks)*testBlock+srp.DefaultImmDataOffset > int(in.rsp.MaxITIULen)) {
						x.mode = modeDirect
					}
					in.issue(x, 1+rng.IntN(4), rng)
					xs = append(xs, x)
				}
				maxWorkers = max(maxWorkers, e.tgt.Stats().LUNWorkers)
				for _, x := range xs {
					in.complete(x)
				}
			}
			st := e.tgt.Stats()
			if tc.wantInline {
				if st.InlineExecs < 36 || maxWorkers != 0 || st.LUNWorkers != 0 {
					t.Fatalf("inline executions %d, workers seen %d, running %d", st.InlineExecs, maxWorkers, st.LUNWorkers)
				}
			} else if st.InlineExecs != 0 {
				t.Fatalf("inline executions %d on a LUN that must use the workers", st.InlineExecs)
			}
			// softroce runs completion handlers: the channel's completions are handled on its
			// receive goroutine (some at least: the loop takes them while it is busy).
			if h := st.HandlerBatches; (h == 0) != tc.o.limits.NoCompletionHandler {
				t.Fatalf("%d completion batches on the transport's goroutine (NoCompletionHandler %v)",
					h, tc.o.limits.NoCompletionHandler)
			}
		})
	}
}

// TestInlineOrdered: while a SIMPLE command executes inline (held in a nonblocking backend, on
// channel a's goroutine), an ORDERED command and a SIMPLE one after it arrive on channel b.
// Neither may touch the backend before the first has completed, and the SIMPLE one not before
// the ORDERED one (SAM: ORDERED waits for every earlier command and holds back every later
// one); they execute on LUN workers, and inline execution resumes once the ORDERED command
// is over.
func TestInlineOrdered(t *testing.T) {
	const depth = 16
	e := newEnv(t, envOpts{fastGates: true, limits: Limits{QueueDepth: depth, LUNWorkers: 4}})
	a, b := e.twoChannels()
	a.clearUA(0)
	g := e.gates[0]
	rng := rand.New(rand.NewPCG(23, 24))
	g.record = true
	g.hold()
	first := &xfer{lba: 100, blocks: 8}
	a.issue(first, 1, rng)
	g.waitInside(t, 1)
	if n := e.tgt.Stats().InlineExecs; n == 0 {
		t.Fatal("the first command did not execute inline")
	}
	ord := &xfer{lba: 200, blocks: 8, write: true, attr: srp.TaskAttr(scsi.TaskOrdered)}
	b.issue(ord, 2, rng)
	after := &xfer{lba: 300, blocks: 8, attr: srp.TaskAttr(scsi.TaskSimple)}
	b.issue(after, 1, rng)
	b.expectQuiet(150 * time.Millisecond)
	if got := g.entered(); !slices.Equal(got, []int64{100 * testBlock}) || g.inside.Load() != 1 {
		t.Fatalf("accesses %v (%d inside) while the first command holds the LUN", got, g.inside.Load())
	}
	inlineBefore := e.tgt.Stats().InlineExecs
	g.release()
	a.complete(first)
	b.complete(ord)
	b.complete(after)
	if got, want := g.entered(), []int64{100 * testBlock, 200 * testBlock, 300 * testBlock}; !slices.Equal(got, want) {
		t.Fatalf("access order %v, want %v", got, want)
	}
	if n := e.tgt.Stats().InlineExecs; n != inlineBefore {
		t.Fatalf("%d commands executed inline with an ORDERED command active", n-inlineBefore)
	}
	// Nothing ORDERED is active any more: inline again.
	x := &xfer{lba: 400, blocks: 8}
	b.issue(x, 1, rng)
	b.complete(x)
	if n := e.tgt.Stats().InlineExecs; n != inlineBefore+1 {
		t.Fatalf("inline executions %d after the ORDERED command, want %d", n, inlineBefore+1)
	}
}

// TestInlineAbort: task management against commands executing inline. An ABORT TASK that
// arrives on the channel while its command executes inline is handled once the command has
// been answered: the task is gone, FUNCTION COMPLETE. A LOGICAL UNIT RESET from another
// channel waits for the inline command to end, which then gets no response; its credit comes
// back with SRP_CRED_REQ (its channel is idle).
func TestInlineAbort(t *testing.T) {
	const depth = 16
	e := newEnv(t, envOpts{fastGates: true, limits: Limits{QueueDepth: depth}})
	a, b := e.twoChannels()
	a.clearUA(0)
	g := e.gates[0]
	rng := rand.New(rand.NewPCG(25, 26))

	// ABORT TASK behind the command on the same channel.
	g.hold()
	x := &xfer{lba: 8, blocks: 8, write: true}
	a.issue(x, 1, rng)
	g.waitInside(t, 1)
	tag := a.tm(srp.TMAbortTask, 0, x.tag)
	a.expectQuiet(100 * time.Millisecond)
	g.release()
	a.complete(x)
	if c := tmCode(t, a.await(tag)); c != srp.TMSuccess {
		t.Fatalf("ABORT TASK of an answered command: %v", c)
	}
	if st := a.ch.Stats(); st.Aborted != 0 || st.TMAborted != 0 || a.reqLim != depth {
		t.Fatalf("stats %+v, credits %d", st, a.reqLim)
	}

	// LOGICAL UNIT RESET from channel b while a command executes inline on channel a.
	g.hold()
	y := &xfer{lba: 16, blocks: 8}
	a.issue(y, 1, rng)
	g.waitInside(t, 1)
	tag = b.tm(srp.TMLUNReset, 0, srp.Tag{})
	b.expectQuiet(100 * time.Millisecond) // the reset waits for the executing command
	g.release()
	if c := tmCode(t, b.await(tag)); c != srp.TMSuccess {
		t.Fatalf("LUN RESET: %v", c)
	}
	// y was aborted: no response; its credit comes back with SRP_CRED_REQ.
	cr, err := srp.ParseCredReq(a.awaitOther(srp.OpCredReq, waitLong))
	if err != nil || cr.ReqLimDelta() != 1 || a.reqLim != depth {
		t.Fatalf("CRED_REQ %v %v, channel a credits %d", cr, err, a.reqLim)
	}
	a.expectQuiet(100 * time.Millisecond)
	if st := a.ch.Stats(); st.Aborted != 1 {
		t.Fatalf("channel a stats %+v", st)
	}
	if st := b.ch.Stats(); st.LUNResets != 1 || st.TMAborted != 1 {
		t.Fatalf("channel b stats %+v", st)
	}
	// The LUN works on, inline, after the unit attention.
	b.clearUA(0)
	z := &xfer{lba: 16, blocks: 8, write: true}
	a.issue(z, 1, rng)
	a.complete(z)
}

// TestInlineRandomIO is TestRandomIO's clean case on plain RAM LUNs (inline execution).
func TestInlineRandomIO(t *testing.T) {
	ops := 120
	if raceEnabled {
		ops /= 2
	}
	e := newEnv(t, envOpts{plainRAM: true, nLUNs: 2, limits: Limits{QueueDepth: 8}})
	in := e.mustLogin(defaultLogin())
	in.clearUA(0, 1)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
	const inflight = 6
	const region = 4 << 20
	for done := 0; done < ops; {
		batch := make([]*xfer, 0, inflight)
		in.resetHeap()
		for s := 0; s < inflight && done+len(batch) < ops; s++ {
			size := 1 + rng.IntN(512)
			x := &xfer{lun: uint16(rng.IntN(2)), write: rng.IntN(2) == 0, blocks: uint32(size),
				mode: descMode(rng.IntN(int(nModes)))}
			x.lba = uint64(s)*region/testBlock + rng.Uint64N(uint64(region/testBlock-size)+1)
			if x.mode == modeImmediate && (!x.write || size*testBlock+srp.DefaultImmDataOffset > int(in.rsp.MaxITIULen)) {
				x.mode = modeDirect
			}
			in.issue(x, 1+rng.IntN(24), rng)
			batch = append(batch, x)
		}
		for _, x := range batch {
			in.complete(x)
		}
		done += len(batch)
	}
	if st := e.tgt.Stats(); st.InlineExecs < uint64(ops) {
		t.Fatalf("inline executions %d for %d commands", st.InlineExecs, ops)
	}
}

// TestFastLUN: a LUN executes inline exactly when its backend says backend.Nonblocking; a
// wrapper that hides the RAM behind the Backend interface, or overrides the claim, does not.
func TestFastLUN(t *testing.T) {
	ram, err := backend.NewRAM(testLUNSize, false)
	if err != nil {
		t.Fatal(err)
	}
	defer ram.Close()
	g := &gateBackend{RAM: ram}
	for _, tc := range []struct {
		name string
		be   backend.Backend
		want bool
	}{
		{"ram", ram, true},
		{"wrapped", struct{ backend.Backend }{ram}, false},
		{"gate", g, false},
		{"fastGate", fastGate{g}, true},
	} {
		l, err := scsi.NewLUN(scsi.LUNConfig{BlockSize: testBlock, Serial: tc.name}, tc.be)
		if err != nil {
			t.Fatal(err)
		}
		if got := fastLUN(l); got != tc.want {
			t.Errorf("%s: fastLUN = %v; want %v", tc.name, got, tc.want)
		}
	}
	if !fastLUN(nil) {
		t.Error("fastLUN(nil) = false; want true (no backend to wait for)")
	}
}
