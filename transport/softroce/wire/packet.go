package wire

import "encoding/binary"

// Packet is a parsed RoCEv2 transport packet: the bytes from the BTH through the ICRC, with the
// positions of its parts. It is a small value; it references, never copies, the buffer given to
// Parse or Layout. The zero Packet is empty (Bytes returns nil, every view nil).
type Packet struct {
	b    []byte
	hlen uint8 // BTH + extended headers
	pad  uint8 // PadCnt
}

// PadCount returns the BTH PadCnt for a payload of n bytes: (-n) & 3.
func PadCount(n int) int { return -n & 3 }

// PacketLen returns the length from the BTH through the ICRC of an op packet carrying n payload
// bytes, or 0 if op is unknown.
func PacketLen(op Opcode, n int) int {
	h := op.HeaderLen()
	if h == 0 {
		return 0
	}
	return h + n + PadCount(n) + ICRCLen
}

// Parse validates b (BTH through ICRC) and returns a Packet over it. It checks, in order:
// len(b) >= BTHLen (ErrTooShort); TVer == 0 (ErrBadTVer); the opcode is known
// (ErrUnknownOpcode); len(b) >= headers + PadCnt + ICRC (ErrTruncated); for opcodes without
// payload, PadCnt == 0 (ErrBadPad) and nothing between headers and ICRC
// (ErrUnexpectedPayload); for opcodes with payload, payload + pad a multiple of 4 as IBA
// requires and every RoCE sender (rxe included) produces (ErrBadPad).
// It does not check the ICRC (that needs the IP header: see Encap) nor the pad bytes' values.
// Parse never panics and never allocates.
func Parse(b []byte) (Packet, error) {
	if len(b) < BTHLen {
		return Packet{}, ErrTooShort
	}
	if b[1]&bthTVer != 0 {
		return Packet{}, ErrBadTVer
	}
	in := &opTable[b[0]]
	if !in.valid {
		return Packet{}, ErrUnknownOpcode
	}
	pad := int(b[1]&bthPadMask) >> 4
	rest := len(b) - int(in.hlen) - ICRCLen // payload + pad
	if rest < pad {
		return Packet{}, ErrTruncated
	}
	if in.flags&HasPayload == 0 {
		if pad != 0 {
			return Packet{}, ErrBadPad
		}
		if rest != 0 {
			return Packet{}, ErrUnexpectedPayload
		}
	} else if rest&3 != 0 {
		return Packet{}, ErrBadPad
	}
	return Packet{b: b, hlen: in.hlen, pad: uint8(pad)}, nil
}

// Layout prepares buf for an op packet carrying n payload bytes: it reslices buf (within its
// capacity) to PacketLen(op, n), zeroes the headers, pad and ICRC, and writes the BTH opcode,
// PadCnt and P_Key DefaultPKey. The caller then fills the remaining BTH fields with the setters
// (SetDestQP, SetPSN, SetAckReq, ...; note that BTH.Encode rewrites PadCnt, so pass
// PadCount(n)), the extended headers through the Packet's views and the payload through
// Payload(). The ICRC is written by the link, which knows the IP header.
func Layout(buf []byte, op Opcode, n int) (Packet, error) {
	in := &opTable[op]
	if !in.valid {
		return Packet{}, ErrUnknownOpcode
	}
	if n < 0 || n > 0xFFFF {
		return Packet{}, ErrPayloadTooLarge
	}
	if n != 0 && in.flags&HasPayload == 0 {
		return Packet{}, ErrUnexpectedPayload
	}
	total := int(in.hlen) + n + PadCount(n) + ICRCLen
	if cap(buf) < total {
		return Packet{}, ErrBufferTooSmall
	}
	b := buf[:total]
	clear(b[:in.hlen])
	clear(b[total-ICRCLen-PadCount(n):])
	b[0] = byte(op)
	b[1] = byte(PadCount(n)) << 4
	binary.BigEndian.PutUint16(b[2:], DefaultPKey)
	return Packet{b: b, hlen: in.hlen, pad: uint8(PadCount(n))}, nil
}

// Bytes returns the whole packet, BTH through ICRC.
func (p Packet) Bytes() []byte { return p.b }

