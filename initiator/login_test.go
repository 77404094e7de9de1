package initiator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
)

// TestLoginRejects: every SRP_LOGIN_REJ reason surfaces as a *LoginRejectError with that reason
// (and errors.Is ErrLoginRejected); a CM reject without SRP data keeps the CM reason.
func TestLoginRejects(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{})
	reasons := []srp.RejectReason{
		srp.RejUnableEstablishChannel, srp.RejInsufficientResources, srp.RejITIULenTooLarge,
		srp.RejUnableAssociateChannel, srp.RejUnsupportedDescFormat, srp.RejMultiChannelUnsupported,
		srp.RejChannelLimitReached,
	}
	for _, reason := range reasons {
		e.tgt.cfg.reject = reason
		cfg := e.config()
		cfg.DisableIndirect = true // so that 0x00010004 is final too
		cfg.MaxITIULen = 64        // so that 0x00010002 cannot be negotiated down
		cfg.DisableImmediateData = true
		_, err := Dial(ctxT(t, 10*time.Second), cfg)
		var lre *LoginRejectError
		if !errors.As(err, &lre) || lre.Reason != reason || !errors.Is(err, ErrLoginRejected) ||
			lre.CMReason != transport.RejectConsumerDefined || lre.Channel != 0 {
			t.Errorf("reason %v: got %v (%#v)", reason, err, lre)
			continue
		}
		// The hints name what the target most likely means.
		if want := map[srp.RejectReason]string{
			srp.RejChannelLimitReached:    "no ACL for this initiator port ID on the target (initiator port " + lre.InitiatorPortID.String() + ")",
			srp.RejUnableAssociateChannel: "wrong target port ID (" + cfg.TargetPortID.String() + " is not the target's)",
			srp.RejITIULenTooLarge:        "the target accepts IUs shorter than 64 bytes only",
		}[reason]; want != "" && (lre.InitiatorPortID == (srp.PortID{}) || !strings.Contains(err.Error(), want)) {
			t.Errorf("reason %v: %q does not say %q", reason, err, want)
		}
	}
	e.tgt.cfg.reject = 0

	// A reject by the CM itself (nobody listening): no SRP reason.
	cfg := e.config()
	cfg.Dialer = &testDialer{local: e.ini.Addrs()[0], timeout: 14, accept: func(acceptReq) (acceptRep, error) {
		return acceptRep{}, &transport.RejectError{Reason: transport.RejectInvalidServiceID}
	}}
	_, err := Dial(ctxT(t, 10*time.Second), cfg)
	var lre *LoginRejectError
	if !errors.As(err, &lre) || lre.Reason != 0 || lre.CMReason != transport.RejectInvalidServiceID ||
		!strings.HasSuffix(err.Error(), ": nothing listens on that CM port (check port and target)") {
		t.Errorf("CM reject: %v", err)
	}
	// Neither REP nor REJ within the connect timeout: no CM answered.
	cfg.Dialer = &testDialer{local: e.ini.Addrs()[0], timeout: 14, accept: func(acceptReq) (acceptRep, error) {
		return acceptRep{}, context.DeadlineExceeded
	}}
	if _, err := Dial(ctxT(t, 10*time.Second), cfg); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "nothing answers on that CM port") {
		t.Errorf("no answer: %v", err)
	}

	// Unreachable target: a plain connection error, not a reject.
	cfg.Dialer = &testDialer{local: e.ini.Addrs()[0], timeout: 14, accept: func(acceptReq) (acceptRep, error) {
		return acceptRep{}, transport.ErrConnUnreachable
	}}
	if _, err := Dial(ctxT(t, 10*time.Second), cfg); !errors.Is(err, transport.ErrConnUnreachable) || errors.Is(err, ErrLoginRejected) {
		t.Errorf("unreachable: %v", err)
	}

	// Wrong target port: 0x00010003 from the target's own check.
	cfg = e.config()
	cfg.TargetPortID = srp.MakePortID(1, 2)
	if _, err := Dial(ctxT(t, 10*time.Second), cfg); !errors.As(err, &lre) || lre.Reason != srp.RejUnableAssociateChannel ||
		!strings.Contains(err.Error(), "wrong target port ID ("+cfg.TargetPortID.String()+" is not the target's)") {
		t.Errorf("wrong target port: %v", err)
	}
}

