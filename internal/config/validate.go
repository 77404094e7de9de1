package config

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Limits of the schema.
const (
	MaxLUNID = 16383 // SAM flat-space addressing

	minMaxITIULen = 996 // ib_srpt's srp_max_req_size minimum
	maxIULen      = 1 << 20
	minMaxTIIULen = 64
	maxMaxTIIULen = 64 << 10
	maxChannels   = 256
	minQueueDepth = 2 // one credit stays reserved for task management
	maxSessions   = 1 << 20
	minKeepalive  = 100 * time.Millisecond
	maxQueueDepth = 4096
	maxSocketPath = 107 // sizeof(sun_path) - 1

	// scsiDeviceBlockMaxTimeout is SCSI_DEVICE_BLOCK_MAX_TIMEOUT (600 s) of
	// torvalds/linux:include/scsi/scsi_device.h: the longest a SCSI device may stay blocked.
	scsiDeviceBlockMaxTimeout = 600 * time.Second
)

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	ibdevRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	groupRE  = regexp.MustCompile(`^([a-z_][a-z0-9_-]{0,30}[$]?|[0-9]{1,10})$`)
	labelRE  = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)
	nameRule = "must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
)

// validator collects problems, located through the source positions when there are any.
type validator struct {
	src  *source
	errs ErrorList
	// labels names the objects errors are reported against: a list element's path
	// (targets[2], targets[2].luns[0]) to how an operator knows it (target "storage",
	// target "storage" LUN 3). An element without a usable name (missing, invalid, or a
	// duplicate) keeps its index.
	labels map[string]string
}

// label records how the object at path p is named in errors, given its parent's label (empty
// for a top-level object or a standalone one).
func (v *validator) label(p, parentLabel, what string) {
	if v.labels == nil {
		v.labels = map[string]string{}
	}
	if parentLabel != "" {
		what = parentLabel + " " + what
	}
	v.labels[p] = what
}

// where is path as errors show it: the label of the object it is in, then the field inside.
func (v *validator) where(path string) string {
	if l, f := v.object(path); l != "" {
		if f == "" {
			return l
		}
		return l + " " + f
	}
	return path
}

// childLabel labels the element at path p of the object at path parentPath: under the parent's
// label, or on its own when the parent is the root of a standalone check (Target.Validate).
// Under an unlabelled parent the element keeps its index, as its label alone would not say
// which parent it belongs to.
func (v *validator) childLabel(parentPath, p, what string) {
	if parentPath == "" {
		v.label(p, "", what)
	} else if pl, ok := v.labels[parentPath]; ok {
		v.label(p, pl, what)
	}
}

// named is the label of the object at path p, or p itself when it has none.
func (v *validator) named(p string) string {
	if l, ok := v.labels[p]; ok {
		return l
	}
	return p
}

// object splits path into the label of the innermost labelled object that contains it and
// the field path inside that object.
func (v *validator) object(path string) (label, field string) {
	for p := path; p != ""; p = parent(p) {
		if l, ok := v.labels[p]; ok {
			return l, strings.TrimPrefix(path[len(p):], ".")
		}
	}
	return "", path
}

func join(path, sub string) string {
	if path == "" {
		return sub
	}
	if strings.HasPrefix(sub, "[") {
		return path + sub
	}
	return path + "." + sub
}

func index(path, list string, i int) string { return fmt.Sprintf("%s[%d]", join(path, list), i) }

// parent strips the last element of a field path: a.b[2].c → a.b[2] → a.b → a → "".
func parent(path string) string {
	if i := strings.LastIndexAny(path, ".["); i >= 0 {
		return path[:i]
	}
	return ""
}

func (v *validator) errorf(path string, kind error, format string, args ...any) {
	e := &Error{Path: path, Msg: fmt.Sprintf(format, args...), Err: kind}
	e.Object, e.Field = v.object(path)
	if v.src != nil {
		for p := path; ; p = parent(p) {
			if v.src.bad[p] {
				return // already reported as a decoding error
			}
			if p == "" {
				break
			}
		}
		e.File = v.src.file
		for p := path; ; p = parent(p) {
			if at, ok := v.src.pos[p]; ok {
				e.Line, e.Column = at.line, at.col
				break
			}
			if p == "" {
				break
			}
		}
	}
	v.errs = append(v.errs, e)
}

// Validate checks the whole configuration: every field, and the references and uniqueness rules
// between sections. It expects defaults to be applied (SetDefaults). The error, if any, is an
// ErrorList with every problem.
func (c *Config) Validate() error {
	v := &validator{src: c.src}
	v.config(c)
	return v.errs.err()
}

