// Package softroce is a pure-Go RoCEv2 RC engine implementing the transport API over a
// link.Link (UDP by default, an in-memory pipe in tests).
//
// Per QP, the engine follows the split of the Linux soft-RoCE driver rdma_rxe so that behaviour
// can be compared line of thought by line of thought: the requester (req.go, after rxe_req.c)
// turns send WRs into packets, the completer (comp.go, after rxe_comp.c) matches ACKs and read
// responses to WRs and drives go-back-N retries, and the responder (resp.go, after rxe_resp.c)
// checks and executes inbound requests and generates ACKs, NAKs and read responses.
//
// Concurrency: a device runs three goroutines: a receive loop (link.Recv, then responder and
// completer for each packet), a transmit loop (requester, read-response streaming, the
// retransmit and RNR timers) and a loopback loop that receives the packets the device sends to
// itself without the link, as rxe does (loop.go). All protocol state is guarded by one device mutex; link I/O
// happens outside it. Packet buffers, queue rings and the CQ are preallocated, so the steady
// state does not allocate per packet or per work request.
//
// To save goroutine handoffs at low queue depth, packets are also sent by whoever produced the
// work: PostSend builds and sends the first packets of its WRs from the caller's goroutine when
// the transmit loop does not have the QP (postInline packets at most), and the receive loop
// sends, at the end of each batch, the ACKs/NAKs, READ responses and requester packets its
// batch released (rxInline full-size packets at most; loopInline on the loopback path). The rest, retransmissions after timers
// and everything behind back-pressure stay with the transmit loop. Whoever builds packets does
// so under the device mutex and takes sendMu before releasing it, so packets reach the link in
// the order they were built (PSN order per QP) whichever goroutine sends them. CQ notifications
// raised by the receive loop are given after it releases the device mutex.
//
// Not implemented: atomics (compare-swap, fetch-add, ATOMIC_WRITE and FLUSH requests are NAKed
// with "invalid request", and atomic WRs are refused at post time), UD/UC QPs (but QP1, the GSI
// QP that carries CM MADs: qp1.go), SRQs, memory windows, alternate paths. Connection management
// (transport.ConnManager over the IB CM on QP1) is in cmapi.go.
//
// Deviations from rxe, on purpose: a failed remote invalidate (SEND_WITH_INV naming a key
// that is not in force) is answered with NAK invalid request (rxe sends a positive ACK and
// then stalls); READ responses are streamed by the transmit loop, so a later WRITE or SEND on
// the same QP may execute before the earlier READ's responses have all been read from memory
// (rxe executes strictly in order); CNPs (opcode 0x81) are accepted and counted (rxe drops
// them); as requester, a gap in READ responses re-requests the rest at once instead of waiting
// for the local ACK timeout, and a positive ACK covering a READ whose responses were not seen
// is an implied NAK (rxe would complete the READ without its data); completing a WQE through a
// coalesced ACK also acknowledges its PSNs (comp.psn moves past it).
package softroce

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// Config configures a device.
type Config struct {
	// Name is the device name (default "softroce0").
	Name string
	// Link carries the packets; required. The device closes it on Close.
	Link link.Link
	// Addrs are the device's addresses (its GIDs, in order). Default: the link's local address
	// and port (LocalAddrPort, if the link has it).
	Addrs []netip.AddrPort
	// Logger receives the device's logs (nil: none).
	Logger *zap.Logger
	// MTU is the largest path MTU the device offers when it dials (the port's active MTU;
	// default 4096). The offer is also capped by the MTU of the network interface holding the
	// local address, as the kernel does for rxe (iboe_get_mtu: the interface MTU less 96 bytes
	// of headers), so that a 1500-byte Ethernet link gets 1024 and loopback 4096; an address
	// on no interface (an in-memory link) gets 1024.
	MTU transport.MTU
	// NoLoopback sends packets addressed to the device itself (a QP connected to another QP of
	// the same device, an initiator and a target in one process) through the link like any
	// other, instead of handing them to the device's own receive path (loop.go). Set it to see
	// such traffic in a capture of the link.
	NoLoopback bool
	// Queues are more receive queues, for a multi-queue device (group.go): links bound to
	// Link's address and port whose kernel steers every packet to the queue of its
	// destination QP (link.ListenUDPQueues; Link is queue 0). Each queue is a device of its
	// own, with its goroutines, its lock and its QPs, sharing the others' memory.
	Queues []link.Link
	// KeepICRC computes and checks the ICRC of every packet, also with an srpd peer. Without
	// it, a device whose link can waive the ICRC (link.ICRCWaiver: UDP, covered by the UDP
	// checksum) offers an srpd peer to leave it out in both directions (CM ECE, cmapi.go), which
	// saves a CRC-32 of every byte at both ends; kernel peers never see the offer. Set it to read
	// srpd-to-srpd traffic with a decoder that checks ICRCs (tshark).
	KeepICRC bool
	// Limits; zero values select the defaults shown.
	MaxQP      int // 1024
	MaxMR      int // 65536
	MaxMRPages int // 512 pages per fast-reg MR
	MaxQPWR    int // 16384
	MaxSGE     int // 32
	MaxInline  int // 256
	MaxCQE     int // 1 << 20
	MaxRdAtom  int // 128 (max_qp_rd_atom and max_qp_init_rd_atom)
}

