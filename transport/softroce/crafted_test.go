package softroce

import (
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// Crafted-packet tests in the style of gVisor's tcpip e2e tests: one real QP (the DUT) against a
// hand-driven peer on the memory link. The test builds every packet the peer sends and checks
// every packet the DUT emits, field by field.

const peerQPN = 0x4242

type rawPeer struct {
	t    *testing.T
	l    *link.MemLink
	dut  *node
	psn  wire.PSN // next PSN the peer sends as requester
	rx   chan []byte
	mtu  int
	done chan struct{}
}

func newRawPeer(t *testing.T, o connOpts) *rawPeer {
	a, b := pipeAddrs()
	la, lb := link.NewPipe(a, b, link.PipeConfig{})
	dut := newNode(t, la, nodeOpts{})
	o.fill()
	p := &rawPeer{t: t, l: lb, dut: dut, psn: 0xFFFFFE, rx: make(chan []byte, 1024), mtu: o.mtu.Bytes(), done: make(chan struct{})}
	dut.bringUp(lb.LocalAddrPort(), peerQPN, uint32(p.psn), o)
	go func() {
		defer close(p.done)
		recvLoop(lb, 8, func(pk []link.Packet) {
			for i := range pk {
				p.rx <- append([]byte(nil), pk[i].Buf...)
			}
		})
	}()
	t.Cleanup(func() {
		dut.closeNoDrain()
		lb.Close()
		<-p.done
		checkNoEngineGoroutines(t)
	})
	return p
}

// send builds one packet op with n payload bytes (filled with b) and PSN psn, lets fix set
// extended headers, and sends it to the DUT.
func (p *rawPeer) send(op wire.Opcode, psn wire.PSN, ackReq bool, payload []byte, fix func(wire.Packet)) {
	p.t.Helper()
	buf := make([]byte, link.MaxPacket)
	pk, err := wire.Layout(buf, op, len(payload))
	if err != nil {
		p.t.Fatal(err)
	}
	b := pk.BTH()
	b.SetDestQP(p.dut.qp.QPN())
	b.SetPSN(psn)
	b.SetAckReq(ackReq)
	copy(pk.Payload(), payload)
	if fix != nil {
		fix(pk)
	}
	if _, err := p.l.Send([]link.Packet{{Dst: p.dut.addr, Buf: pk.Bytes()}}); err != nil {
		p.t.Fatal(err)
	}
}

// expect returns the next packet the DUT sends, parsed, checking opcode, PSN and destination.
func (p *rawPeer) expect(op wire.Opcode, psn wire.PSN) wire.Packet {
	p.t.Helper()
	select {
	case b := <-p.rx:
		pk, err := wire.Parse(b)
		if err != nil {
			p.t.Fatalf("DUT sent an unparseable packet: %v", err)
		}
		if pk.Opcode() != op || pk.BTH().PSN() != psn || pk.BTH().DestQP() != peerQPN {
			p.t.Fatalf("DUT sent %v PSN %#x to QP %#x; want %v PSN %#x to QP %#x", pk.Opcode(), pk.BTH().PSN(),
				pk.BTH().DestQP(), op, psn, peerQPN)
		}
		return pk
	case <-time.After(5 * time.Second):
		p.t.Fatalf("no packet from the DUT; want %v PSN %#x", op, psn)
	}
	return wire.Packet{}
}

func (p *rawPeer) expectAck(syn wire.Syndrome, psn wire.PSN) {
	p.t.Helper()
	pk := p.expect(wire.RCAcknowledge, psn)
	if got := pk.AETH().Syndrome(); got != syn {
		p.t.Fatalf("AETH syndrome %v (%#x), want %v (%#x)", got, uint8(got), syn, uint8(syn))
	}
}

func (p *rawPeer) expectSilence(d time.Duration) {
	p.t.Helper()
	select {
	case b := <-p.rx:
		pk, _ := wire.Parse(b)
		p.t.Fatalf("unexpected packet from the DUT: %v PSN %#x", pk.Opcode(), pk.BTH().PSN())
	case <-time.After(d):
	}
}

func (p *rawPeer) postRecv(id uint64, n int) {
	p.t.Helper()
	if err := p.dut.qp.PostRecv([]transport.RecvWR{{ID: id, SGL: []transport.SGE{p.dut.sge(0, n)}}}); err != nil {
		p.t.Fatal(err)
	}
}

var ackOK = wire.SyndromeACKUnlimited

func TestCraftedDuplicateSendIsReACKed(t *testing.T) {
	p := newRawPeer(t, connOpts{})
	p.postRecv(1, 100)
	p.postRecv(2, 100)
	p.send(wire.RCSendOnly, p.psn, true, []byte("hello"), nil)
	p.expectAck(ackOK, p.psn)
	wantWC(t, waitWC(t, p.dut.rcq, 5*time.Second), 1, transport.WCSuccess, transport.WCRecv)
	// The same packet again (a retransmission): ACKed with the last accepted PSN, not executed,
	// even without AckReq.
	p.send(wire.RCSendOnly, p.psn, false, []byte("hello"), nil)
	p.expectAck(ackOK, p.psn)
	expectNoWC(t, p.dut.rcq, 50*time.Millisecond)
	if s := p.dut.dev.Stats(); s.Duplicates != 1 {
		t.Fatalf("duplicates %d", s.Duplicates)
	}
	// PSN wrap: the first PSN was 0xFFFFFE; the next ones are 0xFFFFFF and 0.
	p.send(wire.RCSendOnly, 0xFFFFFF, true, []byte("x"), nil)
	p.expectAck(ackOK, 0xFFFFFF)
	wantWC(t, waitWC(t, p.dut.rcq, 5*time.Second), 2, transport.WCSuccess, transport.WCRecv)
}

func TestCraftedGapOneNAKThenSilence(t *testing.T) {
	p := newRawPeer(t, connOpts{})
	for i := 0; i < 4; i++ {
		p.postRecv(uint64(i), 100)
	}
	exp := p.psn
	// PSNs exp+1 .. exp+3 arrive; exp is missing: one NAK-seq carrying exp, then silence.
	for i := uint32(1); i <= 3; i++ {
		p.send(wire.RCSendOnly, exp.Add(i), true, []byte{byte(i)}, nil)
	}
	p.expectAck(wire.NakPSNSequenceError.Syndrome(), exp)
	p.expectSilence(50 * time.Millisecond)
	p.send(wire.RCSendOnly, exp.Add(2), true, []byte{2}, nil)
	p.expectSilence(50 * time.Millisecond)
	if s := p.dut.dev.Stats(); s.OutOfSequence != 4 || s.NAKsSent[0] != 1 {
		t.Fatalf("stats %+v", s)
	}
	// Go-back-N from exp: everything is accepted in order.
	for i := uint32(0); i <= 3; i++ {
		p.send(wire.RCSendOnly, exp.Add(i), i == 3, []byte{byte(i)}, nil)
	}
	p.expectAck(ackOK, exp.Add(3))
	for i := 0; i < 4; i++ {
		wantWC(t, waitWC(t, p.dut.rcq, 5*time.Second), uint64(i), transport.WCSuccess, transport.WCRecv)
	}
	// A new gap gets a new NAK.
	p.send(wire.RCSendOnly, exp.Add(6), true, []byte{6}, nil)
	p.expectAck(wire.NakPSNSequenceError.Syndrome(), exp.Add(4))
}

func TestCraftedRNRNAK(t *testing.T) {
	p := newRawPeer(t, connOpts{minRNRTimer: 14})
	p.send(wire.RCSendOnly, p.psn, true, []byte("no receive posted"), nil)
	p.expectAck(wire.RNRNAKSyndrome(14), p.psn)
	if s := p.dut.dev.Stats(); s.RNRNAKsSent != 1 {
		t.Fatalf("stats %+v", s)
	}
	// No state change: after a receive is posted, the retry at the same PSN succeeds.
	p.postRecv(9, 100)
	p.send(wire.RCSendOnly, p.psn, true, []byte("now"), nil)
	p.expectAck(ackOK, p.psn)
	wantWC(t, waitWC(t, p.dut.rcq, 5*time.Second), 9, transport.WCSuccess, transport.WCRecv)
	if s := p.dut.qp.State(); s != transport.QPSRTS {
		t.Fatalf("state %v", s)
	}
}

func TestCraftedBadRKeyNAKAndQPError(t *testing.T) {
	p := newRawPeer(t, connOpts{})
	p.postRecv(1, 100)
	mr := p.dut.mr
	canary := p.dut.bytes(0, 16)
	copy(canary, "canary-canary-ca")
	bad := mr.RKey() ^ 0x01 // right index, wrong key byte
	p.send(wire.RCRDMAWriteOnly, p.psn, true, []byte("overwrite!"), func(pk wire.Packet) {
		pk.RETH().Encode(&wire.RETHFields{VA: p.dut.mem.Addr(), RKey: bad, DMALen: 10})
	})
	p.expectAck(wire.NakRemoteAccessError.Syndrome(), p.psn)
	equal(t, "memory behind a bad rkey", canary, []byte("canary-canary-ca"))
	if s := p.dut.qp.State(); s != transport.QPSErr {
		t.Fatalf("state %v, want ERR", s)
	}
	wantWC(t, waitWC(t, p.dut.rcq, 5*time.Second), 1, transport.WCWRFlushErr, transport.WCRecv)
	// An ERR QP drops everything silently.
	p.send(wire.RCSendOnly, p.psn.Inc(), true, []byte("x"), nil)
	p.expectSilence(50 * time.Millisecond)
}

func TestCraftedOutOfBoundsAndNoAccessNAK(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   wire.Opcode
		va   func(p *rawPeer) uint64
		n    uint32
	}{
		{"write past end", wire.RCRDMAWriteOnly, func(p *rawPeer) uint64 { return p.dut.mem.Addr() + uint64(p.dut.mem.Len()) - 4 }, 8},
		{"write before start", wire.RCRDMAWriteOnly, func(p *rawPeer) uint64 { return p.dut.mem.Addr() - 4 }, 8},
		{"read wrapping va+len", wire.RCRDMAReadRequest, func(p *rawPeer) uint64 { return ^uint64(0) - 2 }, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newRawPeer(t, connOpts{})
			var pl []byte
			if tc.op != wire.RCRDMAReadRequest {
				pl = make([]byte, tc.n)
			}
			p.send(tc.op, p.psn, true, pl, func(pk wire.Packet) {
				pk.RETH().Encode(&wire.RETHFields{VA: tc.va(p), RKey: p.dut.mr.RKey(), DMALen: tc.n})
			})
			p.expectAck(wire.NakRemoteAccessError.Syndrome(), p.psn)
		})
	}
}

