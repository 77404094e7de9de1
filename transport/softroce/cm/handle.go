package cm

import (
	"net/netip"
	"time"

	"github.com/srpd/srpd/transport"
)

// HandleMAD processes one received MAD: mad is the 256-byte payload of a UD SEND that
// arrived on QP1, src the packet's IP source (replies go there) and dst its IP destination
// (our address; replies come from it). A MAD that is not a CM message we can parse is
// ignored and the parse error returned (for counting); a well-formed MAD that matches no
// connection is answered or dropped as the kernel CM does and nil is returned. HandleMAD never
// panics, whatever the bytes.
func (m *Manager) HandleMAD(now time.Duration, src, dst netip.Addr, mad []byte, out *Outputs) error {
	if !src.IsValid() || !dst.IsValid() {
		return ErrInvalidArgument
	}
	src, dst = src.Unmap(), dst.Unmap()
	if src.Is4() != dst.Is4() {
		return ErrInvalidArgument
	}
	b, err := Check(mad)
	if err != nil {
		return err
	}
	switch b.AttributeID() {
	case AttrREQ:
		m.handleREQ(now, src, dst, REQ(b), out)
	case AttrREP:
		m.handleREP(now, src, dst, REP(b), out)
	case AttrRTU:
		m.handleRTU(RTU(b), out)
	case AttrREJ:
		m.handleREJ(now, REJ(b), out)
	case AttrMRA:
		m.handleMRA(now, MRA(b), out)
	case AttrDREQ:
		m.handleDREQ(now, src, dst, DREQ(b), out)
	case AttrDREP:
		m.handleDREP(now, DREP(b), out)
	case AttrSIDRREQ:
		// No UD service is offered: answer "service ID not supported" as cm.c
		// cm_sidr_req_handler does when no listener matches (cm_reject_sidr_req).
		r := SIDRREQ(b)
		rep := SIDRREP(out.mad(0, dst, src, AttrSIDRREP, b.TransactionID()))
		rep.SetRequestID(r.RequestID())
		rep.SetStatus(SIDRUnsupported)
		rep.SetServiceID(r.ServiceID())
	case AttrLAP:
		// Alternate paths are not supported over RoCE (cm_lap_handler returns early for RoCE
		// ports and drops the LAP). We answer a LAP for a connection we know with an APR
		// "unsupported" so that a non-Linux peer does not wait for its retries to run out.
		r := LAP(b)
		if c := m.lookup(r.RemoteCommID(), r.LocalCommID()); c != nil && c.state == StateEstablished {
			a := APR(out.mad(c.id, dst, src, AttrAPR, b.TransactionID()))
			a.SetLocalCommID(uint32(c.id))
			a.SetRemoteCommID(c.remoteID)
			a.SetAPStatus(APRUnsupported)
		}
	default:
		// SIDR_REP, APR: we never send SIDR_REQ or LAP; drop.
	}
	return nil
}

// lookup is cm.c cm_acquire_id(local, remote): the connection with our comm ID local whose
// peer's comm ID is remote.
func (m *Manager) lookup(local, remote uint32) *conn {
	c := m.conns[ConnID(local)]
	if c == nil || c.remoteID != remote {
		return nil
	}
	return c
}

// rejectStale answers a REQ or REP (msg; msgRejected says which) whose sender reuses a QPN that
// the connection stale still holds: a REJ with reason STALE_CONN, and if stale is established,
// its QP to error and a DREQ (cm.c cm_req_handler and cm_rep_handler, both on a remote QPN
// already in the table).
func (m *Manager) rejectStale(now time.Duration, stale *conn, src, dst netip.Addr, msg []byte, msgRejected uint8, out *Outputs) {
	issueREJ(src, dst, msg, transport.RejectStaleConn, msgRejected, out)
	if stale.state == StateEstablished {
		m.qpError(stale, out)
		m.sendDREQ(now, stale, nil, out)
	}
}

