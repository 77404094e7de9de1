package transport

import (
	"errors"
	"fmt"
)

// Sentinel errors. Engines wrap them in the typed errors below (or with fmt.Errorf and %w), so
// test with errors.Is.
var (
	// ErrSQFull: the send queue has fewer free slots than WRs in the chain; nothing was posted.
	ErrSQFull = errors.New("transport: send queue full")
	// ErrRQFull: the receive queue has fewer free slots than WRs in the chain; nothing was posted.
	ErrRQFull = errors.New("transport: receive queue full")
	// ErrQPState: the operation is not allowed in the QP's current state (e.g. PostSend before
	// RTS); nothing was posted.
	ErrQPState = errors.New("transport: operation not allowed in the QP's state")
	// ErrInvalidOpcode: unknown or unsupported work-request opcode.
	ErrInvalidOpcode = errors.New("transport: invalid work request opcode")
	// ErrTooManySGE: a WR has more SGEs than the QP's MaxSendSGE / MaxRecvSGE.
	ErrTooManySGE = errors.New("transport: too many scatter/gather elements")
	// ErrInlineTooLong: an inline WR carries more bytes than the QP's MaxInlineData.
	ErrInlineTooLong = errors.New("transport: inline data too long")
	// ErrInvalidWR: a malformed work request (bad flags for the opcode, a REG_MR with no MR, a
	// page list longer than the MR's maximum, a wrong-sized length, ...).
	ErrInvalidWR = errors.New("transport: invalid work request")
	// ErrInvalidTransition: the requested QP state transition is not legal from the current state.
	ErrInvalidTransition = errors.New("transport: invalid QP state transition")
	// ErrMissingAttr: a QP attribute required by the transition is absent from the mask.
	ErrMissingAttr = errors.New("transport: required QP attribute missing")
	// ErrInvalidAttr: a QP attribute is not allowed for the transition, or its value is out of
	// range.
	ErrInvalidAttr = errors.New("transport: invalid QP attribute")
	// ErrInvalidArgument: an argument is out of range (size 0, unknown access bit, ...).
	ErrInvalidArgument = errors.New("transport: invalid argument")
	// ErrInvalidAccess: an access-flag combination verbs forbids (remote write or remote atomic
	// without local write).
	ErrInvalidAccess = errors.New("transport: invalid access flags")
	// ErrBadAddress: an address range is not inside memory allocated from this device.
	ErrBadAddress = errors.New("transport: address range outside device memory")
	// ErrBusy: the object is still in use (memory with MRs over it, a PD with MRs or QPs, a CQ
	// with QPs).
	ErrBusy = errors.New("transport: resource busy")
	// ErrNoResources: a device limit would be exceeded.
	ErrNoResources = errors.New("transport: out of resources")
	// ErrNotSupported: the engine does not implement this feature.
	ErrNotSupported = errors.New("transport: not supported")
	// ErrWrongDevice: an object from another device (or another PD where the same PD is required).
	ErrWrongDevice = errors.New("transport: object belongs to another device or PD")
	// ErrClosed: the object (or its device) has been closed.
	ErrClosed = errors.New("transport: closed")
)

// PostError reports which work request of a PostSend / PostRecv chain was refused. Nothing in the
// chain was posted.
type PostError struct {
	Index int    // index of the offending WR in the slice
	WRID  uint64 // its ID
	Err   error  // one of the sentinel errors above, possibly wrapped with detail
}

func (e *PostError) Error() string {
	return fmt.Sprintf("post: wr[%d] (id %#x): %v", e.Index, e.WRID, e.Err)
}

func (e *PostError) Unwrap() error { return e.Err }

// ModifyError reports why a QP Modify was refused. The QP is unchanged.
type ModifyError struct {
	From, To QPState
	Attrs    QPAttrMask // the attributes at fault (missing, not allowed, or out of range)
	Err      error      // ErrInvalidTransition, ErrMissingAttr, ErrInvalidAttr, ErrClosed, ...
	Detail   string     // optional human detail
}

func (e *ModifyError) Error() string {
	s := fmt.Sprintf("modify qp %v->%v: %v", e.From, e.To, e.Err)
	if e.Attrs != 0 {
		s += " [" + e.Attrs.String() + "]"
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

func (e *ModifyError) Unwrap() error { return e.Err }
