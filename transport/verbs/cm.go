//go:build verbs && linux && cgo

package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/srpd/srpd/transport"
)

// transport.ConnManager on librdmacm (see the package doc). Channels never block the CM event
// goroutine: a Listener queues up to ListenBacklog requests (more are rejected at once), a
// connection's setup channel holds every event a connection attempt can see, and CMConn.Events
// has room for the two events a connection ever delivers.

// ListenBacklog is the capacity of a Listener's queue of requests not yet returned by Accept
// (and the rdma_listen backlog).
const ListenBacklog = 1024

var (
	_ transport.Listener    = (*listener)(nil)
	_ transport.ConnRequest = (*connRequest)(nil)
	_ transport.CMConn      = (*cmConn)(nil)
)

var errAnswered = errors.New("verbs: connection request already answered")

type cmState struct {
	d      *Device
	ch     *C.struct_rdma_event_channel
	stop   int
	done   chan struct{}
	closed chan struct{} // device close: waits in Dial and Accept end

	mu       sync.Mutex
	next     uint64
	objs     map[uint64]cmObj
	isClosed bool
}

type cmObj interface{ event(ev *cmEvent) }

// cmEvent is a copied rdma_cm_event.
type cmEvent struct {
	typ          C.int
	status       int
	id           *C.struct_rdma_cm_id
	handle       uint64
	listenHandle uint64
	local, peer  netip.AddrPort
	qpNum        uint32
	resp, init   uint8
	flowControl  bool
	retry, rnr   uint8
	srq          bool
	pathMTU      transport.MTU
	privateData  []byte
}

func (d *Device) cmGet() (*cmState, error) {
	d.cmOnce.Do(func() {
		ch, err := C.rdma_create_event_channel()
		if ch == nil {
			d.cmErr = errnoErr("rdma_create_event_channel", err)
			return
		}
		efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			C.rdma_destroy_event_channel(ch)
			d.cmErr = fmt.Errorf("verbs: eventfd: %w", err)
			return
		}
		c := &cmState{d: d, ch: ch, stop: efd, done: make(chan struct{}), closed: make(chan struct{}),
			objs: make(map[uint64]cmObj), next: 1}
		d.mu.Lock()
		closed := d.closed
		if !closed {
			d.cm = c
		}
		d.mu.Unlock()
		if closed {
			unix.Close(efd)
			C.rdma_destroy_event_channel(ch)
			d.cmErr = transport.ErrClosed
			return
		}
		go c.loop()
	})
	if d.cmErr != nil {
		return nil, d.cmErr
	}
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, transport.ErrClosed
	}
	return d.cm, nil
}

func (c *cmState) register(o cmObj) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.next
	c.next++
	c.objs[h] = o
	return h
}

func (c *cmState) unregister(h uint64) {
	c.mu.Lock()
	delete(c.objs, h)
	c.mu.Unlock()
}

func (c *cmState) loop() {
	defer close(c.done)
	var ev C.struct_shim_cmev
	for {
		r := C.shim_cm_get(c.ch, C.int(c.stop), &ev)
		if r == 0 {
			return
		}
		if r < 0 {
			if e := syscall.Errno(-r); e == syscall.EINTR || e == syscall.EAGAIN {
				continue
			}
			c.d.log.Error("rdma_cm event channel failed", zap.Error(syscall.Errno(-r)))
			return
		}
		e := &cmEvent{typ: ev.event, status: int(ev.status), id: ev.id, handle: uint64(ev.handle),
			listenHandle: uint64(ev.listen_handle), local: fromShimAddr(&ev.local), peer: fromShimAddr(&ev.peer),
			qpNum: uint32(ev.qp_num), resp: uint8(ev.responder_resources), init: uint8(ev.initiator_depth),
			flowControl: ev.flow_control != 0, retry: uint8(ev.retry_count), rnr: uint8(ev.rnr_retry_count),
			srq: ev.srq != 0, pathMTU: transport.MTU(ev.path_mtu)}
		if ev.pd_len > 0 {
			e.privateData = C.GoBytes(unsafe.Pointer(&ev.pd[0]), C.int(ev.pd_len))
		}
		h := e.handle
		if e.typ == C.RDMA_CM_EVENT_CONNECT_REQUEST {
			h = e.listenHandle
		}
		c.mu.Lock()
		o := c.objs[h]
		c.mu.Unlock()
		if o == nil {
			if e.typ == C.RDMA_CM_EVENT_CONNECT_REQUEST {
				C.shim_cm_reject(e.id, nil, 0)
				C.rdma_destroy_id(e.id)
			}
			continue
		}
		o.event(e)
	}
}

