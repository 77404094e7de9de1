package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
)

func (s *suite) testDeviceAttr(t *testing.T) {
	p := s.f(t)
	for _, ep := range []Endpoint{p.A, p.B} {
		a := ep.Dev.Attr()
		if a.PageSize <= 0 || a.PageSize&(a.PageSize-1) != 0 {
			t.Errorf("%s: page size %d", ep.Dev.Name(), a.PageSize)
		}
		if a.MaxQPWR < 64 || a.MaxSGE < 1 || a.MaxCQE < 256 || a.MaxQP < 2 || a.MaxMR < 2 || a.MaxPD < 1 {
			t.Errorf("%s: implausible limits %+v", ep.Dev.Name(), a)
		}
		if a.MaxMTU.Bytes() == 0 || a.ActiveMTU.Bytes() == 0 || a.ActiveMTU > a.MaxMTU {
			t.Errorf("%s: MTUs max %v active %v", ep.Dev.Name(), a.MaxMTU, a.ActiveMTU)
		}
		found := false
		for _, ap := range ep.Dev.Addrs() {
			if ap.Addr().Unmap() == ep.Addr.Unmap() {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: endpoint address %v not among the device's addresses %v", ep.Dev.Name(), ep.Addr, ep.Dev.Addrs())
		}
		found = false
		for _, g := range ep.Dev.GIDs() {
			if g == transport.GIDFromAddr(ep.Addr.Unmap()) || g == transport.GIDFromAddr(ep.Addr) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: no GID for %v among %v", ep.Dev.Name(), ep.Addr, ep.Dev.GIDs())
		}
	}
}

func (s *suite) testMemoryAndMR(t *testing.T) {
	p := s.f(t)
	dev := p.A.Dev
	ps := dev.Attr().PageSize
	mem, err := dev.AllocMemory(ps + 5)
	must(t, err)
	if mem.Len() != 2*ps || len(mem.Bytes()) != mem.Len() || mem.Addr()%uint64(ps) != 0 {
		t.Fatalf("memory: len %d (%d bytes), addr %#x; want 2 pages, page-aligned", mem.Len(), len(mem.Bytes()), mem.Addr())
	}
	if !bytes.Equal(mem.Bytes(), make([]byte, mem.Len())) {
		t.Fatal("new memory is not zeroed")
	}
	if _, err := dev.AllocMemory(0); err == nil {
		t.Fatal("AllocMemory(0) accepted")
	}
	pd, err := dev.AllocPD()
	must(t, err)
	mr, err := pd.RegMR(mem.Addr()+16, 100, transport.AccessLocalWrite|transport.AccessRemoteWrite|transport.AccessRemoteRead)
	must(t, err)
	if mr.LKey() == 0 || mr.Index() == 0 || mr.LKey()>>8 != mr.Index() || mr.FastReg() || mr.MaxPages() != 0 {
		t.Fatalf("MR keys: index %#x lkey %#x rkey %#x fastreg %v", mr.Index(), mr.LKey(), mr.RKey(), mr.FastReg())
	}
	if inf := mr.Query(); inf.State != transport.MRValid || inf.FastReg {
		t.Fatalf("MR query %+v", inf)
	}
	if _, err := pd.RegMR(mem.Addr()+uint64(mem.Len())-8, 16, transport.AccessLocalWrite); !errors.Is(err, transport.ErrBadAddress) {
		t.Fatalf("MR past the end of device memory: %v; want ErrBadAddress", err)
	}
	if _, err := pd.RegMR(mem.Addr(), 16, transport.AccessRemoteWrite); !errors.Is(err, transport.ErrInvalidAccess) {
		t.Fatalf("remote write without local write: %v; want ErrInvalidAccess", err)
	}
	if _, err := pd.AllocFastRegMR(dev.Attr().MaxMRPages + 1); err == nil {
		t.Fatal("fast-reg MR above MaxMRPages accepted")
	}
	if err := mem.Free(); !errors.Is(err, transport.ErrBusy) {
		t.Fatalf("free memory under an MR: %v; want ErrBusy", err)
	}
	if err := pd.Close(); !errors.Is(err, transport.ErrBusy) {
		t.Fatalf("close a PD with an MR: %v; want ErrBusy", err)
	}
	cq, err := dev.CreateCQ(16)
	must(t, err)
	if cq.Cap() < 16 {
		t.Fatalf("CQ cap %d < 16", cq.Cap())
	}
	qp, err := pd.CreateQP(transport.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: transport.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	must(t, err)
	if qp.State() != transport.QPSReset || qp.QPN() < 2 || qp.QPN() > 0xFFFFFF {
		t.Fatalf("new QP %#x in %v", qp.QPN(), qp.State())
	}
	if c := qp.Query().Cap; c.MaxSendWR < 4 || c.MaxRecvWR < 4 || c.MaxSendSGE < 1 || c.MaxRecvSGE < 1 {
		t.Fatalf("QP caps %+v below the request", c)
	}
	if qp.SendQueueFree() != qp.Query().Cap.MaxSendWR || qp.RecvQueueFree() != qp.Query().Cap.MaxRecvWR {
		t.Fatalf("free slots %d/%d, caps %+v", qp.SendQueueFree(), qp.RecvQueueFree(), qp.Query().Cap)
	}
	if err := cq.Close(); !errors.Is(err, transport.ErrBusy) {
		t.Fatalf("close a CQ in use: %v; want ErrBusy", err)
	}
	must(t, qp.Close())
	must(t, cq.Close())
	must(t, mr.Close())
	must(t, mem.Free())
	must(t, pd.Close())
}

func (s *suite) testPostValidation(t *testing.T) {
	p := s.f(t)
	a := newSide(t, p.A, sideOpts{depth: 8})
	b := newSide(t, p.B, sideOpts{depth: 8})
	send := transport.SendWR{ID: 1, Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: []transport.SGE{a.sge(0, 8)}}
	// RESET: neither queue accepts WRs; INIT: receives only; RTR: receives only.
	postErrIndex(t, a.qp.PostSend([]transport.SendWR{send}), transport.ErrQPState, 0)
	postErrIndex(t, a.qp.PostRecv([]transport.RecvWR{{ID: 1, SGL: []transport.SGE{a.sge(0, 8)}}}), transport.ErrQPState, 0)
	// a talks to b's QP, which stays in RESET: the peer drops everything, so what a posts stays
	// outstanding (no ACK, retries at the slowest timeout).
	a.bringUp(t, a.qp, a.psn, b.ep, b.qp.QPN(), b.psn, connOpts{mtu: transport.MTU1024, timeout: 20})
	capa := a.qp.Query().Cap
	free := a.qp.SendQueueFree()
	if free != capa.MaxSendWR {
		t.Fatalf("free SQ slots %d, cap %d", free, capa.MaxSendWR)
	}
	bad := []struct {
		name string
		wr   transport.SendWR
		want error
	}{
		{"opcode 99", transport.SendWR{Opcode: 99}, transport.ErrInvalidOpcode},
		{"too many SGEs", transport.SendWR{Opcode: transport.WRSend, SGL: make([]transport.SGE, capa.MaxSendSGE+1)}, transport.ErrTooManySGE},
		{"inline READ", transport.SendWR{Opcode: transport.WRRDMARead, Flags: transport.SendInline}, transport.ErrInvalidWR},
		{"REG_MR without MR", transport.SendWR{Opcode: transport.WRRegMR}, transport.ErrInvalidWR},
	}
	if capa.MaxInlineData < (1<<20)-1 {
		bad = append(bad, struct {
			name string
			wr   transport.SendWR
			want error
		}{"inline too long", transport.SendWR{Opcode: transport.WRSend, Flags: transport.SendInline,
			SGL: []transport.SGE{a.sge(0, capa.MaxInlineData+1)}}, transport.ErrInlineTooLong})
	}
	for _, tc := range bad {
		t.Logf("%s", tc.name)
		postErrIndex(t, a.qp.PostSend([]transport.SendWR{send, tc.wr}), tc.want, 1)
		if got := a.qp.SendQueueFree(); got != free {
			t.Fatalf("%s: a refused chain changed the SQ: free %d, want %d", tc.name, got, free)
		}
	}
	postErrIndex(t, a.qp.PostRecv([]transport.RecvWR{{ID: 1}, {ID: 2, SGL: make([]transport.SGE, capa.MaxRecvSGE+1)}}), transport.ErrTooManySGE, 1)
	if got := a.qp.RecvQueueFree(); got != capa.MaxRecvWR {
		t.Fatalf("a refused receive chain changed the RQ: free %d", got)
	}
	// Fill the SQ but one slot; a chain of two does not fit and changes nothing.
	chain := make([]transport.SendWR, free-1)
	for i := range chain {
		chain[i] = send
		chain[i].ID = uint64(10 + i)
	}
	must(t, a.qp.PostSend(chain))
	if got := a.qp.SendQueueFree(); got != 1 {
		t.Fatalf("free %d after posting %d of %d", got, free-1, free)
	}
	postErrIndex(t, a.qp.PostSend([]transport.SendWR{send, send}), transport.ErrSQFull, 1)
	if got := a.qp.SendQueueFree(); got != 1 {
		t.Fatalf("a refused chain changed the SQ: free %d", got)
	}
	// Fill the RQ; one more is refused.
	recvs := make([]transport.RecvWR, capa.MaxRecvWR)
	for i := range recvs {
		recvs[i] = transport.RecvWR{ID: uint64(100 + i), SGL: []transport.SGE{a.sge(4096, 64)}}
	}
	must(t, a.qp.PostRecv(recvs))
	postErrIndex(t, a.qp.PostRecv([]transport.RecvWR{{ID: 999}}), transport.ErrRQFull, 0)

	// Modify errors are typed and leave the QP alone.
	var me *transport.ModifyError
	err := a.qp.Modify(&transport.QPAttr{State: transport.QPSInit}, transport.AttrState)
	if !errors.Is(err, transport.ErrInvalidTransition) || !errors.As(err, &me) || me.From != transport.QPSRTS {
		t.Fatalf("RTS->INIT: %v", err)
	}
	if st := a.qp.State(); st != transport.QPSRTS {
		t.Fatalf("state %v after a refused Modify", st)
	}
	// To ERR: every outstanding WR is flushed, in order.
	must(t, a.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState))
	w := s.wait(p)
	for i := range chain {
		wantWC(t, waitWC(t, a.scq, w), uint64(10+i), transport.WCWRFlushErr, transport.WCSend)
	}
	for i := range recvs {
		wantWC(t, waitWC(t, a.rcq, w), uint64(100+i), transport.WCWRFlushErr, transport.WCRecv)
	}
	if got := a.qp.SendQueueFree(); got != free {
		t.Fatalf("free SQ slots after the flush: %d, want %d", got, free)
	}
	if got := a.qp.RecvQueueFree(); got != capa.MaxRecvWR {
		t.Fatalf("free RQ slots after the flush: %d, want %d", got, capa.MaxRecvWR)
	}
}

func (s *suite) testSendRecv(t *testing.T) {
	for _, mtu := range s.cfg.MTUs {
		t.Run(mtu.String(), func(t *testing.T) {
			a, b, p := s.pair(t, sideOpts{}, mtu)
			w := s.wait(p)
			m := mtu.Bytes()
			for i, n := range []int{0, 1, m - 1, m, m + 1, 5*m + 3, 65536 + 5} {
				for _, imm := range []bool{false, true} {
					fill(a.bytes(0, n), uint64(i))
					clear(b.bytes(0, 128<<10))
					id := uint64(i*2 + 1)
					// Two receive SGEs: the data is scattered over both.
					must(t, b.qp.PostRecv([]transport.RecvWR{{ID: id, SGL: []transport.SGE{b.sge(0, 40000), b.sge(40000, 80000)}}}))
					wr := transport.SendWR{ID: id, Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: []transport.SGE{a.sge(0, n)}}
					if imm {
						wr.Opcode, wr.Imm = transport.WRSendWithImm, 0xdeadbeef^uint32(i)
					}
					must(t, a.qp.PostSend([]transport.SendWR{wr}))
					wantWC(t, waitWC(t, a.scq, w), id, transport.WCSuccess, transport.WCSend)
					wc := waitWC(t, b.rcq, w)
					wantWC(t, wc, id, transport.WCSuccess, transport.WCRecv)
					if int(wc.ByteLen) != n || wc.QPN != b.qp.QPN() {
						t.Fatalf("recv WC %+v, want %d bytes on QP %#x", wc, n, b.qp.QPN())
					}
					if imm != (wc.Flags&transport.WCWithImm != 0) || (imm && wc.Imm != wr.Imm) {
						t.Fatalf("recv WC %+v: immediate data (want %v, %#x)", wc, imm, wr.Imm)
					}
					equal(t, fmt.Sprintf("SEND %d", n), b.bytes(0, n), a.bytes(0, n))
				}
			}
			// A gather list on the send side.
			fill(a.bytes(0, 3000), 99)
			fill(a.bytes(8192, 5000), 98)
			must(t, b.qp.PostRecv([]transport.RecvWR{{ID: 77, SGL: []transport.SGE{b.sge(0, 8000)}}}))
			must(t, a.qp.PostSend([]transport.SendWR{{ID: 77, Opcode: transport.WRSend, Flags: transport.SendSignaled,
				SGL: []transport.SGE{a.sge(0, 3000), a.sge(8192, 5000)}}}))
			wantWC(t, waitWC(t, a.scq, w), 77, transport.WCSuccess, transport.WCSend)
			wc := waitWC(t, b.rcq, w)
			wantWC(t, wc, 77, transport.WCSuccess, transport.WCRecv)
			if wc.ByteLen != 8000 {
				t.Fatalf("gathered SEND: %d bytes", wc.ByteLen)
			}
			equal(t, "gather part 1", b.bytes(0, 3000), a.bytes(0, 3000))
			equal(t, "gather part 2", b.bytes(3000, 5000), a.bytes(8192, 5000))
		})
	}
}

func (s *suite) testSendInline(t *testing.T) {
	p := s.f(t)
	max := p.A.Dev.Attr().MaxInlineData
	if max <= 0 {
		t.Skipf("SKIPPED: %s supports no inline data", p.A.Dev.Name())
	}
	n := min(max, 64)
	o := sideOpts{inline: n}
	a, b := newSide(t, p.A, o), newSide(t, p.B, o)
	co := connOpts{mtu: transport.MTU1024, timeout: s.cfg.LocalACKTimeout}
	a.bringUp(t, a.qp, a.psn, b.ep, b.qp.QPN(), b.psn, co)
	b.bringUp(t, b.qp, b.psn, a.ep, a.qp.QPN(), a.psn, co)
	if got := a.qp.Query().Cap.MaxInlineData; got < n {
		t.Fatalf("QP inline cap %d < %d requested", got, n)
	}
	w := s.wait(p)
	fill(a.bytes(0, n), 5)
	want := bytes.Clone(a.bytes(0, n))
	must(t, b.qp.PostRecv([]transport.RecvWR{{ID: 1, SGL: []transport.SGE{b.sge(0, 4096)}}}))
	// Inline data is copied at post time: no lkey is needed and the buffer may change at once.
	must(t, a.qp.PostSend([]transport.SendWR{{ID: 2, Opcode: transport.WRSend, Flags: transport.SendSignaled | transport.SendInline,
		SGL: []transport.SGE{{Addr: a.mem.Addr(), Length: uint32(n)}}}}))
	clear(a.bytes(0, n))
	wantWC(t, waitWC(t, a.scq, w), 2, transport.WCSuccess, transport.WCSend)
	wc := waitWC(t, b.rcq, w)
	wantWC(t, wc, 1, transport.WCSuccess, transport.WCRecv)
	if int(wc.ByteLen) != n {
		t.Fatalf("inline SEND: %d bytes, want %d", wc.ByteLen, n)
	}
	equal(t, "inline SEND", b.bytes(0, n), want)
}

func (s *suite) testWriteRead(t *testing.T) {
	big := s.cfg.BigXfer
	for _, mtu := range s.cfg.MTUs {
		t.Run(mtu.String(), func(t *testing.T) {
			a, b, p := s.pair(t, sideOpts{memSize: 2*big + 1<<20}, mtu)
			w := s.wait(p)
			m := mtu.Bytes()
			for i, n := range []int{1, m - 1, m, m + 1, 3*m + 7, 65536 + 13, big} {
				t.Run(sizeName(n), func(t *testing.T) {
					src, dst := a.bytes(0, n), a.bytes(big, n)
					fill(src, uint64(n)*31+uint64(i))
					clear(dst)
					off := 4096 + 5 // unaligned remote offset
					// WRITE a → b (unsignaled), then READ b → a (signaled): one completion.
					must(t, a.qp.PostSend([]transport.SendWR{
						{ID: 1, Opcode: transport.WRRDMAWrite, SGL: []transport.SGE{a.sge(0, n)},
							RemoteAddr: b.mem.Addr() + uint64(off), RKey: b.mr.RKey()},
						{ID: 2, Opcode: transport.WRRDMARead, Flags: transport.SendSignaled,
							SGL: []transport.SGE{a.sge(big, n)}, RemoteAddr: b.mem.Addr() + uint64(off), RKey: b.mr.RKey()},
					}))
					wc := waitWC(t, a.scq, w)
					wantWC(t, wc, 2, transport.WCSuccess, transport.WCRDMARead)
					if int(wc.ByteLen) != n {
						t.Fatalf("READ byte len %d, want %d", wc.ByteLen, n)
					}
					equal(t, "remote after WRITE", b.bytes(off, n), src)
					equal(t, "local after READ", dst, src)
				})
			}
			expectNoWC(t, b.rcq, 10*time.Millisecond) // RDMA without immediate consumes no receive
		})
	}
}

func (s *suite) testWriteWithImm(t *testing.T) {
	a, b, p := s.pair(t, sideOpts{}, 0)
	w := s.wait(p)
	for i, n := range []int{0, 1, 5000} {
		fill(a.bytes(0, n), uint64(i+100))
		must(t, b.qp.PostRecv([]transport.RecvWR{{ID: 50 + uint64(i)}}))
		must(t, a.qp.PostSend([]transport.SendWR{{ID: 9, Opcode: transport.WRRDMAWriteWithImm, Imm: 0x01020304 + uint32(i),
			Flags: transport.SendSignaled, SGL: []transport.SGE{a.sge(0, n)}, RemoteAddr: b.mem.Addr() + 8192, RKey: b.mr.RKey()}}))
		wantWC(t, waitWC(t, a.scq, w), 9, transport.WCSuccess, transport.WCRDMAWrite)
		wc := waitWC(t, b.rcq, w)
		wantWC(t, wc, 50+uint64(i), transport.WCSuccess, transport.WCRecvRDMAWithImm)
		if wc.Flags&transport.WCWithImm == 0 || wc.Imm != 0x01020304+uint32(i) || int(wc.ByteLen) != n {
			t.Fatalf("WRITE_WITH_IMM %d bytes: WC %+v", n, wc)
		}
		equal(t, "WRITE_WITH_IMM", b.bytes(8192, n), a.bytes(0, n))
	}
}

func (s *suite) testUnsignaled(t *testing.T) {
	a, b, p := s.pair(t, sideOpts{}, 0)
	w := s.wait(p)
	free := a.qp.SendQueueFree()
	for round := 0; round < 3; round++ {
		fill(a.bytes(0, 3*1000), uint64(round))
		must(t, b.qp.PostRecv([]transport.RecvWR{{ID: 5, SGL: []transport.SGE{b.sge(65536, 64)}}}))
		must(t, a.qp.PostSend([]transport.SendWR{
			{ID: 1, Opcode: transport.WRRDMAWrite, SGL: []transport.SGE{a.sge(0, 1000)}, RemoteAddr: b.mem.Addr(), RKey: b.mr.RKey()},
			{ID: 2, Opcode: transport.WRRDMAWrite, SGL: []transport.SGE{a.sge(1000, 1000)}, RemoteAddr: b.mem.Addr() + 1000, RKey: b.mr.RKey()},
			{ID: 3, Opcode: transport.WRRDMAWrite, SGL: []transport.SGE{a.sge(2000, 1000)}, RemoteAddr: b.mem.Addr() + 2000, RKey: b.mr.RKey()},
			{ID: 4, Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: []transport.SGE{a.sge(0, 10)}},
		}))
		// The only completion is the signaled SEND's; it retires the three WRITEs (their slots
		// are free again) and, by RC ordering, the WRITEs' data is in place when the SEND lands.
		wantWC(t, waitWC(t, a.scq, w), 4, transport.WCSuccess, transport.WCSend)
		wantWC(t, waitWC(t, b.rcq, w), 5, transport.WCSuccess, transport.WCRecv)
		equal(t, "WRITEs before the SEND", b.bytes(0, 3000), a.bytes(0, 3000))
		expectNoWC(t, a.scq, 10*time.Millisecond)
		if got := a.qp.SendQueueFree(); got != free {
			t.Fatalf("free SQ slots %d after the signaled completion, want %d", got, free)
		}
	}
}

func (s *suite) testRemoteAccessError(t *testing.T) {
	t.Run("WriteBadKey", func(t *testing.T) {
		a, b, p := s.pair(t, sideOpts{}, 0)
		w := s.wait(p)
		rk := b.mr.RKey()
		bad := rk&^0xFF | (rk+1)&0xFF // right MR index, wrong key byte
		must(t, b.qp.PostRecv([]transport.RecvWR{{ID: 40, SGL: []transport.SGE{b.sge(0, 64)}}}))
		must(t, a.qp.PostSend([]transport.SendWR{
			{ID: 1, Opcode: transport.WRRDMAWrite, SGL: []transport.SGE{a.sge(0, 100)}, RemoteAddr: b.mem.Addr(), RKey: bad},
			{ID: 2, Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: []transport.SGE{a.sge(0, 10)}},
		}))
		// An error always completes, signaled or not; the rest of the SQ is flushed.
		wantWC(t, waitWC(t, a.scq, w), 1, transport.WCRemAccessErr, transport.WCRDMAWrite)
		wantWC(t, waitWC(t, a.scq, w), 2, transport.WCWRFlushErr, transport.WCSend)
		waitState(t, a.qp, transport.QPSErr, w)
		// The responder goes to ERR too (class C) and flushes its receive.
		wantWC(t, waitWC(t, b.rcq, w), 40, transport.WCWRFlushErr, transport.WCRecv)
		waitState(t, b.qp, transport.QPSErr, w)
		// Posting to a QP in ERR completes with flush errors.
		must(t, a.qp.PostSend([]transport.SendWR{{ID: 6, Opcode: transport.WRSend, SGL: []transport.SGE{a.sge(0, 10)}}}))
		wantWC(t, waitWC(t, a.scq, w), 6, transport.WCWRFlushErr, transport.WCSend)
		must(t, b.qp.PostRecv([]transport.RecvWR{{ID: 41, SGL: []transport.SGE{b.sge(0, 64)}}}))
		wantWC(t, waitWC(t, b.rcq, w), 41, transport.WCWRFlushErr, transport.WCRecv)
	})
	t.Run("ReadNoRemoteRead", func(t *testing.T) {
		a, b, p := s.pair(t, sideOpts{}, 0)
		w := s.wait(p)
		local, err := b.pd.RegMR(b.mem.Addr(), 8192, transport.AccessLocalWrite)
		must(t, err)
		t.Cleanup(func() { closeLogged(t, "MR", local.Close) })
		// An MR without remote rights: its lkey is no rkey.
		must(t, a.qp.PostSend([]transport.SendWR{{ID: 3, Opcode: transport.WRRDMARead, Flags: transport.SendSignaled,
			SGL: []transport.SGE{a.sge(0, 100)}, RemoteAddr: b.mem.Addr(), RKey: local.LKey()}}))
		wantWC(t, waitWC(t, a.scq, w), 3, transport.WCRemAccessErr, transport.WCRDMARead)
		waitState(t, a.qp, transport.QPSErr, w)
	})
	t.Run("WriteOutOfRange", func(t *testing.T) {
		a, b, p := s.pair(t, sideOpts{}, 0)
		w := s.wait(p)
		must(t, a.qp.PostSend([]transport.SendWR{{ID: 4, Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled,
			SGL: []transport.SGE{a.sge(0, 100)}, RemoteAddr: b.mem.Addr() + uint64(b.mem.Len()) - 50, RKey: b.mr.RKey()}}))
		wantWC(t, waitWC(t, a.scq, w), 4, transport.WCRemAccessErr, transport.WCRDMAWrite)
	})
	t.Run("LocalProtection", func(t *testing.T) {
		a, _, p := s.pair(t, sideOpts{}, 0)
		w := s.wait(p)
		// A local SGE with a wrong lkey completes with a local protection error.
		sge := a.sge(0, 100)
		sge.LKey = sge.LKey&^0xFF | (sge.LKey+1)&0xFF
		must(t, a.qp.PostSend([]transport.SendWR{{ID: 5, Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled,
			SGL: []transport.SGE{sge}, RemoteAddr: a.mem.Addr(), RKey: a.mr.RKey()}}))
		// softroce (and hardware) report LOC_PROT_ERR; kernel rxe 6.1 reports LOC_QP_OP_ERR.
		wc := waitWC(t, a.scq, w)
		if wc.ID != 5 || (wc.Status != transport.WCLocProtErr && wc.Status != transport.WCLocQPOpErr) {
			t.Fatalf("completion %+v (%v); want id 5 LOC_PROT_ERR (or LOC_QP_OP_ERR)", wc, wc.Status)
		}
		waitState(t, a.qp, transport.QPSErr, w)
	})
}

func (s *suite) testRecvLengthError(t *testing.T) {
	a, b, p := s.pair(t, sideOpts{}, 0)
	w := s.wait(p)
	must(t, b.qp.PostRecv([]transport.RecvWR{{ID: 7, SGL: []transport.SGE{b.sge(0, 16)}}}))
	must(t, a.qp.PostSend([]transport.SendWR{{ID: 8, Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: []transport.SGE{a.sge(0, 100)}}}))
	// The requester sees a NAK: invalid request (softroce, the IBA's class C) or remote
	// operational error (kernel rxe 6.1). The responder's receive fails: softroce reports
	// LOC_LEN_ERR, rxe REM_INV_REQ_ERR or another error. Engines differ here; what must hold is
	// that both sides fail and both QPs end in ERR.
	wc := waitWC(t, a.scq, w)
	if wc.ID != 8 || (wc.Status != transport.WCRemInvReqErr && wc.Status != transport.WCRemOpErr) {
		t.Fatalf("send completion %+v (%v); want id 8 REM_INV_REQ_ERR (or REM_OP_ERR)", wc, wc.Status)
	}
	wc = waitWC(t, b.rcq, w)
	if wc.ID != 7 || wc.Status == transport.WCSuccess {
		t.Fatalf("receive completion %+v (%v); want id 7 failed", wc, wc.Status)
	}
	t.Logf("receive completed with %v", wc.Status)
	waitState(t, a.qp, transport.QPSErr, w)
	waitState(t, b.qp, transport.QPSErr, w)
}

func (s *suite) testFlushOnError(t *testing.T) {
	a, b, p := s.pair(t, sideOpts{}, 0)
	w := s.wait(p)
	rfree := b.qp.RecvQueueFree()
	for i := 0; i < 3; i++ {
		must(t, b.qp.PostRecv([]transport.RecvWR{{ID: uint64(20 + i), SGL: []transport.SGE{b.sge(i*100, 100)}}}))
	}
	if got := b.qp.RecvQueueFree(); got != rfree-3 {
		t.Fatalf("free RQ slots %d, want %d", got, rfree-3)
	}
	// A live connection first: one SEND consumes receive 20.
	must(t, a.qp.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: []transport.SGE{a.sge(0, 10)}}}))
	wantWC(t, waitWC(t, a.scq, w), 1, transport.WCSuccess, transport.WCSend)
	wantWC(t, waitWC(t, b.rcq, w), 20, transport.WCSuccess, transport.WCRecv)
	must(t, b.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState))
	if st := b.qp.State(); st != transport.QPSErr {
		t.Fatalf("state %v after Modify(ERR)", st)
	}
	wantWC(t, waitWC(t, b.rcq, w), 21, transport.WCWRFlushErr, transport.WCRecv)
	wantWC(t, waitWC(t, b.rcq, w), 22, transport.WCWRFlushErr, transport.WCRecv)
	// Posts in ERR are accepted and flushed, in order.
	must(t, b.qp.PostRecv([]transport.RecvWR{{ID: 23, SGL: []transport.SGE{b.sge(0, 100)}}}))
	must(t, b.qp.PostSend([]transport.SendWR{{ID: 24, Opcode: transport.WRSend, SGL: []transport.SGE{b.sge(0, 10)}},
		{ID: 25, Opcode: transport.WRRDMAWrite, SGL: []transport.SGE{b.sge(0, 10)}, RemoteAddr: a.mem.Addr(), RKey: a.mr.RKey()}}))
	wantWC(t, waitWC(t, b.rcq, w), 23, transport.WCWRFlushErr, transport.WCRecv)
	wantWC(t, waitWC(t, b.scq, w), 24, transport.WCWRFlushErr, transport.WCSend)
	wantWC(t, waitWC(t, b.scq, w), 25, transport.WCWRFlushErr, transport.WCRDMAWrite)
	expectNoWC(t, b.rcq, 20*time.Millisecond)
	if got := b.qp.RecvQueueFree(); got != rfree {
		t.Fatalf("free RQ slots %d after the flush, want %d", got, rfree)
	}
	// ERR → RESET → INIT works again; RESET discards nothing since nothing is left.
	must(t, b.qp.Modify(&transport.QPAttr{State: transport.QPSReset}, transport.AttrState))
	if st := b.qp.State(); st != transport.QPSReset {
		t.Fatalf("state %v after Modify(RESET)", st)
	}
	must(t, b.qp.Modify(&transport.QPAttr{State: transport.QPSInit, Port: 1, AccessFlags: transport.AccessRemoteWrite},
		transport.AttrState|transport.AttrPort|transport.AttrPKeyIndex|transport.AttrAccessFlags))
	must(t, b.qp.PostRecv([]transport.RecvWR{{ID: 26, SGL: []transport.SGE{b.sge(0, 100)}}}))
	expectNoWC(t, b.rcq, 20*time.Millisecond)
}