// Device implements transport.Device.
type Device struct {
	name  string
	log   *zap.Logger
	debug bool
	lnk   link.Link
	// waiver: the link accepts packets without ICRC for the QPs in waived (ICRCWaiver, unless
	// Config.KeepICRC); the offer our CM makes to srpd peers.
	waiver bool
	waived sync.Map // uint32 QPN → struct{}: QPs whose srpd peer sends without ICRC
	attr   transport.DeviceAttr
	addrs  []netip.AddrPort
	gids   []transport.GID
	port   uint16
	cm     *cmState // connection management over QP1 (qp1.go, cmapi.go)
	// grp is the multi-queue device the device is queue qidx of nq (group.go); nil, 0, 0
	// for a device of one queue.
	grp      *group
	qidx, nq int

	mu sync.Mutex
	// rxMu makes the receive paths (the link's receive loop, the loopback loop) take turns
	// processing batches; taken before mu.
	rxMu sync.Mutex
	// loop short-circuits packets addressed to the device itself (loop.go).
	loop loopback
	// sendMu orders link sends as packets were built: a goroutine takes it before releasing mu
	// and holds it until its Send returns, so a later-built packet never overtakes.
	sendMu  sync.Mutex
	closing bool // no new posts
	closed  bool
	mrs     []*mr // index → MR; [0] always nil
	freeMR  []uint32
	qps     map[uint32]*qp
	nextQPN uint32
	npd     int
	ncq     int
	// transmit scheduling
	ready   []*qp // QPs with requester or read-response work
	touched []*qp // QPs with control packets or transmit work pending at the end of an rx batch
	// inBatch is set while a receive path processes a batch: schedule then only notes the QP
	// (touched, wantTx), and the receive loop sends what it can itself at the end of the batch
	// instead of waking the transmit loop.
	inBatch bool
	// rxHolds is set while the receive loop holds mu: CQ notifications wait in notifyCQs
	// until it releases mu (rxNotify), so that a woken consumer does not block on mu at once.
	rxHolds   bool
	notifyCQs []*cq
	// rxSending is set while the receive loop runs completion handlers (rxHandle) and holds
	// back its batch rxPend, to which posters add what they build (into rxSpare); the
	// transmit loop waits meanwhile (txDeferred) and is woken after.
	rxSending  bool
	txDeferred bool
	rxPend     []link.Packet
	rxSpare    [][]byte
	// hOwed are CQs with a handler that got completions from posts while rxSending: rxHandle
	// runs their handlers again before it ends.
	hOwed, hRun []*cq
	// txHolds is set while the transmit loop holds sendMu (PostSend then leaves its packets
	// to the transmit loop rather than wait for a long batch).
	txHolds atomic.Bool
	// Buffers for packets built by a posting goroutine (PostSend sends from the caller when
	// the transmit path is idle); they belong to whoever holds sendMu.
	postBufs [][]byte
	postPkts []link.Packet
	// held are the packets of posts made inside BeginPosts/EndPosts brackets (postbatch.go).
	held     heldPosts
	deadline time.Time
	// ms is the device memory (the group's, for a queue of a multi-queue device), with what
	// payloads by reference on the link need of it (linkref.go).
	ms *memSpace
	// copyPayloads turns payloads by reference off (benchmarks compare).
	copyPayloads bool
	kick         chan struct{}
	done         chan struct{}
	wg           sync.WaitGroup

	stats counters
}

const (
	defaultName = "softroce0"
	// bufSize is the capacity of every packet buffer.
	bufSize = link.MaxPacket
)

// Open creates a device over cfg.Link and starts its goroutines; with Config.Queues, a
// multi-queue device (group.go), of which the returned device is queue 0.
func Open(cfg Config) (*Device, error) {
	if len(cfg.Queues) > 0 {
		return openGroup(cfg)
	}
	d, err := newDevice(cfg, nil, 0)
	if err != nil {
		return nil, err
	}
	d.start()
	return d, nil
}

