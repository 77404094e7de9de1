package initiator

import (
	"context"
	"errors"

	"go.uber.org/zap"

	"github.com/srpd/srpd/initiator/nbd"
)

// NBDDevice adapts a LUN to the NBD server's Device interface, mapping the initiator's errors to
// the NBD error values the client sees:
//
//   - ErrReadOnly (write protection, DATA PROTECT) → EPERM
//   - ErrRange, ILLEGAL REQUEST → EINVAL; LBA OUT OF RANGE on a write → ENOSPC
//   - ErrNoSpace (thin provisioning out of space) → ENOSPC
//   - ErrNotSupported (INVALID COMMAND OPERATION CODE, no discard) → EINVAL (NBD reserves
//     ENOTSUP for NBD_CMD_FLAG_FAST_ZERO)
//   - ErrSessionLost, ErrClosed → ESHUTDOWN (the export's session is gone for good)
//   - medium, hardware, reservation conflict, timeouts, ErrFastFail, ErrTransport and anything
//     else → EIO
//
// It takes any BlockDevice: a LUN, or a multipath device over several (initiator/mpath).
func NBDDevice(l BlockDevice) nbd.Device { return nbdDevice{l} }

// BlockDevice is the block API of a LUN, which an NBD export serves.
type BlockDevice interface {
	ReadAt(ctx context.Context, p []byte, off int64) error
	WriteAt(ctx context.Context, p []byte, off int64, fua bool) error
	ReadAtAsync(ctx context.Context, p []byte, off int64, done func(error))
	WriteAtAsync(ctx context.Context, p []byte, off int64, fua bool, done func(error))
	Flush(ctx context.Context) error
	Discard(ctx context.Context, off, n int64) error
	WriteZeroes(ctx context.Context, off, n int64, noUnmap bool) error
	Provisioning(ctx context.Context, off, n int64) ([]Run, error)
	Size() int64
	BlockSize() int
	ReadOnly() bool
	CanDiscard() bool
}

var _ BlockDevice = (*LUN)(nil)

type nbdDevice struct{ l BlockDevice }

var (
	_ nbd.Device        = nbdDevice{}
	_ nbd.AsyncDevice   = nbdDevice{}
	_ nbd.PostBatcher   = nbdDevice{}
	_ nbd.BlockStatuser = nbdDevice{}
)

// NBDErrno returns the NBD error value for an error of the block API (0 for nil).
func NBDErrno(err error, write bool) nbd.Errno {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrSessionLost), errors.Is(err, ErrClosed):
		return nbd.ESHUTDOWN
	case errors.Is(err, ErrReadOnly):
		return nbd.EPERM
	case errors.Is(err, ErrNoSpace):
		return nbd.ENOSPC
	case errors.Is(err, ErrNotSupported):
		return nbd.EINVAL
	case errors.Is(err, ErrRange):
		if write {
			return nbd.ENOSPC
		}
		return nbd.EINVAL
	case errors.Is(err, ErrIllegalRequest):
		return nbd.EINVAL
	case errors.Is(err, context.Canceled):
		return nbd.ESHUTDOWN
	}
	return nbd.EIO
}

func mapErr(err error, write bool) error {
	if err == nil {
		return nil
	}
	return nbd.DeviceError(NBDErrno(err, write), err)
}

func (d nbdDevice) ReadAt(ctx context.Context, p []byte, off int64) error {
	return mapErr(d.l.ReadAt(ctx, p, off), false)
}

func (d nbdDevice) WriteAt(ctx context.Context, p []byte, off int64, fua bool) error {
	return mapErr(d.l.WriteAt(ctx, p, off, fua), true)
}

// ReadAtAsync and WriteAtAsync make the export an nbd.AsyncDevice: a request is posted by the
// connection's reader and answered from the command's completion, without a goroutine per
// request in between.
func (d nbdDevice) ReadAtAsync(ctx context.Context, p []byte, off int64, done func(error)) {
	d.l.ReadAtAsync(ctx, p, off, done)
}

func (d nbdDevice) WriteAtAsync(ctx context.Context, p []byte, off int64, fua bool, done func(error)) {
	d.l.WriteAtAsync(ctx, p, off, fua, done)
}

func (d nbdDevice) AsyncError(err error, write bool) error { return mapErr(err, write) }

// BeginPosts and EndPosts make the export an nbd.PostBatcher when the block device batches
// posts (a LUN whose transport device is a transport.PostBatcher): the requests of one read of
// the connection reach the target together.
func (d nbdDevice) BeginPosts() {
	if b, ok := d.l.(nbd.PostBatcher); ok {
		b.BeginPosts()
	}
}

// EndPosts: see BeginPosts.
func (d nbdDevice) EndPosts() {
	if b, ok := d.l.(nbd.PostBatcher); ok {
		b.EndPosts()
	}
}

func (d nbdDevice) Flush(ctx context.Context) error { return mapErr(d.l.Flush(ctx), false) }

func (d nbdDevice) Discard(ctx context.Context, off, n int64) error {
	return mapErr(d.l.Discard(ctx, off, n), true)
}

func (d nbdDevice) WriteZeroes(ctx context.Context, off, n int64, noUnmap bool) error {
	return mapErr(d.l.WriteZeroes(ctx, off, n, noUnmap), true)
}

// BlockStatus makes the export an nbd.BlockStatuser from GET LBA STATUS (LUN.Provisioning):
// deallocated runs are holes (zero where the LUN reads unmapped blocks as zeroes), anchored
// ones only zero.
func (d nbdDevice) BlockStatus(ctx context.Context, off, length int64) ([]nbd.Extent, error) {
	runs, err := d.l.Provisioning(ctx, off, length)
	if err != nil {
		return nil, mapErr(err, false)
	}
	exts := make([]nbd.Extent, len(runs))
	for i, r := range runs {
		exts[i] = nbd.Extent{Length: r.Len, Hole: r.Deallocated && !r.Anchored, Zero: r.Zero}
	}
	return exts, nil
}

func (d nbdDevice) Size() int64      { return d.l.Size() }
func (d nbdDevice) BlockSize() int   { return d.l.BlockSize() }
func (d nbdDevice) ReadOnly() bool   { return d.l.ReadOnly() }
func (d nbdDevice) CanDiscard() bool { return d.l.CanDiscard() }

// NBDAllocator returns an nbd.Allocator of the session's Buffers, for nbd.Config.Allocator:
// the NBD server's large request buffers are then memory the session's commands map directly
// (see Buffer), which saves a copy of every READ's and WRITE's data.
func NBDAllocator(s *Session) nbd.Allocator { return nbdAllocator{s} }

type nbdAllocator struct{ s *Session }

func (a nbdAllocator) Alloc(n int) ([]byte, func(), error) {
	b, err := a.s.AllocBuffer(n)
	if err != nil {
		return nil, nil, err
	}
	return b.Bytes(), func() {
		if err := b.Free(); err != nil {
			a.s.log.Warn("freeing an NBD buffer", zap.Error(err))
		}
	}, nil
}