// Validate checks one target on its own (not its transport reference, nor what the rest of a
// Config may conflict with). Defaults must be applied. Paths are relative to the target.
func (t *Target) Validate() error {
	v := &validator{}
	v.target("", t)
	return v.errs.err()
}

// Validate checks one LUN on its own. Defaults must be applied.
func (l *LUN) Validate() error {
	v := &validator{}
	v.lun("", l)
	return v.errs.err()
}

// Validate checks one ACL on its own (not whether its LUNs exist).
func (a *ACL) Validate() error {
	v := &validator{}
	v.acl("", a, nil)
	return v.errs.err()
}

// Validate checks one session on its own (not its transport reference). Defaults must be
// applied.
func (s *Session) Validate() error {
	v := &validator{}
	v.session("", s)
	return v.errs.err()
}

func (v *validator) name(path, name string) {
	switch {
	case name == "":
		v.errorf(path, ErrMissing, "required")
	case !nameRE.MatchString(name):
		v.errorf(path, ErrInvalid, "%q %s", name, nameRule)
	}
}

func (v *validator) rng(path string, val, lo, hi int64, unit string) {
	if val < lo || val > hi {
		v.errorf(path, ErrInvalid, "%d%s is out of range: must be between %d and %d", val, unit, lo, hi)
	}
}

func (v *validator) absPath(path, p string, maxLen int) bool {
	switch {
	case p == "":
		v.errorf(path, ErrMissing, "required")
	case strings.ContainsRune(p, 0):
		v.errorf(path, ErrInvalid, "must not contain NUL bytes")
	case !filepath.IsAbs(p):
		v.errorf(path, ErrInvalid, "%q must be an absolute path", p)
	case filepath.Clean(p) != p:
		v.errorf(path, ErrInvalid, "%q is not a clean path (use %q)", p, filepath.Clean(p))
	case len(p) > maxLen:
		v.errorf(path, ErrInvalid, "path is %d bytes long, longer than %d", len(p), maxLen)
	default:
		return true
	}
	return false
}

func (v *validator) ip(path, s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		v.errorf(path, ErrInvalid, "%q is not an IP address", s)
		return a, false
	}
	return a, true
}

func validHost(s string) bool {
	if _, err := netip.ParseAddr(s); err == nil {
		return true
	}
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(strings.TrimSuffix(s, "."), ".") {
		if !labelRE.MatchString(l) {
			return false
		}
	}
	return true
}

// uniqueName checks that name, of the kind item at path p and index i in list, is not the name
// of an earlier item, recorded in seen (name to index); an empty name is left to the item's
// own check.
func (v *validator) uniqueName(seen map[string]int, p, kind, list, name string, i int) {
	if j, dup := seen[name]; dup && name != "" {
		v.errorf(join(p, "name"), ErrDuplicate, "%s %q is already defined by %s[%d]", kind, name, list, j)
		return
	}
	seen[name] = i
}

// entry starts the checks of element i of a named list (transports, targets, sessions,
// multipath): its messages are labelled with its name (label, e.g. "target"), check runs on its
// path, and its name must be unique (kind names it in that message). It returns the path.
func (v *validator) entry(seen map[string]int, list, label, kind, name string, i int, check func(p string)) string {
	p := index("", list, i)
	if _, dup := seen[name]; !dup && nameRE.MatchString(name) {
		v.label(p, "", fmt.Sprintf("%s %q", label, name))
	}
	check(p)
	v.uniqueName(seen, p, kind, list, name, i)
	return p
}

