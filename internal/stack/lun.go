package stack

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/scsi/backend"
)

// LUN is an open logical unit: its backend and the SCSI logical unit over it.
type LUN struct {
	Config config.LUN
	SCSI   *scsi.LUN
	// Capacity is the backend's size in bytes at open; SCSI.Blocks() follows resizes.
	Capacity int64
	// raw is the backend as opened (before LUNOptions.Wrap): the one that resizes.
	raw backend.Backend
}

// LUNOptions are what opening a LUN takes beyond its configuration.
type LUNOptions struct {
	// Admit, for a file or blockdev LUN, vets the file that was opened before it is resized
	// or used (backend.FileOptions.Admit); nil admits any.
	Admit func(backend.Identity) error
	// Wrap, if set, wraps the backend the logical unit uses (the daemon times the I/O).
	Wrap func(backend.Backend) backend.Backend
	// Log receives the backend's events (an RBD image's exclusive lock); nil: none.
	Log *zap.Logger
}

// DefaultSerial is the unit serial number of a LUN without one: the target port ID and the
// LUN number, stable across restarts (the NAA identifier derives from it).
func DefaultSerial(portID config.PortID, id int) string {
	return fmt.Sprintf("%016x%016x-%d", portID.IDExt(), portID.GUID(), id)
}

// OpenLUN opens the backend of LUN l of target t and creates the logical unit. Symlinks in a
// file or blockdev path are refused (backend.ErrSymlink) unless l.FollowSymlinks. Errors name
// the target and the LUN and wrap the backend's.
func OpenLUN(t *config.Target, l config.LUN, o LUNOptions) (*LUN, error) {
	var (
		be     backend.Backend
		err    error
		lunRef atomic.Pointer[scsi.LUN] // for the RBD header watch, once the LUN exists
	)
	switch l.Backend {
	case config.BackendRAM:
		be, err = backend.NewRAM(int64(l.Size), l.ReadOnly)
	case config.BackendFile:
		be, err = backend.OpenFile(l.Path, backend.FileOptions{ReadOnly: l.ReadOnly, Create: l.Create,
			Size: int64(l.Size), Direct: l.Direct, Shared: l.Shared, NoSymlinks: !l.FollowSymlinks, Admit: o.Admit})
	case config.BackendBlockDev:
		be, err = backend.OpenBlockDev(l.Path, backend.BlockDevOptions{ReadOnly: l.ReadOnly, Direct: l.Direct,
			NoSymlinks: !l.FollowSymlinks, Admit: o.Admit})
	case config.BackendRBD:
		log := o.Log
		if log == nil {
			log = zap.NewNop()
		}
		be, err = openRBD(l, func(int64) { rbdResized(&lunRef) }, log)
	default:
		err = fmt.Errorf("unknown backend %q: %w", l.Backend, ctlapi.ErrInvalidArgument)
	}
	if err != nil {
		return nil, fmt.Errorf("target %s: LUN %d: %w", t.Name, l.ID, err)
	}
	lc, err := lunIdentity(t, &l)
	if err != nil {
		_ = be.Close()
		return nil, fmt.Errorf("target %s: LUN %d: %w", t.Name, l.ID, err)
	}
	lc.BlockSize, lc.ReadOnly = l.BlockSize, l.ReadOnly
	lc.Allocation, _ = be.(backend.Allocation) // before Wrap hides it
	lc.Fence, _ = be.(backend.Fenceable)
	lc.PRStore = sharedPRStore(be)
	capacity, raw := be.Size(), be
	if o.Wrap != nil {
		be = o.Wrap(be)
	}
	lun, err := scsi.NewLUN(lc, be)
	if err != nil {
		_ = be.Close()
		return nil, fmt.Errorf("target %s: LUN %d: %w", t.Name, l.ID, err)
	}
	lunRef.Store(lun)
	return &LUN{Config: l, SCSI: lun, Capacity: capacity, raw: raw}, nil
}

// rbdResized follows a resize of an RBD image made elsewhere (rbd resize): the header watch
// saw the new size, and the initiators are told CAPACITY DATA HAS CHANGED.
func rbdResized(ref *atomic.Pointer[scsi.LUN]) {
	if l := ref.Load(); l != nil {
		_, _ = l.Resize() // a size that is no multiple of the block size keeps the old capacity
	}
}

// LockState is the state of the exclusive lock of a LUN whose backend several gateways share
// under one (an RBD image with the managed lock): whether this gateway owns it and how many
// times it was fenced (another gateway took the lock over). ok is false for other LUNs.
func (l *LUN) LockState() (owned bool, fences uint64, ok bool) {
	f, isF := l.raw.(backend.Fenceable)
	o, isO := l.raw.(interface{ LockOwned() bool })
	if !isF || !isO {
		return false, 0, false
	}
	return o.LockOwned(), f.FenceEpoch(), true
}

// Size is the capacity in bytes now.
func (l *LUN) Size() int64 { return int64(l.SCSI.Blocks()) * int64(l.SCSI.BlockSize()) }

