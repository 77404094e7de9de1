package link

import (
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/srpd/srpd/transport/softroce/wire"
)

// Faults configures the deterministic fault injection of one direction of a pipe. Each
// probability is in [0, 1]. For every packet the PRNG draws the same five numbers in the same
// order (drop, corrupt, duplicate, reorder, delay) whatever the probabilities, so changing one
// probability does not reshuffle the others' decisions. Faults apply in that order; a dropped
// packet gets no other fault.
type Faults struct {
	// Drop loses the packet.
	Drop float64
	// Corrupt flips one bit of one byte of Buf (never BTH byte 4, the only byte the ICRC masks)
	// after the ICRC is computed, so the receiver drops it and counts an ICRC drop.
	Corrupt float64
	// Duplicate delivers the packet twice (back to back).
	Duplicate float64
	// Reorder holds the packet back until ReorderDistance (default 1: a swap with the next
	// packet) later packets of this direction have been queued.
	Reorder         float64
	ReorderDistance int
	// Delay holds the packet back for DelayTime if it is > 0 (capped at MaxDelayTime), else
	// until DelayPackets (default 8) later packets have been queued.
	Delay        float64
	DelayPackets int
	DelayTime    time.Duration
}

// MaxDelayTime bounds Faults.DelayTime and PipeConfig.HoldTimeout.
const MaxDelayTime = time.Second

// PipeConfig configures NewPipe. The zero value is a perfect wire on port 4791.
type PipeConfig struct {
	// Seed seeds the per-direction PRNGs (PCG); equal seeds and equal traffic give equal faults.
	Seed uint64
	// AtoB and BtoA are the faults of packets sent by a and by b.
	AtoB, BtoA Faults
	// QueueLen is the number of packet buffers per direction (default 256). A packet arriving
	// when all are in use (queued or held) is dropped and counted in the receiver's
	// Stats.RxQueueDrops, like a NIC ring overflow; the sender still counts it as sent.
	QueueLen int
	// HoldTimeout releases packets held by count-based Reorder/Delay after this long even if
	// not enough later packets came (so that a test cannot wedge on the last packet).
	// 0 means 50ms; negative means never (only the count or Flush releases them).
	HoldTimeout time.Duration
	// PortA and PortB are the endpoints' UDP ports (default UDPPort).
	PortA, PortB uint16
	// RxeIPv4IDs makes senders use an incrementing IPv4 Identification, as kernel rxe does,
	// instead of 0 (what the UDP link sends). Receivers recover it from the ICRC either way.
	RxeIPv4IDs bool
	// BatchSize is what BatchSize returns (default 32).
	BatchSize int
}

// Action is a Filter's verdict.
type Action uint8

// Filter verdicts.
const (
	Pass Action = iota // send the packet (through fault injection)
	Drop               // lose the packet (counted in FaultStats.Filtered)
)

// Filter inspects every packet a MemLink sends, before fault injection. p.Buf is the link's own
// copy of the packet: the filter may modify its bytes (not its length) and the ICRC is then
// recomputed, so a test can craft valid packets. p.Src/p.Dst are resolved. The filter runs with
// the direction's lock held: it must not call the MemLink.
type Filter func(p *Packet) Action

// FaultStats counts the faults injected into the packets a MemLink sent.
type FaultStats struct {
	Filtered, Dropped, Corrupted, Duplicated, Reordered, Delayed uint64
}

// MemLink is one end of an in-memory pipe (see NewPipe). It implements Link and Encapsulator.
// Packets are copied into a fixed ring of MaxPacket buffers on Send and out of it on Recv: no
// allocation per packet.
type MemLink struct {
	addr   netip.AddrPort
	peer   *MemLink
	in     *memQueue // packets travelling to this endpoint
	batch  int
	ctr    counters
	closed atomic.Bool
	recvMu sync.Mutex // serializes Recv (one wait timer)
	timer  *time.Timer
}

type memSlot struct {
	src, dst netip.AddrPort
	tc       uint8
	n        int
	buf      []byte // cap MaxPacket
}

type heldPkt struct {
	slot    int32
	atCount uint64 // release when enq >= atCount (0: time only)
	at      time.Time
	hasTime bool
}

// memQueue is one direction of the pipe: its faults, PRNG, buffers and delivery state.
type memQueue struct {
	mu          sync.Mutex
	faults      Faults
	holdTimeout time.Duration
	rng         *rand.Rand
	rxeIDs      bool
	ipid        uint16
	filter      Filter
	fstats      FaultStats

	slots []memSlot
	free  []int32
	ready []int32 // ring
	rHead int
	rLen  int
	held  []heldPkt
	enq   uint64

	notify   chan struct{}
	closedCh chan struct{}
	closed   bool
}

