package transport

import (
	"context"
	"net/netip"
	"strings"
)

// Access are memory / QP access rights with the values of enum ib_access_flags.
type Access uint32

// Access flags (IB values).
const (
	AccessLocalWrite   Access = 1 << 0
	AccessRemoteWrite  Access = 1 << 1
	AccessRemoteRead   Access = 1 << 2
	AccessRemoteAtomic Access = 1 << 3

	// AccessRemote is every remote right.
	AccessRemote = AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
	accessAll    = AccessLocalWrite | AccessRemote
)

// Validate checks an MR access set as verbs does: known bits only, and remote write or remote
// atomic require local write.
func (a Access) Validate() error {
	if a&^accessAll != 0 {
		return ErrInvalidAccess
	}
	if a&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && a&AccessLocalWrite == 0 {
		return ErrInvalidAccess
	}
	return nil
}

func (a Access) String() string {
	var p []string
	if a&AccessLocalWrite != 0 {
		p = append(p, "LOCAL_WRITE")
	}
	if a&AccessRemoteWrite != 0 {
		p = append(p, "REMOTE_WRITE")
	}
	if a&AccessRemoteRead != 0 {
		p = append(p, "REMOTE_READ")
	}
	if a&AccessRemoteAtomic != 0 {
		p = append(p, "REMOTE_ATOMIC")
	}
	if len(p) == 0 {
		return "NONE"
	}
	return strings.Join(p, "|")
}

// DeviceAttr are device limits (the ibv_device_attr subset that matters here).
type DeviceAttr struct {
	PageSize        int    // size and alignment of Memory pages (4096)
	PageSizeCap     uint64 // bit n set ⇔ pages of 2^n bytes accepted by REG_MR
	MaxMRSize       uint64 // bytes one MR may cover
	MaxMRPages      int    // max page-list length of a fast-reg MR (max_fast_reg_page_list_len)
	MaxMR           int    // MRs per device
	MaxPD           int
	MaxQP           int
	MaxQPWR         int // max SQ / RQ depth
	MaxSGE          int // max SGEs per WR
	MaxInlineData   int // max inline bytes per WR
	MaxCQ           int
	MaxCQE          int // max CQ depth
	MaxQPRdAtom     int // max MaxRdAtomic (outstanding READs as requester)
	MaxQPInitRdAtom int // max MaxDestRdAtomic (outstanding READs as responder)
	MaxMsgSize      uint64
	MaxMTU          MTU    // largest path MTU
	ActiveMTU       MTU    // the port's active MTU
	AtomicCap       bool   // atomics supported (false for softroce)
	HostSGE         bool   // SGE.Host accepted in SEND and RDMA WRITE gather lists (softroce)
	VendorID        uint32 // 0 for softroce
}

// Device is an RDMA device with one port (ibv_context + ibv_port).
type Device interface {
	// Name is the device name (e.g. "softroce0").
	Name() string
	// Attr returns the device limits.
	Attr() DeviceAttr
	// GIDs lists the device's RoCEv2 GIDs (index = GID index).
	GIDs() []GID
	// Addrs lists the UDP endpoints the device receives on (port 4791 in production).
	Addrs() []netip.AddrPort
	// AllocMemory maps n bytes (rounded up to whole pages) of zeroed, page-aligned memory off the
	// Go heap and makes it device-visible. It is the only memory MRs and SGEs may refer to.
	AllocMemory(n int) (Memory, error)
	// AllocPD allocates a protection domain.
	AllocPD() (PD, error)
	// CreateCQ creates a completion queue with room for at least entries completions.
	CreateCQ(entries int) (CQ, error)
	// Close moves every QP to ERR, waits (bounded by ctx) for in-flight work to drain, stops the
	// device's goroutines and closes its link. Objects of a closed device return ErrClosed;
	// Memory stays mapped until freed (Free remains callable after Close).
	Close(ctx context.Context) error
}