// newDevice builds a device, queue qidx of g when g is not nil, without starting it.
func newDevice(cfg Config, g *group, qidx int) (*Device, error) {
	if cfg.Link == nil {
		return nil, fmt.Errorf("softroce: no link: %w", transport.ErrInvalidArgument)
	}
	def := func(v, d int) int {
		if v <= 0 {
			return d
		}
		return v
	}
	d := &Device{
		name:    cfg.Name,
		log:     cfg.Logger,
		lnk:     cfg.Link,
		qps:     make(map[uint32]*qp),
		nextQPN: 0x11,
		kick:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		mrs:     make([]*mr, 1, 64),
	}
	if d.name == "" {
		d.name = defaultName
	}
	if g != nil {
		d.grp, d.qidx, d.nq = g, qidx, len(g.devs)
		d.ms = g.ms
	} else {
		d.ms = &memSpace{devs: []*Device{d}}
	}
	if w, ok := cfg.Link.(link.ICRCWaiver); ok && !cfg.KeepICRC {
		d.waiver = true
		w.WaiveICRC(d.icrcWaived)
	}
	d.postBufs = make([][]byte, postInline)
	backing := make([]byte, postInline*bufSize)
	for i := range d.postBufs {
		d.postBufs[i] = backing[i*bufSize : (i+1)*bufSize : (i+1)*bufSize]
	}
	d.postPkts = make([]link.Packet, 0, postInline)
	if d.log == nil {
		d.log = zap.NewNop()
	}
	d.log = d.log.With(zap.String("device", d.name))
	d.debug = d.log.Core().Enabled(zapcore.DebugLevel)
	rd := def(cfg.MaxRdAtom, 128)
	d.attr = transport.DeviceAttr{
		PageSize:        pageSize,
		PageSizeCap:     ^uint64(pageSize - 1), // any power of two ≥ 4096
		MaxMRSize:       1 << 40,
		MaxMRPages:      def(cfg.MaxMRPages, 512),
		MaxMR:           def(cfg.MaxMR, 65536),
		MaxPD:           1 << 16,
		MaxQP:           def(cfg.MaxQP, 1024),
		MaxQPWR:         def(cfg.MaxQPWR, 16384),
		MaxSGE:          def(cfg.MaxSGE, 32),
		MaxInlineData:   def(cfg.MaxInline, 256),
		MaxCQ:           1 << 16,
		MaxCQE:          def(cfg.MaxCQE, 1<<20),
		MaxQPRdAtom:     rd,
		MaxQPInitRdAtom: rd,
		MaxMsgSize:      1 << 31,
		MaxMTU:          transport.MTU4096,
		ActiveMTU:       transport.MTU4096,
		HostSGE:         true,
	}
	if cfg.MTU != 0 {
		if cfg.MTU.Bytes() == 0 {
			return nil, fmt.Errorf("softroce: MTU %d: %w", cfg.MTU, transport.ErrInvalidArgument)
		}
		d.attr.ActiveMTU = cfg.MTU
	}
	d.addrs = cfg.Addrs
	if len(d.addrs) == 0 {
		if lp, ok := cfg.Link.(interface{ LocalAddrPort() netip.AddrPort }); ok {
			d.addrs = []netip.AddrPort{lp.LocalAddrPort()}
		} else if a := cfg.Link.LocalAddr(); a.IsValid() {
			d.addrs = []netip.AddrPort{netip.AddrPortFrom(a, link.UDPPort)}
		}
	}
	for _, a := range d.addrs {
		d.gids = append(d.gids, transport.GIDFromAddr(a.Addr()))
	}
	if len(d.addrs) > 0 {
		d.port = d.addrs[0].Port()
	}
	d.log.Debug("device open", zap.Stringers("addrs", d.addrs))
	d.cm = newCMState(d)
	d.loop.init(cfg.NoLoopback)
	return d, nil
}

// start starts the device's goroutines.
func (d *Device) start() {
	d.wg.Add(3)
	go d.rxLoop()
	go d.txLoop()
	go d.loopLoop()
}

// Name implements transport.Device.
func (d *Device) Name() string { return d.name }

// Attr implements transport.Device.
func (d *Device) Attr() transport.DeviceAttr { return d.attr }

// GIDs implements transport.Device.
func (d *Device) GIDs() []transport.GID { return append([]transport.GID(nil), d.gids...) }

// Addrs implements transport.Device.
func (d *Device) Addrs() []netip.AddrPort { return append([]netip.AddrPort(nil), d.addrs...) }

// Stats returns a snapshot of the device's counters (a multi-queue device's queue 0: the sum
// over its queues; QueueStats has each).
func (d *Device) Stats() Stats {
	if d.leads() {
		return d.groupStats()
	}
	return d.queueStats()
}

// queueStats is Stats for the device alone.
func (d *Device) queueStats() Stats {
	s := d.stats.snapshot()
	ls := d.lnk.Stats()
	s.ICRCDrops = ls.RxICRCDrops
	s.LinkDrops = ls.RxMalformedDrops + ls.RxQueueDrops
	s.BusyPolls, s.BusyPollHits, s.BusyPollSkips = ls.RxBusyPolls, ls.RxBusyPollHits, ls.RxBusyPollSkips
	s.ICRCWaived = ls.RxICRCWaived
	return s
}

