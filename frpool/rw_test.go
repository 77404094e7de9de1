package frpool

import (
	"bytes"
	"errors"
	"testing"

	"github.com/srpd/srpd/transport"
)

type rwRecorder struct {
	done []error
}

func (r *rwRecorder) RWDone(c *RWCtx, err error) { r.done = append(r.done, err) }

// rwEnv is an env whose QP's peer has remote memory registered with remote access.
type rwEnv struct {
	*env
	peer    *fakeDev
	peerMem fakeMemory
	rkey    uint32
}

func newRWEnv(t *testing.T, cfg Config) *rwEnv {
	e := newEnv(t, cfg)
	peer := newFakeDev("peer", 9)
	pd, _ := peer.AllocPD()
	pm := peer.alloc(16 * fakePage)
	mr, err := pd.RegMR(pm.Addr(), uint64(pm.Len()), transport.AccessLocalWrite|transport.AccessRemoteRead|transport.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	e.qp.peer = peer
	if err := e.p.AddLocalMemory(e.mem); err != nil {
		t.Fatal(err)
	}
	return &rwEnv{env: e, peer: peer, peerMem: pm, rkey: mr.RKey()}
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

func TestRWChunkingAndData(t *testing.T) {
	for _, dir := range []RWDir{RWWrite, RWRead} {
		e := newRWEnv(t, Config{PeerMaxMsg: 3000, MaxRdAtomic: 16})
		local := []transport.SGE{
			{Addr: e.mem.Addr() + 100, Length: 5000},
			{Addr: e.mem.Addr() + 3*fakePage, Length: 10},
			{Addr: e.mem.Addr() + 4*fakePage, Length: 1},
			{Addr: e.mem.Addr() + 5*fakePage + 17, Length: 2989},
		} // 8000 bytes
		remote := []RemoteSeg{
			{Addr: e.peerMem.Addr() + 10, RKey: e.rkey, Len: 4000},
			{Addr: e.peerMem.Addr() + 8*fakePage, RKey: e.rkey, Len: 4000},
		}
		c := e.p.NewRWCtx(16, 32)
		n, err := c.Init(dir, local, remote)
		if err != nil {
			t.Fatal(err)
		}
		var total uint64
		for i := 0; i < n; i++ {
			w := c.wrs[i]
			var wl uint64
			for _, s := range w.SGL {
				wl += uint64(s.Length)
				if s.LKey == 0 {
					t.Fatal("no lkey")
				}
			}
			if len(w.SGL) > 2 || wl > 3000 || wl == 0 {
				t.Fatalf("wr %d: %d SGEs, %d bytes", i, len(w.SGL), wl)
			}
			inFirst := w.RemoteAddr >= remote[0].Addr && w.RemoteAddr+wl <= remote[0].Addr+uint64(remote[0].Len)
			inSecond := w.RemoteAddr >= remote[1].Addr && w.RemoteAddr+wl <= remote[1].Addr+uint64(remote[1].Len)
			if !inFirst && !inSecond {
				t.Fatalf("wr %d crosses a remote descriptor", i)
			}
			total += wl
		}
		if total != 8000 || c.Bytes() != 8000 {
			t.Fatalf("total %d", total)
		}
		// data
		lb := e.mem.Bytes()
		pb := e.peerMem.Bytes()
		var want []byte
		if dir == RWWrite {
			for _, s := range local {
				off := s.Addr - e.mem.Addr()
				fill(lb[off:off+uint64(s.Length)], byte(off))
				want = append(want, lb[off:off+uint64(s.Length)]...)
			}
		} else {
			for _, r := range remote {
				off := r.Addr - e.peerMem.Addr()
				fill(pb[off:off+uint64(r.Len)], byte(off))
				want = append(want, pb[off:off+uint64(r.Len)]...)
			}
		}
		rec := &rwRecorder{}
		if err := e.p.PostRW(c, nil, rec); err != nil {
			t.Fatal(err)
		}
		if e.p.t.uncovered() != 0 {
			t.Fatal("last WR not signaled")
		}
		e.execAll()
		if got := e.deliver(); len(got) != 0 {
			t.Fatalf("ULP got %v", got)
		}
		if len(rec.done) != 1 || rec.done[0] != nil {
			t.Fatalf("done %v", rec.done)
		}
		var got []byte
		if dir == RWWrite {
			for _, r := range remote {
				off := r.Addr - e.peerMem.Addr()
				got = append(got, pb[off:off+uint64(r.Len)]...)
			}
		} else {
			for _, s := range local {
				off := s.Addr - e.mem.Addr()
				got = append(got, lb[off:off+uint64(s.Length)]...)
			}
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%v: data differs", dir)
		}
		if e.p.Stats().RWTransfers != 1 || e.p.reserved != 0 {
			t.Fatalf("stats %+v reserved %d", e.p.Stats(), e.p.reserved)
		}
	}
}

func TestRWReadWaves(t *testing.T) {
	e := newRWEnv(t, Config{PeerMaxMsg: 1000, MaxRdAtomic: 2, SQDepth: 16})
	c := e.p.NewRWCtx(8, 8)
	n, err := c.Init(RWRead, []transport.SGE{{Addr: e.mem.Addr(), Length: 4500}},
		[]RemoteSeg{{Addr: e.peerMem.Addr(), RKey: e.rkey, Len: 4500}})
	if err != nil || n != 5 {
		t.Fatalf("n %d err %v", n, err)
	}
	fill(e.peerMem.Bytes()[:4500], 3)
	rec := &rwRecorder{}
	if err := e.p.PostRW(c, nil, rec); err != nil {
		t.Fatal(err)
	}
	for wave := 0; wave < 3; wave++ {
		if got := e.qp.pending(); got != min(2, 5-2*wave) {
			t.Fatalf("wave %d: %d READs outstanding", wave, got)
		}
		if len(rec.done) != 0 {
			t.Fatal("done early")
		}
		e.execAll()
		if got := e.deliver(); len(got) != 0 {
			t.Fatalf("ULP got %v", got)
		}
	}
	if len(rec.done) != 1 || rec.done[0] != nil {
		t.Fatalf("done %v", rec.done)
	}
	if !bytes.Equal(e.mem.Bytes()[:4500], e.peerMem.Bytes()[:4500]) {
		t.Fatal("data differs")
	}
	if e.p.reserved != 0 || e.p.t.outstanding() != 0 {
		t.Fatalf("reserved %d outstanding %d", e.p.reserved, e.p.t.outstanding())
	}
	// Re-post the same context (reuse without re-init).
	if err := e.p.PostRW(c, nil, rec); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		e.execAll()
		e.deliver()
	}
	if len(rec.done) != 2 {
		t.Fatal("second transfer not done")
	}
}

func TestRWWriteWithChainedResponse(t *testing.T) {
	e := newRWEnv(t, Config{PeerMaxMsg: 2048})
	c := e.p.NewRWCtx(8, 8)
	if _, err := c.Init(RWWrite, []transport.SGE{{Addr: e.mem.Addr(), Length: 5000}},
		[]RemoteSeg{{Addr: e.peerMem.Addr(), RKey: e.rkey, Len: 5000}}); err != nil {
		t.Fatal(err)
	}
	rec := &rwRecorder{}
	resp := transport.SendWR{ID: 77, Opcode: transport.WRSend, Flags: transport.SendSignaled}
	if err := e.p.PostRW(c, &resp, rec); err != nil {
		t.Fatal(err)
	}
	if e.qp.posted != 4 { // 3 WRITEs + the SEND, one post
		t.Fatalf("posted %d", e.qp.posted)
	}
	for i := 0; i < 3; i++ {
		e.qp.exec()
	}
	if len(e.qp.sendWC) != 0 {
		t.Fatal("a WRITE was signaled")
	}
	e.execAll()
	got := e.deliver()
	if len(got) != 1 || got[0].ID != 77 || e.qp.sends != 1 {
		t.Fatalf("ULP completions %+v", got)
	}
	if len(rec.done) != 1 || rec.done[0] != nil {
		t.Fatalf("done %v", rec.done)
	}
	// A response chained to READs is refused.
	c2 := e.p.NewRWCtx(8, 8)
	_, _ = c2.Init(RWRead, []transport.SGE{{Addr: e.mem.Addr(), Length: 10}}, []RemoteSeg{{Addr: e.peerMem.Addr(), RKey: e.rkey, Len: 10}})
	if err := e.p.PostRW(c2, &resp, rec); !errors.Is(err, ErrState) {
		t.Fatalf("err %v", err)
	}
}

func TestRWErrors(t *testing.T) {
	e := newRWEnv(t, Config{SQDepth: 4})
	c := e.p.NewRWCtx(8, 8)
	local := []transport.SGE{{Addr: e.mem.Addr(), Length: 100}}
	if _, err := c.Init(RWWrite, local, []RemoteSeg{{Addr: e.peerMem.Addr(), RKey: e.rkey, Len: 99}}); !errors.Is(err, ErrRWLength) {
		t.Fatalf("length mismatch: %v", err)
	}
	if _, err := c.Init(RWWrite, []transport.SGE{{Addr: 0x1234, Length: 100}},
		[]RemoteSeg{{Addr: e.peerMem.Addr(), RKey: e.rkey, Len: 100}}); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("unregistered: %v", err)
	}
	small := e.p.NewRWCtx(1, 8)
	if _, err := small.Init(RWWrite, []transport.SGE{{Addr: e.mem.Addr(), Length: 100}, {Addr: e.mem.Addr() + 200, Length: 100}, {Addr: e.mem.Addr() + 400, Length: 100}},
		[]RemoteSeg{{Addr: e.peerMem.Addr(), RKey: e.rkey, Len: 300}}); !errors.Is(err, ErrRWLength) {
		t.Fatalf("capacity: %v", err)
	}
	// Too many WRs for the send queue: nothing posted.
	big := e.p.NewRWCtx(8, 8)
	var rs []RemoteSeg
	for i := 0; i < 4; i++ {
		rs = append(rs, RemoteSeg{Addr: e.peerMem.Addr() + uint64(i*1000), RKey: e.rkey, Len: 100})
	}
	if n, err := big.Init(RWWrite, []transport.SGE{{Addr: e.mem.Addr(), Length: 400}}, rs); n != 4 || err != nil {
		t.Fatalf("n %d err %v", n, err)
	}
	rec := &rwRecorder{}
	if err := e.p.PostRW(big, nil, rec); !errors.Is(err, ErrSQFull) || e.qp.posted != 0 {
		t.Fatalf("err %v posted %d", err, e.qp.posted)
	}
	// A bad rkey from the initiator: remote access error, QP error, the transfer fails once.
	if _, err := c.Init(RWWrite, local, []RemoteSeg{{Addr: e.peerMem.Addr(), RKey: e.rkey ^ 0x55, Len: 100}}); err != nil {
		t.Fatal(err)
	}
	if err := e.p.PostRW(c, nil, rec); err != nil {
		t.Fatal(err)
	}
	e.execAll()
	got := e.deliver()
	if len(got) != 0 || len(rec.done) != 1 || !errors.Is(rec.done[0], ErrQPError) {
		t.Fatalf("ulp %v done %v", got, rec.done)
	}
	var wce *WCError
	if !errors.As(rec.done[0], &wce) || wce.Status != transport.WCRemAccessErr {
		t.Fatalf("done %v", rec.done[0])
	}
	if err := e.p.PostRW(c, nil, rec); !errors.Is(err, ErrQPError) {
		t.Fatalf("post in error: %v", err)
	}
}