func TestCraftedReadDuplicateReplays(t *testing.T) {
	p := newRawPeer(t, connOpts{mtu: transport.MTU256})
	mem := p.dut.bytes(0, 1024)
	fill(mem, 5)
	va := p.dut.mem.Addr()
	read := func(psn wire.PSN, off, n uint32) {
		p.send(wire.RCRDMAReadRequest, psn, true, nil, func(pk wire.Packet) {
			pk.RETH().Encode(&wire.RETHFields{VA: va + uint64(off), RKey: p.dut.mr.RKey(), DMALen: n})
		})
	}
	check := func(pk wire.Packet, off, n int) {
		t.Helper()
		equal(t, "read response payload", pk.Payload(), mem[off:off+n])
		if a := pk.AETH(); a != nil && a.Syndrome() != ackOK {
			t.Fatalf("AETH %v", a.Syndrome())
		}
	}
	psn := p.psn
	read(psn, 0, 700) // 3 responses: 256, 256, 188
	check(p.expect(wire.RCRDMAReadResponseFirst, psn), 0, 256)
	check(p.expect(wire.RCRDMAReadResponseMiddle, psn.Add(1)), 256, 256)
	check(p.expect(wire.RCRDMAReadResponseLast, psn.Add(2)), 512, 188)
	// The same request again: replayed from the saved resource.
	read(psn, 0, 700)
	check(p.expect(wire.RCRDMAReadResponseFirst, psn), 0, 256)
	check(p.expect(wire.RCRDMAReadResponseMiddle, psn.Add(1)), 256, 256)
	check(p.expect(wire.RCRDMAReadResponseLast, psn.Add(2)), 512, 188)
	// A retry for the rest, from the middle (as a requester does after partial loss).
	read(psn.Add(1), 256, 444)
	check(p.expect(wire.RCRDMAReadResponseMiddle, psn.Add(1)), 256, 256)
	check(p.expect(wire.RCRDMAReadResponseLast, psn.Add(2)), 512, 188)
	// A duplicate asking for more than the original, or with another key, is dropped.
	read(psn, 0, 701)
	p.expectSilence(50 * time.Millisecond)
	// The next new request continues at psn+3.
	read(psn.Add(3), 10, 5)
	check(p.expect(wire.RCRDMAReadResponseOnly, psn.Add(3)), 10, 5)
	if s := p.dut.dev.Stats(); s.ReadReplays != 2 {
		t.Fatalf("replays %d", s.ReadReplays)
	}
}

