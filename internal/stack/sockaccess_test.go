package stack

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/srpd/srpd/internal/config"
)

// TestSetSocketAccess: the mode is set; the group given by name or number is the socket's
// afterwards, whether it had it already (no chown needed: the case srpd.service's
// SystemCallFilter= relies on, checked by cmd/srpd TestSyscallFilter) or not (root only).
func TestSetSocketAccess(t *testing.T) {
	dir := t.TempDir()
	check := func(path string, mode os.FileMode, gid int) {
		t.Helper()
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != mode || int(fi.Sys().(*syscall.Stat_t).Gid) != gid {
			t.Fatalf("%s: mode %v gid %d, want %v gid %d", path, fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Gid, mode, gid)
		}
	}
	listen := func(name string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return path
	}
	own := listen("own.sock")
	if err := SetSocketAccess(own, 0o660, strconv.Itoa(os.Getegid())); err != nil {
		t.Fatal(err)
	}
	check(own, 0o660, os.Getegid())
	if err := SetSocketAccess(own, 0o600, ""); err != nil {
		t.Fatal(err)
	}
	check(own, 0o600, os.Getegid())
	if err := SetSocketAccess(own, 0o600, "no-such-group-srpd-test"); err == nil {
		t.Error("an unknown group was accepted")
	}

	if os.Geteuid() != 0 {
		t.Skip("changing a socket to another group needs root")
	}
	other := os.Getegid() + 1
	path := listen("other.sock")
	if err := SetSocketAccess(path, config.FileMode(0o640), strconv.Itoa(other)); err != nil {
		t.Fatal(err)
	}
	check(path, 0o640, other)
}
