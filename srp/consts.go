package srp

import "strconv"

// Opcode is byte 0 of every SRP IU (byte 11 of the RDMA CM login request).
type Opcode uint8

// Opcodes; torvalds/linux:include/scsi/srp.h.
const (
	OpLoginReq Opcode = 0x00
	OpTskMgmt  Opcode = 0x01
	OpCmd      Opcode = 0x02
	OpILogout  Opcode = 0x03
	OpCredRsp  Opcode = 0x41
	OpAerRsp   Opcode = 0x42
	OpTLogout  Opcode = 0x80
	OpCredReq  Opcode = 0x81
	OpAerReq   Opcode = 0x82
	OpLoginRsp Opcode = 0xc0
	OpRsp      Opcode = 0xc1
	OpLoginRej Opcode = 0xc2
)

var opcodeNames = [...]struct {
	op   Opcode
	name string
}{
	{OpLoginReq, "SRP_LOGIN_REQ"},
	{OpTskMgmt, "SRP_TSK_MGMT"},
	{OpCmd, "SRP_CMD"},
	{OpILogout, "SRP_I_LOGOUT"},
	{OpCredRsp, "SRP_CRED_RSP"},
	{OpAerRsp, "SRP_AER_RSP"},
	{OpTLogout, "SRP_T_LOGOUT"},
	{OpCredReq, "SRP_CRED_REQ"},
	{OpAerReq, "SRP_AER_REQ"},
	{OpLoginRsp, "SRP_LOGIN_RSP"},
	{OpRsp, "SRP_RSP"},
	{OpLoginRej, "SRP_LOGIN_REJ"},
}

func (o Opcode) String() string {
	for _, n := range opcodeNames {
		if n.op == o {
			return n.name
		}
	}
	return "SRP_OPCODE(0x" + strconv.FormatUint(uint64(o), 16) + ")"
}

// IU sizes in bytes; the structs of torvalds/linux:include/scsi/srp.h
// (ib_srp asserts the same sizes at build time).
const (
	LoginReqLen     = 64 // struct srp_login_req
	LoginReqRDMALen = 56 // struct srp_login_req_rdma
	LoginRspLen     = 52 // struct srp_login_rsp (packed)
	LoginRejLen     = 32 // struct srp_login_rej
	ILogoutLen      = 16 // struct srp_i_logout
	TLogoutLen      = 16 // struct srp_t_logout
	TskMgmtLen      = 48 // struct srp_tsk_mgmt
	CmdHdrLen       = 48 // struct srp_cmd, without add_data
	RspHdrLen       = 36 // struct srp_rsp, without data
	CredReqLen      = 16 // struct srp_cred_req
	CredRspLen      = 16 // struct srp_cred_rsp
	AerReqHdrLen    = 36 // struct srp_aer_req, without sense_data
	AerRspLen       = 16 // struct srp_aer_rsp

	DirectDescLen  = 16 // struct srp_direct_buf
	IndirectHdrLen = 20 // struct srp_indirect_buf, without desc_list
	ImmBufLen      = 4  // struct srp_imm_buf

	// MaxAddCDBLen is the largest additional CDB length the one-byte
	// ADDITIONAL CDB LENGTH field can express (its low two bits are
	// reserved), so a CDB is at most 16+252 bytes.
	MaxAddCDBLen = 252

	// DefaultImmDataOffset is the immediate-data offset Linux ib_srp
	// requests: sizeof(struct srp_cmd) + SRP_MAX_ADD_CDB_LEN (16) +
	// sizeof(struct srp_imm_buf) = 68, so that a 32-byte CDB still fits
	// (drivers/infiniband/ulp/srp/ib_srp.h).
	DefaultImmDataOffset = CmdHdrLen + 16 + ImmBufLen
)

// BufFormats is the SUPPORTED / REQUIRED BUFFER FORMATS bit mask of the
// login IUs.
type BufFormats uint16

// Buffer format bits; torvalds/linux:include/scsi/srp.h.
const (
	BufFormatDirect   BufFormats = 1 << 1 // SRP_BUF_FORMAT_DIRECT
	BufFormatIndirect BufFormats = 1 << 2 // SRP_BUF_FORMAT_INDIRECT
)

// DescFormat is one nibble of SRP_CMD's DATA BUFFER DESCRIPTOR FORMATS byte:
// the high nibble describes data-out, the low nibble data-in.
type DescFormat uint8

//go:generate go tool stringer -type=DescFormat,TLogoutReason -linecomment -output=consts_string.go

// Descriptor formats; torvalds/linux:include/scsi/srp.h. The line comments are the String
// names (consts_string.go).
const (
	// SRP_NO_DATA_DESC
	DescNone DescFormat = 0 // none
	// SRP_DATA_DESC_DIRECT
	DescDirect DescFormat = 1 // direct
	// SRP_DATA_DESC_INDIRECT
	DescIndirect DescFormat = 2 // indirect
	// SRP_DATA_DESC_IMM (SRP-2, data-out only)
	DescImmediate DescFormat = 3 // immediate
)

