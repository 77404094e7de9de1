package nbd

import (
	"context"
	"errors"
	"fmt"
	"syscall"
)

// Errno is an NBD error value, what the error field of a reply carries
// (NetworkBlockDevice/nbd:doc/proto.md "Error values"). The numbers are the common Linux errno
// values but are defined by the protocol, not by the host. Errno implements error, so a Device
// may return one directly (or wrap one with %w, or use *Error).
type Errno uint32

// The NBD error values (proto.md "Error values"). The server never sends anything else.
const (
	EPERM     Errno = 1   // NBD_EPERM: write, trim or zeroing on a read-only export
	EIO       Errno = 5   // NBD_EIO: the default for any device failure
	ENOMEM    Errno = 12  // NBD_ENOMEM: allowed but "SHOULD NOT" be used; never produced by mapping
	EINVAL    Errno = 22  // NBD_EINVAL: bad request (range, alignment, flags, size, command)
	ENOSPC    Errno = 28  // NBD_ENOSPC: write beyond the end, or the device is out of space
	EOVERFLOW Errno = 75  // NBD_EOVERFLOW: for NBD_CMD_FLAG_DF only; a Device's is sent as EINVAL
	ENOTSUP   Errno = 95  // NBD_ENOTSUP: for NBD_CMD_FLAG_FAST_ZERO only; a Device's is sent as EINVAL
	ESHUTDOWN Errno = 108 // NBD_ESHUTDOWN: the server or the device's session is going away
)

func (e Errno) Error() string {
	switch e {
	case EPERM:
		return "nbd: operation not permitted (EPERM)"
	case EIO:
		return "nbd: input/output error (EIO)"
	case ENOMEM:
		return "nbd: cannot allocate memory (ENOMEM)"
	case EINVAL:
		return "nbd: invalid argument (EINVAL)"
	case ENOSPC:
		return "nbd: no space left on device (ENOSPC)"
	case EOVERFLOW:
		return "nbd: value too large (EOVERFLOW)"
	case ENOTSUP:
		return "nbd: operation not supported (ENOTSUP)"
	case ESHUTDOWN:
		return "nbd: server is shutting down (ESHUTDOWN)"
	}
	return fmt.Sprintf("nbd: error %d", uint32(e))
}

// known reports whether e is one of the protocol's error values.
func (e Errno) known() bool {
	switch e {
	case EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN:
		return true
	}
	return false
}

// wire returns the value to send for a code a Device chose (see ErrnoOf).
func (e Errno) wire() Errno {
	switch e {
	case EOVERFLOW, ENOTSUP:
		return EINVAL
	}
	if e.known() {
		return e
	}
	return EIO
}

// Error is a Device failure together with the NBD error the client is to see. Devices build
// one with DeviceError when the cause alone would not map to the right code.
type Error struct {
	Code Errno // sent to the client; must be one of the constants above, else EIO is sent
	Err  error // the cause, for logs; may be nil
}

// DeviceError returns an *Error carrying code and err.
func DeviceError(code Errno, err error) error { return &Error{Code: code, Err: err} }

func (e *Error) Error() string {
	if e.Err == nil {
		return e.Code.Error()
	}
	return e.Code.Error() + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is makes errors.Is(err, nbd.EIO) true for an *Error with that code.
func (e *Error) Is(target error) bool {
	code, ok := target.(Errno)
	return ok && code == e.Code
}

// ErrnoOf maps an error returned by a Device to the value sent to the client; nil maps to 0.
// In order:
//
//   - an *Error or an Errno in the chain: its code (EIO when it is not a protocol value;
//     EINVAL for EOVERFLOW and ENOTSUP, which proto.md reserves for NBD_CMD_FLAG_DF and
//     NBD_CMD_FLAG_FAST_ZERO failures this server never has);
//   - context.Canceled (the server cancelled the request at shutdown): ESHUTDOWN;
//   - syscall errnos: EPERM, EACCES, EROFS → EPERM; ENOSPC, EDQUOT, EFBIG → ENOSPC (as
//     proto.md asks); EINVAL, EOVERFLOW, ERANGE, ENOTSUP → EINVAL; ESHUTDOWN → ESHUTDOWN;
//   - anything else, including context.DeadlineExceeded and ENOMEM: EIO.
func ErrnoOf(err error) Errno {
	if err == nil {
		return 0
	}
	var de *Error
	if errors.As(err, &de) {
		return de.Code.wire()
	}
	var code Errno
	if errors.As(err, &code) {
		return code.wire()
	}
	if errors.Is(err, context.Canceled) {
		return ESHUTDOWN
	}
	var se syscall.Errno
	if errors.As(err, &se) {
		switch se {
		case syscall.EPERM, syscall.EACCES, syscall.EROFS:
			return EPERM
		case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG:
			return ENOSPC
		case syscall.EINVAL, syscall.EOVERFLOW, syscall.ERANGE, syscall.ENOTSUP:
			return EINVAL
		case syscall.ESHUTDOWN:
			return ESHUTDOWN
		}
	}
	return EIO
}

// Errors returned by the Server's methods. Test them with errors.Is.
var (
	// ErrServerClosed: the server has shut down (Serve returned); it cannot be used again.
	ErrServerClosed = errors.New("nbd: server closed")
	// ErrExportExists: AddExport with a name that is already exported.
	ErrExportExists = errors.New("nbd: export already exists")
	// ErrNoExport: RemoveExport with a name that is not exported.
	ErrNoExport = errors.New("nbd: no such export")
	// ErrInvalidDevice: AddExport with a Device whose size or block size cannot be exported.
	ErrInvalidDevice = errors.New("nbd: device cannot be exported")
	// ErrSocketInUse: ListenUnix found a live server answering on the socket path.
	ErrSocketInUse = errors.New("nbd: unix socket is in use by another server")
	// ErrNotLoopback: ListenTCP with a non-loopback address while Config.AllowNonLoopback is off.
	ErrNotLoopback = errors.New("nbd: TCP address is not a loopback address")
	// ErrAlreadyServing: Serve called while another Serve is running.
	ErrAlreadyServing = errors.New("nbd: server is already serving")
	// ErrTooManyConnections: a connection over Config.MaxConnections was refused (ServeConn's
	// error for it; accepted connections are counted in Stats.Refused).
	ErrTooManyConnections = errors.New("nbd: too many connections")
	// ErrWriteStalled: the client did not read its replies within Config.WriteTimeout, and the
	// connection was closed (ServeConn's error; counted in Counters.StalledClosed).
	ErrWriteStalled = errors.New("nbd: client did not read its replies within the write timeout")
)

// errProtocol marks a client protocol violation that ends the connection (a hard disconnect).
type protocolError struct{ msg string }

func (e *protocolError) Error() string { return "nbd: protocol violation: " + e.msg }

func protoErr(format string, args ...any) error {
	return &protocolError{msg: fmt.Sprintf(format, args...)}
}