// isLocal reports whether a is one of the device's IP addresses.
func (d *Device) isLocal(a netip.Addr) bool {
	for _, x := range d.addrs {
		if x.Addr().Unmap() == a.Unmap() {
			return true
		}
	}
	// A wildcard-bound link answers on every address.
	return len(d.addrs) == 0 || (len(d.addrs) == 1 && d.addrs[0].Addr().IsUnspecified())
}

// AllocMemory implements transport.Device.
func (d *Device) AllocMemory(n int) (transport.Memory, error) {
	if n <= 0 {
		return nil, fmt.Errorf("alloc memory of %d bytes: %w", n, transport.ErrInvalidArgument)
	}
	n = (n + pageSize - 1) &^ (pageSize - 1)
	buf, err := mmapAnon(n)
	if err != nil {
		return nil, fmt.Errorf("alloc memory: mmap %d bytes: %w", n, err)
	}
	r := &region{ms: d.ms, buf: buf}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		_ = unix.Munmap(buf)
		return nil, transport.ErrClosed
	}
	d.ms.lock()
	d.ms.mm.add(r)
	d.ms.unlock()
	d.mu.Unlock()
	return memory{r}, nil
}

// AllocPD implements transport.Device.
func (d *Device) AllocPD() (transport.PD, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, transport.ErrClosed
	}
	if d.npd >= d.attr.MaxPD {
		return nil, transport.ErrNoResources
	}
	d.npd++
	return &pd{dev: d}, nil
}

// Close implements transport.PD.
func (p *pd) Close() error {
	d := p.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.closed {
		return transport.ErrClosed
	}
	if p.nMR > 0 || p.nQP > 0 {
		return fmt.Errorf("close PD with %d MRs and %d QPs: %w", p.nMR, p.nQP, transport.ErrBusy)
	}
	p.closed = true
	d.npd--
	return nil
}

// CreateCQ implements transport.Device.
func (d *Device) CreateCQ(entries int) (transport.CQ, error) {
	if entries <= 0 || entries > d.attr.MaxCQE {
		return nil, fmt.Errorf("create CQ of %d entries: %w", entries, transport.ErrInvalidArgument)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, transport.ErrClosed
	}
	if d.ncq >= d.attr.MaxCQ {
		return nil, transport.ErrNoResources
	}
	d.ncq++
	c := &cq{dev: d}
	c.q.Init(entries)
	return c, nil
}

// Close implements transport.Device: no new work is accepted; outstanding send work and queued
// CM MADs (a DREQ sent just before Close) are given until ctx is done to complete (drain); then
// every QP moves to ERR (flushing what remains), the link is closed and both goroutines exit.
// It returns ctx's error if the drain was cut short. Queue 0 of a multi-queue device closes
// every queue; the other queues close only with it.
func (d *Device) Close(ctx context.Context) error {
	switch {
	case d.leads():
		return d.closeGroup(ctx)
	case d.grp != nil:
		return fmt.Errorf("close %s: a queue closes with its device (queue 0): %w", d.name, transport.ErrInvalidArgument)
	}
	return d.closeQueue(ctx)
}

// closeQueue is Close for the device alone.
func (d *Device) closeQueue(ctx context.Context) error {
	d.mu.Lock()
	if d.closing {
		d.mu.Unlock()
		return transport.ErrClosed
	}
	d.closing = true
	d.mu.Unlock()

	var drainErr error
	tick := time.NewTicker(time.Millisecond)
drain:
	for !d.drained() {
		select {
		case <-ctx.Done():
			drainErr = ctx.Err()
			break drain
		case <-tick.C:
		}
	}
	tick.Stop()

	d.mu.Lock()
	for _, q := range d.qps {
		q.toError()
	}
	d.closed = true
	d.mu.Unlock()
	close(d.done)
	// A batch handed to the link just before (the loops hold sendMu across Send) is sent
	// before the link closes.
	d.sendMu.Lock()
	d.sendMu.Unlock() //nolint:staticcheck // a barrier
	err := d.lnk.Close()
	d.wg.Wait()
	d.mu.Lock()
	d.ms.lock()
	d.ms.closed++
	d.ms.reapDead()
	d.ms.unlock()
	d.mu.Unlock()
	if drainErr != nil {
		return fmt.Errorf("close %s: drain: %w", d.name, drainErr)
	}
	if err != nil {
		return fmt.Errorf("close %s: link: %w", d.name, err)
	}
	return nil
}

// drained reports whether no QP has outstanding send work or read responses to stream.
func (d *Device) drained() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, q := range d.qps {
		if q.state != transport.QPSRTS && q.state != transport.QPSSQD {
			continue
		}
		if q.sqHead != q.sqTail || q.resp.nstream > 0 || q.ctl.pending {
			return false
		}
	}
	return len(d.cm.txq) == 0
}