// The DUT as requester: posted SENDs go out with consecutive PSNs and AckReq on each (single
// packet) message; one ACK for the last PSN completes all of them, in order.
func TestCraftedCoalescedACK(t *testing.T) {
	p := newRawPeer(t, connOpts{timeout: 20})
	sq := p.dut.psn
	var wrs []transport.SendWR
	for i := 0; i < 4; i++ {
		wrs = append(wrs, transport.SendWR{ID: uint64(10 + i), Opcode: transport.WRSend, Flags: transport.SendSignaled,
			SGL: []transport.SGE{p.dut.sge(i*8, 8)}})
	}
	if err := p.dut.qp.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	for i := uint32(0); i < 4; i++ {
		pk := p.expect(wire.RCSendOnly, wire.PSN(sq).Add(i))
		if !pk.BTH().AckReq() {
			t.Fatalf("SEND_ONLY without AckReq")
		}
	}
	expectNoWC(t, p.dut.scq, 20*time.Millisecond)
	p.send(wire.RCAcknowledge, wire.PSN(sq).Add(3), false, nil, func(pk wire.Packet) {
		pk.AETH().Encode(&wire.AETHFields{Syndrome: ackOK, MSN: 4})
	})
	for i := 0; i < 4; i++ {
		wantWC(t, waitWC(t, p.dut.scq, 5*time.Second), uint64(10+i), transport.WCSuccess, transport.WCSend)
	}
}

