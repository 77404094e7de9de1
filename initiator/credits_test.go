package initiator

import (
	"testing"
	"time"

	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport/softroce/link"
)

// TestCreditsRespected: a target granting few credits (and checking every command against them)
// under a queue depth far beyond them: the initiator waits for credits instead of exceeding them,
// and keeps one in reserve for task management.
func TestCreditsRespected(t *testing.T) {
	for _, credits := range []int{2, 5} {
		e := newMemEnv(t, link.PipeConfig{}, tgtConfig{credits: credits, lunSize: 8 << 20})
		cfg := e.config()
		cfg.QueueDepth = 32
		s := e.dial(cfg)
		l := s.LUNs()[0]
		m := newModel(int(l.Size())/512, 512)
		runWorkload(ctxT(t, 2*time.Minute), t, l, m, workloadOpts{ops: 15, qds: []int{32}, maxSize: 64 << 10, mixed: true})
		if v := e.tgt.violations.Load(); v != 0 {
			t.Errorf("credits %d: %d commands beyond the credits granted", credits, v)
		}
		if s.Stats().CreditWaits == 0 {
			t.Errorf("credits %d: never waited for credits", credits)
		}
		c := s.chans[0]
		c.mu.Lock()
		lim := c.reqLim
		c.mu.Unlock()
		if lim != int32(credits) {
			t.Errorf("credits %d: %d left when idle", credits, lim)
		}
	}
}

// TestTargetRequests: SRP_CRED_REQ adds credits and SRP_AER_REQ is logged; both are answered
// (CRED_RSP, AER_RSP) without using a credit. A session that starts with too few credits to
// send a command (one, reserved for task management) waits until a CRED_REQ grants more.
func TestTargetRequests(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{credits: 1})
	go func() {
		for len(e.tgt.channels()) == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
		e.tgt.channels()[0].sendTargetIU(srp.OpCredReq, 9, 0)
	}()
	s := e.dial(e.config())
	waitFor(t, "CRED_RSP", 5*time.Second, func() bool { return e.tgt.credRsps.Load() == 1 })
	if st := s.Stats(); st.CredReqs != 1 || st.CreditWaits == 0 {
		t.Errorf("stats %+v", st)
	}
	ch := e.tgt.channels()[0]
	ch.sendTargetIU(srp.OpAerReq, 2, 0)
	waitFor(t, "AER_RSP", 5*time.Second, func() bool { return e.tgt.aerRsps.Load() == 1 })
	// 1 + 9 + 2 credits granted; the responses used none.
	c := s.chans[0]
	waitFor(t, "credits", 5*time.Second, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.reqLim == 12
	})
	if got := ch.creditsNow(); got != 12 {
		t.Errorf("target counts %d credits", got)
	}
	if v := e.tgt.violations.Load(); v != 0 {
		t.Errorf("%d violations", v)
	}
	if err := s.LUNs()[0].WriteAt(ctxT(t, 5*time.Second), make([]byte, 512), 0, false); err != nil {
		t.Fatal(err)
	}
}

// TestCreditProbe: a target that hands credits back only with task management responses
// starves a channel once nothing is in flight; the initiator spends its reserved credit on a
// harmless task management function to collect them, instead of hanging.
func TestCreditProbe(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{credits: 4})
	s := e.dial(e.config())
	l := s.LUNs()[0]
	e.tgt.stingy.Store(true)
	ctx := ctxT(t, 20*time.Second)
	for i := 0; i < 20; i++ {
		if err := l.WriteAt(ctx, make([]byte, 4096), int64(i)*4096, false); err != nil {
			t.Fatal(err)
		}
	}
	if e.tgt.tms.Load() == 0 || s.Stats().TaskMgmt == 0 {
		t.Errorf("no credit probe: %+v", s.Stats())
	}
	if v := e.tgt.violations.Load(); v != 0 {
		t.Errorf("%d violations", v)
	}
}
