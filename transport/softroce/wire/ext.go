package wire

import (
	"encoding/binary"
	"strconv"
	"time"
)

// Extended transport header views. Layouts from torvalds/linux:drivers/infiniband/sw/rxe/rxe_hdr.h.

// RETH is the 16-byte RDMA Extended Transport Header: VA (8), R_Key (4), DMA length (4).
type RETH []byte

// RETHFields holds the fields of a RETH.
type RETHFields struct {
	VA     uint64
	RKey   uint32
	DMALen uint32
}

// VA returns the remote virtual address.
func (r RETH) VA() uint64 { return binary.BigEndian.Uint64(r) }

// RKey returns the remote key.
func (r RETH) RKey() uint32 { return binary.BigEndian.Uint32(r[8:]) }

// DMALen returns the DMA length of the whole message.
func (r RETH) DMALen() uint32 { return binary.BigEndian.Uint32(r[12:]) }

// SetVA sets the virtual address.
func (r RETH) SetVA(v uint64) { binary.BigEndian.PutUint64(r, v) }

// SetRKey sets the remote key.
func (r RETH) SetRKey(k uint32) { binary.BigEndian.PutUint32(r[8:], k) }

// SetDMALen sets the DMA length.
func (r RETH) SetDMALen(n uint32) { binary.BigEndian.PutUint32(r[12:], n) }

// Encode writes all fields.
func (r RETH) Encode(f *RETHFields) {
	_ = r[15]
	r.SetVA(f.VA)
	r.SetRKey(f.RKey)
	r.SetDMALen(f.DMALen)
}

// Fields decodes all fields.
func (r RETH) Fields() RETHFields { return RETHFields{VA: r.VA(), RKey: r.RKey(), DMALen: r.DMALen()} }

// AETH is the 4-byte ACK Extended Transport Header: syndrome (1), MSN (3).
type AETH []byte

// AETHFields holds the fields of an AETH.
type AETHFields struct {
	Syndrome Syndrome
	MSN      uint32 // 24 bits
}

// Syndrome returns the syndrome byte.
func (a AETH) Syndrome() Syndrome { return Syndrome(a[0]) }

// MSN returns the 24-bit message sequence number.
func (a AETH) MSN() uint32 { return get24(a[1:]) }

// SetSyndrome sets the syndrome.
func (a AETH) SetSyndrome(s Syndrome) { a[0] = byte(s) }

// SetMSN sets the MSN (masked to 24 bits).
func (a AETH) SetMSN(m uint32) { put24(a[1:], m&0xFFFFFF) }

// Encode writes all fields.
func (a AETH) Encode(f *AETHFields) {
	_ = a[3]
	a[0] = byte(f.Syndrome)
	a.SetMSN(f.MSN)
}

// Fields decodes all fields.
func (a AETH) Fields() AETHFields { return AETHFields{Syndrome: a.Syndrome(), MSN: a.MSN()} }

// Syndrome is the AETH syndrome byte: bit 7 reserved (0), bits 6-5 the type, bits 4-0 a value
// (credit count, RNR timer code or NAK code). See IBA 9.7.5.1 and rxe_comp.c/rxe_resp.c.
type Syndrome uint8

// SyndromeType is bits 6-5 of a Syndrome (rxe masks the syndrome with 0xE0).
type SyndromeType uint8

// Syndrome types (torvalds/linux:drivers/infiniband/sw/rxe/rxe_hdr.h AETH_ACK etc.).
const (
	SyndromeACK      SyndromeType = 0x00
	SyndromeRNRNAK   SyndromeType = 0x20
	SyndromeReserved SyndromeType = 0x40
	SyndromeNAK      SyndromeType = 0x60
)

func (t SyndromeType) String() string {
	switch t {
	case SyndromeACK:
		return "ACK"
	case SyndromeRNRNAK:
		return "RNR_NAK"
	case SyndromeNAK:
		return "NAK"
	}
	return "RESERVED"
}

// SyndromeACKUnlimited is ACK with the "invalid credit count" value 0x1F, the only ACK rxe sends
// (torvalds/linux:drivers/infiniband/sw/rxe/rxe_hdr.h AETH_ACK_UNLIMITED).
const SyndromeACKUnlimited Syndrome = 0x1F