// LoginFlags is SRP_LOGIN_REQ's REQ_FLAGS byte.
type LoginFlags uint8

// Login request flags: SRP_MULTICHAN_*, SRP_IMMED_REQUESTED from
// torvalds/linux:include/scsi/srp.h; SRP_MTCH_ACTION and the *SOLNT bits
// from drivers/infiniband/ulp/srpt/ib_srpt.h.
const (
	MultiChanSingle LoginFlags = 0    // terminate the nexus' other channels
	MultiChanMulti  LoginFlags = 1    // keep the nexus' other channels
	MultiChanMask   LoginFlags = 0x03 // MULTI-CHANNEL ACTION
	LoginLOSOLNT    LoginFlags = 0x10 // logout solicited notification
	LoginCRSOLNT    LoginFlags = 0x20 // credit request solicited notification
	LoginAESOLNT    LoginFlags = 0x40 // asynchronous event solicited notification
	ImmedRequested  LoginFlags = 0x80 // SRP-2: initiator wants immediate data
)

// LoginRspFlags is SRP_LOGIN_RSP's RSP_FLAGS byte.
type LoginRspFlags uint8

// Login response flags; torvalds/linux:include/scsi/srp.h.
const (
	MultiChanNoChan     LoginRspFlags = 0x0  // no existing channels
	MultiChanTerminated LoginRspFlags = 0x1  // existing channels terminated
	MultiChanMaintained LoginRspFlags = 0x2  // existing channels maintained
	MultiChanResultMask LoginRspFlags = 0x3  // MULTI-CHANNEL RESULT
	ImmedSupported      LoginRspFlags = 0x80 // SRP-2: SRP_LOGIN_RSP_IMMED_SUPP
)

// Ext is srpd's extension byte, carried in a byte SRP reserves: SRP_LOGIN_REQ byte 27 (the
// 64-byte form), struct srp_login_req_rdma byte 50 (the first of its reserved bytes) and
// SRP_LOGIN_RSP byte 27. Conforming peers write reserved bytes as zero and ignore them
// (torvalds/linux:drivers/infiniband/ulp/srpt/ib_srpt.c srpt_rdma_cm_req_recv copies only the
// named fields of srp_login_req_rdma; ib_srp.c reads none of SRP_LOGIN_RSP's reserved bytes), so
// a kernel peer never sends an extension and never sees one: a target answers an extension
// only when the initiator's request carried it.
type Ext uint8

// The extensions. A target grants a subset of what the request offers.
const (
	// ExtRemoteInvalidate: REQ, the initiator handles SEND_WITH_INV (a response that invalidates
	// the memory registration of its command, IB remote invalidation); RSP, the target answers
	// a command whose data travels through one direct descriptor with SEND_WITH_INV of that
	// descriptor's key, so the initiator need not post a LOCAL_INV before reusing its buffer.
	ExtRemoteInvalidate Ext = 0x01
)

// RejectReason is SRP_LOGIN_REJ's REASON field.
type RejectReason uint32

// Login reject reasons; enum srp_login_rej_reason in
// torvalds/linux:include/scsi/srp.h.
const (
	RejUnableEstablishChannel  RejectReason = 0x00010000
	RejInsufficientResources   RejectReason = 0x00010001
	RejITIULenTooLarge         RejectReason = 0x00010002
	RejUnableAssociateChannel  RejectReason = 0x00010003
	RejUnsupportedDescFormat   RejectReason = 0x00010004
	RejMultiChannelUnsupported RejectReason = 0x00010005
	RejChannelLimitReached     RejectReason = 0x00010006
)

func (r RejectReason) String() string {
	switch r {
	case RejUnableEstablishChannel:
		return "unable to establish RDMA channel, no reason specified"
	case RejInsufficientResources:
		return "insufficient RDMA channel resources"
	case RejITIULenTooLarge:
		return "requested maximum initiator to target IU length too large"
	case RejUnableAssociateChannel:
		return "unable to associate RDMA channel with specified I_T nexus"
	case RejUnsupportedDescFormat:
		return "requested buffer descriptor format not supported"
	case RejMultiChannelUnsupported:
		return "multiple RDMA channels not supported with this I_T nexus"
	case RejChannelLimitReached:
		return "no more RDMA channels available for this initiator"
	}
	return "RejectReason(0x" + strconv.FormatUint(uint64(r), 16) + ")"
}

// TLogoutReason is SRP_T_LOGOUT's REASON field. The values are not in
// Linux's srp.h; they come from ipxe/ipxe:src/include/ipxe/srp.h. Code 7 is
// not defined there.
type TLogoutReason uint32

