package softroce

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/cm"
	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// QP1 (the GSI QP) and the engine side of connection management.
//
// The device owns one cm.Manager (the pure IB CM / RDMA CM state machine) and drives it as the
// integration note of package cm prescribes: under the device mutex, from the receive loop
// (MADs arriving on QP1, first RC packet of a QP whose RTU is outstanding), from the transmit
// loop's timer (Manager.Expire) and from the ConnManager API (cmapi.go). Each call's Outputs are
// processed at once, in order: QP Modify steps applied to the QPs, MADs queued for the link as
// UD SEND_ONLY packets to QP1 (sent by whichever loop runs next, in order), events delivered to
// the ULP through buffered channels that never block the engine.
//
// UDP ports. A MAD (and an RC QP's packets) go to UDP 4791 of the peer unless the peer's port
// is known to differ, which only happens when several softroce devices share a host on
// ephemeral ports (tests): SetPeerUDPPort names it explicitly; otherwise a device that itself
// is not on 4791 answers each peer at the source port its MADs came from. A device on 4791
// always answers 4791: the kernel (rxe) sends its MADs from a flow-hash source port (0xC000 |
// hash, e.g. 55410 in the reference capture) and listens on 4791 only.

// CMStats counts QP1 traffic.
type CMStats struct {
	RxMADs      uint64 // valid MADs handed to the connection manager
	RxMalformed uint64 // MADs the manager could not parse (wrong class, version, attribute, ...)
	RxDropped   uint64 // UD packets dropped before the manager: not SEND_ONLY to QP1, bad length or address
	RxBadPKey   uint64 // UD packets with a P_Key other than 0xFFFF (rxe: bad_pkey_cntr)
	RxBadQKey   uint64 // QP1 packets with a DETH Q_Key other than 0x80010000 (rxe: qkey_viol_cntr)
	TxMADs      uint64 // MADs queued for the link
}

type cmCounters struct {
	rxMADs, rxMalformed, rxDropped, rxBadPKey, rxBadQKey, txMADs atomic.Uint64
}

// cmState is the device's connection-management state. Everything but the counters is guarded
// by dev.mu.
type cmState struct {
	dev   *Device
	mgr   *cm.Manager
	start time.Time // Manager time 0
	out   cm.Outputs

	listeners map[listenKey]*listener
	conns     map[cm.ConnID]*cmConn
	estWait   map[uint32]cm.ConnID // QPN → accepted connection waiting for its RTU

	peerPorts map[netip.Addr]uint16 // SetPeerUDPPort
	learned   map[netip.Addr]uint16 // source ports of MADs (only when the device is not on 4791)

	madPSN uint32        // QP1 send PSN
	txq    []link.Packet // MADs waiting for a loop to send them

	stats cmCounters
}

type listenKey struct {
	addr netip.Addr // invalid: wildcard
	port uint16
}

func mkListenKey(a netip.Addr, port uint16) listenKey {
	if !a.IsValid() || a.IsUnspecified() {
		return listenKey{port: port}
	}
	return listenKey{a.Unmap(), port}
}

// newCMState creates the connection-management state of d with the default cm.Config.
func newCMState(d *Device) *cmState {
	c := &cmState{
		dev:       d,
		start:     time.Now(),
		listeners: make(map[listenKey]*listener),
		conns:     make(map[cm.ConnID]*cmConn),
		estWait:   make(map[uint32]cm.ConnID),
		peerPorts: make(map[netip.Addr]uint16),
		learned:   make(map[netip.Addr]uint16),
	}
	var b [4]byte
	_, _ = crand.Read(b[:])
	c.madPSN = binary.BigEndian.Uint32(b[:]) & wire.PSNMask
	mgr, err := cm.NewManager(d.cmConfig(cm.Config{}))
	if err != nil {
		panic("softroce: cm.NewManager: " + err.Error()) // GUID is never 0
	}
	c.mgr = mgr
	return c
}

// cmConfig fills the device-dependent parts of a cm.Config: a GUID when none is given and the
// read/atomic clamps.
func (d *Device) cmConfig(cfg cm.Config) cm.Config {
	if cfg.GUID == 0 {
		cfg.GUID = randomGUID()
	}
	if cfg.MaxRdAtomic == 0 {
		cfg.MaxRdAtomic = uint8(min(d.attr.MaxQPRdAtom, 255))
	}
	if cfg.MaxDestRdAtomic == 0 {
		cfg.MaxDestRdAtomic = uint8(min(d.attr.MaxQPInitRdAtom, 255))
	}
	if d.grp != nil {
		// The queues are one CA to peers; each makes comm IDs of its own class (group.go).
		if cfg.GUID == 0 {
			cfg.GUID = d.grp.guid
		}
		cfg.CommIDMod, cfg.CommIDRem = uint32(d.nq), uint32(d.qidx)
	}
	return cfg
}

