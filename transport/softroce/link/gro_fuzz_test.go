//go:build linux

package link

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/srpd/srpd/internal/fuzzbound"
	"github.com/srpd/srpd/transport/softroce/wire"
)

var (
	groLocal = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), UDPPort)
	groPeer  = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), 49152)
)

// Bits of the fuzz input's flags byte.
const (
	groFlagTrunc      = 1 << 0 // MSG_TRUNC in msg_flags
	groFlagCtrunc     = 1 << 1 // MSG_CTRUNC in msg_flags
	groFlagWild       = 1 << 2 // the link is bound to 0.0.0.0 (the destination must come from IP_PKTINFO)
	groFlagControllen = 1 << 3 // msg_controllen beyond the control buffer (never from a kernel)
	groFlagLen        = 1 << 4 // msg_len beyond the receive buffer (never from a kernel)
	groFlagWaive      = 1 << 5 // the link waives the ICRC for odd destination QPs (ICRCWaiver)
)

// groWaiveOdd is the fuzzed link's ICRC waiver (groFlagWaive).
func groWaiveOdd(qpn uint32) bool { return qpn&1 != 0 }

// rxOnlyUDP is a GRO UDP link without a socket, for feeding its receive state directly.
func rxOnlyUDP(local netip.AddrPort) *UDP {
	return &UDP{local: local, is4: true, gro: true, batch: 1, rx: newMmsgState(1, 1),
		groBufs: [][]byte{make([]byte, groBufLen)}}
}

// sockaddr4 is the bytes of a struct sockaddr_in for a (what recvmmsg writes into msg_name).
func sockaddr4(a netip.AddrPort) []byte {
	var sa unix.RawSockaddrInet4
	sa.Family = unix.AF_INET
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], a.Port())
	sa.Addr = a.Addr().As4()
	return append([]byte(nil), (*[unix.SizeofSockaddrInet4]byte)(unsafe.Pointer(&sa))[:]...)
}

// groCmsg is a UDP_GRO control message carrying segment size seg (an int, as the kernel
// writes it: torvalds/linux:include/linux/udp.h udp_cmsg_recv).
func groCmsg(seg int) []byte {
	b := make([]byte, unix.CmsgSpace(4))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = unix.IPPROTO_UDP, unix.UDP_GRO
	h.SetLen(unix.CmsgLen(4))
	binary.NativeEndian.PutUint32(b[unix.CmsgLen(0):], uint32(seg))
	return b
}

// load puts one received message into u's receive state as recvmmsg would have left it.
func (u *UDP) load(data, name, ctrl []byte, flags uint8) {
	m := &u.rx.msgs[0]
	m.Len = uint32(copy(u.groBufs[0], data))
	if flags&groFlagLen != 0 {
		m.Len = uint32(len(u.groBufs[0]) + len(data) + 1)
	}
	nm := (*[unsafe.Sizeof(u.rx.names[0])]byte)(unsafe.Pointer(&u.rx.names[0]))
	clear(nm[:])
	copy(nm[:], name)
	c := u.rx.ctrl[0][:]
	clear(c)
	m.Hdr.Controllen = uint64(copy(c, ctrl))
	if flags&groFlagControllen != 0 {
		m.Hdr.Controllen = ^uint64(0) - uint64(len(ctrl))
	}
	m.Hdr.Flags = 0
	if flags&groFlagTrunc != 0 {
		m.Hdr.Flags |= unix.MSG_TRUNC
	}
	if flags&groFlagCtrunc != 0 {
		m.Hdr.Flags |= unix.MSG_CTRUNC
	}
	u.groMsgs, u.groMsg, u.groOff, u.groStarted = 1, 0, 0, false
}

// groSeed is n RoCEv2 packets of payload bytes each, with ICRCs for groPeer → groLocal, back to
// back as GRO hands them over, and the segment size.
func groSeed(tb testing.TB, n, payload int) ([]byte, int) {
	var all []byte
	seg := 0
	for i := range n {
		p := mkSend(tb, groLocal, uint32(i), payload)
		e := wire.Encap{Src: groPeer, Dst: groLocal, IPv4ID: uint16(i * 13)}
		e.PutICRC(p.Buf)
		all = append(all, p.Buf...)
		seg = len(p.Buf)
	}
	return all, seg
}

