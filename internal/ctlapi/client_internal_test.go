package ctlapi

import (
	"errors"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
)

// TestConnErrorClassification covers EACCES/EPERM, which root (the test runner) never gets.
func TestConnErrorClassification(t *testing.T) {
	c := NewClient("/run/srpd/srpd.sock")
	wrap := func(errno syscall.Errno) error {
		return &url.Error{Op: "Get", URL: "http://srpd/v1/status", Err: &net.OpError{Op: "dial", Net: "unix",
			Err: os.NewSyscallError("connect", errno)}}
	}
	for _, tt := range []struct {
		errno syscall.Errno
		kind  error
		msg   string
	}{
		{syscall.EACCES, ErrPermission, "permission denied on the control socket /run/srpd/srpd.sock"},
		{syscall.EPERM, ErrPermission, "permission denied"},
		{syscall.ENOENT, ErrDaemonNotRunning, "srpd is not running (nothing listens on /run/srpd/srpd.sock: no such file or directory)"},
		{syscall.ECONNREFUSED, ErrDaemonNotRunning, "connection refused"},
		{syscall.EMFILE, nil, "too many open files"},
	} {
		err := c.connError(wrap(tt.errno))
		if tt.kind != nil && !errors.Is(err, tt.kind) {
			t.Errorf("%v: %v is not %v", tt.errno, err, tt.kind)
		}
		if tt.kind == nil && (errors.Is(err, ErrPermission) || errors.Is(err, ErrDaemonNotRunning)) {
			t.Errorf("%v: misclassified: %v", tt.errno, err)
		}
		if !errors.Is(err, tt.errno) {
			t.Errorf("%v: the errno is lost: %v", tt.errno, err)
		}
		if got := err.Error(); !strings.Contains(got, tt.msg) {
			t.Errorf("%v: message %q lacks %q", tt.errno, got, tt.msg)
		}
	}
}
