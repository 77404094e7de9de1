package frpool

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce"
	"github.com/srpd/srpd/transport/softroce/link"
)

// softEngine runs the model on softroce: device A (the pool's) and device B (the peer) over an
// in-memory link. The main QP pair A↔B carries the pool's send queue (REG_MR, LOCAL_INV, the ULP's
// SENDs, sentinels) and the peer's SEND_WITH_INV; a second pair (adversary) in the same PDs lets
// the peer replay RDMA READs and WRITEs with any rkey: an rkey is PD-wide, so a stale key used on
// another QP of the PD is exactly the exposure the pool must close. A failed adversary access
// (NAK, remote access error) breaks only the adversary pair, which is rebuilt.
type softEngine struct {
	t              tb
	da, db         *softroce.Device
	pa, pb         transport.PD
	scq, rcq       transport.CQ // the pool QP's CQs
	bscq, brcq     transport.CQ
	advCQa, advCQb transport.CQ
	qa, qb         transport.QP // main pair
	adva, advb     transport.QP // adversary pair
	ma, mb         transport.Memory
	mra, mrb       transport.MR // regular MRs for receive buffers / adversary data
	psn            uint32
	depth          int
	sqCap          int // SendQueueFree of the main QP when nothing is outstanding
	recvDepth      int
	lastQPN        uint32
	errs           []string
	tick           *time.Ticker // benchmarks
}

type tb interface {
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
}

// softQPTimeout is the local ACK timeout of the softroce QPs: 4.096 µs × 2^12 ≈ 16.8 ms, much
// shorter than rxe's usual 17 (≈ 537 ms). The link is perfect, so a retry only happens when an
// ACK is late, e.g. under -race on a loaded machine; with 12 such go-back-N retries are frequent,
// which keeps them covered: they once exposed a softroce bug (a retry executed REG_MR work
// requests that had already executed a second time, failing with LOC_QP_OP_ERR against their
// own key; TestConcurrentSoftroce -count=40 reproduced it within seconds).
const softQPTimeout = 12

const (
	softRecvBuf = 64
	softAdvBuf  = 8192
)

func newSoftEngine(t tb, depth int) *softEngine {
	la, lb := link.NewPipe(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), link.PipeConfig{Seed: 1})
	da, err := softroce.Open(softroce.Config{Link: la, Name: "frpoolA"})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	db, err := softroce.Open(softroce.Config{Link: lb, Name: "frpoolB"})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	e := &softEngine{t: t, da: da, db: db, depth: depth, recvDepth: 64, psn: 0x100}
	must := func(err error) {
		if err != nil {
			t.Fatalf("softroce setup: %v", err)
		}
	}
	e.pa, err = da.AllocPD()
	must(err)
	e.pb, err = db.AllocPD()
	must(err)
	for _, c := range []*transport.CQ{&e.scq, &e.rcq, &e.advCQa} {
		*c, err = da.CreateCQ(4096)
		must(err)
	}
	for _, c := range []*transport.CQ{&e.bscq, &e.brcq, &e.advCQb} {
		*c, err = db.CreateCQ(4096)
		must(err)
	}
	e.ma, err = da.AllocMemory(e.recvDepth * softRecvBuf)
	must(err)
	e.mb, err = db.AllocMemory(2*e.recvDepth*softRecvBuf + softAdvBuf)
	must(err)
	e.mra, err = e.pa.RegMR(e.ma.Addr(), uint64(e.ma.Len()), transport.AccessLocalWrite)
	must(err)
	e.mrb, err = e.pb.RegMR(e.mb.Addr(), uint64(e.mb.Len()), transport.AccessLocalWrite)
	must(err)
	e.connectMain()
	e.connectAdversary()
	return e
}

func (e *softEngine) newQP(pd transport.PD, scq, rcq transport.CQ, depth int) transport.QP {
	q, err := pd.CreateQP(transport.QPInitAttr{SendCQ: scq, RecvCQ: rcq,
		Cap: transport.QPCap{MaxSendWR: depth, MaxRecvWR: e.recvDepth, MaxSendSGE: 2, MaxRecvSGE: 1}})
	if err != nil {
		e.t.Fatalf("create QP: %v", err)
	}
	return q
}

