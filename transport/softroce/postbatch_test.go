package softroce

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
)

var _ transport.PostBatcher = (*Device)(nil)

// TestPostBatchHolds: inside a bracket, SENDs on two QPs of a device are held back (nothing
// reaches the link) and the last EndPosts sends them with one link send; over UDP with GSO
// towards loopback they leave as one GSO message and arrive whole, in post order.
func TestPostBatchHolds(t *testing.T) {
	la, lb := ListenUDPPair(t, loopback4, loopback4, link.UDPOptions{GSO: true, GRO: true})
	a1, b1 := newNode(t, la, nodeOpts{}), newNode(t, lb, nodeOpts{})
	// An ACK timeout of ~4.3 s: a held packet's retransmit timer (it runs from build time)
	// must not send it while the test looks, however slow the machine.
	a2, b2 := secondPair(t, a1, b1, nodeOpts{}, connOpts{timeout: 20})
	const n, size = 8, 64
	warm(t, a1, b1, n*size)
	warm(t, a2, b2, n*size)
	for i := 0; i < n; i++ {
		for _, b := range []*node{b1, b2} {
			if err := b.qp.PostRecv([]transport.RecvWR{{ID: uint64(i), SGL: []transport.SGE{b.sge(i*size, size)}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := 0; i < n; i++ {
		fill(a1.bytes(i*size, size), uint64(100+i))
		fill(a2.bytes(i*size, size), uint64(200+i))
	}
	dev := a1.dev
	before, lbefore := dev.Stats(), la.Stats()
	dev.BeginPosts()
	dev.BeginPosts() // brackets nest (two NBD connections of one device)
	for i := 0; i < n; i++ {
		a := []*node{a1, a2}[i%2]
		mustPostSend(t, a.qp, []transport.SendWR{{ID: uint64(i), Opcode: transport.WRSend, Flags: transport.SendSignaled,
			SGL: []transport.SGE{a.sge(i/2*size, size)}}})
	}
	dev.EndPosts()
	if s := dev.Stats(); s.TxPackets != before.TxPackets || s.HeldSends != before.HeldSends {
		t.Fatalf("inside a bracket: %d packets sent, %d held sends (want none)", s.TxPackets-before.TxPackets, s.HeldSends-before.HeldSends)
	}
	expectNoWC(t, b1.rcq, 20*time.Millisecond)
	dev.EndPosts()
	for _, b := range []*node{b1, b2} {
		for i := 0; i < n/2; i++ {
			wc := waitWC(t, b.rcq, 5*time.Second)
			wantWC(t, wc, uint64(i), transport.WCSuccess, transport.WCRecv)
		}
	}
	for i := 0; i < n; i++ {
		a, b := []*node{a1, a2}[i%2], []*node{b1, b2}[i%2]
		equal(t, "send", b.bytes(i/2*size, size), a.bytes(i/2*size, size))
	}
	for i := 0; i < n; i++ {
		waitWC(t, []*node{a1, a2}[i%2].scq, 5*time.Second)
	}
	s, ls := dev.Stats(), la.Stats()
	if got := s.HeldPackets - before.HeldPackets; got != n {
		t.Errorf("held packets %d, want %d", got, n)
	}
	if got := s.HeldSends - before.HeldSends; got != 1 {
		t.Errorf("held sends %d, want 1", got)
	}
	if got := ls.TxGSOMessages - lbefore.TxGSOMessages; got != 1 {
		t.Errorf("GSO messages %d, want the %d SENDs in 1", got, n)
	}
	if bs := b1.dev.Stats(); bs.OutOfSequence != 0 || bs.NAKsSent[0] != 0 {
		t.Errorf("receiver: %d out of sequence, %d PSN sequence NAKs", bs.OutOfSequence, bs.NAKsSent[0])
	}
}

// secondPair makes a second node on a1's and b1's devices each, connects both pairs, and
// closes the devices when t ends.
func secondPair(t *testing.T, a1, b1 *node, o nodeOpts, co connOpts) (a2, b2 *node) {
	a2, b2 = newNodeOn(t, a1.dev, o), newNodeOn(t, b1.dev, o)
	connect(a1, b1, co)
	connect(a2, b2, co)
	t.Cleanup(func() {
		a1.close()
		b1.close()
		checkNoEngineGoroutines(t)
	})
	return a2, b2
}

// warm sends one message from a to b (through a's memory at off, into b's): a QP that the
// transmit loop still has from its move to RTS is sent by that loop, bracket or not.
func warm(t *testing.T, a, b *node, off int) {
	t.Helper()
	if err := b.qp.PostRecv([]transport.RecvWR{{ID: 99, SGL: []transport.SGE{b.sge(off, 64)}}}); err != nil {
		t.Fatal(err)
	}
	mustPostSend(t, a.qp, []transport.SendWR{{ID: 99, Opcode: transport.WRSend, Flags: transport.SendSignaled,
		SGL: []transport.SGE{a.sge(off, 64)}}})
	wantWC(t, waitWC(t, b.rcq, 5*time.Second), 99, transport.WCSuccess, transport.WCRecv)
	wantWC(t, waitWC(t, a.scq, 5*time.Second), 99, transport.WCSuccess, transport.WCSend)
}

// TestPostBatchOrder: brackets opened and closed at random by several posters, posts in and out
// of them, and traffic the other way (the device's receive loop ACKs and sends READ responses
// meanwhile): every packet still reaches the link in the order it was built — the peer sees no
// PSN out of sequence, nothing is retransmitted — and every message arrives intact.
func TestPostBatchOrder(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run("", func(t *testing.T) { postBatchOrder(t, seed) })
	}
}

func postBatchOrder(t *testing.T, seed uint64) {
	// A queue that holds every packet in flight: a drop would look like misordering.
	o := nodeOpts{memSize: 4 << 20, sqDepth: 1024, rqDepth: 1024}
	a1, b1, lka, lkb := newPipePair(t, link.PipeConfig{QueueLen: 8192}, o)
	a2, b2 := secondPair(t, a1, b1, o, connOpts{})
	const msgs, size = 400, 256 // a message of 256 bytes: a SEND, or an RDMA WRITE of 3000 bytes
	warm(t, a1, b1, 3<<20+8192)
	warm(t, a2, b2, 3<<20+8192)
	for _, b := range []*node{b1, b2} {
		for i := 0; i < msgs; i++ {
			if err := b.qp.PostRecv([]transport.RecvWR{{ID: uint64(i), SGL: []transport.SGE{b.sge(i*size, size)}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var wg sync.WaitGroup
	// The reverse direction: b1 reads from a1's memory, so a1's device answers with READ
	// responses (from its receive loop) while its posters post.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 50; i++ {
			mustPostSend(t, b1.qp, []transport.SendWR{{ID: 1 << 32, Opcode: transport.WRRDMARead, Flags: transport.SendSignaled,
				SGL:        []transport.SGE{b1.sge(3<<20, 8192)},
				RemoteAddr: a1.mem.Addr() + 2<<20, RKey: a1.mr.RKey()}})
			waitWC(t, b1.scq, 5*time.Second)
		}
	}()
	for k, a := range []*node{a1, a2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(k)))
			open := 0
			for i := 0; i < msgs; i++ {
				op := r.IntN(4)
				if i == 0 {
					op = 0 // the first posts, which find the window open, in a bracket
				}
				switch op {
				case 0:
					a.dev.BeginPosts()
					open++
				case 1:
					if open > 0 {
						a.dev.EndPosts()
						open--
					}
				}
				buf := a.bytes(i*size, size)
				fill(buf, seed<<32|uint64(k)<<16|uint64(i))
				binary.BigEndian.PutUint32(buf, uint32(i))
				wrs := []transport.SendWR{{ID: uint64(i), Opcode: transport.WRSend, Flags: transport.SendSignaled,
					SGL: []transport.SGE{a.sge(i*size, size)}}}
				if r.IntN(3) == 0 { // a multi-packet RDMA WRITE before the SEND
					wrs = append([]transport.SendWR{{ID: 1 << 40, Opcode: transport.WRRDMAWrite,
						SGL: []transport.SGE{a.sge(1<<20, 3000)}, RemoteAddr: []*node{b1, b2}[k].mem.Addr() + 1<<20,
						RKey: []*node{b1, b2}[k].mr.RKey()}}, wrs...)
				}
				mustPostSend(t, a.qp, wrs)
			}
			for ; open > 0; open-- {
				a.dev.EndPosts()
			}
		}()
	}
	for k, b := range []*node{b1, b2} {
		a := []*node{a1, a2}[k]
		for i := 0; i < msgs; i++ {
			wc := waitWC(t, b.rcq, 5*time.Second)
			wantWC(t, wc, uint64(i), transport.WCSuccess, transport.WCRecv)
			if got := binary.BigEndian.Uint32(b.bytes(i*size, 4)); got != uint32(i) {
				t.Fatalf("qp %d: message %d carries %d", k, i, got)
			}
			equal(t, "send", b.bytes(i*size, size), a.bytes(i*size, size))
		}
	}
	wg.Wait()
	as, bs := a1.dev.Stats(), b1.dev.Stats()
	// A packet sent before one built earlier on its QP arrives out of sequence (and draws a
	// PSN sequence NAK). Retransmits alone are no sign of it: on a loaded machine the local
	// ACK timeout (16.8 ms) can fire, and go-back-N resends in order.
	if bs.OutOfSequence != 0 || bs.NAKsSent[0] != 0 {
		t.Errorf("packets out of order on the wire: receiver %d out of sequence, %d PSN NAKs (sender: %d retransmits, %d timeouts)",
			bs.OutOfSequence, bs.NAKsSent[0], as.Retransmits, as.Timeouts)
	}
	if as.HeldPackets == 0 {
		t.Errorf("no packet was held (the brackets did nothing)")
	}
	if la, lb := lka.Stats(), lkb.Stats(); la.RxQueueDrops+lb.RxQueueDrops != 0 {
		t.Errorf("the pipe dropped %d packets", la.RxQueueDrops+lb.RxQueueDrops)
	}
	t.Logf("held %d packets in %d sends of %d packets", as.HeldPackets, as.HeldSends, as.TxPackets)
}

// BenchmarkPostBatch: 64-byte SENDs over UDP loopback with GSO/GRO, benchDepth posted in a row
// and then waited for, each post a link send of its own ("single") or the row in one
// BeginPosts/EndPosts bracket ("bracket"; one GSO datagram). No allocation per SEND either way:
//
//	go test -run '^$' -bench PostBatch -benchmem ./transport/softroce/
func BenchmarkPostBatch(b *testing.B) {
	for _, bracket := range []bool{false, true} {
		b.Run(map[bool]string{false: "single", true: "bracket"}[bracket], func(b *testing.B) {
			la, lb := ListenUDPPair(b, loopback4, loopback4, link.UDPOptions{GSO: true, GRO: true})
			o := nodeOpts{sqDepth: 64, rqDepth: 64, cqDepth: 256}
			na, nb := newNode(b, la, o), newNode(b, lb, o)
			defer func() { na.close(); nb.close() }()
			connect(na, nb, connOpts{mtu: transport.MTU4096, timeout: 14})
			const size = 64
			rwr := make([]transport.RecvWR, 1)
			rsge := make([]transport.SGE, 1)
			postRecv := func(i int) {
				rsge[0] = nb.sge(i%benchDepth*size, size)
				rwr[0] = transport.RecvWR{ID: uint64(i), SGL: rsge}
				if err := nb.qp.PostRecv(rwr); err != nil {
					b.Fatal(err)
				}
			}
			for i := 0; i < 2*benchDepth; i++ {
				postRecv(i)
			}
			wrs := make([]transport.SendWR, benchDepth)
			sges := make([]transport.SGE, benchDepth)
			for i := range wrs {
				sges[i] = na.sge(i*size, size)
				wrs[i] = transport.SendWR{ID: uint64(i), Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: sges[i : i+1]}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			var wc [2 * benchDepth]transport.WC
			wait := func(cq transport.CQ, n int) {
				for got := 0; got < n; {
					got += pollSome(b, ctx, cq, wc[:])
				}
			}
			before := na.dev.Stats()
			start := startBench(b, size)
			for done := 0; done < b.N; done += benchDepth {
				if bracket {
					na.dev.BeginPosts()
				}
				for i := range wrs {
					if err := na.qp.PostSend(wrs[i : i+1]); err != nil {
						b.Fatal(err)
					}
				}
				if bracket {
					na.dev.EndPosts()
				}
				wait(na.scq, benchDepth)
				wait(nb.rcq, benchDepth)
				for i := 0; i < benchDepth; i++ {
					postRecv(done + i)
				}
			}
			el := time.Since(start)
			b.StopTimer()
			mbps(b, int64(size)*int64(b.N), el)
			s := na.dev.Stats()
			b.ReportMetric(float64(s.HeldSends-before.HeldSends)/float64(b.N), "heldsends/op")
		})
	}
}
