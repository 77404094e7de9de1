package stack

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"

	"github.com/srpd/srpd/internal/config"
)

// LookupGroup resolves a group name or numeric id.
func LookupGroup(g string) (int, error) {
	if id, err := strconv.Atoi(g); err == nil {
		return id, nil
	}
	gr, err := user.LookupGroup(g)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(gr.Gid)
}

// SetSocketAccess gives the unix socket at path its group (unless group is empty) and mode.
// A socket that has the group already (the daemon's own group, as under srpd.service with
// Group=srpd) is not chowned: the unit's SystemCallFilter= denies the @chown calls with
// ~@privileged, so only a group other than the daemon's needs them.
func SetSocketAccess(path string, mode config.FileMode, group string) error {
	if group != "" {
		gid, err := LookupGroup(group)
		if err != nil {
			return fmt.Errorf("socket %s: group %q: %w", path, group, err)
		}
		if !hasGroup(path, gid) {
			if err := os.Lchown(path, -1, gid); err != nil {
				return fmt.Errorf("socket %s: %w", path, err)
			}
		}
	}
	if err := os.Chmod(path, os.FileMode(mode)); err != nil {
		return fmt.Errorf("socket %s: %w", path, err)
	}
	return nil
}

// hasGroup reports whether the file at path (not followed) belongs to group gid.
func hasGroup(path string, gid int) bool {
	fi, err := os.Lstat(path)
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Gid) == gid
}
