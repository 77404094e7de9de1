package link

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/srpd/srpd/transport/softroce/wire"
)

var (
	addrA = netip.MustParseAddr("10.77.0.1")
	addrB = netip.MustParseAddr("10.77.0.2")
)

// mkSend builds an RC SEND_ONLY with PSN psn and an n-byte payload into a fresh buffer.
func mkSend(t testing.TB, dst netip.AddrPort, psn uint32, n int) Packet {
	t.Helper()
	p, err := wire.Layout(make([]byte, MaxPacket), wire.RCSendOnly, n)
	if err != nil {
		t.Fatal(err)
	}
	p.BTH().SetDestQP(0x11)
	p.BTH().SetPSN(wire.PSN(psn))
	p.BTH().SetAckReq(true)
	for i := range p.Payload() {
		p.Payload()[i] = byte(i + int(psn))
	}
	return Packet{Dst: dst, Buf: p.Bytes()}
}

func recvBufs(n int) []Packet {
	ps := make([]Packet, n)
	for i := range ps {
		ps[i].Buf = make([]byte, MaxPacket)
	}
	return ps
}

// recvAll receives until want packets arrived or the deadline passes.
func recvAll(t testing.TB, l Link, want int, d time.Duration) []uint32 {
	t.Helper()
	var psns []uint32
	done := make(chan struct{})
	go func() {
		defer close(done)
		bufs := recvBufs(8)
		for len(psns) < want {
			n, err := l.Recv(bufs)
			if err != nil {
				return
			}
			for _, p := range bufs[:n] {
				psns = append(psns, uint32(wire.BTH(p.Buf).PSN()))
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(d):
		l.Close()
		<-done
	}
	return psns
}

func TestPipeBasic(t *testing.T) {
	for _, fam := range []struct{ a, b netip.Addr }{
		{addrA, addrB},
		{netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")},
	} {
		a, b := NewPipe(fam.a, fam.b, PipeConfig{RxeIPv4IDs: true})
		var pkts []Packet
		for i := range 10 {
			pkts = append(pkts, mkSend(t, b.LocalAddrPort(), uint32(i), i*37))
		}
		if n, err := a.Send(pkts); n != 10 || err != nil {
			t.Fatal(n, err)
		}
		bufs := recvBufs(16)
		n, err := b.Recv(bufs)
		if err != nil || n != 10 {
			t.Fatal(n, err)
		}
		for i, p := range bufs[:n] {
			if string(p.Buf) != string(pkts[i].Buf) {
				t.Fatalf("packet %d differs", i)
			}
			if p.Src != a.LocalAddrPort() || p.Dst != b.LocalAddrPort() {
				t.Fatalf("addresses %v %v", p.Src, p.Dst)
			}
			e := wire.Encap{Src: p.Src, Dst: p.Dst}
			if fam.a.Is6() && !e.VerifyICRC(p.Buf) {
				t.Fatal("icrc")
			}
		}
		st := b.Stats()
		if st.RxPackets != 10 || a.Stats().TxPackets != 10 || st.RxICRCDrops != 0 {
			t.Fatalf("%+v", st)
		}
		a.Close()
		b.Close()
		if _, err := b.Recv(bufs); !errors.Is(err, net.ErrClosed) {
			t.Fatal(err)
		}
		if _, err := a.Send(pkts); !errors.Is(err, net.ErrClosed) {
			t.Fatal(err)
		}
	}
}

func TestPipeCloseUnblocksRecv(t *testing.T) {
	a, b := NewPipe(addrA, addrB, PipeConfig{})
	defer a.Close()
	closeUnblocksRecv(t, b, 1)
}

// closeUnblocksRecv checks that Close ends a Recv (of n buffers) blocked on l with
// net.ErrClosed.
func closeUnblocksRecv(t *testing.T, l Link, n int) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		_, err := l.Recv(recvBufs(n))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	l.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Recv not unblocked by Close")
	}
}

func TestPipeCorruptCountsICRC(t *testing.T) {
	a, b := NewPipe(addrA, addrB, PipeConfig{Seed: 1, AtoB: Faults{Corrupt: 1}})
	defer a.Close()
	var pkts []Packet
	for i := range 50 {
		pkts = append(pkts, mkSend(t, b.LocalAddrPort(), uint32(i), 64))
	}
	a.Send(pkts)
	// One good packet to end the Recv.
	a.SetFaults(Faults{})
	a.Send([]Packet{mkSend(t, b.LocalAddrPort(), 999, 8)})
	got := recvAll(t, b, 1, 5*time.Second)
	if len(got) != 1 || got[0] != 999 {
		t.Fatal(got)
	}
	if st := b.Stats(); st.RxICRCDrops != 50 || st.RxMalformedDrops != 0 {
		t.Fatalf("%+v", st)
	}
	if fs := a.FaultStats(); fs.Corrupted != 50 {
		t.Fatalf("%+v", fs)
	}
}

func TestPipeFaultsDeterministic(t *testing.T) {
	run := func() ([]uint32, FaultStats) {
		a, b := NewPipe(addrA, addrB, PipeConfig{Seed: 42, HoldTimeout: 10 * time.Millisecond,
			AtoB: Faults{Drop: 0.1, Duplicate: 0.1, Reorder: 0.1, ReorderDistance: 3, Delay: 0.05, DelayPackets: 5}})
		defer a.Close()
		for i := range 200 {
			if _, err := a.Send([]Packet{mkSend(t, b.LocalAddrPort(), uint32(i), 16)}); err != nil {
				t.Fatal(err)
			}
		}
		b.Flush()
		fs := a.FaultStats()
		want := 200 - int(fs.Dropped) + int(fs.Duplicated)
		return recvAll(t, b, want, 5*time.Second), fs
	}
	p1, f1 := run()
	p2, f2 := run()
	if f1 != f2 || len(p1) != len(p2) {
		t.Fatalf("not deterministic: %+v %+v", f1, f2)
	}
	for i := range p1 {
		if p1[i] != p2[i] {
			t.Fatalf("order differs at %d", i)
		}
	}
	if f1.Dropped == 0 || f1.Duplicated == 0 || f1.Reordered == 0 || f1.Delayed == 0 {
		t.Fatalf("faults not exercised: %+v", f1)
	}
	inOrder := true
	for i := 1; i < len(p1); i++ {
		if p1[i] < p1[i-1] {
			inOrder = false
		}
	}
	if inOrder {
		t.Fatal("no reordering observed")
	}
	t.Logf("faults %+v, delivered %d", f1, len(p1))
}

func TestPipeReorderSwap(t *testing.T) {
	a, b := NewPipe(addrA, addrB, PipeConfig{HoldTimeout: -1})
	defer a.Close()
	a.SetFaults(Faults{Reorder: 1})
	a.Send([]Packet{mkSend(t, b.LocalAddrPort(), 1, 4)})
	a.SetFaults(Faults{})
	a.Send([]Packet{mkSend(t, b.LocalAddrPort(), 2, 4), mkSend(t, b.LocalAddrPort(), 3, 4)})
	if got := recvAll(t, b, 3, 5*time.Second); len(got) != 3 || got[0] != 2 || got[1] != 1 || got[2] != 3 {
		t.Fatal(got)
	}
}

func TestPipeDelayTime(t *testing.T) {
	a, b := NewPipe(addrA, addrB, PipeConfig{AtoB: Faults{Delay: 1, DelayTime: 30 * time.Millisecond}})
	defer a.Close()
	start := time.Now()
	a.Send([]Packet{mkSend(t, b.LocalAddrPort(), 7, 4)})
	if got := recvAll(t, b, 1, 5*time.Second); len(got) != 1 {
		t.Fatal(got)
	}
	if el := time.Since(start); el < 25*time.Millisecond {
		t.Fatalf("delivered after %v", el)
	}
}

func TestPipeFilterAndInject(t *testing.T) {
	a, b := NewPipe(addrA, addrB, PipeConfig{})
	defer a.Close()
	// Drop the 3rd SEND_ONLY; rewrite the PSN of the 5th (the ICRC is recomputed).
	seen := 0
	a.SetFilter(func(p *Packet) Action {
		if wire.BTH(p.Buf).Opcode() != wire.RCSendOnly {
			return Pass
		}
		seen++
		switch seen {
		case 3:
			return Drop
		case 5:
			wire.BTH(p.Buf).SetPSN(500)
		}
		return Pass
	})
	for i := range 6 {
		a.Send([]Packet{mkSend(t, b.LocalAddrPort(), uint32(i), 4)})
	}
	got := recvAll(t, b, 5, 5*time.Second)
	want := []uint32{0, 1, 3, 500, 5}
	if len(got) != len(want) {
		t.Fatal(got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatal(got)
		}
	}
	if a.FaultStats().Filtered != 1 {
		t.Fatal(a.FaultStats())
	}
	// Inject a crafted valid packet and a raw one with a bad ICRC.
	good := mkSend(t, netip.AddrPort{}, 77, 4)
	bad := mkSend(t, netip.AddrPort{}, 78, 4)
	if _, err := b.Inject(false, good); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Inject(true, bad); err != nil {
		t.Fatal(err)
	}
	b.Inject(false, mkSend(t, netip.AddrPort{}, 79, 4))
	got = recvAll(t, b, 2, 5*time.Second)
	if len(got) != 2 || got[0] != 77 || got[1] != 79 || b.Stats().RxICRCDrops != 1 {
		t.Fatal(got, b.Stats())
	}
}

func TestPipeQueueFull(t *testing.T) {
	a, b := NewPipe(addrA, addrB, PipeConfig{QueueLen: 4})
	defer a.Close()
	var pkts []Packet
	for i := range 10 {
		pkts = append(pkts, mkSend(t, b.LocalAddrPort(), uint32(i), 4))
	}
	if n, err := a.Send(pkts); n != 10 || err != nil {
		t.Fatal(n, err)
	}
	if st := b.Stats(); st.RxQueueDrops != 6 {
		t.Fatalf("%+v", st)
	}
	if got := recvAll(t, b, 4, 5*time.Second); len(got) != 4 || got[3] != 3 {
		t.Fatal(got)
	}
}

func TestPipeSendErrors(t *testing.T) {
	a, b := NewPipe(addrA, addrB, PipeConfig{})
	defer a.Close()
	defer b.Close()
	ok := mkSend(t, b.LocalAddrPort(), 1, 4)
	short := Packet{Dst: b.LocalAddrPort(), Buf: make([]byte, 10)}
	if n, err := a.Send([]Packet{ok, short, ok}); n != 1 || !errors.Is(err, ErrPacketSize) {
		t.Fatal(n, err)
	}
	v6 := ok
	v6.Dst = netip.MustParseAddrPort("[::1]:4791")
	if n, err := a.Send([]Packet{v6}); n != 0 || !errors.Is(err, ErrAddress) {
		t.Fatal(n, err)
	}
	if _, err := b.Recv([]Packet{{Buf: make([]byte, 100)}}); !errors.Is(err, ErrBufferTooSmall) {
		t.Fatal(err)
	}
	if a.Stats().TxErrors != 2 {
		t.Fatal(a.Stats())
	}
}

func TestPipeConcurrent(t *testing.T) {
	a, b := NewPipe(addrA, addrB, PipeConfig{QueueLen: 1024})
	defer a.Close()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				a.Send([]Packet{mkSend(t, b.LocalAddrPort(), uint32(g*1000+i), 32)})
			}
		}()
	}
	wg.Wait()
	if got := recvAll(t, b, 400, 5*time.Second); len(got) != 400 {
		t.Fatal(len(got))
	}
}

func BenchmarkPipe(b *testing.B) {
	la, lb := NewPipe(addrA, addrB, PipeConfig{QueueLen: 1024})
	defer la.Close()
	const batch = 32
	pkts := make([]Packet, batch)
	for i := range pkts {
		pkts[i] = mkSend(b, lb.LocalAddrPort(), uint32(i), 4096)
	}
	bufs := recvBufs(batch)
	b.SetBytes(int64(batch * len(pkts[0].Buf)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := la.Send(pkts); err != nil {
			b.Fatal(err)
		}
		for got := 0; got < batch; {
			n, err := lb.Recv(bufs)
			if err != nil {
				b.Fatal(err)
			}
			got += n
		}
	}
}
