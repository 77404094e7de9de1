package frpool

import (
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
)

// Benchmarks on the deterministic double: they measure the pool's own cost (and the double's,
// which is the same in every variant) per operation, with allocations (-benchmem).
//
//	go test -run '^$' -bench . -benchmem ./frpool/

func benchEnv(b *testing.B, nMR, depth int) *env {
	return newEnv(b, Config{NumMRs: nMR, SQDepth: depth, MaxPages: 16})
}

// drain executes the posted WRs and hands the pool every send completion.
func (e *env) drain(tb testing.TB) {
	for e.qp.exec() {
	}
	for {
		wc, ok := e.qp.popSend()
		if !ok {
			return
		}
		if _, err := e.p.HandleSendCompletion(&wc); err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkRegistrations: Get + REG_MR + LOCAL_INV + completion processing, 16 MRs in flight per
// batch; reports registrations per second.
func BenchmarkRegistrations(b *testing.B) {
	const batch = 16
	e := benchEnv(b, batch, 4*batch)
	segs := e.buf(0, 16) // 64 KiB
	regs := make([]*Reg, batch)
	chain := Chain{}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	n := 0
	for n < b.N {
		for k := range regs {
			r, err := e.p.TryGet(segs, nopOwner{})
			if err != nil {
				b.Fatal(err)
			}
			regs[k] = r
		}
		chain = Chain{Reg: regs}
		if err := e.p.Post(&chain); err != nil {
			b.Fatal(err)
		}
		chain = Chain{Inv: regs}
		if err := e.p.Post(&chain); err != nil {
			b.Fatal(err)
		}
		e.drain(b)
		n += batch
	}
	// n, not b.N: the loop runs whole batches.
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "regs/s")
}

// BenchmarkIO compares one I/O's send-queue work on the initiator: with a pre-registered buffer
// (a signaled SEND carrying a fixed rkey) and with fast registration (REG_MR + SEND, then
// LOCAL_INV once the response is in, buffer handed back on its completion). The difference of the
// two ns/op is the extra cost per I/O of register + invalidate.
func BenchmarkIO(b *testing.B) {
	send := []transport.SendWR{{ID: 1, Opcode: transport.WRSend, Flags: transport.SendSignaled}}
	b.Run("preregistered", func(b *testing.B) {
		e := benchEnv(b, 1, 64)
		chain := Chain{WRs: send}
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if err := e.p.Post(&chain); err != nil {
				b.Fatal(err)
			}
			e.drain(b)
		}
	})
	b.Run("fastreg", func(b *testing.B) {
		e := benchEnv(b, 1, 64)
		segs := e.buf(0, 16)
		regs := make([]*Reg, 1)
		var chain Chain
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			r, err := e.p.TryGet(segs, nopOwner{})
			if err != nil {
				b.Fatal(err)
			}
			regs[0] = r
			chain = Chain{Reg: regs, WRs: send}
			if err := e.p.Post(&chain); err != nil {
				b.Fatal(err)
			}
			e.drain(b) // SEND completion; the response arrives
			if err := e.p.Invalidate(r); err != nil {
				b.Fatal(err)
			}
			e.drain(b) // LOCAL_INV completion: buffer back
		}
	})
}
