//go:build linux

package link

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/srpd/srpd/transport/softroce/wire"
)

var (
	lo4 = netip.MustParseAddr("127.0.0.1")
	lo6 = netip.MustParseAddr("::1")
)

func listen(t testing.TB, a netip.Addr, opts UDPOptions) *UDP {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	u, err := ListenUDP(ctx, netip.AddrPortFrom(a, 0), opts)
	if err != nil {
		if a.Is6() && errors.Is(err, unix.EADDRNOTAVAIL) {
			t.Skip("no IPv6 loopback:", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	return u
}

// recvN receives until want packets arrived, failing after d.
func recvN(t testing.TB, l Link, want int, d time.Duration) []Packet {
	t.Helper()
	var out []Packet
	done := make(chan error, 1)
	go func() {
		bufs := recvBufs(16)
		for len(out) < want {
			n, err := l.Recv(bufs)
			if err != nil {
				done <- err
				return
			}
			for _, p := range bufs[:n] {
				q := p
				q.Buf = append([]byte(nil), p.Buf...)
				out = append(out, q)
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(d):
		l.Close()
		<-done
		t.Fatalf("received %d of %d packets", len(out), want)
	}
	return out
}

func TestUDPRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		addr netip.Addr
		gro  bool
	}{{"v4", lo4, false}, {"v6", lo6, false}, {"v4-gro", lo4, true}, {"v6-gro", lo6, true}} {
		t.Run(tc.name, func(t *testing.T) {
			a := listen(t, tc.addr, UDPOptions{GRO: tc.gro})
			b := listen(t, tc.addr, UDPOptions{GRO: tc.gro})
			var pkts []Packet
			for i := range 100 {
				p := mkSend(t, b.LocalAddrPort(), uint32(i), (i*41)%4097)
				p.TrafficClass = uint8(i % 4 * 8)
				pkts = append(pkts, p)
			}
			for i := 0; i < len(pkts); i += 10 {
				if n, err := a.Send(pkts[i : i+10]); n != 10 || err != nil {
					t.Fatal(n, err)
				}
			}
			got := recvN(t, b, len(pkts), 10*time.Second)
			for i, p := range got {
				if string(p.Buf) != string(pkts[i].Buf) {
					t.Fatalf("packet %d differs", i)
				}
				if p.Src != a.LocalAddrPort() || p.Dst != b.LocalAddrPort() {
					t.Fatalf("addresses %v -> %v", p.Src, p.Dst)
				}
				if p.TrafficClass != pkts[i].TrafficClass {
					t.Fatalf("tc %d want %d", p.TrafficClass, pkts[i].TrafficClass)
				}
			}
			st := b.Stats()
			if st.RxPackets != 100 || st.RxICRCDrops != 0 || st.RxMalformedDrops != 0 || a.Stats().TxPackets != 100 {
				t.Fatalf("%+v %+v", st, a.Stats())
			}
		})
	}
}

func TestUDPWildcard(t *testing.T) {
	for _, tc := range []struct{ wild, lo netip.Addr }{{netip.IPv4Unspecified(), lo4}, {netip.IPv6Unspecified(), lo6}} {
		a := listen(t, tc.wild, UDPOptions{})
		b := listen(t, tc.wild, UDPOptions{})
		dst := netip.AddrPortFrom(tc.lo, b.LocalAddrPort().Port())
		p := mkSend(t, dst, 5, 100)
		if _, err := a.Send([]Packet{p}); !errors.Is(err, ErrAddress) {
			t.Fatalf("wildcard send without Src: %v", err)
		}
		p.Src = netip.AddrPortFrom(tc.lo, 0)
		if n, err := a.Send([]Packet{p}); n != 1 || err != nil {
			t.Fatal(n, err)
		}
		got := recvN(t, b, 1, 5*time.Second)
		if got[0].Dst != dst || got[0].Src.Addr() != tc.lo || got[0].Src.Port() != a.LocalAddrPort().Port() {
			t.Fatalf("%v -> %v", got[0].Src, got[0].Dst)
		}
	}
}

func TestUDPCloseUnblocks(t *testing.T) {
	u := listen(t, lo4, UDPOptions{})
	closeUnblocksRecv(t, u, 4)
	if _, err := u.Send([]Packet{mkSend(t, netip.MustParseAddrPort("127.0.0.1:9"), 1, 1)}); !errors.Is(err, net.ErrClosed) {
		t.Fatal(err)
	}
}

func TestUDPSendErrors(t *testing.T) {
	u := listen(t, lo4, UDPOptions{})
	ok := mkSend(t, u.LocalAddrPort(), 1, 1)
	if n, err := u.Send([]Packet{ok, {Dst: u.LocalAddrPort(), Buf: make([]byte, 3)}}); n != 1 || !errors.Is(err, ErrPacketSize) {
		t.Fatal(n, err)
	}
	v6 := ok
	v6.Dst = netip.MustParseAddrPort("[::1]:4791")
	if n, err := u.Send([]Packet{v6}); n != 0 || !errors.Is(err, ErrAddress) {
		t.Fatal(n, err)
	}
	if _, err := u.Recv([]Packet{{Buf: make([]byte, 10)}}); !errors.Is(err, ErrBufferTooSmall) {
		t.Fatal(err)
	}
}

// ---- AF_PACKET helpers: capture and inject frames on lo (root only; CI runs as root) ----

type loSock struct {
	fd      int
	ifindex int
}

func openLo(t testing.TB) *loSock {
	t.Helper()
	ifi, err := net.InterfaceByName("lo")
	if err != nil {
		t.Skip("no lo interface:", err)
	}
	proto := int(htons(unix.ETH_P_ALL))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			t.Skip("AF_PACKET needs CAP_NET_RAW (tests run as root in CI):", err)
		}
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	// SO_RCVBUFFORCE (root) is not capped by net.core.rmem_max.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20) != nil {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	}
	s := &loSock{fd: fd, ifindex: ifi.Index}
	t.Cleanup(func() { unix.Close(fd) })
	return s
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// onlyUDPTo attaches a classic BPF filter that keeps only UDP datagrams to port (IPv4 without
// options, or IPv6 without extension headers, behind lo's 14-byte Ethernet header). Without it
// the capture socket also queues every other test's loopback traffic (go test runs packages in
// parallel) and overflows under load, losing the frames this test is about.
func (s *loSock) onlyUDPTo(t testing.TB, port uint16) {
	t.Helper()
	p := uint32(port)
	prog := []unix.SockFilter{
		{Code: 0x28, K: 12},                   // 0: ldh [12] (EtherType)
		{Code: 0x15, Jt: 0, Jf: 4, K: 0x800},  // 1: IPv4? else 6
		{Code: 0x30, K: 23},                   // 2: ldb [23] (IPv4 protocol)
		{Code: 0x15, Jt: 0, Jf: 8, K: 17},     // 3: UDP? else drop
		{Code: 0x28, K: 36},                   // 4: ldh [36] (UDP dst port, IHL 5)
		{Code: 0x15, Jt: 5, Jf: 6, K: p},      // 5: port? accept : drop
		{Code: 0x15, Jt: 0, Jf: 5, K: 0x86dd}, // 6: IPv6? else drop
		{Code: 0x30, K: 20},                   // 7: ldb [20] (IPv6 next header)
		{Code: 0x15, Jt: 0, Jf: 3, K: 17},     // 8: UDP? else drop
		{Code: 0x28, K: 56},                   // 9: ldh [56] (UDP dst port)
		{Code: 0x15, Jt: 0, Jf: 1, K: p},      // 10: port? accept : drop
		{Code: 0x06, K: 0x40000},              // 11: accept
		{Code: 0x06, K: 0},                    // 12: drop
	}
	fp := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.SetsockoptSockFprog(s.fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &fp); err != nil {
		t.Fatal("SO_ATTACH_FILTER:", err)
	}
}

// capture returns the IP packets (Ethernet header stripped) seen on lo as incoming frames
// (PACKET_HOST), until want frames matched keep or the deadline passed.
func (s *loSock) capture(want int, d time.Duration, keep func(ip []byte) bool) [][]byte {
	var out [][]byte
	buf := make([]byte, 70000)
	deadline := time.Now().Add(d)
	for len(out) < want && time.Now().Before(deadline) {
		n, from, err := unix.Recvfrom(s.fd, buf, 0)
		if err != nil {
			continue // timeout tick
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok || ll.Pkttype == unix.PACKET_OUTGOING || n < 14 {
			continue
		}
		ip := buf[14:n]
		if keep(ip) {
			out = append(out, append([]byte(nil), ip...))
		}
	}
	return out
}

// inject sends an IP packet into the local stack as it is. IPv6 goes as an Ethernet frame on lo
// through the AF_PACKET socket. IPv4 goes through a raw IP_HDRINCL socket, because a frame with a
// 127/8 source injected on lo is a martian to ip_route_input (net.ipv4.conf.lo.route_localnet=0);
// the kernel keeps a non-zero ID and the addresses and only rewrites the header checksum.
func (s *loSock) inject(t testing.TB, ip []byte) {
	t.Helper()
	if ip[0]>>4 == 4 {
		if binary.BigEndian.Uint16(ip[4:]) == 0 {
			t.Fatal("raw IPv4 injection needs a non-zero ID")
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.Sendto(fd, ip, 0, &unix.SockaddrInet4{Addr: [4]byte(ip[16:20])}); err != nil {
			t.Fatal(err)
		}
		return
	}
	et := uint16(0x0800)
	if ip[0]>>4 == 6 {
		et = 0x86DD
	}
	frame := make([]byte, 14+len(ip))
	binary.BigEndian.PutUint16(frame[12:], et)
	copy(frame[14:], ip)
	if err := unix.Sendto(s.fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: s.ifindex, Protocol: htons(et)}); err != nil {
		t.Fatal(err)
	}
}

func udpTo(ip []byte, port uint16) bool {
	switch ip[0] >> 4 {
	case 4:
		return len(ip) >= 28 && ip[9] == 17 && binary.BigEndian.Uint16(ip[22:]) == port
	case 6:
		return len(ip) >= 48 && ip[6] == 17 && binary.BigEndian.Uint16(ip[42:]) == port
	}
	return false
}

// TestLoopbackCaptureICRC proves the UDP link's assumption about the IP header the kernel
// writes: it captures what the link sends off lo and checks every frame's ICRC against the
// real header bytes, plus ID 0 / DF / TTL / TOS for IPv4.
func TestLoopbackCaptureICRC(t *testing.T) {
	for _, fam := range []netip.Addr{lo4, lo6} {
		t.Run(fam.String(), func(t *testing.T) {
			cap := openLo(t)
			a := listen(t, fam, UDPOptions{})
			b := listen(t, fam, UDPOptions{})
			const N = 64
			var pkts []Packet
			ops := []wire.Opcode{wire.RCSendOnly, wire.RCRDMAWriteOnly, wire.RCAcknowledge, wire.UDSendOnly, wire.RCRDMAReadResponseMiddle}
			for i := range N {
				op := ops[i%len(ops)]
				n := (i * 97) % 4097
				if !op.Is(wire.HasPayload) {
					n = 0
				}
				if op == wire.UDSendOnly {
					n = wire.MADLen
				}
				pk, err := wire.Layout(make([]byte, MaxPacket), op, n)
				if err != nil {
					t.Fatal(err)
				}
				pk.BTH().SetPSN(wire.PSN(i))
				pk.BTH().SetDestQP(0x11)
				for j := range pk.Payload() {
					pk.Payload()[j] = byte(j * i)
				}
				pkts = append(pkts, Packet{Dst: b.LocalAddrPort(), TrafficClass: uint8(i % 8 * 4), Buf: pk.Bytes()})
			}
			cap.onlyUDPTo(t, b.LocalAddrPort().Port())
			done := make(chan [][]byte)
			go func() {
				done <- cap.capture(N, 10*time.Second, func(ip []byte) bool { return udpTo(ip, b.LocalAddrPort().Port()) })
			}()
			time.Sleep(20 * time.Millisecond)
			for i := 0; i < N; i += 16 {
				if n, err := a.Send(pkts[i : i+16]); n != 16 || err != nil {
					t.Fatal(n, err)
				}
			}
			frames := <-done
			if len(frames) != N {
				t.Fatalf("captured %d of %d frames", len(frames), N)
			}
			recvN(t, b, N, 5*time.Second)
			verified := 0
			for _, ip := range frames {
				e, hl, plen, err := wire.ParseEncap(ip)
				if err != nil {
					t.Fatal(err)
				}
				pkt := ip[hl : hl+plen]
				psn := wire.BTH(pkt).PSN()
				sent := pkts[psn]
				got, err := wire.ICRCFromHeaders(ip[:hl-8], ip[hl-8:hl], pkt)
				if err != nil || got != binary.LittleEndian.Uint32(pkt[len(pkt)-4:]) {
					t.Fatalf("PSN %d: ICRC of captured frame does not match its header (%v)", psn, err)
				}
				if string(pkt) != string(sent.Buf) {
					t.Fatalf("PSN %d: captured bytes differ from sent", psn)
				}
				if e.TrafficClass != sent.TrafficClass {
					t.Fatalf("PSN %d: TOS %d want %d", psn, e.TrafficClass, sent.TrafficClass)
				}
				if e.HopLimit != 64 {
					t.Fatalf("TTL/hop limit %d", e.HopLimit)
				}
				if fam.Is4() && (e.IPv4ID != 0 || e.IPv4NoDF) {
					t.Fatalf("IPv4 ID %#x DF %v: kernel did not send ID 0 with DF", e.IPv4ID, !e.IPv4NoDF)
				}
				verified++
			}
			t.Logf("%s: %d frames captured off lo, %d ICRCs verified against the real IP header", fam, len(frames), verified)
		})
	}
}

// rxeFrame builds an IP packet the way kernel rxe does: IPv4 with a random ID, DF and UDP
// checksum 0, or IPv6 with UDP checksum 0; the ICRC covers that exact header.
func rxeFrame(t testing.TB, src, dst netip.AddrPort, id uint16, psn uint32, n int) []byte {
	t.Helper()
	p := mkSend(t, dst, psn, n)
	e := wire.Encap{Src: src, Dst: dst, IPv4ID: id, HopLimit: 64}
	e.PutICRC(p.Buf)
	ip := make([]byte, e.HeaderLen()+len(p.Buf))
	if _, err := e.PutHeaders(ip, p.Buf); err != nil {
		t.Fatal(err)
	}
	copy(ip[e.HeaderLen():], p.Buf)
	return ip
}

// TestUDPAcceptsRxeFrames injects rxe-style frames on lo: IPv4 with varying IDs (recovered from
// the ICRC) and IPv6 with a zero UDP checksum (UDP_NO_CHECK6_RX); corrupted ones are dropped and
// counted.
func TestUDPAcceptsRxeFrames(t *testing.T) {
	for _, fam := range []netip.Addr{lo4, lo6} {
		t.Run(fam.String(), func(t *testing.T) {
			inj := openLo(t)
			b := listen(t, fam, UDPOptions{})
			src := netip.AddrPortFrom(fam, 0xC123)
			const N = 40
			for i := range N {
				ip := rxeFrame(t, src, b.LocalAddrPort(), uint16(0x9E37*i+11)|1, uint32(i), i*13)
				if i%4 == 3 { // corrupt one payload/header byte after the ICRC was computed
					ip[len(ip)-5-i%7] ^= 0x20
				}
				inj.inject(t, ip)
			}
			want := N - N/4
			got := recvN(t, b, want, 10*time.Second)
			for _, p := range got {
				if wire.BTH(p.Buf).PSN()%4 == 3 {
					t.Fatal("corrupted packet accepted")
				}
				if p.Src != src {
					t.Fatal(p.Src)
				}
			}
			deadline := time.Now().Add(2 * time.Second)
			for b.Stats().RxICRCDrops < N/4 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if st := b.Stats(); st.RxICRCDrops != N/4 || st.RxPackets != uint64(want) {
				t.Fatalf("%+v", st)
			}
		})
	}
}

// TestUDPGROSplit sends UDP GSO super-packets (UDP_SEGMENT) from a plain socket over lo to a
// GRO-enabled link: lo delivers them unsegmented with a gso_size cmsg, and the link must split
// them and verify every segment.
func TestUDPGROSplit(t *testing.T) {
	b := listen(t, lo4, UDPOptions{GRO: true})
	if !b.GRO() {
		t.Skip("kernel without UDP_GRO")
	}
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	src := c.LocalAddr().(*net.UDPAddr).AddrPort()
	const segs, payload = 8, 1024
	var all []byte
	for i := range segs {
		p := mkSend(t, b.LocalAddrPort(), uint32(i), payload)
		e := wire.Encap{Src: src, Dst: b.LocalAddrPort(), IPv4ID: uint16(i * 7)} // any ID: recovered
		e.PutICRC(p.Buf)
		all = append(all, p.Buf...)
	}
	segLen := len(all) / segs
	oob := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafePointer(&oob[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(oob[unix.CmsgLen(0):], uint16(segLen))
	if _, _, err := c.WriteMsgUDPAddrPort(all, oob, b.LocalAddrPort()); err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOPROTOOPT) || os.IsPermission(err) {
			t.Skip("no UDP_SEGMENT:", err)
		}
		t.Fatal(err)
	}
	got := recvN(t, b, segs, 5*time.Second)
	for i, p := range got {
		if wire.BTH(p.Buf).PSN() != wire.PSN(i) || len(p.Buf) != segLen {
			t.Fatalf("segment %d: psn %d len %d", i, wire.BTH(p.Buf).PSN(), len(p.Buf))
		}
	}
	if st := b.Stats(); st.RxPackets != segs || st.RxICRCDrops != 0 {
		t.Fatalf("%+v", st)
	}
}

// TestUDPGSO: a GSO link sends runs of same-size packets to one loopback destination as
// super-packets; receivers with and without GRO get every packet, in order, intact, with its
// addresses and traffic class. Runs break where the destination, the traffic class or the size
// changes (a shorter packet ends a run).
func TestUDPGSO(t *testing.T) {
	for _, tc := range []struct {
		name string
		addr netip.Addr
		gro  bool
	}{{"v4", lo4, false}, {"v4-gro", lo4, true}, {"v6", lo6, false}, {"v6-gro", lo6, true}} {
		t.Run(tc.name, func(t *testing.T) {
			a := listen(t, tc.addr, UDPOptions{GSO: true})
			if !a.GSO() {
				t.Skip("kernel without UDP_SEGMENT")
			}
			b := listen(t, tc.addr, UDPOptions{GRO: tc.gro})
			c := listen(t, tc.addr, UDPOptions{GRO: tc.gro})
			var toB, toC, all []Packet
			psn := uint32(0)
			add := func(dst *UDP, n, payload int, tcls uint8) {
				for range n {
					p := mkSend(t, dst.LocalAddrPort(), psn, payload)
					p.TrafficClass = tcls
					psn++
					all = append(all, p)
					if dst == b {
						toB = append(toB, p)
					} else {
						toC = append(toC, p)
					}
				}
			}
			add(b, 20, 4096, 0) // one run (more than one batch of 32 with what follows)
			add(b, 1, 100, 0)   // a shorter last segment joins it
			add(b, 3, 1024, 0)  // a new run: the previous one ended with a shorter packet
			add(b, 3, 1024, 8)  // traffic class changes
			add(c, 5, 1024, 0)  // destination changes
			for i := range 6 {  // alternating destinations: no runs
				if i%2 == 0 {
					add(b, 1, 512, 0)
				} else {
					add(c, 1, 512, 0)
				}
			}
			add(b, 70, 2048, 0) // longer than gsoMaxSegs-sized and byte-limited runs
			if n, err := a.Send(all); n != len(all) || err != nil {
				t.Fatal(n, err)
			}
			check := func(rx *UDP, want []Packet) {
				t.Helper()
				got := recvN(t, rx, len(want), 10*time.Second)
				for i, p := range got {
					if string(p.Buf) != string(want[i].Buf) {
						t.Fatalf("packet %d differs (psn %d, want %d)", i, wire.BTH(p.Buf).PSN(), wire.BTH(want[i].Buf).PSN())
					}
					if p.Src != a.LocalAddrPort() || p.Dst != rx.LocalAddrPort() || p.TrafficClass != want[i].TrafficClass {
						t.Fatalf("packet %d: %v -> %v tc %d", i, p.Src, p.Dst, p.TrafficClass)
					}
				}
				if st := rx.Stats(); st.RxICRCDrops != 0 || st.RxMalformedDrops != 0 {
					t.Fatalf("receiver %+v", st)
				}
				if tc.gro && rx == b && rx.Stats().RxGROMessages == 0 {
					t.Errorf("GRO receiver saw no coalesced datagram: %+v", rx.Stats())
				}
			}
			check(b, toB)
			check(c, toC)
			st := a.Stats()
			if st.TxPackets != uint64(len(all)) || st.TxGSOMessages == 0 || st.TxErrors != 0 {
				t.Fatalf("sender %+v", st)
			}
			// 20+1 | 3 | 3 | 5 | 6 singles | 70 in runs of at most 31 (64 KiB / 2,092 bytes):
			// far fewer messages than packets.
			if st.TxGSOMessages > 10 {
				t.Errorf("%d super-packets for %d packets", st.TxGSOMessages, len(all))
			}
		})
	}
}

// TestUDPCloseReleasesSocket: Close ends a waiting receive with net.ErrClosed and releases the
// descriptor (no leak over many links), and a failed bind has the shape net.ListenPacket gives
// it (a *net.OpError whose errno callers test), which internal/stack.ListenCause relies on.
// Guards any change of how the link owns its socket (an experiment with a blocking socket of
// its own, outside the netpoller, was measured and not kept: see transport/softroce/link/udp.go).
func TestUDPCloseReleasesSocket(t *testing.T) {
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip("no /proc/self/fd:", err)
		}
		return len(ents)
	}
	before := fds()
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		u, err := ListenUDP(ctx, netip.AddrPortFrom(lo4, 0), UDPOptions{GRO: true})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		closeUnblocksRecv(t, u, 4)
		if _, err := u.Recv(recvBufs(1)); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Recv after Close: %v", err)
		}
	}
	if after := fds(); after > before {
		t.Fatalf("%d descriptors open after 20 links were closed, %d before", after, before)
	}

	u := listen(t, lo4, UDPOptions{})
	_, err := ListenUDP(context.Background(), u.LocalAddrPort(), UDPOptions{})
	var oe *net.OpError
	if !errors.Is(err, unix.EADDRINUSE) || !errors.As(err, &oe) || oe.Op != "listen" {
		t.Fatalf("bind to a port in use: %v (%T)", err, err)
	}
}