// NAK-seq makes the DUT complete what precedes the NAKed PSN and go back to it.
func TestCraftedNAKSeqGoBackN(t *testing.T) {
	p := newRawPeer(t, connOpts{timeout: 20})
	sq := wire.PSN(p.dut.psn)
	var wrs []transport.SendWR
	for i := 0; i < 5; i++ {
		wrs = append(wrs, transport.SendWR{ID: uint64(i), Opcode: transport.WRSend, Flags: transport.SendSignaled,
			SGL: []transport.SGE{p.dut.sge(i*8, 8)}})
	}
	if err := p.dut.qp.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	for i := uint32(0); i < 5; i++ {
		p.expect(wire.RCSendOnly, sq.Add(i))
	}
	p.send(wire.RCAcknowledge, sq.Add(2), false, nil, func(pk wire.Packet) {
		pk.AETH().Encode(&wire.AETHFields{Syndrome: wire.NakPSNSequenceError.Syndrome(), MSN: 2})
	})
	wantWC(t, waitWC(t, p.dut.scq, 5*time.Second), 0, transport.WCSuccess, transport.WCSend)
	wantWC(t, waitWC(t, p.dut.scq, 5*time.Second), 1, transport.WCSuccess, transport.WCSend)
	for i := uint32(2); i < 5; i++ {
		p.expect(wire.RCSendOnly, sq.Add(i))
	}
	p.expectSilence(30 * time.Millisecond)
	p.send(wire.RCAcknowledge, sq.Add(4), false, nil, func(pk wire.Packet) {
		pk.AETH().Encode(&wire.AETHFields{Syndrome: ackOK, MSN: 5})
	})
	for i := 2; i < 5; i++ {
		wantWC(t, waitWC(t, p.dut.scq, 5*time.Second), uint64(i), transport.WCSuccess, transport.WCSend)
	}
	if s := p.dut.dev.Stats(); s.Retransmits != 3 || s.NAKsRcvd[0] != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// A long WRITE: exact MTU segmentation, RETH only on FIRST, AckReq on LAST and after 64+1
// packets without one (rxe RXE_MAX_PKT_PER_ACK), window of 128 unacknowledged PSNs.
func TestCraftedSegmentationAckReqWindow(t *testing.T) {
	p := newRawPeer(t, connOpts{mtu: transport.MTU256, timeout: 20})
	sq := wire.PSN(p.dut.psn)
	n := 200*256 + 100
	if err := p.dut.qp.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled,
		SGL: []transport.SGE{p.dut.sge(0, n)}, RemoteAddr: 0x1000, RKey: 0x1234}}); err != nil {
		t.Fatal(err)
	}
	var acked []uint32
	for i := uint32(0); i <= maxUnackedPSNs; i++ {
		op := wire.RCRDMAWriteMiddle
		if i == 0 {
			op = wire.RCRDMAWriteFirst
		}
		pk := p.expect(op, sq.Add(i))
		if pk.PayloadLen() != 256 {
			t.Fatalf("packet %d carries %d bytes", i, pk.PayloadLen())
		}
		if (pk.RETH() != nil) != (i == 0) {
			t.Fatalf("RETH on packet %d", i)
		}
		if pk.BTH().AckReq() {
			acked = append(acked, i)
		}
	}
	if len(acked) != 1 || acked[0] != maxPktPerAck+1 {
		t.Fatalf("AckReq on packets %v, want [%d]", acked, maxPktPerAck+1)
	}
	// 129 PSNs out, none acknowledged: the window is full.
	p.expectSilence(30 * time.Millisecond)
	ack := func(psn wire.PSN) {
		p.send(wire.RCAcknowledge, psn, false, nil, func(pk wire.Packet) {
			pk.AETH().Encode(&wire.AETHFields{Syndrome: ackOK})
		})
	}
	expectRange := func(from, to uint32) {
		for i := from; i <= to; i++ {
			op := wire.RCRDMAWriteMiddle
			if i == 200 {
				op = wire.RCRDMAWriteLast
			}
			pk := p.expect(op, sq.Add(i))
			if i == 200 && (pk.PayloadLen() != 100 || !pk.BTH().AckReq()) {
				t.Fatalf("LAST: %d bytes, AckReq %v", pk.PayloadLen(), pk.BTH().AckReq())
			}
		}
	}
	// ACK of PSN 65 opens the window up to 65+1+128.
	ack(sq.Add(maxPktPerAck + 1))
	expectRange(maxUnackedPSNs+1, maxPktPerAck+2+maxUnackedPSNs)
	p.expectSilence(30 * time.Millisecond)
	ack(sq.Add(150))
	expectRange(maxPktPerAck+3+maxUnackedPSNs, 200)
	p.send(wire.RCAcknowledge, sq.Add(200), false, nil, func(pk wire.Packet) {
		pk.AETH().Encode(&wire.AETHFields{Syndrome: ackOK})
	})
	wantWC(t, waitWC(t, p.dut.scq, 5*time.Second), 1, transport.WCSuccess, transport.WCRDMAWrite)
}

