package softroce

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
)

// TestLossyPipelineNoRetryExceeded: a deep pipeline of mixed WRITEs, READs and SENDs up to 64 KiB
// over a link with 1% drop, duplicates and reordering, with the retry settings ib_srp uses
// (retry_cnt 6 — here 7 attempts — and a 67 ms local ACK timeout) must complete every WR: loss
// slows it down, it never exhausts the retry budget while each round makes progress.
func TestLossyPipelineNoRetryExceeded(t *testing.T) {
	drop := 0.01
	f := link.Faults{Drop: drop, Duplicate: drop / 2, Reorder: drop / 2, ReorderDistance: 3}
	a, b, _, _ := newPipePair(t, link.PipeConfig{Seed: testSeed(), AtoB: f, BtoA: f, QueueLen: 1024}, nodeOpts{memSize: 8 << 20})
	t.Cleanup(func() { a.close(); b.close() })
	connect(a, b, connOpts{timeout: 14, retry: 6, rnrRetry: 6})
	rng := rand.New(rand.NewPCG(testSeed(), 1))
	total, depth := 1500, 32
	if testing.Short() {
		total = 300
	}
	for i := 0; i < 256; i++ {
		if err := b.qp.PostRecv([]transport.RecvWR{{ID: uint64(i), SGL: []transport.SGE{b.sge(4<<20, 8192)}}}); err != nil {
			t.Fatal(err)
		}
	}
	posted, done, recvs := 0, 0, 0
	var wcs [64]transport.WC
	deadline := time.Now().Add(5 * time.Minute)
	for done < total {
		for posted < total && posted-done < depth {
			n := 1 + rng.IntN(64<<10)
			var wr transport.SendWR
			switch rng.IntN(3) {
			case 0:
				wr = transport.SendWR{Opcode: transport.WRRDMAWrite, SGL: []transport.SGE{a.sge(0, n)}, RemoteAddr: b.mem.Addr(), RKey: b.mr.RKey()}
			case 1:
				wr = transport.SendWR{Opcode: transport.WRRDMARead, SGL: []transport.SGE{a.sge(1<<20, n)}, RemoteAddr: b.mem.Addr() + 1<<20, RKey: b.mr.RKey()}
			case 2:
				wr = transport.SendWR{Opcode: transport.WRSend, SGL: []transport.SGE{a.sge(2<<20, min(n, 8192))}}
			}
			wr.ID = uint64(posted)
			wr.Flags = transport.SendSignaled
			if err := a.qp.PostSend([]transport.SendWR{wr}); err != nil {
				t.Fatal(err)
			}
			posted++
		}
		k := a.scq.Poll(wcs[:])
		for _, wc := range wcs[:k] {
			if wc.Status != transport.WCSuccess {
				t.Fatalf("after %d: %+v (%v); stats a %+v\nb %+v", done, wc, wc.Status, a.dev.Stats(), b.dev.Stats())
			}
			done++
		}
		m := b.rcq.Poll(wcs[:])
		for _, wc := range wcs[:m] {
			if wc.Status != transport.WCSuccess {
				t.Fatalf("recv %+v", wc)
			}
			recvs++
			if err := b.qp.PostRecv([]transport.RecvWR{{ID: wc.ID, SGL: []transport.SGE{b.sge(4<<20, 8192)}}}); err != nil {
				t.Fatal(err)
			}
		}
		if k == 0 && m == 0 {
			time.Sleep(100 * time.Microsecond)
		}
		if time.Now().After(deadline) {
			t.Fatalf("stuck at %d", done)
		}
	}
	if recvs == 0 {
		t.Fatal("no SEND arrived")
	}
	t.Logf("%d WRs, %d SENDs received; requester stats %+v", done, recvs, a.dev.Stats())
}
