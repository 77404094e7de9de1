package ctlapi

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/srpd/srpd/internal/config"
)

// Code is the machine-readable kind of an API error.
type Code string

// Error codes and their HTTP statuses.
const (
	CodeInvalidArgument  Code = "invalid_argument"       // 400
	CodePermissionDenied Code = "permission_denied"      // 403
	CodeNotFound         Code = "not_found"              // 404
	CodeMethodNotAllowed Code = "method_not_allowed"     // 405
	CodeAlreadyExists    Code = "already_exists"         // 409
	CodeConflict         Code = "conflict"               // 409: in use, busy, sessions logged in
	CodeTooLarge         Code = "payload_too_large"      // 413
	CodeUnsupportedMedia Code = "unsupported_media_type" // 415
	CodeInternal         Code = "internal"               // 500
	CodeUnsupported      Code = "unsupported"            // 501: not in this build or kernel
	CodeUnavailable      Code = "unavailable"            // 503: shutting down, reloading
)

// HTTPStatus returns the status a code is sent with.
func (c Code) HTTPStatus() int {
	switch c {
	case CodeInvalidArgument:
		return http.StatusBadRequest
	case CodePermissionDenied:
		return http.StatusForbidden
	case CodeNotFound:
		return http.StatusNotFound
	case CodeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case CodeAlreadyExists, CodeConflict:
		return http.StatusConflict
	case CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeUnsupportedMedia:
		return http.StatusUnsupportedMediaType
	case CodeUnsupported:
		return http.StatusNotImplemented
	case CodeUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// Sentinel errors. A Service wraps them to choose the code of its error; on the client side
// errors.Is(err, ErrNotFound) holds for an *APIError with code not_found, and so on.
var (
	ErrInvalidArgument = errors.New("invalid argument")
	ErrPermission      = errors.New("permission denied")
	ErrNotFound        = errors.New("not found")
	ErrAlreadyExists   = errors.New("already exists")
	ErrConflict        = errors.New("conflict")
	ErrUnsupported     = errors.New("unsupported")
	ErrUnavailable     = errors.New("unavailable")
	ErrInternal        = errors.New("internal error")

	// ErrDaemonNotRunning: the control socket does not exist or nobody listens on it.
	ErrDaemonNotRunning = errors.New("srpd is not running")
)

var codeSentinels = []struct {
	code Code
	err  error
}{
	{CodeInvalidArgument, ErrInvalidArgument},
	{CodePermissionDenied, ErrPermission},
	{CodeNotFound, ErrNotFound},
	{CodeAlreadyExists, ErrAlreadyExists},
	{CodeConflict, ErrConflict},
	{CodeUnsupported, ErrUnsupported},
	{CodeUnavailable, ErrUnavailable},
	{CodeInternal, ErrInternal},
}

// Detail is one located problem of an invalid request body (a config validation error).
type Detail struct {
	Path string `json:"path,omitempty"`
	// Location is Path as an operator reads it, by object name where the object has one
	// (target "storage" LUN 3: size); what srpctl prints.
	Location string `json:"location,omitempty"`
	Message  string `json:"message"`
}

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Error APIErrorInfo `json:"error"`
}

// APIErrorInfo is the "error" object of an ErrorBody.
type APIErrorInfo struct {
	Code    Code     `json:"code"`
	Message string   `json:"message"`
	Details []Detail `json:"details,omitempty"`
}

// APIError is an error response received by Client.
type APIError struct {
	StatusCode int
	Code       Code
	Message    string
	Details    []Detail
}

func (e *APIError) Error() string {
	var b strings.Builder
	b.WriteString(e.Message)
	if e.Message == "" {
		fmt.Fprintf(&b, "%s (HTTP %d)", e.Code, e.StatusCode)
	}
	details := e.Details
	if len(details) == 1 && strings.Contains(e.Message, cmp.Or(details[0].Location, details[0].Path)+": ") {
		details = nil // the message is that one problem already: print it once
	}
	for _, d := range details {
		b.WriteString("\n  ")
		if loc := cmp.Or(d.Location, d.Path); loc != "" {
			b.WriteString(loc)
			b.WriteString(": ")
		}
		b.WriteString(d.Message)
	}
	return b.String()
}

// Is makes errors.Is(apiErr, ErrNotFound) (and the other sentinels) follow the code.
func (e *APIError) Is(target error) bool {
	for _, cs := range codeSentinels {
		if cs.err == target {
			return e.Code == cs.code
		}
	}
	return false
}

// listCode classifies a configuration that failed validation. Problems that are all
// duplicates of what the running configuration already has (a port ID another target uses, a
// second session to the same target port) are a conflict with existing state, as
// ErrAlreadyExists is, not a malformed request; a request body that is invalid on its own
// (invalidRequest) stays invalid_argument whatever its problems are.
func listCode(err error, list config.ErrorList) Code {
	switch {
	case errors.Is(err, ErrInvalidArgument):
		return CodeInvalidArgument
	case errors.Is(err, ErrConflict), errors.Is(err, config.ErrInUse):
		return CodeConflict
	case errors.Is(err, ErrAlreadyExists), errors.Is(err, config.ErrExists):
		return CodeAlreadyExists
	}
	for _, e := range list {
		if !errors.Is(e, config.ErrDuplicate) {
			return CodeInvalidArgument
		}
	}
	return CodeConflict
}

// invalidRequest marks a request body that is invalid on its own (checked before any
// Service call), so that its duplicate problems (a LUN ID listed twice) are not taken for a
// conflict with the running configuration.
type invalidRequest struct{ error }

func (e invalidRequest) Unwrap() error        { return e.error }
func (e invalidRequest) Is(target error) bool { return target == ErrInvalidArgument }

// errorInfo classifies a Service error into the body to send.
func errorInfo(err error) APIErrorInfo {
	info := APIErrorInfo{Code: CodeInternal, Message: err.Error()}
	var list config.ErrorList
	var apiErr *APIError
	switch {
	case errors.As(err, &apiErr): // a Service that proxies another daemon (or a Client)
		info.Code, info.Details = apiErr.Code, apiErr.Details
	case errors.As(err, &list):
		info.Code = listCode(err, list)
		info.Message, _, _ = strings.Cut(err.Error(), "\n")
		if len(list) > 1 {
			info.Message += fmt.Sprintf(" (and %d more problems)", len(list)-1)
		}
		for _, e := range list {
			msg := e.Msg
			if e.Line > 0 {
				msg = fmt.Sprintf("%s (%s:%d)", e.Msg, e.File, e.Line)
			}
			info.Details = append(info.Details, Detail{Path: e.Path, Location: e.Location(), Message: msg})
		}
	case errors.Is(err, ErrNotFound), errors.Is(err, config.ErrNotFound):
		info.Code = CodeNotFound
	case errors.Is(err, ErrAlreadyExists), errors.Is(err, config.ErrExists):
		info.Code = CodeAlreadyExists
	case errors.Is(err, ErrConflict), errors.Is(err, config.ErrInUse):
		info.Code = CodeConflict
	case errors.Is(err, ErrInvalidArgument):
		info.Code = CodeInvalidArgument
	case errors.Is(err, ErrUnsupported), errors.Is(err, config.ErrUnsupported):
		info.Code = CodeUnsupported
	case errors.Is(err, ErrUnavailable):
		info.Code = CodeUnavailable
	case errors.Is(err, ErrPermission):
		info.Code = CodePermissionDenied
	}
	return info
}

// SocketError is a failure to reach the control socket. It unwraps to ErrDaemonNotRunning
// (no socket, or nobody listening: ENOENT, ECONNREFUSED) or ErrPermission (EACCES, EPERM), when
// it is one of those, and to the underlying error.
type SocketError struct {
	Socket string
	Kind   error // ErrDaemonNotRunning, ErrPermission or nil
	Err    error
}

func (e *SocketError) Error() string {
	switch e.Kind {
	case ErrDaemonNotRunning:
		return fmt.Sprintf("srpd is not running (nothing listens on %s: %v)", e.Socket, rootCause(e.Err))
	case ErrPermission:
		return fmt.Sprintf("permission denied on the control socket %s", e.Socket)
	}
	return fmt.Sprintf("control socket %s: %v", e.Socket, e.Err)
}

func (e *SocketError) Unwrap() []error {
	if e.Kind == nil {
		return []error{e.Err}
	}
	return []error{e.Kind, e.Err}
}

func rootCause(err error) error {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err
		}
		err = u
	}
}

// WithCode makes err answer with sentinel's code (ErrUnavailable, ErrNotFound, ...) while its
// message stays err's: errors.Is holds for both err's chain and sentinel.
func WithCode(err, sentinel error) error {
	if err == nil {
		return nil
	}
	return &codedError{err: err, sentinel: sentinel}
}

type codedError struct{ err, sentinel error }

func (e *codedError) Error() string   { return e.err.Error() }
func (e *codedError) Unwrap() []error { return []error{e.err, e.sentinel} }
