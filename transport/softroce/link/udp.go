//go:build linux

package link

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/srpd/srpd/transport/softroce/wire"
)

// UDP is a Link over a UDP socket (RoCEv2 on the host's IP stack). See ListenUDP.
//
// What goes on the wire. Packets are sent with sendmmsg from an unconnected socket with
// IP_MTU_DISCOVER = IP_PMTUDISC_DO. Linux then sets DF and, because the socket is unconnected
// and DF is set without ignore_df, writes IPv4 Identification 0
// (torvalds/linux:include/net/ip.h ip_select_ident_segs; a connected socket uses a per-socket
// counter and the default IP_PMTUDISC_WANT a hashed ID). TTL is IP_TTL (UDPOptions.TTL), TOS
// is the socket default 0 or Packet.TrafficClass through a per-packet IP_TOS cmsg, and the source
// address is the bound address or Packet.Src.Addr() through an IP_PKTINFO cmsg. The ICRC is
// therefore computed over: IHL 5, total length, ID 0, DF, offset 0, UDP, src, dst, the link's
// port, Packet.Dst's port — TestLoopbackCaptureICRC proves it against frames captured off lo.
// IPv6 has no ID; the kernel writes a real UDP checksum (we do not set UDP_NO_CHECK6_TX: rxe's
// receive socket is created with use_udp6_rx_checksums = 0 and so accepts zero and valid
// checksums alike — torvalds/linux:drivers/infiniband/sw/rxe/rxe_net.c rxe_setup_udp_tunnel,
// net/ipv6/ip6_udp_tunnel.c udp_sock_create6 — and a real checksum is what RFC 6935/6936 ask of
// non-tunnel senders).
//
// UDP GSO (UDP_SEGMENT, UDPOptions.GSO) is used only towards loopback addresses and towards
// peers that accept any IPv4 Identification (Packet.Segmentable: an srpd, negotiated through CM
// ECE). The segments' IPv4 IDs are chosen by whoever segments (inet_gso_segment increments
// from the first ID in software; a NIC doing USO follows its own rule), so the ICRC, computed
// for ID 0, covers only the first; receivers that recover the ID accept them all, but rxe does
// not: it checks the full ICRC. Every other datagram leaves alone with ID 0.
//
// What is accepted. IP_PKTINFO/IPV6_RECVPKTINFO give the destination address (needed for the
// ICRC when bound to a wildcard), IP_RECVTOS/IPV6_RECVTCLASS the traffic class, SO_RXQ_OVFL the
// socket's drop count. UDP_NO_CHECK6_RX (torvalds/linux:include/uapi/linux/udp.h: TX 101, RX 102)
// accepts the zero UDP checksum rxe sends over IPv6. IPv4 packets are checked by recovering the
// sender's Identification from the ICRC (wire.Encap.RecoverIPv4ID; rxe varies it), IPv6 ones by
// plain ICRC verification; failures and malformed datagrams are dropped and counted.
type UDP struct {
	conn     *net.UDPConn
	rc       syscall.RawConn
	local    netip.AddrPort
	is4      bool
	wild     bool // bound to the unspecified address
	batch    int
	gro      bool
	busyPoll time.Duration // UDPOptions.BusyPoll
	gso      bool          // UDPOptions.GSO and the kernel has UDP_SEGMENT; cleared if a send is refused
	ctr      counters

	closed atomic.Bool

	recvMu sync.Mutex
	rx     mmsgState
	rxFn   func(fd uintptr) bool
	rxN    int // messages requested / received
	// run counts the packets Recv returned since the socket was last found empty (spinRecv;
	// recvMu held).
	run    int
	rxErr  error
	lastOv uint32 // last SO_RXQ_OVFL value
	// GRO state: link-owned buffers and a cursor over received, unsplit data.
	groBufs    [][]byte
	groMsgs    int    // messages in groBufs from the last recvmmsg
	groMsg     int    // current message
	groOff     int    // offset in it
	groStarted bool   // groMeta and groSeg are those of message groMsg
	groMeta    Packet // its addresses and traffic class
	groSeg     int    // its GRO segment size (0: one datagram)

	sendMu sync.Mutex
	tx     mmsgState
	txFn   func(fd uintptr) bool
	txOff  int   // messages sent
	txN    int   // messages prepared
	txPkts []int // txPkts[m]: packets in messages [0, m)
	txGSO  bool  // a prepared message is a GSO super-packet
	txErr  error
}