// close stops the event goroutine and destroys every ID and the channel (device close).
func (c *cmState) close() {
	c.mu.Lock()
	if c.isClosed {
		c.mu.Unlock()
		return
	}
	c.isClosed = true
	close(c.closed)
	objs := slices.Collect(maps.Values(c.objs))
	c.objs = map[uint64]cmObj{}
	c.mu.Unlock()
	wake(c.stop)
	<-c.done
	for _, o := range objs {
		switch x := o.(type) {
		case *listener:
			x.shutdown()
		case *cmConn:
			x.destroyID()
		}
	}
	unix.Close(c.stop)
	C.rdma_destroy_event_channel(c.ch)
}

// ---- listening ------------------------------------------------------------------------------

type listener struct {
	cm         *cmState
	handle     uint64
	id         *C.struct_rdma_cm_id
	addr       netip.AddrPort
	ch         chan *connRequest
	done       chan struct{}
	once       sync.Once // Close
	finishOnce sync.Once
}

// Listen implements transport.ConnManager.
func (d *Device) Listen(addr netip.Addr, port uint16) (transport.Listener, error) {
	if addr.IsValid() && !addr.IsUnspecified() && !d.isLocal(addr) {
		return nil, fmt.Errorf("verbs: listen on %v: not an address of %s: %w", addr, d.name, transport.ErrInvalidArgument)
	}
	c, err := d.cmGet()
	if err != nil {
		return nil, err
	}
	if !addr.IsValid() {
		addr = netip.IPv4Unspecified()
	}
	l := &listener{cm: c, addr: netip.AddrPortFrom(addr.Unmap(), port), ch: make(chan *connRequest, ListenBacklog),
		done: make(chan struct{})}
	l.handle = c.register(l)
	id, err := C.shim_cm_create_id(c.ch, C.uint64_t(l.handle))
	if id == nil {
		c.unregister(l.handle)
		return nil, errnoErr("rdma_create_id", err)
	}
	l.id = id
	sa := toShimAddr(l.addr)
	if r := C.shim_cm_listen(id, &sa, ListenBacklog); r != 0 {
		c.unregister(l.handle)
		C.rdma_destroy_id(id)
		return nil, fmt.Errorf("verbs: listen on %v: %w", l.addr, negErrno("rdma_listen", r))
	}
	return l, nil
}

func (l *listener) Addr() netip.AddrPort { return l.addr }

// event handles a CONNECT_REQUEST (CM goroutine).
func (l *listener) event(e *cmEvent) {
	if e.typ != C.RDMA_CM_EVENT_CONNECT_REQUEST {
		return
	}
	d := l.cm.d
	reject := func() {
		C.shim_cm_reject(e.id, nil, 0)
		C.rdma_destroy_id(e.id)
	}
	if C.shim_cm_verbs(e.id) != d.ctx {
		// Arrived on another device (a wildcard listener): not ours to accept.
		reject()
		return
	}
	select {
	case <-l.done:
		reject()
		return
	default:
	}
	conn := newConn(l.cm, e.id)
	conn.local, conn.remote = e.local, e.peer
	C.shim_cm_set_handle(e.id, C.uint64_t(conn.handle))
	mtu := e.pathMTU
	if mtu.Bytes() == 0 {
		mtu = d.attr.ActiveMTU
	}
	req := &connRequest{c: conn, pd: e.privateData, info: transport.ConnRequestInfo{
		LocalAddr: e.local, RemoteAddr: e.peer, PacketSrc: e.peer.Addr(), PacketDst: e.local.Addr(),
		RemoteQPN: e.qpNum, PathMTU: mtu, ResponderResources: e.resp, InitiatorDepth: e.init,
		RetryCount: e.retry, RNRRetryCount: e.rnr, FlowControl: e.flowControl, SRQ: e.srq,
	}}
	select {
	case l.ch <- req:
	default:
		l.cm.unregister(conn.handle)
		reject()
	}
}

// Accept implements transport.Listener.
func (l *listener) Accept(ctx context.Context) (transport.ConnRequest, error) {
	select {
	case r := <-l.ch:
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.done:
		return nil, transport.ErrClosed
	}
}

