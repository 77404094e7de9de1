package wire

import "strconv"

// Opcode is the BTH OpCode: bits 7-5 the transport, bits 4-0 the operation
// (torvalds/linux:include/rdma/ib_pack.h).
type Opcode uint8

// Transport is the transport service an opcode belongs to (BTH opcode bits 7-5).
type Transport uint8

// Transports (torvalds/linux:include/rdma/ib_pack.h IB_OPCODE_RC etc.).
const (
	TransportRC  Transport = 0x00
	TransportUC  Transport = 0x20
	TransportRD  Transport = 0x40
	TransportUD  Transport = 0x60
	TransportCNP Transport = 0x80
)

func (t Transport) String() string {
	switch t {
	case TransportRC:
		return "RC"
	case TransportUC:
		return "UC"
	case TransportRD:
		return "RD"
	case TransportUD:
		return "UD"
	case TransportCNP:
		return "CNP"
	}
	return "Transport(0x" + strconv.FormatUint(uint64(t), 16) + ")"
}

// Operation codes, OR-ed with a Transport (torvalds/linux:include/rdma/ib_pack.h).
const (
	opSendFirst              = 0x00
	opSendMiddle             = 0x01
	opSendLast               = 0x02
	opSendLastWithImmediate  = 0x03
	opSendOnly               = 0x04
	opSendOnlyWithImmediate  = 0x05
	opRDMAWriteFirst         = 0x06
	opRDMAWriteMiddle        = 0x07
	opRDMAWriteLast          = 0x08
	opRDMAWriteLastWithImm   = 0x09
	opRDMAWriteOnly          = 0x0A
	opRDMAWriteOnlyWithImm   = 0x0B
	opRDMAReadRequest        = 0x0C
	opRDMAReadResponseFirst  = 0x0D
	opRDMAReadResponseMiddle = 0x0E
	opRDMAReadResponseLast   = 0x0F
	opRDMAReadResponseOnly   = 0x10
	opAcknowledge            = 0x11
	opAtomicAcknowledge      = 0x12
	opCompareSwap            = 0x13
	opFetchAdd               = 0x14
	opSendLastWithInvalidate = 0x16
	opSendOnlyWithInvalidate = 0x17
	opFlush                  = 0x1C
	opAtomicWrite            = 0x1D
	opCNP                    = 0x01
	numOpcodes               = 256
)