const (
	ctrlLen   = 128
	groBufLen = 65536
	// gsoMaxSegs is the most segments per super-packet (UDP_MAX_SEGMENTS is 64 before Linux
	// 6.1's 128 — torvalds/linux:include/linux/udp.h) and gsoMaxBytes the most UDP payload.
	gsoMaxSegs  = 64
	gsoMaxBytes = 65507
	defaultTTL  = 64
	defaultSock = 4 << 20
)

type mmsgState struct {
	msgs  []unix.Mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6
	ctrl  [][ctrlLen]byte
}

// newMmsgState prepares n messages with iovPer iovecs each: 1 to receive, 3 to send (a packet
// whose payload is carried by reference is headers, payload, ICRC).
func newMmsgState(n, iovPer int) mmsgState {
	s := mmsgState{
		msgs:  make([]unix.Mmsghdr, n),
		iovs:  make([]unix.Iovec, n*iovPer),
		names: make([]unix.RawSockaddrInet6, n),
		ctrl:  make([][ctrlLen]byte, n),
	}
	for i := range s.msgs {
		h := &s.msgs[i].Hdr
		h.Name = (*byte)(unsafe.Pointer(&s.names[i]))
		h.Iov = &s.iovs[i]
		h.SetIovlen(1)
	}
	return s
}

// ListenUDP opens a UDP link bound to addr (IPv4 or IPv6, possibly unspecified; port 0 picks an
// ephemeral port, UDPPort is the RoCEv2 port). The link uses one socket and one family: an IPv6
// link is IPV6_V6ONLY. ctx bounds the socket setup only.
func ListenUDP(ctx context.Context, addr netip.AddrPort, opts UDPOptions) (*UDP, error) {
	return listenUDP(ctx, addr, opts, false)
}

// listenUDP is ListenUDP; reuse sets SO_REUSEPORT before the bind (ListenUDPQueues).
func listenUDP(ctx context.Context, addr netip.AddrPort, opts UDPOptions, reuse bool) (*UDP, error) {
	a := addr.Addr().Unmap()
	if !a.IsValid() {
		return nil, ErrAddress
	}
	addr = netip.AddrPortFrom(a, addr.Port())
	batch := opts.BatchSize
	if batch <= 0 {
		batch = 32
	}
	batch = min(batch, 1024)
	ttl := opts.TTL
	if ttl <= 0 || ttl > 255 {
		ttl = defaultTTL
	}
	sockBuf := opts.SocketBuffer
	if sockBuf <= 0 {
		sockBuf = defaultSock
	}
	is4 := a.Is4()
	network := "udp6"
	if is4 {
		network = "udp4"
	}
	gro := opts.GRO
	var sockErr error
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		err := c.Control(func(fd uintptr) {
			sockErr = setupSocket(int(fd), is4, ttl, sockBuf, &gro, reuse)
		})
		if err != nil {
			return err
		}
		return sockErr
	}}
	pc, err := lc.ListenPacket(ctx, network, addr.String())
	if err != nil {
		return nil, err
	}
	conn := pc.(*net.UDPConn)
	rc, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, err
	}
	local := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	gso := opts.GSO
	if gso {
		// UDP_SEGMENT is readable where the kernel supports it (0 = no default segment size).
		_ = rc.Control(func(fd uintptr) {
			if _, err := unix.GetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT); err != nil {
				gso = false
			}
		})
	}
	u := &UDP{
		conn: conn, rc: rc, local: local, is4: is4, wild: a.IsUnspecified(), batch: batch, gro: gro, gso: gso, busyPoll: max(opts.BusyPoll, 0),
		rx: newMmsgState(batch, 1), tx: newMmsgState(batch, 3), txPkts: make([]int, batch+1),
	}
	if gro {
		u.groBufs = make([][]byte, batch)
		backing := make([]byte, batch*groBufLen)
		for i := range u.groBufs {
			u.groBufs[i] = backing[i*groBufLen : (i+1)*groBufLen : (i+1)*groBufLen]
		}
	}
	u.rxFn = u.recvmmsg
	u.txFn = u.sendmmsg
	return u, nil
}