// Close implements transport.Listener.
func (l *listener) Close() error {
	closed := true
	l.once.Do(func() { closed = false })
	if closed {
		return transport.ErrClosed
	}
	l.cm.unregister(l.handle)
	l.finish()
	return nil
}

// shutdown is Close during device close (the ID must go before the channel).
func (l *listener) shutdown() { l.finish() }

func (l *listener) finish() {
	l.finishOnce.Do(func() {
		close(l.done)
		C.rdma_destroy_id(l.id)
		for {
			select {
			case r := <-l.ch:
				_ = r.Reject(nil, transport.RejectConsumerDefined)
			default:
				return
			}
		}
	})
}

// ---- connections ----------------------------------------------------------------------------

type cmConn struct {
	cm     *cmState
	handle uint64
	id     *C.struct_rdma_cm_id
	setup  chan *cmEvent
	events chan transport.CMEvent

	mu            sync.Mutex
	qp            *qp
	local, remote netip.AddrPort
	pd            []byte
	established   bool
	discDelivered bool
	twDelivered   bool
	destroyed     bool
}

func newConn(c *cmState, id *C.struct_rdma_cm_id) *cmConn {
	x := &cmConn{cm: c, id: id, setup: make(chan *cmEvent, 16), events: make(chan transport.CMEvent, 2)}
	x.handle = c.register(x)
	return x
}

func (r *cmConn) QP() transport.QP                 { return r.qp }
func (r *cmConn) LocalAddr() netip.AddrPort        { return r.local }
func (r *cmConn) RemoteAddr() netip.AddrPort       { return r.remote }
func (r *cmConn) PrivateData() []byte              { return r.pd }
func (r *cmConn) Events() <-chan transport.CMEvent { return r.events }

// event (CM goroutine): before the connection is established everything goes to whoever waits
// in Dial or Accept; afterwards DISCONNECTED moves the QP to ERR and is delivered once, and
// TIMEWAIT_EXIT ends the connection (the ID is destroyed).
func (r *cmConn) event(e *cmEvent) {
	r.mu.Lock()
	est := r.established
	r.mu.Unlock()
	if !est {
		select {
		case r.setup <- e:
		default:
			r.cm.d.log.Warn("rdma_cm: connection setup event dropped", zap.Int("event", int(e.typ)))
		}
		return
	}
	switch e.typ {
	case C.RDMA_CM_EVENT_DISCONNECTED, C.RDMA_CM_EVENT_REJECTED, C.RDMA_CM_EVENT_DEVICE_REMOVAL:
		r.disconnected(e)
	case C.RDMA_CM_EVENT_TIMEWAIT_EXIT:
		r.disconnected(e)
		r.mu.Lock()
		deliver := !r.twDelivered
		r.twDelivered = true
		r.mu.Unlock()
		if deliver {
			r.events <- transport.CMEvent{Type: transport.CMEventTimewaitExit}
			close(r.events)
		}
		r.cm.unregister(r.handle)
		r.destroyID()
	}
}

// disconnected moves the QP to ERR and queues CMEventDisconnected (once) while holding the QP's
// lock, which the CQ poller needs to queue completions: the flushes the ERR causes are queued
// after the event, and the event is not seen before the QP is in ERR.
func (r *cmConn) disconnected(e *cmEvent) {
	r.mu.Lock()
	deliver := !r.discDelivered
	r.discDelivered = true
	r.mu.Unlock()
	var ev transport.CMEvent
	if deliver {
		ev = transport.CMEvent{Type: transport.CMEventDisconnected, PrivateData: e.privateData}
		if e.typ == C.RDMA_CM_EVENT_REJECTED {
			ev.Reason = transport.RejectReason(e.status)
			ev.Err = &transport.RejectError{Reason: ev.Reason, PrivateData: e.privateData}
		}
	}
	q := r.qp
	if q == nil {
		if deliver {
			r.events <- ev
		}
		return
	}
	q.mu.Lock()
	q.toErrLocked()
	if deliver {
		r.events <- ev // capacity 2: never blocks
	}
	q.mu.Unlock()
}

func (r *cmConn) destroyID() {
	if claimTeardown(&r.mu, &r.destroyed) {
		C.rdma_destroy_id(r.id)
	}
}

// abandon ends a connection attempt: the ID is destroyed (the kernel CM sends a REJ or DREQ as
// its state requires).
func (r *cmConn) abandon() {
	r.cm.unregister(r.handle)
	if r.qp != nil {
		r.qp.mu.Lock()
		if r.qp.pendingAccept == r {
			r.qp.pendingAccept = nil
		}
		r.qp.mu.Unlock()
	}
	r.destroyID()
}

