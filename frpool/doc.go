// Package frpool is the fast-registration MR pool, one per QP, with rkey increment and
// invalidate ordering that are correct by construction, plus RDMA read/write contexts that hide
// MRs from the ULP.
//
// # Why
//
// Linux's ib_srp (2021) posts an unsignaled LOCAL_INV, puts the MR straight back on its free
// list and unmaps the I/O buffer; the next user bumps the key byte in software (ib_inc_rkey,
// ib_update_fast_reg_key), remaps and posts REG_MR. That is legal only because work requests on
// one send queue execute in order and hardware keeps its own key state, and it still hands the
// buffer back before the invalidation is known to have executed: until it does, the peer (or
// anyone replaying the rkey) can still reach the buffer. rxe, which once compared the queued
// LOCAL_INV against the already-bumped software key, made the problem visible (linux-rdma,
// September 2021; see the srp-protocol reference, §6 and §8).
//
// # Rules this package implements
//
//   - One pool per QP. MRs are never posted on another QP: ordering across send queues is
//     undefined.
//   - A registration handle (Reg) records the exact key it was registered with; its LOCAL_INV
//     names that key, never "the MR's current key". The key is picked by Get (the ULP needs it for
//     the SEND chained after the REG_MR) and the MR's key byte advances only when the REG_MR work
//     request is built and posted, so a cancelled Get or a failed post leaves the MR untouched
//     (the concern of rdma_rw_update_lkey in Linux's rw.c). The byte wraps mod 256 (counted in
//     Stats.KeyWraps) and skips the key bytes of registrations of that MR that may still be live.
//   - Reuse: an MR whose LOCAL_INV is posted may be registered again on the same QP at once. Verbs
//     rule relied on: work requests on one send queue execute in order and local operations take
//     effect in that order (IBA; rxe executes REG_MR inline when reached and fences LOCAL_INV
//     behind every earlier WR, roce-wire §4.5), so the LOCAL_INV executes before the new REG_MR.
//     LOCAL_INVs carry SendFence so that they also wait for earlier RDMA READs on engines that do
//     not fence local invalidation implicitly.
//   - The buffer a registration mapped goes back to its owner (BufferOwner.BufferReleased) only
//     when the invalidation is confirmed: by the LOCAL_INV's own signaled completion, by a later
//     signaled completion on the same send queue (which retires every earlier WR), or by a receive
//     completion reporting remote invalidation (SEND_WITH_INV) of exactly that rkey. Send and
//     receive completions are not ordered with respect to each other, so one such report per
//     registration is accepted whether it is polled before or after the registration's death; a
//     remote invalidation of a key of ours that matches no live registration otherwise (a
//     second report of one registration included) quarantines the MR.
//   - Unsignaled WRs are tracked per send queue (sqTracker). A post that would leave more than
//     Config.SignalInterval WRs without a later signaled one gets its last WR signaled; Flush posts
//     a sentinel (signaled zero-length RDMA WRITE) when invalidations would otherwise wait for a
//     completion nobody has asked for.
//   - Posting is all-or-nothing and never leaves the pool half-updated: a chain (REG_MRs, ULP WRs,
//     LOCAL_INVs) is validated, built into preallocated work requests, posted, and only then
//     committed; the pool keeps its own send-queue slot accounting so that a chain that does not
//     fit is refused before anything happens.
//   - QP error (an errored or flushed completion, HandleQPError, or Recover): every MR whose device
//     state is unknown is quarantined and, since nothing executes on a QP in ERR, resolved at once
//     from the device's own view (MR.Query): a FREE MR is reusable after Recover, anything else is
//     deregistered and re-created. Every outstanding registration goes back to its owner with an
//     error wrapping ErrQPError; nothing is leaked. A key mismatch on a healthy QP quarantines one
//     MR until the WRs posted before it are retired (a sentinel makes sure they are).
//   - Exhaustion is backpressure: Get waits (within its context) for a free MR. No panics, no
//     growth.
//
// # Contract with the ULP
//
// The pool does not poll. The ULP (target or initiator channel) owns the CQs and:
//
//   - posts everything for the QP's send queue through the pool (Post, Register, Invalidate,
//     PostRW); the pool puts WRIDTag | sequence number in the wire WR IDs and keeps the ULP's IDs;
//   - hands every send completion to HandleSendCompletion, in CQ order, and treats the completion
//     as its own only when that returns deliver == true (wc.ID is then the ULP's ID again);
//     completions of another QP (wc.QPN) or from before Recover are reported as
//     ErrStaleCompletion and otherwise ignored, so CQs may be shared;
//   - hands every receive completion to HandleRecvCompletion (for remote invalidation and error
//     detection) before processing it, so that a response carrying SEND_WITH_INV releases the
//     buffer before the ULP would invalidate it locally;
//   - ends every handle it got from Get with exactly one Cancel (never posted) or Invalidate
//     (posted; also when the registration is already dead, which only gives the handle back);
//   - calls Flush after each batch when Config.BatchInvalidates is set (Sync to drain completely);
//   - calls HandleQPError when it learns of a QP error out of band (async event, disconnect);
//   - after a QP error, brings the QP (or a new one) back and calls Recover.
//
// Owner callbacks run on the goroutine of the pool call that discovered the event, without pool
// locks held; they may call back into the pool.
//
// # Hot path
//
// Get, Post, Invalidate, HandleSendCompletion and HandleRecvCompletion do not allocate in steady
// state: MR descriptors, registration handles with their page lists, the work-request scratch
// array and the send-queue tracker are preallocated at New. Waiting in Get allocates one channel
// per wake-up round, only when it has to wait.
package frpool