func setupSocket(fd int, is4 bool, ttl, sockBuf int, gro *bool, reuse bool) error {
	set := func(level, opt, v int) error { return unix.SetsockoptInt(fd, level, opt, v) }
	if reuse {
		if err := set(unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
			return fmt.Errorf("SO_REUSEPORT: %w", err)
		}
	}
	if set(unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, sockBuf) != nil {
		_ = set(unix.SOL_SOCKET, unix.SO_RCVBUF, sockBuf)
	}
	if set(unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sockBuf) != nil {
		_ = set(unix.SOL_SOCKET, unix.SO_SNDBUF, sockBuf)
	}
	_ = set(unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1) // best effort: drop counter
	var errs []error
	if is4 {
		errs = append(errs,
			set(unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO), // DF + ID 0
			set(unix.IPPROTO_IP, unix.IP_TTL, ttl),
			set(unix.IPPROTO_IP, unix.IP_TOS, 0),
			set(unix.IPPROTO_IP, unix.IP_PKTINFO, 1),
			set(unix.IPPROTO_IP, unix.IP_RECVTOS, 1))
	} else {
		errs = append(errs,
			set(unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1),
			set(unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO),
			set(unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, ttl),
			set(unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1),
			set(unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1),
			// Accept the zero UDP checksum rxe sends over IPv6 (include/uapi/linux/udp.h
			// UDP_NO_CHECK6_RX = 102).
			set(unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_RX, 1))
	}
	if *gro && set(unix.IPPROTO_UDP, unix.UDP_GRO, 1) != nil {
		*gro = false // kernel without UDP_GRO: plain datagrams
	}
	return errors.Join(errs...)
}

// LocalAddr returns the bound address (unspecified for a wildcard link).
func (u *UDP) LocalAddr() netip.Addr { return u.local.Addr() }

// LocalAddrPort returns the bound address and port (the actual port when 0 was asked).
func (u *UDP) LocalAddrPort() netip.AddrPort { return u.local }

// BatchSize returns the recvmmsg/sendmmsg batch size.
func (u *UDP) BatchSize() int { return u.batch }

// GRO reports whether UDP_GRO is in use.
func (u *UDP) GRO() bool { return u.gro }

// GSO reports whether UDP GSO is in use (for loopback destinations and Segmentable packets).
func (u *UDP) GSO() bool {
	u.sendMu.Lock()
	defer u.sendMu.Unlock()
	return u.gso
}

// Stats returns a snapshot of the counters.
func (u *UDP) Stats() Stats { return u.ctr.snapshot() }

// WaiveICRC implements ICRCWaiver: the UDP checksum, which the sending kernel computes (or its
// NIC) and the receiving one verifies (or its NIC), covers every byte the ICRC covers but the
// masked IP and BTH fields, and a loopback or veth datagram never leaves memory.
func (u *UDP) WaiveICRC(f func(destQPN uint32) bool) { u.ctr.setWaiver(f) }

// Close closes the socket; blocked Send/Recv calls return net.ErrClosed.
func (u *UDP) Close() error {
	if u.closed.Swap(true) {
		return nil
	}
	return u.conn.Close()
}

// srcFor returns the source address a packet leaves with.
func (u *UDP) srcFor(p *Packet) (netip.Addr, bool) {
	if a := p.Src.Addr().Unmap(); a.IsValid() && !a.IsUnspecified() {
		return a, a.Is4() == u.is4
	}
	if u.wild {
		return netip.Addr{}, false
	}
	return u.local.Addr(), true
}

// Encap returns the encapsulation u gives p on the wire.
func (u *UDP) Encap(p *Packet) wire.Encap {
	src, _ := u.srcFor(p)
	dst := netip.AddrPortFrom(p.Dst.Addr().Unmap(), p.Dst.Port())
	if !u.is4 {
		dst = p.Dst
	}
	return wire.Encap{Src: netip.AddrPortFrom(src, u.local.Port()), Dst: dst, TrafficClass: p.TrafficClass}
}

func putCmsg(b []byte, level, typ int, data []byte) int {
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = int32(level), int32(typ)
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[unix.CmsgLen(0):], data)
	return unix.CmsgSpace(len(data))
}