// Without AckReq the responder stays silent; coalescing never acknowledges past the last
// AckReq PSN.
func TestCraftedAckOnlyWhenRequested(t *testing.T) {
	p := newRawPeer(t, connOpts{})
	va := p.dut.mem.Addr()
	w := func(psn wire.PSN, ack bool) {
		p.send(wire.RCRDMAWriteOnly, psn, ack, []byte("abcd"), func(pk wire.Packet) {
			pk.RETH().Encode(&wire.RETHFields{VA: va, RKey: p.dut.mr.RKey(), DMALen: 4})
		})
	}
	w(p.psn, false)
	p.expectSilence(30 * time.Millisecond)
	w(p.psn.Add(1), true)
	w(p.psn.Add(2), false)
	p.expectAck(ackOK, p.psn.Add(1))
	p.expectSilence(30 * time.Millisecond)
}

func TestCraftedCNPCounted(t *testing.T) {
	p := newRawPeer(t, connOpts{})
	p.send(wire.CNP, 0, false, make([]byte, 16), nil)
	deadline := time.Now().Add(5 * time.Second)
	for p.dut.dev.Stats().CNPs != 1 {
		if time.Now().After(deadline) {
			t.Fatal("CNP not counted")
		}
		time.Sleep(time.Millisecond)
	}
	p.expectSilence(20 * time.Millisecond)
}

