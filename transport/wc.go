package transport

import "strconv"

// WCStatus is a work-completion status with the numeric values of enum ib_wc_status
// (torvalds/linux include/rdma/ib_verbs.h, verified at commit 0008b84ea9af).
type WCStatus uint8

// Completion statuses (IB values).
const (
	WCSuccess        WCStatus = 0  // IB_WC_SUCCESS
	WCLocLenErr      WCStatus = 1  // IB_WC_LOC_LEN_ERR: receive buffer too small, length error
	WCLocQPOpErr     WCStatus = 2  // IB_WC_LOC_QP_OP_ERR: e.g. REG_MR/LOCAL_INV failure
	WCLocEECOpErr    WCStatus = 3  // IB_WC_LOC_EEC_OP_ERR (RD only)
	WCLocProtErr     WCStatus = 4  // IB_WC_LOC_PROT_ERR: SGE lkey/range/access check failed
	WCWRFlushErr     WCStatus = 5  // IB_WC_WR_FLUSH_ERR: flushed because the QP is in ERR
	WCMWBindErr      WCStatus = 6  // IB_WC_MW_BIND_ERR
	WCBadRespErr     WCStatus = 7  // IB_WC_BAD_RESP_ERR: unexpected response opcode
	WCLocAccessErr   WCStatus = 8  // IB_WC_LOC_ACCESS_ERR
	WCRemInvReqErr   WCStatus = 9  // IB_WC_REM_INV_REQ_ERR: NAK 0x61, or failed remote invalidate
	WCRemAccessErr   WCStatus = 10 // IB_WC_REM_ACCESS_ERR: NAK 0x62
	WCRemOpErr       WCStatus = 11 // IB_WC_REM_OP_ERR: NAK 0x63 or an unknown NAK code
	WCRetryExcErr    WCStatus = 12 // IB_WC_RETRY_EXC_ERR: transport retry counter exceeded
	WCRNRRetryExcErr WCStatus = 13 // IB_WC_RNR_RETRY_EXC_ERR: RNR retry counter exceeded
	WCLocRDDViolErr  WCStatus = 14 // IB_WC_LOC_RDD_VIOL_ERR
	WCRemInvRDReqErr WCStatus = 15 // IB_WC_REM_INV_RD_REQ_ERR
	WCRemAbortErr    WCStatus = 16 // IB_WC_REM_ABORT_ERR
	WCInvEECNErr     WCStatus = 17 // IB_WC_INV_EECN_ERR
	WCInvEECStateErr WCStatus = 18 // IB_WC_INV_EEC_STATE_ERR
	WCFatalErr       WCStatus = 19 // IB_WC_FATAL_ERR
	WCRespTimeoutErr WCStatus = 20 // IB_WC_RESP_TIMEOUT_ERR
	WCGeneralErr     WCStatus = 21 // IB_WC_GENERAL_ERR
)

var wcStatusNames = [...]string{
	"SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR", "WR_FLUSH_ERR",
	"MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR",
	"REM_OP_ERR", "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR",
	"REM_ABORT_ERR", "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR",
	"GENERAL_ERR",
}

// String returns the IB name without the IB_WC_ prefix, e.g. "REM_ACCESS_ERR".
func (s WCStatus) String() string {
	if int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return "WC_STATUS(" + strconv.Itoa(int(s)) + ")"
}

// WCOpcode is the completion opcode with the values of enum ib_wc_opcode (current kernels).
type WCOpcode uint8

// Completion opcodes (IB values). Receive completions have bit 7 set.
const (
	WCSend            WCOpcode = 0   // IB_WC_SEND (SEND, SEND_WITH_IMM, SEND_WITH_INV)
	WCRDMAWrite       WCOpcode = 1   // IB_WC_RDMA_WRITE (also RDMA_WRITE_WITH_IMM)
	WCRDMARead        WCOpcode = 2   // IB_WC_RDMA_READ
	WCCompSwap        WCOpcode = 3   // IB_WC_COMP_SWAP
	WCFetchAdd        WCOpcode = 4   // IB_WC_FETCH_ADD
	WCLSO             WCOpcode = 5   // IB_WC_LSO
	WCLocalInv        WCOpcode = 6   // IB_WC_LOCAL_INV
	WCRegMR           WCOpcode = 7   // IB_WC_REG_MR
	WCRecv            WCOpcode = 128 // IB_WC_RECV
	WCRecvRDMAWithImm WCOpcode = 129 // IB_WC_RECV_RDMA_WITH_IMM
)

// IsRecv reports whether the opcode is a receive-side completion.
func (o WCOpcode) IsRecv() bool { return o&WCRecv != 0 }

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCCompSwap:
		return "COMP_SWAP"
	case WCFetchAdd:
		return "FETCH_ADD"
	case WCLSO:
		return "LSO"
	case WCLocalInv:
		return "LOCAL_INV"
	case WCRegMR:
		return "REG_MR"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return "WC_OPCODE(" + strconv.Itoa(int(o)) + ")"
}

// WCFlags are the ib_wc_flags bits that apply here.
type WCFlags uint8

// Completion flags (IB values).
const (
	WCWithImm        WCFlags = 1 << 1 // IB_WC_WITH_IMM: Imm is valid
	WCWithInvalidate WCFlags = 1 << 2 // IB_WC_WITH_INVALIDATE: InvalidatedRKey is valid
)

// WC is a work completion. A send-side WC is produced for a signaled WR (or every WR on a QP
// created with SQSigAll) and for every WR that completes in error; every receive WR produces one.
// For an errored or flushed WC only ID, Status, QPN (and Opcode, best effort) are meaningful, as
// in verbs.
type WC struct {
	ID        uint64   // the WR's ID
	Status    WCStatus // IB status
	Opcode    WCOpcode // what completed
	VendorErr uint32   // engine-specific detail for errors (0 if none)
	ByteLen   uint32   // receive: bytes placed; RDMA READ: bytes read
	// Imm is the immediate data (valid if Flags&WCWithImm), as the 32-bit big-endian value
	// carried on the wire, converted to host order.
	Imm uint32
	// InvalidatedRKey is the rkey invalidated by a SEND_WITH_INV from the peer (valid if
	// Flags&WCWithInvalidate). That MR is FREE by the time this completion is seen.
	InvalidatedRKey uint32
	QPN             uint32  // local QP number
	SrcQP           uint32  // remote QP number (receive completions)
	Flags           WCFlags // WITH_IMM / WITH_INVALIDATE
}
