package initiator

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// Sentinel errors; test with errors.Is. Typed errors (*SCSIError, *LoginRejectError,
// *TaskMgmtError) answer errors.Is for the sentinels that describe them.
var (
	// ErrClosed: the session was closed by its owner (Close).
	ErrClosed = errors.New("initiator: session closed")
	// ErrSessionLost: dev_loss_tmo expired (or reconnecting was impossible) and the session was
	// torn down; it will not come back.
	ErrSessionLost = errors.New("initiator: session lost (dev_loss_tmo expired)")
	// ErrFastFail: no channel to the target has been up for fast_io_fail_tmo; I/O fails at once
	// until a channel is back (scsi_transport_srp's FAIL_FAST state, DID_TRANSPORT_FAILFAST).
	ErrFastFail = errors.New("initiator: transport offline (fast_io_fail_tmo expired)")
	// ErrTransport: a command was re-issued after channel failures as often as Config.MaxRetries
	// allows and still did not get through.
	ErrTransport = errors.New("initiator: command failed on every attempt (channel failures)")
	// ErrTimeout: a command did not complete in time (the context's deadline or
	// Config.CommandTimeout) and was aborted. Errors carrying it also match the context's error
	// when the context ended.
	ErrTimeout = errors.New("initiator: command timed out and was aborted")
	// ErrLoginRejected: the target rejected a login (*LoginRejectError).
	ErrLoginRejected = errors.New("initiator: login rejected")
	// ErrLogin: a login response could not be used (malformed, or its parameters are unusable).
	ErrLogin = errors.New("initiator: unusable login response")
	// ErrTaskMgmt: a task management function failed or was not answered (*TaskMgmtError).
	ErrTaskMgmt = errors.New("initiator: task management failed")

	// ErrReadOnly: a write to a LUN that reports itself write protected (no command was sent), or
	// the target answered DATA PROTECT.
	ErrReadOnly = errors.New("initiator: LUN is write protected")
	// ErrRange: an offset or length that is not block aligned or lies outside the LUN.
	ErrRange = errors.New("initiator: offset or length not aligned or out of range")
	// ErrNotSupported: the LUN does not support the operation (e.g. Discard without
	// logical block provisioning), or the target answered INVALID COMMAND OPERATION CODE.
	ErrNotSupported = errors.New("initiator: operation not supported by the LUN")
	// ErrNoLUN: the target does not present the LUN (any more).
	ErrNoLUN = errors.New("initiator: no such LUN")
	// ErrShortTransfer: the target moved less data than a READ or WRITE asked for.
	ErrShortTransfer = errors.New("initiator: short data transfer")
	// ErrLUNData: a logical unit's discovery data (REPORT LUNS, INQUIRY, READ CAPACITY) is
	// malformed or describes a unit the block API cannot use (block size zero or not a power
	// of two in [512, 65536], a capacity beyond 2^63 bytes); Rescan skips such a unit.
	ErrLUNData = errors.New("initiator: unusable logical unit data from the target")

	// Categories of *SCSIError, for errors.Is.
	ErrMediumError         = errors.New("scsi: medium error")
	ErrReservationConflict = errors.New("scsi: reservation conflict")
	ErrIllegalRequest      = errors.New("scsi: illegal request")
	ErrNoSpace             = errors.New("scsi: space allocation failed (thin provisioning)")
	ErrNotReady            = errors.New("scsi: logical unit not ready")
	ErrHardware            = errors.New("scsi: hardware error")
	ErrAborted             = errors.New("scsi: command aborted by the target")
	ErrBusy                = errors.New("scsi: target busy or task set full")
)