func newMemQueue(n int, f Faults, seed, stream uint64, hold time.Duration, rxeIDs bool) *memQueue {
	q := &memQueue{
		faults: f, holdTimeout: hold, rxeIDs: rxeIDs,
		rng:      rand.New(rand.NewPCG(seed, stream)),
		slots:    make([]memSlot, n),
		free:     make([]int32, n),
		ready:    make([]int32, n),
		held:     make([]heldPkt, 0, n),
		notify:   make(chan struct{}, 1),
		closedCh: make(chan struct{}),
	}
	backing := make([]byte, n*MaxPacket)
	for i := range q.slots {
		q.slots[i].buf = backing[i*MaxPacket : (i+1)*MaxPacket : (i+1)*MaxPacket]
		q.free[i] = int32(n - 1 - i)
	}
	if q.faults.ReorderDistance <= 0 {
		q.faults.ReorderDistance = 1
	}
	if q.faults.DelayPackets <= 0 {
		q.faults.DelayPackets = 8
	}
	q.faults.DelayTime = min(q.faults.DelayTime, MaxDelayTime)
	return q
}

// NewPipe returns two connected in-memory links with addresses a and b (both IPv4 or both
// IPv6; an invalid or mixed pair is a programming error and panics). Whatever one end sends,
// with any Dst, arrives at the other end (a point-to-point wire), subject to cfg's faults.
func NewPipe(a, b netip.Addr, cfg PipeConfig) (*MemLink, *MemLink) {
	a, b = a.Unmap(), b.Unmap()
	if !a.IsValid() || !b.IsValid() || a.Is4() != b.Is4() {
		panic("link: NewPipe needs two valid addresses of one family")
	}
	n := cfg.QueueLen
	if n <= 0 {
		n = 256
	}
	hold := cfg.HoldTimeout
	switch {
	case hold == 0:
		hold = 50 * time.Millisecond
	case hold > MaxDelayTime:
		hold = MaxDelayTime
	}
	pa, pb := cfg.PortA, cfg.PortB
	if pa == 0 {
		pa = UDPPort
	}
	if pb == 0 {
		pb = UDPPort
	}
	batch := cfg.BatchSize
	if batch <= 0 {
		batch = 32
	}
	la := &MemLink{addr: netip.AddrPortFrom(a, pa), batch: batch, timer: stoppedTimer()}
	lb := &MemLink{addr: netip.AddrPortFrom(b, pb), batch: batch, timer: stoppedTimer()}
	la.peer, lb.peer = lb, la
	lb.in = newMemQueue(n, cfg.AtoB, cfg.Seed, 0xA2B, hold, cfg.RxeIPv4IDs) // a -> b
	la.in = newMemQueue(n, cfg.BtoA, cfg.Seed, 0xB2A, hold, cfg.RxeIPv4IDs) // b -> a
	return la, lb
}

func stoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// LocalAddr returns the endpoint's address.
func (m *MemLink) LocalAddr() netip.Addr { return m.addr.Addr() }

// LocalAddrPort returns the endpoint's address and UDP port.
func (m *MemLink) LocalAddrPort() netip.AddrPort { return m.addr }

// Peer returns the other end of the pipe.
func (m *MemLink) Peer() *MemLink { return m.peer }

// BatchSize returns the configured batch size.
func (m *MemLink) BatchSize() int { return m.batch }

// Stats returns a snapshot of the counters.
func (m *MemLink) Stats() Stats { return m.ctr.snapshot() }

// FaultStats returns the faults injected so far into packets sent by m.
func (m *MemLink) FaultStats() FaultStats {
	q := m.peer.in
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.fstats
}

// SetFilter installs f (nil removes it) for packets sent by m.
func (m *MemLink) SetFilter(f Filter) {
	q := m.peer.in
	q.mu.Lock()
	q.filter = f
	q.mu.Unlock()
}

// SetFaults replaces the faults of packets sent by m (the PRNG stream continues).
func (m *MemLink) SetFaults(f Faults) {
	q := m.peer.in
	q.mu.Lock()
	if f.ReorderDistance <= 0 {
		f.ReorderDistance = 1
	}
	if f.DelayPackets <= 0 {
		f.DelayPackets = 8
	}
	f.DelayTime = min(f.DelayTime, MaxDelayTime)
	q.faults = f
	q.mu.Unlock()
}

// Flush releases every packet held (reordered/delayed) on its way to m, in hold order.
func (m *MemLink) Flush() {
	q := m.in
	q.mu.Lock()
	for _, h := range q.held {
		q.pushReady(h.slot)
	}
	q.held = q.held[:0]
	q.mu.Unlock()
	q.wake()
}