// RNR NAK received by the DUT as requester: it waits the RNR time and retries the same PSN;
// rnr_retry exhaustion completes the WR with RNR_RETRY_EXC_ERR.
func TestCraftedRNRRetryExhaustion(t *testing.T) {
	p := newRawPeer(t, connOpts{timeout: 20, rnrRetry: 2})
	sq := wire.PSN(p.dut.psn)
	if err := p.dut.qp.PostSend([]transport.SendWR{{ID: 3, Opcode: transport.WRSend, SGL: []transport.SGE{p.dut.sge(0, 4)}}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		p.expect(wire.RCSendOnly, sq)
		p.send(wire.RCAcknowledge, sq, false, nil, func(pk wire.Packet) {
			pk.AETH().Encode(&wire.AETHFields{Syndrome: wire.RNRNAKSyndrome(1)})
		})
	}
	wc := waitWC(t, p.dut.scq, 5*time.Second)
	wantWC(t, wc, 3, transport.WCRNRRetryExcErr, transport.WCSend)
	if s := p.dut.qp.State(); s != transport.QPSErr {
		t.Fatalf("state %v", s)
	}
}

// Local ACK timeout: with nothing coming back the DUT retransmits retry_cnt times, then fails
// with RETRY_EXC_ERR.
func TestCraftedRetryExhaustion(t *testing.T) {
	p := newRawPeer(t, connOpts{timeout: 8, retry: 2}) // ~1 ms
	sq := wire.PSN(p.dut.psn)
	if err := p.dut.qp.PostSend([]transport.SendWR{{ID: 4, Opcode: transport.WRSend, SGL: []transport.SGE{p.dut.sge(0, 4)}}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		p.expect(wire.RCSendOnly, sq)
	}
	wantWC(t, waitWC(t, p.dut.scq, 5*time.Second), 4, transport.WCRetryExcErr, transport.WCSend)
}

// TestCraftedNAKProgressResetsRetry: a PSN sequence NAK that acknowledges new PSNs is progress:
// it restores the retry budget and starts the go-back-N for its gap at once. With retry_cnt 1,
// two such NAKs in a row used to end the WRITE in RETRY_EXC_ERR (rxe's rule: reset on ACK only).
func TestCraftedNAKProgressResetsRetry(t *testing.T) {
	p := newRawPeer(t, connOpts{timeout: 20, retry: 1, mtu: transport.MTU256}) // timeout ~4.3 s
	sq := wire.PSN(p.dut.psn)
	if err := p.dut.qp.PostSend([]transport.SendWR{{ID: 9, Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled,
		SGL: []transport.SGE{p.dut.sge(0, 8*256)}, RemoteAddr: 0x10000, RKey: 0x1234}}); err != nil {
		t.Fatal(err)
	}
	writeOps := func(from uint32) {
		t.Helper()
		for i := from; i < 8; i++ {
			op := wire.RCRDMAWriteMiddle
			switch i {
			case 0:
				op = wire.RCRDMAWriteFirst
			case 7:
				op = wire.RCRDMAWriteLast
			}
			p.expect(op, sq.Add(i))
		}
	}
	nak := func(at uint32) {
		p.send(wire.RCAcknowledge, sq.Add(at), false, nil, func(pk wire.Packet) {
			pk.AETH().Encode(&wire.AETHFields{Syndrome: wire.NakPSNSequenceError.Syndrome(), MSN: 0})
		})
	}
	writeOps(0)
	nak(2) // PSNs 0-1 arrived: go back to 2
	// The retransmission restarts in the middle of the message: rxe resends it as MIDDLE/LAST
	// packets with the PSNs of the first transmission.
	writeOps(2)
	nak(5) // the retransmission got 2-4 through, then lost 5: progress again
	writeOps(5)
	p.send(wire.RCAcknowledge, sq.Add(7), false, nil, func(pk wire.Packet) {
		pk.AETH().Encode(&wire.AETHFields{Syndrome: ackOK, MSN: 1})
	})
	wantWC(t, waitWC(t, p.dut.scq, 5*time.Second), 9, transport.WCSuccess, transport.WCRDMAWrite)
	if s := p.dut.dev.Stats(); s.Retransmits != 6+3 || s.RetryExceeded != 0 || s.Timeouts != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// SQD: WRs posted while draining are queued, not started; back in RTS they go out.
func TestCraftedSQD(t *testing.T) {
	p := newRawPeer(t, connOpts{timeout: 20})
	sq := wire.PSN(p.dut.psn)
	if err := p.dut.qp.Modify(&transport.QPAttr{State: transport.QPSSQD}, transport.AttrState); err != nil {
		t.Fatal(err)
	}
	if err := p.dut.qp.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.WRSend, Flags: transport.SendSignaled,
		SGL: []transport.SGE{p.dut.sge(0, 4)}}}); err != nil {
		t.Fatal(err)
	}
	p.expectSilence(30 * time.Millisecond)
	if err := p.dut.qp.Modify(&transport.QPAttr{State: transport.QPSRTS}, transport.AttrState); err != nil {
		t.Fatal(err)
	}
	p.expect(wire.RCSendOnly, sq)
}