// SCSIError is a command that the target completed with a status other than GOOD (after the
// retries that UNIT ATTENTION, BUSY and the like call for). Sense holds the decoded sense data
// of a CHECK CONDITION and RawSense its bytes. errors.Is matches the category sentinels:
// ErrMediumError, ErrReservationConflict, ErrReadOnly (DATA PROTECT), ErrNoSpace, ErrNotReady,
// ErrHardware, ErrAborted, ErrBusy, ErrIllegalRequest (and ErrNotSupported for INVALID COMMAND
// OPERATION CODE, ErrRange for LBA OUT OF RANGE).
type SCSIError struct {
	Op       string      // the command (e.g. "READ(16)")
	LUN      uint64      // the LUN number the command was sent to
	LBA      uint64      // first LBA of a medium access command (0 otherwise)
	Status   scsi.Status // SCSI status
	Sense    scsi.Sense  // decoded sense (CHECK CONDITION; zero value otherwise)
	RawSense []byte      // sense data as received (possibly truncated by the target)
}

func (e *SCSIError) Error() string {
	s := "initiator: " + e.Op + " to LUN " + strconv.FormatUint(e.LUN, 10)
	if e.LBA != 0 {
		s += " at LBA " + strconv.FormatUint(e.LBA, 10)
	}
	s += ": " + e.Status.String()
	if e.Status == scsi.StatusCheckCondition {
		s += ": " + e.Sense.String()
	}
	return s
}

// Is matches the category sentinels.
func (e *SCSIError) Is(target error) bool {
	switch e.Status {
	case scsi.StatusReservationConflict:
		return target == ErrReservationConflict
	case scsi.StatusBusy, scsi.StatusTaskSetFull:
		return target == ErrBusy
	case scsi.StatusTaskAborted:
		return target == ErrAborted
	case scsi.StatusCheckCondition:
	default:
		return false
	}
	s := e.Sense
	switch target {
	case ErrMediumError:
		return s.Key == scsi.MediumError
	case ErrHardware:
		return s.Key == scsi.HardwareError
	case ErrNotReady:
		return s.Key == scsi.NotReady
	case ErrAborted:
		return s.Key == scsi.AbortedCommand
	case ErrIllegalRequest:
		return s.Key == scsi.IllegalRequest
	case ErrNotSupported:
		return s.Key == scsi.IllegalRequest && s.ASC == 0x20 && s.ASCQ == 0x00
	case ErrRange:
		return s.Key == scsi.IllegalRequest && s.ASC == 0x21 && s.ASCQ == 0x00
	case ErrReadOnly:
		// DATA PROTECT, except SPACE ALLOCATION FAILED WRITE PROTECT (27/07).
		return s.Key == scsi.DataProtect && !(s.ASC == 0x27 && s.ASCQ == 0x07)
	case ErrNoSpace:
		return s.Key == scsi.DataProtect && s.ASC == 0x27 && s.ASCQ == 0x07
	}
	return false
}

// LoginRejectError is a login the target (or its connection manager) rejected. Reason is the
// SRP_LOGIN_REJ reason when the CM REJ carried one (CMReason transport.RejectConsumerDefined);
// it is 0 when the REJ had no SRP_LOGIN_REJ (CMReason says why, e.g. nobody listening on the
// port). errors.Is(err, ErrLoginRejected) holds.
type LoginRejectError struct {
	Channel    int                    // channel index whose login was rejected
	Reason     srp.RejectReason       // SRP_LOGIN_REJ REASON (0: none)
	BufFmt     srp.BufFormats         // SUPPORTED BUFFER FORMATS of the SRP_LOGIN_REJ
	CMReason   transport.RejectReason // the CM REJ reason
	ReqITIULen uint32                 // the REQUESTED MAX IT IU LEN of the rejected login
	// The port identifiers the rejected SRP_LOGIN_REQ carried, for the hint.
	InitiatorPortID srp.PortID
	TargetPortID    srp.PortID
	// TargetPortHint is the target port identifier an srpd target named in its reject of a
	// login that named another (srp.ParsePortHint); HasTargetPortHint says whether it did.
	TargetPortHint    srp.PortID
	HasTargetPortHint bool
}