// schedule puts q on the transmit loop's ready list and wakes it. During a receive batch the
// QP is only noted: the receive loop serves it at the end of the batch (rxFlush). dev.mu held.
func (d *Device) schedule(q *qp) {
	if q.inReady {
		return // the transmit loop has it and has been woken (it empties ready before sleeping)
	}
	if d.inBatch {
		q.wantTx = true
		d.touch(q)
		return
	}
	q.inReady = true
	d.ready = append(d.ready, q)
	d.wake()
}

func (d *Device) wake() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// armTimer records that q has a deadline at t. dev.mu held.
func (d *Device) armTimer(t time.Time) {
	if d.deadline.IsZero() || t.Before(d.deadline) {
		d.deadline = t
		d.wake()
	}
}

// send hands packets to the link, counting them (those to the device itself to its loopback
// queue).
func (d *Device) send(pkts []link.Packet) { d.sendFrom(pkts, nil) }

// sendFrom is send for packets built into the full-size buffers of pool, which the caller owns
// and reuses only after this call: the loopback queue may take such a buffer instead of copying
// the packet, and puts one of its own free buffers in its place in pool.
func (d *Device) sendFrom(pkts []link.Packet, pool [][]byte) {
	if d.loop.on {
		pkts = d.loopSend(pkts, pool)
	}
	if refs := d.countRefs(pkts); refs > 0 {
		defer d.sentRefs(refs)
	}
	for len(pkts) > 0 {
		n, err := d.lnk.Send(pkts)
		var bytes, refs, refBytes uint64
		for i := 0; i < n; i++ {
			bytes += uint64(pkts[i].Len())
			if k := len(pkts[i].Payload); k > 0 {
				refs++
				refBytes += uint64(k)
			}
		}
		d.stats.txPackets.Add(uint64(n))
		d.stats.txBytes.Add(bytes)
		if refs > 0 {
			d.stats.txRefPackets.Add(refs)
			d.stats.txRefBytes.Add(refBytes)
		}
		if err == nil {
			return
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
		// Skip the packet the link refused (it is lost, as on a network) and go on.
		d.stats.dropped.Add(1)
		if d.debug {
			d.log.Debug("link send", zap.Error(err))
		}
		pkts = pkts[n+1:]
	}
}

// rxBufs are the preallocated buffers of one receive path: the link's receive loop and the
// loopback loop (loop.go) each have their own.
type rxBufs struct {
	rx      []link.Packet // received packets (full-size buffers)
	ctl     []link.Packet // what a batch sends at its end
	ctlBufs [][]byte      // ACK/NAK buffers
	big     [][]byte      // full-size buffers for READ responses and requester packets
	// refs (the loopback path only) are the payload references of the packets in rx
	// (loopref.go); nil on the link's path, whose packets carry their payload.
	refs []loopRef
}

func newRxBufs(bs, nbig int, refs bool) *rxBufs {
	b := &rxBufs{
		rx:      make([]link.Packet, bs),
		ctl:     make([]link.Packet, 0, 2*bs+nbig),
		ctlBufs: make([][]byte, 2*bs),
		big:     make([][]byte, nbig),
	}
	if refs {
		b.refs = make([]loopRef, bs)
	}
	for i := range b.rx {
		b.rx[i].Buf = make([]byte, bufSize)
	}
	for i := range b.ctlBufs {
		b.ctlBufs[i] = make([]byte, 64)
	}
	backing := make([]byte, nbig*bufSize)
	for i := range b.big {
		b.big[i] = backing[i*bufSize : (i+1)*bufSize : (i+1)*bufSize]
	}
	return b
}

func (d *Device) rxLoop() {
	defer d.wg.Done()
	bs := d.lnk.BatchSize()
	if bs <= 0 {
		bs = 32
	}
	b := newRxBufs(bs, rxInline, false)
	// A link that can hand out views of its receive memory (UDP with GRO) saves a copy of
	// every received byte; the views are used up within the batch (rxBatch keeps nothing).
	recv := d.lnk.Recv
	if vr, ok := d.lnk.(link.ViewReceiver); ok {
		recv = vr.RecvViews
	}
	own := make([][]byte, len(b.rx))
	for i := range b.rx {
		own[i] = b.rx[i].Buf[:cap(b.rx[i].Buf)]
	}
	for {
		for i := range b.rx {
			b.rx[i].Buf = own[i]
		}
		n, err := recv(b.rx)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			select {
			case <-d.done:
				return
			default:
			}
			d.log.Warn("link receive", zap.Error(err))
			time.Sleep(time.Millisecond)
			continue
		}
		var bytes uint64
		for i := 0; i < n; i++ {
			bytes += uint64(len(b.rx[i].Buf))
		}
		d.stats.rxPackets.Add(uint64(n))
		d.stats.rxBytes.Add(bytes)
		if !d.rxBatch(b, n) {
			return
		}
	}
}