// ACKSyndrome returns an ACK syndrome with the given credit count (0..30; values outside select
// the "unlimited"/invalid credit encoding 0x1F).
func ACKSyndrome(credits int) Syndrome {
	if credits < 0 || credits > 30 {
		return SyndromeACKUnlimited
	}
	return Syndrome(credits)
}

// RNRNAKSyndrome returns an RNR NAK syndrome carrying timer code t.
func RNRNAKSyndrome(t RNRTimer) Syndrome { return Syndrome(SyndromeRNRNAK) | Syndrome(t&0x1F) }

// Type returns the syndrome type (ACK, RNR NAK, NAK or reserved). A syndrome with bit 7 set is
// reported as reserved.
func (s Syndrome) Type() SyndromeType {
	if s&0x80 != 0 {
		return SyndromeReserved
	}
	return SyndromeType(s & 0x60)
}

// Credits returns the credit count of an ACK syndrome; valid is false for 0x1F (invalid /
// unlimited credits) and for non-ACK syndromes.
func (s Syndrome) Credits() (n int, valid bool) {
	if s.Type() != SyndromeACK || s&0x1F == 0x1F {
		return 0, false
	}
	return int(s & 0x1F), true
}

// RNRTimer returns the RNR timer code of an RNR NAK syndrome (meaningless for other types).
func (s Syndrome) RNRTimer() RNRTimer { return RNRTimer(s & 0x1F) }

// NakCode returns the NAK code of a NAK syndrome (the whole syndrome byte, 0x60..0x7F).
func (s Syndrome) NakCode() NakCode { return NakCode(s) }

func (s Syndrome) String() string {
	switch s.Type() {
	case SyndromeACK:
		if n, ok := s.Credits(); ok {
			return "ACK(credits=" + strconv.Itoa(n) + ")"
		}
		return "ACK"
	case SyndromeRNRNAK:
		return "RNR_NAK(timer=" + strconv.Itoa(int(s.RNRTimer())) + ")"
	case SyndromeNAK:
		return "NAK(" + s.NakCode().String() + ")"
	}
	return "Syndrome(0x" + strconv.FormatUint(uint64(s), 16) + ")"
}

// NakCode is a NAK syndrome byte (type 0x60 | code). IBA 9.7.5.2.4; rxe_hdr.h AETH_NAK_*.
type NakCode uint8

// NAK codes.
const (
	NakPSNSequenceError  NakCode = 0x60 // rxe_hdr.h AETH_NAK_PSN_SEQ_ERROR
	NakInvalidRequest    NakCode = 0x61 // AETH_NAK_INVALID_REQ -> IB_WC_REM_INV_REQ_ERR
	NakRemoteAccessError NakCode = 0x62 // AETH_NAK_REM_ACC_ERR -> IB_WC_REM_ACCESS_ERR
	NakRemoteOperational NakCode = 0x63 // AETH_NAK_REM_OP_ERR -> IB_WC_REM_OP_ERR
	NakInvalidRDRequest  NakCode = 0x64 // IBA only; rxe maps unknown NAKs to REM_OP_ERR
)

// Syndrome returns the syndrome byte carrying c.
func (c NakCode) Syndrome() Syndrome { return Syndrome(0x60 | c&0x1F) }

// Known reports whether c is one of the NAK codes rxe defines (0x60-0x63).
func (c NakCode) Known() bool { return c >= NakPSNSequenceError && c <= NakRemoteOperational }

func (c NakCode) String() string {
	switch c {
	case NakPSNSequenceError:
		return "PSN_SEQUENCE_ERROR"
	case NakInvalidRequest:
		return "INVALID_REQUEST"
	case NakRemoteAccessError:
		return "REMOTE_ACCESS_ERROR"
	case NakRemoteOperational:
		return "REMOTE_OPERATIONAL_ERROR"
	case NakInvalidRDRequest:
		return "INVALID_RD_REQUEST"
	}
	return "NakCode(0x" + strconv.FormatUint(uint64(c), 16) + ")"
}

// RNRTimer is the 5-bit RNR NAK timer code (IBA table 45).
type RNRTimer uint8

// rnrTimerMicros is indexed by the timer code (torvalds/linux:drivers/infiniband/sw/rxe/rxe_comp.c
// rnrnak_usec; code 25 is 61440 us, rxe's table has a 61410 typo).
var rnrTimerMicros = [32]uint32{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880,
	163840, 245760, 327680, 491520,
}

