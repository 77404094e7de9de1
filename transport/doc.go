// Package transport is srpd's verbs-style RDMA API: devices, protection domains, memory
// regions, completion queues, reliable-connected queue pairs and connection management, with
// work requests and completions that keep InfiniBand verbs semantics (and IB numeric values) so
// that the pure-Go engine (transport/softroce) and a libibverbs engine (transport/verbs, build
// tag `verbs`) can implement the same interfaces and code above them (frpool, target,
// initiator) behaves the same on both.
//
// # Object model
//
//	Device ─┬─ Memory      off-heap, page-aligned buffers with device ("DMA") addresses
//	        ├─ CQ          completion queue: Poll, Notify, Wait
//	        ├─ PD ─┬─ MR   regular MRs over registered memory; fast-reg MRs (REG_MR/LOCAL_INV)
//	        │      └─ QP   RC queue pair: Modify (RESET→INIT→RTR→RTS[↔SQD], →ERR, →RESET),
//	        │              PostSend, PostRecv
//	        └─ ConnManager Listen → Listener → ConnRequest (Accept/Reject/MRA) → CMConn; Dial
//
// Everything is expressed in device addresses, exactly as verbs uses DMA/virtual addresses: an
// SGE is (Addr, Length, LKey), a REG_MR work request carries a list of page addresses and an
// IOVA, and Memory.Addr gives the device address of a buffer's first byte. An engine only ever
// touches memory it allocated itself; an address outside its memory map is a local protection
// error (or, from the wire, a remote access error), never an access to the Go heap.
//
// # Memory keys
//
// lkey = rkey = MR index << 8 | key byte. Index 0 is never used, so key 0 is always invalid.
// A fast-registration MR starts FREE. A REG_MR work request carries its own page list, IOVA,
// length, access and the full new key; nothing about the MR changes until that work request
// executes in send-queue order. The key "in force" (what the responder checks, and what LOCAL_INV
// must name) is kept by the engine and is distinct from whatever key software has chosen for the
// next registration; MR.Query reports the engine's view.
//
// # Send-queue contract
//
// Work requests on one SQ execute in order; a completion for WR n implies that every WR before n
// on that SQ has completed. PostSend and PostRecv are all-or-nothing: either every WR in the slice
// is posted or none is, and the returned error says why (ErrSQFull/ErrRQFull, or a validation
// error) and which WR (*PostError). SendQueueFree reports how many WRs fit right now.
// Posting does not allocate: work requests are value structs passed as a slice, and engines copy
// what they need (SGEs, inline data) into preallocated queue slots. The page list of a REG_MR WR
// is the exception: the engine keeps a reference to the caller's slice and copies it when the WR
// executes, so the caller must not modify it until the WR (or a later one on the SQ) completes.
//
// # Completions on the engine's goroutine
//
// A consumer normally waits on CQ.Notify and polls from its own goroutine. At low queue depth
// the wake-up of that goroutine costs more than the work itself, so a CQ may also implement
// CompletionHandler: the engine then runs the consumer's function on its own goroutine right
// after adding completions (softroce: the receive loop, after releasing its lock; whatever the
// handler posts joins the ACKs of the same receive batch in one link send). The handler must not
// wait for the engine (it runs on it); target and initiator take the completions there only when
// their channel goroutine is idle and leave failures and teardown to it.
//
// A device may also implement Progresser: work it would hand to a goroutine of its own
// (softroce: packets between two QPs of the same device, which it loops back without the
// network, as rxe does) can then run on the consumer's goroutine. The initiator brackets each
// command's post with Hold and Progress, so that with the target on the same device the
// command, its execution and answer, and its completion all run on the posting goroutine.
//
// A device may implement PostBatcher: a consumer that posts several commands in a row
// brackets them with BeginPosts and EndPosts, and the device sends what they transmit together
// (softroce: one system call and, for SENDs of one size to one peer, one GSO datagram, where
// each post would otherwise be a sendmmsg and a datagram of its own). The initiator's NBD
// export brackets the requests of one read of its socket.
//
// # Connection management
//
// A device that can establish connections implements ConnManager (cm.go): RDMA CM semantics
// over the IB CM as a Linux rdma_cm peer sees them, the RDMA CM header stripped from and added
// to the private data, with QPs the caller creates; Dial and ConnRequest.Accept move the QP to
// RTS. softroce drives its own CM state machine (transport/softroce/cm) over QP1 MADs; the
// verbs engine maps the interface onto librdmacm. Without a CM, a QP can still be connected by
// hand: the caller supplies the address vector, destination QPN and PSNs through Modify, the
// way ibv_rc_pingpong exchanges them out of band (the engines' tests do).
package transport