// handleREQ is cm.c cm_req_handler + cm_match_req, followed by the RDMA CM checks of
// cma_ib_req_handler.
func (m *Manager) handleREQ(now time.Duration, src, dst netip.Addr, r REQ, out *Outputs) {
	guid := r.LocalCAGUID()
	// Duplicate REQ (same peer comm ID and CA GUID)?
	if c := m.byRemoteID[remoteKey{guid, r.LocalCommID()}]; c != nil {
		m.dupREQ(c, src, out)
		return
	}
	// Stale connection: the peer reuses a QPN we still know (connected or in timewait).
	if c := m.byRemoteQPN[remoteKey{guid, r.LocalQPN()}]; c != nil {
		m.rejectStale(now, c, src, dst, r, MsgResponseREQ, out)
		return
	}
	// Find the listener: service ID in the TCP port space, then the RDMA CM header address.
	ps, port, ok := ParseServiceID(r.ServiceID())
	if !ok || ps != PortSpaceTCP || m.ports[port] == 0 {
		issueREJ(src, dst, r, transport.RejectInvalidServiceID, MsgResponseREQ, out)
		return
	}
	hdr, err := ParseCMAHeader(r.PrivateData())
	var lis netip.AddrPort
	if err == nil {
		lis, ok = m.findListener(hdr.DstAddr(), port)
	}
	if err != nil || !ok || r.TransportServiceType() != 0 || r.ExtendedTransportType() != 0 {
		// cma_ib_req_handler fails (bad header, no listener bound to that address, QP type
		// mismatch): the new cm_id is destroyed in REQ_RCVD, i.e. a consumer-defined REJ.
		issueREJ(src, dst, r, transport.RejectConsumerDefined, MsgResponseREQ, out)
		return
	}
	if mtu := transport.MTU(r.PathMTU()); mtu.Bytes() == 0 {
		issueREJ(src, dst, r, transport.RejectInvalidMTU, MsgResponseREQ, out)
		return
	}
	if len(m.conns) >= m.cfg.MaxConns {
		issueREJ(src, dst, r, transport.RejectNoResources, MsgResponseREQ, out)
		return
	}

	c := m.newConn(m.newCommID())
	c.local, c.remote = dst, src
	c.listener = lis
	c.serviceID = r.ServiceID()
	c.cmaSrc = netip.AddrPortFrom(hdr.SrcAddr(), hdr.SrcPort())
	c.cmaDst = netip.AddrPortFrom(hdr.DstAddr(), port)
	m.setRemote(c, guid, r.LocalCommID(), r.LocalQPN())
	c.tid = be64(r[8:])
	// cm_req_handler: timeout = ms(REQ Local CM Response Timeout), retries = REQ Max CM
	// Retries; resources mapped (our initiator depth = their responder resources).
	c.timeout = TimeoutDuration(r.LocalCMResponseTimeout())
	c.maxRetries = r.MaxCMRetries()
	c.offerInit = r.ResponderResources()
	c.offerResp = r.InitiatorDepth()
	c.initDepth, c.respRes = c.offerInit, c.offerResp
	c.mtu = r.PathMTU()
	c.sqPSN = r.StartingPSN()
	c.retryCount = r.RetryCount()
	c.rnrRetry = r.RNRRetryCount()
	c.reqRNRRetry = c.rnrRetry
	c.flowControl = r.EndToEndFlowControl()
	c.srq = r.SRQ()
	c.peerECE = ECE{VendorID: r.VendorID(), AttrMod: be32(r[madAttrMod:])}
	pp := r.PrimaryPath()
	// cm_format_paths_from_req: packet_life_time = ack timeout - 1, av.timeout = that + 1.
	c.reqAckTO = pp.LocalACKTimeout()
	c.avTimeout = max(c.reqAckTO, 1)
	c.flowLabel = pp.FlowLabel()
	c.tclass = pp.TrafficClass()
	c.hopLimit = pp.HopLimit()
	if c.hopLimit == 0 {
		c.hopLimit = m.cfg.HopLimit
	}
	c.state = StateReqRcvd
	m.arm(c, now+m.cfg.DecisionTimeout, timerDecision, out)

	e := Event{Kind: EventRequest, PrivateData: out.copyBytes(r.PrivateData()[CMAHeaderLen:])}
	e.Request = RequestInfo{
		ConnRequestInfo: transport.ConnRequestInfo{
			LocalAddr: c.cmaDst, RemoteAddr: c.cmaSrc, PacketSrc: src, PacketDst: dst,
			RemoteQPN: c.remoteQPN, RemoteCAGUID: guid, StartingPSN: c.sqPSN,
			PathMTU: transport.MTU(c.mtu), ResponderResources: c.respRes,
			InitiatorDepth: c.initDepth, RetryCount: c.retryCount, RNRRetryCount: c.rnrRetry,
			FlowControl: c.flowControl, SRQ: c.srq,
		},
		Listener: lis, ServiceID: c.serviceID, ECE: c.peerECE,
	}
	m.emit(c, out, e)
}