// FuzzGROSplit drives the GRO receive path (decodeMeta's msg_name and cmsg parsing, nextGRO's
// splitting by segment size, drainGRO's checks) with an arbitrary received buffer, segment size
// (sent as a UDP_GRO cmsg when non-zero), further raw control bytes, msg_name bytes (empty:
// the peer's sockaddr_in) and flags. Properties: no panic; the pieces tile the received bytes
// exactly, in order, each a datagram of the segment size but the last; and every piece is
// counted exactly once, returned or dropped, with the returned ones being pieces in order.
func FuzzGROSplit(f *testing.F) {
	four, seg := groSeed(f, 4, 1024)
	f.Add(four, uint16(seg), []byte{}, []byte{}, uint8(0))
	f.Add(four[:len(four)-100], uint16(seg), []byte{}, []byte{}, uint8(0)) // short last piece
	f.Add(four, uint16(seg+4), []byte{}, []byte{}, uint8(0))               // misaligned segments
	f.Add(four, uint16(0), []byte{}, []byte{}, uint8(0))                   // no cmsg: one datagram
	f.Add(four, uint16(1), []byte{}, []byte{}, uint8(0))
	f.Add(four, uint16(seg), []byte{}, []byte{}, uint8(groFlagCtrunc))
	f.Add(four, uint16(seg), []byte{}, []byte{}, uint8(groFlagTrunc|groFlagControllen))
	f.Add(four, uint16(seg), []byte{}, []byte{}, uint8(groFlagLen))
	one, _ := groSeed(f, 1, 100)
	f.Add(one, uint16(0), []byte{}, []byte{}, uint8(0))
	f.Add([]byte{}, uint16(0), []byte{}, []byte{}, uint8(0))
	var pi unix.Inet4Pktinfo
	pi.Addr = groLocal.Addr().As4()
	pktinfo := make([]byte, unix.CmsgSpace(unix.SizeofInet4Pktinfo))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&pktinfo[0]))
	h.Level, h.Type = unix.IPPROTO_IP, unix.IP_PKTINFO
	h.SetLen(unix.CmsgLen(unix.SizeofInet4Pktinfo))
	copy(pktinfo[unix.CmsgLen(0):], (*[unix.SizeofInet4Pktinfo]byte)(unsafe.Pointer(&pi))[:])
	f.Add(four, uint16(seg), pktinfo, []byte{}, uint8(groFlagWild))
	f.Add(four, uint16(seg), pktinfo[:len(pktinfo)-3], []byte{}, uint8(groFlagWild))
	f.Add(four, uint16(seg), append(groCmsg(7), 0xff, 0xff), []byte{}, uint8(0))
	f.Add(four, uint16(seg), []byte{}, []byte{10, 0, 1, 2, 3, 4, 5, 6}, uint8(0)) // AF_INET6 of junk
	f.Add(groZeroICRC(four, seg), uint16(seg), []byte{}, []byte{}, uint8(groFlagWaive))
	f.Fuzz(func(t *testing.T, data []byte, segArg uint16, rawCtrl, name []byte, flags uint8) {
		fuzzbound.Run(t, func() {
			local := groLocal
			if flags&groFlagWild != 0 {
				local = netip.AddrPortFrom(netip.IPv4Unspecified(), UDPPort)
			}
			if len(name) == 0 {
				name = sockaddr4(groPeer)
			}
			var ctrl []byte
			if segArg != 0 {
				ctrl = groCmsg(int(segArg))
			}
			ctrl = append(ctrl, rawCtrl...)
			data = data[:min(len(data), groBufLen)]

			// 1. Tiling: the pieces are the received bytes, cut in order.
			u := rxOnlyUDP(local)
			u.load(data, name, ctrl, flags)
			var pieces [][]byte
			var joined []byte
			bad := false
			for i := 0; ; i++ {
				if i > len(data)+1 {
					t.Errorf("nextGRO returned %d pieces of %d bytes without finishing", i, len(data))
					return
				}
				p, st := u.nextGRO()
				if st == groDone {
					break
				}
				bad = bad || st == groBadMsg
				pieces = append(pieces, p)
				joined = append(joined, p...)
			}
			want := data
			if flags&groFlagLen != 0 {
				want = u.groBufs[0] // a length beyond the buffer: the whole buffer is the message
			}
			if !bytes.Equal(joined, want) {
				t.Errorf("pieces (%d, %d bytes) do not tile the %d received bytes", len(pieces), len(joined), len(want))
				return
			}
			if len(pieces) == 0 || bad && len(pieces) != 1 {
				t.Errorf("%d pieces (bad message %v)", len(pieces), bad)
				return
			}
			for i, p := range pieces[:len(pieces)-1] {
				if len(p) != len(pieces[0]) || len(p) == 0 {
					t.Errorf("piece %d has %d bytes, piece 0 %d: only the last may differ", i, len(p), len(pieces[0]))
					return
				}
			}
			if last := pieces[len(pieces)-1]; len(pieces) > 1 && len(last) > len(pieces[0]) {
				t.Errorf("last piece %d bytes, longer than the segment size %d", len(last), len(pieces[0]))
				return
			}
			// With nothing but our UDP_GRO cmsg and the peer's address, the segment size is ours.
			if len(rawCtrl) == 0 && flags == 0 && len(data) > 0 && !bad {
				want := 1
				if s := int(segArg); s > 0 {
					want = (len(data) + s - 1) / s
				}
				if len(pieces) != want {
					t.Errorf("%d pieces of %d bytes with segment size %d, want %d", len(pieces), len(data), segArg, want)
					return
				}
			}

			// 2. Accounting: every piece is counted once; what Recv would return is pieces, in
			// order, copied or as views (RecvViews) of exactly their length.
			for _, views := range []bool{false, true} {
				u = rxOnlyUDP(local)
				u.load(data, name, ctrl, flags)
				if flags&groFlagWaive != 0 {
					u.WaiveICRC(groWaiveOdd)
				}
				pkts := make([]Packet, 3)
				own := make([][]byte, len(pkts))
				for i := range pkts {
					own[i] = make([]byte, MaxPacket)
				}
				next := 0
				for i := 0; ; i++ {
					if i > len(pieces) {
						t.Error("drainGRO does not finish")
						return
					}
					for j := range pkts {
						pkts[j].Buf = own[j]
					}
					k := u.drainGRO(pkts, views)
					if k == 0 {
						break
					}
					for _, p := range pkts[:k] {
						if views && cap(p.Buf) != len(p.Buf) {
							t.Errorf("a view of %d bytes has capacity %d", len(p.Buf), cap(p.Buf))
							return
						}
						for next < len(pieces) && !bytes.Equal(pieces[next], p.Buf) {
							next++
						}
						if next == len(pieces) {
							t.Errorf("returned a packet of %d bytes that is not a later piece", len(p.Buf))
							return
						}
						next++
						if p.Src != groPeer || p.Dst.Port() != UDPPort {
							t.Errorf("returned packet from %v to %v", p.Src, p.Dst)
							return
						}
						if _, err := wire.Parse(p.Buf); err != nil {
							t.Errorf("returned packet does not parse: %v", err)
							return
						}
						// Unchecked only where waived: a zero ICRC field to an odd QP.
						waived := flags&groFlagWaive != 0 && binary.BigEndian.Uint32(p.Buf[len(p.Buf)-4:]) == 0 &&
							groWaiveOdd(wire.BTH(p.Buf).DestQP())
						if e := (wire.Encap{Src: p.Src, Dst: p.Dst}); !waived {
							if _, ok := e.RecoverIPv4ID(p.Buf); !ok {
								t.Errorf("returned a packet whose ICRC fails, not waived")
								return
							}
						}
					}
				}
				st := u.Stats()
				if n := st.RxPackets + st.RxMalformedDrops + st.RxICRCDrops; n != uint64(len(pieces)) {
					t.Errorf("%d pieces but %+v", len(pieces), st)
				}
			}
		})
	})
}

