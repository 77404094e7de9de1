package softroce

import (
	"net/netip"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
)

// loopPair is two nodes on one device over an in-memory link: their packets take the loopback
// path, never the link.
func loopPair(t *testing.T) (a, b *node, lnk *link.MemLink) {
	t.Helper()
	la, _ := link.NewPipe(netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2"), link.PipeConfig{})
	a = newNode(t, la, nodeOpts{})
	b = newNodeOn(t, a.dev, nodeOpts{})
	t.Cleanup(a.close)
	// No local ACK timeout: a SEND held back by Hold must not be retransmitted meanwhile.
	connect(a, b, connOpts{mtu: transport.MTU1024, noTimeout: true})
	return a, b, la
}

// TestLoopbackHoldProgress: between Hold and Progress a SEND to a QP of the same device is
// not delivered; Progress delivers it on the caller's goroutine, with the ACK that completes
// it, so both completions are there when Progress returns. Without Hold the loopback loop
// delivers. Nothing crosses the link.
func TestLoopbackHoldProgress(t *testing.T) {
	a, b, lnk := loopPair(t)
	fill(a.bytes(0, 3000), 1)
	recv := func(id uint64) {
		if err := b.qp.PostRecv([]transport.RecvWR{{ID: id, SGL: []transport.SGE{b.sge(0, 4096)}}}); err != nil {
			t.Fatal(err)
		}
	}
	send := func(id uint64) {
		if err := a.qp.PostSend([]transport.SendWR{{ID: id, Opcode: transport.WRSend, Flags: transport.SendSignaled,
			SGL: []transport.SGE{a.sge(0, 3000)}}}); err != nil {
			t.Fatal(err)
		}
	}
	wcs := make([]transport.WC, 4)

	recv(1)
	a.dev.Hold()
	send(11)
	time.Sleep(30 * time.Millisecond)
	if n := b.rcq.Poll(wcs); n != 0 {
		t.Fatalf("delivered before Progress: %+v", wcs[:n])
	}
	a.dev.Progress()
	if n := b.rcq.Poll(wcs); n != 1 || wcs[0].ID != 1 || wcs[0].Status != transport.WCSuccess || wcs[0].ByteLen != 3000 {
		t.Fatalf("after Progress: receive completions %+v", wcs[:n])
	}
	if n := a.scq.Poll(wcs); n != 1 || wcs[0].ID != 11 || wcs[0].Status != transport.WCSuccess {
		t.Fatalf("after Progress: send completions %+v (the ACK should be processed too)", wcs[:n])
	}
	equal(t, "payload", b.bytes(0, 3000), a.bytes(0, 3000))

	// A handler on the receive CQ runs within Progress.
	ran := 0
	b.rcq.(transport.CompletionHandler).SetCompletionHandler(func() bool {
		ran += b.rcq.Poll(wcs) // on this goroutine (inside Progress): no race
		return true
	})
	recv(2)
	a.dev.Hold()
	send(12)
	a.dev.Progress()
	if ran != 1 {
		t.Fatalf("handler took %d completions inside Progress, want 1", ran)
	}
	b.rcq.(transport.CompletionHandler).SetCompletionHandler(nil)
	waitWC(t, a.scq, time.Second)

	// No Hold: the loopback loop delivers.
	recv(3)
	send(13)
	wantWC(t, waitWC(t, b.rcq, 5*time.Second), 3, transport.WCSuccess, transport.WCRecv)
	wantWC(t, waitWC(t, a.scq, 5*time.Second), 13, transport.WCSuccess, transport.WCSend)

	if s := lnk.Stats(); s.TxPackets != 0 {
		t.Errorf("link sent %d packets, want 0", s.TxPackets)
	}
	if s := a.dev.Stats(); s.LoopPackets < 6 || s.LoopDrops != 0 {
		t.Errorf("device: %d packets looped back, %d dropped; want >= 6 and 0", s.LoopPackets, s.LoopDrops)
	}
}

// TestLoopbackHandlerRounds: a completion that a post made from inside a completion handler
// adds at once (a LOCAL_INV completes when posted) runs its CQ's handler before the receive
// path finishes, instead of waking the consumer's goroutine: the Notify token stays unused.
func TestLoopbackHandlerRounds(t *testing.T) {
	a, b, _ := loopPair(t)
	mr, err := b.pd.AllocFastRegMR(4)
	if err != nil {
		t.Fatal(err)
	}
	// Both handlers run on the device's loopback path (or inside Progress), never
	// concurrently with this goroutine's reads below, which follow the completions' arrival
	// through channels.
	recvd := make(chan transport.WC, 4)
	invd := make(chan transport.WC, 4)
	rwcs, swcs := make([]transport.WC, 4), make([]transport.WC, 4)
	b.rcq.(transport.CompletionHandler).SetCompletionHandler(func() bool {
		n := b.rcq.Poll(rwcs)
		for _, wc := range rwcs[:n] {
			if wc.Opcode == transport.WCRecv {
				if err := b.qp.PostSend([]transport.SendWR{{ID: 99, Opcode: transport.WRLocalInv,
					Flags: transport.SendSignaled, InvalidateRKey: mr.RKey()}}); err != nil {
					t.Error(err)
				}
			}
			recvd <- wc
		}
		return true
	})
	b.scq.(transport.CompletionHandler).SetCompletionHandler(func() bool {
		n := b.scq.Poll(swcs)
		for _, wc := range swcs[:n] {
			invd <- wc
		}
		return true
	})
	if err := b.qp.PostRecv([]transport.RecvWR{{ID: 1, SGL: []transport.SGE{b.sge(0, 4096)}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend([]transport.SendWR{{ID: 11, Opcode: transport.WRSend, Flags: transport.SendSignaled,
		SGL: []transport.SGE{a.sge(0, 100)}}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []chan transport.WC{recvd, invd} {
		select {
		case wc := <-c:
			if wc.Status != transport.WCSuccess {
				t.Fatalf("completion %+v", wc)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no completion in 5 s")
		}
	}
	select {
	case <-b.scq.Notify():
		t.Error("the LOCAL_INV's completion woke the send CQ's consumer instead of running its handler")
	default:
	}
	wantWC(t, waitWC(t, a.scq, 5*time.Second), 11, transport.WCSuccess, transport.WCSend)
}

// TestLoopbackQueueFull: when the loopback queue is full, packets are dropped and counted, as
// on a network, and the RC retry recovers them: a 256 KiB RDMA WRITE (256 packets at MTU
// 1024) through a queue of 16 packets arrives whole.
func TestLoopbackQueueFull(t *testing.T) {
	la, _ := link.NewPipe(netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2"), link.PipeConfig{})
	dev, err := Open(Config{Link: la, Name: "small-loop"})
	if err != nil {
		t.Fatal(err)
	}
	dev.loop.mu.Lock()
	dev.loop.max = 16
	dev.loop.mu.Unlock()
	a := newNodeOn(t, dev, nodeOpts{})
	b := newNodeOn(t, dev, nodeOpts{})
	t.Cleanup(a.close)
	connect(a, b, connOpts{mtu: transport.MTU1024, timeout: 8}) // local ACK timeout ~1 ms
	const n = 256 << 10
	fill(a.bytes(0, n), 7)
	for round := 0; round < 3; round++ {
		clear(b.bytes(0, n))
		if err := a.qp.PostSend([]transport.SendWR{{ID: uint64(round), Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled,
			SGL: []transport.SGE{a.sge(0, n)}, RemoteAddr: b.mem.Addr(), RKey: b.mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
		wantWC(t, waitWC(t, a.scq, 20*time.Second), uint64(round), transport.WCSuccess, transport.WCRDMAWrite)
		equal(t, "written", b.bytes(0, n), a.bytes(0, n))
	}
	s := dev.Stats()
	if s.LoopDrops == 0 {
		t.Errorf("no packet dropped by a loopback queue of 16 (%d looped back)", s.LoopPackets)
	}
	if s.Retransmits == 0 {
		t.Errorf("dropped %d packets but retransmitted none", s.LoopDrops)
	}
	t.Logf("looped back %d, dropped %d, retransmitted %d", s.LoopPackets, s.LoopDrops, s.Retransmits)
}