// Transport retry counts. The main pair retries for ever: retry_cnt 7 is never decremented by
// rxe (rxe_comp.c, COMPST_ERROR_RETRY) nor softroce, so a late ACK on a loaded machine never
// turns into an error the harness did not cause. The adversary pair gives up after 6 retries:
// its RDMA READs race with invalidations, and when the responder NAKs a READ in the middle of
// its responses (the MR went away) after the requester had timed out and re-requested part of
// it (the responder replays from its saved READ resource), the requester can drop that NAK
// without acting on it: rxe's check_psn (and softroce's completer) treats a response PSN beyond
// comp.psn on a READ WQE as a gap (COMPST_DONE) and one behind it as a duplicate unless a READ
// response sequence is in progress. The responder is in ERR and drops every retry, so with
// infinite retries the READ never completes: "adversary access did not complete" about once in
// 10^5 sequences under load, and within seconds with a 1 ms ACK timeout (device B: thousands of
// timeouts, no NAK received; device A: one remote-access NAK sent, one READ replay). A READ that
// gives up counts as denied, like one that is NAKed.
const (
	softRetryMain      = 7
	softRetryAdversary = 6
)

// bringUp moves q to RTS towards the peer QP (addresses, QPNs and PSNs exchanged out of band).
func (e *softEngine) bringUp(q transport.QP, self, peer netip.AddrPort, peerQPN, sq, rq uint32, retry uint8) {
	must := func(err error) {
		if err != nil {
			e.t.Fatalf("modify: %v", err)
		}
	}
	must(q.Modify(&transport.QPAttr{State: transport.QPSInit, Port: 1, AccessFlags: transport.AccessRemoteWrite | transport.AccessRemoteRead},
		transport.AttrState|transport.AttrPKeyIndex|transport.AttrPort|transport.AttrAccessFlags))
	must(q.Modify(&transport.QPAttr{State: transport.QPSRTR, PathMTU: transport.MTU1024, DestQPN: peerQPN, RQPSN: rq,
		MaxDestRdAtomic: 16, MinRNRTimer: 1,
		AV: transport.AddressVector{SrcAddr: self.Addr(), DstAddr: peer.Addr(), DstPort: peer.Port()}},
		transport.AttrState|transport.AttrAV|transport.AttrPathMTU|transport.AttrDestQPN|transport.AttrRQPSN|
			transport.AttrMaxDestRdAtomic|transport.AttrMinRNRTimer))
	must(q.Modify(&transport.QPAttr{State: transport.QPSRTS, Timeout: softQPTimeout, RetryCnt: retry, RNRRetry: 7, SQPSN: sq, MaxRdAtomic: 16},
		transport.AttrState|transport.AttrTimeout|transport.AttrRetryCnt|transport.AttrRNRRetry|transport.AttrSQPSN|transport.AttrMaxQPRdAtomic))
}

func (e *softEngine) pair(pa, pb transport.QP, retry uint8) {
	aAddr, bAddr := e.da.Addrs()[0], e.db.Addrs()[0]
	e.psn += 0x1000
	e.bringUp(pa, aAddr, bAddr, pb.QPN(), e.psn, e.psn+1, retry)
	e.bringUp(pb, bAddr, aAddr, pa.QPN(), e.psn+1, e.psn, retry)
}

func (e *softEngine) connectMain() {
	if e.qa != nil {
		_ = e.qa.Close()
		_ = e.qb.Close()
	}
	e.qa = e.newQP(e.pa, e.scq, e.rcq, e.depth)
	e.qb = e.newQP(e.pb, e.bscq, e.brcq, 2*e.depth+8)
	e.pair(e.qa, e.qb, softRetryMain)
	e.lastQPN = e.qa.QPN()
	e.sqCap = e.qa.SendQueueFree()
	// Receive buffers: A for the peer's SEND_WITH_INV, B for the pool's (ULP) SENDs.
	for i := 0; i < e.recvDepth; i++ {
		e.postRecvA(i)
		e.postRecvB(i)
	}
}