// TestGROSplitSeeds: the seed buffers split as the kernel coalesced them, every packet passes
// its checks, and the cases that must be dropped whole are.
func TestGROSplitSeeds(t *testing.T) {
	four, seg := groSeed(t, 4, 1024)
	for _, tc := range []struct {
		name                       string
		data                       []byte
		seg                        int
		flags                      uint8
		pkts, malformed, icrc, gro uint64
	}{
		{"four coalesced", four, seg, 0, 4, 0, 0, 1},
		{"no UDP_GRO cmsg: one datagram", four, 0, 0, 0, 0, 1, 0},
		{"segment size one off", four, seg + 1, 0, 0, 0, 4, 1},
		{"control truncated: segmentation unknown", four, seg, groFlagCtrunc, 0, 1, 0, 0},
		{"datagram truncated", four, seg, groFlagTrunc, 0, 1, 0, 0},
		{"length beyond the buffer", four, seg, groFlagLen, 0, 1, 0, 0},
		{"controllen beyond the buffer", four, seg, groFlagControllen, 4, 0, 0, 1},
		{"empty datagram", nil, 0, 0, 0, 1, 0, 0},
	} {
		for _, views := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/views=%v", tc.name, views), func(t *testing.T) {
				u := rxOnlyUDP(groLocal)
				var ctrl []byte
				if tc.seg > 0 {
					ctrl = groCmsg(tc.seg)
				}
				u.load(tc.data, sockaddr4(groPeer), ctrl, tc.flags)
				pkts := recvBufs(8)
				n := u.drainGRO(pkts, views)
				st := u.Stats()
				if uint64(n) != tc.pkts || st.RxPackets != tc.pkts || st.RxMalformedDrops != tc.malformed ||
					st.RxICRCDrops != tc.icrc || st.RxGROMessages != tc.gro {
					t.Fatalf("returned %d, %+v; want %d packets, %d malformed, %d ICRC, %d GRO",
						n, st, tc.pkts, tc.malformed, tc.icrc, tc.gro)
				}
				for i, p := range pkts[:n] {
					if !bytes.Equal(p.Buf, four[i*seg:(i+1)*seg]) || wire.BTH(p.Buf).PSN() != wire.PSN(i) {
						t.Fatalf("packet %d differs", i)
					}
				}
			})
		}
	}
}

// groZeroICRC is a copy of a seed buffer of seg-byte packets with every ICRC field zeroed and
// the destination QPs made odd and even in turn (groFlagWaive accepts the odd ones).
func groZeroICRC(data []byte, seg int) []byte {
	out := append([]byte(nil), data...)
	for i, off := 0, 0; off+seg <= len(out); i, off = i+1, off+seg {
		p := out[off : off+seg]
		clear(p[len(p)-4:])
		wire.BTH(p).SetDestQP(0x10 | uint32(i&1))
	}
	return out
}
