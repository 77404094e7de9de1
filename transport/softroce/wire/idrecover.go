package wire

import "encoding/binary"

// IPv4 Identification recovery.
//
// A receiver using a plain UDP socket does not see the sender's IPv4 header, but the ICRC covers
// the 16-bit Identification (rxe's kernel sends a varying ID with DF). CRC-32 is affine over
// GF(2): for messages of one length, crc(M1) ^ crc(M2) depends only on M1 ^ M2. Computing the
// ICRC with ID = 0 and XOR-ing it with the received ICRC therefore leaves
//
//	D = id(x) * x^(32 + 8N)  mod P(x)
//
// where id(x) is the 16-bit ID as a polynomial of degree < 16, P the CRC-32 polynomial and N the
// number of message bytes after the ID field (the message is 8 bytes LRH stand-in, 20 IPv4, 8
// UDP, BTH..pad, so N = len(pkt) + 18). Since x is invertible modulo P (P has a constant term),
//
//	id(x) = D * x^-(32 + 8N)  mod P(x)
//
// and the received ICRC is consistent with *some* ID iff this product has degree < 16, i.e. its
// 16 high-degree coefficients are zero. That costs one ICRC pass (needed anyway) plus two
// carry-less multiplications modulo P, using x^-(8k) from two 256-entry tables built at init.
//
// Strength. Without the ID, 16 of the 32 check bits are spent on solving for it; the remaining
// 16 are a parity check. For every packet up to 4160 bytes (link.MaxPacket, all IB MTUs), as
// TestRecoverDetectionClasses verifies exhaustively over all bit positions:
//   - a corruption confined to the 16 ID bits is by construction undetectable, and harmless:
//     nothing above the IP layer uses the ID;
//   - every error confined to at most 3 consecutive bits outside the ID field (in particular
//     every single-bit error) anywhere in the covered bytes (IPv4 version/IHL, total length,
//     flags, protocol, addresses; UDP ports and length; BTH but byte 4; extended headers,
//     payload, pad, ICRC) is detected;
//   - a double-bit error is missed for about 1.5e-5 (~2^-16) of all position pairs, where the
//     full CRC-32 detects every one at these lengths; longer bursts (4..16 bits) are missed at a
//     few specific positions (4 positions for 4-bit bursts, about half of them for 16-bit ones);
//   - a random corruption (or a random datagram, or one whose addresses/ports/length do not
//     match the receiver's view) passes with probability 2^-16 instead of 2^-32.
// Ethernet FCS and the IPv4 header checksum still guard each hop, so what reaches the ICRC check
// is mostly end-host or middlebox corruption; a 2^-16 escape rate is the price of not seeing
// the ID through a plain UDP socket (a raw socket or AF_PACKET receiver would see it).
// The DF/fragment word is assumed to be DF with offset 0 (Encap.IPv4NoDF selects 0): a
// fragmented RoCE packet is invalid anyway. Sending side note: the softroce UDP link sends ID 0
// (see package link), and rxe checks the full 32 bits of what we send.

const crcPolyReflected = 0xEDB88320 // crc32.IEEE

// gfMul returns a*b mod P in zlib's reflected representation (bit 31 = x^0), as zlib's multmodp.
func gfMul(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; a != 0 && m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
			a &^= m
		}
		if b&1 != 0 {
			b = b>>1 ^ crcPolyReflected
		} else {
			b >>= 1
		}
	}
	return p
}

// mulInvX returns v * x^-1 mod P (inverse of the reflected shift-by-one step).
func mulInvX(v uint32) uint32 {
	if v&(1<<31) != 0 {
		return (v^crcPolyReflected)<<1 | 1
	}
	return v << 1
}

// invByteLo[i] = x^-(8i), invByteHi[i] = x^-(8*256*i) mod P; built at init, never mutated.
var invByteLo, invByteHi = buildInvTables()

func buildInvTables() (lo, hi [256]uint32) {
	one := uint32(1) << 31
	xInv8 := one
	for range 8 {
		xInv8 = mulInvX(xInv8)
	}
	lo[0] = one
	for i := 1; i < 256; i++ {
		lo[i] = gfMul(lo[i-1], xInv8)
	}
	x2048 := gfMul(lo[255], xInv8) // x^-(8*256)
	hi[0] = one
	for i := 1; i < 256; i++ {
		hi[i] = gfMul(hi[i-1], x2048)
	}
	return lo, hi
}

// xInvBytes returns x^-(8k) mod P for 0 <= k < 65536.
func xInvBytes(k int) uint32 {
	return gfMul(invByteLo[k&0xFF], invByteHi[k>>8&0xFF])
}

// RecoverIPv4ID finds the IPv4 Identification for which the ICRC stored in pkt (BTH through
// ICRC) verifies, given the rest of the encapsulation in e (e.IPv4ID is ignored; e must be IPv4).
// ok is false if no ID makes the ICRC verify (the packet is corrupt or not for this
// encapsulation); see the strength discussion above. It never allocates.
func (e *Encap) RecoverIPv4ID(pkt []byte) (id uint16, ok bool) {
	if len(pkt) < BTHLen+ICRCLen || !e.Is4() || len(pkt) > 0xFFFF-IPv4HeaderLen-UDPHeaderLen {
		return 0, false
	}
	d := e.icrc(pkt, 0) ^ binary.LittleEndian.Uint32(pkt[len(pkt)-ICRCLen:])
	if d == 0 {
		return 0, true
	}
	// x^-(32+8N) = x^-(8(N+4)), N = len(pkt)+18.
	y := gfMul(d, xInvBytes(len(pkt)+22))
	if y&0xFFFF != 0 {
		return 0, false
	}
	return uint16(y>>16&0xFF)<<8 | uint16(y>>24), true
}