// randomGUID returns a modified EUI-64 built from a random, locally administered unicast MAC
// (the form rxe's node GUID has, which is derived from the netdev's MAC): mac[0..2] ff fe
// mac[3..5] with the universal/local bit inverted.
func randomGUID() uint64 {
	var mac [6]byte
	_, _ = crand.Read(mac[:])
	mac[0] = mac[0]&^0x01 | 0x02 // unicast, locally administered
	g := [8]byte{mac[0] ^ 0x02, mac[1], mac[2], 0xFF, 0xFE, mac[3], mac[4], mac[5]}
	return binary.BigEndian.Uint64(g[:])
}

// ConfigureCM replaces the connection manager's configuration (timeouts, retries, GUID, ...;
// zero fields take cm's defaults, GUID 0 a random locally administered EUI-64). It is only
// allowed while the device has no listener and no connection (ErrBusy otherwise), typically
// right after Open. On queue 0 of a multi-queue device it configures every queue.
func (d *Device) ConfigureCM(cfg cm.Config) error {
	for _, q := range d.members() {
		if err := q.configureCM(cfg); err != nil { // cmConfig gives the queues one GUID
			return err
		}
	}
	return nil
}

// configureCM is ConfigureCM for the device alone.
func (d *Device) configureCM(cfg cm.Config) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closing {
		return transport.ErrClosed
	}
	c := d.cm
	if len(c.listeners) > 0 || c.mgr.NumConns() > 0 {
		return fmt.Errorf("configure CM: %d listeners, %d connections: %w", len(c.listeners), c.mgr.NumConns(), transport.ErrBusy)
	}
	mgr, err := cm.NewManager(d.cmConfig(cfg))
	if err != nil {
		return fmt.Errorf("configure CM: %w", err)
	}
	c.mgr = mgr
	return nil
}

// CMConfig returns the connection manager's configuration in force.
func (d *Device) CMConfig() cm.Config {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cm.mgr.Config()
}

// SetPeerUDPPort records that the RoCEv2 peer at addr listens on UDP port instead of 4791 (a
// softroce extension for several devices on one host; see transport.AddressVector.DstPort).
// MADs and the RC packets of connections with that peer go there. Port 0 removes the entry.
// On queue 0 of a multi-queue device it applies to every queue.
func (d *Device) SetPeerUDPPort(addr netip.Addr, port uint16) {
	for _, q := range d.members() {
		q.setPeerUDPPort(addr, port)
	}
}

func (d *Device) setPeerUDPPort(addr netip.Addr, port uint16) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if port == 0 {
		delete(d.cm.peerPorts, addr.Unmap())
		return
	}
	d.cm.peerPorts[addr.Unmap()] = port
}

// CMStats returns a snapshot of the QP1 counters (queue 0 of a multi-queue device: the sum
// over its queues).
func (d *Device) CMStats() CMStats {
	var out CMStats
	for _, q := range d.members() {
		s := &q.cm.stats
		out.RxMADs += s.rxMADs.Load()
		out.RxMalformed += s.rxMalformed.Load()
		out.RxDropped += s.rxDropped.Load()
		out.RxBadPKey += s.rxBadPKey.Load()
		out.RxBadQKey += s.rxBadQKey.Load()
		out.TxMADs += s.txMADs.Load()
	}
	return out
}

// mnow converts an engine time to the Manager's clock.
func (c *cmState) mnow(t time.Time) time.Duration { return t.Sub(c.start) }

// peerPort is the UDP port of the peer at a. dev.mu held.
func (c *cmState) peerPort(a netip.Addr) uint16 {
	a = a.Unmap()
	if p, ok := c.peerPorts[a]; ok {
		return p
	}
	if p, ok := c.learned[a]; ok {
		return p
	}
	return link.UDPPort
}

