package scsi

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/srpd/srpd/scsi/backend"
)

// fenceBackend is a memBackend that another exporter can fence, as RBD with a managed lock:
// fenced, every medium call fails with backend.ErrFenced until Resume.
type fenceBackend struct {
	*memBackend
	epoch  atomic.Uint64
	fenced atomic.Bool

	mu      sync.Mutex
	resumes []uint64
}

var _ backend.Fenceable = (*fenceBackend)(nil)

func (f *fenceBackend) fence() {
	f.fenced.Store(true)
	f.epoch.Add(1)
}

func (f *fenceBackend) FenceEpoch() uint64 { return f.epoch.Load() }

func (f *fenceBackend) Resume(e uint64) {
	f.mu.Lock()
	f.resumes = append(f.resumes, e)
	f.mu.Unlock()
	if e == f.epoch.Load() {
		f.fenced.Store(false)
	}
}

func (f *fenceBackend) resumed() []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]uint64(nil), f.resumes...)
}

func (f *fenceBackend) check() error {
	if f.fenced.Load() {
		return fmt.Errorf("fake: %w", backend.ErrFenced)
	}
	return nil
}

func (f *fenceBackend) ReadAt(p []byte, off int64) (int, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	return f.memBackend.ReadAt(p, off)
}

func (f *fenceBackend) WriteAt(p []byte, off int64) (int, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	return f.memBackend.WriteAt(p, off)
}

func (f *fenceBackend) Flush() error {
	if err := f.check(); err != nil {
		return err
	}
	return f.memBackend.Flush()
}

// TestFenceGate: after a fence, the backend is resumed only once every command admitted
// before the fence has left the task set; those commands fail with NOT READY, ASYMMETRIC
// ACCESS STATE TRANSITION (04/0A) and write nothing, and the commands admitted after the
// fence run once it is resumed.
func TestFenceGate(t *testing.T) {
	fb := &fenceBackend{memBackend: newMemBackend(512 * testBlocks)}
	l, err := NewLUN(testConfig(), fb)
	if err != nil {
		t.Fatal(err)
	}
	clearUA(t, l, nexA)
	write := func(lba uint64, b byte) *Command {
		return &Command{CDB: cdbWrite16(lba, 1), Nexus: nexA, DataOut: fill(512, b), Sense: make([]byte, MaxSenseLen)}
	}
	ctx := context.Background()
	// Two commands admitted (their data still on the wire, say), then the fence.
	old1, old2 := write(10, 0x11), write(11, 0x22)
	l.Admit(old1)
	l.Admit(old2)
	fb.fence()
	// A command that arrives after the fence: admitted under the new epoch; no resume yet,
	// two older commands are in the task set.
	new1 := write(12, 0x33)
	l.Admit(new1)
	if r := fb.resumed(); len(r) != 0 {
		t.Fatalf("resumed %v with two commands from before the fence in the task set", r)
	}
	// An old command executes: refused with the transition sense, nothing written.
	wantSense(t, l.Execute(ctx, old1), NotReady, 0x04, 0x0A)
	if r := fb.resumed(); len(r) != 0 {
		t.Fatalf("resumed %v with one command from before the fence in the task set", r)
	}
	// The last old one is withdrawn (its initiator went away): now the backend may resume.
	l.Withdraw(old2)
	if r := fb.resumed(); len(r) != 1 || r[0] != 1 {
		t.Fatalf("resumes %v, want [1]", r)
	}
	wantGood(t, l.Execute(ctx, new1))
	got := make([]byte, 3*512)
	if _, err := fb.memBackend.ReadAt(got, 10*512); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:1024], make([]byte, 1024)) || !bytes.Equal(got[1024:], fill(512, 0x33)) {
		t.Fatalf("blocks 10-12: %x... %x... %x...", got[0], got[512], got[1024])
	}
	// A fence while idle: the next command resumes at once (nothing older is left) and runs.
	fb.fence()
	r, _ := do(l, nexA, cdbWrite16(13, 1), fill(512, 0x44), 0)
	wantGood(t, r)
	if r := fb.resumed(); len(r) != 2 || r[1] != 2 {
		t.Fatalf("resumes %v, want [1 2]", r)
	}
	// A fence found by a running command (the backend fails it), with commands of the same
	// epoch queued behind: they all fail, and the resume waits for the last of them.
	a, b := write(20, 0x55), write(21, 0x66)
	l.Admit(a)
	l.Admit(b)
	fb.fence()
	wantSense(t, l.Execute(ctx, a), NotReady, 0x04, 0x0A)
	c := write(22, 0x77) // after the fence
	l.Admit(c)
	if r := fb.resumed(); len(r) != 2 {
		t.Fatalf("resumes %v before the last old command left", r)
	}
	wantSense(t, l.Execute(ctx, b), NotReady, 0x04, 0x0A)
	if r := fb.resumed(); len(r) != 3 || r[2] != 3 {
		t.Fatalf("resumes %v, want [1 2 3]", r)
	}
	wantGood(t, l.Execute(ctx, c))
	// SYNCHRONIZE CACHE on a fenced backend: the transition too, not MEDIUM ERROR.
	fb.fenced.Store(true)
	r, _ = do(l, nexA, cdbSync16(0, 0), nil, 0)
	wantSense(t, r, NotReady, 0x04, 0x0A)
}