// Resize grows the backend to size bytes (0: reads its size again, e.g. of a block device
// grown by lvextend) and makes the logical unit's capacity follow: the initiators that use it
// get CAPACITY DATA HAS CHANGED. It returns the new capacity. A backend that cannot resize is
// ctlapi.ErrUnsupported; a shrink is backend.ErrWouldShrink with ctlapi.ErrInvalidArgument.
func (l *LUN) Resize(size int64) (int64, error) {
	r, ok := l.raw.(backend.Resizer)
	if !ok {
		return l.Size(), fmt.Errorf("LUN %d: the %s backend cannot be resized: %w", l.Config.ID, l.Config.Backend, ctlapi.ErrUnsupported)
	}
	if size != 0 && size%int64(l.SCSI.BlockSize()) != 0 {
		return l.Size(), fmt.Errorf("LUN %d: size %d is not a multiple of the block size %d: %w",
			l.Config.ID, size, l.SCSI.BlockSize(), ctlapi.ErrInvalidArgument)
	}
	if _, err := r.Resize(size); err != nil {
		if errors.Is(err, backend.ErrWouldShrink) || errors.Is(err, backend.ErrInvalidSize) || errors.Is(err, backend.ErrReadOnly) {
			err = fmt.Errorf("%w: %w", err, ctlapi.ErrInvalidArgument)
		} else if errors.Is(err, backend.ErrNotSupported) {
			err = fmt.Errorf("%w: %w", err, ctlapi.ErrUnsupported)
		}
		return l.Size(), fmt.Errorf("LUN %d: %w", l.Config.ID, err)
	}
	if _, err := l.SCSI.Resize(); err != nil {
		return l.Size(), fmt.Errorf("LUN %d: %w: %w", l.Config.ID, err, ctlapi.ErrInvalidArgument)
	}
	return l.Size(), nil
}

// lunIdentity is the identity and ALUA part of LUN l's scsi configuration: the serial (l's,
// else DefaultSerial, else for rbd none: the image's DeviceID in hex), the NAA (l's naa, else
// derived: for rbd from the image's pool/namespace/image, so that every gateway of the cluster
// exporting it reports the same logical unit), and the target's ALUA groups with the LUN's
// own states.
func lunIdentity(t *config.Target, l *config.LUN) (scsi.LUNConfig, error) {
	var lc scsi.LUNConfig
	lc.Serial = l.Serial
	switch {
	case l.Backend == config.BackendRBD && l.RBD != nil:
		lc.DeviceID = RBDDeviceID(l.RBD)
	case lc.Serial == "":
		lc.Serial = DefaultSerial(t.PortID, l.ID)
	}
	if l.NAA != "" {
		naa, err := config.ParseNAA(l.NAA)
		if err != nil {
			return lc, fmt.Errorf("naa %w: %w", err, ctlapi.ErrInvalidArgument)
		}
		lc.NAA = naa
	}
	a, err := ALUAConfig(t, l)
	if err != nil {
		return lc, err
	}
	lc.ALUA = a
	return lc, nil
}

// RBDDeviceID is the stable identity of an RBD image: the first 16 bytes of SHA-256 over
// "srpd-rbd-v1", the pool, the namespace and the image name. It does not name the cluster:
// two clusters' images of the same spec exported to one initiator need a naa of their own.
func RBDDeviceID(r *config.RBD) [16]byte {
	h := sha256.New()
	for _, s := range []string{"srpd-rbd-v1", r.Pool, r.Namespace, r.Image} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	var id [16]byte
	copy(id[:], h.Sum(nil))
	return id
}

// ALUAConfig is the scsi ALUA configuration of LUN l of target t (nil when t has no alua):
// the target's group with its port (t.PortID, as the target package puts it in every
// nexus) and the peers' groups, in their configured states overridden by l.ALUAStates.
func ALUAConfig(t *config.Target, l *config.LUN) (*scsi.ALUAConfig, error) {
	a := t.ALUA
	if a == nil {
		return nil, nil
	}
	state := func(group int, s string) (scsi.ALUAState, error) {
		for _, o := range l.ALUAStates {
			if o.Group == group {
				s = o.State
			}
		}
		if s == "" {
			return scsi.ALUAActiveOptimized, nil
		}
		st, err := scsi.ParseALUAState(s)
		if err != nil {
			return 0, fmt.Errorf("alua: %w: %w", err, ctlapi.ErrInvalidArgument)
		}
		return st, nil
	}
	st, err := state(a.Group, a.State)
	if err != nil {
		return nil, err
	}
	c := &scsi.ALUAConfig{
		Groups: []scsi.PortGroup{{ID: uint16(a.Group), State: st, RelativePorts: []uint16{uint16(a.RelativePort)}}},
		Ports:  []scsi.TargetPort{{ID: t.PortID.SRP(), RelativeID: uint16(a.RelativePort)}},
	}
	for _, p := range a.Peers {
		st, err := state(p.Group, p.State)
		if err != nil {
			return nil, err
		}
		g := scsi.PortGroup{ID: uint16(p.Group), State: st}
		for _, r := range p.RelativePorts {
			g.RelativePorts = append(g.RelativePorts, uint16(r))
		}
		c.Groups = append(c.Groups, g)
	}
	return c, nil
}

// Close flushes and closes the logical unit and its backend.
func (l *LUN) Close() error { return l.SCSI.Close() }