// Target logout reasons. The line comments are the String names (consts_string.go).
const (
	TLogoutNoReason TLogoutReason = 0 // no reason specified
	// inactive channel, resources reclaimed
	TLogoutInactive TLogoutReason = 1 // inactive RDMA channel
	// invalid IU type received by target
	TLogoutInvalidIUType TLogoutReason = 2 // invalid information unit type
	// response with no matching request
	TLogoutUnexpectedResponse TLogoutReason = 3 // unexpected response
	// disconnected by a new login's multi-channel action
	TLogoutMultiChannelAction TLogoutReason = 4 // disconnected by multi-channel action
	// unsupported DATA-OUT descriptor format
	TLogoutUnsupportedDataOut TLogoutReason = 5 // unsupported data-out descriptor format
	// unsupported DATA-IN descriptor format
	TLogoutUnsupportedDataIn TLogoutReason = 6 // unsupported data-in descriptor format
	// invalid IU length for IU type
	TLogoutInvalidIULength TLogoutReason = 8 // invalid IU length
)

// TaskMgmtFunc is SRP_TSK_MGMT's TASK MANAGEMENT FUNCTION byte.
type TaskMgmtFunc uint8

// Task management functions; torvalds/linux:include/scsi/srp.h.
const (
	TMAbortTask    TaskMgmtFunc = 0x01
	TMAbortTaskSet TaskMgmtFunc = 0x02
	TMClearTaskSet TaskMgmtFunc = 0x04
	TMLUNReset     TaskMgmtFunc = 0x08
	TMClearACA     TaskMgmtFunc = 0x40
)

func (f TaskMgmtFunc) String() string {
	switch f {
	case TMAbortTask:
		return "ABORT TASK"
	case TMAbortTaskSet:
		return "ABORT TASK SET"
	case TMClearTaskSet:
		return "CLEAR TASK SET"
	case TMLUNReset:
		return "LOGICAL UNIT RESET"
	case TMClearACA:
		return "CLEAR ACA"
	}
	return "TaskMgmtFunc(0x" + strconv.FormatUint(uint64(f), 16) + ")"
}

// TMResponse is the task management response code carried in byte 3 of
// an SRP_RSP's response data.
type TMResponse uint8

// Task management response codes used by ib_srpt
// (drivers/infiniband/ulp/srpt/ib_srpt.h); other SAM codes are not used by
// Linux and not defined here.
const (
	TMSuccess          TMResponse = 0x00 // SRP_TSK_MGMT_SUCCESS
	TMFuncNotSupported TMResponse = 0x04 // SRP_TSK_MGMT_FUNC_NOT_SUPP
	TMFailed           TMResponse = 0x05 // SRP_TSK_MGMT_FAILED
)

func (r TMResponse) String() string {
	switch r {
	case TMSuccess:
		return "function complete"
	case TMFuncNotSupported:
		return "function not supported"
	case TMFailed:
		return "function failed"
	}
	return "TMResponse(0x" + strconv.FormatUint(uint64(r), 16) + ")"
}

// TaskAttr is SRP_CMD's task attribute byte.
type TaskAttr uint8

// Task attributes (drivers/infiniband/ulp/srpt/ib_srpt.h SRP_CMD_*_Q).
const (
	TaskSimple      TaskAttr = 0x0
	TaskHeadOfQueue TaskAttr = 0x1
	TaskOrdered     TaskAttr = 0x2
	TaskACA         TaskAttr = 0x4
)

func (a TaskAttr) String() string {
	switch a {
	case TaskSimple:
		return "SIMPLE"
	case TaskHeadOfQueue:
		return "HEAD OF QUEUE"
	case TaskOrdered:
		return "ORDERED"
	case TaskACA:
		return "ACA"
	}
	return "TaskAttr(0x" + strconv.FormatUint(uint64(a), 16) + ")"
}

// RspFlags is SRP_RSP's flags byte.
type RspFlags uint8

// SRP_RSP flags; torvalds/linux:include/scsi/srp.h SRP_RSP_FLAG_*.
const (
	RspValid RspFlags = 1 << 0 // response data present
	SnsValid RspFlags = 1 << 1 // sense data present
	DOOver   RspFlags = 1 << 2 // data-out overflow, DATA-OUT RESIDUAL COUNT valid
	DOUnder  RspFlags = 1 << 3 // data-out underflow, DATA-OUT RESIDUAL COUNT valid
	DIOver   RspFlags = 1 << 4 // data-in overflow, DATA-IN RESIDUAL COUNT valid
	DIUnder  RspFlags = 1 << 5 // data-in underflow, DATA-IN RESIDUAL COUNT valid

	// ResidFlags are the four residual bits.
	ResidFlags = DOOver | DOUnder | DIOver | DIUnder
)

// SolNot is the solicited-notification byte (byte 1) of several IUs.
type SolNot uint8

// Solicited-notification bits (drivers/infiniband/ulp/srpt/ib_srpt.h).
const (
	SOLNT   SolNot = 0x01 // SRP_RSP, SRP_T_LOGOUT, SRP_CRED_REQ, SRP_AER_REQ
	SCSOLNT SolNot = 0x02 // SRP_CMD, SRP_TSK_MGMT: notify on success
	UCSOLNT SolNot = 0x04 // SRP_CMD, SRP_TSK_MGMT: notify on failure
)