// Opcodes. RC, UC and UD opcodes as rxe implements them, RD opcodes as in rxe's table (rxe
// rejects them at QP lookup), the RC FLUSH/ATOMIC WRITE extensions (rxe >= v6.2) and the
// RoCEv2 congestion notification packet.
const (
	RCSendFirst                  = Opcode(TransportRC) | opSendFirst
	RCSendMiddle                 = Opcode(TransportRC) | opSendMiddle
	RCSendLast                   = Opcode(TransportRC) | opSendLast
	RCSendLastWithImmediate      = Opcode(TransportRC) | opSendLastWithImmediate
	RCSendOnly                   = Opcode(TransportRC) | opSendOnly
	RCSendOnlyWithImmediate      = Opcode(TransportRC) | opSendOnlyWithImmediate
	RCRDMAWriteFirst             = Opcode(TransportRC) | opRDMAWriteFirst
	RCRDMAWriteMiddle            = Opcode(TransportRC) | opRDMAWriteMiddle
	RCRDMAWriteLast              = Opcode(TransportRC) | opRDMAWriteLast
	RCRDMAWriteLastWithImmediate = Opcode(TransportRC) | opRDMAWriteLastWithImm
	RCRDMAWriteOnly              = Opcode(TransportRC) | opRDMAWriteOnly
	RCRDMAWriteOnlyWithImmediate = Opcode(TransportRC) | opRDMAWriteOnlyWithImm
	RCRDMAReadRequest            = Opcode(TransportRC) | opRDMAReadRequest
	RCRDMAReadResponseFirst      = Opcode(TransportRC) | opRDMAReadResponseFirst
	RCRDMAReadResponseMiddle     = Opcode(TransportRC) | opRDMAReadResponseMiddle
	RCRDMAReadResponseLast       = Opcode(TransportRC) | opRDMAReadResponseLast
	RCRDMAReadResponseOnly       = Opcode(TransportRC) | opRDMAReadResponseOnly
	RCAcknowledge                = Opcode(TransportRC) | opAcknowledge
	RCAtomicAcknowledge          = Opcode(TransportRC) | opAtomicAcknowledge
	RCCompareSwap                = Opcode(TransportRC) | opCompareSwap
	RCFetchAdd                   = Opcode(TransportRC) | opFetchAdd
	RCSendLastWithInvalidate     = Opcode(TransportRC) | opSendLastWithInvalidate
	RCSendOnlyWithInvalidate     = Opcode(TransportRC) | opSendOnlyWithInvalidate
	RCFlush                      = Opcode(TransportRC) | opFlush
	RCAtomicWrite                = Opcode(TransportRC) | opAtomicWrite
	UCSendFirst                  = Opcode(TransportUC) | opSendFirst
	UCSendMiddle                 = Opcode(TransportUC) | opSendMiddle
	UCSendLast                   = Opcode(TransportUC) | opSendLast
	UCSendLastWithImmediate      = Opcode(TransportUC) | opSendLastWithImmediate
	UCSendOnly                   = Opcode(TransportUC) | opSendOnly
	UCSendOnlyWithImmediate      = Opcode(TransportUC) | opSendOnlyWithImmediate
	UCRDMAWriteFirst             = Opcode(TransportUC) | opRDMAWriteFirst
	UCRDMAWriteMiddle            = Opcode(TransportUC) | opRDMAWriteMiddle
	UCRDMAWriteLast              = Opcode(TransportUC) | opRDMAWriteLast
	UCRDMAWriteLastWithImmediate = Opcode(TransportUC) | opRDMAWriteLastWithImm
	UCRDMAWriteOnly              = Opcode(TransportUC) | opRDMAWriteOnly
	UCRDMAWriteOnlyWithImmediate = Opcode(TransportUC) | opRDMAWriteOnlyWithImm
	RDSendFirst                  = Opcode(TransportRD) | opSendFirst
	RDSendMiddle                 = Opcode(TransportRD) | opSendMiddle
	RDSendLast                   = Opcode(TransportRD) | opSendLast
	RDSendLastWithImmediate      = Opcode(TransportRD) | opSendLastWithImmediate
	RDSendOnly                   = Opcode(TransportRD) | opSendOnly
	RDSendOnlyWithImmediate      = Opcode(TransportRD) | opSendOnlyWithImmediate
	RDRDMAWriteFirst             = Opcode(TransportRD) | opRDMAWriteFirst
	RDRDMAWriteMiddle            = Opcode(TransportRD) | opRDMAWriteMiddle
	RDRDMAWriteLast              = Opcode(TransportRD) | opRDMAWriteLast
	RDRDMAWriteLastWithImmediate = Opcode(TransportRD) | opRDMAWriteLastWithImm
	RDRDMAWriteOnly              = Opcode(TransportRD) | opRDMAWriteOnly
	RDRDMAWriteOnlyWithImmediate = Opcode(TransportRD) | opRDMAWriteOnlyWithImm
	RDRDMAReadRequest            = Opcode(TransportRD) | opRDMAReadRequest
	RDRDMAReadResponseFirst      = Opcode(TransportRD) | opRDMAReadResponseFirst
	RDRDMAReadResponseMiddle     = Opcode(TransportRD) | opRDMAReadResponseMiddle
	RDRDMAReadResponseLast       = Opcode(TransportRD) | opRDMAReadResponseLast
	RDRDMAReadResponseOnly       = Opcode(TransportRD) | opRDMAReadResponseOnly
	RDAcknowledge                = Opcode(TransportRD) | opAcknowledge
	RDAtomicAcknowledge          = Opcode(TransportRD) | opAtomicAcknowledge
	RDCompareSwap                = Opcode(TransportRD) | opCompareSwap
	RDFetchAdd                   = Opcode(TransportRD) | opFetchAdd
	UDSendOnly                   = Opcode(TransportUD) | opSendOnly
	UDSendOnlyWithImmediate      = Opcode(TransportUD) | opSendOnlyWithImmediate
	CNP                          = Opcode(TransportCNP) | opCNP
)

