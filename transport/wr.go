package transport

import "strconv"

// SGE is a scatter/gather element: Length bytes at device address Addr, inside an MR whose lkey
// is LKey (ib_sge). The engine checks the lkey (index and full key), the MR's PD, its state, the
// range and, where the engine writes into it (receive buffers, RDMA READ destinations), that the
// MR grants LocalWrite. Any failure completes the WR with WCLocProtErr.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
	// Host, when not nil, is the element's bytes in process memory instead of a registered
	// range (Addr and LKey are ignored; Length must be len(Host)): a source the ULP need not
	// copy into registered memory first (a RAM LUN's data sent as it lies). Only in the gather
	// list of SEND and RDMA WRITE work requests, and only on devices whose DeviceAttr.HostSGE
	// is set (softroce, which reads the bytes when it builds or sends the packets; a NIC could
	// not reach them without a registration); elsewhere the post fails with ErrInvalidWR. The
	// caller keeps the slice, and for a correct transfer its bytes, as they are until the WR
	// completes.
	Host []byte
}

// WROpcode is a send work-request opcode, with the values of enum ib_wr_opcode.
type WROpcode uint8

// Send work-request opcodes (IB values). Atomics are defined for completeness; softroce refuses
// them at post time with ErrInvalidOpcode.
const (
	WRRDMAWrite        WROpcode = 0  // IB_WR_RDMA_WRITE
	WRRDMAWriteWithImm WROpcode = 1  // IB_WR_RDMA_WRITE_WITH_IMM
	WRSend             WROpcode = 2  // IB_WR_SEND
	WRSendWithImm      WROpcode = 3  // IB_WR_SEND_WITH_IMM
	WRRDMARead         WROpcode = 4  // IB_WR_RDMA_READ
	WRAtomicCmpSwp     WROpcode = 5  // IB_WR_ATOMIC_CMP_AND_SWP (not supported by softroce)
	WRAtomicFetchAdd   WROpcode = 6  // IB_WR_ATOMIC_FETCH_AND_ADD (not supported by softroce)
	WRSendWithInv      WROpcode = 8  // IB_WR_SEND_WITH_INV
	WRLocalInv         WROpcode = 10 // IB_WR_LOCAL_INV
	WRRegMR            WROpcode = 11 // IB_WR_REG_MR
)

func (o WROpcode) String() string {
	switch o {
	case WRRDMAWrite:
		return "RDMA_WRITE"
	case WRRDMAWriteWithImm:
		return "RDMA_WRITE_WITH_IMM"
	case WRSend:
		return "SEND"
	case WRSendWithImm:
		return "SEND_WITH_IMM"
	case WRRDMARead:
		return "RDMA_READ"
	case WRAtomicCmpSwp:
		return "ATOMIC_CMP_AND_SWP"
	case WRAtomicFetchAdd:
		return "ATOMIC_FETCH_AND_ADD"
	case WRSendWithInv:
		return "SEND_WITH_INV"
	case WRLocalInv:
		return "LOCAL_INV"
	case WRRegMR:
		return "REG_MR"
	}
	return "WR_OPCODE(" + strconv.Itoa(int(o)) + ")"
}

// CompletionOpcode is the WCOpcode a successful completion of this WR carries.
func (o WROpcode) CompletionOpcode() WCOpcode {
	switch o {
	case WRRDMAWrite, WRRDMAWriteWithImm:
		return WCRDMAWrite
	case WRRDMARead:
		return WCRDMARead
	case WRAtomicCmpSwp:
		return WCCompSwap
	case WRAtomicFetchAdd:
		return WCFetchAdd
	case WRLocalInv:
		return WCLocalInv
	case WRRegMR:
		return WCRegMR
	}
	return WCSend
}

// SendFlags are the ib_send_flags bits.
type SendFlags uint8

// Send flags (IB values).
const (
	// SendFence: do not start this WR until every earlier RDMA READ (and atomic) on the SQ has
	// completed. (LOCAL_INV is always fenced against *all* earlier WRs, as rxe does.)
	SendFence SendFlags = 1 << 0
	// SendSignaled: produce a completion on success (always produced on error). Ignored when the
	// QP was created with SQSigAll.
	SendSignaled SendFlags = 1 << 1
	// SendSolicited: set the SE bit on the last packet (SEND*, RDMA_WRITE_WITH_IMM).
	SendSolicited SendFlags = 1 << 2
	// SendInline: the SGL's bytes are copied at post time (no lkey check; addresses must still be
	// device memory); total length ≤ MaxInlineData. SEND* and RDMA_WRITE* only.
	SendInline SendFlags = 1 << 3
)

// RegMRWR is the part of a send WR specific to REG_MR (ib_reg_wr plus what ib_map_mr_sg puts in
// the ib_mr): everything the registration will install, carried by the WR itself.
type RegMRWR struct {
	MR     MR     // a fast-reg MR of the QP's PD (from PD.AllocFastRegMR), FREE when this executes
	Key    uint32 // full new key: MR index << 8 | key byte; the index must be the MR's
	Access Access // access granted by the registration
	IOVA   uint64 // address remote peers (and SGEs) will use for the first byte
	Length uint64 // bytes covered, starting at IOVA; ≤ len(Pages)*PageSize - (IOVA offset in page)
	// PageSize is a power of two ≥ 4096 (Device.Attr().PageSizeCap lists what the device takes).
	PageSize uint32
	// Pages are device addresses of PageSize-aligned pages; Pages[i] backs IOVA-aligned page i.
	// The engine keeps this slice (no copy at post) and copies it when the WR executes: do not
	// modify it until this WR, or a later one on the same SQ, has completed.
	Pages []uint64
}

// SendWR is a send work request (ib_send_wr with its RDMA / REG_MR extensions flattened).
// Only the fields relevant to Opcode are read.
type SendWR struct {
	ID     uint64
	Opcode WROpcode
	Flags  SendFlags
	// SGL is the local data (SEND*, RDMA_WRITE*: source; RDMA_READ: destination, needs
	// LocalWrite). The engine copies the SGEs (and inline bytes) at post time.
	SGL []SGE
	// Imm is the immediate data for *_WITH_IMM, sent big-endian on the wire.
	Imm uint32
	// InvalidateRKey is the key to invalidate: at the peer for SEND_WITH_INV (IETH), locally for
	// LOCAL_INV (it must equal the key in force of that MR, else WCLocQPOpErr and QP error).
	InvalidateRKey uint32
	// RemoteAddr and RKey address the peer's memory for RDMA_WRITE*, RDMA_READ.
	RemoteAddr uint64
	RKey       uint32
	// Reg is used by REG_MR.
	Reg RegMRWR
}

// RecvWR is a receive work request (ib_recv_wr). Every SGE needs LocalWrite.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}
