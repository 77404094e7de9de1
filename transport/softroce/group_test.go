package softroce

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
)

// openGroupT opens a multi-queue device of n queues on addr (ephemeral port), closed when t
// ends.
func openGroupT(t testing.TB, addr netip.Addr, n int, lo link.UDPOptions) *Device {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	qs, err := link.ListenUDPQueues(ctx, netip.AddrPortFrom(addr, 0), lo, n)
	if err != nil {
		t.Skipf("SKIPPED: no UDP queues on %v: %v", addr, err)
	}
	links := make([]link.Link, n)
	for i, q := range qs {
		links[i] = q
	}
	d, err := Open(Config{Name: "g" + addr.String(), Link: links[0], Queues: links[1:]})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.ConfigureCM(fastCM); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Close(ctx); err != nil {
			t.Errorf("close %s: %v", d.Name(), err)
		}
	})
	return d
}

func queueIndex(d *Device, q transport.Device) int {
	for i, x := range d.Queues() {
		if x == q {
			return i
		}
	}
	return -1
}

// TestGroupQueues: two multi-queue devices (a dialler and a listener, as an initiator host
// and a target host) connect several QPs through the CM and move data both ways on each. QPs
// are numbered in their queue's residue class; a request is accepted on the queue of the
// dialling QP when both have as many queues; every queue carries traffic; with unequal queue
// counts everything still works (packets of a GSO super-packet that the kernel steered by its
// first segment are handed to their queue). Then the same through one device's own loopback.
func TestGroupQueues(t *testing.T) {
	a4, b4 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	for _, tc := range []struct {
		name   string
		na, nb int
		lo     link.UDPOptions
	}{
		{"3x3", 3, 3, link.UDPOptions{}},
		{"3x3-gso", 3, 3, link.UDPOptions{GRO: true, GSO: true}},
		{"2x3-gso", 2, 3, link.UDPOptions{GRO: true, GSO: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			da := openGroupT(t, a4, tc.na, tc.lo)
			db := openGroupT(t, b4, tc.nb, tc.lo)
			da.SetPeerUDPPort(b4, db.Addrs()[0].Port())
			if got := len(da.Queues()); got != tc.na || da.Queues()[0] != transport.Device(da) {
				t.Fatalf("%d queues, first %v", got, da.Queues()[0])
			}
			l, err := db.Listen(netip.Addr{}, cmPort)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			const pairs = 6
			ctx := ctxT(t, 20*time.Second)
			for i := range pairs {
				qa := transport.QueueFor(da, i).(*Device)
				x := newNodeOn(t, qa, nodeOpts{})
				if got := link.QueueOf(x.qp.QPN(), tc.na); got != i%tc.na {
					t.Fatalf("QP %#x of queue %d: QueueOf says %d", x.qp.QPN(), i%tc.na, got)
				}
				dch := goDial(ctx, &node{dev: da}, b4, cmPort, x.qp, []byte("hello"), rdParam)
				req, err := l.Accept(ctx)
				if err != nil {
					t.Fatal(err)
				}
				qb, ok := req.Info().Device.(*Device)
				if !ok || queueIndex(db, qb) < 0 {
					t.Fatalf("request's device %v is not a queue of the listener's", req.Info().Device)
				}
				if k := queueIndex(db, qb); tc.na == tc.nb && k != i%tc.na {
					t.Fatalf("request from a QP of queue %d accepted on queue %d", i%tc.na, k)
				}
				y := newNodeOn(t, qb, nodeOpts{})
				if got := link.QueueOf(y.qp.QPN(), tc.nb); got != queueIndex(db, qb) {
					t.Fatalf("QP %#x on queue %d: QueueOf says %d", y.qp.QPN(), queueIndex(db, qb), got)
				}
				if _, err := req.Accept(ctx, y.qp, nil, rdParam); err != nil {
					t.Fatal(err)
				}
				if r := <-dch; r.err != nil {
					t.Fatal(r.err)
				}
				rcTraffic(t, x, y, x.qp, y.qp)
			}
			for _, d := range []*Device{da, db} {
				for i, s := range d.QueueStats() {
					if s.RxPackets == 0 || s.TxPackets == 0 {
						t.Errorf("%s queue %d carried nothing: %+v", d.Name(), i, s)
					}
				}
				if sum := d.Stats(); sum.RxPackets == 0 || sum.RxPackets != sumRx(d.QueueStats()) {
					t.Errorf("%s: Stats %d received, queues %d", d.Name(), sum.RxPackets, sumRx(d.QueueStats()))
				}
			}
			if tc.na == tc.nb && !tc.lo.GSO {
				// Steered by the kernel, paired by the CM: only QP1's MADs change queue.
				for _, d := range []*Device{da, db} {
					for i, s := range d.QueueStats()[1:] {
						if s.Forwarded != 0 {
							t.Errorf("%s queue %d forwarded %d packets", d.Name(), i+1, s.Forwarded)
						}
					}
				}
			}
			if n := len(db.EstablishedConns()); n != pairs {
				t.Errorf("%d established connections listed, want %d", n, pairs)
			}
			t.Logf("forwarded: %v / %v", forwards(da), forwards(db))
		})
	}
	t.Run("loopback", func(t *testing.T) {
		d := openGroupT(t, a4, 2, link.UDPOptions{GRO: true, GSO: true})
		d.SetPeerUDPPort(a4, d.Addrs()[0].Port()) // ourselves, on an ephemeral port
		l, err := d.Listen(netip.Addr{}, cmPort)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ctx := ctxT(t, 20*time.Second)
		for i := range 4 {
			x, y := connectPair(t, ctx, d, i, l, a4, nodeOpts{})
			if k := queueIndex(d, y.dev); k != i%2 {
				t.Fatalf("request from queue %d arrived on queue %d", i%2, k)
			}
			rcTraffic(t, x, y, x.qp, y.qp)
		}
		for i, s := range d.QueueStats() {
			if s.LoopPackets == 0 || s.Forwarded != 0 {
				t.Errorf("queue %d: %d packets looped back, %d forwarded", i, s.LoopPackets, s.Forwarded)
			}
		}
	})
}

