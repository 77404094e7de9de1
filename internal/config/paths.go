package config

import (
	"path/filepath"
	"strings"
)

// Beneath reports whether path lies strictly beneath the directory dir. Both must be clean
// absolute paths; the comparison is by name only (no symlinks resolved), so that
// /srv/luns-old is not beneath /srv/luns.
func Beneath(path, dir string) bool {
	if dir == "/" {
		return path != "/" && strings.HasPrefix(path, "/")
	}
	return strings.HasPrefix(path, dir) && len(path) > len(dir) && path[len(dir)] == '/'
}

// PathAllowed reports whether path may be a LUN path under allowed_paths: always when the list
// is empty, else when it lies beneath one of its directories.
func (c *Config) PathAllowed(path string) bool {
	if len(c.AllowedPaths) == 0 {
		return true
	}
	for _, d := range c.AllowedPaths {
		if Beneath(path, d) {
			return true
		}
	}
	return false
}

// lunPaths checks allowed_paths and the paths of the file and blockdev LUNs against it and
// against srpd's own sockets. Paths are clean and absolute by now (or already reported), so a
// ".." escape cannot get here; symlinks are the daemon's to resolve when it opens the LUN.
func (v *validator) lunPaths(c *Config) {
	seen := map[string]int{}
	for i, d := range c.AllowedPaths {
		p := index("", "allowed_paths", i)
		if !v.absPath(p, d, 4095) {
			continue
		}
		if j, dup := seen[d]; dup {
			v.errorf(p, ErrDuplicate, "%s is already listed as allowed_paths[%d]", d, j)
		}
		seen[d] = i
	}
	own := map[string]string{}
	if v.src != nil && v.src.file != "" {
		// The file being parsed (srpd -c FILE --check, srpctl config validate FILE): the daemon
		// refuses it by inode too, but a LUN naming it is worth reporting before any start.
		if abs, err := filepath.Abs(v.src.file); err == nil {
			own[abs] = "this configuration file"
		}
	}
	if c.Control.Socket != "" {
		own[c.Control.Socket] = "srpd's control socket (control.socket)"
	}
	for i, s := range c.Sessions {
		for k, e := range s.NBD {
			if e.Socket != "" {
				own[e.Socket] = "the NBD socket of " + v.where(index(index("", "sessions", i), "nbd", k))
			}
		}
	}
	for i := range c.Targets {
		t := &c.Targets[i]
		for k := range t.LUNs {
			l := &t.LUNs[k]
			if l.Path == "" || (l.Backend != BackendFile && l.Backend != BackendBlockDev) {
				continue
			}
			lp := join(index(index("", "targets", i), "luns", k), "path")
			if what, ok := own[l.Path]; ok {
				v.errorf(lp, ErrInvalid, "%s is %s, not a LUN", l.Path, what)
				continue
			}
			if !c.PathAllowed(l.Path) {
				v.errorf(lp, ErrInvalid, "%s is outside allowed_paths (%s)",
					l.Path, strings.Join(c.AllowedPaths, ", "))
			}
		}
	}
}