func (s *suite) testFastReg(t *testing.T) {
	a, b, p := s.pair(t, sideOpts{}, 0)
	w := s.wait(p)
	fr, err := b.pd.AllocFastRegMR(8)
	if errors.Is(err, transport.ErrNotSupported) {
		t.Skipf("SKIPPED: %s has no fast registration: %v", p.B.Dev.Name(), err)
	}
	must(t, err)
	t.Cleanup(func() { closeLogged(t, "fast-reg MR", fr.Close) })
	if !fr.FastReg() || fr.MaxPages() < 8 || fr.Index() == 0 || fr.RKey()>>8 != fr.Index() {
		t.Fatalf("fast-reg MR: fastreg %v maxpages %d index %#x rkey %#x", fr.FastReg(), fr.MaxPages(), fr.Index(), fr.RKey())
	}
	if inf := fr.Query(); inf.State != transport.MRFree || !inf.FastReg {
		t.Fatalf("new fast-reg MR: %+v", inf)
	}
	// The portable form of a registration: VA-contiguous pages, the IOVA is the device address
	// of the first byte (what ib_map_mr_sg does, and what frpool and ib_srp use).
	ps := uint64(p.B.Dev.Attr().PageSize)
	base := b.mem.Addr()
	pages := []uint64{base + 5*ps, base + 6*ps, base + 7*ps}
	iova := pages[0] + 0x100
	length := 3*ps - 0x100 - 17
	key1 := fr.Index()<<8 | (fr.RKey()+1)&0xFF
	reg := transport.SendWR{ID: 100, Opcode: transport.WRRegMR, Flags: transport.SendSignaled, Reg: transport.RegMRWR{
		MR: fr, Key: key1, Access: transport.AccessLocalWrite | transport.AccessRemoteWrite | transport.AccessRemoteRead,
		IOVA: iova, Length: length, PageSize: uint32(ps), Pages: pages}}
	must(t, b.qp.PostSend([]transport.SendWR{reg}))
	wantWC(t, waitWC(t, b.scq, w), 100, transport.WCSuccess, transport.WCRegMR)
	if inf := fr.Query(); inf.State != transport.MRValid || inf.Key != key1 || inf.IOVA != iova || inf.Length != length {
		t.Fatalf("after REG_MR: %+v; want VALID key %#x iova %#x length %d", inf, key1, iova, length)
	}
	n := int(length)
	fill(a.bytes(0, n), 77)
	must(t, a.qp.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled,
		SGL: []transport.SGE{a.sge(0, n)}, RemoteAddr: iova, RKey: key1}}))
	wantWC(t, waitWC(t, a.scq, w), 1, transport.WCSuccess, transport.WCRDMAWrite)
	equal(t, "fast-reg WRITE", b.bytes(int(5*ps)+0x100, n), a.bytes(0, n))
	must(t, a.qp.PostSend([]transport.SendWR{{ID: 2, Opcode: transport.WRRDMARead, Flags: transport.SendSignaled,
		SGL: []transport.SGE{a.sge(1<<19, n)}, RemoteAddr: iova, RKey: key1}}))
	wantWC(t, waitWC(t, a.scq, w), 2, transport.WCSuccess, transport.WCRDMARead)
	equal(t, "fast-reg READ", a.bytes(1<<19, n), a.bytes(0, n))

	// SEND_WITH_INV of key1: b's receive reports it and the MR is FREE.
	must(t, b.qp.PostRecv([]transport.RecvWR{{ID: 200, SGL: []transport.SGE{b.sge(1<<19, 64)}}}))
	must(t, a.qp.PostSend([]transport.SendWR{{ID: 3, Opcode: transport.WRSendWithInv, Flags: transport.SendSignaled,
		SGL: []transport.SGE{a.sge(0, 36)}, InvalidateRKey: key1}}))
	wantWC(t, waitWC(t, a.scq, w), 3, transport.WCSuccess, transport.WCSend)
	wc := waitWC(t, b.rcq, w)
	wantWC(t, wc, 200, transport.WCSuccess, transport.WCRecv)
	if wc.Flags&transport.WCWithInvalidate == 0 || wc.InvalidatedRKey != key1 || wc.ByteLen != 36 {
		t.Fatalf("recv WC %+v: want invalidate of %#x", wc, key1)
	}
	if inf := fr.Query(); inf.State != transport.MRFree {
		t.Fatalf("after remote invalidate: %+v", inf)
	}
	// Register again with the next key and LOCAL_INV it in the same chain: SQ order.
	key2 := fr.Index()<<8 | (key1+1)&0xFF
	reg.ID, reg.Reg.Key = 101, key2
	must(t, b.qp.PostSend([]transport.SendWR{reg, {ID: 102, Opcode: transport.WRLocalInv, Flags: transport.SendSignaled, InvalidateRKey: key2}}))
	wantWC(t, waitWC(t, b.scq, w), 101, transport.WCSuccess, transport.WCRegMR)
	wantWC(t, waitWC(t, b.scq, w), 102, transport.WCSuccess, transport.WCLocalInv)
	if inf := fr.Query(); inf.State != transport.MRFree || inf.Key != key2 {
		t.Fatalf("after LOCAL_INV: %+v; want FREE with key %#x", inf, key2)
	}
	// Register with key3 unsignaled, then a signaled SEND retires it: the MR is VALID.
	key3 := fr.Index()<<8 | (key2+1)&0xFF
	reg.ID, reg.Reg.Key, reg.Flags = 103, key3, 0
	must(t, b.qp.PostRecv([]transport.RecvWR{{ID: 201, SGL: []transport.SGE{b.sge(1<<19, 64)}}}))
	must(t, a.qp.PostRecv([]transport.RecvWR{{ID: 300, SGL: []transport.SGE{a.sge(1<<19, 64)}}}))
	must(t, b.qp.PostSend([]transport.SendWR{reg, {ID: 104, Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: []transport.SGE{b.sge(0, 8)}}}))
	wantWC(t, waitWC(t, b.scq, w), 104, transport.WCSuccess, transport.WCSend)
	if inf := fr.Query(); inf.State != transport.MRValid || inf.Key != key3 {
		t.Fatalf("after an unsignaled REG_MR retired by a SEND: %+v; want VALID with key %#x", inf, key3)
	}
	wantWC(t, waitWC(t, a.rcq, w), 300, transport.WCSuccess, transport.WCRecv)
	// A stale access with key2: NAK remote access error, a's QP goes to ERR.
	must(t, a.qp.PostSend([]transport.SendWR{{ID: 4, Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled,
		SGL: []transport.SGE{a.sge(0, 100)}, RemoteAddr: iova, RKey: key2}}))
	wantWC(t, waitWC(t, a.scq, w), 4, transport.WCRemAccessErr, transport.WCRDMAWrite)
	waitState(t, a.qp, transport.QPSErr, w)
	waitState(t, b.qp, transport.QPSErr, w)
	wantWC(t, waitWC(t, b.rcq, w), 201, transport.WCWRFlushErr, transport.WCRecv)
}