// TestNegotiateDown: a target that refuses the IU length (0x00010002) is asked again with smaller
// ones until it accepts; the immediate-data size and descriptor count follow. A target without
// indirect descriptors (0x00010004) is asked again with direct descriptors only.
func TestNegotiateDown(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{maxITIULen: 2116, noIndirect: true})
	cfg := e.config()
	cfg.MaxPagesPerMR = 4 // would like 16 descriptors per command
	cfg.CmdSGEntries = 16
	s := e.dial(cfg)
	e.tgt.mu.Lock()
	logins := append([]srp.LoginReq(nil), e.tgt.logins...)
	e.tgt.mu.Unlock()
	var lens []uint32
	for _, l := range logins {
		lens = append(lens, l.ReqITIULen)
	}
	want := []uint32{8260, 4164, 2116, 2116}
	if len(lens) != len(want) {
		t.Fatalf("login IU lengths %v, want %v", lens, want)
	}
	for i := range want {
		if lens[i] != want[i] {
			t.Fatalf("login IU lengths %v, want %v", lens, want)
		}
	}
	if last := logins[len(logins)-1]; last.BufFmt != srp.BufFormatDirect {
		t.Errorf("last login formats %#x, want direct only", last.BufFmt)
	}
	c := s.chans[0]
	if c.params.txIULen != 2116 || c.params.maxImm != 2048 || c.params.maxDescs != 1 || c.capacity() != 16<<10 {
		t.Errorf("negotiated %+v capacity %d", c.params, c.capacity())
	}
	// Large I/O still works: 16 KiB commands with direct descriptors, 2 KiB immediate writes.
	l := s.LUNs()[0]
	m := newModel(int(l.Size())/l.BlockSize(), l.BlockSize())
	ctx := ctxT(t, 2*time.Minute)
	runWorkload(ctx, t, l, m, workloadOpts{ops: scaled(20), qds: []int{8}, maxSize: 256 << 10, mixed: true})
	verifyAll(ctx, t, l, m)
	if e.tgt.indirect.Load() != 0 || e.tgt.immCmds.Load() == 0 {
		t.Errorf("indirect %d, immediate %d", e.tgt.indirect.Load(), e.tgt.immCmds.Load())
	}
}

// TestMultichannel: channel 0 logs in SINGLE, the others MULTI; commands spread over all of them.
// A target without multichannel support refuses the others (0x00010005): the session goes on
// with one channel and does not retry them.
func TestMultichannel(t *testing.T) {
	t.Run("four", func(t *testing.T) {
		e := newMemEnv(t, link.PipeConfig{}, tgtConfig{})
		cfg := e.config()
		cfg.ChCount = 4
		s := e.dial(cfg)
		e.tgt.mu.Lock()
		logins := append([]srp.LoginReq(nil), e.tgt.logins...)
		e.tgt.mu.Unlock()
		if len(logins) != 4 {
			t.Fatalf("%d logins", len(logins))
		}
		for i, l := range logins {
			want := srp.MultiChanMulti
			if i == 0 {
				want = srp.MultiChanSingle
			}
			if l.MultiChannel() != want || l.InitiatorPortID != s.InitiatorPortID() {
				t.Errorf("login %d: %+v", i, l)
			}
		}
		if got := s.Stats().LiveChannels; got != 4 {
			t.Fatalf("live channels %d", got)
		}
		l := s.LUNs()[0]
		m := newModel(int(l.Size())/l.BlockSize(), l.BlockSize())
		ctx := ctxT(t, 2*time.Minute)
		runWorkload(ctx, t, l, m, workloadOpts{ops: 20, qds: []int{16}, maxSize: 64 << 10})
		for _, c := range e.tgt.channels() {
			if c.creditsNow() == 32 && e.tgt.cmds.Load() > 0 {
				// every channel must have carried commands: credits were used at some point
			}
		}
		used := 0
		for _, c := range s.chans {
			if c.reqs[0].gen > 0 || c.reqs[1].gen > 0 {
				used++
			}
		}
		if used != 4 {
			t.Errorf("commands on %d of 4 channels", used)
		}
	})
	t.Run("unsupported", func(t *testing.T) {
		e := newMemEnv(t, link.PipeConfig{}, tgtConfig{maxChannels: 1})
		cfg := e.config()
		cfg.ChCount = 3
		s := e.dial(cfg)
		if got := s.Stats().LiveChannels; got != 1 {
			t.Fatalf("live channels %d", got)
		}
		time.Sleep(300 * time.Millisecond) // reconnect attempts would show up as logins
		e.tgt.mu.Lock()
		n := len(e.tgt.logins)
		e.tgt.mu.Unlock()
		if n != 3 {
			t.Errorf("%d logins, want 3 (no retries of refused channels)", n)
		}
		for _, c := range s.chans[1:] {
			if c.getState() != chDisabled {
				t.Errorf("channel %d %v", c.idx, c.getState())
			}
		}
		l := s.LUNs()[0]
		if err := l.WriteAt(ctxT(t, 10*time.Second), make([]byte, 4096), 0, false); err != nil {
			t.Fatal(err)
		}
	})
}

var _ = context.Background