// dupREQ is cm.c cm_dup_req_handler, plus: a REQ repeated after our REP means the REP was
// lost, so it is sent again at once (the kernel waits for its own REP timeout).
func (m *Manager) dupREQ(c *conn, src netip.Addr, out *Outputs) {
	switch c.state {
	case StateReqRcvd:
		// RDMA CM arms a delayed MRA (CMA_CM_MRA_SETTING) while the ULP decides: a
		// duplicate REQ makes it go out.
		c.serviceTimeout = m.cfg.MRAServiceTimeout
		c.pdLen = 0
		c.state = StateMRAReqSent
		m.sendMRA(c, src, out)
	case StateMRAReqSent:
		m.sendMRA(c, src, out)
	case StateRepSent, StateMRARepRcvd:
		if c.pending {
			m.resendPending(c, src, out)
		}
	case StateTimewait:
		m.sendREJTo(c, src, transport.RejectStaleConn, out)
	}
}

// sendREJTo sends a REJ formatted from the connection state (cm_format_rej) to dst.
func (m *Manager) sendREJTo(c *conn, dst netip.Addr, reason transport.RejectReason, out *Outputs) {
	remote := c.remote
	c.remote = dst
	m.sendREJ(c, reason, nil, nil, out)
	c.remote = remote
}

// handleREP is cm.c cm_rep_handler (active side), with cm_dup_rep_handler for REPs of
// connections that already have one.
func (m *Manager) handleREP(now time.Duration, src, dst netip.Addr, r REP, out *Outputs) {
	c := m.conns[ConnID(r.RemoteCommID())]
	if c == nil || !c.active || c.remoteIDSet {
		// Duplicate: re-send the RTU if established.
		if d := m.lookup(r.RemoteCommID(), r.LocalCommID()); d != nil && d.active && d.state == StateEstablished {
			m.sendRTU(d, src, out)
		}
		return
	}
	if c.state != StateReqSent && c.state != StateMRAReqRcvd {
		return
	}
	guid := r.LocalCAGUID()
	if m.byRemoteID[remoteKey{guid, r.LocalCommID()}] != nil {
		return // duplicate (CA GUID, comm ID): dropped
	}
	if old := m.byRemoteQPN[remoteKey{guid, r.LocalQPN()}]; old != nil {
		// Stale connection: this one stays in REQ_SENT (cm_rep_handler "goto error").
		m.rejectStale(now, old, src, dst, r, MsgResponseREP, out)
		return
	}
	m.stopPending(c, out)
	m.setRemote(c, guid, r.LocalCommID(), r.LocalQPN())
	// Resource mapping (cm_rep_handler): our initiator depth = their responder resources.
	c.initDepth = clampNZ(r.ResponderResources(), m.cfg.MaxRdAtomic)
	c.respRes = clampNZ(r.InitiatorDepth(), m.cfg.MaxDestRdAtomic)
	c.sqPSN = r.StartingPSN()
	c.rnrRetry = r.RNRRetryCount()
	c.avTimeout = AckTimeout(r.TargetACKDelay(), c.avTimeout-1)
	c.peerECE = ECE{VendorID: r.VendorID(), AttrMod: be32(r[madAttrMod:])}
	c.state = StateRepRcvd
	// cma_rep_recv: QP to RTR and RTS (cma_modify_qp_rtr re-applies INIT first), then RTU.
	m.qpInit(c, out)
	m.qpRTR(c, out)
	m.qpRTS(c, out)
	c.pdLen = 0
	m.sendRTU(c, c.remote, out)
	c.state = StateEstablished
	m.emit(c, out, Event{Kind: EventEstablished, PrivateData: out.copyBytes(r.PrivateData())})
}

// handleRTU is cm.c cm_rtu_handler.
func (m *Manager) handleRTU(r RTU, out *Outputs) {
	c := m.lookup(r.RemoteCommID(), r.LocalCommID())
	if c == nil || (c.state != StateRepSent && c.state != StateMRARepRcvd) {
		return
	}
	m.stopPending(c, out)
	c.state = StateEstablished
	m.emit(c, out, Event{Kind: EventEstablished, PrivateData: out.copyBytes(r.PrivateData())})
}