// Send implements Link. It computes each packet's ICRC for the header described on UDP and
// hands the batch to sendmmsg, waiting (through the Go netpoller) while the socket buffer is
// full.
func (u *UDP) Send(pkts []Packet) (int, error) {
	if u.closed.Load() {
		return 0, net.ErrClosed
	}
	u.sendMu.Lock()
	defer u.sendMu.Unlock()
	sent := 0
	for sent < len(pkts) {
		nm, err := u.prepareSend(pkts[sent:])
		if nm > 0 {
			u.txOff, u.txN, u.txErr = 0, nm, nil
			if werr := u.rc.Write(u.txFn); werr != nil && u.txErr == nil {
				u.txErr = werr
			}
			done := u.txPkts[u.txOff]
			if u.txGSO {
				for m := 0; m < u.txOff; m++ {
					if u.txPkts[m+1]-u.txPkts[m] > 1 {
						u.ctr.txGSO.Add(1)
					}
				}
			}
			for i := 0; i < done; i++ {
				u.ctr.txBytes.Add(uint64(pkts[sent+i].Len()))
			}
			u.ctr.txPackets.Add(uint64(done))
			sent += done
			if u.txErr != nil && u.txGSO && !u.closed.Load() &&
				(errors.Is(u.txErr, unix.EIO) || errors.Is(u.txErr, unix.EINVAL) || errors.Is(u.txErr, unix.EOPNOTSUPP)) {
				// The kernel refused a super-packet (no GSO on this path): go on without.
				u.gso = false
				continue
			}
			if u.txErr != nil {
				u.ctr.txErrors.Add(1)
				if u.closed.Load() {
					return sent, net.ErrClosed
				}
				return sent, u.txErr
			}
		}
		if err != nil {
			u.ctr.txErrors.Add(1)
			return sent, err
		}
	}
	return sent, nil
}

// prepareSend fills the tx mmsghdrs for up to batch packets and returns the number of
// messages (u.txPkts maps them to packets); it stops before the first invalid packet and
// returns its error after the valid ones. With GSO, consecutive packets to the same loopback
// destination, source and traffic class share one message when every one but the last has the
// size of the first.
func (u *UDP) prepareSend(pkts []Packet) (int, error) {
	n := min(len(pkts), u.batch)
	nmsg := 0
	u.txPkts[0] = 0
	u.txGSO = false
	var err error
	// The message being built: its first packet, segment size, bytes, and whether it can
	// still take more.
	var (
		first, seg, bytes int
		open              bool
		msrc              netip.Addr
	)
	iov := 0 // next free iovec
	i := 0
	for ; i < n; i++ {
		p := &pkts[i]
		if err = p.checkSend(true); err != nil {
			break
		}
		plen := p.Len()
		src, ok := u.srcFor(p)
		dst := p.Dst.Addr()
		if u.is4 {
			dst = dst.Unmap()
		}
		if !ok || !dst.IsValid() || dst.Is4() != u.is4 || p.Dst.Port() == 0 {
			err = ErrAddress
			break
		}
		if p.NoICRC {
			clear(p.Buf[len(p.Buf)-wire.ICRCLen:])
		} else {
			e := wire.Encap{Src: netip.AddrPortFrom(src, u.local.Port()), Dst: netip.AddrPortFrom(dst, p.Dst.Port())}
			e.PutICRC(p.Buf)
		}

		if open {
			fp := &pkts[first]
			k := i - first
			if fp.Dst == p.Dst && msrc == src && fp.TrafficClass == p.TrafficClass && fp.Segmentable == p.Segmentable &&
				plen <= seg && pkts[i-1].Len() == seg && k < gsoMaxSegs && bytes+plen <= gsoMaxBytes {
				// Append p to the message as one more segment (the kernel cuts segments from
				// the iovecs' concatenation, so a packet in pieces stays one segment).
				bytes += plen
				h := &u.tx.msgs[nmsg-1].Hdr
				nv := u.putIovs(iov, p)
				iov += nv
				h.SetIovlen(int(h.Iovlen) + nv)
				u.txPkts[nmsg] = i + 1
				if k == 1 {
					u.addSegment(nmsg-1, seg)
				}
				continue
			}
		}
		first, seg, bytes, msrc = i, plen, plen, src
		open = u.gso && (dst.IsLoopback() || p.Segmentable)

		m := nmsg
		nmsg++
		u.txPkts[nmsg] = i + 1
		h := &u.tx.msgs[m].Hdr
		h.Iov = &u.tx.iovs[iov]
		nv := u.putIovs(iov, p)
		iov += nv
		h.SetIovlen(nv)
		nm := &u.tx.names[m]
		*nm = unix.RawSockaddrInet6{}
		if u.is4 {
			sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(nm))
			sa.Family = unix.AF_INET
			binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], p.Dst.Port())
			sa.Addr = dst.As4()
			h.Namelen = unix.SizeofSockaddrInet4
		} else {
			nm.Family = unix.AF_INET6
			binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&nm.Port))[:], p.Dst.Port())
			nm.Addr = dst.As16()
			if dst.Is6() && dst.Zone() != "" {
				nm.Scope_id = zoneIndex(dst.Zone())
			}
			h.Namelen = unix.SizeofSockaddrInet6
		}
		// Control: source address (when not the bound one) and traffic class (when not 0).
		c := u.tx.ctrl[m][:]
		off := 0
		if u.wild || src != u.local.Addr() {
			if u.is4 {
				var pi [12]byte // struct in_pktinfo: ifindex, spec_dst, addr
				a := src.As4()
				copy(pi[4:8], a[:])
				off += putCmsg(c[off:], unix.IPPROTO_IP, unix.IP_PKTINFO, pi[:])
			} else {
				var pi [20]byte // struct in6_pktinfo: addr, ifindex
				a := src.As16()
				copy(pi[:16], a[:])
				off += putCmsg(c[off:], unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, pi[:])
			}
		}
		if p.TrafficClass != 0 {
			var v [4]byte
			binary.NativeEndian.PutUint32(v[:], uint32(p.TrafficClass))
			if u.is4 {
				off += putCmsg(c[off:], unix.IPPROTO_IP, unix.IP_TOS, v[:])
			} else {
				off += putCmsg(c[off:], unix.IPPROTO_IPV6, unix.IPV6_TCLASS, v[:])
			}
		}
		if off > 0 {
			h.Control = &u.tx.ctrl[m][0]
		} else {
			h.Control = nil
		}
		h.SetControllen(off)
	}
	return nmsg, err
}

