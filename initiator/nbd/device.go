package nbd

import "context"

// Device is the block device behind one export: the initiator's per-LUN block API implements
// it. The server calls it from many goroutines at once (one per request in flight, across every
// connection to the export) and checks every request before calling it, so a Device only sees:
//
//   - off and len(p) (or n) that are multiples of BlockSize(), with the range inside
//     [0, Size()) as Size() was when the client connected; n > 0 and len(p) > 0;
//   - len(p) ≤ Config.MaxRequestSize for ReadAt and WriteAt (Discard and WriteZeroes ranges
//     carry no payload and may be as large as the export);
//   - no WriteAt, Discard or WriteZeroes when ReadOnly(), and no Discard unless CanDiscard().
//
// p belongs to the server and must not be retained after the call returns.
//
// Durability (what makes NBD_FLAG_CAN_MULTI_CONN valid, and the server always advertises it):
//
//   - Flush makes durable every write (WriteAt, Discard, WriteZeroes) that completed — returned
//     — before Flush was called, whichever connection, goroutine or caller issued it. A Device
//     with per-connection or per-goroutine caches must not implement Flush per cache.
//   - WriteAt with fua=true returns only once that write is durable. The server turns FUA on
//     TRIM and WRITE_ZEROES into the call followed by Flush.
//   - A completed write is visible to every later ReadAt, from any connection.
//
// Errors: return nil, or an error that ErrnoOf maps to the NBD error the client should see:
// an Errno (nbd.EIO, nbd.ENOSPC, nbd.EPERM, nbd.EINVAL, nbd.ESHUTDOWN when the session to the
// target is gone for good), an *Error from DeviceError, a syscall.Errno, or any other error
// (sent as EIO). The server only sends the values proto.md allows for the request: ENOTSUP
// and EOVERFLOW from a Device go out as EINVAL.
//
// Cancellation: ctx is cancelled when the server gives up on the connection (the shutdown or
// RemoveExport bound expired, or the client vanished); the call should then return promptly,
// because RemoveExport and Serve wait for every call into the Device to return.
type Device interface {
	// ReadAt fills p with the bytes at off.
	ReadAt(ctx context.Context, p []byte, off int64) error
	// WriteAt writes p at off; with fua the data is durable when it returns.
	WriteAt(ctx context.Context, p []byte, off int64, fua bool) error
	// Flush makes every completed write durable (see above).
	Flush(ctx context.Context) error
	// Discard deallocates [off, off+n) (NBD_CMD_TRIM, a hint: the contents become unspecified).
	Discard(ctx context.Context, off, n int64) error
	// WriteZeroes makes [off, off+n) read as zeroes; with noUnmap (NBD_CMD_FLAG_NO_HOLE) the
	// range stays allocated (SCSI WRITE SAME without UNMAP), otherwise it may be deallocated.
	// It must be supported on every writable Device (falling back to writing zeroes).
	WriteZeroes(ctx context.Context, off, n int64, noUnmap bool) error
	// Size is the capacity in bytes, a multiple of BlockSize(). Read at each handshake.
	Size() int64
	// BlockSize is the logical block size: 512 or 4096 (any power of two from 512 to 65536 is
	// accepted). It is the minimum and preferred block size of NBD_INFO_BLOCK_SIZE, and the
	// alignment the server enforces on offsets and lengths.
	BlockSize() int
	// ReadOnly exports the device read-only (NBD_FLAG_READ_ONLY; writes get EPERM).
	ReadOnly() bool
	// CanDiscard advertises NBD_FLAG_SEND_TRIM.
	CanDiscard() bool
}

// AsyncDevice may be implemented by a Device that can start reads and writes without blocking.
// The connection's reader then posts READ and WRITE requests itself and keeps reading, and the
// reply is sent from done: no goroutine handoff per request. done is called exactly once, maybe
// before the method returns, maybe on a goroutine that must not be held up (a transport's
// receive goroutine): the connection never blocks in it (a reply that does not fit the socket
// is finished by a goroutine of its own).
type AsyncDevice interface {
	ReadAtAsync(ctx context.Context, p []byte, off int64, done func(error))
	WriteAtAsync(ctx context.Context, p []byte, off int64, fua bool, done func(error))
	// AsyncError maps an error given to done to what ReadAt or WriteAt would have returned.
	AsyncError(err error, write bool) error
}

// PostBatcher may be implemented by an AsyncDevice whose posts can be sent together (an
// initiator LUN over softroce: transport.PostBatcher). While the next request is already in
// its read buffer, the connection's reader brackets the posts with BeginPosts and EndPosts, and
// it ends the bracket after the last buffered request and before it waits for anything (a
// read, a buffer, a request slot), so nothing it posted waits for the client.
type PostBatcher interface {
	BeginPosts()
	EndPosts()
}

// Extent is a run of bytes with one allocation status, as NBD_CMD_BLOCK_STATUS reports it in
// the base:allocation metadata context (proto.md "Metadata contexts").
type Extent struct {
	Length int64 // bytes, > 0 (a multiple of BlockSize() except where it ends the request)
	Hole   bool  // not allocated (NBD_STATE_HOLE): a write there may fail with ENOSPC
	Zero   bool  // reads as zeroes (NBD_STATE_ZERO)
}

// BlockStatuser may be implemented by a Device that knows which of its blocks are allocated
// (for the initiator: SCSI GET LBA STATUS). Without it every export reports one extent,
// allocated data, over whatever range is asked for.
//
// BlockStatus describes the consecutive extents from off on; off and length are multiples of
// BlockSize() and inside the export. It may describe less than length (at least one extent);
// what lies beyond off+length is cut off, and the server sends at most maxExtents (32)
// descriptors, one with NBD_CMD_FLAG_REQ_ONE. The returned slice is not retained.
type BlockStatuser interface {
	BlockStatus(ctx context.Context, off, length int64) ([]Extent, error)
}
