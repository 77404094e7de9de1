//go:build linux

package link

import (
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/srpd/srpd/transport/softroce/wire"
)

const (
	benchBatch   = 32
	benchPayload = 4096 // one MTU-4096 RDMA WRITE MIDDLE per packet
	benchWindow  = 8    // batches in flight (keeps within the 4 MiB socket buffers: no loss)
)

// pipeline runs send and recv concurrently for n batches with at most benchWindow batches in
// flight, and returns the elapsed time. Every wait is bounded.
func pipeline(b *testing.B, n int, send func() error, recv func() (int, error), closeAll func()) time.Duration {
	// Watchdog: a lost datagram would leave recv blocked; closing the sockets unblocks it.
	wd := time.AfterFunc(time.Minute, closeAll)
	defer wd.Stop()
	credits := make(chan struct{}, benchWindow)
	for range benchWindow {
		credits <- struct{}{}
	}
	errc := make(chan error, 1)
	start := time.Now()
	go func() {
		for range n {
			select {
			case <-credits:
			default:
				t := time.NewTimer(10 * time.Second) // slow path only: no allocation when credits are there
				select {
				case <-credits:
					t.Stop()
				case <-t.C:
					errc <- errTimeout
					return
				}
			}
			if err := send(); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	got, acked := 0, 0
	for got < n*benchBatch {
		k, err := recv()
		if err != nil {
			b.Fatal(err)
		}
		got += k
		for acked < got/benchBatch {
			acked++
			credits <- struct{}{}
		}
	}
	el := time.Since(start)
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	return el
}

var errTimeout = &net.OpError{Op: "bench", Err: syscall.ETIMEDOUT}

func benchPackets(b *testing.B, dst netip.AddrPort) []Packet {
	pkts := make([]Packet, benchBatch)
	for i := range pkts {
		p, err := wire.Layout(make([]byte, MaxPacket), wire.RCRDMAWriteMiddle, benchPayload)
		if err != nil {
			b.Fatal(err)
		}
		p.BTH().SetDestQP(0x11)
		p.BTH().SetPSN(wire.PSN(i))
		pkts[i] = Packet{Dst: dst, Buf: p.Bytes()}
	}
	return pkts
}

func benchLink(b *testing.B, n int, reset bool) time.Duration {
	tx := listen(b, lo4, UDPOptions{})
	rx := listen(b, lo4, UDPOptions{})
	pkts := benchPackets(b, rx.LocalAddrPort())
	bufs := recvBufs(benchBatch)
	if reset {
		b.ResetTimer()
	}
	el := pipeline(b, n, func() error {
		_, err := tx.Send(pkts)
		return err
	}, func() (int, error) { return rx.Recv(bufs) }, func() { tx.Close(); rx.Close() })
	if st := rx.Stats(); st.RxICRCDrops+st.RxMalformedDrops != 0 {
		b.Fatalf("%+v", st)
	}
	return el
}

func rawConn(b *testing.B) *net.UDPConn {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	rc, _ := c.SyscallConn()
	rc.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, defaultSock)
		unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, defaultSock)
	})
	return c
}

// benchRaw blasts the same bytes through plain UDP sockets, one datagram per syscall, no ICRC.
func benchRaw(b *testing.B, n int, reset bool) time.Duration {
	tx, rx := rawConn(b), rawConn(b)
	dst := rx.LocalAddr().(*net.UDPAddr).AddrPort()
	pkts := benchPackets(b, dst)
	buf := make([]byte, MaxPacket)
	if reset {
		b.ResetTimer()
	}
	return pipeline(b, n, func() error {
		for i := range pkts {
			if _, err := tx.WriteToUDPAddrPort(pkts[i].Buf, dst); err != nil {
				return err
			}
		}
		return nil
	}, func() (int, error) {
		_, _, err := rx.ReadFromUDPAddrPort(buf)
		if err != nil {
			return 0, err
		}
		return 1, nil
	}, func() { tx.Close(); rx.Close() })
}

func report(b *testing.B, el time.Duration) {
	pps := float64(b.N*benchBatch) / el.Seconds()
	b.ReportMetric(pps, "pkts/s")
	b.ReportMetric(0, "ns/op")
	b.SetBytes(int64(benchBatch * benchPayload))
}

// BenchmarkUDPLink: one op = one batch of 32 MTU-4096 packets sent and received through the UDP
// link over 127.0.0.1 (sendmmsg/recvmmsg, ICRC on send, ID recovery + ICRC on receive).
func BenchmarkUDPLink(b *testing.B) {
	b.ReportAllocs()
	report(b, benchLink(b, b.N, true))
}

// BenchmarkRawUDP: the same bytes through plain UDP sockets, one syscall per datagram.
func BenchmarkRawUDP(b *testing.B) {
	b.ReportAllocs()
	report(b, benchRaw(b, b.N, true))
}

// BenchmarkLinkVsRaw runs both in the same iteration count and reports both rates and the ratio.
func BenchmarkLinkVsRaw(b *testing.B) {
	l := benchLink(b, b.N, false)
	r := benchRaw(b, b.N, false)
	lp := float64(b.N*benchBatch) / l.Seconds()
	rp := float64(b.N*benchBatch) / r.Seconds()
	b.ReportMetric(lp, "link-pkts/s")
	b.ReportMetric(rp, "raw-pkts/s")
	b.ReportMetric(lp/rp, "link/raw")
	b.ReportMetric(0, "ns/op")
}

// TestUDPSteadyStateNoAllocs checks that a Send + Recv of a full batch allocates nothing.
func TestUDPSteadyStateNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	for _, tc := range []struct {
		a        netip.Addr
		gro, gso bool
	}{{lo4, false, false}, {lo6, false, false}, {lo4, true, false}, {lo4, true, true}, {lo6, false, true}} {
		tx := listen(t, tc.a, UDPOptions{GSO: tc.gso})
		rx := listen(t, tc.a, UDPOptions{GRO: tc.gro})
		pkts := benchPackets(&testing.B{}, rx.LocalAddrPort())
		bufs := recvBufs(benchBatch)
		run := func() {
			if _, err := tx.Send(pkts); err != nil {
				t.Fatal(err)
			}
			for got := 0; got < benchBatch; {
				n, err := rx.Recv(bufs)
				if err != nil {
					t.Fatal(err)
				}
				got += n
			}
		}
		run()
		if a := testing.AllocsPerRun(50, run); a != 0 {
			t.Errorf("%v gro=%v gso=%v: %v allocations per batch", tc.a, tc.gro, tc.gso, a)
		}
	}
}

// TestPipeSteadyStateNoAllocs checks the same for MemLink.
func TestPipeSteadyStateNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	a, b := NewPipe(lo4, netip.MustParseAddr("127.0.0.2"), PipeConfig{Seed: 3,
		AtoB: Faults{Drop: 0.01, Duplicate: 0.01, Reorder: 0.01, Corrupt: 0.01}, HoldTimeout: -1})
	defer a.Close()
	pkts := benchPackets(&testing.B{}, b.LocalAddrPort())
	bufs := recvBufs(2 * benchBatch)
	run := func() {
		if _, err := a.Send(pkts); err != nil {
			t.Fatal(err)
		}
		b.Flush()
		if _, err := b.Recv(bufs); err != nil {
			t.Fatal(err)
		}
	}
	run()
	if n := testing.AllocsPerRun(50, run); n != 0 {
		t.Errorf("%v allocations per batch", n)
	}
}
