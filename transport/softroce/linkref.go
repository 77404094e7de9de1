package softroce

import (
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
)

// Payload by reference on the link. A data packet the requester builds (RDMA WRITE, SEND) has
// its payload copied from the source MR into a packet buffer, which the kernel then copies
// again into its socket buffer. To an srpd peer that waives the ICRC (q.noICRC: no CRC has to
// be computed over the bytes) the copy is left out: the packet's link.Packet carries the
// headers in its buffer and the payload as a slice of the MR's memory, which the UDP link
// hands to sendmmsg as an iovec of its own (link.Packet.Payload). At 128 KiB reads between
// two processes the target's gather into packet buffers was 12 % of its CPU time (perf).
//
// Which packets: requester data packets of at least refMinPayload bytes, a multiple of 4 (no
// pad), whose bytes are one piece of one SGE's MR (a fast-reg MR's piece within one page), to
// a peer that waives the ICRC, not to the device itself (loopref.go carries those). Not READ
// responses: the responder reads the peer-named MR when it builds the response, under the
// rkey check, and reading it later, when the packet is sent, would reopen the window between
// an invalidation and the memory's reuse that frpool exists to close. Not inline data (copied
// at post time).
//
// When the bytes are read: when the packet is sent rather than when it was built, a little
// later. For a correct consumer that is the same: the WQE completes only after the packet's
// ACK, so its source bytes may not change before it is sent (loopref.go makes the same
// argument for the loopback path).
//
// Memory lifetime: packets are built under the device mutex and sent later, under sendMu,
// after it is released (held by post brackets, rxPend while completion handlers run, or just
// the time between building and sendmmsg). Memory.Free must not let such a packet read
// unmapped memory, or memory mapped again at the same address (another allocation's bytes
// sent to the peer). refOut counts the packets built with a Payload for the link and not
// yet through sendFrom (incremented under mu when built, decremented after the link's Send
// returned; loopback packets with a Payload of process memory are not counted: loopSend takes
// them, and no device memory is involved):
// when it is zero under mu, no such packet exists, and Free unmaps at once. Otherwise Free
// maps the range again as PROT_NONE (the pages are released at once and the address stays
// reserved, so nothing else is mapped there: a late send fails with EFAULT and the packet is
// dropped, as a link error) and keeps it in dead; the next holder of mu that sees refOut at
// zero unmaps it (reapDead: the transmit loop, woken by the send that brings refOut to zero,
// or a later Free), and Close unmaps whatever is left once every sender has stopped. The
// memory's MRs are gone before Free succeeds (region.users), so no packet built after Free
// can point into it.

// linkRef returns the n bytes of w's data at message offset off as one slice of registered
// memory when the packet can carry them by reference (see above), after the lkey check of the
// SGE. nil with ok: copy them (gather). ok false: protection error. dev.mu held.
func (q *qp) linkRef(w *sendWQE, off, n uint32) (payload []byte, ok bool) {
	if !q.noICRC || q.dev.copyPayloads || n < refMinPayload || n%4 != 0 || w.wr.Flags&transport.SendInline != 0 ||
		(q.dev.loop.on && q.dev.loopDst(q.dst)) {
		return nil, true
	}
	it := sglIter{sgl: w.wr.SGL, off: off, n: n}
	m, va, host, k, ok := q.nextSGE(&it)
	if k != n {
		return nil, ok // a protection error, or the bytes span SGEs
	}
	if host != nil {
		return host, true // SGE.Host: the caller's memory, kept until the WR completes
	}
	if c := m.chunk(va, int(n)); len(c) == int(n) {
		return c, true
	}
	return nil, true // across a fast-reg MR's pages
}

// countRefs returns the number of pkts with a payload by reference.
func (d *Device) countRefs(pkts []link.Packet) int64 {
	var n int64
	for i := range pkts {
		if pkts[i].Payload != nil {
			n++
		}
	}
	return n
}

// sentRefs records that n packets with a payload by reference went through the link's Send
// (sent or dropped). When that leaves none out and freed memory waits, the transmit loop is
// woken to unmap it (this goroutine holds sendMu and may not take mu).
func (d *Device) sentRefs(n int64) {
	if ms := d.ms; ms.refOut.Add(-n) == 0 && ms.deadN.Load() > 0 {
		d.wake()
	}
}

// unmap releases a freed region's memory: at once when no packet may still point into it,
// otherwise later (see above). ms.mu held.
func (ms *memSpace) unmap(buf []byte) error {
	if ms.refOut.Load() == 0 || ms.sendsDone() {
		ms.reapDead()
		return unix.Munmap(buf)
	}
	// Release the pages now and keep the addresses reserved. Should this fail, the memory
	// stays mapped (and readable) until reapDead: nothing is lost but the pages' early return.
	_, _ = unix.MmapPtr(-1, 0, unsafe.Pointer(&buf[0]), uintptr(len(buf)), unix.PROT_NONE,
		unix.MAP_FIXED|unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	ms.dead = append(ms.dead, buf)
	ms.deadN.Store(int32(len(ms.dead)))
	return nil
}

// sendsDone reports whether every device sharing the space has stopped its senders. ms.mu
// held.
func (ms *memSpace) sendsDone() bool { return ms.closed >= len(ms.devs) }

// reapDead unmaps the freed memory kept for packets that were still out, once none is.
// ms.mu held.
func (ms *memSpace) reapDead() {
	if len(ms.dead) == 0 || (ms.refOut.Load() != 0 && !ms.sendsDone()) {
		return
	}
	for i, b := range ms.dead {
		_ = unix.Munmap(b) // the mapping of AllocMemory (or its PROT_NONE stand-in): cannot fail
		ms.dead[i] = nil
	}
	ms.dead = ms.dead[:0]
	ms.deadN.Store(0)
}

// reap is reapDead for a holder of a device's mu.
func (ms *memSpace) reap() {
	ms.lock()
	ms.reapDead()
	ms.unlock()
}