// rxBatch processes the n packets in b.rx: responder and completer for each under the device
// mutex, then the packets the batch owes (rxFlush) and the CQ notifications and completion
// handlers (rxHandle). Receive paths take turns (rxMu): the batch state below belongs to one
// batch at a time. It returns false once the device is closed.
func (d *Device) rxBatch(b *rxBufs, n int) bool {
	d.rxMu.Lock()
	defer d.rxMu.Unlock()
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return false
	}
	now := time.Now()
	d.rxHolds, d.inBatch = true, true
	for i := 0; i < n; i++ {
		var ref *loopRef
		if b.refs != nil {
			ref = &b.refs[i]
		}
		d.input(&b.rx[i], ref, now)
	}
	d.inBatch = false
	ctl, nbig := d.rxFlush(b.ctl[:0], b.ctlBufs, b.big, now)
	ctl = d.cmTx(ctl)
	d.rxHolds = false
	if d.handlersOwed() {
		var held []link.Packet
		var locked bool
		ctl, held, locked = d.rxHandle(ctl, b.big[nbig:])
		if locked {
			d.sendTaken(held, ctl, b.big)
			d.sendMu.Unlock()
			clear(ctl)
			b.ctl = ctl[:0]
		}
		return true
	}
	if len(ctl) == 0 && !d.heldToFlush() {
		d.mu.Unlock()
		d.rxNotify()
		return true
	}
	d.sendMu.Lock()
	held := d.held.take() // built before ctl: they go first
	d.mu.Unlock()
	d.rxNotify()
	d.sendTaken(held, ctl, b.big)
	d.sendMu.Unlock()
	clear(ctl) // drop references to buffers' views
	b.ctl = ctl[:0]
	return true
}

// handlersOwed reports whether a CQ notified by the last receive batch has a completion
// handler. dev.mu held.
func (d *Device) handlersOwed() bool {
	for _, c := range d.notifyCQs {
		if c.handler.Load() != nil {
			return true
		}
	}
	return false
}

// rxHandle runs the completion handlers (and gives the other notifications) owed by the last
// receive batch, with the packets the batch produced (ctl, not sent yet) held back so that
// what the handlers post joins them: a responder's ACK and the reply its consumer posts leave
// in one link send. While the handlers run (rxSending), nothing else sends: PostSend builds
// into the batch (the free full-size buffers in spare) or leaves its QP to the transmit loop,
// and the transmit loop waits, so packets still reach the link in the order they were built.
// Called with dev.mu held; returns with it released and, when there is something to send
// (locked), with sendMu held: the packets held by post brackets (postbatch.go), to be sent
// first, and ctl.
func (d *Device) rxHandle(ctl []link.Packet, spare [][]byte) (_, held []link.Packet, locked bool) {
	d.rxSending, d.rxPend, d.rxSpare = true, ctl, spare
	d.mu.Unlock()
	for i, c := range d.notifyCQs {
		d.notifyCQs[i] = nil
		c.deferred = false
		if h := c.handler.Load(); h == nil || !(*h)() {
			c.q.Wake()
		}
	}
	d.notifyCQs = d.notifyCQs[:0]
	d.mu.Lock()
	for round := 0; len(d.hOwed) > 0; round++ {
		d.hRun, d.hOwed = d.hOwed, d.hRun[:0]
		for _, c := range d.hRun {
			c.owedH = false
		}
		d.mu.Unlock()
		for i, c := range d.hRun {
			d.hRun[i] = nil
			// A bounded number of rounds: a handler whose every run posts something that
			// completes at once is left to its consumer's goroutine.
			if h := c.handler.Load(); round >= handlerRounds || h == nil || !(*h)() {
				c.q.Wake()
			}
		}
		d.mu.Lock()
	}
	ctl = d.rxPend
	d.rxSending, d.rxPend, d.rxSpare = false, nil, nil
	if d.txDeferred {
		d.txDeferred = false
		d.wake()
	}
	if locked = len(ctl) > 0 || d.heldToFlush(); locked {
		d.sendMu.Lock()
		held = d.held.take()
	}
	d.mu.Unlock()
	return ctl, held, locked
}

// rxNotify gives the CQ notifications owed by the last receive batch. Only the receive loop
// touches notifyCQs (under mu while rxHolds, then here after releasing it).
func (d *Device) rxNotify() {
	for i, c := range d.notifyCQs {
		d.notifyCQs[i] = nil
		c.deferred = false
		c.q.Wake()
	}
	d.notifyCQs = d.notifyCQs[:0]
}

