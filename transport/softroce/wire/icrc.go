package wire

import (
	"encoding/binary"
	"hash/crc32"
	"net/netip"
)

// ICRC, exactly as torvalds/linux:drivers/infiniband/sw/rxe/rxe_icrc.c computes it (same recipe
// in secdev/scapy:scapy/contrib/roce.py): standard CRC-32 (IEEE 802.3, reflected, init and final
// XOR 0xFFFFFFFF, Go's crc32.IEEE) over
//
//  1. 8 bytes 0xFF (stand-in for the IB LRH),
//  2. the IP header with masked fields set to all ones: IPv4 TOS, TTL, header checksum;
//     IPv6 traffic class + flow label (bytes 0-3 become 0x6F 0xFF 0xFF 0xFF... with the version
//     nibble kept) and hop limit,
//  3. the UDP header with the checksum set to 0xFFFF,
//  4. the BTH with byte 4 (FECN, BECN, reserved) set to 0xFF,
//  5. the extended headers, payload and pad,
//
// stored little-endian in the last 4 bytes of the packet. Unmasked and therefore covered: IPv4
// version/IHL, total length, Identification, flags/fragment offset, protocol, addresses; IPv6
// payload length, next header, addresses; UDP ports and length.

// lrhSeed is crc32.ChecksumIEEE of 8 bytes 0xFF: continuing crc32.Update from it equals rxe's raw
// seed 0xDEBB20E3 (its complement) followed by the raw CRC of the rest.
const lrhSeed = 0x2144DF1C

// Header lengths of the encapsulation rxe uses (no IPv4 options, no IPv6 extension headers).
const (
	IPv4HeaderLen = 20
	IPv6HeaderLen = 40
	UDPHeaderLen  = 8
	// IPv4DF is the IPv4 Don't Fragment flag in the flags/fragment-offset word.
	IPv4DF = 0x4000
)

// Encap describes the IP/UDP encapsulation of one RoCEv2 packet: what the ICRC covers besides
// the transport bytes, and what PutHeaders writes. Addresses must both be IPv4 (IPv4-mapped IPv6
// addresses count as IPv4) or both IPv6.
type Encap struct {
	Src, Dst netip.AddrPort
	// IPv4ID is the IPv4 Identification (covered by the ICRC).
	IPv4ID uint16
	// IPv4NoDF clears the DF flag; the zero value sends DF with fragment offset 0, as rxe and the
	// softroce links do. The flags/offset word is covered by the ICRC.
	IPv4NoDF bool
	// TrafficClass is the IPv4 TOS / IPv6 traffic class, HopLimit the IPv4 TTL / IPv6 hop limit
	// (0 means 64) and FlowLabel the IPv6 flow label. All three are masked out of the ICRC; they
	// only matter to PutHeaders.
	TrafficClass uint8
	HopLimit     uint8
	FlowLabel    uint32
}

// Is4 reports whether the encapsulation is IPv4 (Src is an IPv4 or IPv4-mapped address).
func (e *Encap) Is4() bool { return e.Src.Addr().Unmap().Is4() }

// Valid reports whether both addresses are valid and of the same family.
func (e *Encap) Valid() bool {
	s, d := e.Src.Addr().Unmap(), e.Dst.Addr().Unmap()
	return s.IsValid() && d.IsValid() && s.Is4() == d.Is4()
}

// HeaderLen returns the IP + UDP header length: 28 for IPv4, 48 for IPv6.
func (e *Encap) HeaderLen() int {
	if e.Is4() {
		return IPv4HeaderLen + UDPHeaderLen
	}
	return IPv6HeaderLen + UDPHeaderLen
}

func (e *Encap) fragWord() uint16 {
	if e.IPv4NoDF {
		return 0
	}
	return IPv4DF
}