// OpFlags describes an opcode: which extended headers follow the BTH and what the packet means.
// The classification mirrors rxe's RXE_*_MASK bits
// (torvalds/linux:drivers/infiniband/sw/rxe/rxe_opcode.h).
type OpFlags uint32

// Header-presence flags.
const (
	HasRDETH        OpFlags = 1 << iota // Reliable Datagram ETH (RD only)
	HasDETH                             // Datagram ETH (UD, RD)
	HasRETH                             // RDMA ETH
	HasAtomicETH                        // Atomic ETH (requests)
	HasAETH                             // ACK ETH
	HasAtomicAckETH                     // Atomic ACK ETH
	HasImmDt                            // Immediate data
	HasIETH                             // Invalidate ETH
	HasFETH                             // Flush ETH
	HasPayload                          // the packet may carry payload bytes

	// Request is set for requester-to-responder packets (rxe RXE_REQ_MASK).
	Request
	// Response is set for responder-to-requester packets: ACKs and read responses (RXE_ACK_MASK).
	Response
	// First marks the start of a message (RXE_START_MASK): FIRST and ONLY packets.
	First
	// Middle marks a MIDDLE packet (RXE_MIDDLE_MASK).
	Middle
	// Last marks the end of a message (RXE_END_MASK): LAST and ONLY packets.
	Last
	// ConsumesRecvWQE is set when the packet needs a posted receive at the responder
	// (RXE_RWR_MASK: SEND FIRST/ONLY, RDMA WRITE with immediate).
	ConsumesRecvWQE
	// Completes is set when executing the packet completes a receive WQE (RXE_COMP_MASK).
	Completes
	Send        // a SEND packet (RXE_SEND_MASK)
	Write       // an RDMA WRITE packet (RXE_WRITE_MASK)
	Read        // an RDMA READ request (RXE_READ_MASK)
	Atomic      // a compare-swap / fetch-add request (RXE_ATOMIC_MASK)
	ReadResp    // an RDMA READ response packet
	Ack         // an ACKNOWLEDGE or ATOMIC ACKNOWLEDGE
	AtomicWrite // RC ATOMIC WRITE (RXE_ATOMIC_WRITE_MASK)
	FlushOp     // RC FLUSH (RXE_FLUSH_MASK)
	Congestion  // a RoCEv2 CNP
)

// Extended header sizes (torvalds/linux:drivers/infiniband/sw/rxe/rxe_hdr.h).
const (
	BTHLen          = 12
	RDETHLen        = 4
	DETHLen         = 8
	RETHLen         = 16
	AtomicETHLen    = 28
	AETHLen         = 4
	AtomicAckETHLen = 8
	ImmDtLen        = 4
	IETHLen         = 4
	FETHLen         = 4
	ICRCLen         = 4
	// MaxHeaderLen is the longest BTH + extended headers of any known opcode.
	MaxHeaderLen = BTHLen + RDETHLen + DETHLen + AtomicETHLen // 52: RD atomics
)

type opInfo struct {
	name  string
	flags OpFlags
	hlen  uint8 // BTH + extended headers
	// offsets of each extended header from the start of the BTH; 0 = absent.
	rdeth, deth, reth, atmeth, aeth, atmack, immdt, ieth, feth uint8
	valid                                                      bool
}

// opTable is built once at init and never mutated.
var opTable = buildOpTable()

