package softroce

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/cm"
)

// transport.ConnManager on softroce: RDMA CM semantics over the IB CM carried on QP1 (qp1.go).
//
// Channels and what happens when nobody reads them (the engine never blocks on a consumer):
//   - Listener: a queue of ListenBacklog requests. A REQ arriving while it is full is rejected
//     at once (REJ reason 3, no resources). A request queued but never taken by Accept, or taken
//     and never answered, is rejected by the CM after cm.Config.DecisionTimeout (65.5 s by
//     default; an MRA is sent meanwhile if the peer repeats its REQ); Listener.Accept skips
//     requests that died in the queue (peer gave up, or decision timeout).
//   - CMConn.Events: capacity 2, which is all a connection ever produces (one
//     CMEventDisconnected, one CMEventTimewaitExit), so events are never dropped and the engine
//     never waits. The channel is closed after CMEventTimewaitExit.
//   - Dial and ConnRequest.Accept wait on a private one-slot channel for their single result.

// ListenBacklog is the capacity of a Listener's queue of requests not yet returned by Accept.
const ListenBacklog = 1024

var (
	_ transport.ConnManager = (*Device)(nil)
	_ transport.Listener    = (*listener)(nil)
	_ transport.ConnRequest = (*connRequest)(nil)
	_ transport.CMConn      = (*cmConn)(nil)
)

// errAnswered: Accept or Reject called twice on one ConnRequest.
var errAnswered = errors.New("softroce: connection request already answered")

type cmResult struct {
	conn *cmConn
	err  error
}

// cmConn is the engine's record of one connection (keyed by the Manager's ConnID) and, once
// established, the transport.CMConn. Fields are guarded by dev.mu except the channels.
type cmConn struct {
	dev     *Device
	id      cm.ConnID
	qp      *qp
	active  bool   // created by Dial
	udpPort uint16 // the peer's UDP port (4791 unless it is a test device)

	local, remote netip.AddrPort // RDMA CM endpoints
	pd            []byte         // REP (active) / RTU (passive) private data
	req           *connRequest   // passive, until answered
	wait          chan cmResult  // Dial / Accept waiting for the outcome
	events        chan transport.CMEvent
	established   bool
	discSent      bool
}

// finish hands the outcome to the waiter, if any. dev.mu held.
func (r *cmConn) finish(res cmResult) {
	if r.wait == nil {
		return
	}
	r.wait <- res // capacity 1, one result per waiter
	r.wait = nil
}

// abandonRequest marks a request not yet accepted as dead (the peer gave up). dev.mu held.
func (r *cmConn) abandonRequest(err error) {
	if q := r.req; q != nil && !q.answered {
		q.dead, q.err = true, err
	}
}

func (r *cmConn) QP() transport.QP                 { return r.qp }
func (r *cmConn) LocalAddr() netip.AddrPort        { return r.local }
func (r *cmConn) RemoteAddr() netip.AddrPort       { return r.remote }
func (r *cmConn) PrivateData() []byte              { return r.pd }
func (r *cmConn) Events() <-chan transport.CMEvent { return r.events }

// Disconnect implements transport.CMConn: QP to ERR, then a DREQ (retransmitted until the
// DREP); a no-op once disconnected.
func (r *cmConn) Disconnect(privateData []byte) error {
	if len(privateData) > transport.MaxDisconnectPrivateData {
		return fmt.Errorf("disconnect: %d bytes of private data: %w", len(privateData), transport.ErrInvalidArgument)
	}
	d := r.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return transport.ErrClosed
	}
	c := d.cm
	if c.conns[r.id] != r {
		return nil // released: timewait is over
	}
	err := c.call(func(now time.Duration, out *cm.Outputs) error {
		return c.mgr.Disconnect(now, r.id, privateData, out)
	})
	if errors.Is(err, cm.ErrUnknownConn) {
		return nil
	}
	return cmErr("disconnect", err)
}

// Listen implements transport.ConnManager (on queue 0 of a multi-queue device: on every
// queue).
func (d *Device) Listen(addr netip.Addr, port uint16) (transport.Listener, error) {
	if d.leads() {
		return d.groupListen(addr, port)
	}
	l := &listener{dev: d, addr: addr, port: port, ch: make(chan *connRequest, ListenBacklog),
		done: make(chan struct{}), devs: []*Device{d}}
	if err := d.register(l); err != nil {
		return nil, err
	}
	return l, nil
}

