package initiator

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/target"
	"github.com/srpd/srpd/transport/softroce/link"
)

// ioDuring runs the random workload (with flush, discard, write zeroes) while disrupt runs and
// for a while after, then checks the whole LUN: every acknowledged write must be there, no I/O
// may fail.
func ioDuring(t *testing.T, l *LUN, disrupt func()) *workloadStats {
	m := newModel(int(l.Size())/l.BlockSize(), l.BlockSize())
	ctx := ctxT(t, 5*time.Minute)
	var st *workloadStats
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		st = runWorkload(ctx, t, l, m, workloadOpts{ops: 1 << 30, qds: []int{16}, maxSize: 256 << 10, mixed: true, stop: stop})
	}()
	disrupt()
	time.Sleep(300 * time.Millisecond) // I/O on the recovered session
	close(stop)
	wg.Wait()
	verifyAll(ctx, t, l, m)
	return st
}

func recoveryConfig(c Config) Config {
	c.ChCount = 2
	c.CommandTimeout = time.Second
	c.TaskMgmtTimeout = 300 * time.Millisecond
	c.ReconnectDelay = 50 * time.Millisecond
	c.MaxReconnectDelay = 200 * time.Millisecond
	return c
}

// TestReconnectCrash kills the target (its QPs vanish without a word) and restarts it, three
// times, under load: channels fail (retry exceeded, or commands time out and error handling
// gives up), reconnect with back-off, held and failed commands are re-issued, and no
// acknowledged write is lost.
func TestReconnectCrash(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{lunSize: 16 << 20})
	s := e.dial(recoveryConfig(e.config()))
	l := s.LUNs()[0]
	st := ioDuring(t, l, func() {
		for i := 0; i < 3; i++ {
			time.Sleep(300 * time.Millisecond)
			e.tgt.kill()
			// Restart only once a channel has seen the crash: a restart before any channel
			// noticed would leave LiveChannels at 2 and the next kill would fold two crashes
			// into one recovery (2 reconnects for 3 kills on a loaded CI machine).
			waitFor(t, "a channel to fail", 20*time.Second, func() bool { return s.Stats().LiveChannels < 2 })
			time.Sleep(100 * time.Millisecond)
			e.tgt.restart()
			waitFor(t, "reconnected", 10*time.Second, func() bool { return s.Stats().LiveChannels == 2 })
		}
	})
	ss := s.Stats()
	t.Logf("%d reads, %d writes; session %+v", st.reads.Load(), st.writes.Load(), ss)
	if ss.Reconnects < 3 {
		t.Errorf("%d reconnects", ss.Reconnects)
	}
	if v := e.tgt.violations.Load(); v != 0 {
		t.Errorf("%d credit violations", v)
	}
}

// TestReconnectGraceful: the target disconnects every channel (CM DREQ) and logs channels out
// (SRP_T_LOGOUT) under load; the initiator reconnects and carries on.
func TestReconnectGraceful(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{lunSize: 16 << 20})
	s := e.dial(recoveryConfig(e.config()))
	l := s.LUNs()[0]
	ioDuring(t, l, func() {
		time.Sleep(200 * time.Millisecond)
		e.tgt.disconnectAll()
		time.Sleep(300 * time.Millisecond)
		waitFor(t, "channels back", 10*time.Second, func() bool { return s.Stats().LiveChannels == 2 })
		e.tgt.channels()[0].sendTargetIU(srp.OpTLogout, 0, srp.TLogoutInactive)
		waitFor(t, "logged-out channel back", 10*time.Second, func() bool { return s.Stats().Reconnects >= 3 })
	})
	if ss := s.Stats(); ss.Reconnects < 3 {
		t.Errorf("stats %+v", ss)
	}
}

