package softroce

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
)

// Small-message latency at queue depth 1 over loopback UDP, beside a raw UDP ping-pong of
// 64-byte datagrams between two goroutines measured in the same run (what any RDMA round trip
// here is bounded by):
//
//	go test -run '^$' -bench Latency ./transport/softroce/
//
// RawUDP: one datagram each way. Send64: a 64-byte SEND, answered by a 64-byte SEND from a
// goroutine on the peer that waits on its receive CQ (as a ULP does); ACKs go as the engine
// sends them. Read4K: a signaled 4 KiB RDMA READ, waited for on the send CQ. µs/op is one
// round trip.
func BenchmarkLatency(b *testing.B) {
	b.Run("RawUDP", benchLatRawUDP)
	lo := link.UDPOptions{GSO: true, GRO: true} // as srpd uses them
	b.Run("Send64", func(b *testing.B) { benchLatSend(b, 64, lo) })
	b.Run("Read4K", func(b *testing.B) { benchLatRead(b, 4096, lo) })
	b.Run("Write4K", func(b *testing.B) { benchLatWrite(b, 4096, lo) })
}

// usPerOp reports the wall time per op and the CPU time (user+system, the whole process: both
// devices and every goroutine) per op since cpu0 (cpuTime at the start).
func usPerOp(b *testing.B, d time.Duration, cpu0 time.Duration) {
	b.ReportMetric(d.Seconds()*1e6/float64(b.N), "µs/op")
	b.ReportMetric((cpuTime()-cpu0).Seconds()*1e6/float64(b.N), "cpu-µs/op")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchLatRawUDP(b *testing.B) {
	ip := net.IPv4(127, 0, 0, 1)
	ca, err := net.ListenUDP("udp4", &net.UDPAddr{IP: ip})
	if err != nil {
		b.Skip(err)
	}
	defer ca.Close()
	cb, err := net.ListenUDP("udp4", &net.UDPAddr{IP: ip})
	if err != nil {
		b.Skip(err)
	}
	defer cb.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, from, err := cb.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if _, err := cb.WriteToUDPAddrPort(buf[:n], from); err != nil {
				return
			}
		}
	}()
	bb := cb.LocalAddr().(*net.UDPAddr).AddrPort()
	pkt := make([]byte, 64+28) // BTH + ICRC-sized framing around 64 bytes
	buf := make([]byte, 2048)
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime()
	for i := 0; i < b.N; i++ {
		if _, err := ca.WriteToUDPAddrPort(pkt, bb); err != nil {
			b.Fatal(err)
		}
		if _, _, err := ca.ReadFromUDPAddrPort(buf); err != nil {
			b.Fatal(err)
		}
	}
	usPerOp(b, time.Since(start), cpu0)
	b.StopTimer()
	cb.Close()
	<-done
}

func latPair(b *testing.B, lo link.UDPOptions) (*node, *node) {
	la, lb := ListenUDPPair(b, loopback4, loopback4, lo)
	o := nodeOpts{memSize: 1 << 20, sqDepth: 64, rqDepth: 64, cqDepth: 256}
	na, nb := newNode(b, la, o), newNode(b, lb, o)
	connect(na, nb, connOpts{mtu: transport.MTU4096, timeout: 14})
	return na, nb
}

// waitOne waits for and returns one completion from cq.
func waitOne(b *testing.B, cq transport.CQ, ctx context.Context, wc []transport.WC) transport.WC {
	for {
		if cq.Poll(wc[:1]) == 1 {
			if wc[0].Status != transport.WCSuccess {
				b.Fatalf("completion %+v", wc[0])
			}
			return wc[0]
		}
		if err := cq.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func benchLatSend(b *testing.B, size int, lo link.UDPOptions) {
	na, nb := latPair(b, lo)
	defer func() { na.close(); nb.close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Receives: 8 on each side, reposted as they complete.
	const nrecv = 8
	for _, n := range []*node{na, nb} {
		for i := 0; i < nrecv; i++ {
			sg := []transport.SGE{n.sge(4096+i*4096, 4096)}
			if err := n.qp.PostRecv([]transport.RecvWR{{ID: uint64(i), SGL: sg}}); err != nil {
				b.Fatal(err)
			}
		}
	}
	echo := make(chan error, 1)
	stop := make(chan struct{})
	go func() {
		sgl := []transport.SGE{nb.sge(0, size)}
		wr := []transport.SendWR{{Opcode: transport.WRSend, SGL: sgl}}
		var wc [1]transport.WC
		var rwr [1]transport.RecvWR
		var rsg [1]transport.SGE
		for {
			for nb.rcq.Poll(wc[:]) == 0 {
				if err := nb.rcq.Wait(ctx); err != nil {
					echo <- nil
					return
				}
				select {
				case <-stop:
					echo <- nil
					return
				default:
				}
			}
			i := int(wc[0].ID)
			rsg[0] = nb.sge(4096+i*4096, 4096)
			rwr[0] = transport.RecvWR{ID: uint64(i), SGL: rsg[:]}
			if err := nb.qp.PostRecv(rwr[:]); err != nil {
				echo <- err
				return
			}
			if err := nb.qp.PostSend(wr); err != nil {
				echo <- err
				return
			}
		}
	}()
	sgl := []transport.SGE{na.sge(0, size)}
	wr := []transport.SendWR{{Opcode: transport.WRSend, SGL: sgl}}
	var wc [1]transport.WC
	var rwr [1]transport.RecvWR
	var rsg [1]transport.SGE
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime()
	for i := 0; i < b.N; i++ {
		mustPostSend(b, na.qp, wr)
		c := waitOne(b, na.rcq, ctx, wc[:])
		k := int(c.ID)
		rsg[0] = na.sge(4096+k*4096, 4096)
		rwr[0] = transport.RecvWR{ID: uint64(k), SGL: rsg[:]}
		if err := na.qp.PostRecv(rwr[:]); err != nil {
			b.Fatal(err)
		}
	}
	usPerOp(b, time.Since(start), cpu0)
	b.StopTimer()
	close(stop)
	cancel()
	if err := <-echo; err != nil {
		b.Fatal(err)
	}
}

func benchLatRead(b *testing.B, size int, lo link.UDPOptions) {
	benchLatOne(b, size, transport.WRRDMARead, lo)
}

func benchLatWrite(b *testing.B, size int, lo link.UDPOptions) {
	benchLatOne(b, size, transport.WRRDMAWrite, lo)
}

func benchLatOne(b *testing.B, size int, op transport.WROpcode, lo link.UDPOptions) {
	na, nb := latPair(b, lo)
	defer func() { na.close(); nb.close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sgl := []transport.SGE{na.sge(0, size)}
	wr := []transport.SendWR{{Opcode: op, Flags: transport.SendSignaled, SGL: sgl,
		RemoteAddr: nb.mem.Addr(), RKey: nb.mr.RKey()}}
	var wc [1]transport.WC
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime()
	for i := 0; i < b.N; i++ {
		mustPostSend(b, na.qp, wr)
		waitOne(b, na.scq, ctx, wc[:])
	}
	usPerOp(b, time.Since(start), cpu0)
	b.StopTimer()
}