// ---- connection management ------------------------------------------------------------------

func connManagers(t *testing.T, p Pair) (a, b transport.ConnManager) {
	t.Helper()
	a, okA := p.A.Dev.(transport.ConnManager)
	b, okB := p.B.Dev.(transport.ConnManager)
	if !okA || !okB {
		t.Skipf("SKIPPED: %s or %s does not implement transport.ConnManager", p.A.Dev.Name(), p.B.Dev.Name())
	}
	return a, b
}

var cmParam = transport.ConnParam{ResponderResources: 4, InitiatorDepth: 4, FlowControl: true}

type dialRes struct {
	conn transport.CMConn
	err  error
}

func goDial(ctx context.Context, cm transport.ConnManager, to netip.AddrPort, qp transport.QP, pd []byte) chan dialRes {
	ch := make(chan dialRes, 1)
	go func() {
		c, err := cm.Dial(ctx, to, qp, pd, cmParam)
		ch <- dialRes{c, err}
	}()
	return ch
}

func (s *suite) testCMConnect(t *testing.T) {
	p := s.f(t)
	cma, cmb := connManagers(t, p)
	a, b := newSide(t, p.A, sideOpts{}), newSide(t, p.B, sideOpts{})
	w := s.wait(p)
	port := s.cfg.CMPort
	l, err := cmb.Listen(p.B.Addr, port)
	must(t, err)
	defer l.Close()
	if la := l.Addr(); la.Port() != port {
		t.Fatalf("listener address %v, want port %d", la, port)
	}
	ctx, cancel := context.WithTimeout(context.Background(), w)
	defer cancel()
	dialPD := []byte("conformance: REQ private data")
	acceptPD := []byte("conformance: REP private data, longer than the REQ's")
	dch := goDial(ctx, cma, netip.AddrPortFrom(p.B.Addr, port), a.qp, dialPD)
	req, err := l.Accept(ctx)
	must(t, err)
	if got := req.PrivateData(); !bytes.HasPrefix(got, dialPD) || len(got) > transport.MaxDialPrivateData {
		t.Fatalf("request private data %q; want %q + padding (≤ %d bytes)", got, dialPD, transport.MaxDialPrivateData)
	}
	info := req.Info()
	if info.RemoteQPN != a.qp.QPN() || info.PathMTU.Bytes() == 0 || info.LocalAddr.Port() != port ||
		info.RemoteAddr.Addr().Unmap() != p.A.Addr.Unmap() || info.ResponderResources == 0 {
		t.Fatalf("request info %+v (dialling QP %#x from %v)", info, a.qp.QPN(), p.A.Addr)
	}
	cb, err := req.Accept(ctx, b.qp, acceptPD, cmParam)
	must(t, err)
	r := <-dch
	must(t, r.err)
	ca := r.conn
	if !bytes.HasPrefix(ca.PrivateData(), acceptPD) || len(ca.PrivateData()) > transport.MaxAcceptPrivateData {
		t.Fatalf("REP private data %q; want %q + padding", ca.PrivateData(), acceptPD)
	}
	if ca.QP() != a.qp || cb.QP() != b.qp {
		t.Fatal("CMConn.QP is not the QP that was connected")
	}
	if ca.RemoteAddr().Port() != port || cb.LocalAddr().Port() != port {
		t.Fatalf("endpoints: dialer %v -> %v, acceptor %v <- %v", ca.LocalAddr(), ca.RemoteAddr(), cb.LocalAddr(), cb.RemoteAddr())
	}
	waitState(t, a.qp, transport.QPSRTS, w)
	waitState(t, b.qp, transport.QPSRTS, w)

	// Traffic both ways, including RDMA (the CM grants remote write and, with responder
	// resources, remote read).
	fill(a.bytes(0, 5000), 1)
	must(t, b.qp.PostRecv([]transport.RecvWR{{ID: 1, SGL: []transport.SGE{b.sge(0, 8192)}}}))
	must(t, a.qp.PostSend([]transport.SendWR{
		{ID: 2, Opcode: transport.WRRDMAWrite, SGL: []transport.SGE{a.sge(0, 5000)}, RemoteAddr: b.mem.Addr() + 65536, RKey: b.mr.RKey()},
		{ID: 3, Opcode: transport.WRRDMARead, SGL: []transport.SGE{a.sge(131072, 5000)}, RemoteAddr: b.mem.Addr() + 65536, RKey: b.mr.RKey()},
		{ID: 4, Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: []transport.SGE{a.sge(0, 5000)}},
	}))
	wantWC(t, waitWC(t, a.scq, w), 4, transport.WCSuccess, transport.WCSend)
	wantWC(t, waitWC(t, b.rcq, w), 1, transport.WCSuccess, transport.WCRecv)
	equal(t, "SEND over the CM connection", b.bytes(0, 5000), a.bytes(0, 5000))
	equal(t, "WRITE over the CM connection", b.bytes(65536, 5000), a.bytes(0, 5000))
	equal(t, "READ over the CM connection", a.bytes(131072, 5000), a.bytes(0, 5000))
	// The other way: the acceptor writes into and reads from the dialler (an SRP target's
	// RDMA towards its initiator), then sends.
	fill(b.bytes(200000, 3000), 2)
	must(t, a.qp.PostRecv([]transport.RecvWR{{ID: 5, SGL: []transport.SGE{a.sge(0, 64)}}}))
	must(t, b.qp.PostSend([]transport.SendWR{
		{ID: 7, Opcode: transport.WRRDMAWrite, SGL: []transport.SGE{b.sge(200000, 3000)}, RemoteAddr: a.mem.Addr() + 300000, RKey: a.mr.RKey()},
		{ID: 8, Opcode: transport.WRRDMARead, SGL: []transport.SGE{b.sge(400000, 3000)}, RemoteAddr: a.mem.Addr() + 300000, RKey: a.mr.RKey()},
		{ID: 6, Opcode: transport.WRSendWithImm, Imm: 42, Flags: transport.SendSignaled, SGL: []transport.SGE{b.sge(0, 64)}},
	}))
	wantWC(t, waitWC(t, b.scq, w), 6, transport.WCSuccess, transport.WCSend)
	wantWC(t, waitWC(t, a.rcq, w), 5, transport.WCSuccess, transport.WCRecv)
	equal(t, "acceptor's WRITE", a.bytes(300000, 3000), b.bytes(200000, 3000))
	equal(t, "acceptor's READ", b.bytes(400000, 3000), b.bytes(200000, 3000))

	// Disconnect: the peer sees DISCONNECTED and both QPs end in ERR.
	must(t, ca.Disconnect([]byte("bye")))
	waitState(t, a.qp, transport.QPSErr, w)
	select {
	case ev, ok := <-cb.Events():
		if !ok || ev.Type != transport.CMEventDisconnected {
			t.Fatalf("acceptor event %+v (open %v); want DISCONNECTED", ev, ok)
		}
	case <-time.After(w):
		t.Fatalf("no DISCONNECTED event at the acceptor within %v", w)
	}
	waitState(t, b.qp, transport.QPSErr, w)
	must(t, ca.Disconnect(nil)) // idempotent
	must(t, cb.Disconnect(nil))
}

