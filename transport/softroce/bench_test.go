package softroce

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// Throughput over loopback UDP, RoCE RDMA WRITE / READ beside a raw UDP blast of the same bytes
// in datagrams of the same size (4096 payload + 32 bytes of BTH/RETH-sized header), so that the
// ratio is meaningful on whatever machine runs it:
//
//	go test -run '^$' -bench Loopback -benchmem ./transport/softroce/

var benchSizes = []int{64 << 10, 1 << 20}

const benchDepth = 8 // messages in flight

func BenchmarkLoopback(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("RawUDP/"+fmtSize(size), func(b *testing.B) { benchRawUDP(b, size) })
		b.Run("RawLink/"+fmtSize(size), func(b *testing.B) { benchRawLink(b, size) })
		b.Run("Write/"+fmtSize(size), func(b *testing.B) { benchRDMA(b, size, transport.WRRDMAWrite, link.UDPOptions{}) })
		b.Run("Read/"+fmtSize(size), func(b *testing.B) { benchRDMA(b, size, transport.WRRDMARead, link.UDPOptions{}) })
		off := link.UDPOptions{GSO: true, GRO: true}
		b.Run("WriteGSO/"+fmtSize(size), func(b *testing.B) { benchRDMA(b, size, transport.WRRDMAWrite, off) })
		b.Run("ReadGSO/"+fmtSize(size), func(b *testing.B) { benchRDMA(b, size, transport.WRRDMARead, off) })
		// Between srpd peers (no ICRC, as the CM negotiates it): the WRITE's payload goes by
		// reference (linkref.go), or is copied into packet buffers as before (Copy).
		b.Run("WriteNoICRC/"+fmtSize(size), func(b *testing.B) { benchRDMANoICRC(b, size, transport.WRRDMAWrite, false) })
		b.Run("WriteNoICRCCopy/"+fmtSize(size), func(b *testing.B) { benchRDMANoICRC(b, size, transport.WRRDMAWrite, true) })
	}
	// Two QPs of one device: the packets take the device's loopback path (loop.go), not the
	// link; 128 KiB is the I/O size of the SRP benchmarks.
	for _, size := range []int{128 << 10} {
		b.Run("LoopWrite/"+fmtSize(size), func(b *testing.B) { benchLoop(b, size, transport.WRRDMAWrite) })
		b.Run("LoopRead/"+fmtSize(size), func(b *testing.B) { benchLoop(b, size, transport.WRRDMARead) })
	}
}

// pollSome polls cq into wc once; when it is empty it waits for a notification and returns 0.
// Any completion that is not a success stops t.
func pollSome(t tb, ctx context.Context, cq transport.CQ, wc []transport.WC) int {
	n := cq.Poll(wc)
	if n == 0 {
		if err := cq.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		return 0
	}
	for _, c := range wc[:n] {
		if c.Status != transport.WCSuccess {
			t.Fatalf("completion %+v", c)
		}
	}
	return n
}

func mbps(b *testing.B, bytes int64, d time.Duration) {
	b.ReportMetric(float64(bytes)/d.Seconds()/1e6, "MB/s")
}

// startBench starts the timed part of a benchmark that moves size bytes an op and returns when
// it started.
func startBench(b *testing.B, size int) time.Time {
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	return time.Now()
}

// reportDelivered ends a one-way blast started at start: it gives the receiver up to 50 ms to
// count the want bytes still queued (got), stops the timer and reports the throughput received
// and the fraction lost.
func reportDelivered(b *testing.B, got *atomic.Int64, want int64, start time.Time) {
	for t := time.Now(); got.Load() < want && time.Since(t) < 50*time.Millisecond; {
		time.Sleep(100 * time.Microsecond)
	}
	el := time.Since(start)
	b.StopTimer()
	mbps(b, got.Load(), el)
	b.ReportMetric(1-float64(got.Load())/float64(want), "loss")
}

func benchRDMA(b *testing.B, size int, op transport.WROpcode, lo link.UDPOptions) {
	la, lb := ListenUDPPair(b, loopback4, loopback4, lo)
	o := nodeOpts{memSize: 2 * benchDepth * size, sqDepth: 64, cqDepth: 256}
	na, nb := newNode(b, la, o), newNode(b, lb, o)
	defer func() { na.close(); nb.close() }()
	benchRun(b, na, nb, size, op, nil)
}

// benchRDMANoICRC is benchRDMA with GSO and GRO, the ICRC waived both ways and payloads by
// reference on or off (copy).
func benchRDMANoICRC(b *testing.B, size int, op transport.WROpcode, copied bool) {
	la, lb := ListenUDPPair(b, loopback4, loopback4, link.UDPOptions{GSO: true, GRO: true})
	o := nodeOpts{memSize: 2 * benchDepth * size, sqDepth: 64, cqDepth: 256}
	na, nb := newNode(b, la, o), newNode(b, lb, o)
	defer func() { na.close(); nb.close() }()
	benchRun(b, na, nb, size, op, func() {
		for _, n := range []*node{na, nb} {
			n.dev.mu.Lock()
			n.qp.(*qp).setNoICRC(true)
			n.dev.copyPayloads = copied
			n.dev.mu.Unlock()
		}
	})
	if s := na.dev.Stats(); (s.TxRefPackets == 0) != copied || s.ICRCWaived+nb.dev.Stats().ICRCWaived == 0 {
		b.Fatalf("payloads by reference %d (copied %v), ICRC waived %d + %d", s.TxRefPackets, copied, s.ICRCWaived, nb.dev.Stats().ICRCWaived)
	}
}