// putIovs points the tx iovecs from index iov at p's bytes and returns how many it used: one
// (Buf), or three for a payload by reference (headers, Payload, ICRC field).
func (u *UDP) putIovs(iov int, p *Packet) int {
	v := u.tx.iovs[iov:]
	if len(p.Payload) == 0 {
		v[0].Base = &p.Buf[0]
		v[0].SetLen(len(p.Buf))
		return 1
	}
	h := len(p.Buf) - wire.ICRCLen
	v[0].Base = &p.Buf[0]
	v[0].SetLen(h)
	v[1].Base = &p.Payload[0]
	v[1].SetLen(len(p.Payload))
	v[2].Base = &p.Buf[h]
	v[2].SetLen(wire.ICRCLen)
	return 3
}

// addSegment turns tx message m into a GSO super-packet of seg-byte segments (UDP_SEGMENT cmsg
// after the ones it has).
func (u *UDP) addSegment(m, seg int) {
	h := &u.tx.msgs[m].Hdr
	off := int(h.Controllen)
	var v [2]byte
	binary.NativeEndian.PutUint16(v[:], uint16(seg))
	off += putCmsg(u.tx.ctrl[m][off:], unix.IPPROTO_UDP, unix.UDP_SEGMENT, v[:])
	h.Control = &u.tx.ctrl[m][0]
	h.SetControllen(off)
	u.txGSO = true
}

func zoneIndex(zone string) uint32 {
	if ifi, err := net.InterfaceByName(zone); err == nil {
		return uint32(ifi.Index)
	}
	return 0
}

// sendmmsg and recvmmsg use RawSyscall6: with MSG_DONTWAIT they never block, so the
// scheduler's bookkeeping of a syscall that might (entersyscall) is not needed, and it costs:
// entering one wakes the runtime's sysmon thread whenever it sleeps, a futex wake per packet
// batch that made up a tenth of the target's CPU time at queue depth 1 (perf). A large GSO send
// keeps its P for the copy, as any Go code would.

// Waiting stays with the Go netpoller. Measured and not kept (2026-12-07): a blocking socket of
// the link's own, outside the netpoller, whose receive sleeps in recvmmsg (MSG_WAITFORONE,
// through Syscall6, SO_RCVTIMEO as the bound, shutdown to wake it on Close). A UDP ping-pong
// of two Go processes on a 2-vCPU VM got faster with it (34 → 26 µs round trip, 21 → 14 µs
// CPU per exchange: one system call per wake-up instead of a recvmmsg finding nothing, two
// epoll_pwait and the recvmmsg that reads), and the target's CPU per 4 KiB read at queue depth
// 1 fell by a fifth, but the NBD benchmark between two processes lost 0-15 % on five of six
// jobs in the same run (`BENCH_B=ecc95c9 OURS="split split@b" bench/bench.sh nbd`, 3 rounds):
// each receive then returns with the first datagram and wakes a thread of its own, where the
// netpoller's later wake-up finds several and runs them on a thread that was awake anyway.

