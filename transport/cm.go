package transport

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
)

// Connection management API (RDMA CM semantics over the IB CM, as a Linux rdma_cm peer sees
// it). An engine that supports connection management implements ConnManager; softroce drives
// the pure state machine in transport/softroce/cm from its QP1 path, the verbs engine maps it
// onto librdmacm. Wire conventions follow RDMA CM: the service ID is in the TCP port space
// (0x0000000001060000 | port) and REQ private data starts with the 36-byte RDMA CM header,
// which this API strips on receive and adds on send (torvalds/linux:drivers/infiniband/core/
// cma.c).

// Private-data limits seen by a ULP (torvalds/linux:include/rdma/ib_cm.h sizes, minus the
// RDMA CM header for the REQ).
const (
	MaxDialPrivateData       = 56  // REQ: 92 - 36-byte RDMA CM header
	MaxAcceptPrivateData     = 196 // REP
	MaxRejectPrivateData     = 148 // REJ
	MaxMRAPrivateData        = 222 // MRA
	MaxDisconnectPrivateData = 220 // DREQ
)

// ConnParam are the connection parameters of rdma_conn_param that matter on RoCE.
type ConnParam struct {
	// ResponderResources: RDMA READs (and atomics) this side accepts outstanding as responder
	// (becomes the local QP's MaxDestRdAtomic; REQ/REP Responder Resources field).
	ResponderResources uint8
	// InitiatorDepth: RDMA READs this side issues outstanding as requester (local QP's
	// MaxRdAtomic; REQ/REP Initiator Depth). When accepting, 0 means "as many as the peer
	// offers" (so that RDMA READs towards the peer are legal).
	InitiatorDepth uint8
	// RetryCount: transport retries (REQ only; 0..7, 7 = infinite on rxe). 0 means 7.
	RetryCount uint8
	// RNRRetryCount: RNR retries the peer applies to us (0..7, 7 = infinite). 0 means 7.
	RNRRetryCount uint8
	// FlowControl: end-to-end flow control supported (ib_srp sets it).
	FlowControl bool
	// SRQ: the local QP uses a shared receive queue.
	SRQ bool
	// MinRNRTimer: RNR NAK timer code this side's responder advertises (0 = 655.36 ms, the
	// kernel CM's default; 0..31).
	MinRNRTimer uint8
}

// RejectReason is an IB CM REJ reason (torvalds/linux:include/rdma/ib_cm.h enum
// ib_cm_rej_reason).
type RejectReason uint16

// REJ reasons.
const (
	RejectNoQP                      RejectReason = 1
	RejectNoEEC                     RejectReason = 2
	RejectNoResources               RejectReason = 3
	RejectTimeout                   RejectReason = 4 // ARI = the rejecting CA's GUID
	RejectUnsupported               RejectReason = 5
	RejectInvalidCommID             RejectReason = 6
	RejectInvalidCommInstance       RejectReason = 7
	RejectInvalidServiceID          RejectReason = 8 // nobody listens on the port
	RejectInvalidTransportType      RejectReason = 9
	RejectStaleConn                 RejectReason = 10
	RejectRDCNotExist               RejectReason = 11
	RejectInvalidGID                RejectReason = 12
	RejectInvalidLID                RejectReason = 13
	RejectInvalidSL                 RejectReason = 14
	RejectInvalidTrafficClass       RejectReason = 15
	RejectInvalidHopLimit           RejectReason = 16
	RejectInvalidPacketRate         RejectReason = 17
	RejectInvalidAltGID             RejectReason = 18
	RejectInvalidAltLID             RejectReason = 19
	RejectInvalidAltSL              RejectReason = 20
	RejectInvalidAltTrafficClass    RejectReason = 21
	RejectInvalidAltHopLimit        RejectReason = 22
	RejectInvalidAltPacketRate      RejectReason = 23
	RejectPortCMRedirect            RejectReason = 24
	RejectPortRedirect              RejectReason = 25
	RejectInvalidMTU                RejectReason = 26
	RejectInsufficientRespResources RejectReason = 27
	RejectConsumerDefined           RejectReason = 28 // what rdma_reject and ULPs use
	RejectInvalidRNRRetry           RejectReason = 29
	RejectDuplicateLocalCommID      RejectReason = 30
	RejectInvalidClassVersion       RejectReason = 31
	RejectInvalidFlowLabel          RejectReason = 32
	RejectInvalidAltFlowLabel       RejectReason = 33
	RejectVendorOptionNotSupported  RejectReason = 35
)

