package wire

import "encoding/binary"

// BTH is the 12-byte Base Transport Header (torvalds/linux:drivers/infiniband/sw/rxe/rxe_hdr.h):
//
//	byte 0     OpCode
//	byte 1     SE(7) M(6) PadCnt(5-4) TVer(3-0)
//	bytes 2-3  P_Key
//	byte 4     FECN(7) BECN(6) reserved(5-0)   (masked to 0xFF in the ICRC)
//	bytes 5-7  DestQP
//	byte 8     AckReq(7) reserved(6-0)
//	bytes 9-11 PSN
type BTH []byte

// BTHFields holds the fields of a BTH for Encode.
type BTHFields struct {
	Opcode         Opcode
	SolicitedEvent bool
	MigReq         bool
	PadCount       uint8 // 0..3
	TVer           uint8 // 0..15; RoCEv2 requires 0
	PKey           uint16
	FECN, BECN     bool
	DestQP         uint32 // 24 bits
	AckReq         bool
	PSN            PSN
}

const (
	bthSE      = 0x80
	bthMig     = 0x40
	bthPadMask = 0x30
	bthTVer    = 0x0F
	bthFECN    = 0x80
	bthBECN    = 0x40
	bthAckReq  = 0x80
	qpnMask    = 0xFFFFFF
)

func get24(b []byte) uint32    { return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }
func put24(b []byte, v uint32) { b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v) }

func setBit(b *byte, mask byte, on bool) {
	if on {
		*b |= mask
	} else {
		*b &^= mask
	}
}

// Opcode returns the BTH OpCode.
func (b BTH) Opcode() Opcode { return Opcode(b[0]) }

// SolicitedEvent returns the SE bit.
func (b BTH) SolicitedEvent() bool { return b[1]&bthSE != 0 }

// MigReq returns the M (migration request) bit.
func (b BTH) MigReq() bool { return b[1]&bthMig != 0 }

// PadCount returns PadCnt, the number of pad bytes between the payload and the ICRC.
func (b BTH) PadCount() int { return int(b[1]&bthPadMask) >> 4 }

// TVer returns the transport header version (0 for IBA/RoCE).
func (b BTH) TVer() uint8 { return b[1] & bthTVer }

// PKey returns the partition key.
func (b BTH) PKey() uint16 { return binary.BigEndian.Uint16(b[2:]) }

// FECN returns the forward explicit congestion notification bit.
func (b BTH) FECN() bool { return b[4]&bthFECN != 0 }

// BECN returns the backward explicit congestion notification bit.
func (b BTH) BECN() bool { return b[4]&bthBECN != 0 }

// DestQP returns the 24-bit destination QP number.
func (b BTH) DestQP() uint32 { return get24(b[5:]) }

// AckReq returns the acknowledge-request bit.
func (b BTH) AckReq() bool { return b[8]&bthAckReq != 0 }

// PSN returns the 24-bit packet sequence number.
func (b BTH) PSN() PSN { return PSN(get24(b[9:])) }

// SetOpcode sets the OpCode.
func (b BTH) SetOpcode(o Opcode) { b[0] = byte(o) }

// SetSolicitedEvent sets the SE bit.
func (b BTH) SetSolicitedEvent(v bool) { setBit(&b[1], bthSE, v) }

// SetMigReq sets the M bit.
func (b BTH) SetMigReq(v bool) { setBit(&b[1], bthMig, v) }

// SetPadCount sets PadCnt (n is masked to 2 bits).
func (b BTH) SetPadCount(n int) { b[1] = b[1]&^bthPadMask | byte(n&3)<<4 }

// SetTVer sets the transport header version (masked to 4 bits).
func (b BTH) SetTVer(v uint8) { b[1] = b[1]&^bthTVer | v&bthTVer }

// SetPKey sets the partition key.
func (b BTH) SetPKey(k uint16) { binary.BigEndian.PutUint16(b[2:], k) }

// SetFECN sets the FECN bit.
func (b BTH) SetFECN(v bool) { setBit(&b[4], bthFECN, v) }

// SetBECN sets the BECN bit.
func (b BTH) SetBECN(v bool) { setBit(&b[4], bthBECN, v) }

// SetDestQP sets the destination QP (masked to 24 bits).
func (b BTH) SetDestQP(qpn uint32) { put24(b[5:], qpn&qpnMask) }

// SetAckReq sets the AckReq bit.
func (b BTH) SetAckReq(v bool) { setBit(&b[8], bthAckReq, v) }

// SetPSN sets the PSN (masked to 24 bits).
func (b BTH) SetPSN(p PSN) { put24(b[9:], uint32(p)&PSNMask) }

// Encode writes all fields; reserved bits are written as zero.
func (b BTH) Encode(f *BTHFields) {
	_ = b[11]
	b[0] = byte(f.Opcode)
	b[1] = f.PadCount&3<<4 | f.TVer&bthTVer
	if f.SolicitedEvent {
		b[1] |= bthSE
	}
	if f.MigReq {
		b[1] |= bthMig
	}
	binary.BigEndian.PutUint16(b[2:], f.PKey)
	b[4] = 0
	if f.FECN {
		b[4] |= bthFECN
	}
	if f.BECN {
		b[4] |= bthBECN
	}
	put24(b[5:], f.DestQP&qpnMask)
	b[8] = 0
	if f.AckReq {
		b[8] = bthAckReq
	}
	put24(b[9:], uint32(f.PSN)&PSNMask)
}

// Fields decodes all fields.
func (b BTH) Fields() BTHFields {
	return BTHFields{
		Opcode: b.Opcode(), SolicitedEvent: b.SolicitedEvent(), MigReq: b.MigReq(),
		PadCount: uint8(b.PadCount()), TVer: b.TVer(), PKey: b.PKey(), FECN: b.FECN(),
		BECN: b.BECN(), DestQP: b.DestQP(), AckReq: b.AckReq(), PSN: b.PSN(),
	}
}
