package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

// Exit codes scripts can rely on; documented in `srpctl --help` and README.md.
const (
	exitOK          = 0 // success
	exitError       = 1 // any other error, including an invalid configuration file
	exitUsage       = 2 // bad command line: unknown command or flag, wrong arguments
	exitNotRunning  = 3 // srpd is not running: no control socket, or nobody listening on it
	exitPermission  = 4 // permission denied: the control socket, or netlink without CAP_NET_ADMIN
	exitNotFound    = 5 // no such target, LUN, ACL, session, connection, RDMA link or interface
	exitConflict    = 6 // already exists, or in use (a LUN named by an ACL, a target with sessions)
	exitUnsupported = 7 // unsupported: the kernel lacks the feature (RDMA netlink), or srpd was built without it
)

const exitCodesHelp = `Exit codes:
  0  success
  1  error (including an invalid configuration file)
  2  usage: unknown command or flag, wrong arguments
  3  srpd is not running (no control socket, or nobody listening on it)
  4  permission denied (control socket; RDMA netlink needs root)
  5  not found (target, LUN, ACL, session, connection, RDMA link, interface)
  6  conflict: already exists, or in use
  7  unsupported by the kernel (no RDMA netlink) or by this build of srpd`

// Local error kinds, for what does not come from the control API.
var (
	errNotFound    = errors.New("not found")
	errConflict    = errors.New("already exists")
	errPermission  = errors.New("permission denied")
	errUnsupported = errors.New("unsupported")
)

// usageError is a command-line mistake (exit 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// exitCode maps an error to the documented exit codes.
func exitCode(err error) int {
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue), isCobraUsage(err):
		return exitUsage
	case errors.Is(err, ctlapi.ErrDaemonNotRunning):
		return exitNotRunning
	case errors.Is(err, ctlapi.ErrPermission), errors.Is(err, errPermission):
		return exitPermission
	case errors.Is(err, ctlapi.ErrNotFound), errors.Is(err, errNotFound):
		return exitNotFound
	case errors.Is(err, ctlapi.ErrAlreadyExists), errors.Is(err, ctlapi.ErrConflict), errors.Is(err, errConflict),
		errors.Is(err, config.ErrExists), errors.Is(err, config.ErrInUse):
		return exitConflict
	case errors.Is(err, ctlapi.ErrUnsupported), errors.Is(err, errUnsupported):
		return exitUnsupported
	}
	return exitError
}

// isCobraUsage recognises the usage errors cobra makes itself (it has no error types for them).
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command ", "unknown flag: ", "unknown shorthand flag: ", "required flag(s) ",
		"invalid argument ", "flag needs an argument", "accepts ", "requires at least ", "if any flags in the group"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// hint returns advice for a well-known failure, or "".
func hint(err error, socket string) string {
	switch {
	case errors.Is(err, ctlapi.ErrDaemonNotRunning):
		return "start it with `systemctl start srpd` (or `srpd -c FILE`), or point --socket / $SRPCTL_SOCKET at its control socket (control.socket in srpd.yaml)"
	case errors.Is(err, ctlapi.ErrPermission) && strings.Contains(err.Error(), socket):
		return "run srpctl as root, or as a member of the control socket's group (control.group in srpd.yaml, srpd under systemd)"
	}
	return ""
}