// Len returns len(Bytes()).
func (p Packet) Len() int { return len(p.b) }

// Opcode returns the BTH opcode.
func (p Packet) Opcode() Opcode {
	if len(p.b) == 0 {
		return 0
	}
	return Opcode(p.b[0])
}

// BTH returns the base transport header.
func (p Packet) BTH() BTH {
	if len(p.b) < BTHLen {
		return nil
	}
	return BTH(p.b[:BTHLen])
}

// HeaderLen returns the length of the BTH plus extended headers.
func (p Packet) HeaderLen() int { return int(p.hlen) }

func (p Packet) ext(off uint8, n int) []byte {
	if off == 0 || len(p.b) == 0 {
		return nil
	}
	return p.b[off : int(off)+n : int(off)+n]
}

func (p Packet) info() *opInfo {
	if len(p.b) == 0 {
		return &opTable[0xFF] // never valid: all offsets zero
	}
	return &opTable[p.b[0]]
}

// RDETH returns the RDETH, or nil if the opcode has none.
func (p Packet) RDETH() RDETH { return RDETH(p.ext(p.info().rdeth, RDETHLen)) }

// DETH returns the DETH, or nil if the opcode has none.
func (p Packet) DETH() DETH { return DETH(p.ext(p.info().deth, DETHLen)) }

// RETH returns the RETH, or nil if the opcode has none.
func (p Packet) RETH() RETH { return RETH(p.ext(p.info().reth, RETHLen)) }

// AtomicETH returns the AtomicETH, or nil if the opcode has none.
func (p Packet) AtomicETH() AtomicETH { return AtomicETH(p.ext(p.info().atmeth, AtomicETHLen)) }

// AETH returns the AETH, or nil if the opcode has none.
func (p Packet) AETH() AETH { return AETH(p.ext(p.info().aeth, AETHLen)) }

// AtomicAckETH returns the AtomicAckETH, or nil if the opcode has none.
func (p Packet) AtomicAckETH() AtomicAckETH {
	return AtomicAckETH(p.ext(p.info().atmack, AtomicAckETHLen))
}

// ImmDt returns the immediate data, or nil if the opcode has none.
func (p Packet) ImmDt() ImmDt { return ImmDt(p.ext(p.info().immdt, ImmDtLen)) }

// IETH returns the IETH, or nil if the opcode has none.
func (p Packet) IETH() IETH { return IETH(p.ext(p.info().ieth, IETHLen)) }

// FETH returns the FETH, or nil if the opcode has none.
func (p Packet) FETH() FETH { return FETH(p.ext(p.info().feth, FETHLen)) }

// Payload returns the payload (without pad). Its capacity ends at the pad.
func (p Packet) Payload() []byte {
	if len(p.b) == 0 {
		return nil
	}
	end := len(p.b) - ICRCLen - int(p.pad)
	return p.b[p.hlen:end:end]
}

// PayloadLen returns len(Payload()).
func (p Packet) PayloadLen() int {
	if len(p.b) == 0 {
		return 0
	}
	return len(p.b) - ICRCLen - int(p.pad) - int(p.hlen)
}

// Pad returns the pad bytes (0-3).
func (p Packet) Pad() []byte {
	if len(p.b) == 0 {
		return nil
	}
	end := len(p.b) - ICRCLen
	return p.b[end-int(p.pad) : end : end]
}

// ICRC returns the ICRC stored in the packet (little-endian on the wire).
func (p Packet) ICRC() uint32 {
	if len(p.b) < ICRCLen {
		return 0
	}
	return binary.LittleEndian.Uint32(p.b[len(p.b)-ICRCLen:])
}

// MAD returns the payload as a MAD view when the packet is a UD SEND to QP1 whose payload holds
// at least the common MAD header; otherwise nil.
func (p Packet) MAD() MAD {
	if len(p.b) == 0 || Opcode(p.b[0]) != UDSendOnly || BTH(p.b).DestQP() != QPGSI {
		return nil
	}
	pl := p.Payload()
	if len(pl) < MADHeaderLen {
		return nil
	}
	return MAD(pl)
}