const (
	// handlerRounds bounds the extra rounds of completion handlers rxHandle runs for
	// completions that their posts added (hOwed).
	handlerRounds = 4
	// rxInline is the number of full-size packets the link's receive loop builds itself at the
	// end of a batch (READ responses, requester packets released by ACKs, what completion
	// handlers post); more is left to the transmit loop. 512 holds the RDMA WRITEs and SENDs
	// of a batch of several 128 KiB commands at MTU 4096 (and four QPs' full windows of 128
	// PSNs), so that a target answers a batch without waking the transmit loop: waking it is a
	// context switch between threads, which costs more CPU than building the packets when the
	// peer is another process competing for the same CPUs (bench.sh nbd, ours-2proc, against
	// 40: 4 KiB random reads at QD32 +45 %, target CPU per I/O 13.5 → 7.5 µs; 128 KiB
	// sequential reads at QD32 +19 %). The buffers are allocated once; pages never used stay
	// untouched.
	rxInline = 512
	// loopInline is rxInline for the loopback loop (loop.go). There both ends of a connection
	// are this process, whose other CPU the transmit loop puts to work in parallel: handing the
	// rest of a batch over pays (bench.sh nbd, ours, 512 against 40: 4 KiB random reads at QD32
	// -16 %). 40 holds a 128 KiB RDMA WRITE or READ response and the SEND behind it.
	loopInline = 40
	// postInline is the number of packets PostSend builds and sends from the caller's goroutine;
	// the rest of a longer message is left to the transmit loop.
	postInline = 8
)

// rxFlush builds the packets owed at the end of a receive batch: for every QP touched, its
// pending ACK/NAK (into a small buffer of ctlBufs) or, when it has requester or read-response
// work, up to the budget of full-size buffers big; whatever does not fit goes to the transmit
// loop. A QP the transmit loop already has keeps it (it sends control packets behind read
// responses, in order). dev.mu held; the caller sends the packets under sendMu.
func (d *Device) rxFlush(pkts []link.Packet, ctlBufs, big [][]byte, now time.Time) ([]link.Packet, int) {
	nctl, nbig := 0, 0
	for _, q := range d.touched {
		q.inTouched = false
		want := q.wantTx
		q.wantTx = false
		switch {
		case q.resp.nstream == 0 && (!want || q.inReady):
			if !q.ctl.pending {
				continue
			}
			if nctl < len(ctlBufs) {
				pkts = append(pkts, q.buildCtl(ctlBufs[nctl]))
				nctl++
			} else {
				d.schedule(q)
			}
		case q.inReady:
			// The transmit loop streams q's read responses; it sends the ACK/NAK after them.
		case nbig < len(big):
			before := len(pkts)
			var more bool
			pkts, more = q.work(pkts, big[nbig:], now)
			nbig += len(pkts) - before
			if more {
				d.schedule(q)
			}
		default:
			d.schedule(q)
		}
	}
	clear(d.touched)
	d.touched = d.touched[:0]
	return pkts, nbig
}

// txBatch is the number of packets the transmit loop builds before handing them to the link.
const txBatch = 64

func (d *Device) txLoop() {
	defer d.wg.Done()
	bs := d.lnk.BatchSize()
	if bs <= 0 || bs > txBatch {
		bs = txBatch
	}
	bufs := make([][]byte, bs)
	for i := range bufs {
		bufs[i] = make([]byte, bufSize)
	}
	pkts := make([]link.Packet, 0, bs)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			return
		}
		now := time.Now()
		if !d.deadline.IsZero() && !now.Before(d.deadline) {
			d.fireTimers(now)
		}
		if d.rxSending {
			// The receive loop's handlers are running and it sends last (rxHandle).
			d.txDeferred = true
			d.mu.Unlock()
			select {
			case <-d.kick:
			case <-d.done:
				return
			}
			continue
		}
		if d.ms.deadN.Load() > 0 {
			d.ms.reap()
		}
		pkts = d.transmit(pkts[:0], bufs, now)
		pkts = d.cmTx(pkts)
		deadline := d.deadline
		if len(pkts) > 0 || d.heldToFlush() {
			d.sendMu.Lock()
			d.txHolds.Store(true)
			held := d.held.take() // built before pkts: they go first
			d.mu.Unlock()
			d.sendTaken(held, pkts, nil)
			d.txHolds.Store(false)
			d.sendMu.Unlock()
			clear(pkts) // drop references to buffers' views
			continue
		}
		d.mu.Unlock()
		wait := time.Hour
		if !deadline.IsZero() {
			wait = time.Until(deadline)
			if wait <= 0 {
				continue
			}
		}
		timer.Reset(wait)
		select {
		case <-d.kick:
		case <-timer.C:
		case <-d.done:
			return
		}
	}
}

