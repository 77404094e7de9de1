// Package target is the SRP target: login and ACLs, channels, credits, command dispatch to scsi
// LUNs and task management. It is the only place where SRP meets SCSI.
//
// # Shape
//
// A Target is one SRP target port (Config.PortID = id_ext + ioc_guid). Each initiator port
// that logs in gets an I_T nexus (a session) with one or more channels; each channel is one RC
// QP. ACLs map initiator port identifiers to views: a scsi.LUNSet with the LUNs that initiator
// may see (masking: REPORT LUNS lists only those, other LUN numbers answer 25/00) and, per LUN,
// whether it is read-only for that initiator.
//
// Logins come from Serve (a transport.Listener: CM REQ private data → decision → REP with
// SRP_LOGIN_RSP, or REJ "consumer defined" with SRP_LOGIN_REJ), or from Login for a QP the
// caller connects itself (tests, or a CM the caller drives): Login decides, creates the
// channel's resources and returns a PendingChannel whose QP is in INIT with its receive ring
// posted; once the QP is in RTS, Establish starts the channel. The decision itself
// (decideLogin, exposed as DecideLogin) is a pure function of the target's configuration, the
// request, the connection and the number of channels the nexus has; see decideLogin for the
// reject reasons and why a missing ACL is 0x00010006.
//
// # A channel
//
// One goroutine per channel owns everything of it: it polls the channel's CQ, receives IUs,
// keeps the credits, posts RDMA READ / RDMA WRITE / SEND work requests (through frpool, see Data
// mover) and answers; LUN workers only execute commands and post an event back. When the
// transport can run a completion handler (transport.CompletionHandler: softroce) and the
// channel's goroutine is idle, the transport's receive goroutine does that goroutine's
// completion work under the same lock (channel.cqp, an internal/cqpoll Poller): a command on a
// RAM LUN is then received, executed and answered, with the ACK of its SEND, without any
// goroutine handoff (Limits.NoCompletionHandler turns it off, TargetStats.HandlerBatches
// counts it). Commands
// execute on per-LUN worker pools (Limits.LUNWorkers goroutines per LUN at most, shared by
// every session, started on demand and gone after 100 ms idle), so a slow LUN holds only its
// own workers; see lunQueue for the dispatch order that keeps ORDERED task attributes deadlock
// free with bounded workers. Commands to a fast LUN (the RAM backend) execute inline on the
// channel's goroutine instead, when no ORDERED command is active there and an execution slot is
// free (no handoff to a worker and back; Limits.NoInline turns it off, TargetStats.InlineExecs
// counts them). Every
// request slot (QueueDepth+1 of them) has its response buffer, external descriptor table buffer
// and Limits.MaxTransfer bytes of data buffer in one memory area registered at login: nothing
// is registered or allocated per I/O (BenchmarkCommandPath: 0 allocs/op). A channel's memory is
// therefore (QueueDepth+1) × (MaxTransfer + MAX IT IU LEN + MAX TI IU LEN + the descriptor
// table buffer) of registered memory — virtual until a request slot touches it, 131 MiB at
// depth 128 with the defaults — plus about 1.5 MiB of Go heap at depth 128 (work requests and
// descriptor scratch of the request slots, the pool's send-queue books).
//
// Command path: receive → credit → srp.ParseCmd (with the negotiated immediate-data offset) →
// the view's LUNSet.Parse (direction, length, the ACL's write protection; Execute reuses the
// parse) → LUNSet.Admit in arrival order → RDMA READ of external indirect tables, if any →
// RDMA READ of data-out (or immediate data used in place in the receive buffer) → execution on
// a LUN worker or inline → SRP_RSP (status, sense truncated to MAX TI IU LEN, residuals:
// computeResiduals) posted after the data-in RDMA WRITEs as one all-or-nothing chain with only
// the SEND signaled, the receive buffer reposted first.
//
// # Credits
//
// The login grants QueueDepth credits; each SRP_CMD and SRP_TSK_MGMT consumes one; each SRP_RSP
// returns 1 plus the credits of requests that ended without a response (aborted). When owed
// credits have no response to ride on, the channel sends SRP_CRED_REQ (ib_srpt never does,
// which can starve an idle channel). A request beyond the credits is answered at once with
// BUSY (TSK_MGMT: FUNCTION FAILED) and delta 1, holding nothing; the receive ring has one
// buffer more than the credits (for SRP_CRED_RSP), and an initiator that ignores credits
// beyond that meets RNR NAKs, never a target that runs out of anything. See credits.
//
// # Task management
//
// ABORT TASK, ABORT TASK SET, CLEAR TASK SET and LOGICAL UNIT RESET abort commands in the LUN
// queues (undispatched ones at once, running ones through their context: scsi reports TASK
// ABORTED for a command still waiting for its turn, a command already running on the backend
// completes); aborted commands get no response (SAM, and ib_srpt) and their credits are
// returned as above; the TM response goes out once every aborted command has ended. CLEAR ACA
// and unknown functions: FUNCTION NOT SUPPORTED. See handleTM.
//
// # Teardown
//
// SRP_I_LOGOUT, a CM DREQ, a transport error, a SINGLE login of the same initiator (T_LOGOUT
// reason 4), a protocol error (T_LOGOUT with its reason: 2 invalid IU type, 3 unexpected
// response, 8 invalid IU length), Channel.Close (reason 1) or Target.Close (reason 0) close a
// channel: its commands are aborted, T_LOGOUT is sent if asked for (bounded by
// Limits.LogoutTimeout), the QP goes to ERR (CM DREQ when there is a connection) and the
// channel waits for every work request to flush and every executing command to return,
// bounded by Limits.TeardownTimeout; past it the transport resources are destroyed anyway and
// the memory a still-executing command uses is released when that command returns (never
// "waiting for unregistration" forever). The last channel of a session reports I_T nexus loss
// to the LUNs.
//
// # Data mover
//
// Data moves through frpool's RW contexts (frpool/rw.go, in the spirit of Linux's rdma_rw_ctx):
// each channel has one frpool.Pool bound to its QP, through which every send work request is
// posted, and each request slot one preallocated frpool.RWCtx for up to 16 RDMA work requests (a
// transfer needing more — more remote descriptors — borrows one of the channel's four large
// contexts, sized for Limits.MaxDescriptors, and waits in send-queue order when none is free;
// ChannelStats.BigTransfers counts them). The external tables and the data-out are RDMA READs of
// the context (RWRead; the pool posts them in waves of at most max_rd_atomic and calls RWDone once
// the last wave completed); data-in is RDMA WRITEs with the SRP_RSP SEND chained after them
// (RWWrite with a response: one all-or-nothing post, only the SEND signaled); a response without
// data-in and the control IUs are plain chains (Pool.Post). The local side is the slot's data
// buffer (or table buffer) in the channel's one registered memory area, given with its lkey, so
// no MR is registered per I/O and the pool's own MR (it needs one) is never used. One exception:
// on a device that takes process memory as a source (transport.DeviceAttr.HostSGE: softroce), a
// READ from a LUN that lends its memory (backend.Viewer: RAM) is answered from that memory as it
// lies — the slot offers room for maxViews views (scsi.Command.DataInViews) and the RDMA WRITEs
// take them as SGE.Host sources, so the data is not copied into the slot first (to an srpd
// initiator without ICRC, softroce then hands the pieces to the kernel by reference: no copy in
// the process at all). A READ whose views do not fit the slot's own RW context is copied into
// the slot as before; ChannelStats.LentReads counts the others. The views are valid while the
// request slot holds them (the RAM backend never reuses a chunk's memory for another range);
// their bytes follow writes that overlap the READ, which SAM allows (scsi's Atomicity note). Send-queue
// slots are accounted by the channel as well, conservatively (a chain's slots come back when it has
// completed), so that the pool never refuses a chain and the control IUs always find their two
// reserved slots: a chain that does not fit waits in FIFO order instead. Send completions go to
// Pool.HandleSendCompletion, which gives back the completions of the target's SENDs (their own WR
// IDs) and runs RWDone for the transfers; ChannelStats.RWTransfers counts the transfers the pool
// completed. postRead and respondCmd (through prepareRW) are the only places that prepare RDMA
// transfers, doPost the only one that posts them.
package target
