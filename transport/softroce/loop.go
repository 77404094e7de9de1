package softroce

import (
	"net/netip"
	"sync"

	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// Loopback, as rxe does it (torvalds/linux:drivers/infiniband/sw/rxe/rxe_net.c: rxe_prepare
// marks a packet RXE_LOOPBACK_MASK when its destination is the device itself, and
// rxe_xmit_packet hands such a packet to rxe_loopback, that is straight to rxe_rcv, instead of
// the IP stack): a packet whose destination address and UDP port are the device's own is
// queued here and processed by the device's own receive path, without a system call. An
// initiator and a target in one process (srpd's loopback demo) then exchange their packets
// without a socket. Such packets are not seen by the link, so a capture of the link does not
// show them (Config.NoLoopback sends them through the link instead), and they carry no ICRC:
// the link computes and checks ICRCs, and these never leave memory. Nor, mostly, do they carry
// their payload: a data packet's payload is carried by reference, its bytes copied once, from
// the source MR straight into the destination, when the packet is processed (loopref.go).
//
// The loopback loop is the device's third goroutine. Whoever queues packets while the queue
// has no drainer wakes it; while it processes a batch, what that batch sends to the device
// itself (the ACKs, a target's reply posted by a completion handler) is queued behind and
// processed in the same run, without another wake-up. A consumer that brackets its post with
// Hold and Progress (transport.Progresser) drains the queue itself instead: at queue depth 1 an
// initiator's command, the target's execution and reply and the initiator's completion then
// all run on the posting goroutine, without a goroutine handoff (with GOMAXPROCS above 1 each
// handoff also wakes an idle thread of the Go scheduler).

const (
	// loopBatch is the number of queued packets the loopback loop processes as one batch.
	loopBatch = 32
	// loopMaxBufs bounds the packets the queue holds (about 32 MiB). Beyond it a packet is
	// dropped and counted, and the RC retry recovers it as after a loss on a network. In
	// practice the queue holds what the requesters have in flight towards the device itself.
	loopMaxBufs = 8192
	// progressBatches bounds the batches Progress processes on its caller's goroutine before
	// it hands the rest to the loopback loop: enough for a command of 1 MiB (a write's READ
	// responses alone are 8 batches at MTU 4096), as waking the loopback loop mid-command costs
	// a goroutine handoff.
	progressBatches = 16
)

type loopback struct {
	on   bool
	max  int // loopMaxBufs (tests lower it)
	kick chan struct{}

	mu    sync.Mutex
	q     []loopPacket // queued packets from head on; each Buf is a full-size buffer of the queue
	head  int
	free  [][]byte // the queue's free buffers
	nbufs int      // buffers the queue has allocated
	// active: the queue has a drainer (the loopback loop was woken or is processing, or a
	// Progress owes or runs a drain): queueing needs no wake-up. Only the drainer takes
	// packets, so the batch buffers (bufs) are its.
	active bool
	holds  int  // Holds without their Progress yet
	owed   bool // a packet was queued while the queue had no drainer and holds > 0
	bufs   *rxBufs
}

// loopPacket is a queued packet and, when its payload is carried by reference (loopref.go),
// where that payload is: the packet's payload area then holds nothing of use.
type loopPacket struct {
	pk  link.Packet
	ref loopRef
}

func (l *loopback) init(off bool) {
	l.on, l.max = !off, loopMaxBufs
	l.kick = make(chan struct{}, 1)
}

// loopDst reports whether dst is one of the device's own addresses and its UDP port.
func (d *Device) loopDst(dst netip.AddrPort) bool {
	a := dst.Addr().Unmap()
	if !a.IsValid() || a.IsUnspecified() {
		return false
	}
	for _, x := range d.addrs {
		if x.Port() == dst.Port() && x.Addr().Unmap() == a {
			return true
		}
	}
	return false
}

// loopSend moves the packets of pkts that are addressed to the device itself to the loopback
// queue and returns the others, compacted in place in their order. A packet built at the start
// of a buffer of pool (sendFrom) is taken with its buffer, which a free buffer of the queue
// replaces in pool; any other is copied (the caller's buffers are reused at once), but for the
// payload of a packet carried by reference, which holds nothing the receiver reads. Such a
// packet (loopRefFlag) has its reference decoded and queued beside it. Called by sendFrom,
// with sendMu held, so packets join the queue in the order they were built.
func (d *Device) loopSend(pkts []link.Packet, pool [][]byte) []link.Packet {
	i := 0
	for i < len(pkts) && !d.loopDst(pkts[i].Dst) {
		i++
	}
	if i == len(pkts) {
		return pkts
	}
	l := &d.loop
	k := i
	var n, bytes, drops, nref, refBytes uint64
	j := 0 // packets built into pool come in pool's order: look on from the last one found
	l.mu.Lock()
	for ; i < len(pkts); i++ {
		p := &pkts[i]
		if !d.loopDst(p.Dst) {
			pkts[k] = *p
			k++
			continue
		}
		buf := l.freeBuf()
		if buf == nil {
			drops++
			continue
		}
		plen := p.Len()
		var ref loopRef
		ncopy := plen
		if p.Payload != nil {
			// A payload of process memory by reference (gatherRef): the headers are copied,
			// the payload is kept beside them (their buffer has room for it: full size).
			ncopy = len(p.Buf) - wire.ICRCLen
			ref.n, ref.seg[0] = 1, refSeg{len: uint64(len(p.Payload)), host: p.Payload}
			nref++
			refBytes += uint64(len(p.Payload))
		} else if plen > loopRefByte && p.Buf[loopRefByte]&loopRefFlag != 0 {
			hdr, pl, ok := ref.get(p.Buf)
			if !ok {
				// Never (our own builders encoded it): lost, as a bad packet would be.
				l.free = append(l.free, buf)
				drops++
				continue
			}
			ncopy = hdr
			nref++
			refBytes += uint64(pl)
		}
		if plen > 0 {
			for j < len(pool) && (len(pool[j]) == 0 || &pool[j][0] != &p.Buf[0]) {
				j++
			}
		}
		if plen > 0 && j < len(pool) {
			// Take the caller's buffer; ours takes its place.
			buf, pool[j] = pool[j], buf
			j++
		} else {
			copy(buf, p.Buf[:ncopy])
			if j == len(pool) {
				j = 0 // not from pool (a control packet): later ones may still be
			}
		}
		// What the link's Recv would report: the sender's address and the device's port.
		src := p.Src.Addr()
		if !src.IsValid() || src.IsUnspecified() {
			src = p.Dst.Addr()
		}
		l.q = append(l.q, loopPacket{pk: link.Packet{
			Src:          netip.AddrPortFrom(src, d.port),
			Dst:          p.Dst,
			TrafficClass: p.TrafficClass,
			Buf:          buf[:plen],
		}, ref: ref})
		n++
		bytes += uint64(plen)
	}
	wake := len(l.q) > l.head && l.claim()
	l.mu.Unlock()
	d.stats.loopPackets.Add(n)
	d.stats.loopBytes.Add(bytes)
	if nref > 0 {
		d.stats.loopRefPackets.Add(nref)
		d.stats.loopRefBytes.Add(refBytes)
	}
	if drops > 0 {
		d.stats.loopDrops.Add(drops)
	}
	if wake {
		l.wake()
	}
	return pkts[:k]
}

// freeBuf returns a free full-size buffer of the queue, or nil when the queue holds all it
// may (the packet is then dropped and counted; RC retries recover it). l.mu held.
func (l *loopback) freeBuf() []byte {
	if m := len(l.free); m > 0 {
		buf := l.free[m-1]
		l.free[m-1] = nil
		l.free = l.free[:m-1]
		return buf
	}
	if l.nbufs < l.max {
		l.nbufs++
		return make([]byte, bufSize)
	}
	return nil
}

// claim gives packets just queued a drainer if the queue has none: it reports whether the
// loopback loop must be woken (not when a Hold's Progress will drain). l.mu held.
func (l *loopback) claim() bool {
	if l.active {
		return false
	}
	l.active = true
	if l.holds > 0 {
		l.owed = true // a Progress will drain
		return false
	}
	return true
}

// wake wakes the loopback loop.
func (l *loopback) wake() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// loopLoop drains the loopback queue whenever woken.
func (d *Device) loopLoop() {
	defer d.wg.Done()
	for {
		select {
		case <-d.loop.kick:
		case <-d.done:
			return
		}
		if !d.loopDrain(-1) {
			return
		}
	}
}

// loopDrain processes the loopback queue, a batch at a time, until it is empty (then the
// queue has no drainer) or, when max >= 0, max batches are done (then the loopback loop takes
// over). Only the queue's drainer calls it. It returns false once the device is closed.
func (d *Device) loopDrain(max int) bool {
	l := &d.loop
	l.mu.Lock()
	if l.bufs == nil {
		l.bufs = newRxBufs(loopBatch, loopInline, true) // only a device that loops back needs them
	}
	b := l.bufs
	for k := 0; ; k++ {
		n := min(len(l.q)-l.head, len(b.rx))
		if n == 0 {
			clear(l.q)
			l.q, l.head = l.q[:0], 0
			l.active = false
			l.mu.Unlock()
			return true
		}
		if k == max {
			l.mu.Unlock()
			l.wake()
			return true
		}
		l.take(b, n)
		l.mu.Unlock()
		if !d.rxBatch(b, n) {
			return false
		}
		l.mu.Lock()
	}
}

// take moves the first n queued packets into b.rx (and their references into b.refs). l.mu
// held, by the queue's drainer.
func (l *loopback) take(b *rxBufs, n int) {
	// Swap buffers: the queued packet's becomes the batch's, the batch's joins the free list.
	for i := 0; i < n; i++ {
		old := b.rx[i].Buf[:cap(b.rx[i].Buf)]
		b.rx[i], b.refs[i] = l.q[l.head+i].pk, l.q[l.head+i].ref
		l.q[l.head+i] = loopPacket{}
		l.free = append(l.free, old)
	}
	l.head += n
	if l.head >= len(l.q)/2 { // keep the queue from growing while it is never empty
		m := copy(l.q, l.q[l.head:])
		clear(l.q[m:])
		l.q, l.head = l.q[:m], 0
	}
}

// Hold implements transport.Progresser: until the matching Progress, packets to the device
// itself that find the loopback queue without a drainer wait for that Progress.
func (d *Device) Hold() {
	l := &d.loop
	l.mu.Lock()
	l.holds++
	l.mu.Unlock()
}

// Progress implements transport.Progresser: it ends a Hold and, if packets wait for it,
// processes them on the caller's goroutine (a few batches; the loopback loop does the rest).
func (d *Device) Progress() {
	l := &d.loop
	l.mu.Lock()
	if l.holds > 0 {
		l.holds--
	}
	owed := l.owed
	l.owed = false
	l.mu.Unlock()
	if owed {
		d.loopDrain(progressBatches)
	}
}