// maskedPrefix writes the masked IP header, UDP header and BTH for a packet of pktLen bytes (BTH
// through ICRC) into s and returns the length used. bth must hold at least BTHLen bytes.
func (e *Encap) maskedPrefix(s *[IPv6HeaderLen + UDPHeaderLen + BTHLen]byte, pktLen int, bth []byte, id uint16) int {
	n := 0
	udpLen := UDPHeaderLen + pktLen
	if e.Is4() {
		src, dst := e.Src.Addr().Unmap().As4(), e.Dst.Addr().Unmap().As4()
		s[0], s[1] = 0x45, 0xFF
		binary.BigEndian.PutUint16(s[2:], uint16(IPv4HeaderLen+udpLen))
		binary.BigEndian.PutUint16(s[4:], id)
		binary.BigEndian.PutUint16(s[6:], e.fragWord())
		s[8], s[9], s[10], s[11] = 0xFF, 17, 0xFF, 0xFF
		copy(s[12:16], src[:])
		copy(s[16:20], dst[:])
		n = IPv4HeaderLen
	} else {
		src, dst := e.Src.Addr().As16(), e.Dst.Addr().As16()
		s[0], s[1], s[2], s[3] = 0x6F, 0xFF, 0xFF, 0xFF
		binary.BigEndian.PutUint16(s[4:], uint16(udpLen))
		s[6], s[7] = 17, 0xFF
		copy(s[8:24], src[:])
		copy(s[24:40], dst[:])
		n = IPv6HeaderLen
	}
	binary.BigEndian.PutUint16(s[n:], e.Src.Port())
	binary.BigEndian.PutUint16(s[n+2:], e.Dst.Port())
	binary.BigEndian.PutUint16(s[n+4:], uint16(udpLen))
	s[n+6], s[n+7] = 0xFF, 0xFF
	n += UDPHeaderLen
	copy(s[n:n+BTHLen], bth[:BTHLen])
	s[n+4] = 0xFF
	return n + BTHLen
}

func (e *Encap) icrc(pkt []byte, id uint16) uint32 {
	var s [IPv6HeaderLen + UDPHeaderLen + BTHLen]byte
	n := e.maskedPrefix(&s, len(pkt), pkt, id)
	return crc32.Update(crcSmall(lrhSeed, s[:n]), crc32.IEEETable, pkt[BTHLen:len(pkt)-ICRCLen])
}

// ICRC computes the ICRC of pkt (BTH through ICRC inclusive; the last 4 bytes are not read)
// carried in the encapsulation e. It returns 0 if pkt is shorter than BTH + ICRC.
func (e *Encap) ICRC(pkt []byte) uint32 {
	if len(pkt) < BTHLen+ICRCLen {
		return 0
	}
	return e.icrc(pkt, e.IPv4ID)
}

// PutICRC computes the ICRC of pkt and stores it (little-endian) in its last 4 bytes.
func (e *Encap) PutICRC(pkt []byte) {
	if len(pkt) < BTHLen+ICRCLen {
		return
	}
	binary.LittleEndian.PutUint32(pkt[len(pkt)-ICRCLen:], e.icrc(pkt, e.IPv4ID))
}

// VerifyICRC reports whether the ICRC stored in pkt matches.
func (e *Encap) VerifyICRC(pkt []byte) bool {
	if len(pkt) < BTHLen+ICRCLen {
		return false
	}
	return e.icrc(pkt, e.IPv4ID) == binary.LittleEndian.Uint32(pkt[len(pkt)-ICRCLen:])
}