var rejectNames = [...]string{
	1: "no QP", 2: "no EEC", 3: "no resources", 4: "timeout", 5: "unsupported",
	6: "invalid comm ID", 7: "invalid comm instance", 8: "invalid service ID",
	9: "invalid transport type", 10: "stale conn", 11: "RDC not exist", 12: "invalid GID",
	13: "invalid LID", 14: "invalid SL", 15: "invalid traffic class", 16: "invalid hop limit",
	17: "invalid packet rate", 18: "invalid alt GID", 19: "invalid alt LID",
	20: "invalid alt SL", 21: "invalid alt traffic class", 22: "invalid alt hop limit",
	23: "invalid alt packet rate", 24: "port CM redirect", 25: "port redirect",
	26: "invalid MTU", 27: "insufficient resp resources", 28: "consumer defined",
	29: "invalid RNR retry", 30: "duplicate local comm ID", 31: "invalid class version",
	32: "invalid flow label", 33: "invalid alt flow label", 35: "vendor option not supported",
}

func (r RejectReason) String() string {
	if int(r) < len(rejectNames) && rejectNames[r] != "" {
		return rejectNames[r]
	}
	return "reject reason " + strconv.Itoa(int(r))
}

// CM sentinel errors (test with errors.Is).
var (
	// ErrConnRejected: the peer (or its CM) answered with a REJ; the error is a *RejectError.
	ErrConnRejected = errors.New("transport: connection rejected")
	// ErrConnUnreachable: no answer within the CM's retries (REQ or REP retries exhausted,
	// RDMA_CM_EVENT_UNREACHABLE).
	ErrConnUnreachable = errors.New("transport: peer unreachable")
	// ErrConnDisconnected: the connection was disconnected (DREQ/DREP, or a REJ once connected).
	ErrConnDisconnected = errors.New("transport: disconnected")
)

// RejectError is the peer's reject of a connection attempt: the REJ reason and what the peer
// put in the REJ (an SRP target puts an SRP_LOGIN_REJ in PrivateData with reason 28).
// errors.Is(err, ErrConnRejected) holds for it.
type RejectError struct {
	Reason      RejectReason
	PrivateData []byte // the REJ's private data (148 bytes on the wire, zero-padded)
	ARI         []byte // additional reject information (RejectInfoLength bytes)
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("transport: connection rejected: %v (%d)", e.Reason, uint16(e.Reason))
}

// Is makes errors.Is(err, ErrConnRejected) true.
func (e *RejectError) Is(target error) bool { return target == ErrConnRejected }

// CMEventType is the type of a connection event (the RDMA_CM_EVENT_* a connected id sees).
type CMEventType uint8

//go:generate go tool stringer -type=CMEventType -linecomment -output=cmeventtype_string.go

// Connection events. The line comments are the String names (cmeventtype_string.go).
const (
	// CMEventEstablished: RTU received (passive) or sent (active); the QP is in RTS.
	CMEventEstablished CMEventType = iota + 1 // ESTABLISHED
	// CMEventRejected: the peer rejected (Reason, PrivateData; Err is a *RejectError).
	CMEventRejected // REJECTED
	// CMEventUnreachable: retries exhausted before the connection was established.
	CMEventUnreachable // UNREACHABLE
	// CMEventDisconnected: DREQ or DREP received, DREQ retries exhausted, or a REJ received
	// once connected. The QP has been moved to ERR. Delivered at most once per connection.
	CMEventDisconnected // DISCONNECTED
	// CMEventTimewaitExit: the connection left timewait; its QP may be reused and no further
	// event will be delivered.
	CMEventTimewaitExit // TIMEWAIT_EXIT
)

// CMEvent is a connection event.
type CMEvent struct {
	Type        CMEventType
	PrivateData []byte       // REP (active) / RTU (passive) / REJ / DREQ / DREP private data
	Reason      RejectReason // CMEventRejected, or CMEventDisconnected caused by a REJ
	Err         error        // *RejectError, ErrConnUnreachable, or a timeout for DREQ retries
}