func buildOpTable() (t [numOpcodes]opInfo) {
	type def struct {
		op    uint8
		name  string
		flags OpFlags
	}
	// Per-operation definitions for RC; UC/RD reuse the subset that exists for them.
	const (
		sendF = Send | HasPayload | Request
	)
	ops := []def{
		{opSendFirst, "SEND_FIRST", sendF | ConsumesRecvWQE | First},
		{opSendMiddle, "SEND_MIDDLE", sendF | Middle},
		{opSendLast, "SEND_LAST", sendF | Completes | Last},
		{opSendLastWithImmediate, "SEND_LAST_WITH_IMMEDIATE", sendF | HasImmDt | Completes | Last},
		{opSendOnly, "SEND_ONLY", sendF | ConsumesRecvWQE | Completes | First | Last},
		{opSendOnlyWithImmediate, "SEND_ONLY_WITH_IMMEDIATE", sendF | HasImmDt | ConsumesRecvWQE | Completes | First | Last},
		{opRDMAWriteFirst, "RDMA_WRITE_FIRST", Write | HasPayload | Request | HasRETH | First},
		{opRDMAWriteMiddle, "RDMA_WRITE_MIDDLE", Write | HasPayload | Request | Middle},
		{opRDMAWriteLast, "RDMA_WRITE_LAST", Write | HasPayload | Request | Last},
		{opRDMAWriteLastWithImm, "RDMA_WRITE_LAST_WITH_IMMEDIATE", Write | HasPayload | Request | HasImmDt | ConsumesRecvWQE | Completes | Last},
		{opRDMAWriteOnly, "RDMA_WRITE_ONLY", Write | HasPayload | Request | HasRETH | First | Last},
		{opRDMAWriteOnlyWithImm, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", Write | HasPayload | Request | HasRETH | HasImmDt | ConsumesRecvWQE | Completes | First | Last},
		{opRDMAReadRequest, "RDMA_READ_REQUEST", Read | Request | HasRETH | First | Last},
		{opRDMAReadResponseFirst, "RDMA_READ_RESPONSE_FIRST", ReadResp | Response | HasPayload | HasAETH | First},
		{opRDMAReadResponseMiddle, "RDMA_READ_RESPONSE_MIDDLE", ReadResp | Response | HasPayload | Middle},
		{opRDMAReadResponseLast, "RDMA_READ_RESPONSE_LAST", ReadResp | Response | HasPayload | HasAETH | Last},
		{opRDMAReadResponseOnly, "RDMA_READ_RESPONSE_ONLY", ReadResp | Response | HasPayload | HasAETH | First | Last},
		{opAcknowledge, "ACKNOWLEDGE", Ack | Response | HasAETH | First | Last},
		{opAtomicAcknowledge, "ATOMIC_ACKNOWLEDGE", Ack | Response | HasAETH | HasAtomicAckETH | First | Last},
		{opCompareSwap, "COMPARE_SWAP", Atomic | Request | HasAtomicETH | First | Last},
		{opFetchAdd, "FETCH_ADD", Atomic | Request | HasAtomicETH | First | Last},
		{opSendLastWithInvalidate, "SEND_LAST_WITH_INVALIDATE", sendF | HasIETH | Completes | Last},
		{opSendOnlyWithInvalidate, "SEND_ONLY_WITH_INVALIDATE", sendF | HasIETH | ConsumesRecvWQE | Completes | First | Last},
		{opFlush, "FLUSH", FlushOp | Request | HasFETH | HasRETH | First | Last},
		{opAtomicWrite, "ATOMIC_WRITE", AtomicWrite | Request | HasRETH | HasPayload | First | Last},
	}
	ucOps := map[uint8]bool{
		opSendFirst: true, opSendMiddle: true, opSendLast: true, opSendLastWithImmediate: true,
		opSendOnly: true, opSendOnlyWithImmediate: true, opRDMAWriteFirst: true,
		opRDMAWriteMiddle: true, opRDMAWriteLast: true, opRDMAWriteLastWithImm: true,
		opRDMAWriteOnly: true, opRDMAWriteOnlyWithImm: true,
	}
	for _, d := range ops {
		t[uint8(TransportRC)|d.op] = layout("RC_"+d.name, d.flags)
		if ucOps[d.op] {
			t[uint8(TransportUC)|d.op] = layout("UC_"+d.name, d.flags)
		}
		if d.op <= opFetchAdd {
			f := d.flags | HasRDETH
			if f&Request != 0 {
				f |= HasDETH
			}
			t[uint8(TransportRD)|d.op] = layout("RD_"+d.name, f)
		}
		if d.op == opSendOnly || d.op == opSendOnlyWithImmediate {
			t[uint8(TransportUD)|d.op] = layout("UD_"+d.name, d.flags|HasDETH)
		}
	}
	// RoCEv2 CNP: BTH followed by 16 reserved bytes (IBA Annex A17).
	t[uint8(TransportCNP)|opCNP] = layout("CNP", Congestion|HasPayload)
	return t
}

// layout computes header offsets. The order of extended headers is rxe's
// (torvalds/linux:drivers/infiniband/sw/rxe/rxe_opcode.c): RDETH, DETH, then FETH before RETH
// (FLUSH), RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH.
func layout(name string, f OpFlags) opInfo {
	in := opInfo{name: name, flags: f, valid: true}
	off := uint8(BTHLen)
	put := func(has OpFlags, dst *uint8, n uint8) {
		if f&has != 0 {
			*dst = off
			off += n
		}
	}
	put(HasRDETH, &in.rdeth, RDETHLen)
	put(HasDETH, &in.deth, DETHLen)
	put(HasFETH, &in.feth, FETHLen)
	put(HasRETH, &in.reth, RETHLen)
	put(HasAtomicETH, &in.atmeth, AtomicETHLen)
	put(HasAETH, &in.aeth, AETHLen)
	put(HasAtomicAckETH, &in.atmack, AtomicAckETHLen)
	put(HasImmDt, &in.immdt, ImmDtLen)
	put(HasIETH, &in.ieth, IETHLen)
	in.hlen = off
	return in
}

// Valid reports whether o is an opcode this package knows.
func (o Opcode) Valid() bool { return opTable[o].valid }

// Transport returns the transport service (bits 7-5).
func (o Opcode) Transport() Transport { return Transport(o & 0xE0) }

// Flags returns the opcode's flags; 0 for an unknown opcode.
func (o Opcode) Flags() OpFlags { return opTable[o].flags }

// Is reports whether all of the flags in f are set for o.
func (o Opcode) Is(f OpFlags) bool { return opTable[o].flags&f == f && f != 0 }

// HeaderLen returns the length of the BTH plus the extended headers of o, or 0 if o is unknown.
func (o Opcode) HeaderLen() int { return int(opTable[o].hlen) }

// String returns the ib_pack.h name without the IB_OPCODE_ prefix, e.g. "RC_SEND_ONLY".
func (o Opcode) String() string {
	if in := &opTable[o]; in.valid {
		return in.name
	}
	return "Opcode(0x" + strconv.FormatUint(uint64(o), 16) + ")"
}

// PayloadLenOK reports whether n payload bytes are allowed for o at path MTU mtu, by the rules
// rxe's responder applies (torvalds/linux:drivers/infiniband/sw/rxe/rxe_resp.c check_length,
// and IBA 9.7.7): no payload for opcodes without one; FIRST and MIDDLE packets carry exactly
// mtu bytes; LAST packets 1..mtu (a 0-byte LAST is invalid); ONLY packets (and UD sends)
// 0..mtu; ATOMIC WRITE exactly 8; a CNP its 16 reserved bytes. The RDMA WRITE residual-length
// rule (the last packet carries exactly what the RETH length leaves) needs message state and is
// the engine's.
func (o Opcode) PayloadLenOK(n, mtu int) bool {
	f := opTable[o].flags
	switch {
	case !opTable[o].valid || n < 0:
		return false
	case f&HasPayload == 0:
		return n == 0
	case f&AtomicWrite != 0:
		return n == 8
	case f&Congestion != 0:
		return n == 16
	case f&Middle != 0, f&First != 0 && f&Last == 0:
		return n == mtu
	case f&Last != 0 && f&First == 0:
		return n >= 1 && n <= mtu
	}
	return n <= mtu
}