// wait returns the next setup event, or ctx's error.
func (r *cmConn) wait(ctx context.Context) (*cmEvent, error) {
	select {
	case e := <-r.setup:
		return e, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-r.cm.closed:
		return nil, transport.ErrClosed
	}
}

func (r *cmConn) markEstablished() {
	r.mu.Lock()
	r.established = true
	r.mu.Unlock()
}

// notifyEstablished passes a COMM_EST async event on to rdma_cm (the peer's first packet came
// before its RTU).
func (r *cmConn) notifyEstablished() { C.rdma_notify(r.id, C.IBV_EVENT_COMM_EST) }

// Disconnect implements transport.CMConn. rdma_cm's DREQ carries no private data.
func (r *cmConn) Disconnect(privateData []byte) error {
	if len(privateData) > transport.MaxDisconnectPrivateData {
		return fmt.Errorf("verbs: disconnect with %d bytes of private data: %w", len(privateData), transport.ErrInvalidArgument)
	}
	if r.qp != nil {
		r.qp.toErr()
	}
	r.mu.Lock()
	gone := r.destroyed
	r.mu.Unlock()
	if !gone {
		C.rdma_disconnect(r.id) // EINVAL once disconnected: idempotent
	}
	return nil
}

// setupError maps a failed connection attempt's event to the API's errors.
func setupError(e *cmEvent) error {
	switch e.typ {
	case C.RDMA_CM_EVENT_REJECTED:
		if e.status > 0 {
			return &transport.RejectError{Reason: transport.RejectReason(e.status), PrivateData: e.privateData}
		}
		return fmt.Errorf("%w: rejected locally (%v)", transport.ErrConnUnreachable, syscall.Errno(-e.status))
	case C.RDMA_CM_EVENT_DISCONNECTED:
		return transport.ErrConnDisconnected
	case C.RDMA_CM_EVENT_UNREACHABLE, C.RDMA_CM_EVENT_CONNECT_ERROR, C.RDMA_CM_EVENT_ADDR_ERROR,
		C.RDMA_CM_EVENT_ROUTE_ERROR:
		st := e.status
		if st < 0 {
			st = -st
		}
		return fmt.Errorf("%w: rdma_cm event %s (%v)", transport.ErrConnUnreachable,
			C.GoString(C.rdma_event_str(uint32(e.typ))), syscall.Errno(st))
	}
	return fmt.Errorf("%w: unexpected rdma_cm event %s", transport.ErrConnUnreachable, C.GoString(C.rdma_event_str(uint32(e.typ))))
}

func (d *Device) cmQP(t transport.QP) (*qp, error) {
	q, ok := t.(*qp)
	if !ok || q == nil || q.dev != d {
		return nil, transport.ErrWrongDevice
	}
	q.mu.Lock()
	st, closed := q.state, q.closed
	q.mu.Unlock()
	if closed {
		return nil, transport.ErrClosed
	}
	if st != transport.QPSReset && st != transport.QPSInit {
		return nil, fmt.Errorf("QP %#x in %v (want RESET or INIT): %w", q.qpn, st, transport.ErrQPState)
	}
	return q, nil
}

func defaultRetry(v uint8) uint8 {
	if v == 0 || v > 7 {
		return 7
	}
	return v
}

