package initiator

import (
	"testing"
	"time"

	"github.com/srpd/srpd/transport/softroce/link"
)

// TestRandomIO runs random mixed-size I/O (one block to 1 MiB, queue depths 1 to 64) with every
// byte checked against a model, in several configurations: one MR per command (direct
// descriptors), many small MRs per command (indirect descriptors), two channels, remote
// invalidation, 1 % packet loss with duplicates and reordering, and UDP on loopback.
func TestRandomIO(t *testing.T) {
	type scenario struct {
		name  string
		pipe  link.PipeConfig
		udp   bool
		tc    tgtConfig
		setup func(*Config)
		ops   int
	}
	lossy := link.Faults{Drop: 0.01, Duplicate: 0.005, Reorder: 0.005}
	scenarios := []scenario{
		{name: "direct", ops: 40},
		{name: "direct-inv", ops: 40, tc: tgtConfig{sendInv: true}},
		{name: "indirect-2ch", tc: tgtConfig{sendInv: true}, ops: 40, setup: func(c *Config) {
			c.MaxPagesPerMR = 4 // 16 KiB per MR: a 256 KiB command uses 16 descriptors
			c.CmdSGEntries = 16
			c.ChCount = 2
		}},
		{name: "loss-1pct", pipe: link.PipeConfig{Seed: 7, AtoB: lossy, BtoA: lossy, QueueLen: 1024}, tc: tgtConfig{sendInv: true}, ops: 20,
			setup: func(c *Config) {
				c.ChCount = 2
				c.MaxPagesPerMR = 16
			}},
		{name: "udp", udp: true, ops: 30, setup: func(c *Config) { c.ChCount = 2 }},
		{name: "udp-nohandler", udp: true, ops: 30, setup: func(c *Config) {
			c.ChCount = 2
			c.NoCompletionHandler = true
		}},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			sc.tc.lunSize = 32 << 20
			var e *env
			if sc.udp {
				e = newUDPEnv(t, sc.tc)
			} else {
				e = newMemEnv(t, sc.pipe, sc.tc)
			}
			cfg := e.config()
			cfg.QueueDepth = 64
			if sc.setup != nil {
				sc.setup(&cfg)
			}
			s := e.dial(cfg)
			l := s.LUNs()[0]
			m := newModel(int(l.Size())/l.BlockSize(), l.BlockSize())
			ctx := ctxT(t, 5*time.Minute)
			st := runWorkload(ctx, t, l, m, workloadOpts{ops: scaled(sc.ops), qds: []int{1, 16, 64}, maxSize: 1 << 20, mixed: true})
			verifyAll(ctx, t, l, m)
			ss := s.Stats()
			t.Logf("%d reads, %d writes, %d other, %d MiB; session %+v; target: %d commands, %d immediate, %d indirect, max %d in flight",
				st.reads.Load(), st.writes.Load(), st.others.Load(), st.bytes.Load()>>20, ss,
				e.tgt.cmds.Load(), e.tgt.immCmds.Load(), e.tgt.indirect.Load(), e.tgt.maxInflight.Load())
			if v := e.tgt.violations.Load(); v != 0 {
				t.Fatalf("%d commands beyond the credits granted", v)
			}
			if sc.name == "indirect-2ch" && e.tgt.indirect.Load() == 0 {
				t.Errorf("no indirect descriptors used")
			}
			if e.tgt.immCmds.Load() == 0 {
				t.Errorf("no immediate data used")
			}
			// softroce runs completion handlers: responses are handled on its receive
			// goroutine (at least some: the channel goroutine takes them while it is busy).
			if off := cfg.NoCompletionHandler; (ss.HandlerBatches == 0) != off {
				t.Errorf("%d completion batches on the transport's goroutine (NoCompletionHandler %v)", ss.HandlerBatches, off)
			}
		})
	}
}