// TestReconnectRealTarget crashes the srpd target (its device vanishes) over UDP and starts a
// new one on the same LUNs, under load; then shuts it down gracefully (T_LOGOUT) and starts it
// again.
func TestReconnectRealTarget(t *testing.T) {
	e := newRealEnv(t, true, link.PipeConfig{}, target.Limits{}, 1, 16<<20)
	s := e.dial(recoveryConfig(e.config()))
	l := s.LUNs()[0]
	st := ioDuring(t, l, func() {
		time.Sleep(300 * time.Millisecond)
		e.crash()
		time.Sleep(200 * time.Millisecond)
		e.start()
		waitFor(t, "reconnected", 10*time.Second, func() bool { return s.Stats().LiveChannels == 2 })
		time.Sleep(300 * time.Millisecond)
		e.stop()
		time.Sleep(100 * time.Millisecond)
		e.start()
		waitFor(t, "reconnected again", 10*time.Second, func() bool { return s.Stats().LiveChannels == 2 })
	})
	ss := s.Stats()
	t.Logf("%d reads, %d writes; session %+v", st.reads.Load(), st.writes.Load(), ss)
	if ss.Reconnects < 2 {
		t.Errorf("%d reconnects", ss.Reconnects)
	}
}

// TestFastFailDevLoss: with the target gone for good, I/O is held, then fails with ErrFastFail
// after fast_io_fail_tmo, and the session is torn down after dev_loss_tmo (ErrSessionLost).
func TestFastFailDevLoss(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{})
	cfg := e.config()
	cfg.FastIOFailTmo = 400 * time.Millisecond
	cfg.DevLossTmo = 1200 * time.Millisecond
	cfg.CommandTimeout = 300 * time.Millisecond
	cfg.TaskMgmtTimeout = 200 * time.Millisecond
	cfg.ReconnectDelay = 50 * time.Millisecond
	s := e.dial(cfg)
	l := s.LUNs()[0]
	e.tgt.kill()
	start := time.Now()
	err := l.WriteAt(ctxT(t, 10*time.Second), make([]byte, 4096), 0, false)
	if !errors.Is(err, ErrFastFail) {
		t.Fatalf("write with the target gone: %v", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 3*time.Second {
		t.Errorf("failed after %v", d)
	}
	if st := s.State(); st != StateFailFast {
		t.Errorf("state %v", st)
	}
	if err := l.ReadAt(ctxT(t, time.Second), make([]byte, 512), 0); !errors.Is(err, ErrFastFail) {
		t.Errorf("read while failing fast: %v", err)
	}
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("session not lost")
	}
	if !errors.Is(s.Err(), ErrSessionLost) || s.State() != StateLost {
		t.Errorf("err %v state %v", s.Err(), s.State())
	}
	if err := l.ReadAt(ctxT(t, time.Second), make([]byte, 512), 0); !errors.Is(err, ErrSessionLost) {
		t.Errorf("read after dev loss: %v", err)
	}
	if got := NBDErrno(ErrSessionLost, false); got != 108 {
		t.Errorf("NBD errno %d", got)
	}
}

// TestHeldIOResumes: I/O issued while no channel is up waits (held) and completes once the
// target is back, within fast_io_fail_tmo.
func TestHeldIOResumes(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{})
	s := e.dial(recoveryConfig(e.config()))
	l := s.LUNs()[0]
	e.tgt.kill()
	done := make(chan error, 1)
	w := bytes.Repeat([]byte{0x3c}, 64<<10)
	go func() { done <- l.WriteAt(ctxT(t, 20*time.Second), w, 1<<20, false) }()
	time.Sleep(1500 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("write finished while the target was down: %v", err)
	default:
	}
	e.tgt.restart()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	checkBlock(t, l, 1<<20, w)
}

func TestTimerValidation(t *testing.T) {
	for _, c := range []struct {
		rd, ff, dl time.Duration
		ok         bool
	}{
		{10 * time.Second, 15 * time.Second, 600 * time.Second, true},
		{Off, Off, Off, false},
		{time.Second, 20 * time.Second, 10 * time.Second, false},
		{time.Second, 601 * time.Second, Off, false},
		{time.Second, Off, 601 * time.Second, false},
		{time.Second, Off, 600 * time.Second, true},
		{Off, 5 * time.Second, Off, true},
		{-2, time.Second, 2 * time.Second, false},
	} {
		if err := validTimers(c.rd, c.ff, c.dl); (err == nil) != c.ok {
			t.Errorf("%v/%v/%v: %v", c.rd, c.ff, c.dl, err)
		}
	}
}
