package softroce

import (
	"encoding/binary"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// Payload by reference on the loopback path. A packet through the link needs its payload in
// the packet: copied from the source MR when the packet is built, copied again into the
// destination MR when it is received. A packet to the device itself (loop.go) need not carry
// it: the builder records where the bytes are, as device address ranges, and the receive path
// copies them from there straight into the destination MR, one copy instead of two. That is
// done for the data packets (RDMA WRITE, SEND, READ response) of at least refMinPayload bytes
// whose bytes lie in at most maxRefSegs ranges; anything else is copied as before. Every check
// (PSN, lkey/rkey, lengths, the MR re-validation) runs as it does for a copied packet, and the
// header is the same (its length fields say the payload length): only where the payload's
// bytes are read from changes.
//
// The bytes are read when the receiver processes the packet rather than when it was built.
// For a correct consumer that is the same: the sender's WQE (a WRITE, a SEND) completes only
// after its ACK, which the receiver sends after processing the packet, and the READ a
// response answers completes only once the requester has processed it, so the source bytes
// may not change in between. A packet rebuilt by go-back-N records them again, like a copy.
//
// Safety: the ranges are device addresses (plain integers), not Go slices, and they are
// resolved under the device mutex, by the receive path, when the packet is processed
// (resolveRef). Memory.Free removes its region from the device's map and unmaps it under the
// same mutex, and device addresses are never reused (memMap.add), so a packet whose source
// was freed meanwhile finds no region: it is dropped (LoopRefDrops), never read from unmapped
// memory. The RC protocol then treats it as lost: the retransmission rebuilds it, checks the
// lkey again and fails as any later use of freed memory would (LOC_PROT_ERR for a WRITE or a
// SEND, a remote access NAK for a READ). A source MR invalidated or deregistered but still
// mapped is read as it is (stale bytes, no crash). Nothing holds a region, so a packet dropped
// from the queue (queue full, device closed) has nothing to release.

const (
	// maxRefSegs bounds the device address ranges of one packet carried by reference (a
	// 4096-byte packet over two fast-reg pages takes two; contiguous ranges merge).
	maxRefSegs = 4
	// refMinPayload is the smallest payload carried by reference: below it the copy costs
	// about what the reference does (and the encoded reference must fit in the payload).
	refMinPayload = 256
	// loopRefFlag marks, in a reserved bit of the BTH (byte 8, bit 6, beside AckReq), a packet
	// built for the loopback queue whose payload area holds an encoded loopRef instead of the
	// payload. Only the device's own builders set it and loopSend, which receives every packet
	// they build for the device itself, clears it when it queues the packet with the decoded
	// reference beside it: a packet from the link never reaches a receive path as a reference.
	loopRefFlag = 0x40
	loopRefByte = 8
	// refEncLen is the encoded size of a loopRef: a count, then (address, length) pairs.
	refEncLen = 8 + 16*maxRefSegs
)

// loopRef is the payload of a loopback packet carried by reference: n device address ranges,
// concatenated in order (n == 0: the payload is in the packet).
type loopRef struct {
	n   int
	seg [maxRefSegs]refSeg
}

type refSeg struct {
	addr uint64
	len  uint64
	// host, when not nil, is the piece itself: process memory (SGE.Host) that has no device
	// address; set by loopSend from link.Packet.Payload, never encoded.
	host []byte
}

// add appends [addr, addr+n), merging it with the last range when contiguous; false when the
// ranges would be more than maxRefSegs.
func (r *loopRef) add(addr uint64, n uint64) bool {
	if r.n > 0 {
		if s := &r.seg[r.n-1]; s.addr+s.len == addr {
			s.len += n
			return true
		}
	}
	if r.n == maxRefSegs {
		return false
	}
	r.seg[r.n] = refSeg{addr: addr, len: n}
	r.n++
	return true
}

// put encodes r into p's payload (at least refMinPayload bytes) and flags p for loopSend.
func (r *loopRef) put(p wire.Packet) {
	b := p.Payload()
	binary.LittleEndian.PutUint64(b, uint64(r.n))
	for i := 0; i < r.n; i++ {
		binary.LittleEndian.PutUint64(b[8+16*i:], r.seg[i].addr)
		binary.LittleEndian.PutUint64(b[16+16*i:], r.seg[i].len)
	}
	p.Bytes()[loopRefByte] |= loopRefFlag
}

// get decodes the reference of a flagged packet buf (BTH through ICRC) into r and clears the
// flag. It returns the packet's header length (the bytes worth copying), its payload length
// and whether the reference is well formed and covers the payload exactly (always, but for a
// bug).
func (r *loopRef) get(buf []byte) (hdr, n int, ok bool) {
	buf[loopRefByte] &^= loopRefFlag
	p, err := wire.Parse(buf)
	if err != nil || p.PayloadLen() < refEncLen {
		return len(buf), 0, false
	}
	b := p.Payload()
	nseg := binary.LittleEndian.Uint64(b)
	if nseg == 0 || nseg > maxRefSegs {
		return len(buf), 0, false
	}
	r.n = int(nseg)
	var total uint64
	for i := 0; i < r.n; i++ {
		r.seg[i].addr = binary.LittleEndian.Uint64(b[8+16*i:])
		r.seg[i].len = binary.LittleEndian.Uint64(b[16+16*i:])
		total += r.seg[i].len
	}
	return p.HeaderLen(), p.PayloadLen(), total == uint64(p.PayloadLen())
}

// byRef reports whether q's next packet of n payload bytes may carry it by reference: it goes
// to the device's loopback queue (exactly the packets loopSend takes) and is large enough.
// dev.mu held.
func (q *qp) byRef(n uint32) bool {
	return n >= refMinPayload && q.dev.loop.on && q.dev.loopDst(q.dst)
}

// refRange appends to r the device address ranges backing MR addresses [va, va+n) (range
// already checked, as for chunk); false when they need more than maxRefSegs. A regular MR's
// addresses are device addresses; a fast-reg MR's map page by page.
func (m *mr) refRange(r *loopRef, va uint64, n uint64) bool {
	if !m.fast {
		return r.add(va, n)
	}
	for n > 0 {
		po := va - m.iova + m.pageOff
		in := po & (1<<m.pageShift - 1)
		k := min(n, 1<<m.pageShift-in)
		if !r.add(m.pageAddrs[po>>m.pageShift]+in, k) {
			return false
		}
		va += k
		n -= k
	}
	return true
}

// gatherRef is gather for a packet carried by reference: n bytes of w's data from message
// offset off, through the SGL with the same lkey check of every SGE touched, recorded in r
// instead of copied, or, when they are one piece of process memory (SGE.Host) of a length
// needing no pad, returned as host (the packet carries it as link.Packet.Payload, which
// loopSend keeps beside the headers). ok false: protection error. r.n == 0 and host nil with
// ok: more than maxRefSegs ranges, or host memory in pieces (the caller copies). Not for inline
// data (already copied at post time). dev.mu held.
func (q *qp) gatherRef(w *sendWQE, off, n uint32, r *loopRef) (ok bool, host []byte) {
	it := sglIter{sgl: w.wr.SGL, off: off, n: n}
	for {
		m, va, h, k, ok := q.nextSGE(&it)
		if k == 0 {
			return ok, nil
		}
		if h != nil {
			if k == n && n%4 == 0 {
				return true, h
			}
			r.n = 0 // host memory in pieces, or with pad bytes: copied
			return true, nil
		}
		if !m.refRange(r, va, uint64(k)) {
			r.n = 0
			return true, nil
		}
	}
}

// resolveRef turns a loop packet's reference into host slices of the device's memory (in
// src, which has room for maxRefSegs). false: a range is no longer in device memory (freed
// after the packet was built): the packet must be dropped. dev.mu held.
func (d *Device) resolveRef(r *loopRef, src [][]byte) bool {
	for i := 0; i < r.n; i++ {
		if h := r.seg[i].host; h != nil {
			src[i] = h // kept alive by the reference; the WR it comes from has not completed
			continue
		}
		b := d.ms.slice(r.seg[i].addr, r.seg[i].len)
		if b == nil {
			return false
		}
		src[i] = b
	}
	return true
}

// copyInPieces writes a payload, src's pieces in order, at MR address va (range already
// checked).
func (m *mr) copyInPieces(va uint64, src [][]byte) {
	for _, b := range src {
		m.copyIn(va, b)
		va += uint64(len(b))
	}
}

// scatterPieces is scatter of a payload in pieces: each is scattered from its message offset
// on, with the same checks.
func (q *qp) scatterPieces(p *pd, sgl []transport.SGE, off uint32, src [][]byte) bool {
	for _, b := range src {
		if !q.scatter(p, sgl, off, b) {
			return false
		}
		off += uint32(len(b))
	}
	return true
}
