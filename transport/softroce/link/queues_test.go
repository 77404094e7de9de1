//go:build linux

package link

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/srpd/srpd/transport/softroce/wire"
)

func TestQueueOf(t *testing.T) {
	for _, tc := range []struct {
		qpn  uint32
		n    int
		want int
	}{
		{1, 4, 0}, {0x11, 1, 0}, {0x11, 2, 1}, {0x12, 2, 0}, {0x13, 3, 1}, {0xFFFFFF, 4, 3}, {0, 4, 0}, {5, 0, 0},
	} {
		if got := QueueOf(tc.qpn, tc.n); got != tc.want {
			t.Errorf("QueueOf(%#x, %d) = %d, want %d", tc.qpn, tc.n, got, tc.want)
		}
	}
}

// TestUDPQueuesSteer: the kernel hands every packet to the queue that owns its destination QP
// (QP1 to queue 0), with and without GRO on the queues; all queues share one port.
func TestUDPQueuesSteer(t *testing.T) {
	for _, gro := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "gro"}[gro], func(t *testing.T) {
			const n = 3
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			qs, err := ListenUDPQueues(ctx, netip.AddrPortFrom(lo4, 0), UDPOptions{GRO: gro}, n)
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range qs {
				t.Cleanup(func() { q.Close() })
			}
			dst := qs[0].LocalAddrPort()
			for i, q := range qs {
				if q.LocalAddrPort() != dst {
					t.Fatalf("queue %d bound to %v, queue 0 to %v", i, q.LocalAddrPort(), dst)
				}
			}
			a := listen(t, lo4, UDPOptions{})
			want := make([][]uint32, n)
			var pkts []Packet
			for i, qpn := range append([]uint32{1}, qpnRange(0x11, 40)...) {
				p := mkSend(t, dst, uint32(i), 64+i)
				wire.BTH(p.Buf).SetDestQP(qpn)
				pkts = append(pkts, p)
				q := QueueOf(qpn, n)
				want[q] = append(want[q], qpn)
			}
			for i := range pkts {
				if k, err := a.Send(pkts[i : i+1]); k != 1 || err != nil {
					t.Fatal(k, err)
				}
			}
			for i, q := range qs {
				got := recvN(t, q, len(want[i]), 5*time.Second)
				for j, p := range got {
					if qpn := wire.BTH(p.Buf).DestQP(); qpn != want[i][j] {
						t.Fatalf("queue %d packet %d: QP %#x, want %#x (QueueOf %d)", i, j, qpn, want[i][j], QueueOf(qpn, n))
					}
				}
			}
			time.Sleep(20 * time.Millisecond) // nothing more may arrive anywhere
			var total uint64
			for i, q := range qs {
				st := q.Stats()
				if st.RxPackets != uint64(len(want[i])) || st.RxICRCDrops != 0 {
					t.Fatalf("queue %d: %+v, want %d packets", i, st, len(want[i]))
				}
				total += st.RxPackets
			}
			if total != uint64(len(pkts)) {
				t.Fatalf("%d packets received, %d sent", total, len(pkts))
			}
		})
	}
}

func qpnRange(first uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = first + uint32(i)
	}
	return out
}

func TestUDPQueuesArgs(t *testing.T) {
	ctx := context.Background()
	for _, n := range []int{0, -1, MaxQueues + 1} {
		if qs, err := ListenUDPQueues(ctx, netip.AddrPortFrom(lo4, 0), UDPOptions{}, n); !errors.Is(err, ErrQueues) || qs != nil {
			t.Errorf("%d queues: %v, %v", n, qs, err)
		}
	}
	qs, err := ListenUDPQueues(ctx, netip.AddrPortFrom(lo4, 0), UDPOptions{}, 1)
	if err != nil || len(qs) != 1 {
		t.Fatal(qs, err)
	}
	qs[0].Close()
	// A port held by a socket without SO_REUSEPORT cannot be joined: typed error, nothing left open.
	held := listen(t, lo4, UDPOptions{})
	if qs, err := ListenUDPQueues(ctx, held.LocalAddrPort(), UDPOptions{}, 2); !errors.Is(err, ErrQueues) || qs != nil {
		t.Fatalf("port in use: %v, %v", qs, err)
	}
}