func (e *LoginRejectError) Error() string {
	var msg string
	if e.Reason != 0 {
		msg = fmt.Sprintf("initiator: channel %d login rejected: %v (0x%08x)", e.Channel, e.Reason, uint32(e.Reason))
	} else {
		msg = fmt.Sprintf("initiator: channel %d login rejected by the connection manager: %v", e.Channel, e.CMReason)
	}
	if h := e.Hint(); h != "" {
		msg += ": " + h
	}
	return msg
}

// Hint is what the target most likely means by the reject, for an operator: SRP_LOGIN_REJ
// reasons are generic (SRP r16a 6.5), and the targets use them for specific causes.
// ib_srpt (torvalds/linux:drivers/infiniband/ulp/srpt/ib_srpt.c, srpt_cm_req_recv) and our
// target (target/login.go) answer a target port ID that is not theirs with UNABLE TO
// ASSOCIATE, and an initiator port no ACL admits with CHANNEL LIMIT REACHED; a CM REJ
// without an SRP_LOGIN_REJ is the connection manager's: nobody listens on that port.
func (e *LoginRejectError) Hint() string {
	switch e.Reason {
	case srp.RejChannelLimitReached:
		return fmt.Sprintf("no ACL for this initiator port ID on the target (initiator port %v), or the target's channel limit for it is reached", e.InitiatorPortID)
	case srp.RejUnableAssociateChannel:
		if e.HasTargetPortHint {
			return fmt.Sprintf("wrong target port ID (%v is not the target's; it says it is %v)", e.TargetPortID, e.TargetPortHint)
		}
		return fmt.Sprintf("wrong target port ID (%v is not the target's)", e.TargetPortID)
	case srp.RejITIULenTooLarge:
		return fmt.Sprintf("the target accepts IUs shorter than %d bytes only", e.ReqITIULen)
	case srp.RejUnsupportedDescFormat:
		return "the target supports none of the buffer descriptor formats offered"
	case srp.RejInsufficientResources:
		return "the target is out of resources or shutting down; it may accept a later login"
	case 0:
		switch e.CMReason {
		case transport.RejectInvalidServiceID, transport.RejectConsumerDefined, transport.RejectTimeout:
			return "nothing listens on that CM port (check port and target)"
		}
	}
	return ""
}

// Is makes errors.Is(err, ErrLoginRejected) true.
func (e *LoginRejectError) Is(target error) bool { return target == ErrLoginRejected }

// TaskMgmtError is a task management function that failed: the target answered with a
// response code other than FUNCTION COMPLETE, or did not answer within Config.TaskMgmtTimeout
// (Timeout set), or the channel failed first (Err set).
type TaskMgmtError struct {
	Func     srp.TaskMgmtFunc
	LUN      uint64
	Response srp.TMResponse // valid when !Timeout && Err == nil
	Timeout  bool
	Err      error
}

func (e *TaskMgmtError) Error() string {
	s := "initiator: " + e.Func.String() + " on LUN " + strconv.FormatUint(e.LUN, 10) + ": "
	switch {
	case e.Err != nil:
		return s + e.Err.Error()
	case e.Timeout:
		return s + "no response"
	}
	return s + e.Response.String()
}

// Is makes errors.Is(err, ErrTaskMgmt) true.
func (e *TaskMgmtError) Is(target error) bool { return target == ErrTaskMgmt }

func (e *TaskMgmtError) Unwrap() error { return e.Err }

// timeoutError is returned for a command that timed out: it matches ErrTimeout and the cause
// (context.DeadlineExceeded / context.Canceled when the caller's context ended).
type timeoutError struct {
	op    string
	cause error // ctx.Err(), or nil for Config.CommandTimeout
	eh    error // what the abort escalation ran into, if anything
}

func (e *timeoutError) Error() string {
	s := "initiator: " + e.op + ": " + ErrTimeout.Error()
	if e.cause != nil {
		s += ": " + e.cause.Error()
	}
	if e.eh != nil {
		s += " (" + e.eh.Error() + ")"
	}
	return s
}

func (e *timeoutError) Unwrap() []error {
	errs := []error{ErrTimeout}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}