// Queuer is implemented by a device with several queues, as a NIC has receive queues and
// completion vectors (softroce with more than one UDP socket): each queue is a Device of its
// own, with its own QPs, CQs, PDs and MRs, that shares the memory (AllocMemory) of the others;
// two queues process their QPs' packets in parallel. A ULP places each channel (its PD, CQs,
// QP and MRs) on one queue, round robin. Queues()[0] is the device itself.
type Queuer interface {
	Queues() []Device
}

// QueueFor returns the device of queue i (mod their number) of dev: dev itself when it has
// one queue.
func QueueFor(dev Device, i int) Device {
	if q, ok := dev.(Queuer); ok {
		if qs := q.Queues(); len(qs) > 0 {
			return qs[((i%len(qs))+len(qs))%len(qs)]
		}
	}
	return dev
}

// Memory is a device-visible buffer off the Go heap (ib_dma_map'd memory).
type Memory interface {
	// Bytes is the CPU view of the whole buffer. It is invalid after Free.
	Bytes() []byte
	// Addr is the device address of Bytes()[0]; Addr()+i addresses Bytes()[i].
	Addr() uint64
	// Len is the buffer size in bytes (a multiple of the page size).
	Len() int
	// Free unmaps the buffer. It fails with ErrBusy while a regular MR covers it or a VALID
	// fast-reg MR maps one of its pages.
	Free() error
}

// PD is a protection domain.
type PD interface {
	// RegMR registers length bytes of device memory starting at device address addr (a regular MR,
	// VALID at once, iova = addr, lkey = rkey).
	RegMR(addr, length uint64, access Access) (MR, error)
	// AllocFastRegMR allocates a fast-registration MR able to map maxPages pages (ib_alloc_mr
	// IB_MR_TYPE_MEM_REG). It starts FREE; REG_MR work requests register it, LOCAL_INV or a
	// remote SEND_WITH_INV invalidate it.
	AllocFastRegMR(maxPages int) (MR, error)
	// CreateQP creates a QP in RESET.
	CreateQP(attr QPInitAttr) (QP, error)
	// Close deallocates the PD; ErrBusy while MRs or QPs exist in it.
	Close() error
}

// MRState is the device's view of an MR.
type MRState uint8

// MR states (as rxe names them).
const (
	MRInvalid MRState = iota // deregistered
	MRFree                   // fast-reg MR not registered (allocated, or invalidated)
	MRValid                  // usable with its key in force
)

func (s MRState) String() string {
	switch s {
	case MRFree:
		return "FREE"
	case MRValid:
		return "VALID"
	}
	return "INVALID"
}

// MRInfo is a snapshot of the device's (the "hardware's") view of an MR: the key in force, the
// mapping and the rights a REG_MR installed. It changes only when work requests execute (or the
// peer invalidates), never when software picks a key for the next registration.
type MRInfo struct {
	State    MRState
	Key      uint32 // the key in force (lkey = rkey)
	IOVA     uint64
	Length   uint64
	Access   Access
	PageSize uint32
	NPages   int
	FastReg  bool
}

// MR is a memory region.
type MR interface {
	// Index is the MR's table index (key >> 8), never 0.
	Index() uint32
	// LKey and RKey are the keys at creation: for a regular MR the keys for its lifetime; for a
	// fast-reg MR the initial key (software chooses the next one for each REG_MR, changing only
	// the low byte).
	LKey() uint32
	RKey() uint32
	// FastReg reports whether this is a fast-registration MR.
	FastReg() bool
	// MaxPages is the page-list capacity of a fast-reg MR (0 for a regular MR).
	MaxPages() int
	// Query returns the device's current view (see MRInfo).
	Query() MRInfo
	// Close deregisters the MR; later accesses with its keys fail.
	Close() error
}

// CQ is a completion queue. Poll may be called from any goroutine; completions are returned in
// the order they were produced (per QP and queue: in WR order).
type CQ interface {
	// Poll copies up to len(wcs) completions into wcs and returns how many. It never blocks and
	// never allocates.
	Poll(wcs []WC) int
	// Notify returns a channel (capacity 1) that receives a token whenever completions are added.
	// A token may be stale; after receiving one, Poll until it returns 0 before waiting again.
	Notify() <-chan struct{}
	// Wait blocks until at least one completion is available, ctx is done (ctx.Err()), or the CQ
	// is closed (ErrClosed).
	Wait(ctx context.Context) error
	// Cap is the number of completions the CQ holds. If it overflows, the QPs that complete into
	// it go to ERR (CQ overrun is fatal, as in verbs).
	Cap() int
	// Close destroys the CQ; ErrBusy while QPs use it.
	Close() error
}