// sendmmsg runs under RawConn.Write: false means "wait until writable".
func (u *UDP) sendmmsg(fd uintptr) bool {
	for u.txOff < u.txN {
		r, e := mmsg(unix.SYS_SENDMMSG, fd, u.tx.msgs[u.txOff:u.txN])
		switch {
		case e == unix.EAGAIN:
			return false
		case e != 0:
			u.txErr = os.NewSyscallError("sendmmsg", e)
			return true
		}
		u.txOff += r
	}
	return true
}

// recvmmsg runs under RawConn.Read: false means "wait until readable".
func (u *UDP) recvmmsg(fd uintptr) bool {
	r, e := mmsg(unix.SYS_RECVMMSG, fd, u.rx.msgs[:u.rxN])
	if e == unix.EAGAIN && u.busyPoll > 0 {
		r, e = u.spinRecv(fd)
	}
	switch {
	case e == unix.EAGAIN:
		return false
	case e != 0:
		u.rxErr = os.NewSyscallError("recvmmsg", e)
		u.rxN = 0
		return true
	}
	u.rxN = r
	return true
}

// spinRecv retries recvmmsg for up to UDPOptions.BusyPoll after it found the socket empty.
// It neither yields the processor (runtime.Gosched) nor the thread (sched_yield) between tries:
// both measured slower (srpbench target against nbd, 4 KiB random reads: yielding to the Go
// scheduler cost 3-10% at queue depth 32, sched_yield as well, and both together undid the
// gain at queue depth 1), and stopping the spin once the thread had been preempted (a gap
// between tries) kept it from ever saving the wake-up that pays.
//
// Only a receive that follows a short run of packets spins (at most spinRun since the socket
// was last found empty): a lone request or its ACK, where the next packet is what the peer
// waits on (queue depth 1). After a longer run the peer is pipelining (a batch of commands,
// a stream of data) and its next packets come when it gets round to them: spinning then only
// takes CPU from the processes that send them (4 KiB random reads at queue depth 32, commands
// coming several to a datagram, with the peer and its client on the same two CPUs: 8 % fewer
// I/Os with the spin than without).
func (u *UDP) spinRecv(fd uintptr) (int, unix.Errno) {
	run := u.run
	u.run = 0
	if run > spinRun {
		u.ctr.rxSpinSkips.Add(1)
		return 0, unix.EAGAIN
	}
	u.ctr.rxSpins.Add(1)
	start := time.Now()
	for !u.closed.Load() {
		r, e := mmsg(unix.SYS_RECVMMSG, fd, u.rx.msgs[:u.rxN])
		if e != unix.EAGAIN {
			if e == 0 {
				u.ctr.rxSpinHits.Add(1)
			}
			return r, e
		}
		if time.Since(start) >= u.busyPoll {
			break
		}
	}
	return 0, unix.EAGAIN
}

// spinRun is the longest run of packets after which an empty receive spins (spinRecv).
const spinRun = 2

// mmsg makes the sendmmsg or recvmmsg call trap on msgs (not empty) with MSG_DONTWAIT, again
// while a signal interrupts it, and returns how many messages it moved.
func mmsg(trap, fd uintptr, msgs []unix.Mmsghdr) (int, unix.Errno) {
	for {
		r, _, e := unix.RawSyscall6(trap, fd, uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)),
			unix.MSG_DONTWAIT, 0, 0)
		if e != unix.EINTR {
			return int(r), e
		}
	}
}

// Recv implements Link.
func (u *UDP) Recv(pkts []Packet) (int, error) { return u.recv(pkts, false) }

// RecvViews implements ViewReceiver: with GRO, the packets of a coalesced datagram are views
// of the link's receive buffer, not copies (one copy of every received byte less; without GRO
// recvmmsg writes into the caller's buffers anyway).
func (u *UDP) RecvViews(pkts []Packet) (int, error) { return u.recv(pkts, true) }