// register makes l the listener of its address and port on d's CM.
func (d *Device) register(l *listener) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closing {
		return transport.ErrClosed
	}
	addr, port := l.addr, l.port
	if addr.IsValid() && !addr.IsUnspecified() && !d.isLocal(addr) {
		return fmt.Errorf("listen on %v: not an address of %s: %w", addr, d.name, transport.ErrInvalidArgument)
	}
	c := d.cm
	if err := c.mgr.Listen(addr, port); err != nil {
		return cmErr(fmt.Sprintf("listen on %v port %d", addr, port), err)
	}
	c.listeners[mkListenKey(addr, port)] = l
	return nil
}

// unregister undoes register: no request reaches l from d any more.
func (d *Device) unregister(l *listener) {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.cm
	if c.listeners[mkListenKey(l.addr, l.port)] == l {
		delete(c.listeners, mkListenKey(l.addr, l.port))
		_ = c.mgr.Unlisten(l.addr, l.port)
	}
}

// listener implements transport.Listener. A multi-queue device's listener is registered with
// every queue (devs), whose requests share its queue ch; a request is guarded by the mu of
// its own queue (r.rec.dev).
type listener struct {
	dev    *Device   // the device Listen was called on
	devs   []*Device // the devices it is registered with
	addr   netip.Addr
	port   uint16
	ch     chan *connRequest
	done   chan struct{}
	closed atomic.Bool
}

func (l *listener) Addr() netip.AddrPort {
	a := l.addr
	if !a.IsValid() {
		a = netip.IPv4Unspecified()
	}
	return netip.AddrPortFrom(a, l.port)
}

// Accept implements transport.Listener.
func (l *listener) Accept(ctx context.Context) (transport.ConnRequest, error) {
	d := l.dev
	for {
		select {
		case r := <-l.ch:
			rd := r.rec.dev
			rd.mu.Lock()
			dead := r.dead
			rd.mu.Unlock()
			if dead {
				continue
			}
			return r, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-l.done:
			return nil, transport.ErrClosed
		case <-d.done:
			return nil, transport.ErrClosed
		}
	}
}

// Close implements transport.Listener: no more requests; those queued are rejected (reason 28).
func (l *listener) Close() error {
	if l.closed.Swap(true) {
		return transport.ErrClosed
	}
	close(l.done)
	// Once unregistered everywhere (under each queue's mu, which delivery holds), no request
	// joins ch any more: those in it are all there is to refuse.
	for _, d := range l.devs {
		d.unregister(l)
	}
	for {
		select {
		case r := <-l.ch:
			l.refuse(r)
			continue
		default:
		}
		return nil
	}
}

// refuse rejects a request Accept never returned (reason 28, consumer defined).
func (l *listener) refuse(r *connRequest) {
	d := r.rec.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if r.answered || r.dead {
		return
	}
	r.answered = true
	c := d.cm
	_ = c.call(func(now time.Duration, out *cm.Outputs) error {
		return c.mgr.Reject(now, r.rec.id, transport.RejectConsumerDefined, nil, out)
	})
	c.drop(r.rec)
}

// connRequest implements transport.ConnRequest.
type connRequest struct {
	rec      *cmConn
	info     transport.ConnRequestInfo
	ece      cm.ECE // the REQ's
	pd       []byte
	answered bool  // dev.mu
	dead     bool  // dev.mu: the peer gave up or the CM timed the request out
	err      error // why it died
}

func (r *connRequest) PrivateData() []byte             { return r.pd }
func (r *connRequest) Info() transport.ConnRequestInfo { return r.info }

// pending checks that the request can still be answered. dev.mu held.
func (r *connRequest) pending() error {
	d := r.rec.dev
	switch {
	case d.closing:
		return transport.ErrClosed
	case r.answered:
		return errAnswered
	case r.dead:
		return r.err
	case d.cm.conns[r.rec.id] != r.rec:
		return transport.ErrConnUnreachable
	}
	return nil
}

