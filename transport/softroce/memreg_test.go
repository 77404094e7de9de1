package softroce

import (
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// The key in force changes only when work requests execute, in SQ order: LOCAL_INV waits for
// every earlier WR to complete (rxe's mandatory local-invalidate fence), REG_MR does not wait
// (it executes when reached) but completes in SQ order; software choosing the next key, and
// even rewriting the page list it posted, changes nothing before execution... except that the
// page list is the WR's own until then, so we only rewrite it after the REG_MR completed.
func TestKeyInForceFollowsSQOrder(t *testing.T) {
	p := newRawPeer(t, connOpts{timeout: 20})
	n := p.dut
	sq := wire.PSN(n.psn)
	fr, err := n.pd.AllocFastRegMR(2)
	if err != nil {
		t.Fatal(err)
	}
	base := n.mem.Addr()
	acc := transport.AccessLocalWrite | transport.AccessRemoteWrite | transport.AccessRemoteRead
	key := func(b uint32) uint32 { return fr.Index()<<8 | b&0xFF }
	pages := []uint64{base + 4*4096, base + 6*4096}
	reg := func(id uint64, k uint32) transport.SendWR {
		return transport.SendWR{ID: id, Opcode: transport.WRRegMR, Flags: transport.SendSignaled,
			Reg: transport.RegMRWR{MR: fr, Key: k, Access: acc, IOVA: 0x5000, Length: 8192, PageSize: 4096, Pages: pages}}
	}
	ack := func(psn wire.PSN) {
		p.send(wire.RCAcknowledge, psn, false, nil, func(pk wire.Packet) {
			pk.AETH().Encode(&wire.AETHFields{Syndrome: ackOK})
		})
	}
	send := transport.SendWR{ID: 1, Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: []transport.SGE{n.sge(0, 8)}}

	// [SEND (unacknowledged), REG_MR k1]: the REG_MR executes at once — the MR is VALID with k1
	// before the SEND is acknowledged — but its completion comes after the SEND's.
	if err := n.qp.PostSend([]transport.SendWR{send, reg(2, key(1))}); err != nil {
		t.Fatal(err)
	}
	p.expect(wire.RCSendOnly, sq)
	deadline := time.Now().Add(5 * time.Second)
	for fr.Query().State != transport.MRValid && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if inf := fr.Query(); inf.State != transport.MRValid || inf.Key != key(1) || inf.IOVA != 0x5000 || inf.NPages != 2 {
		t.Fatalf("REG_MR behind an unacknowledged SEND did not execute: %+v", inf)
	}
	expectNoWC(t, n.scq, 20*time.Millisecond)
	ack(sq)
	wantWC(t, waitWC(t, n.scq, 5*time.Second), 1, transport.WCSuccess, transport.WCSend)
	wantWC(t, waitWC(t, n.scq, 5*time.Second), 2, transport.WCSuccess, transport.WCRegMR)

	// [SEND (unacknowledged), LOCAL_INV k1, REG_MR k2]: software has already moved on to k2,
	// but the key in force stays k1 (VALID) until the SEND completes; then LOCAL_INV(k1)
	// succeeds and REG_MR(k2) takes over, completions in order.
	send.ID = 3
	if err := n.qp.PostSend([]transport.SendWR{send,
		{ID: 4, Opcode: transport.WRLocalInv, Flags: transport.SendSignaled, InvalidateRKey: key(1)},
		reg(5, key(2))}); err != nil {
		t.Fatal(err)
	}
	p.expect(wire.RCSendOnly, sq.Add(1))
	time.Sleep(20 * time.Millisecond)
	if inf := fr.Query(); inf.State != transport.MRValid || inf.Key != key(1) {
		t.Fatalf("LOCAL_INV executed before the SEND ahead of it completed: %+v", inf)
	}
	ack(sq.Add(1))
	wantWC(t, waitWC(t, n.scq, 5*time.Second), 3, transport.WCSuccess, transport.WCSend)
	wantWC(t, waitWC(t, n.scq, 5*time.Second), 4, transport.WCSuccess, transport.WCLocalInv)
	wantWC(t, waitWC(t, n.scq, 5*time.Second), 5, transport.WCSuccess, transport.WCRegMR)
	if inf := fr.Query(); inf.State != transport.MRValid || inf.Key != key(2) {
		t.Fatalf("after LOCAL_INV k1; REG_MR k2: %+v", inf)
	}
	// The page list was copied when REG_MR executed: rewriting the caller's slice now changes
	// nothing the peer can reach.
	pages[0], pages[1] = 0, 0
	fill(n.bytes(4*4096, 4096), 9)
	p.send(wire.RCRDMAReadRequest, p.psn, true, nil, func(pk wire.Packet) {
		pk.RETH().Encode(&wire.RETHFields{VA: 0x5000, RKey: key(2), DMALen: 64})
	})
	equal(t, "READ through k2", p.expect(wire.RCRDMAReadResponseOnly, p.psn).Payload(), n.bytes(4*4096, 64))
	// The stale key k1 is refused by the responder.
	p.send(wire.RCRDMAReadRequest, p.psn.Inc(), true, nil, func(pk wire.Packet) {
		pk.RETH().Encode(&wire.RETHFields{VA: 0x5000, RKey: key(1), DMALen: 64})
	})
	p.expectAck(wire.NakRemoteAccessError.Syndrome(), p.psn.Inc())
}

// LOCAL_INV naming a key that is not the key in force (software's next key, the 2021 rxe/srp
// bug) fails with LOC_QP_OP_ERR and the QP goes to ERR, flushing what follows.
func TestLocalInvWrongKey(t *testing.T) {
	a, b, _, _ := newPipePair(t, pipeDefault(), nodeOpts{})
	defer func() { a.close(); b.close(); checkNoEngineGoroutines(t) }()
	connect(a, b, connOpts{})
	fr, err := a.pd.AllocFastRegMR(1)
	if err != nil {
		t.Fatal(err)
	}
	k1 := fr.Index()<<8 | 0x10
	if err := a.qp.PostSend([]transport.SendWR{
		{ID: 1, Opcode: transport.WRRegMR, Reg: transport.RegMRWR{MR: fr, Key: k1, Access: transport.AccessLocalWrite,
			IOVA: a.mem.Addr(), Length: 4096, PageSize: 4096, Pages: []uint64{a.mem.Addr()}}},
		{ID: 2, Opcode: transport.WRLocalInv, InvalidateRKey: k1 + 1},
		{ID: 3, Opcode: transport.WRSend},
	}); err != nil {
		t.Fatal(err)
	}
	wantWC(t, waitWC(t, a.scq, 5*time.Second), 2, transport.WCLocQPOpErr, transport.WCLocalInv)
	wantWC(t, waitWC(t, a.scq, 5*time.Second), 3, transport.WCWRFlushErr, transport.WCSend)
	if s := a.qp.State(); s != transport.QPSErr {
		t.Fatalf("state %v", s)
	}
	if inf := fr.Query(); inf.State != transport.MRValid || inf.Key != k1 {
		t.Fatalf("MR after a failed LOCAL_INV: %+v", inf)
	}
	// REG_MR on an MR that is not FREE fails the same way.
	if err := a.qp.Modify(&transport.QPAttr{State: transport.QPSReset}, transport.AttrState); err != nil {
		t.Fatal(err)
	}
}

// max_rd_atomic bounds the READs in flight.
func TestMaxRdAtomic(t *testing.T) {
	p := newRawPeer(t, connOpts{timeout: 20, maxRd: 2})
	sq := wire.PSN(p.dut.psn)
	var wrs []transport.SendWR
	for i := 0; i < 3; i++ {
		wrs = append(wrs, transport.SendWR{ID: uint64(i), Opcode: transport.WRRDMARead, Flags: transport.SendSignaled,
			SGL: []transport.SGE{p.dut.sge(i*64, 16)}, RemoteAddr: 0x1000, RKey: 0x99})
	}
	if err := p.dut.qp.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	p.expect(wire.RCRDMAReadRequest, sq)
	p.expect(wire.RCRDMAReadRequest, sq.Add(1))
	p.expectSilence(30 * time.Millisecond)
	p.send(wire.RCRDMAReadResponseOnly, sq, false, make([]byte, 16), func(pk wire.Packet) {
		pk.AETH().Encode(&wire.AETHFields{Syndrome: ackOK})
	})
	wantWC(t, waitWC(t, p.dut.scq, 5*time.Second), 0, transport.WCSuccess, transport.WCRDMARead)
	p.expect(wire.RCRDMAReadRequest, sq.Add(2))
}

// Go-back-N retries never execute a local operation twice. REG_MR executes as soon as the
// requester reaches it, behind unacknowledged SENDs; a retry (timeout or NAK-seq) rewinds the
// requester to the oldest unacknowledged WQE, and the done REG_MR it meets again must stay done
// (rxe req_retry skips wqe_state_done WQEs): a second execution would fail with LOC_QP_OP_ERR
// against its own key, already in force. Each signaled WR completes exactly once, with
// success, in SQ order; the SENDs are retransmitted with their original PSNs.
func TestRetryDoesNotReexecuteLocalOps(t *testing.T) {
	p := newRawPeer(t, connOpts{timeout: 16}) // ~268 ms
	n := p.dut
	sq := wire.PSN(n.psn)
	fr, err := n.pd.AllocFastRegMR(2)
	if err != nil {
		t.Fatal(err)
	}
	acc := transport.AccessLocalWrite | transport.AccessRemoteWrite | transport.AccessRemoteRead
	key := func(b uint32) uint32 { return fr.Index()<<8 | b&0xFF }
	base := n.mem.Addr()
	reg := func(id uint64, k uint32) transport.SendWR {
		return transport.SendWR{ID: id, Opcode: transport.WRRegMR, Flags: transport.SendSignaled,
			Reg: transport.RegMRWR{MR: fr, Key: k, Access: acc, IOVA: 0x5000, Length: 8192, PageSize: 4096,
				Pages: []uint64{base + 4*4096, base + 6*4096}}}
	}
	send := func(id uint64) transport.SendWR {
		return transport.SendWR{ID: id, Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: []transport.SGE{n.sge(0, 8)}}
	}
	ack := func(psn wire.PSN, syn wire.Syndrome) {
		p.send(wire.RCAcknowledge, psn, false, nil, func(pk wire.Packet) {
			pk.AETH().Encode(&wire.AETHFields{Syndrome: syn})
		})
	}
	waitKey := func(what string, st transport.MRState, k uint32) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if inf := fr.Query(); inf.State == st && (st != transport.MRValid || inf.Key == k) {
				return
			}
			time.Sleep(time.Millisecond)
		}
		t.Fatalf("%s: MR %+v, want state %v key %#x", what, fr.Query(), st, k)
	}
	wcs := []struct {
		id uint64
		op transport.WCOpcode
	}{}
	wantWCs := func(n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			w := wcs[0]
			wcs = wcs[1:]
			wantWC(t, waitWC(t, p.dut.scq, 5*time.Second), w.id, transport.WCSuccess, w.op)
		}
	}
	//   1 SEND        PSN sq
	//   2 REG_MR k1   executes at once, behind the unacknowledged SEND 1
	//   3 SEND        PSN sq+1
	//   4 LOCAL_INV k1  fenced: executes once SENDs 1 and 3 completed
	//   5 SEND        PSN sq+2
	//   6 REG_MR k2   executes at once, behind the unacknowledged SEND 5
	//   7 SEND        PSN sq+3
	if err := n.qp.PostSend([]transport.SendWR{send(1), reg(2, key(1)), send(3),
		{ID: 4, Opcode: transport.WRLocalInv, Flags: transport.SendSignaled, InvalidateRKey: key(1)},
		send(5), reg(6, key(2)), send(7)}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		id uint64
		op transport.WCOpcode
	}{{1, transport.WCSend}, {2, transport.WCRegMR}, {3, transport.WCSend}, {4, transport.WCLocalInv},
		{5, transport.WCSend}, {6, transport.WCRegMR}, {7, transport.WCSend}} {
		wcs = append(wcs, w)
	}
	p.expect(wire.RCSendOnly, sq)
	p.expect(wire.RCSendOnly, sq.Add(1))
	waitKey("REG_MR k1 behind an unacknowledged SEND", transport.MRValid, key(1))
	expectNoWC(t, n.scq, 10*time.Millisecond)

	// Round 1: no ACK. The local ACK timeout rewinds to SEND 1; both SENDs go again with their
	// PSNs, REG_MR k1 is stepped over (the QP would go to ERR otherwise).
	p.expect(wire.RCSendOnly, sq)
	p.expect(wire.RCSendOnly, sq.Add(1))
	if s := n.qp.State(); s != transport.QPSRTS {
		t.Fatalf("QP %v after the retry", s)
	}
	if inf := fr.Query(); inf.State != transport.MRValid || inf.Key != key(1) {
		t.Fatalf("MR after the retry: %+v", inf)
	}
	expectNoWC(t, n.scq, 10*time.Millisecond)
	ack(sq.Add(1), ackOK)
	wantWCs(4) // SEND 1, REG_MR k1, SEND 3, LOCAL_INV k1
	// LOCAL_INV k1 executed; SEND 5 goes out, REG_MR k2 executes behind it, then SEND 7.
	p.expect(wire.RCSendOnly, sq.Add(2))
	p.expect(wire.RCSendOnly, sq.Add(3))
	waitKey("REG_MR k2 behind an unacknowledged SEND", transport.MRValid, key(2))

	// Round 2: NAK-seq for SEND 5's PSN (its packet "lost"): go-back-N from SEND 5, REG_MR k2
	// stepped over, SEND 7 again with its PSN.
	ack(sq.Add(2), wire.NakPSNSequenceError.Syndrome())
	p.expect(wire.RCSendOnly, sq.Add(2))
	p.expect(wire.RCSendOnly, sq.Add(3))
	ack(sq.Add(3), ackOK)
	wantWCs(3) // SEND 5, REG_MR k2, SEND 7
	expectNoWC(t, n.scq, 30*time.Millisecond)
	p.expectSilence(10 * time.Millisecond)
	if s := n.qp.State(); s != transport.QPSRTS {
		t.Fatalf("QP %v", s)
	}
	if inf := fr.Query(); inf.State != transport.MRValid || inf.Key != key(2) {
		t.Fatalf("MR at the end: %+v", inf)
	}
	if s := n.dev.Stats(); s.Retransmits != 4 {
		t.Fatalf("retransmits %d, want 4", s.Retransmits)
	}
}