// CompletionHandler is implemented by CQs whose engine can run the consumer's code on the
// goroutine that produced the completions (run to completion), saving the wake-up of a
// consumer goroutine per completion batch: at low queue depth that handoff costs more than the
// work itself. It is optional; consumers fall back to Notify.
type CompletionHandler interface {
	// SetCompletionHandler installs fn (nil removes it). The engine calls fn, on one of its
	// own goroutines and never concurrently with itself for one CQ, when it has added
	// completions, instead of giving the Notify token; when fn returns false (it did not take
	// them: its consumer is busy or needs its own goroutine) the engine gives the token.
	// fn may Poll, post, modify QPs and take its own locks; it must not block on anything the
	// engine has to deliver (Wait, Notify, a CM event, a completion) nor close the device, and
	// should be short: the engine's receive path waits for it. Completions added in other
	// contexts may still give the Notify token instead.
	SetCompletionHandler(fn func() bool)
}

// Progresser is implemented by devices that can do on a consumer's goroutine work they would
// otherwise hand to a goroutine of their own (softroce: the packets a QP sends to another QP
// of the same device, an initiator and a target in one process). A consumer that posts from a
// goroutine holding nothing its completion handlers take may bracket the post with Hold and
// Progress: in between, the device defers such work; Progress does it, which runs completion
// handlers (CompletionHandler) on the caller's goroutine, possibly the handler that completes
// what the caller just posted. Every Hold must be followed by one Progress, soon: work other
// goroutines post meanwhile may wait for it. Pairs may overlap across goroutines.
type Progresser interface {
	Hold()
	Progress()
}

// PostBatcher is implemented by devices whose posts each reach the wire with work of their
// own (softroce: a system call, and a datagram the peer's kernel and receive loop handle, per
// post that finds the send path idle). A consumer about to post several times in a row (the
// commands of one batch of requests) may bracket the posts with BeginPosts and EndPosts: in
// between, the device may hold back what the posts transmit and send it together when the
// last open bracket ends (SENDs of one size to one peer: one UDP GSO datagram). Posts still
// succeed or fail at once, and completions are unchanged. Every BeginPosts must be followed by
// one EndPosts, soon: posts of other goroutines meanwhile may wait for it. Brackets may
// overlap across goroutines. Engines whose posts are a doorbell (hardware) need not
// implement it.
type PostBatcher interface {
	BeginPosts()
	EndPosts()
}

// QP is a reliable-connected queue pair.
type QP interface {
	// QPN is the local QP number (24 bits, ≥ 2).
	QPN() uint32
	// State is the current state (it changes asynchronously to ERR on fatal errors).
	State() QPState
	// Modify changes attributes and state, enforcing the legal transitions and required
	// attributes (ValidateModify); on error the QP is unchanged and the error is a *ModifyError.
	// Moving to ERR flushes outstanding WRs; moving to RESET discards them without completions.
	Modify(attr *QPAttr, mask QPAttrMask) error
	// Query returns the current attributes.
	Query() QPAttr
	// PostSend posts every WR of wrs, in order, or none (ErrSQFull, or a validation error, in a
	// *PostError). Allowed in RTS and SQD (SQD queues without starting) and ERR (the WRs complete
	// with WCWRFlushErr); ErrQPState otherwise.
	PostSend(wrs []SendWR) error
	// PostRecv posts every WR of wrs or none. Allowed from INIT on (ERR: flushed).
	PostRecv(wrs []RecvWR) error
	// SendQueueFree and RecvQueueFree are the slots free now (slots are freed when the WR's
	// completion is queued, or would have been for an unsignaled WR).
	SendQueueFree() int
	RecvQueueFree() int
	// Close destroys the QP; outstanding WRs are discarded without completions.
	Close() error
}