// Accept implements transport.ConnRequest. It returns when the RTU arrives (or the first RC
// packet on qp, which proves the peer established), or with *transport.RejectError when the
// peer rejects our REP, ErrConnUnreachable when the REP retries run out, ErrConnDisconnected
// when the peer disconnects first, or ctx's error (the connection is then abandoned with a
// REJ). The wait is bounded by ctx and by the REP retries (the REQ's Max CM Retries × its
// Local CM Response Timeout: about 65 s with the kernel's values).
func (r *connRequest) Accept(ctx context.Context, tqp transport.QP, privateData []byte, param transport.ConnParam) (transport.CMConn, error) {
	rec := r.rec
	d := rec.dev
	q, err := d.cmQP(tqp)
	if err != nil {
		return nil, fmt.Errorf("accept: %w", err)
	}
	if len(privateData) > transport.MaxAcceptPrivateData {
		return nil, fmt.Errorf("accept: %d bytes of private data: %w", len(privateData), transport.ErrInvalidArgument)
	}
	d.mu.Lock()
	if err := r.pending(); err != nil {
		d.mu.Unlock()
		return nil, fmt.Errorf("accept: %w", err)
	}
	if q.closed || (q.state != transport.QPSReset && q.state != transport.QPSInit) {
		st := q.state
		d.mu.Unlock()
		return nil, fmt.Errorf("accept: QP %#x in %v (want RESET or INIT): %w", q.qpn, st, transport.ErrQPState)
	}
	c := d.cm
	r.answered = true
	rec.req = nil
	rec.qp = q
	rec.events = make(chan transport.CMEvent, 2)
	wait := make(chan cmResult, 1)
	rec.wait = wait
	c.estWait[q.qpn] = rec.id
	err = c.call(func(now time.Duration, out *cm.Outputs) error {
		return c.mgr.Accept(now, rec.id, &cm.AcceptParams{QPN: q.qpn, PrivateData: privateData, Param: param,
			ECE: acceptECE(r.ece, d.waiver)}, out)
	})
	if err != nil {
		rec.wait = nil
		delete(c.estWait, q.qpn)
		if errors.Is(err, cm.ErrUnknownConn) {
			c.drop(rec)
			d.mu.Unlock()
			return nil, fmt.Errorf("accept: %w", transport.ErrConnUnreachable)
		}
		r.answered = false
		rec.req = r
		d.mu.Unlock()
		return nil, cmErr("accept", err)
	}
	d.mu.Unlock()
	return d.cmWait(ctx, rec, wait)
}

// Reject implements transport.ConnRequest. Rejecting a request the peer already abandoned is
// not an error.
func (r *connRequest) Reject(privateData []byte, reason transport.RejectReason) error {
	if len(privateData) > transport.MaxRejectPrivateData {
		return fmt.Errorf("reject: %d bytes of private data: %w", len(privateData), transport.ErrInvalidArgument)
	}
	rec := r.rec
	d := rec.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if r.dead && !r.answered {
		r.answered = true
		return nil
	}
	if err := r.pending(); err != nil {
		return fmt.Errorf("reject: %w", err)
	}
	c := d.cm
	r.answered = true
	err := c.call(func(now time.Duration, out *cm.Outputs) error {
		return c.mgr.Reject(now, rec.id, reason, privateData, out)
	})
	c.drop(rec)
	if errors.Is(err, cm.ErrUnknownConn) {
		return nil
	}
	return cmErr("reject", err)
}

// MRA implements transport.ConnRequest.
func (r *connRequest) MRA(serviceTimeout uint8, privateData []byte) error {
	if len(privateData) > transport.MaxMRAPrivateData || serviceTimeout > 31 {
		return fmt.Errorf("MRA: %w", transport.ErrInvalidArgument)
	}
	rec := r.rec
	d := rec.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := r.pending(); err != nil {
		return fmt.Errorf("MRA: %w", err)
	}
	c := d.cm
	return cmErr("MRA", c.call(func(now time.Duration, out *cm.Outputs) error {
		return c.mgr.MRA(now, rec.id, serviceTimeout, privateData, out)
	}))
}

// Dial implements transport.ConnManager. The REQ goes to remote's IP at UDP 4791 (or the port
// set with SetPeerUDPPort) from the device address of remote's family (for a wildcard-bound
// device: the source address the host routes remote from), offering the device's MTU capped
// by the local interface's (Config.MTU). On a multi-queue device, the queue of the QP dials.
func (d *Device) Dial(ctx context.Context, remote netip.AddrPort, tqp transport.QP, privateData []byte, param transport.ConnParam) (transport.CMConn, error) {
	if d.grp != nil {
		return d.groupDial(ctx, remote, tqp, privateData, param)
	}
	return d.dial(ctx, remote, tqp, privateData, param)
}