// PutHeaders writes the IP and UDP headers for pkt (BTH through ICRC) into b, which must hold
// HeaderLen() bytes, and returns the number written. IPv4 gets IHL 5, e.IPv4ID, DF unless
// IPv4NoDF, TTL e.HopLimit (64 if 0) and a valid header checksum; IPv6 gets e.TrafficClass,
// e.FlowLabel and the hop limit. The UDP checksum is written as 0 (what rxe sends, IPv4 and
// IPv6; it is masked out of the ICRC).
func (e *Encap) PutHeaders(b []byte, pkt []byte) (int, error) {
	if !e.Valid() {
		return 0, ErrAddress
	}
	hl := e.HeaderLen()
	if len(b) < hl {
		return 0, ErrBufferTooSmall
	}
	udpLen := UDPHeaderLen + len(pkt)
	if udpLen+IPv6HeaderLen > 0xFFFF {
		return 0, ErrPayloadTooLarge
	}
	ttl := e.HopLimit
	if ttl == 0 {
		ttl = 64
	}
	n := 0
	if e.Is4() {
		src, dst := e.Src.Addr().Unmap().As4(), e.Dst.Addr().Unmap().As4()
		h := b[:IPv4HeaderLen]
		h[0], h[1] = 0x45, e.TrafficClass
		binary.BigEndian.PutUint16(h[2:], uint16(IPv4HeaderLen+udpLen))
		binary.BigEndian.PutUint16(h[4:], e.IPv4ID)
		binary.BigEndian.PutUint16(h[6:], e.fragWord())
		h[8], h[9], h[10], h[11] = ttl, 17, 0, 0
		copy(h[12:16], src[:])
		copy(h[16:20], dst[:])
		binary.BigEndian.PutUint16(h[10:], IPv4Checksum(h))
		n = IPv4HeaderLen
	} else {
		src, dst := e.Src.Addr().As16(), e.Dst.Addr().As16()
		h := b[:IPv6HeaderLen]
		binary.BigEndian.PutUint32(h, 6<<28|uint32(e.TrafficClass)<<20|e.FlowLabel&0xFFFFF)
		binary.BigEndian.PutUint16(h[4:], uint16(udpLen))
		h[6], h[7] = 17, ttl
		copy(h[8:24], src[:])
		copy(h[24:40], dst[:])
		n = IPv6HeaderLen
	}
	u := b[n : n+UDPHeaderLen]
	binary.BigEndian.PutUint16(u, e.Src.Port())
	binary.BigEndian.PutUint16(u[2:], e.Dst.Port())
	binary.BigEndian.PutUint16(u[4:], uint16(udpLen))
	u[6], u[7] = 0, 0
	return n + UDPHeaderLen, nil
}

// IPv4Checksum returns the Internet checksum of an IPv4 header whose checksum field is zero (or,
// equivalently, 0 for a header whose checksum is correct).
func IPv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	if len(h)&1 != 0 {
		sum += uint32(h[len(h)-1]) << 8
	}
	for sum > 0xFFFF {
		sum = sum>>16 + sum&0xFFFF
	}
	return ^uint16(sum)
}

// ParseEncap decodes a real IPv4 (IHL 5) or IPv6 (no extension headers) header followed by a
// UDP header, as found in a capture, into an Encap plus the UDP payload length. It returns
// ErrIPHeader for anything else (options, extension headers, non-UDP, fragments are accepted
// only as far as the header goes: the flags word must be DF/0 or 0), and ErrAddress for an IPv6
// header carrying an IPv4-mapped source or destination address, which Encap cannot describe.
func ParseEncap(b []byte) (e Encap, hdrLen, udpPayloadLen int, err error) {
	if len(b) < 1 {
		return Encap{}, 0, 0, ErrIPHeader
	}
	switch b[0] >> 4 {
	case 4:
		if len(b) < IPv4HeaderLen+UDPHeaderLen || b[0] != 0x45 || b[9] != 17 {
			return Encap{}, 0, 0, ErrIPHeader
		}
		fw := binary.BigEndian.Uint16(b[6:])
		if fw != IPv4DF && fw != 0 {
			return Encap{}, 0, 0, ErrIPHeader
		}
		e.Src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[12:16])), binary.BigEndian.Uint16(b[20:]))
		e.Dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[16:20])), binary.BigEndian.Uint16(b[22:]))
		e.IPv4ID = binary.BigEndian.Uint16(b[4:])
		e.IPv4NoDF = fw == 0
		e.TrafficClass, e.HopLimit = b[1], b[8]
		hdrLen = IPv4HeaderLen
		if int(binary.BigEndian.Uint16(b[2:])) != IPv4HeaderLen+int(binary.BigEndian.Uint16(b[24:])) {
			return Encap{}, 0, 0, ErrIPHeader
		}
	case 6:
		if len(b) < IPv6HeaderLen+UDPHeaderLen || b[6] != 17 {
			return Encap{}, 0, 0, ErrIPHeader
		}
		src, dst := netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40]))
		// Encap (like a RoCEv2 GID) says "IPv4" with an IPv4-mapped address: rxe picks IPv4
		// encapsulation for a mapped GID (torvalds/linux:include/rdma/ib_verbs.h
		// rdma_gid_attr_network_type), so no RoCEv2 sender puts one in an IPv6 header, and an
		// Encap holding one would describe (and compute the ICRC over) an IPv4 header that is
		// not the one on the wire.
		if src.Is4In6() || dst.Is4In6() {
			return Encap{}, 0, 0, ErrAddress
		}
		e.Src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(b[40:]))
		e.Dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(b[42:]))
		v := binary.BigEndian.Uint32(b)
		e.TrafficClass, e.FlowLabel, e.HopLimit = uint8(v>>20), v&0xFFFFF, b[7]
		hdrLen = IPv6HeaderLen
		if binary.BigEndian.Uint16(b[4:]) != binary.BigEndian.Uint16(b[44:]) {
			return Encap{}, 0, 0, ErrIPHeader
		}
	default:
		return Encap{}, 0, 0, ErrIPHeader
	}
	udpLen := int(binary.BigEndian.Uint16(b[hdrLen+4:]))
	if udpLen < UDPHeaderLen {
		return Encap{}, 0, 0, ErrIPHeader
	}
	return e, hdrLen + UDPHeaderLen, udpLen - UDPHeaderLen, nil
}