// handleREJ is cm.c cm_rej_handler with cm_acquire_rejected_id.
func (m *Manager) handleREJ(now time.Duration, r REJ, out *Outputs) {
	var c *conn
	reason := transport.RejectReason(r.Reason())
	switch {
	case reason == transport.RejectTimeout:
		// The ARI carries the rejecting CA's GUID; look up by (GUID, its comm ID).
		c = m.byRemoteID[remoteKey{be64(r.ARIField()), r.LocalCommID()}]
	case r.MessageRejected() == MsgResponseREQ:
		c = m.conns[ConnID(r.RemoteCommID())]
		if c != nil && c.remoteID != 0 {
			c = nil
		}
	default:
		c = m.lookup(r.RemoteCommID(), r.LocalCommID())
	}
	if c == nil {
		return
	}
	switch c.state {
	case StateReqSent, StateMRAReqRcvd, StateRepSent, StateMRARepRcvd, StateReqRcvd, StateMRAReqSent:
		m.stopPending(c, out)
		m.qpError(c, out)
		m.emit(c, out, Event{Kind: EventRejected, Reason: reason,
			PrivateData: out.copyBytes(r.PrivateData()), ARI: out.copyBytes(r.ARI())})
		if reason == transport.RejectStaleConn {
			m.enterTimewait(now, c, out)
		} else {
			m.release(c, out)
		}
	case StateDreqSent, StateRepRcvd, StateEstablished:
		m.stopPending(c, out)
		m.qpError(c, out)
		m.enterTimewait(now, c, out)
		m.disconnected(c, out, Event{Kind: EventDisconnected, Reason: reason,
			PrivateData: out.copyBytes(r.PrivateData())})
	}
}

// handleMRA is cm.c cm_mra_handler: the pending REQ or REP waits ms(service timeout) +
// ms(av.timeout) before its next retransmission (ib_modify_mad).
func (m *Manager) handleMRA(now time.Duration, r MRA, out *Outputs) {
	var c *conn
	switch r.MessageMRAed() {
	case MsgResponseREQ:
		c = m.conns[ConnID(r.RemoteCommID())]
		if c != nil && c.remoteID != 0 {
			c = nil
		}
	case MsgResponseREP, MsgResponseOther:
		c = m.lookup(r.RemoteCommID(), r.LocalCommID())
	}
	if c == nil || !c.pending {
		return
	}
	switch {
	case c.state == StateReqSent && r.MessageMRAed() == MsgResponseREQ:
		c.state = StateMRAReqRcvd
	case c.state == StateRepSent && r.MessageMRAed() == MsgResponseREP:
		c.state = StateMRARepRcvd
	default:
		return
	}
	c.msgTimeout = TimeoutDuration(r.ServiceTimeout()) + TimeoutDuration(c.avTimeout)
	m.arm(c, now+c.msgTimeout, timerRetry, out)
}

// handleDREQ is cm.c cm_dreq_handler followed by what the RDMA CM ULP does on
// RDMA_CM_EVENT_DISCONNECTED (rdma_disconnect: QP to ERR, then the DREP), done at once.
func (m *Manager) handleDREQ(now time.Duration, src, dst netip.Addr, r DREQ, out *Outputs) {
	c := m.lookup(r.RemoteCommID(), r.LocalCommID())
	if c == nil {
		// cm_issue_drep: answer even without a connection.
		d := DREP(out.mad(0, dst, src, AttrDREP, be64(r[8:])))
		d.SetRemoteCommID(r.LocalCommID())
		d.SetLocalCommID(r.RemoteCommID())
		return
	}
	if c.localQPN != r.RemoteQPN() {
		return // not for this QP: ignored
	}
	switch c.state {
	case StateRepSent, StateMRARepRcvd, StateDreqSent, StateEstablished:
		m.stopPending(c, out)
	case StateTimewait:
		m.sendDREPTo(c, src, out)
		return
	default:
		return // DREQ_RCVD (duplicate) and states without a connection
	}
	c.state = StateDreqRcvd
	c.tid = be64(r[8:])
	m.qpError(c, out)
	m.sendDREP(c, nil, out)
	m.enterTimewait(now, c, out)
	m.disconnected(c, out, Event{Kind: EventDisconnected, PrivateData: out.copyBytes(r.PrivateData())})
}

// handleDREP is cm.c cm_drep_handler.
func (m *Manager) handleDREP(now time.Duration, r DREP, out *Outputs) {
	c := m.lookup(r.RemoteCommID(), r.LocalCommID())
	if c == nil || (c.state != StateDreqSent && c.state != StateDreqRcvd) {
		return
	}
	m.stopPending(c, out)
	m.enterTimewait(now, c, out)
	m.disconnected(c, out, Event{Kind: EventDisconnected, PrivateData: out.copyBytes(r.PrivateData())})
}