func (u *UDP) recv(pkts []Packet, views bool) (int, error) {
	if ok, err := recvInto(pkts); !ok {
		return 0, err
	}
	u.recvMu.Lock()
	defer u.recvMu.Unlock()
	for {
		if u.closed.Load() {
			return 0, net.ErrClosed
		}
		if u.gro {
			if k := u.drainGRO(pkts, views); k > 0 {
				u.run += k
				return k, nil
			}
		}
		n := min(len(pkts), u.batch)
		for i := 0; i < n; i++ {
			h := &u.rx.msgs[i].Hdr
			if u.gro {
				u.rx.iovs[i].Base = &u.groBufs[i][0]
				u.rx.iovs[i].SetLen(groBufLen)
			} else {
				b := pkts[i].Buf[:MaxPacket]
				u.rx.iovs[i].Base = &b[0]
				u.rx.iovs[i].SetLen(MaxPacket)
			}
			h.Namelen = unix.SizeofSockaddrInet6
			h.Control = &u.rx.ctrl[i][0]
			h.SetControllen(ctrlLen)
			h.Flags = 0
		}
		u.rxN, u.rxErr = n, nil
		if err := u.rc.Read(u.rxFn); err != nil {
			if u.closed.Load() || errors.Is(err, net.ErrClosed) {
				return 0, net.ErrClosed
			}
			return 0, err
		}
		if u.rxErr != nil {
			if u.closed.Load() {
				return 0, net.ErrClosed
			}
			return 0, u.rxErr
		}
		if u.gro {
			u.groMsgs, u.groMsg, u.groOff, u.groStarted = u.rxN, 0, 0, false
			continue
		}
		k := 0
		for i := 0; i < u.rxN; i++ {
			m := &u.rx.msgs[i]
			var p Packet
			gso, ok := u.decodeMeta(i, &p)
			if !ok || m.Hdr.Flags&unix.MSG_TRUNC != 0 || gso != 0 {
				u.ctr.rxMalformed.Add(1)
				continue
			}
			p.Buf = pkts[i].Buf[:m.Len]
			e := wire.Encap{Src: p.Src, Dst: p.Dst}
			if !u.ctr.checkRx(&e, p.Buf) {
				continue
			}
			if k != i {
				pkts[k], pkts[i] = pkts[i], pkts[k]
			}
			pkts[k].Src, pkts[k].Dst, pkts[k].TrafficClass = p.Src, p.Dst, p.TrafficClass
			pkts[k].Buf = pkts[k].Buf[:m.Len]
			u.ctr.rxPackets.Add(1)
			u.ctr.rxBytes.Add(uint64(m.Len))
			k++
		}
		if k > 0 {
			u.run += k
			return k, nil
		}
	}
}

// drainGRO copies segments from the GRO buffers into pkts (with views, points pkts at them) and
// returns how many were accepted.
// Every datagram the kernel delivered is counted exactly once: returned (RxPackets) or dropped
// (RxMalformedDrops, RxICRCDrops).
func (u *UDP) drainGRO(pkts []Packet, views bool) int {
	k := 0
	for k < len(pkts) {
		data, st := u.nextGRO()
		if st == groDone {
			break
		}
		if st == groBadMsg || len(data) > MaxPacket {
			u.ctr.rxMalformed.Add(1)
			continue
		}
		p := &pkts[k]
		p.Src, p.Dst, p.TrafficClass = u.groMeta.Src, u.groMeta.Dst, u.groMeta.TrafficClass
		if views {
			p.Buf = data[:len(data):len(data)]
		} else {
			p.Buf = p.Buf[:len(data)]
			copy(p.Buf, data)
		}
		e := wire.Encap{Src: p.Src, Dst: p.Dst}
		if !u.ctr.checkRx(&e, p.Buf) {
			continue
		}
		u.ctr.rxPackets.Add(1)
		u.ctr.rxBytes.Add(uint64(len(p.Buf)))
		k++
	}
	return k
}

// groStatus says what nextGRO returned.
type groStatus uint8

const (
	groDone   groStatus = iota // no received data left
	groPiece                   // one datagram of a message (u.groMeta holds its addresses)
	groBadMsg                  // a whole message that cannot be split or addressed: drop it
)