// Encap returns the encapsulation m gives p on the wire (IPv4 ID 0 unless RxeIPv4IDs, for which
// the ID of the packet is not reported here).
func (m *MemLink) Encap(p *Packet) wire.Encap {
	src := m.addr
	if a := p.Src.Addr().Unmap(); a.IsValid() {
		src = netip.AddrPortFrom(a, m.addr.Port())
	}
	return wire.Encap{Src: src, Dst: p.Dst, TrafficClass: p.TrafficClass}
}

// Close closes m: its Send and Recv (including a blocked Recv) return net.ErrClosed; packets
// sent to it afterwards are discarded.
func (m *MemLink) Close() error {
	if m.closed.Swap(true) {
		return nil
	}
	q := m.in
	q.mu.Lock()
	q.closed = true
	close(q.closedCh)
	q.mu.Unlock()
	return nil
}

func (q *memQueue) wake() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

func (q *memQueue) pushReady(s int32) {
	q.ready[(q.rHead+q.rLen)%len(q.ready)] = s
	q.rLen++
}

func (q *memQueue) popReady() int32 {
	s := q.ready[q.rHead]
	q.rHead = (q.rHead + 1) % len(q.ready)
	q.rLen--
	return s
}

func (q *memQueue) getSlot() (int32, bool) {
	if len(q.free) == 0 {
		return 0, false
	}
	s := q.free[len(q.free)-1]
	q.free = q.free[:len(q.free)-1]
	return s, true
}

func (q *memQueue) putSlot(s int32) { q.free = append(q.free, s) }

// deliver appends slot s to the ready queue and releases the count-held packets that are due.
func (q *memQueue) deliver(s int32) {
	q.pushReady(s)
	q.enq++
	j := 0
	for _, h := range q.held {
		if h.atCount != 0 && q.enq >= h.atCount {
			q.pushReady(h.slot)
			continue
		}
		q.held[j] = h
		j++
	}
	q.held = q.held[:j]
}

// releaseExpired moves held packets whose time has come to the ready queue and returns the
// earliest remaining release time.
func (q *memQueue) releaseExpired(now time.Time) (next time.Time, any bool) {
	j := 0
	for _, h := range q.held {
		if h.hasTime && !now.Before(h.at) {
			q.pushReady(h.slot)
			continue
		}
		if h.hasTime && (!any || h.at.Before(next)) {
			next, any = h.at, true
		}
		q.held[j] = h
		j++
	}
	q.held = q.held[:j]
	return next, any
}

// Send implements Link.
func (m *MemLink) Send(pkts []Packet) (int, error) {
	if m.closed.Load() {
		return 0, net.ErrClosed
	}
	q := m.peer.in
	q.mu.Lock()
	n, err := m.sendLocked(q, pkts, false, true)
	q.mu.Unlock()
	if n > 0 {
		q.wake()
	}
	if err != nil {
		m.ctr.txErrors.Add(1)
	}
	return n, err
}

// Inject delivers pkts to m's receive side as if they had arrived from the wire, bypassing the
// peer's filter and faults. A zero Src becomes the peer's address and port, a zero Dst m's. The
// ICRC is computed for that encapsulation unless raw is true, in which case Buf is delivered
// byte for byte (to test ICRC and framing drops). Injected packets do not count as sent by the
// peer. It returns the number delivered and the first error (as Send).
func (m *MemLink) Inject(raw bool, pkts ...Packet) (int, error) {
	q := m.in
	q.mu.Lock()
	n, err := m.peer.injectLocked(q, pkts, raw)
	q.mu.Unlock()
	if n > 0 {
		q.wake()
	}
	return n, err
}

func (m *MemLink) injectLocked(q *memQueue, pkts []Packet, raw bool) (int, error) {
	return m.sendLocked(q, pkts, raw, false)
}