func (v *validator) config(c *Config) {
	if c.Version != DefaultVersion {
		v.errorf("version", ErrInvalid, "unsupported version %d (this srpd reads version %d)", c.Version, DefaultVersion)
	}
	v.globalLimits("limits", &c.Limits)

	transports := map[string]int{}
	for i := range c.Transports {
		t := &c.Transports[i]
		v.entry(transports, "transports", "transport", "transport", t.Name, i, func(p string) { v.transport(p, t) })
	}
	if len(c.Transports) == 0 && (len(c.Targets) > 0 || len(c.Sessions) > 0) {
		v.errorf("transports", ErrMissing, "at least one transport is required for targets and sessions")
	}
	checkRef := func(path, ref string) *Transport {
		switch {
		case ref == "" && len(c.Transports) > 1:
			v.errorf(path, ErrMissing, "required when several transports are defined")
		case ref != "":
			if i, ok := transports[ref]; ok {
				return &c.Transports[i]
			}
			if len(c.Transports) > 0 {
				v.errorf(path, ErrReference, "transport %q is not defined", ref)
			}
		}
		return nil
	}

	targets := map[string]int{}
	portIDs := map[string]int{}
	paths := map[string]string{}
	for i := range c.Targets {
		t := &c.Targets[i]
		p := v.entry(targets, "targets", "target", "target", t.Name, i, func(p string) { v.target(p, t) })
		tr := checkRef(join(p, "transport"), t.Transport)
		if !t.PortID.IsZero() {
			key := t.Transport + "/" + t.PortID.String()
			if j, dup := portIDs[key]; dup {
				v.errorf(join(p, "port_id"), ErrDuplicate, "port id %s is already used by %s on the same transport", t.PortID, v.named(index("", "targets", j)))
			} else {
				portIDs[key] = i
			}
		}
		if tr != nil && tr.Driver == DriverSoftRoCE && tr.Address != "" {
			if ta, err := netip.ParseAddr(tr.Address); err == nil && !ta.IsUnspecified() {
				for k, l := range t.Listen {
					if la, err := netip.ParseAddr(l); err == nil && la != ta {
						v.errorf(index(p, "listen", k), ErrInvalid,
							"%s is not an address of transport %q, which is bound to %s only", l, tr.Name, tr.Address)
					}
				}
			}
		}
		for k := range t.LUNs {
			l := &t.LUNs[k]
			if l.Backend == BackendRBD && l.RBD != nil {
				// One image exported twice by one daemon: the two LUNs would fight over the
				// image's exclusive lock and their caches would not see each other's writes.
				key := "rbd:" + l.RBD.ClusterConfig + ":" + l.RBD.Spec()
				ip := join(index(p, "luns", k), "rbd.image")
				if prev, dup := paths[key]; dup {
					v.errorf(ip, ErrDuplicate, "image %s is already exported by %s", l.RBD.Spec(), prev)
				} else {
					paths[key] = v.where(index(p, "luns", k))
				}
				continue
			}
			if l.Path == "" || l.Backend == BackendRAM {
				continue
			}
			lp := join(index(p, "luns", k), "path")
			if prev, dup := paths[l.Path]; dup {
				v.errorf(lp, ErrDuplicate, "%s is already exported by %s", l.Path, prev)
			} else {
				paths[l.Path] = v.where(index(p, "luns", k))
			}
		}
	}

	sessions := map[string]int{}
	remotes := map[string]int{}
	sockets := map[string]string{c.Control.Socket: "control.socket"}
	for i := range c.Sessions {
		s := &c.Sessions[i]
		p := v.entry(sessions, "sessions", "session", "session", s.Name, i, func(p string) { v.session(p, s) })
		checkRef(join(p, "transport"), s.Transport)
		if !s.TargetPortID.IsZero() {
			// ib_srp refuses a second login with the same target port and initiator_ext
			// ("Already connected to target port"); so do we.
			key := s.Transport + "/" + s.TargetPortID.String() + "/" + s.InitiatorExt.String()
			if j, dup := remotes[key]; dup {
				v.errorf(join(p, "initiator_ext"), ErrDuplicate,
					"%s already logs in to target port %s with initiator_ext %s", v.named(index("", "sessions", j)), s.TargetPortID, s.InitiatorExt)
			} else {
				remotes[key] = i
			}
		}
		v.uniqueSockets(sockets, p, s.NBD)
	}

	groups := map[string]int{}
	member := map[string]string{}
	for i := range c.Multipath {
		m := &c.Multipath[i]
		p := v.entry(groups, "multipath", "multipath", "multipath group", m.Name, i, func(p string) { v.name(join(p, "name"), m.Name) })
		if len(m.Sessions) < 2 {
			v.errorf(join(p, "sessions"), ErrMissing, "a multipath group needs two or more sessions (one per target port)")
		}
		for k, n := range m.Sessions {
			sp := index(p, "sessions", k)
			switch {
			case c.Session(n) == nil:
				v.errorf(sp, ErrNotFound, "no session %q", n)
			case member[n] != "":
				v.errorf(sp, ErrDuplicate, "session %q is already a path of multipath %q", n, member[n])
			default:
				member[n] = m.Name
				if len(c.Session(n).NBD) > 0 {
					v.errorf(sp, ErrInvalid, "session %q exports LUNs itself: a path's LUNs are exported by its multipath group", n)
				}
			}
		}
		if t := m.NoPathTimeout; t != nil {
			if d := t.Duration(); t.Off() || d < time.Second || d > time.Hour {
				v.errorf(join(p, "no_path_timeout"), ErrInvalid, "must be between 1s and 1h")
			}
		}
		v.nbdExports(p, m.NBD)
		v.uniqueSockets(sockets, p, m.NBD)
	}

	v.control("control", &c.Control)
	v.lunPaths(c)
	switch c.Logging.Level {
	case "debug", "info", "warn", "error":
	default:
		v.errorf("logging.level", ErrInvalid, "%q must be debug, info, warn or error", c.Logging.Level)
	}
	switch c.Logging.Format {
	case "auto", "json", "console":
	default:
		v.errorf("logging.format", ErrInvalid, "%q must be auto, json or console", c.Logging.Format)
	}
	if c.Metrics.Listen != "" {
		v.hostPort("metrics.listen", c.Metrics.Listen)
	}
}