// nextGRO returns the next datagram of the messages received into the GRO buffers: the pieces
// of one message tile it exactly (groNext), a zero-length message is one empty piece (so that
// it is counted as malformed, as without GRO), and a message whose metadata is unusable comes
// back whole as groBadMsg: a truncated datagram or truncated control data (MSG_CTRUNC may have
// cost the UDP_GRO cmsg, and then nobody knows where the datagrams start), a length beyond the
// buffer, or an address decodeMeta refuses.
func (u *UDP) nextGRO() ([]byte, groStatus) {
	for u.groMsg < u.groMsgs {
		i := u.groMsg
		m := &u.rx.msgs[i]
		buf := u.groBufs[i]
		if u.groOff == 0 && !u.groStarted {
			u.groStarted = true
			u.groMeta = Packet{}
			gso, ok := u.decodeMeta(i, &u.groMeta)
			if !ok || m.Hdr.Flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || int64(m.Len) > int64(len(buf)) {
				u.groMsg, u.groStarted = u.groMsg+1, false
				return buf[:min(int64(m.Len), int64(len(buf)))], groBadMsg
			}
			u.groSeg = gso
			if gso > 0 && gso < int(m.Len) {
				u.ctr.rxGRO.Add(1)
			}
			if m.Len == 0 {
				u.groMsg, u.groStarted = u.groMsg+1, false
				return buf[:0], groPiece
			}
		}
		total := int(m.Len)
		if u.groOff >= total {
			u.groMsg, u.groOff, u.groStarted = u.groMsg+1, 0, false
			continue
		}
		off := u.groOff
		u.groOff = groNext(total, off, u.groSeg)
		return buf[off:u.groOff], groPiece
	}
	return nil, groDone
}

// groNext returns the end of the datagram that starts at off (0 <= off < total) in a receive
// buffer of total bytes that UDP GRO coalesced from seg-byte datagrams: the kernel's gso_size,
// which every coalesced datagram has but the last, which may be shorter
// (torvalds/linux:net/ipv4/udp_offload.c udp_gro_receive_segment). seg <= 0 means no
// coalescing: the buffer is one datagram.
func groNext(total, off, seg int) int {
	if seg <= 0 || seg >= total-off {
		return total
	}
	return off + seg
}

// decodeMeta decodes the source address and the control messages of rx message i into p's
// Src, Dst and TrafficClass, and returns the GRO segment size (0 if none).
func (u *UDP) decodeMeta(i int, p *Packet) (gso int, ok bool) {
	nm := &u.rx.names[i]
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&nm.Port))[:])
	switch nm.Family {
	case unix.AF_INET:
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(nm))
		p.Src = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port)
	case unix.AF_INET6:
		p.Src = netip.AddrPortFrom(netip.AddrFrom16(nm.Addr).Unmap(), port)
	default:
		return 0, false
	}
	dst := u.local.Addr()
	h := &u.rx.msgs[i].Hdr
	// Controllen is what the kernel wrote, never more than the buffer it was given; clamped
	// in its own type so that no value can make the slice bound negative.
	c := u.rx.ctrl[i][:min(h.Controllen, ctrlLen)]
	hl := unix.CmsgLen(0)
	for len(c) >= hl {
		ch := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
		l := int(ch.Len)
		if l < hl || l > len(c) {
			break
		}
		data := c[hl:l]
		switch {
		case ch.Level == unix.IPPROTO_IP && ch.Type == unix.IP_PKTINFO && len(data) >= 12:
			dst = netip.AddrFrom4([4]byte(data[8:12]))
		case ch.Level == unix.IPPROTO_IP && ch.Type == unix.IP_TOS && len(data) >= 1:
			p.TrafficClass = data[0]
		case ch.Level == unix.IPPROTO_IPV6 && ch.Type == unix.IPV6_PKTINFO && len(data) >= 16:
			dst = netip.AddrFrom16([16]byte(data[:16])).Unmap()
		case ch.Level == unix.IPPROTO_IPV6 && ch.Type == unix.IPV6_TCLASS && len(data) >= 4:
			p.TrafficClass = uint8(binary.NativeEndian.Uint32(data))
		case ch.Level == unix.IPPROTO_UDP && ch.Type == unix.UDP_GRO && len(data) >= 4:
			gso = int(binary.NativeEndian.Uint32(data))
		case ch.Level == unix.SOL_SOCKET && ch.Type == unix.SO_RXQ_OVFL && len(data) >= 4:
			v := binary.NativeEndian.Uint32(data)
			if d := v - u.lastOv; d != 0 && d < 1<<31 {
				u.ctr.rxQueue.Add(uint64(d))
			}
			u.lastOv = v
		}
		c = c[min(unix.CmsgSpace(l-hl), len(c)):]
	}
	p.Dst = netip.AddrPortFrom(dst, u.local.Port())
	return gso, dst.IsValid() && !dst.IsUnspecified()
}
