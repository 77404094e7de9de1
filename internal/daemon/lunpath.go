package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/scsi/backend"
)

// Why a LUN path is refused (LUNPathError.Err; backend.ErrSymlink is the third kind).
var (
	// ErrReservedPath: the path is one of srpd's own files — its configuration file (or a
	// temporary file of a configuration save), its control socket, an NBD socket — or lies in
	// its run directory, by name, by real path, or as the same inode (a hard link).
	ErrReservedPath = errors.New("one of srpd's own files")
	// ErrPathNotAllowed: allowed_paths is set and the path, symlinks resolved, is outside it.
	ErrPathNotAllowed = errors.New("outside allowed_paths")
)

// LUNPathError is a file or blockdev LUN path srpd refuses to open. It unwraps to Err
// (ErrReservedPath, ErrPathNotAllowed or backend.ErrSymlink), config.ErrInvalid and
// ctlapi.ErrInvalidArgument, so the control API answers it with 400 invalid_argument.
type LUNPathError struct {
	Target string
	LUN    int
	Path   string
	Reason string // what the path is, e.g. "is srpd's configuration file (srpd -c)"
	Err    error
}

func (e *LUNPathError) Error() string {
	return fmt.Sprintf("target %s: LUN %d: path %s %s", e.Target, e.LUN, e.Path, e.Reason)
}

func (e *LUNPathError) Unwrap() []error {
	return []error{e.Err, config.ErrInvalid, ctlapi.ErrInvalidArgument}
}

// ownFile is a file of srpd's that no LUN may be.
type ownFile struct {
	paths    []string // as configured and symlinks resolved
	what     string
	dev, ino uint64
	haveID   bool // dev and ino are known (the file exists)
}

// lunGuard decides which paths a configuration's LUNs may open. It is built for each apply, so
// it sees the configuration file as it is then (a save replaces its inode).
type lunGuard struct {
	own       []ownFile
	ownDirs   []ownFile // run directories: nothing beneath them
	tmpPrefix []string  // config.AtomicWrite's temporary files: dir/.base.tmp-
	allowed   []string  // allowed_paths, as configured and resolved
}

// resolved returns p and, when it differs, p with its symlinks resolved.
func resolved(p string) []string {
	out := []string{p}
	if r, err := filepath.EvalSymlinks(p); err == nil && r != p {
		out = append(out, r)
	}
	return out
}

func newOwnFile(path, what string) ownFile {
	f := ownFile{paths: resolved(path), what: what}
	var st unix.Stat_t
	if unix.Stat(path, &st) == nil {
		f.dev, f.ino, f.haveID = st.Dev, st.Ino, true
	}
	return f
}

// newLUNGuard collects srpd's own files for the configuration c.
func (d *Daemon) newLUNGuard(c *config.Config) *lunGuard {
	g := &lunGuard{}
	if p := d.opts.ConfigPath; p != "" {
		if abs, err := filepath.Abs(p); err == nil {
			g.own = append(g.own, newOwnFile(abs, "is srpd's configuration file (srpd -c)"))
			for _, q := range resolved(abs) {
				dir, base := filepath.Split(q)
				g.tmpPrefix = append(g.tmpPrefix, dir+"."+base+".tmp-")
			}
		}
	}
	sockets := map[string]bool{}
	addSocket := func(p, what string) {
		if p != "" && !sockets[p] {
			sockets[p] = true
			g.own = append(g.own, newOwnFile(p, what))
		}
	}
	addSocket(c.Control.Socket, "is srpd's control socket (control.socket)")
	d.mu.RLock()
	if d.ctl != nil {
		addSocket(d.ctl.cfg.Socket, "is srpd's control socket (control.socket)")
	}
	d.mu.RUnlock()
	for _, s := range c.Sessions {
		for _, e := range s.NBD {
			addSocket(e.Socket, fmt.Sprintf("is the NBD socket of LUN %d of session %s", e.LUN, s.Name))
		}
	}
	for _, dir := range d.opts.RunDirs {
		if filepath.IsAbs(dir) {
			g.ownDirs = append(g.ownDirs, newOwnFile(filepath.Clean(dir), "is in srpd's run directory "+dir))
		}
	}
	for _, a := range c.AllowedPaths {
		g.allowed = append(g.allowed, resolved(a)...)
	}
	return g
}

// reserved tells what of srpd's p is, by name; "" if nothing.
func (g *lunGuard) reserved(p string) string {
	for _, f := range g.own {
		for _, q := range f.paths {
			if p == q {
				return f.what
			}
		}
	}
	for _, f := range g.ownDirs {
		for _, q := range f.paths {
			if p == q || config.Beneath(p, q) {
				return f.what
			}
		}
	}
	for _, pre := range g.tmpPrefix {
		if strings.HasPrefix(p, pre) {
			return "is a temporary file of a configuration save"
		}
	}
	return ""
}

func (g *lunGuard) allows(real string) bool {
	if len(g.allowed) == 0 {
		return true
	}
	for _, a := range g.allowed {
		if config.Beneath(real, a) {
			return true
		}
	}
	return false
}

