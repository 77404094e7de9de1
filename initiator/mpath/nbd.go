package mpath

import (
	"context"
	"errors"

	"github.com/srpd/srpd/initiator"
	"github.com/srpd/srpd/initiator/nbd"
)

// NBDDevice adapts d to the NBD server's Device interface with the error mapping of
// initiator.NBDDevice (ErrNoPath, like a session gone for good, is ESHUTDOWN).
func NBDDevice(d *Device) nbd.Device { return nbdDevice{d} }

type nbdDevice struct{ d *Device }

var (
	_ nbd.Device        = nbdDevice{}
	_ nbd.AsyncDevice   = nbdDevice{}
	_ nbd.BlockStatuser = nbdDevice{}
)

func mapErr(err error, write bool) error {
	if err == nil {
		return nil
	}
	if errno := initiator.NBDErrno(err, write); errno != nbd.EIO || !isNoPath(err) {
		return nbd.DeviceError(errno, err)
	}
	return nbd.DeviceError(nbd.ESHUTDOWN, err)
}

func isNoPath(err error) bool { return errors.Is(err, ErrNoPath) }

func (n nbdDevice) ReadAt(ctx context.Context, p []byte, off int64) error {
	return mapErr(n.d.ReadAt(ctx, p, off), false)
}
func (n nbdDevice) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	return mapErr(n.d.WriteAt(ctx, p, off, fua), true)
}
func (n nbdDevice) ReadAtAsync(ctx context.Context, p []byte, off int64, done func(error)) {
	n.d.ReadAtAsync(ctx, p, off, done)
}
func (n nbdDevice) WriteAtAsync(ctx context.Context, p []byte, off int64, fua bool, done func(error)) {
	n.d.WriteAtAsync(ctx, p, off, fua, done)
}
func (n nbdDevice) AsyncError(err error, write bool) error { return mapErr(err, write) }
func (n nbdDevice) Flush(ctx context.Context) error        { return mapErr(n.d.Flush(ctx), false) }
func (n nbdDevice) Discard(ctx context.Context, off, l int64) error {
	return mapErr(n.d.Discard(ctx, off, l), true)
}
func (n nbdDevice) WriteZeroes(ctx context.Context, off, l int64, noUnmap bool) error {
	return mapErr(n.d.WriteZeroes(ctx, off, l, noUnmap), true)
}

// BlockStatus answers NBD_CMD_BLOCK_STATUS from GET LBA STATUS through the active path.
func (n nbdDevice) BlockStatus(ctx context.Context, off, length int64) ([]nbd.Extent, error) {
	runs, err := n.d.Provisioning(ctx, off, length)
	if err != nil {
		return nil, mapErr(err, false)
	}
	exts := make([]nbd.Extent, len(runs))
	for i, r := range runs {
		exts[i] = nbd.Extent{Length: r.Len, Hole: r.Deallocated && !r.Anchored, Zero: r.Zero}
	}
	return exts, nil
}

func (n nbdDevice) Size() int64      { return n.d.Size() }
func (n nbdDevice) BlockSize() int   { return n.d.BlockSize() }
func (n nbdDevice) ReadOnly() bool   { return n.d.ReadOnly() }
func (n nbdDevice) CanDiscard() bool { return n.d.CanDiscard() }