// ConnRequestInfo describes an incoming connection request (IB CM REQ + RDMA CM header).
type ConnRequestInfo struct {
	// Addresses from the RDMA CM header: the dialled address and port, and the peer's.
	LocalAddr, RemoteAddr netip.AddrPort
	// The packet's IP addresses (what RC traffic will use).
	PacketSrc, PacketDst netip.Addr
	RemoteQPN            uint32
	RemoteCAGUID         uint64
	StartingPSN          uint32 // the first PSN the peer's QP expects from us
	PathMTU              MTU
	// Offered resources, already mapped to our side: ResponderResources is the peer's
	// initiator depth, InitiatorDepth the peer's responder resources (cm.c
	// cm_format_req_event).
	ResponderResources uint8
	InitiatorDepth     uint8
	RetryCount         uint8
	RNRRetryCount      uint8
	FlowControl        bool
	SRQ                bool
	// Device is the device the request arrived on, where the QP that accepts it must be
	// created: a queue of a multi-queue device (Queuer). nil: the listener's device.
	Device Device
}

// ConnRequest is an incoming connection request handed out by a Listener. Exactly one of
// Accept or Reject must be called; MRA may be called first to ask the peer for more time.
type ConnRequest interface {
	// PrivateData is the ULP's private data (the RDMA CM header removed): 56 bytes.
	PrivateData() []byte
	// Info describes the request.
	Info() ConnRequestInfo
	// Accept moves qp (an RC QP of this device, in RESET or INIT) through INIT, RTR and RTS
	// with the attributes derived from the request and param, sends the REP with privateData
	// (≤ MaxAcceptPrivateData) and waits (bounded by ctx) for the RTU.
	Accept(ctx context.Context, qp QP, privateData []byte, param ConnParam) (CMConn, error)
	// Reject answers with a REJ carrying reason (normally RejectConsumerDefined) and
	// privateData (≤ MaxRejectPrivateData).
	Reject(privateData []byte, reason RejectReason) error
	// MRA sends a Message Receipt Acknowledgement asking the peer to wait
	// 4.096 µs × 2^serviceTimeout more before retrying.
	MRA(serviceTimeout uint8, privateData []byte) error
}

// Listener receives connection requests for one address and RDMA CM (TCP port space) port.
type Listener interface {
	// Accept returns the next connection request (bounded by ctx).
	Accept(ctx context.Context) (ConnRequest, error)
	// Addr is the listening address (unspecified for a wildcard) and port.
	Addr() netip.AddrPort
	// Close stops listening; requests not yet returned by Accept are rejected (reason 28).
	Close() error
}

// CMConn is an established connection.
type CMConn interface {
	// QP is the connected QP.
	QP() QP
	// LocalAddr and RemoteAddr are the RDMA CM endpoints.
	LocalAddr() netip.AddrPort
	RemoteAddr() netip.AddrPort
	// PrivateData is what the peer sent when the connection was established (REP private data
	// for the dialling side, RTU private data for the accepting side).
	PrivateData() []byte
	// Events delivers CMEventDisconnected and CMEventTimewaitExit (and nothing after the
	// latter).
	Events() <-chan CMEvent
	// Disconnect moves the QP to ERR and sends a DREQ carrying privateData
	// (≤ MaxDisconnectPrivateData). Idempotent.
	Disconnect(privateData []byte) error
}

// ConnManager is implemented by devices that can establish connections.
type ConnManager interface {
	// Listen starts listening on addr (an address of the device, or unspecified for all)
	// and RDMA CM port (TCP port space).
	Listen(addr netip.Addr, port uint16) (Listener, error)
	// Dial connects qp (an RC QP of this device in RESET) to remote (IP and RDMA CM port) with
	// privateData (≤ MaxDialPrivateData) in the REQ. It returns once the REP has been received,
	// the QP moved to RTS and the RTU sent; or the peer's reject as a *RejectError; or
	// ErrConnUnreachable; or ctx's error (the attempt is then aborted with a REJ, reason timeout).
	Dial(ctx context.Context, remote netip.AddrPort, qp QP, privateData []byte, param ConnParam) (CMConn, error)
}