// ICRCFromHeaders computes the ICRC of pkt (BTH through ICRC) from the literal IP header ip
// (20-byte IPv4 or 40-byte IPv6) and UDP header udp, masking exactly as rxe does, without
// interpreting any field. Use it to check captured frames.
func ICRCFromHeaders(ip, udp, pkt []byte) (uint32, error) {
	if len(pkt) < BTHLen+ICRCLen || len(udp) < UDPHeaderLen {
		return 0, ErrTooShort
	}
	var s [IPv6HeaderLen + UDPHeaderLen + BTHLen]byte
	var n int
	switch {
	case len(ip) == IPv4HeaderLen && ip[0] == 0x45:
		copy(s[:], ip)
		s[1], s[8], s[10], s[11] = 0xFF, 0xFF, 0xFF, 0xFF
		n = IPv4HeaderLen
	case len(ip) == IPv6HeaderLen && ip[0]>>4 == 6:
		copy(s[:], ip)
		s[0] |= 0x0F
		s[1], s[2], s[3], s[7] = 0xFF, 0xFF, 0xFF, 0xFF
		n = IPv6HeaderLen
	default:
		return 0, ErrIPHeader
	}
	copy(s[n:], udp[:UDPHeaderLen])
	s[n+6], s[n+7] = 0xFF, 0xFF
	n += UDPHeaderLen
	copy(s[n:], pkt[:BTHLen])
	s[n+4] = 0xFF
	n += BTHLen
	return crc32.Update(crcSmall(lrhSeed, s[:n]), crc32.IEEETable, pkt[BTHLen:len(pkt)-ICRCLen]), nil
}

// crcSmall is crc32.Update(crc, crc32.IEEETable, b) for the short masked header prefix (40
// or 60 bytes), done here so that the stack scratch buffer does not escape (crc32.Update's
// assembly dispatch makes its argument escape, which would cost an allocation per packet).
// It goes eight bytes a step (slicing-by-8, as hash/crc32's own slicing8Update): byte-wise,
// the prefix cost a quarter of a 4 KiB packet's ICRC and most of an ACK's.
func crcSmall(crc uint32, b []byte) uint32 {
	t := &ieeeSlicing8
	crc = ^crc
	for len(b) >= 8 {
		crc ^= binary.LittleEndian.Uint32(b)
		crc = t[0][b[7]] ^ t[1][b[6]] ^ t[2][b[5]] ^ t[3][b[4]] ^
			t[4][crc>>24] ^ t[5][crc>>16&0xFF] ^ t[6][crc>>8&0xFF] ^ t[7][crc&0xFF]
		b = b[8:]
	}
	for _, v := range b {
		crc = t[0][byte(crc)^v] ^ crc>>8
	}
	return ^crc
}

// ieeeSlicing8 are the slicing-by-8 tables of the IEEE polynomial: [0] is crc32.IEEETable,
// [k][i] the CRC of byte i followed by k zero bytes. Built once at start-up, read-only after.
var ieeeSlicing8 = func() (t [8][256]uint32) {
	t[0] = *crc32.IEEETable
	for i := range 256 {
		crc := t[0][i]
		for k := 1; k < 8; k++ {
			crc = t[0][crc&0xFF] ^ crc>>8
			t[k][i] = crc
		}
	}
	return t
}()