// replyPort is the UDP port answers to a MAD from src go to. dev.mu held.
func (c *cmState) replyPort(src netip.AddrPort) uint16 {
	if p, ok := c.peerPorts[src.Addr().Unmap()]; ok {
		return p
	}
	if c.dev.port != link.UDPPort && src.Port() != 0 {
		return src.Port()
	}
	return link.UDPPort
}

// cmInput handles a UD packet (QP1: rxe_rcv's checks for the GSI QP, then the CM). dev.mu held.
func (d *Device) cmInput(pk *link.Packet, p wire.Packet, now time.Time) {
	c := d.cm
	bth := p.BTH()
	if p.Opcode() != wire.UDSendOnly || bth.DestQP() != wire.QPGSI {
		c.stats.rxDropped.Add(1) // no UD QP but QP1; QP1 only takes SEND_ONLY MADs
		return
	}
	if !pkeyMatch(bth.PKey()) {
		c.stats.rxBadPKey.Add(1)
		return
	}
	if p.DETH().QKey() != wire.GSIQKey {
		c.stats.rxBadQKey.Add(1)
		return
	}
	src, dst := pk.Src.Addr().Unmap(), pk.Dst.Addr().Unmap()
	if p.PayloadLen() != wire.MADLen || !src.IsValid() || !dst.IsValid() || dst.IsUnspecified() ||
		src.IsUnspecified() || !d.isLocal(dst) {
		c.stats.rxDropped.Add(1)
		return
	}
	if d.grp != nil {
		if o := d.madQueue(p.Payload()); o != d.qidx {
			d.forward(o, pk) // a connection of another queue (or a REQ for it)
			return
		}
	}
	if d.port != link.UDPPort && pk.Src.Port() != 0 {
		c.learned[src] = pk.Src.Port()
	}
	t := c.mnow(now)
	c.out.Reset()
	if err := c.mgr.HandleMAD(t, src, dst, p.Payload(), &c.out); err != nil {
		c.stats.rxMalformed.Add(1)
		if d.debug {
			d.log.Debug("QP1: malformed MAD", zap.Stringer("src", pk.Src), zap.Error(err))
		}
	} else {
		c.stats.rxMADs.Add(1)
	}
	c.process(&c.out, t, pk.Src)
}

// cmCommEst reports the first RC request packet of a QP whose connection still waits for its
// RTU (IB_EVENT_COMM_EST): the connection is established. dev.mu held.
func (d *Device) cmCommEst(q *qp, now time.Time) {
	c := d.cm
	if len(c.estWait) == 0 {
		return
	}
	id, ok := c.estWait[q.qpn]
	if !ok {
		return
	}
	delete(c.estWait, q.qpn)
	t := c.mnow(now)
	c.out.Reset()
	if err := c.mgr.CommEstablished(t, id, &c.out); err != nil {
		return
	}
	c.process(&c.out, t, netip.AddrPort{})
}

// cmTimers runs the Manager's expired timers and folds its next deadline into the device's.
// Called by fireTimers. dev.mu held.
func (d *Device) cmTimers(now time.Time) {
	c := d.cm
	if dl, ok := c.mgr.NextDeadline(); ok && !now.Before(c.start.Add(dl)) {
		t := c.mnow(now)
		c.out.Reset()
		c.mgr.Expire(t, &c.out)
		c.process(&c.out, t, netip.AddrPort{})
	}
	if dl, ok := c.mgr.NextDeadline(); ok {
		at := c.start.Add(dl)
		if d.deadline.IsZero() || at.Before(d.deadline) {
			d.deadline = at
		}
	}
}

// cmTx appends the queued MAD packets to pkts (the caller sends them with sendMu, as the loops
// do with their own packets). dev.mu held.
func (d *Device) cmTx(pkts []link.Packet) []link.Packet {
	c := d.cm
	if len(c.txq) == 0 {
		return pkts
	}
	pkts = append(pkts, c.txq...)
	clear(c.txq)
	c.txq = c.txq[:0]
	return pkts
}

// rearm makes the transmit loop's timer cover the Manager's next deadline. dev.mu held.
func (c *cmState) rearm() {
	if dl, ok := c.mgr.NextDeadline(); ok {
		c.dev.armTimer(c.start.Add(dl))
	}
}