// waiverPair returns two UDP links on 127.0.0.1 (GSO and GRO as gso), b waiving the ICRC for
// QP 0x11, and b's address.
func waiverPair(t *testing.T, gso bool) (a, b *UDP, dst netip.AddrPort) {
	t.Helper()
	opts := UDPOptions{GSO: gso, GRO: gso}
	a, b = listen(t, lo4, opts), listen(t, lo4, opts)
	b.WaiveICRC(func(qpn uint32) bool { return qpn == 0x11 })
	return a, b, b.LocalAddrPort()
}

// TestUDPWaiveICRC: a NoICRC packet leaves with a zero ICRC field (also inside a GSO
// super-packet); the receiving link accepts a zero field unchecked only for a destination QP
// its predicate waives, and checks everything else as before: a zero field to another QP and
// a wrong ICRC to a waived QP are ICRC drops, a correct ICRC to a waived QP is accepted without
// counting as waived.
func TestUDPWaiveICRC(t *testing.T) {
	for _, gso := range []bool{false, true} {
		t.Run(fmt.Sprintf("gso=%v", gso), func(t *testing.T) {
			a, b, dst := waiverPair(t, gso)
			var pkts []Packet
			for i := range 4 {
				p := mkSend(t, dst, uint32(i), 256)
				p.NoICRC = true
				pkts = append(pkts, p)
			}
			if n, err := a.Send(pkts); n != len(pkts) || err != nil {
				t.Fatal(n, err)
			}
			got := recvN(t, b, len(pkts), 5*time.Second)
			for i, p := range got {
				if icrc := p.Buf[len(p.Buf)-4:]; !bytes.Equal(icrc, []byte{0, 0, 0, 0}) {
					t.Fatalf("packet %d: ICRC field % x, want zero", i, icrc)
				}
				if !bytes.Equal(p.Buf[:len(p.Buf)-4], pkts[i].Buf[:len(pkts[i].Buf)-4]) {
					t.Fatalf("packet %d differs", i)
				}
			}
			if st := b.Stats(); st.RxICRCWaived != 4 || st.RxICRCDrops != 0 {
				t.Fatalf("after 4 waived packets: %+v", st)
			}

			// A zero ICRC to a QP that did not waive it.
			other := mkSend(t, dst, 9, 256)
			other.NoICRC = true
			wire.BTH(other.Buf).SetDestQP(0x12)
			// A wrong ICRC to the waived QP (the sender computes it, then a bit flips).
			wrong := mkSend(t, dst, 10, 256)
			// A correct ICRC to the waived QP.
			good := mkSend(t, dst, 11, 256)
			if n, err := a.Send([]Packet{other}); n != 1 || err != nil {
				t.Fatal(n, err)
			}
			raw, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(dst))
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			e := wire.Encap{Src: netip.AddrPortFrom(lo4, uint16(raw.LocalAddr().(*net.UDPAddr).Port)), Dst: dst}
			e.PutICRC(wrong.Buf)
			wrong.Buf[len(wrong.Buf)-1] ^= 1
			if _, err := raw.Write(wrong.Buf); err != nil {
				t.Fatal(err)
			}
			// Last: once it is received, the two before it have been looked at (loopback
			// delivers each datagram within its send).
			if n, err := a.Send([]Packet{good}); n != 1 || err != nil {
				t.Fatal(n, err)
			}
			got = recvN(t, b, 1, 5*time.Second)
			if psn := wire.BTH(got[0].Buf).PSN(); psn != 11 {
				t.Fatalf("accepted PSN %d, want only 11 (the correct ICRC)", psn)
			}
			if st := b.Stats(); st.RxICRCWaived != 4 || st.RxICRCDrops != 2 {
				t.Fatalf("want 4 waived, 2 ICRC drops (zero field to QP 0x12, wrong ICRC to QP 0x11): %+v", st)
			}
		})
	}
}

