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

// TestUDPBusyPollAfterRun: an empty receive after a run of more than spinRun packets (a
// pipelining peer) waits without spinning; after a lone packet it spins again.
func TestUDPBusyPollAfterRun(t *testing.T) {
	a := listen(t, lo4, UDPOptions{})
	b := listen(t, lo4, UDPOptions{BusyPoll: time.Minute})
	const run = spinRun + 3
	var burst []Packet
	for i := 0; i < run; i++ {
		burst = append(burst, mkSend(t, b.LocalAddrPort(), uint32(i), 64))
	}
	if n, err := a.Send(burst); n != run || err != nil {
		t.Fatal(n, err)
	}
	recvN(t, b, run, 10*time.Second) // the run, queued before the first receive: no spin
	got := make(chan []Packet, 1)
	go func() { got <- recvN(t, b, 1, 10*time.Second) }()
	deadline := time.Now().Add(5 * time.Second)
	for b.Stats().RxBusyPollSkips == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no skipped spin after a run of %d: %+v", run, b.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if n, err := a.Send([]Packet{mkSend(t, b.LocalAddrPort(), 99, 64)}); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	<-got
	if st := b.Stats(); st.RxBusyPolls != 0 || st.RxBusyPollSkips != 1 {
		t.Fatalf("after a run of %d: %+v; want one receive that did not spin", run, st)
	}
	// A lone packet: the next empty receive spins, and takes the packet sent meanwhile.
	go func() { got <- recvN(t, b, 1, 10*time.Second) }()
	waitSpins(t, b, 1)
	if n, err := a.Send([]Packet{mkSend(t, b.LocalAddrPort(), 100, 64)}); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	<-got
	if st := b.Stats(); st.RxBusyPolls != 1 || st.RxBusyPollHits != 1 || st.RxBusyPollSkips != 1 {
		t.Fatalf("after a lone packet: %+v; want one spin that found the next", st)
	}
}