// process applies one Manager call's Outputs (see the package cm integration note). rx is the
// source of the MAD being handled (zero when the call did not come from a received MAD): stateless
// answers and new passive connections are addressed to its port. dev.mu held.
func (c *cmState) process(out *cm.Outputs, now time.Duration, rx netip.AddrPort) {
	d := c.dev
	// 1. QP updates, in order.
	var failed map[cm.ConnID]error
	for i := range out.QP {
		u := &out.QP[i]
		if _, ok := failed[u.Conn]; ok {
			continue
		}
		rec := c.conns[u.Conn]
		var q *qp
		if rec != nil && rec.qp != nil {
			q = rec.qp
		} else {
			q = d.qps[u.QPN]
		}
		attr := u.Attr
		if u.Mask&transport.AttrAV != 0 {
			port := link.UDPPort
			if rec != nil {
				port = int(rec.udpPort)
			}
			if port != link.UDPPort {
				attr.AV.DstPort = uint16(port)
			}
		}
		var err error
		switch {
		case q == nil || q.qpn != u.QPN || q.closed:
			err = &transport.ModifyError{To: attr.State, Err: transport.ErrClosed, Detail: "QP gone"}
		default:
			err = q.modifyLocked(&attr, u.Mask)
			if err == nil && u.Mask&transport.AttrState != 0 && attr.State == transport.QPSRTR && rec != nil {
				q.segmentable = peerSegmentable(u.PeerECE, rec.active)
				q.setNoICRC(d.waiver && peerWaivesICRC(u.PeerECE, rec.active))
			}
		}
		if err == nil {
			continue
		}
		if u.Mask&transport.AttrState != 0 && attr.State == transport.QPSErr {
			continue // nothing to flush: the QP is gone or already unusable
		}
		if failed == nil {
			failed = make(map[cm.ConnID]error)
		}
		failed[u.Conn] = err
		d.log.Warn("CM: QP modify failed", zap.Uint32("qpn", u.QPN), zap.Uint32("conn", uint32(u.Conn)), zap.Error(err))
	}
	// 2. MADs.
	for i := range out.MADs {
		m := &out.MADs[i]
		if _, ok := failed[m.Conn]; ok && m.Conn != 0 {
			continue
		}
		c.queueMAD(m, rx)
	}
	// 3. Events.
	for i := range out.Events {
		c.deliver(&out.Events[i], now, rx)
	}
	// Connections whose QP could not follow: abandon them (silently) and fail their waiter.
	for id, err := range failed {
		rec := c.conns[id]
		var o cm.Outputs
		_ = c.mgr.Destroy(now, id, &o)
		if rec != nil {
			rec.finish(cmResult{err: err})
			c.drop(rec)
		}
		c.process(&o, now, rx)
	}
	c.rearm()
	if len(c.txq) > 0 {
		d.wake()
	}
}

// queueMAD lays out m as a UD SEND_ONLY to QP1 and queues it. dev.mu held.
func (c *cmState) queueMAD(m *cm.OutMAD, rx netip.AddrPort) {
	var port uint16
	switch rec := c.conns[m.Conn]; {
	case rec != nil && m.Conn != 0:
		port = rec.udpPort
	case rx.IsValid() && rx.Addr().Unmap() == m.Dst.Unmap():
		port = c.replyPort(rx)
	default:
		port = c.peerPort(m.Dst)
	}
	c.queueMADTo(m, port)
}

// queueMADTo lays out m as a UD SEND_ONLY to QP1 at UDP port port and queues it. dev.mu held.
func (c *cmState) queueMADTo(m *cm.OutMAD, port uint16) {
	d := c.dev
	buf := make([]byte, wire.PacketLen(wire.UDSendOnly, wire.MADLen))
	p, err := wire.LayoutMAD(buf, wire.PSN(c.madPSN), m.MAD[:])
	if err != nil {
		panic("softroce: layout MAD: " + err.Error())
	}
	c.madPSN = (c.madPSN + 1) & wire.PSNMask
	c.txq = append(c.txq, link.Packet{
		Src: netip.AddrPortFrom(m.Src, d.port),
		Dst: netip.AddrPortFrom(m.Dst, port),
		Buf: p.Bytes(),
	})
	c.stats.txMADs.Add(1)
	if d.debug {
		d.log.Debug("QP1: send", zap.String("mad", cm.AttrName(m.Attr())), zap.Stringer("dst", netip.AddrPortFrom(m.Dst, port)))
	}
}

