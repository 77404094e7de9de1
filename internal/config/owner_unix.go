//go:build unix

package config

import (
	"os"
	"syscall"
)

// keepOwner gives tmp the owner and group of the file at path, if it exists and differs. Only
// root may change owners; an unprivileged writer already owns what it creates.
func keepOwner(tmp *os.File, path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || (int(st.Uid) == os.Geteuid() && int(st.Gid) == os.Getegid()) {
		return nil
	}
	if os.Geteuid() != 0 {
		return nil
	}
	return tmp.Chown(int(st.Uid), int(st.Gid))
}
