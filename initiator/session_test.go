package initiator

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport/softroce/link"
)

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestLoginDiscoveryIO(t *testing.T) {
	for _, form := range []LoginForm{LoginRDMACM, LoginIBCM} {
		t.Run(form.String(), func(t *testing.T) {
			e := newMemEnv(t, link.PipeConfig{}, tgtConfig{nLUNs: 2, lunSize: 8 << 20})
			cfg := e.config()
			cfg.LoginForm = form
			s := e.dial(cfg)
			luns := s.LUNs()
			if len(luns) != 2 {
				t.Fatalf("LUNs: %d, want 2", len(luns))
			}
			for i, l := range luns {
				inf := l.Info()
				if inf.Number != uint64(i) || inf.BlockSize != 512 || inf.Blocks != (8<<20)/512 {
					t.Errorf("LUN %d: %+v", i, inf)
				}
				if inf.IDType != "naa" || len(inf.ID) != 16 || inf.Vendor != "SRPD" || inf.Serial == "" {
					t.Errorf("LUN %d identification: %q %q %q %s", i, inf.Vendor, inf.Product, inf.Serial, inf.IDString())
				}
				if !inf.UnmapSupported || !l.CanDiscard() || l.ReadOnly() {
					t.Errorf("LUN %d capabilities: %+v", i, inf)
				}
			}
			if a, b := luns[0].Info().IDString(), luns[1].Info().IDString(); a == b {
				t.Errorf("both LUNs have ID %s", a)
			}
			e.tgt.mu.Lock()
			lr := e.tgt.logins[0]
			e.tgt.mu.Unlock()
			if lr.MultiChannel() != srp.MultiChanSingle || lr.Flags&srp.ImmedRequested == 0 ||
				lr.ImmDataOffset != 68 || lr.InitiatorPortID.IDExt() != 1 || lr.TargetPortID != testTargetPort {
				t.Errorf("login request %+v", lr)
			}
			ctx := ctxT(t, 20*time.Second)
			l := luns[1]
			for _, n := range []int{512, 4096, 8192, 64 << 10, 256 << 10, 1 << 20} {
				w := bytes.Repeat([]byte{byte(n), byte(n >> 8), 0x5a}, n/3+1)[:n]
				off := int64(n) * 3
				if err := l.WriteAt(ctx, w, off, n == 4096); err != nil {
					t.Fatalf("write %d: %v", n, err)
				}
				r := make([]byte, n)
				if err := l.ReadAt(ctx, r, off); err != nil {
					t.Fatalf("read %d: %v", n, err)
				}
				if !bytes.Equal(r, w) {
					t.Fatalf("read %d: data differs", n)
				}
			}
			if err := l.Flush(ctx); err != nil {
				t.Fatalf("flush: %v", err)
			}
			st := s.Stats()
			if st.ImmediateData == 0 || e.tgt.immCmds.Load() == 0 {
				t.Errorf("no immediate-data writes: %+v", st)
			}
			if e.tgt.indirect.Load() != 0 {
				t.Errorf("indirect descriptors with one MR per command")
			}
			if err := s.Close(ctx); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := l.ReadAt(ctx, make([]byte, 512), 0); !errors.Is(err, ErrClosed) {
				t.Fatalf("read after close: %v", err)
			}
			waitFor(t, "target channels gone", 5*time.Second, func() bool { return len(e.tgt.channels()) == 0 })
			if v := e.tgt.violations.Load(); v != 0 {
				t.Errorf("credit violations: %d", v)
			}
		})
	}
}