// sendLocked sends pkts from m into q (the peer's receive queue). With faults false (Inject) the
// filter and faults are skipped and nothing is counted on m.
func (m *MemLink) sendLocked(q *memQueue, pkts []Packet, raw, faults bool) (int, error) {
	for i := range pkts {
		p := &pkts[i]
		if err := p.checkSend(false); err != nil {
			return i, err
		}
		src := m.addr
		if a := p.Src.Addr().Unmap(); a.IsValid() {
			src = netip.AddrPortFrom(a, m.addr.Port())
		}
		if !faults && p.Src.IsValid() {
			src = p.Src
		}
		dst := p.Dst
		if !faults && !dst.IsValid() {
			dst = m.peer.addr
		}
		if !dst.Addr().IsValid() || dst.Addr().Unmap().Is4() != src.Addr().Unmap().Is4() {
			return i, ErrAddress
		}
		var id uint16
		if q.rxeIDs {
			q.ipid++
			id = q.ipid
		}
		e := wire.Encap{Src: src, Dst: dst, TrafficClass: p.TrafficClass, IPv4ID: id}
		if !raw {
			e.PutICRC(p.Buf)
		}
		if faults {
			m.ctr.txPackets.Add(1)
			m.ctr.txBytes.Add(uint64(len(p.Buf)))
		}
		if q.closed {
			continue
		}
		s, ok := q.getSlot()
		if !ok {
			m.peer.ctr.rxQueue.Add(1)
			continue
		}
		sl := &q.slots[s]
		sl.src, sl.dst, sl.tc, sl.n = src, dst, p.TrafficClass, len(p.Buf)
		copy(sl.buf, p.Buf)
		if !faults {
			q.deliver(s)
			continue
		}
		if q.filter != nil {
			fp := Packet{Src: src, Dst: dst, TrafficClass: p.TrafficClass, Buf: sl.buf[:sl.n]}
			if q.filter(&fp) == Drop {
				q.fstats.Filtered++
				q.putSlot(s)
				continue
			}
			e.PutICRC(sl.buf[:sl.n])
		}
		f := &q.faults
		rDrop, rCorrupt, rDup, rReorder, rDelay := q.rng.Float64(), q.rng.Float64(), q.rng.Float64(), q.rng.Float64(), q.rng.Float64()
		if rDrop < f.Drop {
			q.fstats.Dropped++
			q.putSlot(s)
			continue
		}
		if rCorrupt < f.Corrupt {
			// Any byte but BTH byte 4 (masked by the ICRC); flip one bit.
			k := q.rng.IntN(sl.n - 1)
			if k >= 4 {
				k++
			}
			sl.buf[k] ^= 1 << q.rng.IntN(8)
			q.fstats.Corrupted++
		}
		switch {
		case rReorder < f.Reorder && len(q.held) < cap(q.held):
			q.fstats.Reordered++
			q.hold(s, uint64(f.ReorderDistance), 0)
		case rDelay < f.Delay && len(q.held) < cap(q.held):
			q.fstats.Delayed++
			if f.DelayTime > 0 {
				q.hold(s, 0, f.DelayTime)
			} else {
				q.hold(s, uint64(f.DelayPackets), 0)
			}
		default:
			q.deliver(s)
		}
		if rDup < f.Duplicate {
			if d, ok := q.getSlot(); ok {
				ds := &q.slots[d]
				ds.src, ds.dst, ds.tc, ds.n = sl.src, sl.dst, sl.tc, sl.n
				copy(ds.buf, sl.buf[:sl.n])
				q.fstats.Duplicated++
				q.deliver(d)
			} else {
				m.peer.ctr.rxQueue.Add(1)
			}
		}
	}
	return len(pkts), nil
}

func (q *memQueue) hold(s int32, after uint64, d time.Duration) {
	h := heldPkt{slot: s}
	if after > 0 {
		h.atCount = q.enq + after
		if q.holdTimeout > 0 {
			h.at, h.hasTime = time.Now().Add(q.holdTimeout), true
		}
	} else {
		h.at, h.hasTime = time.Now().Add(d), true
	}
	q.held = append(q.held, h)
}

// Recv implements Link.
func (m *MemLink) Recv(pkts []Packet) (int, error) {
	if ok, err := recvInto(pkts); !ok {
		return 0, err
	}
	m.recvMu.Lock()
	defer m.recvMu.Unlock()
	q := m.in
	for {
		if m.closed.Load() {
			return 0, net.ErrClosed
		}
		q.mu.Lock()
		next, timed := q.releaseExpired(time.Now())
		n := 0
		for n < len(pkts) && q.rLen > 0 {
			s := q.popReady()
			sl := &q.slots[s]
			p := &pkts[n]
			p.Src, p.Dst, p.TrafficClass = sl.src, sl.dst, sl.tc
			p.Buf = p.Buf[:sl.n]
			copy(p.Buf, sl.buf[:sl.n])
			q.putSlot(s)
			n++
		}
		q.mu.Unlock()
		// Verify outside the lock; compact the accepted packets to the front.
		k := 0
		for i := 0; i < n; i++ {
			p := &pkts[i]
			e := wire.Encap{Src: p.Src, Dst: p.Dst}
			if !m.ctr.checkRx(&e, p.Buf) {
				continue
			}
			if k != i {
				pkts[k], pkts[i] = pkts[i], pkts[k]
			}
			m.ctr.rxPackets.Add(1)
			m.ctr.rxBytes.Add(uint64(len(pkts[k].Buf)))
			k++
		}
		if k > 0 {
			return k, nil
		}
		if n > 0 {
			continue // all dropped; look again before waiting
		}
		var tc <-chan time.Time
		if timed {
			m.timer.Reset(max(time.Until(next), 0))
			tc = m.timer.C
		}
		select {
		case <-q.notify:
		case <-q.closedCh:
		case <-tc:
		}
		if timed {
			m.timer.Stop()
		}
	}
}