func (e *softEngine) postRecvA(i int) {
	i %= e.recvDepth
	err := e.qa.PostRecv([]transport.RecvWR{{ID: uint64(i), SGL: []transport.SGE{{Addr: e.ma.Addr() + uint64(i*softRecvBuf), Length: softRecvBuf, LKey: e.mra.LKey()}}}})
	if err != nil {
		e.t.Fatalf("post recv A: %v", err)
	}
}

func (e *softEngine) postRecvB(i int) {
	i %= e.recvDepth
	err := e.qb.PostRecv([]transport.RecvWR{{ID: uint64(i), SGL: []transport.SGE{{Addr: e.mb.Addr() + uint64(i*softRecvBuf), Length: softRecvBuf, LKey: e.mrb.LKey()}}}})
	if err != nil {
		e.t.Fatalf("post recv B: %v", err)
	}
}

// replenishB reposts B's receives consumed by the pool's SENDs.
func (e *softEngine) replenishB() {
	var wcs [16]transport.WC
	for {
		n := e.brcq.Poll(wcs[:])
		for _, wc := range wcs[:n] {
			if wc.QPN == e.qb.QPN() && wc.Status == transport.WCSuccess {
				e.postRecvB(int(wc.ID))
			}
		}
		if n < len(wcs) {
			return
		}
	}
}

func (e *softEngine) connectAdversary() {
	if e.adva != nil {
		_ = e.adva.Close()
		_ = e.advb.Close()
	}
	e.adva = e.newQP(e.pa, e.advCQa, e.advCQa, 4)
	e.advb = e.newQP(e.pb, e.advCQb, e.advCQb, 4)
	e.pair(e.adva, e.advb, softRetryAdversary)
}

func (e *softEngine) attr() transport.DeviceAttr { return e.da.Attr() }
func (e *softEngine) pd() transport.PD           { return e.pa }
func (e *softEngine) qp() transport.QP           { return e.qa }
func (e *softEngine) alloc(n int) transport.Memory {
	m, err := e.da.AllocMemory(n)
	if err != nil {
		e.t.Fatalf("alloc: %v", err)
	}
	return m
}

// sqEmpty reports whether every WR posted on the main QP's send queue is complete (its
// completion, if any, queued on the CQ).
func (e *softEngine) sqEmpty() bool { return e.qa.SendQueueFree() == e.sqCap }

// exec gives the engine a moment (it runs by itself): until a completion is queued, at most
// 300 µs; not at all if nothing is outstanding on the send queue (there is nothing to wait for,
// and a fixed wait there made up a large part of the model's run time).
func (e *softEngine) exec(int) int {
	e.replenishB()
	if e.sqEmpty() {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Microsecond)
	_ = e.scq.Wait(ctx)
	cancel()
	return 0
}

func (e *softEngine) popSend() (transport.WC, bool) {
	e.replenishB()
	var wc [1]transport.WC
	if e.scq.Poll(wc[:]) == 0 {
		return transport.WC{}, false
	}
	if wc[0].Status == transport.WCLocQPOpErr || wc[0].Status == transport.WCLocProtErr {
		st := e.da.Stats()
		e.errs = append(e.errs, fmt.Sprintf("send completion %#x %v (a local operation failed; device A: %d retry events, %d timeouts)",
			wc[0].ID, wc[0].Status, st.RetryEvents, st.Timeouts))
	}
	return wc[0], true
}

func (e *softEngine) popRecv() (transport.WC, bool) {
	var wc [1]transport.WC
	if e.rcq.Poll(wc[:]) == 0 {
		return transport.WC{}, false
	}
	if wc[0].QPN == e.qa.QPN() && wc[0].Status == transport.WCSuccess {
		e.postRecvA(int(wc[0].ID))
	}
	return wc[0], true
}