func (v *validator) hostPort(path, s string) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		v.errorf(path, ErrInvalid, "%q must be host:port, e.g. 127.0.0.1:9650 or [::1]:9650", s)
		return
	}
	if host != "" && !validHost(host) {
		v.errorf(path, ErrInvalid, "%q is not an IP address or host name", host)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		v.errorf(path, ErrInvalid, "port %q must be a number between 1 and 65535", port)
	}
}

func (v *validator) transport(p string, t *Transport) {
	v.name(join(p, "name"), t.Name)
	switch t.MTU {
	case 256, 512, 1024, 2048, 4096:
	case 0:
		if t.Driver != DriverVerbs {
			v.errorf(join(p, "mtu"), ErrMissing, "required (defaults not applied)")
		}
	default:
		v.errorf(join(p, "mtu"), ErrInvalid, "%d must be 256, 512, 1024, 2048 or 4096 (a RoCE path MTU, not the Ethernet MTU)", t.MTU)
	}
	only := func(field, driver string, set bool) {
		if set {
			v.errorf(join(p, field), ErrInvalid, "only applies to the %s driver", driver)
		}
	}
	switch t.Driver {
	case DriverSoftRoCE:
		switch {
		case t.Address == "" && t.Interface == "":
			v.errorf(join(p, "address"), ErrMissing, "the softroce driver needs an address or an interface")
		case t.Address != "" && t.Interface != "":
			v.errorf(join(p, "interface"), ErrInvalid, "address and interface are mutually exclusive")
		case t.Address != "":
			v.ip(join(p, "address"), t.Address)
		default:
			if len(t.Interface) > 15 || strings.ContainsAny(t.Interface, "/: \t\n") {
				v.errorf(join(p, "interface"), ErrInvalid, "%q is not a network interface name", t.Interface)
			}
		}
		v.rng(join(p, "udp_port"), int64(t.UDPPort), 1, 65535, "")
		v.rng(join(p, "socket_buffer"), int64(t.SocketBuffer), 64<<10, 1<<30, " bytes")
		if t.Queues != 0 {
			v.rng(join(p, "queues"), int64(t.Queues), 1, MaxQueues, "")
		}
		if t.BusyPoll != nil && t.BusyPoll.Duration() > MaxBusyPoll {
			v.errorf(join(p, "busy_poll"), ErrInvalid, "%v is longer than %v (each empty receive spins that long)", t.BusyPoll, MaxBusyPoll)
		}
		if d := time.Duration(t.PacketLifeTime); d != 0 && (d < time.Millisecond || d > 4*time.Second) {
			v.errorf(join(p, "packet_life_time"), ErrInvalid, "%v must be between 1ms and 4s", d)
		}
		only("device", DriverVerbs, t.Device != "")
		only("port", DriverVerbs, t.Port != 0)
	case DriverVerbs:
		if !VerbsSupported {
			v.errorf(join(p, "driver"), ErrUnsupported,
				"this build of srpd has no verbs support (rebuild with -tags verbs, or use driver softroce)")
		}
		switch {
		case t.Device == "":
			v.errorf(join(p, "device"), ErrMissing, "the verbs driver needs an RDMA device name (see `srpctl link list`)")
		case !ibdevRE.MatchString(t.Device):
			v.errorf(join(p, "device"), ErrInvalid, "%q is not an RDMA device name", t.Device)
		}
		v.rng(join(p, "port"), int64(t.Port), 1, 255, "")
		only("address", DriverSoftRoCE, t.Address != "")
		only("interface", DriverSoftRoCE, t.Interface != "")
		only("udp_port", DriverSoftRoCE, t.UDPPort != 0)
		only("socket_buffer", DriverSoftRoCE, t.SocketBuffer != 0)
		only("busy_poll", DriverSoftRoCE, t.BusyPoll != nil)
		only("keep_icrc", DriverSoftRoCE, t.KeepICRC)
		only("packet_life_time", DriverSoftRoCE, t.PacketLifeTime != 0)
		only("queues", DriverSoftRoCE, t.Queues != 0)
	default:
		v.errorf(join(p, "driver"), ErrInvalid, "%q must be softroce or verbs (or verbs:<device>)", t.Driver)
	}
}