func (g *lunGuard) refuse(t *config.Target, l *config.LUN, kind error, format string, args ...any) error {
	return &LUNPathError{Target: t.Name, LUN: l.ID, Path: l.Path, Reason: fmt.Sprintf(format, args...), Err: kind}
}

// realPath resolves the symlinks of p; for a file not there yet (create), of its directory.
func realPath(p string) (string, error) {
	r, err := filepath.EvalSymlinks(p)
	if errors.Is(err, fs.ErrNotExist) {
		if _, lerr := os.Lstat(p); lerr == nil {
			return "", fmt.Errorf("%s is a dangling symbolic link", p)
		}
		dir, err := filepath.EvalSymlinks(filepath.Dir(p))
		if err != nil {
			return "", err
		}
		return filepath.Join(dir, filepath.Base(p)), nil
	}
	return r, err
}

// check looks at a LUN path before it is opened: by name (srpd's files), then symlinks
// resolved (srpd's files, symlinks without follow_symlinks, allowed_paths). It refuses what it
// can tell is wrong so that nothing is opened, created or restarted for it; admit then decides
// on what was actually opened. A path that cannot be resolved (it does not exist) is left to
// the open to report.
func (g *lunGuard) check(t *config.Target, l *config.LUN) error {
	if l.Backend != config.BackendFile && l.Backend != config.BackendBlockDev {
		return nil
	}
	if what := g.reserved(l.Path); what != "" {
		return g.refuse(t, l, ErrReservedPath, "%s", what)
	}
	real, err := realPath(l.Path)
	if err != nil {
		if !l.FollowSymlinks {
			if fi, lerr := os.Lstat(l.Path); lerr == nil && fi.Mode()&os.ModeSymlink != 0 {
				return g.refuse(t, l, backend.ErrSymlink, "is a symbolic link; set follow_symlinks: true on the LUN to allow it")
			}
		}
		return nil
	}
	if real != l.Path && !l.FollowSymlinks {
		return g.refuse(t, l, backend.ErrSymlink,
			"goes through a symbolic link (it resolves to %s); set follow_symlinks: true on the LUN to allow it", real)
	}
	return g.checkReal(t, l, real)
}

func (g *lunGuard) checkReal(t *config.Target, l *config.LUN, real string) error {
	if what := g.reserved(real); what != "" {
		return g.refuse(t, l, ErrReservedPath, "resolves to %s, which %s", real, what)
	}
	var st unix.Stat_t
	if unix.Stat(real, &st) == nil {
		if err := g.sameAsOwn(t, l, st.Dev, st.Ino); err != nil {
			return err
		}
	}
	if !g.allows(real) {
		return g.refuse(t, l, ErrPathNotAllowed, "resolves to %s, outside allowed_paths", real)
	}
	return nil
}

// admit is the backend's Admit for l: the opened file must not be one of srpd's own files by
// identity (a hard link to the configuration file has its inode), and its real path must be
// allowed.
func (g *lunGuard) admit(t *config.Target, l *config.LUN) func(backend.Identity) error {
	return func(id backend.Identity) error {
		if err := g.sameAsOwn(t, l, id.Dev, id.Ino); err != nil {
			return err
		}
		if id.RealPath == "" {
			return nil // no /proc: check judged the path
		}
		if id.RealPath != l.Path && !l.FollowSymlinks {
			return g.refuse(t, l, backend.ErrSymlink, "opened %s through a symbolic link", id.RealPath)
		}
		return g.checkReal(t, l, id.RealPath)
	}
}

// openKind adds an API error kind to a backend open error without changing its message.
type openKind struct {
	error
	kind error
}

func (e *openKind) Unwrap() []error { return []error{e.error, e.kind} }

// classifyOpenError gives the backend's refusals of a LUN the control API code they deserve
// (the request named a wrong path or size: 400; the file is exported elsewhere: 409) rather
// than 500. Other failures (EIO, ENOMEM...) stay internal errors.
func classifyOpenError(err error) error {
	switch {
	case errors.Is(err, backend.ErrBusy):
		return &openKind{err, ctlapi.ErrConflict}
	case errors.Is(err, backend.ErrNotRegularFile), errors.Is(err, backend.ErrNotBlockDevice),
		errors.Is(err, backend.ErrWouldShrink), errors.Is(err, backend.ErrInvalidSize),
		errors.Is(err, backend.ErrReadOnly), errors.Is(err, fs.ErrNotExist), errors.Is(err, backend.ErrNoExclusiveLock):
		return &openKind{err, ctlapi.ErrInvalidArgument}
	}
	return err
}

// sameAsOwn refuses the file dev:ino when it is one of srpd's own files under another name.
func (g *lunGuard) sameAsOwn(t *config.Target, l *config.LUN, dev, ino uint64) error {
	for _, f := range g.own {
		if f.haveID && f.dev == dev && f.ino == ino {
			return g.refuse(t, l, ErrReservedPath, "is the same file as %s, which %s (a hard link or another path to it)",
				f.paths[0], f.what)
		}
	}
	return nil
}
