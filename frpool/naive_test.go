package frpool

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/srpd/srpd/transport"
)

// naivePool is a deliberately naive pool that follows ib_srp's 2021 ordering
// (drivers/infiniband/ulp/srp/ib_srp.c: srp_map_finish_fr, srp_unmap_data, srp_fr_pool_get/put),
// kept only to show that the harness catches it:
//
//   - get: take the first MR of the free list (srp_fr_pool_get), bump the key byte in software at
//     once (ib_inc_rkey + ib_update_fast_reg_key) and rewrite the MR's one CPU-side page list
//     (ib_map_mr_sg), then post an unsignaled REG_MR;
//   - unmap: post an unsignaled LOCAL_INV naming the MR's current software key, put the MR straight
//     back on the free list (srp_fr_pool_put: "caller must already have queued an invalidation")
//     and hand the buffer back (dma_unmap) — nothing waits for the invalidation to execute;
//   - QP error: tear everything down and re-create the MR pool (srp_rport_reconnect).
type naivePool struct {
	pd    transport.PD
	qp    transport.QP
	all   []*naiveMR
	free  []*naiveMR // LIFO, as list_add + list_first_entry
	owner func(h any, err error)
	ps    uint64
	id    uint64
	regs  map[*naiveReg]bool // mapped and not unmapped
	nmr   int
	pages int
}

type naiveMR struct {
	mr    transport.MR
	key   uint32   // ib_mr.rkey: the software key
	pages []uint64 // ib_mr's page list: one per MR, rewritten by every map
}

type naiveReg struct {
	m      *naiveMR
	key    uint32
	iova   uint64
	length uint64
	n      int
	posted bool
}

func newNaivePool(pd transport.PD, qp transport.QP, nmr, pages int, owner func(any, error)) (*naivePool, error) {
	p := &naivePool{pd: pd, qp: qp, owner: owner, ps: fakePage, regs: map[*naiveReg]bool{}, nmr: nmr, pages: pages}
	return p, p.alloc()
}

func (p *naivePool) alloc() error {
	p.all, p.free = nil, nil
	for i := 0; i < p.nmr; i++ {
		mr, err := p.pd.AllocFastRegMR(p.pages)
		if err != nil {
			return err
		}
		m := &naiveMR{mr: mr, key: mr.RKey(), pages: make([]uint64, p.pages)}
		p.all = append(p.all, m)
		p.free = append(p.free, m)
	}
	return nil
}

func (p *naivePool) get(segs []Seg) (any, error) {
	n, length, err := mapSegs(segs, p.ps, p.pages)
	if err != nil {
		return nil, err
	}
	if len(p.free) == 0 {
		return nil, ErrExhausted
	}
	m := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	m.key = m.key&^0xff | (m.key+1)&0xff // ib_inc_rkey + ib_update_fast_reg_key
	fillPages(m.pages, segs, p.ps)       // ib_map_mr_sg rewrites the MR's page list now
	r := &naiveReg{m: m, key: m.key, iova: segs[0].Addr, length: length, n: n}
	p.regs[r] = true
	return r, nil
}

func (p *naivePool) cancel(h any) error {
	r := h.(*naiveReg)
	if !p.regs[r] {
		return nil // from before a recovery: its MR is gone
	}
	delete(p.regs, r)
	p.free = append(p.free, r.m)
	return nil
}

func (p *naivePool) rkey(h any) uint32 { return h.(*naiveReg).key }

func (p *naivePool) post(h any, send *transport.SendWR, inv any) error {
	var wrs []transport.SendWR
	if h != nil && !p.regs[h.(*naiveReg)] {
		return ErrQPError // mapped before a recovery
	}
	if h != nil {
		r := h.(*naiveReg)
		p.id++
		wrs = append(wrs, transport.SendWR{ID: WRIDTag | p.id, Opcode: transport.WRRegMR, Reg: transport.RegMRWR{
			MR: r.m.mr, Key: r.m.key, Access: transport.AccessLocalWrite | transport.AccessRemoteRead | transport.AccessRemoteWrite,
			IOVA: r.iova, Length: r.length, PageSize: fakePage, Pages: r.m.pages[:r.n]}})
	}
	if send != nil {
		wrs = append(wrs, *send)
	}
	if inv != nil {
		r := inv.(*naiveReg)
		p.id++
		wrs = append(wrs, transport.SendWR{ID: WRIDTag | p.id, Opcode: transport.WRLocalInv, InvalidateRKey: r.m.key})
	}
	if err := p.qp.PostSend(wrs); err != nil {
		return sqFull(err)
	}
	if h != nil {
		h.(*naiveReg).posted = true
	}
	if inv != nil {
		p.unmapped(inv.(*naiveReg))
	}
	return nil
}