// dial is Dial from this device.
func (d *Device) dial(ctx context.Context, remote netip.AddrPort, tqp transport.QP, privateData []byte, param transport.ConnParam) (transport.CMConn, error) {
	q, err := d.cmQP(tqp)
	if err != nil {
		return nil, fmt.Errorf("dial %v: %w", remote, err)
	}
	if len(privateData) > transport.MaxDialPrivateData {
		return nil, fmt.Errorf("dial %v: %d bytes of private data: %w", remote, len(privateData), transport.ErrInvalidArgument)
	}
	ra := remote.Addr().Unmap()
	if !ra.IsValid() || ra.IsUnspecified() || remote.Port() == 0 {
		return nil, fmt.Errorf("dial %v: %w", remote, transport.ErrInvalidArgument)
	}
	local, err := d.cmLocalAddr(ra)
	if err != nil {
		return nil, fmt.Errorf("dial %v: %w", remote, err)
	}
	mtu := min(d.attr.ActiveMTU, ifaceMTU(local))
	d.mu.Lock()
	if d.closing {
		d.mu.Unlock()
		return nil, transport.ErrClosed
	}
	if q.closed || (q.state != transport.QPSReset && q.state != transport.QPSInit) {
		st := q.state
		d.mu.Unlock()
		return nil, fmt.Errorf("dial %v: QP %#x in %v (want RESET): %w", remote, q.qpn, st, transport.ErrQPState)
	}
	c := d.cm
	t := c.mnow(time.Now())
	c.out.Reset()
	id, err := c.mgr.Dial(t, &cm.DialParams{
		LocalAddr: local, RemoteAddr: ra, DstPort: remote.Port(), QPN: q.qpn,
		PrivateData: privateData, Param: param, PathMTU: mtu,
		ECE: cm.ECE{VendorID: eceVendorSRPD, AttrMod: d.eceOffer()},
	}, &c.out)
	if err != nil {
		d.mu.Unlock()
		return nil, cmErr(fmt.Sprintf("dial %v", remote), err)
	}
	wait := make(chan cmResult, 1)
	rec := &cmConn{dev: d, id: id, qp: q, active: true, udpPort: c.peerPort(ra), wait: wait,
		events: make(chan transport.CMEvent, 2)}
	c.conns[id] = rec
	c.process(&c.out, t, netip.AddrPort{})
	d.mu.Unlock()
	return d.cmWait(ctx, rec, wait)
}

// cmWait waits for the outcome of a Dial or Accept. On ctx's end the attempt is abandoned
// (Manager.Destroy: REJ, or a DREQ if it got established meanwhile).
func (d *Device) cmWait(ctx context.Context, rec *cmConn, wait chan cmResult) (transport.CMConn, error) {
	select {
	case res := <-wait:
		return res.result()
	case <-d.done:
		return nil, transport.ErrClosed
	case <-ctx.Done():
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case res := <-wait:
		return res.result() // the outcome won the race
	default:
	}
	c := d.cm
	rec.wait = nil
	if !d.closed && c.conns[rec.id] == rec {
		_ = c.call(func(now time.Duration, out *cm.Outputs) error {
			return c.mgr.Destroy(now, rec.id, out)
		})
		c.drop(rec)
	}
	return nil, ctx.Err()
}

func (res cmResult) result() (transport.CMConn, error) {
	if res.err != nil {
		return nil, res.err
	}
	return res.conn, nil
}

// cmQP checks that t is an RC QP of d.
func (d *Device) cmQP(t transport.QP) (*qp, error) {
	q, ok := t.(*qp)
	if !ok || q == nil || q.dev != d {
		return nil, transport.ErrWrongDevice
	}
	return q, nil
}

// cmLocalAddr picks our IP for a connection to remote: the first device address of its family,
// or for a wildcard-bound device the address the host would send from.
func (d *Device) cmLocalAddr(remote netip.Addr) (netip.Addr, error) {
	for _, a := range d.addrs {
		x := a.Addr().Unmap()
		if x.IsValid() && !x.IsUnspecified() && x.Is4() == remote.Is4() {
			return x, nil
		}
	}
	// Route lookup: a connected UDP socket sends nothing but learns its source address.
	uc, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(remote, 4791)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no local address towards %v: %w", remote, err)
	}
	defer uc.Close()
	la := uc.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
	if !d.isLocal(la) {
		return netip.Addr{}, fmt.Errorf("no local address towards %v: %w", remote, transport.ErrInvalidArgument)
	}
	return la, nil
}

