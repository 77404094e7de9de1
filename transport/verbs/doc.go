// Package verbs is the kernel-verbs engine of the transport API: libibverbs and librdmacm through
// cgo, for RoCE NICs, InfiniBand-style RoCE devices and the kernel's soft-RoCE (rdma_rxe). It is
// built only with the build tag `verbs` (and cgo on Linux; Debian's libibverbs-dev and
// librdmacm-dev). Without the tag the package holds only Config and stubs that report
// ErrUnavailable, so the default build stays pure Go and links nothing.
//
// # Objects
//
//   - Device: one port of an RDMA device (OpenDevice("rxe0", Config{})). Its context is the one
//     librdmacm opened (rdma_get_devices), so that connection IDs and the QPs created through the
//     transport API live in the same ibv_context. Addrs and GIDs are the port's RoCEv2 GIDs.
//   - Memory: anonymous mmap'd, page-aligned memory; its device address is its virtual address
//     (what ibv_reg_mr registers). RegMR refuses ranges outside memory allocated from the device.
//   - CQ: an ibv_cq with its own completion channel. One goroutine per CQ waits on the channel (in
//     poll(2) together with a stop eventfd), re-arms it and drains the CQ with ibv_poll_cq in
//     batches of up to 64 completions per cgo call into a ring that Poll copies from (Poll never
//     enters C). Work-request IDs on the wire are the engine's own (QP generation, sequence);
//     the poller maps them back to the caller's IDs through per-QP shadow rings, which is also how
//     unsignaled WRs are retired (a completion for WR n retires every earlier WR on that SQ) and
//     how SendQueueFree/RecvQueueFree are counted.
//   - QP: an RC ibv_qp. Modify validates with transport.ValidateModify and then calls
//     ibv_modify_qp (the AV's source address selects the RoCEv2 GID index; only UDP port 4791).
//     PostSend/PostRecv validate the whole chain in Go first (state, free slots, opcode, SGE
//     count, inline length, REG_MR form) and then post it in one ibv_post_send / ibv_post_recv.
//     WRs posted to a QP the engine knows is in ERR are completed with WR_FLUSH_ERR by the engine
//     itself, in order after whatever the device still has to flush (rxe does not flush receive
//     WRs posted after the QP entered ERR).
//   - ConnManager: rdma_cm (RDMA_PS_TCP) with caller-created QPs: Dial resolves address and
//     route, moves the QP to INIT with rdma_init_qp_attr, connects with the QP number, and on the
//     REP moves it to RTR and RTS and calls rdma_establish (RTU). Accept moves the QP through INIT,
//     RTR and RTS with rdma_init_qp_attr (responder resources and initiator depth from the
//     ConnParam), answers with rdma_accept and waits for ESTABLISHED (or COMM_EST, which it passes
//     on with rdma_notify). One goroutine per device reads the CM event channel, one reads async
//     events.
//
// # Fast registration: type-2 memory windows
//
// libibverbs has no REG_MR work request (ibv_alloc_mr / IB_WR_REG_MR are kernel-only verbs).
// What user space has that keeps the transport contract — a REG_MR executes in send-queue
// order, carries the full new key chosen by software (index << 8 | key byte), is invalidated by
// LOCAL_INV or a peer's SEND_WITH_INV in order, and the device keeps the key in force — is the
// type-2 memory window: ibv_alloc_mw(IBV_MW_TYPE_2) plus IBV_WR_BIND_MW, whose bind carries the
// new rkey (the key byte is the consumer's), executes in SQ order and is invalidated exactly like
// a fast-reg MR. So AllocFastRegMR allocates a type-2 MW and a REG_MR work request is posted as
// a BIND_MW over a hidden "backing" MR (LOCAL_WRITE|MW_BIND, registered once per PD and Memory,
// on first use, with ibv_reg_mr). What it costs, and what it cannot do:
//
//   - The mapping must be virtually contiguous: Pages must be consecutive pages and IOVA the
//     device (virtual) address of the first byte, i.e. what ib_map_mr_sg produces for one
//     contiguous buffer. frpool registers single contiguous buffers this way. A scattered page
//     list or a different IOVA is refused at post time with ErrNotSupported.
//   - A window grants remote access only: its key is an rkey, never an lkey (local SGEs keep
//     using regular MRs, as frpool's users do).
//   - A type-2 window is bound to the QP that bound it: peers reach it only through that
//     connection (frpool's one-pool-per-QP rule already guarantees this).
//   - The first REG_MR on a (PD, Memory) pair registers the backing MR: one ibv_reg_mr system
//     call, pinning the whole Memory; later binds are plain WRs (no system call beyond the
//     doorbell, which rxe's post_send makes anyway).
//   - The device's view (MR.Query) is tracked from completions: a bind or invalidate changes it
//     when its WR is retired (its own completion, or a later completion on the same SQ), a
//     peer's invalidation when the receive completion reporting it is polled. A bind or
//     LOCAL_INV that completes in error or is flushed leaves the window's state unknown, which
//     Query reports as VALID (frpool then deregisters and re-creates it).
//   - Devices without type-2 windows (device_cap_flags lacks MEM_WINDOW_TYPE_2A/2B; siw) get
//     ErrNotSupported from AllocFastRegMR. The alternative, ibv_reg_mr per I/O, would let the
//     kernel pick the key after the ULP has already sent it, and costs a system call plus page
//     pinning per I/O; it does not fit the transport contract and is not offered.
//
// # Limits
//
// Atomics are refused (transport.SendWR has no compare/swap operands). Only RoCE (Ethernet link
// layer) ports. AddressVector.SrcPort and HopLimit/TrafficClass go to the GRH (the kernel picks
// the UDP source port). rdma_cm cannot carry private data in a DREQ, sends REJ reason 28
// (consumer defined) only, sends MRAs by itself for every request handed to user space
// (ConnRequest.MRA is therefore a no-op), and reports neither the REQ's starting PSN nor the
// peer's CA GUID (ConnRequestInfo leaves them 0).
package verbs