// deliver hands one event to the ULP side. dev.mu held.
func (c *cmState) deliver(e *cm.Event, now time.Duration, rx netip.AddrPort) {
	switch e.Kind {
	case cm.EventRequest:
		c.request(e, now, rx)
		return
	}
	rec := c.conns[e.Conn]
	if rec == nil {
		return
	}
	switch e.Kind {
	case cm.EventEstablished:
		delete(c.estWait, e.QPN)
		rec.established = true
		rec.pd = clone(e.PrivateData)
		if info, ok := c.mgr.Conn(e.Conn); ok {
			rec.local, rec.remote = info.LocalCM, info.RemoteCM
		}
		rec.finish(cmResult{conn: rec})
	case cm.EventRejected:
		err := &transport.RejectError{Reason: e.Reason, PrivateData: clone(e.PrivateData), ARI: clone(e.ARI)}
		rec.abandonRequest(err)
		rec.finish(cmResult{err: err})
		if e.Reason != transport.RejectStaleConn { // reason 10: timewait follows
			c.drop(rec)
		}
	case cm.EventUnreachable:
		err := fmt.Errorf("%w: %w", transport.ErrConnUnreachable, e.Err)
		rec.abandonRequest(err)
		rec.finish(cmResult{err: err})
		c.drop(rec)
	case cm.EventDisconnected:
		if rec.wait != nil {
			// Disconnected before Accept saw the RTU (DREQ or REJ right after our REP).
			rec.finish(cmResult{err: transport.ErrConnDisconnected})
			return
		}
		if rec.established && !rec.discSent {
			rec.discSent = true
			rec.events <- transport.CMEvent{Type: transport.CMEventDisconnected,
				PrivateData: clone(e.PrivateData), Reason: e.Reason, Err: e.Err}
		}
	case cm.EventTimewaitExit:
		if rec.established {
			rec.events <- transport.CMEvent{Type: transport.CMEventTimewaitExit}
			close(rec.events)
		}
		c.drop(rec)
	}
}

// request turns an EventRequest into a ConnRequest on the matching listener's queue, or
// rejects it when the listener is gone or its queue is full. dev.mu held.
func (c *cmState) request(e *cm.Event, now time.Duration, rx netip.AddrPort) {
	lis := c.listeners[mkListenKey(e.Request.Listener.Addr(), e.Request.Listener.Port())]
	rec := &cmConn{
		dev: c.dev, id: e.Conn, udpPort: c.replyPort(rx),
		local: e.Request.LocalAddr, remote: e.Request.RemoteAddr,
	}
	r := &connRequest{rec: rec, info: e.Request.ConnRequestInfo, ece: e.Request.ECE, pd: clone(e.PrivateData)}
	r.info.Device = c.dev // its QP must be created here (a queue of a multi-queue device)
	rec.req = r
	c.conns[e.Conn] = rec
	if lis != nil && !lis.closed.Load() {
		select {
		case lis.ch <- r:
			return
		default:
		}
	}
	// Listener closing, or its backlog is full: refuse (the peer sees a REJ "no resources").
	r.answered = true
	var o cm.Outputs
	_ = c.mgr.Reject(now, e.Conn, transport.RejectNoResources, nil, &o)
	c.process(&o, now, rx)
	c.drop(rec)
}

// drop forgets rec (the Manager released the connection or will not report on it again).
// dev.mu held.
func (c *cmState) drop(rec *cmConn) {
	if c.conns[rec.id] == rec {
		delete(c.conns, rec.id)
	}
	if rec.qp != nil {
		if id, ok := c.estWait[rec.qp.qpn]; ok && id == rec.id {
			delete(c.estWait, rec.qp.qpn)
		}
	}
}

// call runs one Manager API call and processes its outputs. dev.mu held.
func (c *cmState) call(f func(now time.Duration, out *cm.Outputs) error) error {
	t := c.mnow(time.Now())
	c.out.Reset()
	err := f(t, &c.out)
	c.process(&c.out, t, netip.AddrPort{})
	return err
}

func clone(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

// cmErr maps the Manager's API errors onto the transport sentinels.
func cmErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var ce cm.Error
	if errors.As(err, &ce) {
		switch ce {
		case cm.ErrAddrInUse:
			return fmt.Errorf("%s: %w: %w", op, transport.ErrBusy, err)
		case cm.ErrNoResources:
			return fmt.Errorf("%s: %w: %w", op, transport.ErrNoResources, err)
		case cm.ErrInvalidArgument, cm.ErrPrivateDataTooLong:
			return fmt.Errorf("%s: %w: %w", op, transport.ErrInvalidArgument, err)
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}