// byRef splits a flat packet into the form of a payload by reference: Buf the headers and the
// ICRC field, Payload a copy of the payload (in memory of its own, as an MR's would be).
func byRef(t testing.TB, p Packet) Packet {
	t.Helper()
	wp, err := wire.Parse(p.Buf)
	if err != nil {
		t.Fatal(err)
	}
	h := wp.HeaderLen()
	q := p
	q.Payload = append([]byte(nil), p.Buf[h:len(p.Buf)-wire.ICRCLen]...)
	q.Buf = append(append([]byte(nil), p.Buf[:h]...), 0, 0, 0, 0)
	q.NoICRC = true
	return q
}

// Packets with their payload by reference (Packet.Payload: headers, payload, ICRC field as
// three iovecs) arrive as the same packets flat, alone or in GSO messages mixed with flat ones,
// and count their whole length; without NoICRC or with pad bytes they are refused.
func TestUDPPayloadByRef(t *testing.T) {
	for _, gso := range []bool{false, true} {
		t.Run(fmt.Sprintf("gso=%v", gso), func(t *testing.T) {
			a, b, dst := waiverPair(t, gso)
			// Equal sizes (GSO puts them in one message, pieces and flat packets mixed), then
			// a shorter one by reference that ends the message.
			var flat, pkts []Packet
			sizes := []int{1024, 1024, 1024, 1024, 1024, 512}
			var want int
			for i, n := range sizes {
				p := mkSend(t, dst, uint32(i), n)
				p.NoICRC = true
				flat = append(flat, p)
				want += len(p.Buf)
				if i%2 == 0 || i == len(sizes)-1 {
					p = byRef(t, p)
				}
				pkts = append(pkts, p)
			}
			if n, err := a.Send(pkts); n != len(pkts) || err != nil {
				t.Fatal(n, err)
			}
			got := recvN(t, b, len(pkts), 5*time.Second)
			for i, p := range got {
				if !bytes.Equal(p.Buf, flat[i].Buf) {
					t.Fatalf("packet %d (by reference: %v) arrived as % x..., want % x...", i,
						pkts[i].Payload != nil, p.Buf[:min(48, len(p.Buf))], flat[i].Buf[:48])
				}
			}
			if st := b.Stats(); st.RxICRCWaived != uint64(len(sizes)) || st.RxICRCDrops != 0 || st.RxMalformedDrops != 0 {
				t.Fatalf("receiver: %+v", st)
			}
			if st := a.Stats(); st.TxBytes != uint64(want) || st.TxPackets != uint64(len(sizes)) {
				t.Fatalf("sender counted %d packets, %d bytes, want %d, %d", st.TxPackets, st.TxBytes, len(sizes), want)
			}
			if gso {
				if st := a.Stats(); st.TxGSOMessages == 0 {
					t.Fatalf("no GSO message: %+v", st)
				}
			}

			// Refused, with what comes before them sent: a payload by reference without
			// NoICRC (its ICRC would be computed over the headers only), and one whose length
			// needs pad bytes.
			good := byRef(t, mkSend(t, dst, 20, 256))
			noWaiver := byRef(t, mkSend(t, dst, 21, 256))
			noWaiver.NoICRC = false
			odd := byRef(t, mkSend(t, dst, 22, 256))
			odd.Payload = odd.Payload[:255]
			for _, bad := range []Packet{noWaiver, odd} {
				n, err := a.Send([]Packet{good, bad})
				if n != 1 || !errors.Is(err, ErrPayloadRef) {
					t.Fatalf("Send: %d, %v; want 1, ErrPayloadRef", n, err)
				}
			}
			recvN(t, b, 2, 5*time.Second)
		})
	}
}

// TestPayloadRefRefused: links that record or copy whole packets take no payload by reference.
func TestPayloadRefRefused(t *testing.T) {
	x, y := NewPipe(lo4, netip.MustParseAddr("127.0.0.2"), PipeConfig{})
	defer x.Close()
	defer y.Close()
	p := byRef(t, mkSend(t, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), UDPPort), 1, 256))
	if n, err := x.Send([]Packet{p}); n != 0 || !errors.Is(err, ErrPayloadRef) {
		t.Fatalf("MemLink: %d, %v; want 0, ErrPayloadRef", n, err)
	}
	tap, err := WithPcap(x, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	flat := mkSend(t, p.Dst, 2, 256)
	if n, err := tap.Send([]Packet{flat, p}); n != 1 || !errors.Is(err, ErrPayloadRef) {
		t.Fatalf("pcap: %d, %v; want 1, ErrPayloadRef", n, err)
	}
}
