// Package backend holds the storage behind a SCSI logical unit: a regular file, a block device or
// RAM. A Backend is a flat byte range; block size, LBAs and SCSI semantics live in package scsi.
//
// Constructors: NewRAM, OpenFile (FileOptions), OpenBlockDev (BlockDevOptions), and OpenRBD
// (RBDOptions: a Ceph RBD image through librbd, build tag rbd with cgo; ErrRBDUnavailable
// without). Their own errors (ErrBusy, ErrNotBlockDevice, ErrNotRegularFile, ErrWouldShrink,
// ErrInvalidSize, ErrSymlink) are in errors.go. Linux only (pread/pwrite, fallocate, block
// device ioctls).
package backend

import (
	"errors"
	"io"
)

// Errors a Backend returns. Callers test them with errors.Is; implementations wrap them with
// context (fmt.Errorf("...: %w", ErrX)).
var (
	// ErrReadOnly: a write, discard or zeroing on a backend opened read-only.
	ErrReadOnly = errors.New("backend: read-only")
	// ErrOutOfRange: an access that does not lie entirely inside [0, Size()).
	ErrOutOfRange = errors.New("backend: access out of range")
	// ErrNotSupported: the backend cannot do this operation (e.g. discard on a device without it).
	ErrNotSupported = errors.New("backend: operation not supported")
	// ErrClosed: the backend was closed.
	ErrClosed = errors.New("backend: closed")
	// ErrFenced: another exporter of the same storage took it over (it broke this one's
	// exclusive lock and had the cluster blocklist it): the call was refused or failed and
	// nothing of it landed after the takeover. See Fenceable.
	ErrFenced = errors.New("backend: fenced by another exporter")
)

// Fenceable is a backend that several exporters (gateways) of one storage object share under
// an exclusive lock (RBD with a managed lock): the one that takes the lock over fences the
// others, whose calls then fail with ErrFenced. A fenced backend must not simply reconnect and
// go on, because a command an initiator gave up on before the takeover could then land after
// it; so it stays fenced until its user knows that no command admitted before the fence is
// left, and says so with Resume. The SCSI layer does that from its task set: each command
// notes FenceEpoch when it is admitted, and once every command admitted under an older epoch
// has left, it calls Resume.
type Fenceable interface {
	// FenceEpoch counts the fences the backend has learnt of. It grows when a call finds that
	// the backend was fenced.
	FenceEpoch() uint64
	// Resume tells the backend that nothing admitted before fence epoch epoch is left: it may
	// reconnect (in the background; calls meanwhile wait for it, bounded) and take the lock
	// again on the next call that needs it. It does not block, and a stale epoch is ignored.
	Resume(epoch uint64)
}

// Info describes what a backend is and can do. It does not change after open.
type Info struct {
	Kind     string // "file", "blockdev", "ram", "rbd"
	Path     string // file or device path; pool[/namespace]/image for rbd; empty for ram
	ReadOnly bool
	// CanDiscard: Discard deallocates (punch hole, BLKDISCARD, dropping RAM pages).
	CanDiscard bool
	// DiscardZeroes: after Discard the range reads back as zeroes (SBC LBPRZ).
	DiscardZeroes bool
	// Rotational is reported in VPD page 0xB1 (medium rotation rate); false = non-rotating.
	Rotational bool
	// PhysicalBlockSize is the backend's natural block size in bytes (0 = unknown), reported
	// in READ CAPACITY(16) as the physical block exponent when larger than the logical block.
	PhysicalBlockSize int
}

// Backend is the storage of one LUN. Implementations are safe for concurrent use: the LUN issues
// ReadAt/WriteAt from many goroutines at once, and must never allocate per call on the read and
// write paths.
//
// Every call checks, in this order: closed (ErrClosed), read-only for the mutating calls
// (ErrReadOnly), range (ErrOutOfRange). An empty access anywhere in [0, Size()] succeeds and does
// nothing. Any other error is the OS failing the I/O (EIO, ENOSPC on a full filesystem under a
// sparse file, a short transfer...): the errno stays reachable with errors.Is, and the SCSI layer
// reports it as a MEDIUM ERROR.
type Backend interface {
	// ReadAt and WriteAt follow io.ReaderAt/io.WriterAt; an access that does not fit entirely in
	// [0, Size()) fails with ErrOutOfRange and transfers nothing.
	io.ReaderAt
	io.WriterAt
	// Size is the capacity in bytes.
	Size() int64
	// Flush makes every completed write durable (fdatasync for files and devices; a no-op for RAM).
	Flush() error
	// Discard deallocates [off, off+n); afterwards the range reads as zeroes when
	// Info().DiscardZeroes. ErrNotSupported when !Info().CanDiscard.
	Discard(off, n int64) error
	// WriteZeroes makes [off, off+n) read as zeroes, deallocating where that is cheaper
	// (FALLOC_FL_ZERO_RANGE, BLKZEROOUT, dropping RAM pages) and writing zeroes otherwise.
	WriteZeroes(off, n int64) error
	Info() Info
	// Close releases the backend; later calls fail with ErrClosed.
	Close() error
}

// Nonblocking is implemented by a backend whose operations never wait for anything (no I/O, no
// lock held across I/O: only memory to copy), such as RAM. A target may then execute the LUN's
// commands inline on a transport goroutine instead of handing them to a worker; a backend that
// claims this and then blocks holds up every channel of the device.
//
// Go promotes the method through embedding: a type that embeds a Nonblocking backend and adds
// anything that may wait must declare Nonblocking() false itself.
type Nonblocking interface{ Nonblocking() bool }

// Viewer is implemented by backends whose content lies in process memory (RAM): a READ's data
// can then be sent as it lies (a transport that takes process memory as a source,
// transport.SGE.Host) instead of being copied out first.
type Viewer interface {
	// ViewAt fills views, up to its capacity, with slices of the backend's memory holding the
	// n bytes at off, in order, and returns how many. A range never written may be a slice of
	// zeroes shared between calls. ok false: nothing is lent for this range (it would take more
	// than cap(views) pieces, or the backend has no memory of its own): the caller uses ReadAt.
	// Errors are ReadAt's (closed, out of range).
	//
	// The views are read-only: nobody may write into them. They stay valid for as long as they
	// are referenced (memory is never reused for another range), and their bytes follow later
	// writes and discards of the range: a READ that sends them before it reports its end
	// returns the medium's content from a moment between its start and its end, or a mix where
	// a WRITE overlapped it, which SAM allows (see scsi's Atomicity note).
	ViewAt(views [][]byte, off int64, n int) (k int, ok bool, err error)
}

// As with Nonblocking, Go promotes ViewAt through embedding: a type that embeds a RAM backend
// and changes how it reads (a wrapper that times, gates or fails reads) must declare ViewAt
// itself, or READs offered views bypass its ReadAt.