// unmapped: MR back on the free list and the buffer back to its owner, right after posting the
// LOCAL_INV (srp_unmap_data).
func (p *naivePool) unmapped(r *naiveReg) {
	delete(p.regs, r)
	p.free = append(p.free, r.m)
	p.owner(r, nil)
}

func (p *naivePool) invalidate(h any) error {
	r := h.(*naiveReg)
	if !p.regs[r] {
		return nil // already unmapped (torn down by a recovery)
	}
	p.id++
	if err := p.qp.PostSend([]transport.SendWR{{ID: WRIDTag | p.id, Opcode: transport.WRLocalInv, InvalidateRKey: r.m.key}}); err != nil {
		return sqFull(err)
	}
	p.unmapped(r)
	return nil
}

// sqFull maps the engine's ErrSQFull to the pool's, which the harness expects.
func sqFull(err error) error {
	if errors.Is(err, transport.ErrSQFull) {
		return fmt.Errorf("%w: %w", ErrSQFull, err)
	}
	return err
}

func (p *naivePool) flush() error { return nil }
func (p *naivePool) sync() error  { return nil }

func (p *naivePool) sendWC(wc *transport.WC) (bool, error) {
	return wc.ID&WRIDTag == 0, nil
}

func (p *naivePool) recvWC(wc *transport.WC) error { return nil }

func (p *naivePool) qpError() {}

func (p *naivePool) recover(qp transport.QP) error {
	for _, m := range p.all {
		_ = m.mr.Close()
	}
	for r := range p.regs {
		delete(p.regs, r)
		if r.posted {
			p.owner(r, ErrQPError)
		}
	}
	p.qp = qp
	return p.alloc()
}

func (p *naivePool) snapshot() any { return nil }

func (p *naivePool) mrs() []transport.MR {
	var out []transport.MR
	for _, m := range p.all {
		out = append(out, m.mr)
	}
	return out
}

func (p *naivePool) quiesced() error {
	if len(p.free) != len(p.all) {
		return fmt.Errorf("%d of %d MRs free", len(p.free), len(p.all))
	}
	return nil
}

func (p *naivePool) close() error {
	for _, m := range p.all {
		_ = m.mr.Close()
	}
	return nil
}

func newNaiveAdapter(h *harness) poolUT {
	p, err := newNaivePool(h.eng.pd(), h.eng.qp(), h.nMR, h.bufPages, h.released)
	if err != nil {
		panic(err)
	}
	return p
}

// recordingTB is a rapid.TB that records a failure instead of failing the test.
type recordingTB struct {
	name   string
	failed bool
	errs   []string
	logs   []string
}

func (r *recordingTB) Helper()      {}
func (r *recordingTB) Name() string { return r.name }
func (r *recordingTB) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}
func (r *recordingTB) Log(args ...any)      { r.logs = append(r.logs, fmt.Sprint(args...)) }
func (r *recordingTB) Skipf(string, ...any) {}
func (r *recordingTB) Skip(...any)          {}
func (r *recordingTB) SkipNow()             {}
func (r *recordingTB) Errorf(format string, args ...any) {
	r.failed = true
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recordingTB) Error(args ...any) {
	r.failed = true
	r.errs = append(r.errs, fmt.Sprint(args...))
}
func (r *recordingTB) Fatalf(format string, args ...any) { r.Errorf(format, args...) }
func (r *recordingTB) Fatal(args ...any)                 { r.Error(args...) }
func (r *recordingTB) FailNow()                          { r.failed = true }
func (r *recordingTB) Fail()                             { r.failed = true }
func (r *recordingTB) Failed() bool                      { return r.failed }

// setFlags sets rapid flags for the duration of a test.
func setFlags(t *testing.T, kv map[string]string) {
	for k, v := range kv {
		fl := flag.Lookup(k)
		old := fl.Value.String()
		if err := fl.Value.Set(v); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = fl.Value.Set(old) })
	}
}

// TestModelCatchesNaive2021 runs the model harness against the naive ib_srp-2021 pool and
// asserts that it fails, with the failure reproduced (shrunk) in the log. The same harness passes
// against Pool (TestModelFake).
func TestModelCatchesNaive2021(t *testing.T) {
	for _, tc := range []struct {
		name          string
		adversaryOnly bool
		want          []string
	}{
		// All invariants: the release-time check fires first.
		{"all", false, []string{"released while", "buffer released to its owner", "page list changed", "LOCAL_INV failed"}},
		// Release-time checks off: the adversary's stale rkey reaches a buffer its owner has back.
		{"adversary", true, []string{"buffer released to its owner"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setFlags(t, map[string]string{"rapid.nofailfile": "true", "rapid.shrinktime": "2s", "rapid.checks": "3000"})
			rec := &recordingTB{name: t.Name()}
			rapid.Check(rec, func(rt *rapid.T) { runModelOpt(rt, &coverage{}, newNaiveAdapter, tc.adversaryOnly) })
			if !rec.failed {
				t.Fatal("the harness did not catch the naive 2021-style pool")
			}
			msg := strings.Join(rec.errs, "\n")
			t.Logf("naive pool caught, minimal failing sequence:\n%s\n%s", msg, strings.Join(rec.logs, "\n"))
			caught := false
			for _, want := range tc.want {
				caught = caught || strings.Contains(msg, want)
			}
			if !caught {
				t.Fatalf("caught for an unexpected reason:\n%s", msg)
			}
		})
	}
}