func TestRWRecoverFailsOutstanding(t *testing.T) {
	e := newRWEnv(t, Config{MaxRdAtomic: 1, PeerMaxMsg: 100})
	c := e.p.NewRWCtx(8, 8)
	_, _ = c.Init(RWRead, []transport.SGE{{Addr: e.mem.Addr(), Length: 300}}, []RemoteSeg{{Addr: e.peerMem.Addr(), RKey: e.rkey, Len: 300}})
	rec := &rwRecorder{}
	if err := e.p.PostRW(c, nil, rec); err != nil {
		t.Fatal(err)
	}
	e.qp.setError()
	e.qp.reset()
	if err := e.p.Recover(e.qp); err != nil {
		t.Fatal(err)
	}
	if len(rec.done) != 1 || !errors.Is(rec.done[0], ErrQPError) {
		t.Fatalf("done %v", rec.done)
	}
	if e.p.reserved != 0 {
		t.Fatalf("reserved %d", e.p.reserved)
	}
	if err := e.p.PostRW(c, nil, rec); err != nil {
		t.Fatalf("re-post after recovery: %v", err)
	}
}

// TestRWQPErrorBetweenWaves: a READ transfer whose wave succeeds after the QP went to error
// (through another work request) has waves left that will never be posted: it ends with
// ErrQPError, not as a success with part of its data missing.
func TestRWQPErrorBetweenWaves(t *testing.T) {
	e := newRWEnv(t, Config{MaxRdAtomic: 1, PeerMaxMsg: 100})
	c := e.p.NewRWCtx(8, 8)
	if n, err := c.Init(RWRead, []transport.SGE{{Addr: e.mem.Addr(), Length: 300}},
		[]RemoteSeg{{Addr: e.peerMem.Addr(), RKey: e.rkey, Len: 300}}); err != nil || n != 3 {
		t.Fatalf("n %d err %v", n, err)
	}
	rec := &rwRecorder{}
	if err := e.p.PostRW(c, nil, rec); err != nil {
		t.Fatal(err)
	}
	e.execAll()                          // the first wave's READ succeeds...
	e.p.HandleQPError(errors.New("cqe")) // ...but the QP fails before its completion is seen
	e.deliver()
	if len(rec.done) != 1 || !errors.Is(rec.done[0], ErrQPError) {
		t.Fatalf("done %v, want one ErrQPError", rec.done)
	}
	if e.p.reserved != 0 {
		t.Fatalf("reserved %d", e.p.reserved)
	}
}

