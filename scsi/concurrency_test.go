package scsi

import (
	"bytes"
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestConcurrentDisjointIO: goroutines write and read back their own ranges concurrently.
func TestConcurrentDisjointIO(t *testing.T) {
	l, _ := newTestLUN(t, testConfig())
	const workers, rounds, blocks = 8, 50, 16
	var wg sync.WaitGroup
	errs := make(chan string, workers)
	for w := range workers {
		wg.Go(func() {
			lba := uint64(w * 128)
			cmd := &Command{Nexus: nexA, Sense: make([]byte, MaxSenseLen), DataIn: make([]byte, blocks*512)}
			for i := range rounds {
				data := fill(blocks*512, byte(w*rounds+i))
				cmd.CDB, cmd.DataOut = cdbRW16(OpWrite16, lba+uint64(i%4), blocks, i%3 == 0), data
				if r := l.Execute(context.Background(), cmd); r.Status != StatusGood {
					errs <- "write: " + r.Sense.String()
					return
				}
				cmd.CDB, cmd.DataOut = cdbRead16(lba+uint64(i%4), blocks), nil
				if r := l.Execute(context.Background(), cmd); r.Status != StatusGood || !bytes.Equal(cmd.DataIn, data) {
					errs <- "read back differs"
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// TestCompareAndWriteAtomic: COMPARE AND WRITE used as a counter by many goroutines loses no
// increment (each read-compare-write is atomic against the others).
func TestCompareAndWriteAtomic(t *testing.T) {
	l, _ := newTestLUN(t, testConfig())
	const workers, incs, blocks = 6, 40, 2
	var wg sync.WaitGroup
	var miscompares atomic.Int64
	for range workers {
		wg.Go(func() {
			cmd := &Command{Nexus: nexA, Sense: make([]byte, MaxSenseLen), DataIn: make([]byte, blocks*512)}
			for range incs {
				for {
					cmd.CDB, cmd.DataOut = cdbRead16(0, blocks), nil
					if r := l.Execute(context.Background(), cmd); r.Status != StatusGood {
						t.Error(r.Sense)
						return
					}
					v := binary.BigEndian.Uint64(cmd.DataIn)
					payload := make([]byte, 2*blocks*512)
					copy(payload, cmd.DataIn)
					for k := blocks * 512; k < len(payload); k += 8 {
						binary.BigEndian.PutUint64(payload[k:], v+1)
					}
					cmd.CDB, cmd.DataOut = cdbCAW(0, blocks), payload
					r := l.Execute(context.Background(), cmd)
					if r.Status == StatusGood {
						break
					}
					if !r.Sense.Match(Miscompare, 0x1D, 0) {
						t.Error(r.Sense)
						return
					}
					miscompares.Add(1)
				}
			}
		})
	}
	wg.Wait()
	d := readBack(t, l, 0, blocks)
	want := make([]byte, blocks*512)
	for k := 0; k < len(want); k += 8 {
		binary.BigEndian.PutUint64(want[k:], workers*incs)
	}
	if !bytes.Equal(d, want) {
		t.Fatalf("counter %d; want %d (%d retries)", binary.BigEndian.Uint64(d), workers*incs, miscompares.Load())
	}
}

// TestCompareAndWriteVsWrites: COMPARE AND WRITEs race plain WRITEs of the same range on a
// backend that tears unsynchronized writes. Every command writes the whole range with one
// byte value, so the range must always be uniform: a COMPARE AND WRITE that miscompares must
// find the difference at offset 0 (a torn range would differ further in), and the final
// content must be one command's value throughout.
func TestCompareAndWriteVsWrites(t *testing.T) {
	cfg := testConfig()
	m := newMemBackend(testBlocks * 512)
	m.tear = true
	l, err := NewLUN(cfg, m)
	if err != nil {
		t.Fatal(err)
	}
	clearUA(t, l, nexA)
	const blocks, n = 8, 1024 * 4
	var wg sync.WaitGroup
	var good, bad atomic.Int64
	for w := range 4 {
		wg.Go(func() { // writers
			cmd := &Command{Nexus: nexA, Sense: make([]byte, MaxSenseLen)}
			for i := range 30 {
				cmd.CDB, cmd.DataOut = cdbWrite16(0, blocks), fill(n, byte(w*40+i+1))
				if r := l.Execute(context.Background(), cmd); r.Status != StatusGood {
					t.Error(r.Sense)
					return
				}
			}
		})
		wg.Go(func() { // compare-and-writers: guess a value, replace it with another
			cmd := &Command{Nexus: nexA, Sense: make([]byte, MaxSenseLen)}
			for i := range 60 {
				guess := byte((w*40 + i) % 160)
				cmd.CDB, cmd.DataOut = cdbCAW(0, blocks), append(fill(n, guess), fill(n, byte(200+w))...)
				r := l.Execute(context.Background(), cmd)
				switch {
				case r.Status == StatusGood:
					good.Add(1)
				case r.Sense.Match(Miscompare, 0x1D, 0) && r.Sense.Info == 0:
					bad.Add(1)
				default:
					t.Errorf("torn range: %v", r.Sense)
					return
				}
			}
		})
	}
	wg.Wait()
	d := readBack(t, l, 0, blocks)
	if !bytes.Equal(d, fill(n, d[0])) {
		t.Fatal("final range is torn")
	}
	t.Logf("%d compare-and-writes matched, %d miscompared", good.Load(), bad.Load())
}

// gatedBackend blocks WriteAt at offsets registered in gates until released, and records the
// order in which writes start.
type gatedBackend struct {
	*memBackend
	mu    sync.Mutex
	gates map[int64]chan struct{}
	order []int64
}

func newGated(size int64) *gatedBackend {
	g := &gatedBackend{memBackend: newMemBackend(size), gates: map[int64]chan struct{}{}}
	g.memBackend.hook = func(op byte, off int64, _ int) {
		if op != 'w' {
			return
		}
		lba := off / 512
		g.mu.Lock()
		g.order = append(g.order, lba)
		ch := g.gates[lba]
		g.mu.Unlock()
		if ch != nil {
			<-ch
		}
	}
	return g
}

func (g *gatedBackend) gate(lba int64) chan struct{} {
	ch := make(chan struct{})
	g.mu.Lock()
	g.gates[lba] = ch
	g.mu.Unlock()
	return ch
}

func (g *gatedBackend) started() []int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]int64(nil), g.order...)
}

func (g *gatedBackend) waitStarted(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(g.started()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %v started", g.started())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestOrderedTaskAttribute: an ORDERED command waits for every earlier command and holds
// back every later SIMPLE one; HEAD OF QUEUE runs at once; SIMPLE commands run concurrently.
func TestOrderedTaskAttribute(t *testing.T) {
	g := newGated(testBlocks * 512)
	l, err := NewLUN(testConfig(), g)
	if err != nil {
		t.Fatal(err)
	}
	clearUA(t, l, nexA)
	ctx := context.Background()
	write := func(lba uint64, attr TaskAttr) *Command {
		return &Command{CDB: cdbWrite16(lba, 1), Nexus: nexA, Attr: attr, DataOut: make([]byte, 512)}
	}
	g1, g2 := g.gate(1), g.gate(2)
	c1, c2 := write(1, TaskSimple), write(2, TaskSimple)
	ord := write(10, TaskOrdered)
	c3, c4 := write(20, TaskSimple), write(21, TaskSimple)
	hoq := write(30, TaskHeadOfQueue)
	// Admission order is arrival order: 1, 2, ORDERED, 20, 21, HOQ.
	for _, c := range []*Command{c1, c2, ord, c3, c4, hoq} {
		l.Admit(c)
	}
	done := make(chan *Command, 6)
	for _, c := range []*Command{c4, c3, hoq, ord, c2, c1} { // executed in scrambled order
		go func() {
			if r := l.Execute(ctx, c); r.Status != StatusGood {
				t.Error(r.Status, r.Sense)
			}
			done <- c
		}()
	}
	g.waitStarted(t, 3) // 1 and 2 concurrently (both blocked in the backend), and the HOQ
	time.Sleep(20 * time.Millisecond)
	st := g.started()
	if len(st) != 3 || !contains(st, 1) || !contains(st, 2) || !contains(st, 30) {
		t.Fatalf("started %v; want 1, 2 and 30 only", st)
	}
	if c := <-done; c != hoq {
		t.Fatal("HEAD OF QUEUE did not finish first")
	}
	close(g1)
	time.Sleep(20 * time.Millisecond)
	if st := g.started(); len(st) != 3 {
		t.Fatalf("started %v while an earlier command is still running", st)
	}
	close(g2)
	for range 5 {
		<-done
	}
	st = g.started()
	if st[3] != 10 || !contains(st[4:], 20) || !contains(st[4:], 21) {
		t.Fatalf("order %v: ORDERED must run after 1 and 2 and before 20 and 21", st)
	}
}

// TestOrderedAbort: a command waiting for its turn returns TASK ABORTED when its context
// ends, without running and without wedging the task set.
func TestOrderedAbort(t *testing.T) {
	g := newGated(testBlocks * 512)
	l, err := NewLUN(testConfig(), g)
	if err != nil {
		t.Fatal(err)
	}
	clearUA(t, l, nexA)
	g1 := g.gate(1)
	first := &Command{CDB: cdbWrite16(1, 1), Nexus: nexA, DataOut: make([]byte, 512)}
	ord := &Command{CDB: cdbWrite16(2, 1), Nexus: nexA, Attr: TaskOrdered, DataOut: make([]byte, 512)}
	after := &Command{CDB: cdbWrite16(3, 1), Nexus: nexA, DataOut: make([]byte, 512)}
	for _, c := range []*Command{first, ord, after} {
		l.Admit(c)
	}
	go l.Execute(context.Background(), first)
	g.waitStarted(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	res := make(chan Result)
	go func() { res <- l.Execute(ctx, ord) }()
	afterDone := make(chan Result)
	go func() { afterDone <- l.Execute(context.Background(), after) }()
	time.Sleep(10 * time.Millisecond)
	cancel()
	if r := <-res; r.Status != StatusTaskAborted {
		t.Fatalf("status %v", r.Status)
	}
	select {
	case <-afterDone:
		t.Fatal("a SIMPLE command overtook the still running earlier one")
	case <-time.After(20 * time.Millisecond):
	}
	close(g1)
	if r := <-afterDone; r.Status != StatusGood {
		t.Fatal(r.Status)
	}
	if st := g.started(); len(st) != 2 || st[1] != 3 {
		t.Fatalf("started %v", st)
	}
	// A withdrawn ORDERED command releases its successors too.
	o := &Command{CDB: cdbTUR(), Nexus: nexA, Attr: TaskOrdered}
	l.Admit(o)
	s := &Command{CDB: cdbTUR(), Nexus: nexA}
	l.Admit(s)
	l.Withdraw(o)
	if r := l.Execute(context.Background(), s); r.Status != StatusGood {
		t.Fatal(r.Status)
	}
}

// TestTaskSetStress mixes attributes from many goroutines and checks that an ORDERED command
// never overlaps any other command.
func TestTaskSetStress(t *testing.T) {
	var running, orderedRunning atomic.Int64
	var violations atomic.Int64
	m := newMemBackend(testBlocks * 512)
	m.hook = func(op byte, _ int64, _ int) {}
	l, err := NewLUN(testConfig(), m)
	if err != nil {
		t.Fatal(err)
	}
	clearUA(t, l, nexA)
	var admitMu sync.Mutex // serialize admission, like a target's receive path
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for i := range 200 {
				attr := TaskSimple
				if (w+i)%7 == 0 {
					attr = TaskOrdered
				}
				cmd := &Command{CDB: cdbTUR(), Nexus: nexA, Attr: attr}
				admitMu.Lock()
				l.Admit(cmd)
				admitMu.Unlock()
				l.tasks.wait(context.Background(), &cmd.ts, attr)
				if attr == TaskOrdered {
					if running.Load() != 0 || orderedRunning.Add(1) != 1 {
						violations.Add(1)
					}
					orderedRunning.Add(-1)
				} else {
					running.Add(1)
					if orderedRunning.Load() != 0 {
						violations.Add(1)
					}
					running.Add(-1)
				}
				l.tasks.done(&cmd.ts)
			}
		})
	}
	wg.Wait()
	if v := violations.Load(); v != 0 {
		t.Fatalf("%d ordering violations", v)
	}
	if h := l.tasks.head; h != l.tasks.tail.Load() || h.members.Load() != 0 {
		t.Fatal("task set not drained")
	}
}

func contains(s []int64, v int64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