// TestNaive2021Scenario replays the 2021 sequence step by step on the double, against the naive
// pool and against Pool: unmap → buffer handed back → a stale RDMA WRITE with the old rkey (a
// retransmission, or a misbehaving target) lands in the buffer its owner is now reusing. With Pool
// the buffer is still the pool's when the stale write lands, and the write fails once the
// invalidation is confirmed.
func TestNaive2021Scenario(t *testing.T) {
	for _, naive := range []bool{true, false} {
		t.Run(map[bool]string{true: "naive", false: "frpool"}[naive], func(t *testing.T) {
			dev := newFakeDev("fake0", 7)
			pdI, _ := dev.AllocPD()
			pd := pdI.(*fakePD)
			qp := newFakeQP(pd, 16, 2)
			mem := dev.alloc(2 * fakePage)
			var back []any
			ownerFn := func(h any, err error) { back = append(back, h) }
			var pool poolUT
			if naive {
				np, err := newNaivePool(pd, qp, 1, 1, ownerFn)
				if err != nil {
					t.Fatal(err)
				}
				pool = np
			} else {
				p, err := New(Config{Attr: dev.attr, PD: pd, QP: qp, MaxPages: 1, NumMRs: 1})
				if err != nil {
					t.Fatal(err)
				}
				pool = &frAdapter{p: p, owner: ownerFunc(func(r *Reg, err error) { ownerFn(r, err) })}
			}
			bufA := Seg{Addr: mem.Addr(), Len: fakePage}
			// 1. map buffer A, REG_MR + SRP_CMD SEND; the target gets the rkey.
			a, err := pool.get([]Seg{bufA})
			if err != nil {
				t.Fatal(err)
			}
			if err := pool.post(a, &transport.SendWR{ID: 1, Opcode: transport.WRSend}, nil); err != nil {
				t.Fatal(err)
			}
			k1 := pool.rkey(a)
			for qp.exec() {
			}
			// 2. SRP_RSP arrives; the initiator unmaps A.
			if err := pool.invalidate(a); err != nil {
				t.Fatal(err)
			}
			released := len(back) == 1
			if released {
				// The owner reuses buffer A at once (e.g. the block layer completes the request).
				copy(mem.Bytes()[:fakePage], strings.Repeat("N", fakePage))
			}
			// 3. A stale RDMA WRITE through k1 arrives before the LOCAL_INV has executed.
			_, ok := dev.remoteAccess(k1, bufA.Addr, []byte("STALE"), true)
			corrupted := released && ok && string(mem.Bytes()[:5]) == "STALE"
			if naive != corrupted {
				t.Fatalf("released=%v stale write ok=%v corrupted=%v (naive=%v)", released, ok, corrupted, naive)
			}
			// 4. The next command reuses the MR at once: REG_MR with k1+1 behind the LOCAL_INV.
			b, err := pool.get([]Seg{{Addr: mem.Addr() + fakePage, Len: fakePage}})
			if err != nil {
				t.Fatal(err)
			}
			if err := pool.post(b, &transport.SendWR{ID: 2, Opcode: transport.WRSend}, nil); err != nil {
				t.Fatal(err)
			}
			if k2 := pool.rkey(b); k2 != k1&^0xff|(k1+1)&0xff {
				t.Fatalf("second key %#x after %#x", k2, k1)
			}
			for qp.exec() {
			}
			for {
				wc, ok := qp.popSend()
				if !ok {
					break
				}
				if _, err := pool.sendWC(&wc); err != nil {
					t.Fatal(err)
				}
			}
			if dev.invFail != 0 || dev.regFail != 0 {
				t.Fatalf("LOCAL_INV failures %d, REG_MR failures %d", dev.invFail, dev.regFail)
			}
			if !naive {
				if len(back) != 1 {
					t.Fatalf("buffer A not released after its LOCAL_INV completed")
				}
				if _, ok := dev.remoteAccess(k1, bufA.Addr, []byte("STALE"), true); ok {
					t.Fatalf("stale rkey still valid after release")
				}
			}
		})
	}
}

type ownerFunc func(r *Reg, err error)

func (f ownerFunc) BufferReleased(r *Reg, err error) { f(r, err) }