// An RDMA WRITE transfer from process memory (SGE.Host) mixed with registered memory: split
// across WRs and remote descriptors like any other, the pieces of host memory stay slices of it
// (no lkey, nothing looked up), and the data arrives; as a READ destination it is refused.
func TestRWHostSGE(t *testing.T) {
	e := newRWEnv(t, Config{PeerMaxMsg: 3000, MaxRdAtomic: 16})
	h1, h2 := make([]byte, 4100), make([]byte, 2900)
	fill(h1, 3)
	fill(h2, 5)
	fill(e.mem.Bytes()[:1000], 9)
	local := []transport.SGE{
		{Host: h1, Length: uint32(len(h1))},
		{Addr: e.mem.Addr(), Length: 1000},
		{Host: h2, Length: uint32(len(h2))},
	} // 8000 bytes
	remote := []RemoteSeg{
		{Addr: e.peerMem.Addr() + 10, RKey: e.rkey, Len: 4000},
		{Addr: e.peerMem.Addr() + 8*fakePage, RKey: e.rkey, Len: 4000},
	}
	c := e.p.NewRWCtx(16, 32)
	n, err := c.Init(RWWrite, local, remote)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		for _, s := range c.wrs[i].SGL {
			if (s.Host != nil) == (s.LKey != 0) || (s.Host != nil && len(s.Host) != int(s.Length)) {
				t.Fatalf("wr %d: SGE %+v: a host piece without lkey, or a registered one with", i, s)
			}
		}
	}
	rec := &rwRecorder{}
	if err := e.p.PostRW(c, nil, rec); err != nil {
		t.Fatal(err)
	}
	e.execAll()
	if got := e.deliver(); len(got) != 0 {
		t.Fatalf("ULP got %v", got)
	}
	if len(rec.done) != 1 || rec.done[0] != nil {
		t.Fatalf("done %v", rec.done)
	}
	want := append(append(append([]byte(nil), h1...), e.mem.Bytes()[:1000]...), h2...)
	pb := e.peerMem.Bytes()
	got := append(append([]byte(nil), pb[10:4010]...), pb[8*fakePage:8*fakePage+4000]...)
	if !bytes.Equal(got, want) {
		t.Fatal("data differs")
	}
	if _, err := e.p.NewRWCtx(16, 32).Init(RWRead, local, remote); !errors.Is(err, transport.ErrInvalidArgument) {
		t.Fatalf("READ into host memory: %v, want ErrInvalidArgument", err)
	}
}