func (v *validator) target(p string, t *Target) {
	v.name(join(p, "name"), t.Name)
	if t.Transport != "" && !nameRE.MatchString(t.Transport) {
		v.errorf(join(p, "transport"), ErrInvalid, "%q %s", t.Transport, nameRule)
	}
	if t.PortID.IsZero() {
		v.errorf(join(p, "port_id"), ErrMissing, "required (32 hexadecimal digits: id_ext then ioc_guid)")
	}
	seen := map[netip.Addr]bool{}
	for i, l := range t.Listen {
		lp := index(p, "listen", i)
		if a, ok := v.ip(lp, l); ok {
			if seen[a] {
				v.errorf(lp, ErrDuplicate, "%s is listed twice", l)
			}
			seen[a] = true
		}
	}
	v.rng(join(p, "cm_port"), int64(t.CMPort), 1, 65535, "")

	ids := map[int]int{}
	for i := range t.LUNs {
		l := &t.LUNs[i]
		lp := index(p, "luns", i)
		if _, dup := ids[l.ID]; !dup {
			v.childLabel(p, lp, fmt.Sprintf("LUN %d", l.ID))
		}
		v.lun(lp, l)
		if j, dup := ids[l.ID]; dup {
			v.errorf(join(lp, "id"), ErrDuplicate, "LUN %d is already defined by luns[%d]", l.ID, j)
		} else {
			ids[l.ID] = i
		}
	}
	inis := map[InitiatorID]int{}
	for i := range t.ACLs {
		a := &t.ACLs[i]
		ap := index(p, "acls", i)
		if _, dup := inis[a.Initiator]; !dup && !a.Initiator.IsZero() {
			v.childLabel(p, ap, fmt.Sprintf("ACL %s", a.Initiator))
		}
		v.acl(ap, a, ids)
		if a.Initiator.IsZero() {
			continue
		}
		if j, dup := inis[a.Initiator]; dup {
			v.errorf(join(ap, "initiator"), ErrDuplicate, "initiator %s already has an ACL (acls[%d])", a.Initiator, j)
		} else {
			inis[a.Initiator] = i
		}
	}
	v.limits(join(p, "limits"), &t.Limits)
	v.targetALUA(p, t)
}

func (v *validator) lun(p string, l *LUN) {
	v.rng(join(p, "id"), int64(l.ID), 0, MaxLUNID, "")
	v.lunALUA(p, l)
	blockOK := l.BlockSize == 512 || l.BlockSize == 4096
	if !blockOK {
		v.errorf(join(p, "block_size"), ErrInvalid, "%d must be 512 or 4096", l.BlockSize)
	}
	not := func(field string, set bool) {
		if set {
			v.errorf(join(p, field), ErrInvalid, "does not apply to the %s backend", l.Backend)
		}
	}
	switch l.Backend {
	case BackendRAM:
		if l.Size == 0 {
			v.errorf(join(p, "size"), ErrMissing, "the ram backend needs a size (e.g. 64MiB)")
		}
		not("path", l.Path != "")
		not("create", l.Create)
		not("direct", l.Direct)
		not("follow_symlinks", l.FollowSymlinks)
		not("shared", l.Shared)
	case BackendFile:
		v.absPath(join(p, "path"), l.Path, 4095)
		if l.Create && l.Size == 0 {
			v.errorf(join(p, "size"), ErrMissing, "create needs a size for the new file")
		}
		if l.Create && l.ReadOnly {
			v.errorf(join(p, "create"), ErrInvalid, "a read-only LUN cannot create its file")
		}
	case BackendBlockDev:
		v.absPath(join(p, "path"), l.Path, 4095)
		not("size", l.Size != 0)
		not("create", l.Create)
		not("shared", l.Shared)
	case BackendRBD:
		if !RBDSupported {
			v.errorf(join(p, "backend"), ErrUnsupported,
				"this build of srpd has no rbd support (rebuild with -tags rbd, cgo and librbd-dev)")
		}
		v.rbd(join(p, "rbd"), l.RBD)
		not("path", l.Path != "")
		not("size", l.Size != 0)
		not("create", l.Create)
		not("direct", l.Direct)
		not("follow_symlinks", l.FollowSymlinks)
		not("shared", l.Shared)
	case "":
		v.errorf(join(p, "backend"), ErrMissing, "required: ram, file, blockdev or rbd")
	default:
		v.errorf(join(p, "backend"), ErrInvalid, "%q must be ram, file, blockdev or rbd", l.Backend)
	}
	if l.Backend != BackendRBD && l.RBD != nil {
		not("rbd", true)
	}
	if l.Size < 0 {
		v.errorf(join(p, "size"), ErrInvalid, "must not be negative")
	} else if blockOK && l.Size%Size(l.BlockSize) != 0 {
		v.errorf(join(p, "size"), ErrInvalid, "%s must be a multiple of the block size (%d)", l.Size, l.BlockSize)
	}
	if len(l.Serial) > 64 {
		v.errorf(join(p, "serial"), ErrInvalid, "is %d bytes long, longer than 64", len(l.Serial))
	}
	for _, r := range l.Serial {
		if r < 0x20 || r > 0x7e {
			v.errorf(join(p, "serial"), ErrInvalid, "must be printable ASCII")
			break
		}
	}
}