// settle waits until the main QP's send queue is empty (everything posted has completed), for
// at most 100 ms (a retry after a lost or late ACK takes ~17 ms, softQPTimeout; the harness's
// quiesce loop calls it again if work is left). It used to wait for the first completion or
// 20 ms, which with nothing outstanding was always the full 20 ms: most of the run time of 10,000
// sequences.
func (e *softEngine) settle() {
	deadline := time.Now().Add(100 * time.Millisecond)
	for {
		e.replenishB()
		if e.sqEmpty() || time.Now().After(deadline) {
			return
		}
		time.Sleep(50 * time.Microsecond)
	}
}

func (e *softEngine) idle() bool              { return true } // the harness checks the pool instead
func (e *softEngine) inError() bool           { return e.qa.State() == transport.QPSErr }
func (e *softEngine) failNextPost(error) bool { return false }
func (e *softEngine) regQueued(uint32) bool   { return false }
func (e *softEngine) violations() error {
	if len(e.errs) > 0 {
		return fmt.Errorf("%v", e.errs)
	}
	return nil
}

func (e *softEngine) setError() {
	if err := e.qa.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState); err != nil {
		e.t.Fatalf("modify to ERR: %v", err)
	}
}

// reconnect replaces the main QP pair (the old QPs are destroyed, discarding what they held).
func (e *softEngine) reconnect() transport.QP {
	e.connectMain()
	return e.qa
}

// waitWC waits for the next completion on cq.
func (e *softEngine) waitWC(cq transport.CQ, d time.Duration) (transport.WC, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wc [1]transport.WC
	for {
		if cq.Poll(wc[:]) == 1 {
			return wc[0], true
		}
		if cq.Wait(ctx) != nil {
			return transport.WC{}, false
		}
	}
}

func (e *softEngine) remoteAccess(rkey uint32, va uint64, data []byte, write bool) ([]span, bool) {
	off := uint64(2 * e.recvDepth * softRecvBuf)
	buf := e.mb.Bytes()[off : off+uint64(len(data))]
	op := transport.WRRDMARead
	if write {
		copy(buf, data)
		op = transport.WRRDMAWrite
	}
	err := e.advb.PostSend([]transport.SendWR{{ID: 1, Opcode: op, Flags: transport.SendSignaled,
		SGL: []transport.SGE{{Addr: e.mb.Addr() + off, Length: uint32(len(data)), LKey: e.mrb.LKey()}}, RemoteAddr: va, RKey: rkey}})
	if err != nil {
		e.t.Fatalf("adversary post: %v", err)
	}
	wc, ok := e.waitWC(e.advCQb, 5*time.Second)
	if !ok {
		e.t.Fatalf("adversary access did not complete in 5 s (adversary QPs %v/%v, main QPs %v/%v; device A %+v; device B %+v)",
			e.adva.State(), e.advb.State(), e.qa.State(), e.qb.State(), e.da.Stats(), e.db.Stats())
	}
	if wc.Status != transport.WCSuccess {
		e.connectAdversary() // both adversary QPs are in ERR now
		// drain what the old pair left behind
		var w [8]transport.WC
		for e.advCQa.Poll(w[:]) > 0 || e.advCQb.Poll(w[:]) > 0 {
		}
		return nil, false
	}
	if !write {
		copy(data, buf)
	}
	return nil, true
}

func (e *softEngine) remoteInvalidate(rkey uint32) {
	if e.qa.State() == transport.QPSErr || e.qb.State() == transport.QPSErr {
		return // dropped by our responder (in ERR): nothing to wait for
	}
	if err := e.qb.PostSend([]transport.SendWR{{ID: 2, Opcode: transport.WRSendWithInv, Flags: transport.SendSignaled, InvalidateRKey: rkey}}); err != nil {
		e.t.Fatalf("SEND_WITH_INV post: %v", err)
	}
	wc, ok := e.waitWC(e.bscq, 5*time.Second)
	if !ok {
		e.t.Fatalf("SEND_WITH_INV did not complete in 5 s (main QPs %v/%v; device A %+v; device B %+v)",
			e.qa.State(), e.qb.State(), e.da.Stats(), e.db.Stats())
	}
	if wc.Status != transport.WCSuccess {
		// A failed remote invalidation: softroce NAKs it and the responder QP (ours) goes to ERR.
		deadline := time.Now().Add(time.Second)
		for e.qa.State() != transport.QPSErr && time.Now().Before(deadline) {
			time.Sleep(100 * time.Microsecond)
		}
	}
}