func (s *suite) testCMReject(t *testing.T) {
	p := s.f(t)
	cma, cmb := connManagers(t, p)
	a, b := newSide(t, p.A, sideOpts{}), newSide(t, p.B, sideOpts{})
	_ = b
	w := s.wait(p)
	port := s.cfg.CMPort + 1
	l, err := cmb.Listen(p.B.Addr, port)
	must(t, err)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), w)
	defer cancel()
	dch := goDial(ctx, cma, netip.AddrPortFrom(p.B.Addr, port), a.qp, []byte("let me in"))
	req, err := l.Accept(ctx)
	must(t, err)
	rejPD := []byte("conformance: no, thanks (REJ private data)")
	must(t, req.Reject(rejPD, transport.RejectConsumerDefined))
	r := <-dch
	var re *transport.RejectError
	if !errors.As(r.err, &re) || !errors.Is(r.err, transport.ErrConnRejected) {
		t.Fatalf("dial: %v, %v; want a *RejectError", r.conn, r.err)
	}
	if re.Reason != transport.RejectConsumerDefined || !bytes.HasPrefix(re.PrivateData, rejPD) || len(re.PrivateData) > transport.MaxRejectPrivateData {
		t.Fatalf("reject: reason %v, private data %q; want consumer defined, %q + padding", re.Reason, re.PrivateData, rejPD)
	}
	// The rejected QP is not connected; it can be dialled again after a RESET.
	if st := a.qp.State(); st == transport.QPSRTS || st == transport.QPSRTR {
		t.Fatalf("rejected QP in %v", st)
	}
}

func (s *suite) testCMNoListener(t *testing.T) {
	p := s.f(t)
	cma, _ := connManagers(t, p)
	a := newSide(t, p.A, sideOpts{})
	w := s.wait(p)
	ctx, cancel := context.WithTimeout(context.Background(), w)
	defer cancel()
	_, err := cma.Dial(ctx, netip.AddrPortFrom(p.B.Addr, s.cfg.CMPort+2), a.qp, nil, cmParam)
	var re *transport.RejectError
	if !errors.As(err, &re) || re.Reason != transport.RejectInvalidServiceID {
		t.Fatalf("dial to a port nobody listens on: %v; want a reject with reason %v", err, transport.RejectInvalidServiceID)
	}
}