// Dial implements transport.ConnManager.
func (d *Device) Dial(ctx context.Context, remote netip.AddrPort, tqp transport.QP, privateData []byte, param transport.ConnParam) (transport.CMConn, error) {
	q, err := d.cmQP(tqp)
	if err != nil {
		return nil, fmt.Errorf("verbs: dial %v: %w", remote, err)
	}
	if len(privateData) > transport.MaxDialPrivateData {
		return nil, fmt.Errorf("verbs: dial %v: %d bytes of private data: %w", remote, len(privateData), transport.ErrInvalidArgument)
	}
	ra := remote.Addr().Unmap()
	if !ra.IsValid() || ra.IsUnspecified() || remote.Port() == 0 {
		return nil, fmt.Errorf("verbs: dial %v: %w", remote, transport.ErrInvalidArgument)
	}
	c, err := d.cmGet()
	if err != nil {
		return nil, err
	}
	r := newConn(c, nil)
	id, cerr := C.shim_cm_create_id(c.ch, C.uint64_t(r.handle))
	if id == nil {
		c.unregister(r.handle)
		return nil, errnoErr("rdma_create_id", cerr)
	}
	r.id = id
	fail := func(err error) (transport.CMConn, error) {
		r.abandon()
		return nil, fmt.Errorf("verbs: dial %v: %w", remote, err)
	}
	var src C.struct_shim_addr
	for _, a := range d.Addrs() {
		if a.Addr().Unmap().Is4() == ra.Is4() {
			src = toShimAddr(netip.AddrPortFrom(a.Addr(), 0))
			break
		}
	}
	dst := toShimAddr(netip.AddrPortFrom(ra, remote.Port()))
	if rc := C.shim_cm_resolve_addr(id, &src, &dst, 2000); rc != 0 {
		return fail(negErrno("rdma_resolve_addr", rc))
	}
	e, err := r.wait(ctx)
	if err != nil {
		return fail(err)
	}
	if e.typ != C.RDMA_CM_EVENT_ADDR_RESOLVED {
		return fail(setupError(e))
	}
	if C.shim_cm_verbs(id) != d.ctx {
		return fail(fmt.Errorf("%w: %v is not reached through %s", transport.ErrConnUnreachable, ra, d.name))
	}
	if rc, err := C.rdma_resolve_route(id, 2000); rc != 0 {
		return fail(errnoErr("rdma_resolve_route", err))
	}
	if e, err = r.wait(ctx); err != nil {
		return fail(err)
	}
	if e.typ != C.RDMA_CM_EVENT_ROUTE_RESOLVED {
		return fail(setupError(e))
	}
	if err := q.cmModify(id, transport.QPSInit, -1); err != nil {
		return fail(err)
	}
	r.qp = q
	cp := C.struct_shim_connparam{qp_num: C.uint32_t(q.qpn),
		responder_resources: C.uint8_t(min(int(param.ResponderResources), d.attr.MaxQPInitRdAtom)),
		initiator_depth:     C.uint8_t(min(int(param.InitiatorDepth), d.attr.MaxQPRdAtom)),
		retry_count:         C.uint8_t(defaultRetry(param.RetryCount)),
		rnr_retry_count:     C.uint8_t(defaultRetry(param.RNRRetryCount)),
		pd_len:              C.uint8_t(len(privateData))}
	if param.FlowControl {
		cp.flow_control = 1
	}
	for i, b := range privateData {
		cp.pd[i] = C.uint8_t(b)
	}
	if rc := C.shim_cm_connect(id, &cp); rc != 0 {
		return fail(negErrno("rdma_connect", rc))
	}
	if e, err = r.wait(ctx); err != nil {
		return fail(err)
	}
	if e.typ != C.RDMA_CM_EVENT_CONNECT_RESPONSE && e.typ != C.RDMA_CM_EVENT_ESTABLISHED {
		return fail(setupError(e))
	}
	r.pd, r.local, r.remote = e.privateData, e.local, e.peer
	if e.typ == C.RDMA_CM_EVENT_CONNECT_RESPONSE {
		// INIT again first, as librdmacm does: before the REP rdma_cm derives no remote access
		// rights for the QP (REMOTE_WRITE, and REMOTE_READ with responder resources).
		if err := q.cmModify(id, transport.QPSInit, -1); err != nil {
			return fail(err)
		}
		if err := q.cmModify(id, transport.QPSRTR, -1); err != nil {
			return fail(err)
		}
		if err := q.cmModify(id, transport.QPSRTS, -1); err != nil {
			return fail(err)
		}
		r.markEstablished()
		if rc, err := C.rdma_establish(id); rc != 0 {
			r.mu.Lock()
			r.established = false
			r.mu.Unlock()
			return fail(errnoErr("rdma_establish", err))
		}
	} else {
		r.markEstablished()
	}
	return r, nil
}

// ---- requests -------------------------------------------------------------------------------

type connRequest struct {
	c    *cmConn
	pd   []byte
	info transport.ConnRequestInfo

	mu       sync.Mutex
	answered bool
}

func (r *connRequest) PrivateData() []byte             { return r.pd }
func (r *connRequest) Info() transport.ConnRequestInfo { return r.info }

func (r *connRequest) answer() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answered {
		return errAnswered
	}
	r.answered = true
	return nil
}