// Local ACK timeout 0 disables retransmission: a lost packet is never sent again.
func TestCraftedTimeoutZeroNoRetransmit(t *testing.T) {
	p := newRawPeer(t, connOpts{noTimeout: true})
	sq := wire.PSN(p.dut.psn)
	if err := p.dut.qp.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.WRSend, SGL: []transport.SGE{p.dut.sge(0, 4)}}}); err != nil {
		t.Fatal(err)
	}
	p.expect(wire.RCSendOnly, sq)
	p.expectSilence(100 * time.Millisecond)
	if s := p.dut.dev.Stats(); s.Timeouts != 0 || s.Retransmits != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// A late ACK of the first transmission arriving while go-back-N is retransmitting the WQE
// completes it, and retransmission continues with the PSNs already assigned (a WQE never gets
// new PSNs). Whether the ACK lands mid-retransmission here depends on timing; the conformance
// runs over UDP and the lossy pipe are what hit that window (it once re-sent a WRITE under new
// PSNs, overlapping the READ behind it).
func TestCraftedLateACKDuringRetransmission(t *testing.T) {
	p := newRawPeer(t, connOpts{timeout: 14, mtu: transport.MTU256}) // ~67 ms
	sq := wire.PSN(p.dut.psn)
	if err := p.dut.qp.PostSend([]transport.SendWR{
		{ID: 1, Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled, SGL: []transport.SGE{p.dut.sge(0, 512)}, RemoteAddr: 0x1000, RKey: 5},
		{ID: 2, Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: []transport.SGE{p.dut.sge(0, 8)}},
	}); err != nil {
		t.Fatal(err)
	}
	p.expect(wire.RCRDMAWriteFirst, sq)
	p.expect(wire.RCRDMAWriteLast, sq.Add(1))
	p.expect(wire.RCSendOnly, sq.Add(2))
	// Timeout: the retransmission starts at the WRITE.
	p.expect(wire.RCRDMAWriteFirst, sq)
	p.send(wire.RCAcknowledge, sq.Add(1), false, nil, func(pk wire.Packet) {
		pk.AETH().Encode(&wire.AETHFields{Syndrome: ackOK})
	})
	wantWC(t, waitWC(t, p.dut.scq, 5*time.Second), 1, transport.WCSuccess, transport.WCRDMAWrite)
	deadline := time.After(40 * time.Millisecond)
	for done := false; !done; {
		select {
		case b := <-p.rx:
			pk, _ := wire.Parse(b)
			if psn := pk.BTH().PSN(); psn.Sub(sq) < 0 || psn.Sub(sq) > 2 || (pk.Opcode() == wire.RCRDMAWriteFirst && psn != sq) {
				t.Fatalf("DUT sent %v with PSN %+d", pk.Opcode(), psn.Sub(sq))
			}
		case <-deadline:
			done = true
		}
	}
	p.send(wire.RCAcknowledge, sq.Add(2), false, nil, func(pk wire.Packet) {
		pk.AETH().Encode(&wire.AETHFields{Syndrome: ackOK})
	})
	wantWC(t, waitWC(t, p.dut.scq, 5*time.Second), 2, transport.WCSuccess, transport.WCSend)
}

