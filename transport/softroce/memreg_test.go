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
