//go:build linux

package link

import (
	"errors"
	"net"
	"testing"
	"time"
)

// waitSpins waits (bounded) until u reports n busy polls started.
func waitSpins(t *testing.T, u *UDP, n uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for u.Stats().RxBusyPolls < n {
		if time.Now().After(deadline) {
			t.Fatalf("busy polls: %d, want %d", u.Stats().RxBusyPolls, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestUDPBusyPoll: a receive that finds the socket empty spins (UDPOptions.BusyPoll), and a
// packet that arrives during the spin is taken by it, not by a wake-up from the netpoller.
func TestUDPBusyPoll(t *testing.T) {
	for _, gro := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "gro"}[gro], func(t *testing.T) {
			a := listen(t, lo4, UDPOptions{})
			b := listen(t, lo4, UDPOptions{GRO: gro, BusyPoll: time.Minute})
			got := make(chan []Packet, 1)
			go func() { got <- recvN(t, b, 1, 10*time.Second) }()
			waitSpins(t, b, 1)
			p := mkSend(t, b.LocalAddrPort(), 7, 1000)
			if n, err := a.Send([]Packet{p}); n != 1 || err != nil {
				t.Fatal(n, err)
			}
			if q := <-got; string(q[0].Buf) != string(p.Buf) {
				t.Fatal("packet differs")
			}
			if st := b.Stats(); st.RxBusyPolls != 1 || st.RxBusyPollHits != 1 || st.RxPackets != 1 {
				t.Fatalf("%+v: want the one packet taken by the one spin", st)
			}
		})
	}
}

// TestUDPBusyPollEnds: once BusyPoll has passed, the receive waits in the netpoller (no hit),
// and with BusyPoll 0 it never spins.
func TestUDPBusyPollEnds(t *testing.T) {
	for _, bp := range []time.Duration{0, time.Millisecond} {
		a := listen(t, lo4, UDPOptions{})
		b := listen(t, lo4, UDPOptions{BusyPoll: bp})
		got := make(chan []Packet, 1)
		go func() { got <- recvN(t, b, 1, 10*time.Second) }()
		if bp > 0 {
			waitSpins(t, b, 1)
		}
		time.Sleep(300 * time.Millisecond) // far past the spin
		if n, err := a.Send([]Packet{mkSend(t, b.LocalAddrPort(), 1, 64)}); n != 1 || err != nil {
			t.Fatal(n, err)
		}
		<-got
		st := b.Stats()
		wantSpins := uint64(0)
		if bp > 0 {
			wantSpins = 1
		}
		if st.RxBusyPolls != wantSpins || st.RxBusyPollHits != 0 || st.RxPackets != 1 {
			t.Fatalf("busy poll %v: %+v", bp, st)
		}
	}
}

// TestUDPCloseEndsBusyPoll: Close ends a spinning receive at once, however long BusyPoll is.
func TestUDPCloseEndsBusyPoll(t *testing.T) {
	u := listen(t, lo4, UDPOptions{BusyPoll: time.Hour})
	errc := make(chan error, 1)
	go func() {
		_, err := u.Recv(recvBufs(4))
		errc <- err
	}()
	waitSpins(t, u, 1)
	u.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a spinning Recv was not ended by Close")
	}
}

// TestUDPBusyPollBacksOff: spins that keep ending empty (the data comes after BusyPoll) make
// most empty receives wait without spinning (one in spinProbe still spins), and spins that find
// data bring spinning back for every empty receive.
func TestUDPBusyPollBacksOff(t *testing.T) {
	const bp = 20 * time.Millisecond
	a := listen(t, lo4, UDPOptions{})
	b := listen(t, lo4, UDPOptions{BusyPoll: bp})
	// round lets one receive find the socket empty, then sends it a packet: after its spin
	// ended (late) or as soon as it spins or skips (early). It reports whether it spun.
	round := func(late bool) bool {
		t.Helper()
		st0 := b.Stats()
		got := make(chan []Packet, 1)
		go func() { got <- recvN(t, b, 1, 10*time.Second) }()
		deadline := time.Now().Add(5 * time.Second)
		var spun bool
		for {
			st := b.Stats()
			if st.RxBusyPolls > st0.RxBusyPolls {
				spun = true
				break
			}
			if st.RxBusyPollSkips > st0.RxBusyPollSkips {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the receive neither spun nor skipped: %+v", st)
			}
			time.Sleep(50 * time.Microsecond)
		}
		if spun && late {
			time.Sleep(3 * bp) // the spin is over
		}
		if n, err := a.Send([]Packet{mkSend(t, b.LocalAddrPort(), 1, 64)}); n != 1 || err != nil {
			t.Fatal(n, err)
		}
		<-got
		return spun
	}
	spins := 0
	for i := 0; i < 4*spinProbe; i++ {
		if round(true) {
			spins++
		}
	}
	st := b.Stats()
	if st.RxBusyPollHits != 0 || st.RxBusyPollSkips == 0 || spins > 6+4 {
		t.Fatalf("after %d late packets: %d spins (%+v); want the spins to back off", 4*spinProbe, spins, st)
	}
	// Early packets: the probes find data, and soon every empty receive spins again.
	last := 0
	for i := 0; i < 12*spinProbe; i++ {
		if round(false) {
			last++
		} else {
			last = 0
		}
	}
	if st := b.Stats(); last < 2*spinProbe || st.RxBusyPollHits == 0 {
		t.Fatalf("after early packets: the last %d receives spun (%+v); want spinning back", last, st)
	}
}