// Class C errors of the responder: NAK invalid request with the offending PSN, the receive in
// use completes in error, the QP goes to ERR.
func TestCraftedInvalidRequestNAK(t *testing.T) {
	mtu := 256
	reth := func(pk wire.Packet, n uint32, p *rawPeer) {
		pk.RETH().Encode(&wire.RETHFields{VA: p.dut.mem.Addr(), RKey: p.dut.mr.RKey(), DMALen: n})
	}
	for _, tc := range []struct {
		name string
		o    connOpts
		seq  func(p *rawPeer) wire.PSN // sends the packets; returns the PSN the NAK must carry
	}{
		{"MIDDLE without FIRST", connOpts{}, func(p *rawPeer) wire.PSN {
			p.send(wire.RCSendMiddle, p.psn, true, make([]byte, 1024), nil)
			return p.psn
		}},
		{"FIRST then ONLY", connOpts{mtu: transport.MTU256}, func(p *rawPeer) wire.PSN {
			p.send(wire.RCSendFirst, p.psn, false, make([]byte, mtu), nil)
			p.send(wire.RCSendOnly, p.psn.Inc(), true, []byte{1}, nil)
			return p.psn.Inc()
		}},
		{"FIRST shorter than the MTU", connOpts{mtu: transport.MTU256}, func(p *rawPeer) wire.PSN {
			p.send(wire.RCSendFirst, p.psn, true, make([]byte, 128), nil)
			return p.psn
		}},
		{"ONLY longer than the MTU", connOpts{mtu: transport.MTU256}, func(p *rawPeer) wire.PSN {
			p.send(wire.RCSendOnly, p.psn, true, make([]byte, 260), nil)
			return p.psn
		}},
		{"SEND longer than the receive buffer", connOpts{}, func(p *rawPeer) wire.PSN {
			p.send(wire.RCSendOnly, p.psn, true, make([]byte, 400), nil)
			return p.psn
		}},
		{"WRITE longer than its RETH length", connOpts{}, func(p *rawPeer) wire.PSN {
			p.send(wire.RCRDMAWriteOnly, p.psn, true, make([]byte, 8), func(pk wire.Packet) { reth(pk, 4, p) })
			return p.psn
		}},
		{"WRITE without REMOTE_WRITE on the QP", connOpts{access: transport.AccessRemoteRead}, func(p *rawPeer) wire.PSN {
			p.send(wire.RCRDMAWriteOnly, p.psn, true, make([]byte, 4), func(pk wire.Packet) { reth(pk, 4, p) })
			return p.psn
		}},
		{"READ without REMOTE_READ on the QP", connOpts{access: transport.AccessRemoteWrite}, func(p *rawPeer) wire.PSN {
			p.send(wire.RCRDMAReadRequest, p.psn, true, nil, func(pk wire.Packet) { reth(pk, 4, p) })
			return p.psn
		}},
		{"atomic (not supported)", connOpts{}, func(p *rawPeer) wire.PSN {
			p.send(wire.RCFetchAdd, p.psn, true, nil, nil)
			return p.psn
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newRawPeer(t, tc.o)
			p.postRecv(1, 300)
			psn := tc.seq(p)
			p.expectAck(wire.NakInvalidRequest.Syndrome(), psn)
			if s := p.dut.qp.State(); s != transport.QPSErr {
				t.Fatalf("state %v", s)
			}
			wc := waitWC(t, p.dut.rcq, 5*time.Second)
			if wc.ID != 1 || wc.Status == transport.WCSuccess {
				t.Fatalf("receive completion %+v", wc)
			}
		})
	}
}
