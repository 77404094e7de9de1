// Package initiator is the SRP initiator: sessions with a target port over one or more RDMA
// channels, request tables and credits, memory registration through the MR pool, error handling
// and reconnection, SCSI discovery, and a block API per logical unit that the NBD server exports.
// It turns block requests into SCSI commands and SCSI commands into SRP information units over
// the transport API; it is modelled on Linux ib_srp and scsi_transport_srp, and avoids their
// known pain points (see the srp-protocol reference, §4, §6 and §8).
//
// # Sessions and channels
//
// Dial logs in Config.ChCount channels to one target port: channel 0 with MULTI-CHANNEL ACTION
// SINGLE, the others with MULTI (a reconnecting channel uses SINGLE only when no other channel of
// the session is up, so that it never terminates a healthy sibling). The SRP_LOGIN_REQ travels
// in the connection request built by a Dialer: CMDialer over a transport.ConnManager (softroce's
// RDMA CM, carried by the IB CM on QP1, or librdmacm on the verbs engine) in the 56-byte RDMA CM
// form, or a Dialer of one's own in the 64-byte form as well (the tests' connects QPs out of
// band). Logins negotiate down instead of failing: a target that finds the IU length too large
// (0x00010002) is asked again with smaller ones (immediate-data and descriptor capacity follow),
// one that refuses indirect descriptors (0x00010004) with direct ones only; a MAX IT IU LEN below
// the request is respected. Every other SRP_LOGIN_REJ is returned as a *LoginRejectError; a
// channel k > 0 that the target refuses for lack of multichannel support is given up, the
// session goes on with the others.
//
// Each channel is one RC QP with one completion queue; a request table of Config.QueueDepth
// slots, each with a preallocated IU buffer, a registered-on-demand data buffer
// (Config.MaxIOSize), MR handles and a completion channel; an MR pool (frpool) bound to the QP;
// and a goroutine that owns the CQ and reconnects the channel. Tags are the channel index, slot
// index and a per-slot generation (a late answer to an aborted command is recognised as stale).
//
// The CQ's completions go through an internal/cqpoll Poller (completion.go). The channel
// goroutine polls while it is busy; while it waits, the engine's goroutine that has just added
// completions (softroce's receive loop, the verbs poller: transport.CompletionHandler) handles
// them in its place, so an answer reaches its caller without first waking the channel
// goroutine. On a device that can do its own deliveries on a caller's goroutine (softroce with
// the target in the same process: transport.Progresser), a command's post is bracketed with
// the Poller's Hold and Progress, so that the command, the target's answer and its completion
// are all processed on the posting goroutine. Either way one goroutine at a time handles
// completions, in CQ order; anything unusual (a failed completion, an error, a target logout)
// is left to the channel goroutine.
//
// Credits: the LOGIN_RSP's REQUEST LIMIT DELTA and every SRP_RSP's delta; a command needs more
// than one credit (the last is reserved for task management), so submitters wait rather than
// exceed the target's limit. The count stays within [0, queue depth + 1] (a slot each and the
// reserved one): what a target grants beyond that is never usable, and keeping less than it
// grants never exceeds its limit. SRP_CRED_REQ and SRP_AER_REQ add their deltas and are answered with
// SRP_CRED_RSP / SRP_AER_RSP without using a credit. SRP_T_LOGOUT takes the channel down
// gracefully: no new commands, those in flight get Config.TeardownTimeout to be answered, then
// it disconnects (and reconnects after reconnect_delay). When every command of a channel is
// over and its credits are still short (a target that returns the credits of aborted commands
// only with later responses), the reserved credit buys a task management function whose
// response brings them back, instead of the channel starving.
//
// # Data path
//
// A READ or WRITE is split into commands no larger than the channel's capacity (MaxIOSize, the
// negotiated descriptor count times the bytes one MR maps) and the LUN's MAXIMUM TRANSFER LENGTH,
// up to eight in flight per call. Writes of at most the negotiated immediate-data size travel in
// the SRP_CMD itself (SRP-2, offset 68). Other data is copied to (writes) or from (reads) the
// slot's data buffer, which the MR pool registers: one MR gives a direct descriptor, several an
// indirect descriptor whose whole table is in the IU (ib_srpt cannot fetch external tables). The
// REG_MRs and the SEND that names their keys go out in one all-or-nothing post. A command the
// target answered completes at once: whichever goroutine handles the response's completion (see
// Sessions and channels) signals the waiting caller, or finishes an asynchronous command in the
// same batch, and the caller copies the data-in (which RC ordering placed in
// the slot's buffer before the response) while the registrations are invalidated. The slot and
// its buffer are reused only once every registration is dead — invalidated remotely
// (SEND_WITH_INV) or by a LOCAL_INV whose completion the pool confirmed — so the target can
// never reach a buffer that has been given back or serves another command; a command ended
// without an answer (abort, reset, channel failure) completes only then. In steady state
// nothing on this path allocates.
//
// A caller can save that copy: memory from Session.AllocBuffer (a Buffer, device memory) given
// to ReadAtAsync or WriteAtAsync is registered itself when the slice starts on a page boundary
// and one command carries it (Stats.Direct counts such commands). As that buffer goes back to
// the caller at done, such a command completes only once its registrations are dead (the
// completion handler polls again for the LOCAL_INVs it has just posted, so this usually costs
// no wake-up). NBDAllocator gives an NBD server's large request buffers this way.
//
// # Errors
//
// A status other than GOOD is retried where SCSI says so (UNIT ATTENTION, BUSY, TASK SET FULL,
// becoming ready, ABORTED COMMAND, TASK ABORTED) and otherwise returned as a *SCSIError carrying
// the status and the decoded sense; errors.Is tells a medium error from a reservation conflict
// from write protection (see the Err* categories). NBDDevice adapts a LUN for the NBD server and
// maps these errors to NBD errno values.
//
// A command that outlives Config.CommandTimeout (or its caller's context) is aborted: ABORT
// TASK, then LOGICAL UNIT RESET (which ends the LUN's other unanswered commands too, on every
// channel), then a reset of the channel; the caller returns only once the command is over and
// its buffers are released. After CommandTimeout alone the command is re-issued (as the SCSI
// midlayer does after error handling); after the context's end, an error matching ErrTimeout
// and the context's error is returned.
//
// A QP error, a CM disconnect or a target logout takes the channel down: the QP is moved to ERR
// and drained (bounded), the MR pool settles every registration from the device's view, and the
// commands without an answer are re-issued on another channel (up to Config.MaxRetries times).
// The channel reconnects on its own after reconnect_delay, then with jittered exponential
// back-off (up to MaxReconnectDelay), so channels and initiators do not reconnect in lockstep.
// While no channel is up, I/O is held; fast_io_fail_tmo after the last channel went down it
// fails with ErrFastFail, and dev_loss_tmo after it the session is torn down (ErrSessionLost). The timers default to and are
// validated like scsi_transport_srp's (10 s, 15 s, 600 s).
//
// # Logging
//
// The session logs its events (logins, negotiation, channel failures, reconnects, aborts and
// resets, target requests) to Config.Logger with the session name and port identifiers as
// fields; errors returned to callers are not logged.
package initiator