func (e *softEngine) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = e.da.Close(ctx)
	_ = e.db.Close(ctx)
}

// softChecks is the number of model sequences run on softroce (each opens two devices).
const softChecks = 300

// TestModelSoftroce runs the same model against softroce over its in-memory link.
func TestModelSoftroce(t *testing.T) {
	cov := &coverage{}
	defer func() { t.Log(cov) }()
	withRapidChecks(t, softChecks, func() {
		rapid.Check(t, func(rt *rapid.T) {
			depth := rapid.IntRange(4, 16).Draw(rt, "depth")
			eng := newSoftEngine(rt, depth)
			defer eng.close()
			nMR := rapid.IntRange(1, 4).Draw(rt, "nMR")
			runModelOn(rt, cov, eng, newFRAdapter(rt, rapid.Bool().Draw(rt, "batch")), nMR, false)
		})
	})
}

// stressOwner is a worker's BufferOwner: it signals the release of its buffer.
type stressOwner struct{ released chan error }

func (o *stressOwner) BufferReleased(r *Reg, err error) { o.released <- err }

// TestConcurrentSoftroce drives the pool from several goroutines against softroce, as a ULP
// would: workers Get (waiting: more workers than MRs), post REG_MR + a signaled SEND, wait for
// the SEND's completion, Invalidate, and wait for their buffer; one poller goroutine owns the CQ
// and feeds the pool; an adversary replays every rkey issued so far from a second QP of the PD and
// checks that no access posted after a buffer's release succeeds.
func TestConcurrentSoftroce(t *testing.T) {
	const workers, ios, nMR = 8, 50, 4
	eng := newSoftEngine(t, 64)
	defer eng.close()
	p, err := New(Config{Attr: eng.attr(), PD: eng.pa, QP: eng.qa, MaxPages: 4, NumMRs: nMR, BatchInvalidates: true})
	if err != nil {
		t.Fatal(err)
	}
	mem := eng.alloc(workers * 4 * 4096)

	type keyInfo struct {
		issued   int
		released bool
		iova     uint64
	}
	var mu sync.Mutex
	keys := map[uint32]*keyInfo{}
	var order []uint32

	sendDone := make([]chan transport.WC, workers)
	for i := range sendDone {
		sendDone[i] = make(chan transport.WC, 4)
	}
	stop := make(chan struct{})
	var pollerWG sync.WaitGroup
	pollerWG.Add(1)
	go func() { // the ULP's completion loop
		defer pollerWG.Done()
		var wcs [16]transport.WC
		for {
			select {
			case <-stop:
				return
			default:
			}
			eng.replenishB()
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			_ = eng.scq.Wait(ctx)
			cancel()
			n := eng.scq.Poll(wcs[:])
			for i := 0; i < n; i++ {
				wc := wcs[i]
				if wc.Status != transport.WCSuccess && wc.Status != transport.WCWRFlushErr {
					t.Errorf("completion %#x: %v (opcode %v, vendor %#x)", wc.ID, wc.Status, wc.Opcode, wc.VendorErr)
				}
				deliver, err := p.HandleSendCompletion(&wc)
				if err != nil {
					t.Errorf("completion: %v", err)
					continue
				}
				if deliver {
					sendDone[wc.ID>>32] <- wc
				}
			}
			if err := p.Flush(); err != nil {
				t.Errorf("flush: %v", err)
			}
		}
	}()

	var advWG sync.WaitGroup
	advWG.Add(1)
	advStop := make(chan struct{})
	var advOK, advDenied int
	go func() { // the adversary
		defer advWG.Done()
		for i := 0; ; i++ {
			select {
			case <-advStop:
				return
			default:
			}
			mu.Lock()
			if len(order) == 0 {
				mu.Unlock()
				time.Sleep(100 * time.Microsecond)
				continue
			}
			k := order[(i*7919)%len(order)]
			ki := keys[k]
			wasReleased := ki.released && ki.issued == 1
			va := ki.iova + uint64(i%(4*4096))
			mu.Unlock()
			_, ok := eng.remoteAccess(k, va, []byte{0xEE}, true)
			if ok {
				advOK++
			} else {
				advDenied++
			}
			if ok && wasReleased {
				t.Errorf("access through rkey %#x succeeded after its buffer was released", k)
			}
		}
	}()

	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			owner := &stressOwner{released: make(chan error, 1)}
			segs := []Seg{{Addr: mem.Addr() + uint64(w*4*4096), Len: 4 * 4096}}
			for i := 0; i < ios; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				r, err := p.Get(ctx, segs, owner)
				cancel()
				if err != nil {
					t.Errorf("worker %d: get: %v", w, err)
					return
				}
				regs := [1]*Reg{r}
				wrs := [1]transport.SendWR{{ID: uint64(w)<<32 | uint64(i), Opcode: transport.WRSend, Flags: transport.SendSignaled}}
				if err := p.Post(&Chain{Reg: regs[:], WRs: wrs[:]}); err != nil {
					t.Errorf("worker %d: post: %v", w, err)
					return
				}
				k := r.RKey()
				mu.Lock()
				if keys[k] == nil {
					keys[k] = &keyInfo{}
					order = append(order, k)
				}
				keys[k].issued++
				keys[k].released = false
				keys[k].iova = r.IOVA()
				mu.Unlock()
				select {
				case wc := <-sendDone[w]:
					if wc.Status != transport.WCSuccess {
						t.Errorf("worker %d: SEND %v", w, wc.Status)
						return
					}
				case <-time.After(10 * time.Second):
					t.Errorf("worker %d: SEND completion lost", w)
					return
				}
				if err := p.Invalidate(r); err != nil {
					t.Errorf("worker %d: invalidate: %v", w, err)
					return
				}
				select {
				case err := <-owner.released:
					if err != nil {
						t.Errorf("worker %d: released with %v", w, err)
						return
					}
				case <-time.After(10 * time.Second):
					t.Errorf("worker %d: buffer never released", w)
					return
				}
				mu.Lock()
				keys[k].released = true
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	close(advStop)
	advWG.Wait()
	close(stop)
	pollerWG.Wait()
	st := p.Stats()
	t.Logf("stats %+v; adversary %d ok / %d denied", st, advOK, advDenied)
	if st.Registrations != workers*ios || st.InvalidationsLocal != workers*ios || st.Free != nMR || st.Invalidating != 0 {
		t.Fatalf("stats %+v", st)
	}
	if st.Waits == 0 {
		t.Error("no Get ever waited although workers > MRs")
	}
	// Drain the sentinels still outstanding, then close.
	deadline := time.Now().Add(5 * time.Second)
	for p.Stats().SQOutstanding > 0 && time.Now().Before(deadline) {
		if wc, ok := eng.waitWC(eng.scq, 100*time.Millisecond); ok {
			if _, err := p.HandleSendCompletion(&wc); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// countOwner counts released buffers.
type countOwner struct{ n int }

func (o *countOwner) BufferReleased(*Reg, error) { o.n++ }

// softBench is a pool on softroce for benchmarks (single goroutine: the benchmark loop polls).
func softBench(b *testing.B, nMR int) (*softEngine, *Pool, transport.Memory) {
	eng := newSoftEngine(b, 256)
	eng.tick = time.NewTicker(time.Millisecond)
	b.Cleanup(func() { eng.tick.Stop(); eng.close() })
	p, err := New(Config{Attr: eng.attr(), PD: eng.pa, QP: eng.qa, MaxPages: 16, NumMRs: nMR})
	if err != nil {
		b.Fatal(err)
	}
	return eng, p, eng.alloc(nMR * 16 * 4096)
}

// pollUntil feeds send completions to the pool until done() holds.
func pollUntil(b *testing.B, eng *softEngine, p *Pool, done func() bool) {
	var wcs [16]transport.WC
	for !done() {
		n := eng.scq.Poll(wcs[:])
		if n == 0 {
			eng.replenishB()
			select { // sleep until the engine adds a completion (a token may be stale: poll again)
			case <-eng.scq.Notify():
			case <-eng.tick.C:
			}
			continue
		}
		for i := 0; i < n; i++ {
			if wcs[i].Status != transport.WCSuccess {
				b.Fatalf("completion %v", wcs[i].Status)
			}
			if _, err := p.HandleSendCompletion(&wcs[i]); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkSoftroceIO is BenchmarkIO on softroce over its in-memory link: one I/O at a time, so
// ns/op is the latency of the initiator's send-queue work per I/O, round trips included. The
// difference between the two is the extra latency of register + invalidate.
func BenchmarkSoftroceIO(b *testing.B) {
	b.Run("preregistered", func(b *testing.B) {
		eng, p, _ := softBench(b, 1)
		wrs := []transport.SendWR{{ID: 1, Opcode: transport.WRSend, Flags: transport.SendSignaled}}
		chain := Chain{WRs: wrs}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := p.Post(&chain); err != nil {
				b.Fatal(err)
			}
			pollUntil(b, eng, p, func() bool { return p.Stats().SQOutstanding == 0 })
		}
	})
	b.Run("fastreg", func(b *testing.B) {
		eng, p, mem := softBench(b, 1)
		segs := []Seg{{Addr: mem.Addr(), Len: 16 * 4096}}
		owner := &countOwner{}
		regs := make([]*Reg, 1)
		wrs := []transport.SendWR{{ID: 1, Opcode: transport.WRSend, Flags: transport.SendSignaled}}
		var chain Chain
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			r, err := p.TryGet(segs, owner)
			if err != nil {
				b.Fatal(err)
			}
			regs[0] = r
			chain = Chain{Reg: regs, WRs: wrs}
			if err := p.Post(&chain); err != nil {
				b.Fatal(err)
			}
			pollUntil(b, eng, p, func() bool { return p.Stats().SQOutstanding == 0 }) // the SEND is done
			if err := p.Invalidate(r); err != nil {
				b.Fatal(err)
			}
			pollUntil(b, eng, p, func() bool { return owner.n == i+1 }) // buffer back
		}
	})
}

// BenchmarkSoftroceRegistrations: batches of 16 REG_MRs then 16 LOCAL_INVs (the last one
// signaled) on softroce; reports registrations per second.
func BenchmarkSoftroceRegistrations(b *testing.B) {
	const batch = 16
	eng, p, mem := softBench(b, batch)
	owner := &countOwner{}
	regs := make([]*Reg, batch)
	var chain Chain
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	n := 0
	for i := 0; i < b.N; i += batch {
		for k := range regs {
			r, err := p.TryGet([]Seg{{Addr: mem.Addr() + uint64(k*16*4096), Len: 16 * 4096}}, owner)
			if err != nil {
				b.Fatal(err)
			}
			regs[k] = r
		}
		chain = Chain{Reg: regs}
		if err := p.Post(&chain); err != nil {
			b.Fatal(err)
		}
		chain = Chain{Inv: regs}
		if err := p.Post(&chain); err != nil {
			b.Fatal(err)
		}
		n += batch
		pollUntil(b, eng, p, func() bool { return owner.n == n })
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "regs/s")
}

// rwWaiter records RWDone.
type rwWaiter struct {
	done chan error
}

func (w *rwWaiter) RWDone(c *RWCtx, err error) { w.done <- err }

// TestRWSoftroce moves data with RW contexts over softroce: RDMA READ of a remote descriptor list
// in waves of MaxRdAtomic, and RDMA WRITE chained with the response SEND.
func TestRWSoftroce(t *testing.T) {
	eng := newSoftEngine(t, 64)
	defer eng.close()
	p, err := New(Config{Attr: eng.attr(), PD: eng.pa, QP: eng.qa, MaxPages: 4, NumMRs: 1, MaxRdAtomic: 2, PeerMaxMsg: 3000})
	if err != nil {
		t.Fatal(err)
	}
	local := eng.alloc(8 * 4096)
	if err := p.AddLocalMemory(local); err != nil {
		t.Fatal(err)
	}
	// The initiator's memory: B's, registered for remote access.
	remoteMem, err := eng.db.AllocMemory(8 * 4096)
	if err != nil {
		t.Fatal(err)
	}
	rmr, err := eng.pb.RegMR(remoteMem.Addr(), uint64(remoteMem.Len()), transport.AccessLocalWrite|transport.AccessRemoteRead|transport.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	remote := []RemoteSeg{
		{Addr: remoteMem.Addr() + 5, RKey: rmr.RKey(), Len: 7000},
		{Addr: remoteMem.Addr() + 4*4096, RKey: rmr.RKey(), Len: 9000},
	}
	for i := range remoteMem.Bytes() {
		remoteMem.Bytes()[i] = byte(i * 13)
	}
	sgl := []transport.SGE{{Addr: local.Addr() + 1, Length: 10000}, {Addr: local.Addr() + 3*4096, Length: 6000}}
	w := &rwWaiter{done: make(chan error, 1)}
	poll := func(until func() bool) {
		deadline := time.Now().Add(10 * time.Second)
		for !until() {
			if time.Now().After(deadline) {
				t.Fatal("timeout")
			}
			eng.replenishB()
			if wc, ok := eng.waitWC(eng.scq, time.Millisecond); ok {
				if _, err := p.HandleSendCompletion(&wc); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	c := p.NewRWCtx(16, 32)
	n, err := c.Init(RWRead, sgl, remote)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.PostRW(c, nil, w); err != nil {
		t.Fatal(err)
	}
	// awaitRW polls until the RDMA transfer is done; it must have succeeded.
	awaitRW := func() {
		t.Helper()
		var rerr error
		poll(func() bool {
			select {
			case rerr = <-w.done:
				return true
			default:
				return false
			}
		})
		if rerr != nil {
			t.Fatal(rerr)
		}
	}
	awaitRW()
	var want, got []byte
	for _, r := range remote {
		off := r.Addr - remoteMem.Addr()
		want = append(want, remoteMem.Bytes()[off:off+uint64(r.Len)]...)
	}
	for _, s := range sgl {
		off := s.Addr - local.Addr()
		got = append(got, local.Bytes()[off:off+uint64(s.Length)]...)
	}
	if string(got) != string(want) {
		t.Fatalf("RDMA READ data differs (%d WRs)", n)
	}
	// Data-in: WRITE it back elsewhere, with the response SEND in the same chain.
	for i := range local.Bytes() {
		local.Bytes()[i] ^= 0x5A
	}
	remote2 := []RemoteSeg{{Addr: remoteMem.Addr() + 100, RKey: rmr.RKey(), Len: 16000}}
	if _, err := c.Init(RWWrite, sgl, remote2); err != nil {
		t.Fatal(err)
	}
	resp := transport.SendWR{ID: 99, Opcode: transport.WRSend, Flags: transport.SendSignaled}
	if err := p.PostRW(c, &resp, w); err != nil {
		t.Fatal(err)
	}
	awaitRW()
	got = got[:0]
	for _, s := range sgl {
		off := s.Addr - local.Addr()
		got = append(got, local.Bytes()[off:off+uint64(s.Length)]...)
	}
	if string(remoteMem.Bytes()[100:16100]) != string(got) {
		t.Fatal("RDMA WRITE data differs")
	}
	if st := p.Stats(); st.RWTransfers != 2 || st.SQOutstanding != 0 {
		t.Fatalf("%+v", st)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}