// rbdNameRE: a pool, namespace or image name. Ceph allows more, but '/' and '@' separate the
// parts of an image spec (pool/namespace/image@snapshot) and the rest would need quoting.
var rbdNameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._+:-]{0,254}$`)

// clientRE: a cephx entity name, client.<id>.
var clientRE = regexp.MustCompile(`^client\.[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

func (v *validator) rbd(p string, r *RBD) {
	if r == nil {
		v.errorf(p, ErrMissing, "the rbd backend needs rbd: {pool: ..., image: ...}")
		return
	}
	v.absPath(join(p, "cluster_config"), r.ClusterConfig, 4095)
	if r.Keyring != "" {
		v.absPath(join(p, "keyring"), r.Keyring, 4095)
	}
	if !clientRE.MatchString(r.Client) {
		v.errorf(join(p, "client"), ErrInvalid, "%q must be client.<id> (letters, digits, '.', '_' or '-')", r.Client)
	}
	name := func(field, val string, required bool) {
		switch {
		case val == "" && required:
			v.errorf(join(p, field), ErrMissing, "required")
		case val != "" && !rbdNameRE.MatchString(val):
			v.errorf(join(p, field), ErrInvalid, "%q must be 1 to 255 letters, digits, '.', '_', '+', ':' or '-', "+
				"not starting with '.', '+', ':' or '-'", val)
		}
	}
	name("pool", r.Pool, true)
	name("namespace", r.Namespace, false)
	name("image", r.Image, true)
	switch r.ExclusiveLock {
	case RBDLockManaged, RBDLockAuto:
	default:
		v.errorf(join(p, "exclusive_lock"), ErrInvalid, "%q must be %s or %s", r.ExclusiveLock, RBDLockManaged, RBDLockAuto)
	}
}

// acl checks one ACL; luns (LUN id → index), when not nil, are the LUNs it may name.
func (v *validator) acl(p string, a *ACL, luns map[int]int) {
	if a.Initiator.IsZero() {
		v.errorf(join(p, "initiator"), ErrMissing, `required: an initiator port id (32 hexadecimal digits) or "*"`)
	}
	seen := map[int]bool{}
	for i, id := range a.LUNs {
		lp := index(p, "luns", i)
		switch _, ok := luns[id]; {
		case id < 0 || id > MaxLUNID:
			v.rng(lp, int64(id), 0, MaxLUNID, "")
		case seen[id]:
			v.errorf(lp, ErrDuplicate, "LUN %d is listed twice", id)
		case luns != nil && !ok:
			v.errorf(lp, ErrReference, "LUN %d is not defined in this target", id)
		}
		seen[id] = true
	}
}

func (v *validator) limits(p string, l *Limits) {
	v.rng(join(p, "max_channels"), int64(l.MaxChannels), 1, maxChannels, "")
	v.rng(join(p, "queue_depth"), int64(l.QueueDepth), minQueueDepth, maxQueueDepth, "")
	v.rng(join(p, "max_it_iu_len"), int64(l.MaxITIULen), minMaxITIULen, maxIULen, " bytes")
	v.rng(join(p, "max_ti_iu_len"), int64(l.MaxTIIULen), minMaxTIIULen, maxMaxTIIULen, " bytes")
	v.rng(join(p, "max_sessions"), int64(l.MaxSessions), 0, maxSessions, "")
	if l.KeepaliveInterval != nil && !l.KeepaliveInterval.Off() && l.KeepaliveInterval.Duration() < minKeepalive {
		v.errorf(join(p, "keepalive_interval"), ErrInvalid, "%v is too short: at least %v, or off", l.KeepaliveInterval, minKeepalive)
	}
	if l.StallTimeout != nil && !l.StallTimeout.Off() && l.StallTimeout.Duration() < minKeepalive {
		v.errorf(join(p, "stall_timeout"), ErrInvalid, "%v is too short: at least %v, or off", l.StallTimeout, minKeepalive)
	}
	switch l.StallAction {
	case "", StallClose, StallLog:
	default:
		v.errorf(join(p, "stall_action"), ErrInvalid, "%q must be close or log", l.StallAction)
	}
}

// globalLimits checks the daemon-wide bounds.
func (v *validator) globalLimits(p string, l *GlobalLimits) {
	v.rng(join(p, "max_sessions"), int64(l.MaxSessions), 0, maxSessions, "")
	v.rng(join(p, "max_sessions_per_initiator"), int64(l.MaxSessionsPerInitiator), 0, maxSessions, "")
	v.rng(join(p, "max_pending_logins"), int64(l.MaxPendingLogins), 0, 65536, "")
	v.rng(join(p, "max_pending_logins_per_source"), int64(l.MaxPendingLoginsPerSource), 0, 65536, "")
	v.rng(join(p, "login_rate_per_source"), int64(l.LoginRatePerSource), 0, 1_000_000, " per second")
	if l.LoginTimeout != 0 && time.Duration(l.LoginTimeout) < 100*time.Millisecond {
		v.errorf(join(p, "login_timeout"), ErrInvalid, "%v is too short: at least 100ms", l.LoginTimeout)
	}
}

func (v *validator) session(p string, s *Session) {
	v.name(join(p, "name"), s.Name)
	if s.Transport != "" && !nameRE.MatchString(s.Transport) {
		v.errorf(join(p, "transport"), ErrInvalid, "%q %s", s.Transport, nameRule)
	}
	switch {
	case s.Address == "":
		v.errorf(join(p, "address"), ErrMissing, "required: the target's IP address or host name")
	case !validHost(s.Address):
		v.errorf(join(p, "address"), ErrInvalid, "%q is not an IP address or host name (give the port in port:)", s.Address)
	}
	v.rng(join(p, "port"), int64(s.Port), 1, 65535, "")
	if s.Source != "" {
		v.ip(join(p, "source"), s.Source)
	}
	if s.TargetPortID.IsZero() {
		v.errorf(join(p, "target_port_id"), ErrMissing, "required (32 hexadecimal digits: id_ext then ioc_guid)")
	}
	v.rng(join(p, "ch_count"), int64(s.ChCount), 1, maxChannels, "")
	v.rng(join(p, "queue_depth"), int64(s.QueueDepth), minQueueDepth, maxQueueDepth, "")
	if s.MaxITIULen != 0 {
		v.rng(join(p, "max_it_iu_len"), int64(s.MaxITIULen), 64, maxIULen, " bytes")
	}
	if d := time.Duration(s.ConnectTimeout); d < time.Second || d > 10*time.Minute {
		v.errorf(join(p, "connect_timeout"), ErrInvalid, "%s must be between 1s and 10m", d)
	}
	v.timeouts(p, s)
	v.nbdExports(p, s.NBD)
}

// nbdExports checks the NBD exports of a session or a multipath group at p.
func (v *validator) nbdExports(p string, exps []NBDExport) {
	luns := map[int]int{}
	for i, e := range exps {
		np := index(p, "nbd", i)
		v.rng(join(np, "lun"), int64(e.LUN), 0, MaxLUNID, "")
		if j, dup := luns[e.LUN]; dup {
			v.errorf(join(np, "lun"), ErrDuplicate, "LUN %d is already exported by nbd[%d]", e.LUN, j)
		} else {
			luns[e.LUN] = i
		}
		v.absPath(join(np, "socket"), e.Socket, maxSocketPath)
		if e.MaxConnections != 0 {
			v.rng(join(np, "max_connections"), int64(e.MaxConnections), 1, MaxNBDConnections, " connections")
		}
		if t := e.WriteTimeout; t != nil && !t.Off() {
			if d := t.Duration(); d < time.Second || d > time.Hour {
				v.errorf(join(np, "write_timeout"), ErrInvalid, "%s must be off or between 1s and 1h", d)
			}
		}
		if e.Mode != 0 {
			v.socketMode(join(np, "mode"), e.Mode)
		}
		v.groupName(join(np, "group"), e.Group)
	}
}

// uniqueSockets reports an NBD export of the entry at p whose socket is already in sockets (the
// control socket and the exports seen so far, each with the place that uses it), and adds the
// others.
func (v *validator) uniqueSockets(sockets map[string]string, p string, exps []NBDExport) {
	for k, e := range exps {
		if e.Socket == "" {
			continue
		}
		np := join(index(p, "nbd", k), "socket")
		if prev, dup := sockets[e.Socket]; dup {
			v.errorf(np, ErrDuplicate, "%s is already used by %s", e.Socket, prev)
		} else {
			sockets[e.Socket] = v.where(np)
		}
	}
}

// timeouts applies srp_tmo_valid() of torvalds/linux:drivers/scsi/scsi_transport_srp.c to the
// session's reconnect_delay, fast_io_fail_tmo and dev_loss_tmo, "off" standing for the kernel's
// negative values:
//
//	if (reconnect_delay < 0 && fast_io_fail_tmo < 0 && dev_loss_tmo < 0) return -EINVAL;
//	if (reconnect_delay == 0) return -EINVAL;
//	if (fast_io_fail_tmo > SCSI_DEVICE_BLOCK_MAX_TIMEOUT) return -EINVAL;
//	if (fast_io_fail_tmo < 0 && dev_loss_tmo > SCSI_DEVICE_BLOCK_MAX_TIMEOUT) return -EINVAL;
//	if (dev_loss_tmo >= LONG_MAX / HZ) return -EINVAL;
//	if (fast_io_fail_tmo >= 0 && dev_loss_tmo >= 0 && fast_io_fail_tmo >= dev_loss_tmo)
//		return -EINVAL;
//
// The kernel counts whole seconds (srp_parse_tmo uses kstrtoint), so sub-second values are
// refused rather than rounded. The LONG_MAX / HZ bound (about 2.9e8 years at HZ=1000) lies past
// the largest time.Duration, so it can never apply here.
func (v *validator) timeouts(p string, s *Session) {
	rd, ff, dl := s.ReconnectDelay, s.FastIOFailTmo, s.DevLossTmo
	pRD, pFF, pDL := join(p, "reconnect_delay"), join(p, "fast_io_fail_tmo"), join(p, "dev_loss_tmo")
	ok := true
	for _, t := range []struct {
		path string
		tmo  *Timeout
	}{{pRD, rd}, {pFF, ff}, {pDL, dl}} {
		switch {
		case t.tmo == nil:
			v.errorf(t.path, ErrMissing, "required (defaults not applied)")
			ok = false
		case !t.tmo.Off() && t.tmo.Duration()%time.Second != 0:
			v.errorf(t.path, ErrInvalid, "%s must be a whole number of seconds (or off)", t.tmo.Duration())
		}
	}
	if !ok {
		return
	}
	switch {
	case rd.Off() && ff.Off() && dl.Off():
		v.errorf(pRD, ErrInvalid, "reconnect_delay, fast_io_fail_tmo and dev_loss_tmo must not all be off")
	case !rd.Off() && rd.Duration() == 0:
		v.errorf(pRD, ErrInvalid, "must not be 0s (use off to never reconnect)")
	}
	if !ff.Off() && ff.Duration() > scsiDeviceBlockMaxTimeout {
		v.errorf(pFF, ErrInvalid, "%s must be at most %s (SCSI_DEVICE_BLOCK_MAX_TIMEOUT)", ff.Duration(), scsiDeviceBlockMaxTimeout)
	}
	if ff.Off() && !dl.Off() && dl.Duration() > scsiDeviceBlockMaxTimeout {
		v.errorf(pDL, ErrInvalid, "%s must be at most %s while fast_io_fail_tmo is off (SCSI_DEVICE_BLOCK_MAX_TIMEOUT)",
			dl.Duration(), scsiDeviceBlockMaxTimeout)
	}
	if !ff.Off() && !dl.Off() && ff.Duration() >= dl.Duration() {
		v.errorf(pFF, ErrInvalid, "%s must be less than dev_loss_tmo (%s)", ff.Duration(), dl.Duration())
	}
}

func (v *validator) control(p string, c *Control) {
	v.absPath(join(p, "socket"), c.Socket, maxSocketPath)
	v.socketMode(join(p, "mode"), c.Mode)
	v.groupName(join(p, "group"), c.Group)
}

// socketMode checks a unix socket's permission bits: within 0777, owner read and write.
func (v *validator) socketMode(p string, m FileMode) {
	if m > 0o777 {
		v.errorf(p, ErrInvalid, "%s has bits outside 0777", m)
	} else if m&0o600 != 0o600 {
		v.errorf(p, ErrInvalid, "%s must give the owner read and write (0600)", m)
	}
}

// groupName checks an optional group name or numeric id.
func (v *validator) groupName(p, g string) {
	if g != "" && !groupRE.MatchString(g) {
		v.errorf(p, ErrInvalid, "%q is not a group name or numeric group id", g)
	}
}
