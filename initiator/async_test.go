package initiator

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/target"
	"github.com/srpd/srpd/transport/softroce/link"
)

// asyncWait runs op (which must call done once) and waits, bounded, for its result.
func asyncWait(t *testing.T, d time.Duration, op func(done func(error))) error {
	t.Helper()
	errc := make(chan error, 2)
	op(func(err error) { errc <- err })
	select {
	case err := <-errc:
		select {
		case <-errc:
			t.Fatal("done called twice")
		case <-time.After(20 * time.Millisecond):
		}
		return err
	case <-time.After(d):
		t.Fatalf("no completion in %v", d)
		return nil
	}
}

// TestAsyncIO: ReadAtAsync and WriteAtAsync with up to 16 commands in flight on two channels
// (more than the free slots and credits at times, so the fallback goroutine path runs too), mixed
// sizes up to 256 KiB (some beyond one command: split on the fallback path); every byte read back
// matches what was written, every done runs once, and no slot leaks (the session closes cleanly
// with every slot back).
func TestAsyncIO(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{lunSize: 16 << 20, credits: 8})
	cfg := e.config()
	cfg.ChCount = 2
	cfg.QueueDepth = 8
	cfg.MaxPagesPerMR = 16 // 64 KiB per MR: 256 KiB takes 4 descriptors
	s := e.dial(cfg)
	l := s.LUNs()[0]
	bs := l.BlockSize()
	ctx := ctxT(t, 2*time.Minute)
	rng := rand.New(rand.NewPCG(41, 42))
	const regions = 64
	region := int64(256 << 10)
	want := make([][]byte, regions)
	for round := 0; round < 6; round++ {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var firstErr error
		fail := func(err error) {
			mu.Lock()
			if firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
		}
		perm := rng.Perm(regions)[:16]
		for _, k := range perm {
			n := bs * (1 + rng.IntN(int(region)/bs))
			b := make([]byte, n)
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
			want[k] = b
			wg.Add(1)
			l.WriteAtAsync(ctx, b, int64(k)*region, round%2 == 1, func(err error) {
				if err != nil {
					fail(err)
				}
				wg.Done()
			})
		}
		wg.Wait()
		if firstErr != nil {
			t.Fatalf("round %d write: %v", round, firstErr)
		}
		got := make([][]byte, len(perm))
		for i, k := range perm {
			got[i] = make([]byte, len(want[k]))
			wg.Add(1)
			l.ReadAtAsync(ctx, got[i], int64(k)*region, func(err error) {
				if err != nil {
					fail(err)
				}
				wg.Done()
			})
		}
		wg.Wait()
		if firstErr != nil {
			t.Fatalf("round %d read: %v", round, firstErr)
		}
		for i, k := range perm {
			if !bytes.Equal(got[i], want[k]) {
				t.Fatalf("round %d: region %d (%d bytes) differs", round, k, len(want[k]))
			}
		}
	}
	// Bad requests complete at once with the block API's errors.
	if err := asyncWait(t, time.Second, func(done func(error)) { l.ReadAtAsync(ctx, make([]byte, 100), 0, done) }); !errors.Is(err, ErrRange) {
		t.Errorf("unaligned read: %v", err)
	}
	if err := asyncWait(t, time.Second, func(done func(error)) {
		l.WriteAtAsync(ctx, make([]byte, bs), l.Size(), false, done)
	}); !errors.Is(err, ErrRange) {
		t.Errorf("write past the end: %v", err)
	}
	if st := s.Stats(); st.Timeouts != 0 || st.Retries > 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestAsyncTimeout: an asynchronous write the target holds times out (the watchdog, since no
// caller waits), is aborted and re-issued on a goroutine; done reports success once, the data
// is there, and the credits come back.
func TestAsyncTimeout(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{credits: 4})
	cfg := e.config()
	cfg.CommandTimeout = 300 * time.Millisecond
	s := e.dial(cfg)
	l := s.LUNs()[0]
	held := holdWrite(e.tgt, 2000)
	w := bytes.Repeat([]byte{0x5a}, 8192)
	start := time.Now()
	if err := asyncWait(t, 20*time.Second, func(done func(error)) { l.WriteAtAsync(ctxT(t, time.Minute), w, 2000*512, false, done) }); err != nil {
		t.Fatal(err)
	}
	if !held.Load() {
		t.Fatal("nothing was held")
	}
	if d := time.Since(start); d < cfg.CommandTimeout {
		t.Errorf("completed after %v, before the command timeout", d)
	}
	checkBlock(t, l, 2000*512, w)
	st := s.Stats()
	if st.Timeouts != 1 || st.Aborts != 1 || e.tgt.aborts.Load() != 1 {
		t.Errorf("stats %+v, target aborts %d", st, e.tgt.aborts.Load())
	}
	// Every slot and credit is back: a full burst of asynchronous reads completes.
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := 0; i < 32; i++ {
		wg.Add(1)
		l.ReadAtAsync(ctxT(t, time.Minute), make([]byte, 4096), int64(i)*4096, func(err error) {
			if err != nil {
				errs <- err
			}
			wg.Done()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if v := e.tgt.violations.Load(); v != 0 {
		t.Errorf("%d credit violations", v)
	}
}

// TestAsyncSessionClose: closing the session with an asynchronous command held by the target
// completes it (done with an error) and releases every slot.
func TestAsyncSessionClose(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{})
	cfg := e.config()
	cfg.TeardownTimeout = time.Second
	s := e.dial(cfg)
	l := s.LUNs()[0]
	held := holdWrite(e.tgt, 3000)
	errc := make(chan error, 2)
	l.WriteAtAsync(ctxT(t, time.Minute), make([]byte, 4096), 3000*512, false, func(err error) { errc <- err })
	deadline := time.Now().Add(10 * time.Second)
	for !held.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !held.Load() {
		t.Fatal("nothing was held")
	}
	if err := s.Close(ctxT(t, 200*time.Millisecond)); err != nil {
		t.Logf("close: %v", err)
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Error("a write the target never answered reported success")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("done not called after the session closed")
	}
	if s.busy() {
		t.Error("request slots still held after close")
	}
}

// TestAsyncLocalInline: with the target on the initiator's softroce device, an asynchronous
// command posted while nothing else is in flight is carried out on the posting goroutine
// (transport.Progresser): the target executes and answers it and its done runs before
// ReadAtAsync/WriteAtAsync return. Every byte read back matches what was written.
func TestAsyncLocalInline(t *testing.T) {
	e := newLocalEnv(t, target.Limits{}, 1, 8<<20)
	cfg := e.config()
	cfg.ChCount = 2
	s := e.dial(cfg)
	l := s.LUNs()[0]
	ctx := ctxT(t, time.Minute)
	rng := rand.New(rand.NewPCG(7, 8))
	const ios = 60
	inline := 0
	for i := 0; i < ios; i++ {
		n := l.BlockSize() * (1 + rng.IntN(64))
		off := int64(rng.IntN(int(l.Size())-n)) / int64(l.BlockSize()) * int64(l.BlockSize())
		w := make([]byte, n)
		for j := range w {
			w[j] = byte(rng.Uint32())
		}
		r := make([]byte, n)
		for k, op := range []func(done func(error)){
			func(done func(error)) { l.WriteAtAsync(ctx, w, off, false, done) },
			func(done func(error)) { l.ReadAtAsync(ctx, r, off, done) },
		} {
			returned := false
			var early bool
			err := asyncWait(t, 10*time.Second, func(done func(error)) {
				op(func(err error) {
					early = !returned // runs on this goroutine if inline: no race
					done(err)
				})
				returned = true
			})
			if err != nil {
				t.Fatalf("I/O %d op %d: %v", i, k, err)
			}
			if early {
				inline++
			}
		}
		if !bytes.Equal(r, w) {
			t.Fatalf("I/O %d: %d bytes at %d differ", i, n, off)
		}
	}
	// Nothing else runs on the device, so every command should complete inline; allow for a
	// loopback drain that was still finishing the previous command's acknowledgements.
	t.Logf("%d of %d commands completed on the posting goroutine", inline, 2*ios)
	if inline < ios { // at least half
		t.Errorf("only %d of %d commands completed on the posting goroutine", inline, 2*ios)
	}
	if st := e.ini.Stats(); st.LoopPackets == 0 || st.TxPackets != 0 {
		t.Errorf("device stats %+v: want loopback only", st)
	}
}

// TestAsyncNoTimeoutCancel: with CommandTimeout Off, an asynchronous command the target never
// answers ends when its context is cancelled (an NBD connection that closes does not wait
// forever for it).
func TestAsyncNoTimeoutCancel(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{credits: 4})
	cfg := e.config()
	cfg.CommandTimeout = Off
	s := e.dial(cfg)
	l := s.LUNs()[0]
	held := holdWrite(e.tgt, 3000)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	err := asyncWait(t, 20*time.Second, func(done func(error)) {
		l.WriteAtAsync(ctx, make([]byte, 4096), 3000*512, false, done)
	})
	if !held.Load() {
		t.Fatal("nothing was held")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("ended after %v, before the cancel", d)
	}
}

// TestByteCounters: Stats.BytesRead and BytesWritten count the data of READ(16)/WRITE(16)s
// that completed GOOD, on the synchronous and the asynchronous path (the daemon reports them as
// a connection's read and write bytes); a failed command adds nothing.
func TestByteCounters(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{lunSize: 8 << 20})
	s := e.dial(e.config())
	l := s.LUNs()[0]
	ctx := ctxT(t, time.Minute)
	buf := make([]byte, 64<<10)
	if err := l.WriteAt(ctx, buf, 0, false); err != nil { // 64 KiB
		t.Fatal(err)
	}
	if err := asyncWait(t, 20*time.Second, func(done func(error)) {
		l.WriteAtAsync(ctx, buf[:4096], 1<<20, false, done)
	}); err != nil {
		t.Fatal(err)
	}
	if err := l.ReadAt(ctx, buf[:8192], 0); err != nil {
		t.Fatal(err)
	}
	if err := asyncWait(t, 20*time.Second, func(done func(error)) {
		l.ReadAtAsync(ctx, buf[:512], 1<<20, done)
	}); err != nil {
		t.Fatal(err)
	}
	// Commands the target fails (a medium error on every READ(16) and WRITE(16)) count nothing.
	e.tgt.mu.Lock()
	e.tgt.refuse = func(cdb []byte) *scsi.Sense {
		if cdb[0] == scsi.OpRead16 || cdb[0] == scsi.OpWrite16 {
			return &scsi.Sense{Key: scsi.MediumError, ASC: 0x11}
		}
		return nil
	}
	e.tgt.mu.Unlock()
	if err := l.ReadAt(ctx, buf[:4096], 0); !errors.Is(err, ErrMediumError) {
		t.Fatalf("refused read: %v, want a medium error", err)
	}
	if err := asyncWait(t, 20*time.Second, func(done func(error)) {
		l.WriteAtAsync(ctx, buf[:4096], 0, false, done)
	}); !errors.Is(err, ErrMediumError) {
		t.Fatalf("refused async write: %v, want a medium error", err)
	}
	st := s.Stats()
	if st.BytesWritten != 64<<10+4096 || st.BytesRead != 8192+512 {
		t.Errorf("BytesWritten %d (want %d), BytesRead %d (want %d)", st.BytesWritten, 64<<10+4096, st.BytesRead, 8192+512)
	}
}