// Accept implements transport.ConnRequest.
func (r *connRequest) Accept(ctx context.Context, tqp transport.QP, privateData []byte, param transport.ConnParam) (transport.CMConn, error) {
	c := r.c
	d := c.cm.d
	q, err := d.cmQP(tqp)
	if err != nil {
		return nil, fmt.Errorf("verbs: accept: %w", err)
	}
	if len(privateData) > transport.MaxAcceptPrivateData {
		return nil, fmt.Errorf("verbs: accept: %d bytes of private data: %w", len(privateData), transport.ErrInvalidArgument)
	}
	if err := r.answer(); err != nil {
		return nil, fmt.Errorf("verbs: accept: %w", err)
	}
	fail := func(err error) (transport.CMConn, error) {
		c.abandon()
		return nil, fmt.Errorf("verbs: accept: %w", err)
	}
	resp := min(int(param.ResponderResources), d.attr.MaxQPInitRdAtom)
	init := int(param.InitiatorDepth)
	if init == 0 {
		init = int(r.info.InitiatorDepth)
	}
	init = min(init, d.attr.MaxQPRdAtom)
	// RESET or INIT → INIT with the access rights rdma_cm derives from the request.
	if err := q.cmModify(c.id, transport.QPSInit, -1); err != nil {
		return fail(err)
	}
	if err := q.cmModify(c.id, transport.QPSRTR, resp); err != nil {
		return fail(err)
	}
	if err := q.cmModify(c.id, transport.QPSRTS, init); err != nil {
		return fail(err)
	}
	c.qp = q
	q.mu.Lock()
	q.pendingAccept = c
	q.mu.Unlock()
	defer func() {
		q.mu.Lock()
		if q.pendingAccept == c {
			q.pendingAccept = nil
		}
		q.mu.Unlock()
	}()
	cp := C.struct_shim_connparam{qp_num: C.uint32_t(q.qpn), responder_resources: C.uint8_t(resp),
		initiator_depth: C.uint8_t(init), rnr_retry_count: C.uint8_t(defaultRetry(param.RNRRetryCount)),
		pd_len: C.uint8_t(len(privateData))}
	if param.FlowControl {
		cp.flow_control = 1
	}
	for i, b := range privateData {
		cp.pd[i] = C.uint8_t(b)
	}
	if rc := C.shim_cm_accept(c.id, &cp); rc != 0 {
		return fail(negErrno("rdma_accept", rc))
	}
	for {
		e, err := c.wait(ctx)
		if err != nil {
			return fail(err)
		}
		switch e.typ {
		case C.RDMA_CM_EVENT_ESTABLISHED:
			c.pd = e.privateData
			c.markEstablished()
			return c, nil
		case C.RDMA_CM_EVENT_CONNECT_RESPONSE:
			continue
		}
		return fail(setupError(e))
	}
}

// Reject implements transport.ConnRequest. rdma_cm rejects with reason 28 (consumer defined)
// only; other reasons are refused with ErrNotSupported and the request stays unanswered.
func (r *connRequest) Reject(privateData []byte, reason transport.RejectReason) error {
	if len(privateData) > transport.MaxRejectPrivateData {
		return fmt.Errorf("verbs: reject: %d bytes of private data: %w", len(privateData), transport.ErrInvalidArgument)
	}
	if reason != transport.RejectConsumerDefined {
		return fmt.Errorf("verbs: reject with reason %v: rdma_cm sends only %v: %w", reason, transport.RejectConsumerDefined, transport.ErrNotSupported)
	}
	if err := r.answer(); err != nil {
		return fmt.Errorf("verbs: reject: %w", err)
	}
	var buf *C.uint8_t
	if len(privateData) > 0 {
		buf = (*C.uint8_t)(C.CBytes(privateData))
		defer C.free(unsafe.Pointer(buf))
	}
	rc := C.shim_cm_reject(r.c.id, buf, C.int(len(privateData)))
	r.c.abandon()
	if rc != 0 {
		return negErrno("rdma_reject", rc)
	}
	return nil
}

// MRA implements transport.ConnRequest. The kernel's rdma_cm has already sent an MRA for every
// request it hands to user space, so there is nothing to send.
func (r *connRequest) MRA(serviceTimeout uint8, privateData []byte) error {
	if len(privateData) > transport.MaxMRAPrivateData || serviceTimeout > 31 {
		return fmt.Errorf("verbs: MRA: %w", transport.ErrInvalidArgument)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answered {
		return errAnswered
	}
	return nil
}