// ifaceMTU is the RoCE path MTU the network interface holding a supports, as the kernel
// computes it for rxe (torvalds/linux:include/rdma/ib_addr.h iboe_get_mtu: the interface MTU
// less GRH 40 + UDP 8 + BTH 12 + XRC 4 + AtomicETH 28 + ICRC 4 = 96 bytes); 1024 when a is on
// no interface.
func ifaceMTU(a netip.Addr) transport.MTU {
	ifs, err := net.Interfaces()
	if err != nil {
		return transport.MTU1024
	}
	for _, ifi := range ifs {
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, x := range addrs {
			if n, ok := x.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == a.Unmap() {
					return iboeMTU(ifi.MTU)
				}
			}
		}
	}
	return transport.MTU1024
}

// iboeMTU maps an interface MTU to the largest RoCE path MTU that fits (iboe_get_mtu).
func iboeMTU(ifMTU int) transport.MTU {
	m := ifMTU - 96
	for _, v := range []transport.MTU{transport.MTU4096, transport.MTU2048, transport.MTU1024, transport.MTU512, transport.MTU256} {
		if m >= v.Bytes() {
			return v
		}
	}
	return transport.MTU256 // iboe_get_mtu gives 0 below 352 bytes; 256 is the smallest path MTU
}

// ECE between srpd peers. Our receive path accepts any IPv4 Identification (link.UDP recovers
// it from the ICRC), which lets a peer send to us in UDP GSO super-packets: the kernel numbers
// the segments' IDs itself, so their ICRCs, computed for ID 0, only verify at a receiver that
// recovers the ID. rxe checks the ICRC as sent and so must never get such packets
// (link/udp.go). A REQ from us offers; an srpd passive side agrees in its REP with a bit of its
// own, because a kernel passive side answers with the REQ's ECE unchanged (cma.c
// cma_accept_ib), which must not read as agreement. Kernel ULPs (ib_srp, ib_srpt) send no ECE.
const (
	// eceVendorSRPD is a locally administered ID (the U/L bit of its first octet is set), not
	// an IEEE OUI, so it names no vendor's ECE options.
	eceVendorSRPD = 0x0A5250
	eceOffer      = 1 << 0 // REQ: our receiver accepts any IPv4 Identification
	eceAgree      = 1 << 1 // REP: so does ours, answering an offer
	// The ICRC waiver (Config.KeepICRC): both ends then send without ICRC and accept packets
	// without one on this connection's QPs, their UDP checksum covering the same bytes.
	eceNoICRCOffer = 1 << 2 // REQ: our receiver waives the ICRC (our link can: ICRCWaiver)
	eceNoICRCAgree = 1 << 3 // REP: so does ours, answering an offer
)

// eceOffer is the ECE attribute our REQ carries.
func (d *Device) eceOffer() uint32 {
	if d.waiver {
		return eceOffer | eceNoICRCOffer
	}
	return eceOffer
}

// acceptECE is the ECE our REP carries for a REQ's: agreement to an srpd offer (to the ICRC
// waiver only when our link can waive it too), else none.
func acceptECE(req cm.ECE, waiver bool) cm.ECE {
	if req.VendorID != eceVendorSRPD || req.AttrMod&eceOffer == 0 {
		return cm.ECE{}
	}
	a := uint32(eceAgree)
	if waiver && req.AttrMod&eceNoICRCOffer != 0 {
		a |= eceNoICRCAgree
	}
	return cm.ECE{VendorID: eceVendorSRPD, AttrMod: a}
}

// peerWaivesICRC reports whether the peer's ECE (its REQ's when we are passive, its REP's
// when active) waives the ICRC both ways: as the active side, its agreement answers our offer,
// which we made only if our link can; as the passive side, the offer (which our REP agreed to
// only if our link can: the caller checks that with Device.waiver).
func peerWaivesICRC(peer cm.ECE, active bool) bool {
	return peerSays(peer, active, eceNoICRCOffer, eceNoICRCAgree)
}

// peerSegmentable reports whether the peer's ECE (its REQ's when we are passive, its REP's
// when active) says it accepts any IPv4 Identification.
func peerSegmentable(peer cm.ECE, active bool) bool {
	return peerSays(peer, active, eceOffer, eceAgree)
}

// peerSays reports whether an srpd peer's ECE carries the offer bit (its REQ, we are passive)
// or the agreement bit (its REP, we are active).
func peerSays(peer cm.ECE, active bool, offer, agree uint32) bool {
	if peer.VendorID != eceVendorSRPD {
		return false
	}
	if active {
		return peer.AttrMod&agree != 0
	}
	return peer.AttrMod&offer != 0
}