// transmit fills pkts (up to len(bufs)) from the ready QPs, round robin. dev.mu held.
func (d *Device) transmit(pkts []link.Packet, bufs [][]byte, now time.Time) []link.Packet {
	for len(d.ready) > 0 && len(pkts) < len(bufs) {
		q := d.ready[0]
		copy(d.ready, d.ready[1:])
		d.ready[len(d.ready)-1] = nil
		d.ready = d.ready[:len(d.ready)-1]
		q.inReady = false
		more := false
		pkts, more = q.work(pkts, bufs[len(pkts):], now)
		if more {
			q.inReady = true
			d.ready = append(d.ready, q)
		}
	}
	return pkts
}

// fireTimers runs expired QP timers and recomputes the next deadline. dev.mu held.
func (d *Device) fireTimers(now time.Time) {
	d.deadline = time.Time{}
	for _, q := range d.qps {
		q.checkTimers(now)
		for _, t := range [2]time.Time{q.retransAt, q.rnrAt} {
			if !t.IsZero() && (d.deadline.IsZero() || t.Before(d.deadline)) {
				d.deadline = t
			}
		}
	}
	d.cmTimers(now)
}

// input dispatches one received packet (rxe_rcv + hdr_check). ref, for a packet of the
// loopback queue, may say where its payload is (loopref.go); nil for a packet from the link.
// dev.mu held.
func (d *Device) input(pk *link.Packet, ref *loopRef, now time.Time) {
	p, err := wire.Parse(pk.Buf)
	if err != nil {
		d.stats.dropped.Add(1)
		return
	}
	// src is the payload, in pieces: the packet's own, or, for a loop packet carried by
	// reference, its bytes resolved now, under dev.mu (Memory.Free unmaps under it too),
	// before anything looks at the packet.
	var srcBuf [maxRefSegs][]byte
	src := srcBuf[:1]
	if ref != nil && ref.n > 0 {
		src = srcBuf[:ref.n]
		if !d.resolveRef(ref, src) {
			d.stats.loopRefDrops.Add(1)
			d.stats.dropped.Add(1)
			return
		}
	} else {
		srcBuf[0] = p.Payload()
	}
	bth := p.BTH()
	op := p.Opcode()
	if op == wire.CNP {
		d.stats.cnps.Add(1)
		return
	}
	if op.Transport() == wire.TransportUD {
		d.cmInput(pk, p, now) // QP1: CM MADs
		return
	}
	if op.Transport() != wire.TransportRC {
		d.stats.dropped.Add(1) // UC/RD: no such QPs
		return
	}
	if !pkeyMatch(bth.PKey()) {
		d.stats.dropped.Add(1)
		return
	}
	q := d.qps[bth.DestQP()]
	if q == nil {
		if d.grp != nil {
			if o := link.QueueOf(bth.DestQP(), d.nq); o != d.qidx {
				d.forward(o, pk) // another queue's QP (a GRO super-packet of mixed QPs)
				return
			}
		}
		d.stats.dropped.Add(1)
		return
	}
	// rxe: RC packets must come from the QP's DGID and go to its SGID.
	if pk.Src.Addr().Unmap() != q.av.DstAddr.Unmap() ||
		(pk.Dst.Addr().IsValid() && !pk.Dst.Addr().IsUnspecified() && pk.Dst.Addr().Unmap() != q.av.SrcAddr.Unmap()) {
		d.stats.dropped.Add(1)
		return
	}
	if op.Is(wire.Request) {
		if q.state != transport.QPSRTR && q.state != transport.QPSRTS && q.state != transport.QPSSQD {
			d.stats.dropped.Add(1)
			return
		}
		d.cmCommEst(q, now) // first packet of a connection whose RTU is outstanding
		q.respond(p, src, now)
		return
	}
	if op.Is(wire.Response) {
		if q.state != transport.QPSRTS && q.state != transport.QPSSQD {
			d.stats.dropped.Add(1)
			return
		}
		q.complete(p, src, now)
		return
	}
	d.stats.dropped.Add(1)
}

// pkeyMatch is rxe's pkey_match against the default P_Key 0xFFFF: equal low 15 bits, and at
// least one of the two a full member (ours always is).
func pkeyMatch(k uint16) bool { return k&0x7FFF == 0x7FFF }

// touch records that q has a control packet to send at the end of the rx batch. dev.mu held.
func (d *Device) touch(q *qp) {
	if !q.inTouched {
		q.inTouched = true
		d.touched = append(d.touched, q)
	}
}

// icrcWaived is the link's ICRCWaiver predicate: QP qpn negotiated packets without ICRC.
// On a multi-queue device a queue may receive another queue's packet (a GRO super-packet is
// steered by its first segment): the QP's own queue knows.
func (d *Device) icrcWaived(qpn uint32) bool {
	if d.grp != nil {
		d = d.grp.devs[link.QueueOf(qpn, d.nq)]
	}
	_, ok := d.waived.Load(qpn)
	return ok
}