func sumRx(ss []Stats) uint64 {
	var n uint64
	for _, s := range ss {
		n += s.RxPackets
	}
	return n
}

func forwards(d *Device) string {
	s := ""
	for _, q := range d.QueueStats() {
		s += fmt.Sprintf(" %d", q.Forwarded)
	}
	return s
}

// TestGroupMemory: the queues share one memory: memory allocated on one queue registers on
// another's PD, Free refuses while an MR of any queue covers it, and a queue cannot be closed
// on its own.
func TestGroupMemory(t *testing.T) {
	d := openGroupT(t, netip.MustParseAddr("127.0.0.1"), 3, link.UDPOptions{})
	mem, err := d.AllocMemory(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	q2 := d.Queues()[2]
	pd, err := q2.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegMR(mem.Addr(), uint64(mem.Len()), transport.AccessLocalWrite)
	if err != nil {
		t.Fatalf("register the leader's memory on queue 2: %v", err)
	}
	if err := mem.Free(); !errors.Is(err, transport.ErrBusy) {
		t.Fatalf("free under an MR of queue 2: %v", err)
	}
	if err := mr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := mem.Free(); err != nil {
		t.Fatal(err)
	}
	if _, err := pd.RegMR(mem.Addr(), 4096, transport.AccessLocalWrite); !errors.Is(err, transport.ErrBadAddress) {
		t.Fatalf("register freed memory: %v", err)
	}
	if err := q2.Close(context.Background()); !errors.Is(err, transport.ErrInvalidArgument) {
		t.Fatalf("closing a queue alone: %v", err)
	}
}

// TestGroupForwardsMixedGSO: a GSO super-packet carrying the packets of QPs on two queues is
// steered whole to one (by its first segment); that queue hands the other QP's packets to
// their queue, and the data arrives intact.
func TestGroupForwardsMixedGSO(t *testing.T) {
	a4, b4 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	lo := link.UDPOptions{GRO: true, GSO: true}
	da := openGroupT(t, a4, 1, lo) // one queue: a plain device, whose sends mix its QPs
	da.copyPayloads = true         // whole packets: a GSO run of payloads by reference stops at 8
	db := openGroupT(t, b4, 2, lo)
	da.SetPeerUDPPort(b4, db.Addrs()[0].Port())
	l, err := db.Listen(netip.Addr{}, cmPort)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := ctxT(t, 20*time.Second)
	var xs, ys []*node
	queues := map[int]bool{}
	for len(queues) < 2 {
		x, y := connectPair(t, ctx, da, 0, l, b4, nodeOpts{})
		queues[queueIndex(db, y.dev)] = true
		xs, ys = append(xs, x), append(ys, y)
	}
	before := db.Stats().Forwarded
	// One packet each (WRITE ONLY, same size): consecutive, they make one GSO run. (The first
	// packet of a longer message carries a RETH, longer than the rest: it starts a new run.)
	const n = 2048
	for round := range 4 {
		da.BeginPosts() // one sendmmsg: same-size packets of both QPs in GSO super-packets
		for i, x := range xs {
			fill(x.bytes(0, n), uint64(round*10+i))
			mustPostSend(t, x.qp, []transport.SendWR{{ID: uint64(round), Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled,
				SGL: []transport.SGE{x.sge(0, n)}, RemoteAddr: ys[i].mem.Addr(), RKey: ys[i].mr.RKey()}})
		}
		da.EndPosts()
		for i, x := range xs {
			wantWC(t, waitWC(t, x.scq, 5*time.Second), uint64(round), transport.WCSuccess, transport.WCRDMAWrite)
			equal(t, fmt.Sprintf("round %d QP %d", round, i), ys[i].bytes(0, n), x.bytes(0, n))
		}
	}
	if st := da.Stats(); st.Retransmits != 0 || db.Stats().ICRCDrops != 0 {
		t.Fatalf("%d retransmissions, %d ICRC drops: a packet that changed queue was lost", st.Retransmits, db.Stats().ICRCDrops)
	}
	if fw := db.Stats().Forwarded - before; fw == 0 {
		t.Fatalf("no data packet changed queue (queues per QP %v, forwarded %v)", queues, forwards(db))
	}
	t.Logf("forwarded per queue:%s", forwards(db))
}

// connectPair makes a node on queue i of the dialler da and connects it through the CM to a
// node the listener l's device creates on the queue the request arrived on.
func connectPair(t testing.TB, ctx context.Context, da *Device, i int, l transport.Listener, to netip.Addr, o nodeOpts) (x, y *node) {
	x = newNodeOn(t, transport.QueueFor(da, i).(*Device), o)
	dch := goDial(ctx, &node{dev: da}, to, cmPort, x.qp, nil, rdParam)
	req, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	y = newNodeOn(t, req.Info().Device.(*Device), o)
	if _, err := req.Accept(ctx, y.qp, nil, rdParam); err != nil {
		t.Fatal(err)
	}
	if r := <-dch; r.err != nil {
		t.Fatal(r.err)
	}
	return x, y
}

// BenchmarkQueues: two QPs between two devices (two hosts on 127.0.0.1 and 127.0.0.2) with 1
// and 2 receive queues each, a goroutine per QP keeping benchDepth 4 KiB RDMA WRITEs in flight
// (benchstat -col /queues; the queues=2 figure needs CPUs to spare to gain). 0 allocs/op.
func BenchmarkQueues(b *testing.B) {
	a4, b4 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	const size, pairs = 4096, 2
	for _, nq := range []int{1, 2} {
		b.Run(fmt.Sprintf("queues=%d", nq), func(b *testing.B) {
			lo := link.UDPOptions{GRO: true, GSO: true}
			da, db := openGroupT(b, a4, nq, lo), openGroupT(b, b4, nq, lo)
			da.SetPeerUDPPort(b4, db.Addrs()[0].Port())
			l, err := db.Listen(netip.Addr{}, cmPort)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			o := nodeOpts{memSize: benchDepth * size, sqDepth: 64, cqDepth: 256}
			var xs, ys []*node
			for i := range pairs {
				x, y := connectPair(b, ctx, da, i, l, b4, o)
				xs, ys = append(xs, x), append(ys, y)
			}
			b.SetBytes(size)
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			for p := range pairs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					x, y := xs[p], ys[p]
					wrs := make([]transport.SendWR, benchDepth)
					for i := range wrs {
						wrs[i] = transport.SendWR{ID: uint64(i), Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled,
							SGL: []transport.SGE{x.sge(i*size, size)}, RemoteAddr: y.mem.Addr() + uint64(i*size), RKey: y.mr.RKey()}
					}
					var wc [benchDepth]transport.WC
					n := b.N / pairs
					inflight, posted := 0, 0
					for done := 0; done < n; {
						for inflight < benchDepth && posted < n {
							if err := x.qp.PostSend(wrs[posted%benchDepth : posted%benchDepth+1]); err != nil {
								b.Error(err)
								return
							}
							posted++
							inflight++
						}
						k := pollSome(b, ctx, x.scq, wc[:])
						done += k
						inflight -= k
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			var retx uint64
			for _, d := range []*Device{da, db} {
				retx += d.Stats().Retransmits
			}
			b.ReportMetric(float64(retx)/float64(b.N), "retx/op")
		})
	}
}
