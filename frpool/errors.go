package frpool

import "errors"

// Sentinel errors; test with errors.Is. Errors that carry a completion status wrap one of these
// in a *WCError.
var (
	// ErrClosed: the pool has been closed.
	ErrClosed = errors.New("frpool: pool closed")
	// ErrExhausted: Get gave up waiting for a free MR (it also wraps the context's error).
	ErrExhausted = errors.New("frpool: no free MR")
	// ErrQPError: the QP went to the error state (or a registration's state became unknown).
	// Posting fails with it until Recover; every outstanding registration is handed back to its
	// owner with an error wrapping it.
	ErrQPError = errors.New("frpool: QP in error")
	// ErrSQFull: the pool's send-queue accounting has fewer free slots than the chain needs;
	// nothing was posted and the pool state is unchanged.
	ErrSQFull = errors.New("frpool: send queue full")
	// ErrState: the registration or RW context is not in a state that allows the operation (e.g.
	// Invalidate of a registration that was never posted, a handle used after release).
	ErrState = errors.New("frpool: wrong state for this operation")
	// ErrMapping: the buffer cannot be mapped by one MR (empty, too many pages, or a gap: every
	// segment but the first must start on a page boundary and every segment but the last must end
	// on one, as ib_map_mr_sg requires for IB_MR_TYPE_MEM_REG).
	ErrMapping = errors.New("frpool: buffer cannot be mapped by one MR")
	// ErrRKeyMismatch: a remote invalidation named a key of one of the pool's MRs that is not the
	// key of any live registration. The MR is quarantined.
	ErrRKeyMismatch = errors.New("frpool: remote invalidation of an rkey that is not live")
	// ErrQuarantined: the handle's MR is quarantined (after a key mismatch) until the send queue
	// has drained past it; an unposted handle can be posted after that, or cancelled.
	ErrQuarantined = errors.New("frpool: MR quarantined")
	// ErrUnknownRKey: a remote invalidation named an MR index that is not the pool's.
	ErrUnknownRKey = errors.New("frpool: remote invalidation of an rkey not owned by the pool")
	// ErrForeignWR: a send completion whose WR ID lacks WRIDTag: something other than the pool
	// posted on the pool's send queue, which breaks the pool's ordering bookkeeping.
	ErrForeignWR = errors.New("frpool: completion for a work request the pool did not post")
	// ErrStaleCompletion: a completion for a WR posted before the last Recover (harmless).
	ErrStaleCompletion = errors.New("frpool: completion from before recovery")
	// ErrBadCompletion: a completion that contradicts the send-queue contract (out of order, or
	// a successful completion for an unsignaled WR).
	ErrBadCompletion = errors.New("frpool: completion out of send-queue order")
	// ErrKeySpace: every one of the 256 key bytes of an MR belongs to a registration that may still
	// be live; the MR cannot be registered again until invalidations are confirmed.
	ErrKeySpace = errors.New("frpool: no reusable key byte for this MR")
	// ErrRWLength: local and remote lengths of an RW context differ, or exceed its capacity.
	ErrRWLength = errors.New("frpool: RW context length mismatch or too large")
	// ErrNotRegistered: a local segment lies in no memory registered with AddLocalMemory.
	ErrNotRegistered = errors.New("frpool: local buffer not in registered memory")
	// ErrBusy: Close with registrations or work requests still outstanding.
	ErrBusy = errors.New("frpool: registrations or work requests outstanding")
)
