package stack

import (
	"fmt"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/scsi/backend"
)

// LUN is an open logical unit: its backend and the SCSI logical unit over it.
type LUN struct {
	Config config.LUN
	SCSI   *scsi.LUN
	// Capacity is the backend's size in bytes.
	Capacity int64
}

// LUNOptions are what opening a LUN takes beyond its configuration.
type LUNOptions struct {
	// Admit, for a file or blockdev LUN, vets the file that was opened before it is resized
	// or used (backend.FileOptions.Admit); nil admits any.
	Admit func(backend.Identity) error
	// Wrap, if set, wraps the backend the logical unit uses (the daemon times the I/O).
	Wrap func(backend.Backend) backend.Backend
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
		be  backend.Backend
		err error
	)
	switch l.Backend {
	case config.BackendRAM:
		be, err = backend.NewRAM(int64(l.Size), l.ReadOnly)
	case config.BackendFile:
		be, err = backend.OpenFile(l.Path, backend.FileOptions{ReadOnly: l.ReadOnly, Create: l.Create,
			Size: int64(l.Size), Direct: l.Direct, NoSymlinks: !l.FollowSymlinks, Admit: o.Admit})
	case config.BackendBlockDev:
		be, err = backend.OpenBlockDev(l.Path, backend.BlockDevOptions{ReadOnly: l.ReadOnly, Direct: l.Direct,
			NoSymlinks: !l.FollowSymlinks, Admit: o.Admit})
	case config.BackendRBD:
		be, err = openRBD(l)
	default:
		err = fmt.Errorf("unknown backend %q: %w", l.Backend, ctlapi.ErrInvalidArgument)
	}
	if err != nil {
		return nil, fmt.Errorf("target %s: LUN %d: %w", t.Name, l.ID, err)
	}
	serial := l.Serial
	if serial == "" {
		serial = DefaultSerial(t.PortID, l.ID)
	}
	capacity := be.Size()
	if o.Wrap != nil {
		be = o.Wrap(be)
	}
	lun, err := scsi.NewLUN(scsi.LUNConfig{BlockSize: l.BlockSize, ReadOnly: l.ReadOnly, Serial: serial}, be)
	if err != nil {
		_ = be.Close()
		return nil, fmt.Errorf("target %s: LUN %d: %w", t.Name, l.ID, err)
	}
	return &LUN{Config: l, SCSI: lun, Capacity: capacity}, nil
}

// Close flushes and closes the logical unit and its backend.
func (l *LUN) Close() error { return l.SCSI.Close() }