// benchLoop is benchRDMA between two QPs of one device (over an in-memory link that carries
// nothing): the loopback path.
func benchLoop(b *testing.B, size int, op transport.WROpcode) {
	la, _ := link.NewPipe(netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2"), link.PipeConfig{})
	o := nodeOpts{memSize: 2 * benchDepth * size, sqDepth: 64, cqDepth: 256}
	na := newNode(b, la, o)
	nb := newNodeOn(b, na.dev, o)
	defer na.close()
	benchRun(b, na, nb, size, op, nil)
	if s := na.dev.Stats(); s.TxPackets != 0 {
		b.Fatalf("%d packets went through the link", s.TxPackets)
	}
}

// benchRun posts size-byte op WRs from na to nb, benchDepth in flight; setup runs after the QPs
// are connected.
func benchRun(b *testing.B, na, nb *node, size int, op transport.WROpcode, setup func()) {
	connect(na, nb, connOpts{mtu: transport.MTU4096, timeout: 14})
	if setup != nil {
		setup()
	}
	wrs := make([]transport.SendWR, benchDepth)
	sges := make([]transport.SGE, benchDepth)
	for i := range wrs {
		sges[i] = na.sge(i*size, size)
		wrs[i] = transport.SendWR{ID: uint64(i), Opcode: op, Flags: transport.SendSignaled, SGL: sges[i : i+1],
			RemoteAddr: nb.mem.Addr() + uint64(i*size), RKey: nb.mr.RKey()}
	}
	var wc [benchDepth]transport.WC
	post := func(i int) {
		if err := na.qp.PostSend(wrs[i%benchDepth : i%benchDepth+1]); err != nil {
			b.Fatal(err)
		}
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer wcancel()
	start := startBench(b, size)
	inflight := 0
	posted := 0
	for done := 0; done < b.N; {
		for inflight < benchDepth && posted < b.N {
			post(posted)
			posted++
			inflight++
		}
		n := pollSome(b, wctx, na.scq, wc[:])
		done += n
		inflight -= n
	}
	el := time.Since(start)
	b.StopTimer()
	mbps(b, int64(size)*int64(b.N), el)
	s := na.dev.Stats()
	b.ReportMetric(float64(s.Retransmits)/float64(b.N), "retx/op")
}

// benchRawUDP sends size bytes per op as 4128-byte datagrams from one UDP socket to another
// on 127.0.0.1 (one datagram per syscall, like the anchors in the reference notes) with a
// receiver goroutine counting bytes; MB/s is what arrived.
func benchRawUDP(b *testing.B, size int) {
	rc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Skip(err)
	}
	defer rc.Close()
	_ = rc.SetReadBuffer(4 << 20)
	sc, err := net.DialUDP("udp4", nil, rc.LocalAddr().(*net.UDPAddr))
	if err != nil {
		b.Skip(err)
	}
	defer sc.Close()
	_ = sc.SetWriteBuffer(4 << 20)
	const dgram = 4096 + 32
	var got atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 65536)
		for {
			n, err := rc.Read(buf)
			if err != nil {
				return
			}
			got.Add(int64(n) * 4096 / dgram)
		}
	}()
	pkt := make([]byte, dgram)
	per := (size + 4095) / 4096
	start := startBench(b, size)
	for i := 0; i < b.N; i++ {
		for k := 0; k < per; k++ {
			if _, err := sc.Write(pkt); err != nil {
				b.Fatal(err)
			}
		}
	}
	// Let the receiver drain what is still queued.
	reportDelivered(b, &got, int64(b.N)*int64(per)*4096, start)
	rc.Close()
	wg.Wait()
}

// benchRawLink blasts the same bytes through the batched UDP link itself (sendmmsg/recvmmsg,
// ICRC computed and verified), as RDMA WRITE MIDDLE packets of 4096 bytes, with no RC engine:
// the ceiling the engine runs under.
func benchRawLink(b *testing.B, size int) {
	la, lb := ListenUDPPair(b, loopback4, loopback4, link.UDPOptions{})
	defer la.Close()
	var got atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		recvLoop(lb, lb.BatchSize(), func(rx []link.Packet) {
			var k int64
			for i := range rx {
				if p, err := wire.Parse(rx[i].Buf); err == nil {
					k += int64(p.PayloadLen())
				}
			}
			got.Add(k)
		})
	}()
	batch := la.BatchSize()
	tx := make([]link.Packet, batch)
	for i := range tx {
		buf := make([]byte, link.MaxPacket)
		p, err := wire.Layout(buf, wire.RCRDMAWriteMiddle, 4096)
		if err != nil {
			b.Fatal(err)
		}
		p.BTH().SetDestQP(0x11)
		tx[i] = link.Packet{Dst: lb.LocalAddrPort(), Buf: p.Bytes()}
	}
	per := (size + 4095) / 4096
	start := startBench(b, size)
	for i := 0; i < b.N; i++ {
		for left := per; left > 0; {
			n := min(left, batch)
			sent, err := la.Send(tx[:n])
			if err != nil && !errors.Is(err, net.ErrClosed) {
				b.Fatal(err)
			}
			left -= sent
		}
	}
	reportDelivered(b, &got, int64(b.N)*int64(per)*4096, start)
	lb.Close()
	wg.Wait()
}
