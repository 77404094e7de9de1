package stack

import (
	"fmt"
	"os"
	"os/user"
	"strconv"

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
func SetSocketAccess(path string, mode config.FileMode, group string) error {
	if group != "" {
		gid, err := LookupGroup(group)
		if err != nil {
			return fmt.Errorf("socket %s: group %q: %w", path, group, err)
		}
		if err := os.Lchown(path, -1, gid); err != nil {
			return fmt.Errorf("socket %s: %w", path, err)
		}
	}
	if err := os.Chmod(path, os.FileMode(mode)); err != nil {
		return fmt.Errorf("socket %s: %w", path, err)
	}
	return nil
}
