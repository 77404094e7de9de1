package initiator

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport/softroce/link"
)

// holdWrite makes the target swallow the first WRITE(16) to lba (never answering it).
func holdWrite(tg *tgt, lba uint64) *atomic.Bool {
	var held atomic.Bool
	tg.setHold(func(cdb []byte) bool {
		if cdb[0] == scsi.OpWrite16 && binary.BigEndian.Uint64(cdb[2:]) == lba {
			return held.CompareAndSwap(false, true)
		}
		return false
	})
	return &held
}

func checkBlock(t *testing.T, l *LUN, off int64, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	if err := l.ReadAt(ctxT(t, 10*time.Second), got, off); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("data at %d differs", off)
	}
}

// TestTimeoutAbort: a command the target never answers times out (Config.CommandTimeout), is
// aborted with ABORT TASK (using the credit reserved for task management) and re-issued; the
// write lands, and the aborted command's credit comes back.
func TestTimeoutAbort(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{credits: 4})
	cfg := e.config()
	cfg.CommandTimeout = 300 * time.Millisecond
	s := e.dial(cfg)
	l := s.LUNs()[0]
	held := holdWrite(e.tgt, 1000)
	// The held write's data is in the model's format so that the workload below, which may read
	// these blocks, knows what they hold.
	m := newModel(int(l.Size())/512, 512)
	w := make([]byte, 8192)
	id := m.nextID.Add(1)
	m.fill(w, id, 1000)
	if err := l.WriteAt(ctxT(t, 10*time.Second), w, 1000*512, false); err != nil {
		t.Fatal(err)
	}
	m.wrote(1000, len(w)/512, id, true)
	if !held.Load() {
		t.Fatal("nothing was held")
	}
	checkBlock(t, l, 1000*512, w)
	st := s.Stats()
	if st.Timeouts != 1 || st.Aborts != 1 || e.tgt.aborts.Load() != 1 || st.LUNResets != 0 {
		t.Errorf("stats %+v, target aborts %d", st, e.tgt.aborts.Load())
	}
	// The credits are all back: a burst at full depth runs (and never exceeds them).
	runWorkload(ctxT(t, time.Minute), t, l, m, workloadOpts{ops: 20, qds: []int{16}, maxSize: 64 << 10})
	if v := e.tgt.violations.Load(); v != 0 {
		t.Errorf("%d credit violations", v)
	}
}

// TestTimeoutLUNReset: when ABORT TASK fails, error handling escalates to LOGICAL UNIT RESET,
// which ends every unanswered command to the LUN on every channel; they are re-issued.
func TestTimeoutLUNReset(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{})
	e.tgt.tmFor = func(f srp.TaskMgmtFunc) tmMode {
		if f == srp.TMAbortTask {
			return tmFail
		}
		return tmAnswer
	}
	cfg := e.config()
	cfg.ChCount = 2
	cfg.CommandTimeout = 400 * time.Millisecond
	s := e.dial(cfg)
	l := s.LUNs()[0]
	// Hold two writes (they land on both channels: slots are taken round robin); the first to
	// time out resets the LUN, which ends the other one too.
	var n atomic.Int32
	e.tgt.setHold(func(cdb []byte) bool {
		return cdb[0] == scsi.OpWrite16 && binary.BigEndian.Uint64(cdb[2:]) < 100 && n.Add(1) <= 2
	})
	errc := make(chan error, 2)
	for i := 0; i < 2; i++ {
		go func(i int) {
			errc <- l.WriteAt(ctxT(t, 20*time.Second), bytes.Repeat([]byte{byte(i + 1)}, 512), int64(i*10)*512, false)
		}(i)
	}
	for i := 0; i < 2; i++ {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	checkBlock(t, l, 0, bytes.Repeat([]byte{1}, 512))
	checkBlock(t, l, 10*512, bytes.Repeat([]byte{2}, 512))
	st := s.Stats()
	if st.LUNResets < 1 || e.tgt.resets.Load() < 1 || st.Timeouts < 1 {
		t.Errorf("stats %+v, target resets %d", st, e.tgt.resets.Load())
	}
}

// TestTimeoutChannelReset: a target that answers no task management at all: ABORT TASK and
// LOGICAL UNIT RESET time out, the channel is reset (reconnected) and the command re-issued.
func TestTimeoutChannelReset(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{})
	e.tgt.setTM(tmIgnore)
	cfg := e.config()
	cfg.CommandTimeout = 300 * time.Millisecond
	cfg.TaskMgmtTimeout = 200 * time.Millisecond
	s := e.dial(cfg)
	l := s.LUNs()[0]
	holdWrite(e.tgt, 7)
	w := bytes.Repeat([]byte{0x77}, 4096)
	if err := l.WriteAt(ctxT(t, 20*time.Second), w, 7*512, true); err != nil {
		t.Fatal(err)
	}
	checkBlock(t, l, 7*512, w)
	st := s.Stats()
	if st.Reconnects < 1 || st.Aborts != 1 || st.LUNResets != 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestContextDeadline: the caller's deadline bounds a command: it is aborted and the error
// matches both ErrTimeout and context.DeadlineExceeded; the session stays usable.
func TestContextDeadline(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{})
	s := e.dial(e.config())
	l := s.LUNs()[0]
	holdWrite(e.tgt, 42)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := l.WriteAt(ctx, make([]byte, 512), 42*512, false)
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %v", d)
	}
	if e.tgt.aborts.Load() != 1 {
		t.Errorf("target saw %d aborts", e.tgt.aborts.Load())
	}
	w := bytes.Repeat([]byte{9}, 512)
	if err := l.WriteAt(ctxT(t, 10*time.Second), w, 42*512, false); err != nil {
		t.Fatal(err)
	}
	checkBlock(t, l, 42*512, w)
	// A context cancelled before the command starts fails at once.
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if err := l.ReadAt(cctx, make([]byte, 512), 0); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}