// Duration returns the time the requester waits before retrying after an RNR NAK with code t.
func (t RNRTimer) Duration() time.Duration {
	return time.Duration(rnrTimerMicros[t&0x1F]) * time.Microsecond
}

// IETH is the 4-byte Invalidate ETH: the R_Key to invalidate.
type IETH []byte

// RKey returns the R_Key to invalidate.
func (h IETH) RKey() uint32 { return binary.BigEndian.Uint32(h) }

// SetRKey sets the R_Key to invalidate.
func (h IETH) SetRKey(k uint32) { binary.BigEndian.PutUint32(h, k) }

// ImmDt is the 4-byte immediate data. It is opaque; the accessors use network order as rxe
// passes it through unchanged.
type ImmDt []byte

// Imm returns the immediate data as a big-endian integer.
func (h ImmDt) Imm() uint32 { return binary.BigEndian.Uint32(h) }

// SetImm sets the immediate data.
func (h ImmDt) SetImm(v uint32) { binary.BigEndian.PutUint32(h, v) }

// DETH is the 8-byte Datagram ETH: Q_Key (4), reserved (1), source QP (3).
type DETH []byte

// DETHFields holds the fields of a DETH.
type DETHFields struct {
	QKey  uint32
	SrcQP uint32 // 24 bits
}

// QKey returns the queue key.
func (h DETH) QKey() uint32 { return binary.BigEndian.Uint32(h) }

// SrcQP returns the 24-bit source QP number.
func (h DETH) SrcQP() uint32 { return get24(h[5:]) }

// SetQKey sets the queue key.
func (h DETH) SetQKey(k uint32) { binary.BigEndian.PutUint32(h, k) }

// SetSrcQP sets the source QP (masked to 24 bits).
func (h DETH) SetSrcQP(q uint32) { put24(h[5:], q&qpnMask) }

// Encode writes all fields; the reserved byte is written as zero.
func (h DETH) Encode(f *DETHFields) {
	_ = h[7]
	h.SetQKey(f.QKey)
	h[4] = 0
	h.SetSrcQP(f.SrcQP)
}

// Fields decodes all fields.
func (h DETH) Fields() DETHFields { return DETHFields{QKey: h.QKey(), SrcQP: h.SrcQP()} }

// RDETH is the 4-byte Reliable Datagram ETH: reserved (1), EE context (3). RD is not
// supported; the view exists so that RD packets can be parsed and rejected.
type RDETH []byte

// EEContext returns the 24-bit end-to-end context.
func (h RDETH) EEContext() uint32 { return get24(h[1:]) }

// FETH is the 4-byte Flush ETH (RC FLUSH, rxe >= v6.2): selectivity level in bits 5-4 and
// placement type in bits 3-0 of the last byte. Parse only.
type FETH []byte

// SelectivityLevel returns the flush selectivity level.
func (h FETH) SelectivityLevel() uint8 { return h[3] >> 4 & 3 }

// PlacementType returns the flush placement type.
func (h FETH) PlacementType() uint8 { return h[3] & 0xF }

// AtomicETH is the 28-byte Atomic ETH: VA (8), R_Key (4), swap/add data (8), compare data (8).
// softroce does not execute atomics; the view exists so that they can be parsed and NAKed.
type AtomicETH []byte

// VA returns the remote virtual address.
func (h AtomicETH) VA() uint64 { return binary.BigEndian.Uint64(h) }

// RKey returns the remote key.
func (h AtomicETH) RKey() uint32 { return binary.BigEndian.Uint32(h[8:]) }

// SwapAdd returns the swap (compare-swap) or add (fetch-add) operand.
func (h AtomicETH) SwapAdd() uint64 { return binary.BigEndian.Uint64(h[12:]) }

// Compare returns the compare operand (compare-swap).
func (h AtomicETH) Compare() uint64 { return binary.BigEndian.Uint64(h[20:]) }

// AtomicAckETH is the 8-byte Atomic ACK ETH: the original remote data. Parse only.
type AtomicAckETH []byte

// OrigData returns the original remote data.
func (h AtomicAckETH) OrigData() uint64 { return binary.BigEndian.Uint64(h) }
