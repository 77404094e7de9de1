package cm

import (
	"net/netip"
	"time"

	"github.com/srpd/srpd/transport"
)

// conn is one connection (cm.c struct cm_id_private, with the RDMA CM bits we need).
type conn struct {
	id     ConnID
	state  State
	active bool

	// peerECE is the ECE of the peer's REQ (passive) or REP (active); the RTR QPUpdate
	// carries it.
	peerECE ECE

	silent         bool // destroyed or rejected by the ULP: no further events
	disconnectSent bool // EventDisconnected delivered
	qpTouched      bool // a QPUpdate was emitted
	qpErr          bool // the ERR QPUpdate was emitted

	local, remote  netip.Addr     // packet addresses: ours and the peer's
	cmaSrc, cmaDst netip.AddrPort // RDMA CM: dialler (header source) and listener
	listener       netip.AddrPort
	serviceID      uint64

	remoteID    uint32
	remoteGUID  uint64
	remoteIDSet bool
	localQPN    uint32
	remoteQPN   uint32
	tid         uint64 // cm_id_priv->tid: the REQ's (passive) / ours, or the last DREQ's

	// Negotiated parameters, with cm_id_priv's meaning (our side's view).
	mtu         uint8
	respRes     uint8 // our max_dest_rd_atomic
	initDepth   uint8 // our max_rd_atomic
	retryCount  uint8
	rnrRetry    uint8
	sqPSN       uint32
	rqPSN       uint32
	avTimeout   uint8 // av.timeout: QP local ACK timeout and timewait length
	flowLabel   uint32
	tclass      uint8
	hopLimit    uint8
	minRNRTimer uint8
	flowControl bool
	srq         bool
	reqAckTO    uint8 // passive: REQ primary Local ACK Timeout
	offerInit   uint8 // passive: REQ Responder Resources (what the peer serves us)
	offerResp   uint8 // passive: REQ Initiator Depth
	reqRNRRetry uint8 // passive: REQ RNR Retry Count

	// Message retransmission (one pending message: REQ, REP or DREQ).
	timeout     time.Duration // cm_id_priv->timeout_ms
	maxRetries  uint8
	pending     bool
	retriesLeft uint8
	msgTimeout  time.Duration // the pending message's timeout (extended by an MRA)
	msg         [MADLen]byte

	// Kept for answering duplicates (cm_set_private_data): RTU/MRA/DREP private data.
	pd             [RTUPrivateDataSize]byte
	pdLen          int
	serviceTimeout uint8

	// Timer.
	timer    timerKind
	deadline time.Duration
	timerSeq uint64
	heapIdx  int
}

func (c *conn) setPD(b []byte) { c.pdLen = copy(c.pd[:], b) }

// DialParams are the arguments of Dial.
type DialParams struct {
	// LocalAddr is our IP (the GID the REQ names and RC packets come from); RemoteAddr the
	// peer's. Same family.
	LocalAddr, RemoteAddr netip.Addr
	// SrcPort is our RDMA CM port (RDMA CM header, flow label); 0 picks an ephemeral one.
	SrcPort uint16
	// DstPort is the peer's RDMA CM port (service ID 0x0000000001060000 | DstPort).
	DstPort uint16
	// QPN is our RC QP (in RESET; Dial emits its INIT update).
	QPN uint32
	// PrivateData is the ULP's REQ private data (≤ 56 bytes; the RDMA CM header is added).
	PrivateData []byte
	Param       transport.ConnParam
	// PathMTU is the path MTU to offer (REQ Path Packet Payload MTU). 0 means 1024.
	PathMTU transport.MTU
	// TrafficClass is the REQ/AV traffic class (IPv4 TOS).
	TrafficClass uint8
	// HopLimit 0 means Config.HopLimit (64).
	HopLimit uint8
	// ECE goes into the REQ (vendor ID at bytes 29-31, attribute modifier in the MAD header),
	// as rdma_connect_ece does; zero (the kernel ULPs' value) leaves both fields 0.
	ECE ECE
}

// ECE is Enhanced Connection Establishment data (struct rdma_ucm_ece,
// torvalds/linux:include/uapi/rdma/rdma_user_cm.h): a 24-bit vendor ID and a 32-bit attribute
// modifier carried by REQ and REP. cm.c cm_format_req/cm_format_rep write them
// (cm_format_mad_ece_hdr puts attr_mod in the MAD header's AttributeModifier) and
// cm_req_handler/cm_rep_handler read them back; a kernel passive side that has no ECE of its
// own answers with the REQ's (cma.c cma_accept_ib copies id_priv->ece into the REP).
type ECE struct {
	VendorID uint32 // 24 bits
	AttrMod  uint32
}

// Dial starts an active connection: it emits the QP's INIT update, sends a REQ formatted as
// the kernel's RDMA CM formats one for RoCE (cm.c cm_format_req after cma_connect_ib and
// cma_resolve_iboe_route) and arms the REQ retransmission timer.
func (m *Manager) Dial(now time.Duration, p *DialParams, out *Outputs) (ConnID, error) {
	if p.QPN == 0 || p.QPN > 0xFFFFFF || !p.LocalAddr.IsValid() || !p.RemoteAddr.IsValid() ||
		p.LocalAddr.Unmap().Is4() != p.RemoteAddr.Unmap().Is4() || p.RemoteAddr.IsUnspecified() {
		return 0, ErrInvalidArgument
	}
	if len(p.PrivateData) > ULPREQPrivateDataSize {
		return 0, ErrPrivateDataTooLong
	}
	mtu := p.PathMTU
	if mtu == 0 {
		mtu = transport.MTU1024
	}
	if mtu.Bytes() == 0 {
		return 0, ErrInvalidArgument
	}
	if len(m.conns) >= m.cfg.MaxConns {
		return 0, ErrNoResources
	}
	cfg := &m.cfg
	c := m.newConn(m.newCommID())
	c.active = true
	c.local, c.remote = p.LocalAddr.Unmap(), p.RemoteAddr.Unmap()
	sport := p.SrcPort
	if sport == 0 {
		sport = m.ephemeralPort()
	}
	c.cmaSrc = netip.AddrPortFrom(c.local, sport)
	c.cmaDst = netip.AddrPortFrom(c.remote, p.DstPort)
	c.serviceID = ServiceID(PortSpaceTCP, p.DstPort)
	c.localQPN = p.QPN
	c.mtu = uint8(mtu)
	c.respRes = clampNZ(p.Param.ResponderResources, cfg.MaxDestRdAtomic)
	c.initDepth = clampNZ(p.Param.InitiatorDepth, cfg.MaxRdAtomic)
	c.retryCount = orDefault7(p.Param.RetryCount)
	c.rnrRetry = orDefault7(p.Param.RNRRetryCount) // replaced by the REP's
	c.minRNRTimer = p.Param.MinRNRTimer & 0x1F
	c.flowControl, c.srq = p.Param.FlowControl, p.Param.SRQ
	c.rqPSN = m.psn() // RDMA CM seq_num: REQ Starting PSN = our rq_psn
	c.tclass = p.TrafficClass
	c.hopLimit = p.HopLimit
	if c.hopLimit == 0 {
		c.hopLimit = cfg.HopLimit
	}
	c.flowLabel = FlowLabel(sport, p.DstPort)
	// cm.c ib_send_cm_req: av.timeout = packet_life_time + 1 (cm_init_av_by_path), timeout_ms
	// = 2 × ms(packet life) + ms(remote CM response timeout), retries = max_cm_retries.
	c.avTimeout = cfg.PacketLifeTime + 1
	c.timeout = 2*TimeoutDuration(cfg.PacketLifeTime) + TimeoutDuration(cfg.CMResponseTimeout)
	c.maxRetries = cfg.MaxCMRetries
	c.tid = TID(cfg.HiTID, uint32(c.id))

	b := InitMAD(c.msg[:], AttrREQ, c.tid)
	r := REQ(b)
	r.SetLocalCommID(uint32(c.id))
	r.SetServiceID(c.serviceID)
	r.SetLocalCAGUID(cfg.GUID)
	r.SetLocalQPN(c.localQPN)
	r.SetResponderResources(c.respRes)
	r.SetInitiatorDepth(c.initDepth)
	r.SetRemoteCMResponseTimeout(cfg.CMResponseTimeout)
	r.SetTransportServiceType(0) // RC
	r.SetEndToEndFlowControl(c.flowControl)
	r.SetStartingPSN(c.rqPSN)
	r.SetLocalCMResponseTimeout(cfg.CMResponseTimeout)
	r.SetRetryCount(c.retryCount)
	r.SetPartitionKey(DefaultPKey)
	r.SetPathMTU(c.mtu)
	r.SetRNRRetryCount(c.rnrRetry)
	r.SetMaxCMRetries(cfg.MaxCMRetries)
	r.SetSRQ(c.srq)
	setECE(b, p.ECE, r.SetVendorID)
	pp := r.PrimaryPath()
	if c.hopLimit > 1 {
		// "Work-around until there's a way to obtain remote LID info" (cm_format_req).
		pp.SetLocalLID(PermissiveLID)
		pp.SetRemoteLID(PermissiveLID)
	}
	pp.SetLocalGID(c.local.As16())
	pp.SetRemoteGID(c.remote.As16())
	pp.SetFlowLabel(c.flowLabel)
	pp.SetPacketRate(0) // IB_RATE_PORT_CURRENT
	pp.SetTrafficClass(c.tclass)
	pp.SetHopLimit(c.hopLimit)
	pp.SetSL(0)
	pp.SetSubnetLocal(c.hopLimit <= 1)
	pp.SetLocalACKTimeout(AckTimeout(cfg.AckDelay, cfg.PacketLifeTime))
	pd := r.PrivateData()
	CMAHeader(pd).Encode(c.local, sport, c.remote)
	copy(pd[CMAHeaderLen:], p.PrivateData)

	c.state = StateReqSent
	m.qpInit(c, out)
	m.startPending(now, c, out)
	return c.id, nil
}

// startPending sends c.msg and arms its retransmission timer.
func (m *Manager) startPending(now time.Duration, c *conn, out *Outputs) {
	c.pending = true
	c.retriesLeft = c.maxRetries
	c.msgTimeout = c.timeout
	m.resendPending(c, c.remote, out)
	m.arm(c, now+c.msgTimeout, timerRetry, out)
}

func (m *Manager) resendPending(c *conn, dst netip.Addr, out *Outputs) {
	out.MADs = append(out.MADs, OutMAD{Conn: c.id, Src: c.local, Dst: dst, MAD: c.msg})
}

func (m *Manager) stopPending(c *conn, out *Outputs) {
	c.pending = false
	m.cancelTimer(c, out)
}

// AcceptParams are the arguments of Accept.
type AcceptParams struct {
	// QPN is our RC QP (RESET or INIT).
	QPN uint32
	// PrivateData goes raw into the REP (≤ 196 bytes).
	PrivateData []byte
	// Param: ResponderResources and InitiatorDepth go into the REP (InitiatorDepth 0 means
	// what the peer offers, capped by Config.MaxRdAtomic, and is never above it), FlowControl,
	// SRQ, RNRRetryCount (0 means 7: the peer's rnr_retry), MinRNRTimer. RetryCount is
	// ignored (the REQ's applies).
	Param transport.ConnParam
	// ECE goes into the REP (vendor ID at bytes 39/43/47, attribute modifier in the MAD
	// header); zero leaves both 0.
	ECE ECE
}

// Accept answers a request (states REQ_RCVD, MRA_REQ_SENT) the way rdma_accept does
// (cma.c cma_accept_ib): QP to INIT, RTR and RTS with the derived attributes, then the REP
// (retransmitted until the RTU arrives).
func (m *Manager) Accept(now time.Duration, id ConnID, p *AcceptParams, out *Outputs) error {
	c := m.conns[id]
	if c == nil || c.silent {
		return ErrUnknownConn
	}
	if c.state != StateReqRcvd && c.state != StateMRAReqSent {
		return ErrState
	}
	if p.QPN == 0 || p.QPN > 0xFFFFFF {
		return ErrInvalidArgument
	}
	if len(p.PrivateData) > REPPrivateDataSize {
		return ErrPrivateDataTooLong
	}
	cfg := &m.cfg
	m.cancelTimer(c, out) // decision timer
	c.localQPN = p.QPN
	c.respRes = clampNZ(p.Param.ResponderResources, cfg.MaxDestRdAtomic)
	init := p.Param.InitiatorDepth
	if init == 0 || init > c.offerInit {
		// ≥ 1 whenever the peer offers responder resources, so that RDMA READs towards the
		// peer are legal; never more than it offers.
		init = c.offerInit
	}
	c.initDepth = clampNZ(init, cfg.MaxRdAtomic)
	c.flowControl, c.srq = p.Param.FlowControl, p.Param.SRQ
	c.minRNRTimer = p.Param.MinRNRTimer & 0x1F
	c.rqPSN = m.psn() // REP Starting PSN: the first PSN the peer sends us
	repRNR := orDefault7(p.Param.RNRRetryCount)

	m.qpInit(c, out)
	m.qpRTR(c, out)
	m.qpRTS(c, out)

	b := InitMAD(c.msg[:], AttrREP, c.tid)
	r := REP(b)
	r.SetLocalCommID(uint32(c.id))
	r.SetRemoteCommID(c.remoteID)
	r.SetLocalQPN(c.localQPN)
	r.SetStartingPSN(c.rqPSN)
	r.SetResponderResources(c.respRes)
	r.SetInitiatorDepth(c.initDepth)
	r.SetTargetACKDelay(cfg.AckDelay)
	r.SetFailoverAccepted(0)
	r.SetEndToEndFlowControl(c.flowControl)
	r.SetRNRRetryCount(repRNR)
	r.SetSRQ(c.srq)
	r.SetLocalCAGUID(cfg.GUID)
	setECE(b, p.ECE, r.SetVendorID)
	copy(r.PrivateData(), p.PrivateData)

	c.state = StateRepSent
	m.startPending(now, c, out)
	return nil
}

// Reject rejects a request (REQ_RCVD, MRA_REQ_SENT), an accepted connection whose RTU has not
// arrived (REP_SENT, MRA_REP_RCVD: timewait follows) or our own pending dial (REQ_SENT,
// MRA_REQ_RCVD), with reason (0 means RejectConsumerDefined) and private data (≤ 148 bytes),
// as ib_send_cm_rej. No event is delivered for the connection afterwards.
func (m *Manager) Reject(now time.Duration, id ConnID, reason transport.RejectReason, pd []byte, out *Outputs) error {
	c := m.conns[id]
	if c == nil || c.silent {
		return ErrUnknownConn
	}
	if len(pd) > REJPrivateDataSize {
		return ErrPrivateDataTooLong
	}
	if reason == 0 {
		reason = transport.RejectConsumerDefined
	}
	switch c.state {
	case StateReqSent, StateMRAReqRcvd, StateReqRcvd, StateMRAReqSent:
		m.sendREJ(c, reason, nil, pd, out)
		m.qpError(c, out)
		c.silent = true
		m.release(c, out)
	case StateRepSent, StateMRARepRcvd:
		m.sendREJ(c, reason, nil, pd, out)
		m.qpError(c, out)
		c.silent = true
		m.enterTimewait(now, c, out)
	default:
		return ErrState
	}
	return nil
}

// MRA sends a Message Receipt Acknowledgement for a request the ULP needs more time for
// (REQ_RCVD → MRA_REQ_SENT); the peer extends its REQ timeout by 4.096 µs × 2^serviceTimeout.
// Duplicate REQs are answered with the same MRA. The decision deadline is extended to match.
func (m *Manager) MRA(now time.Duration, id ConnID, serviceTimeout uint8, pd []byte, out *Outputs) error {
	c := m.conns[id]
	if c == nil || c.silent {
		return ErrUnknownConn
	}
	if len(pd) > MRAPrivateDataSize {
		return ErrPrivateDataTooLong
	}
	if c.state != StateReqRcvd {
		return ErrState
	}
	c.serviceTimeout = serviceTimeout & 0x1F
	c.setPD(pd)
	c.state = StateMRAReqSent
	m.sendMRA(c, c.remote, out)
	m.arm(c, now+max(m.cfg.DecisionTimeout, TimeoutDuration(c.serviceTimeout)), timerDecision, out)
	return nil
}

// Disconnect disconnects an established connection the way rdma_disconnect does: QP to ERR,
// then a DREQ (retransmitted until the DREP). Calling it again, or during timewait, is a
// no-op. Other states: ErrState (use Destroy to abort a connection attempt).
func (m *Manager) Disconnect(now time.Duration, id ConnID, pd []byte, out *Outputs) error {
	c := m.conns[id]
	if c == nil || c.silent {
		return ErrUnknownConn
	}
	if len(pd) > DREQPrivateDataSize {
		return ErrPrivateDataTooLong
	}
	switch c.state {
	case StateEstablished:
		m.qpError(c, out)
		m.sendDREQ(now, c, pd, out)
	case StateDreqSent, StateTimewait:
	default:
		return ErrState
	}
	return nil
}

// Destroy abandons a connection in any state, as ib_destroy_cm_id (cm.c cm_destroy_id) does:
// a pending dial is rejected with reason 4 (ARI: our GUID), an unanswered or unconfirmed
// request with reason 28, an established connection gets one DREQ; connections that must pass
// through timewait stay (silently) until it ends. No event is delivered for it afterwards.
func (m *Manager) Destroy(now time.Duration, id ConnID, out *Outputs) error {
	c := m.conns[id]
	if c == nil {
		return ErrUnknownConn
	}
	c.silent = true
	m.qpError(c, out)
	switch c.state {
	case StateReqSent, StateMRAReqRcvd:
		m.stopPending(c, out)
		var ari [8]byte
		putBE64(ari[:], m.cfg.GUID)
		m.sendREJ(c, transport.RejectTimeout, ari[:], nil, out)
		m.release(c, out)
	case StateReqRcvd, StateMRAReqSent:
		m.sendREJ(c, transport.RejectConsumerDefined, nil, nil, out)
		m.release(c, out)
	case StateRepSent, StateMRARepRcvd:
		m.stopPending(c, out)
		m.sendREJ(c, transport.RejectConsumerDefined, nil, nil, out)
		m.enterTimewait(now, c, out)
	case StateEstablished:
		// ib_send_cm_dreq, then the DREQ_SENT case: cancel and enter timewait.
		m.sendDREQ(now, c, nil, out)
		m.stopPending(c, out)
		m.enterTimewait(now, c, out)
	case StateDreqSent:
		m.stopPending(c, out)
		m.enterTimewait(now, c, out)
	case StateDreqRcvd:
		m.sendDREP(c, nil, out)
		m.enterTimewait(now, c, out)
	case StateTimewait:
	default:
		m.release(c, out)
	}
	return nil
}

// CommEstablished reports that the QP of a connection whose RTU is still outstanding received
// its first packet (IB_EVENT_COMM_EST, cm.c cm_establish): the connection is established as if
// the RTU had arrived.
func (m *Manager) CommEstablished(now time.Duration, id ConnID, out *Outputs) error {
	c := m.conns[id]
	if c == nil {
		return ErrUnknownConn
	}
	switch c.state {
	case StateRepSent, StateMRARepRcvd:
		m.stopPending(c, out)
		c.state = StateEstablished
		m.emit(c, out, Event{Kind: EventEstablished})
	case StateEstablished:
	default:
		return ErrState
	}
	return nil
}

// message builders

// sendREJ is cm.c cm_format_rej: TID of the connection; Local Comm ID 0 and "REQ rejected"
// while the REQ is only received, our comm ID otherwise; REP-related states reject the REP.
func (m *Manager) sendREJ(c *conn, reason transport.RejectReason, ari, pd []byte, out *Outputs) {
	r := REJ(out.mad(c.id, c.local, c.remote, AttrREJ, c.tid))
	r.SetRemoteCommID(c.remoteID)
	switch c.state {
	case StateReqRcvd:
		r.SetLocalCommID(0)
		r.SetMessageRejected(MsgResponseREQ)
	case StateMRAReqSent:
		r.SetLocalCommID(uint32(c.id))
		r.SetMessageRejected(MsgResponseREQ)
	case StateRepRcvd:
		r.SetLocalCommID(uint32(c.id))
		r.SetMessageRejected(MsgResponseREP)
	default:
		r.SetLocalCommID(uint32(c.id))
		r.SetMessageRejected(MsgResponseOther)
	}
	r.SetReason(uint16(reason))
	if n := copy(r.ARIField(), ari); n > 0 {
		r.SetRejectInfoLength(uint8(n))
	}
	copy(r.PrivateData(), pd)
}

// issueREJ is cm.c cm_issue_rej: a REJ answering a received message without a connection.
// Remote Comm ID is the message's Local Comm ID, Local Comm ID its bytes 28-31 (the Remote
// Comm ID of most messages; 0 in a REQ without ECE), TID echoed.
func issueREJ(src, dst netip.Addr, msg []byte, reason transport.RejectReason, msgRejected uint8, out *Outputs) {
	r := REJ(out.mad(0, dst, src, AttrREJ, be64(msg[8:])))
	r.SetRemoteCommID(be32(msg[24:]))
	r.SetLocalCommID(be32(msg[28:]))
	r.SetMessageRejected(msgRejected)
	r.SetReason(uint16(reason))
}

func (m *Manager) sendMRA(c *conn, dst netip.Addr, out *Outputs) {
	r := MRA(out.mad(c.id, c.local, dst, AttrMRA, c.tid))
	r.SetMessageMRAed(MsgResponseREQ)
	r.SetLocalCommID(uint32(c.id))
	r.SetRemoteCommID(c.remoteID)
	r.SetServiceTimeout(c.serviceTimeout)
	copy(r.PrivateData(), c.pd[:c.pdLen])
}

func (m *Manager) sendRTU(c *conn, dst netip.Addr, out *Outputs) {
	r := RTU(out.mad(c.id, c.local, dst, AttrRTU, c.tid))
	r.SetLocalCommID(uint32(c.id))
	r.SetRemoteCommID(c.remoteID)
	copy(r.PrivateData(), c.pd[:c.pdLen])
}

// sendDREQ is ib_send_cm_dreq: a fresh TID (cm_form_tid), the peer's QPN, retransmitted with
// the connection's timeout and retries.
func (m *Manager) sendDREQ(now time.Duration, c *conn, pd []byte, out *Outputs) {
	b := InitMAD(c.msg[:], AttrDREQ, TID(m.cfg.HiTID, uint32(c.id)))
	r := DREQ(b)
	r.SetLocalCommID(uint32(c.id))
	r.SetRemoteCommID(c.remoteID)
	r.SetRemoteQPN(c.remoteQPN)
	copy(r.PrivateData(), pd)
	c.state = StateDreqSent
	m.startPending(now, c, out)
}

func (m *Manager) sendDREP(c *conn, pd []byte, out *Outputs) {
	c.setPD(pd)
	m.sendDREPTo(c, c.remote, out)
}

func (m *Manager) sendDREPTo(c *conn, dst netip.Addr, out *Outputs) {
	r := DREP(out.mad(c.id, c.local, dst, AttrDREP, c.tid))
	r.SetLocalCommID(uint32(c.id))
	r.SetRemoteCommID(c.remoteID)
	copy(r.PrivateData(), c.pd[:c.pdLen])
}

// setECE writes e into a REQ or REP MAD: the vendor ID through setVendor, the attribute
// modifier into the MAD header (cm.c cm_format_mad_ece_hdr).
func setECE(mad []byte, e ECE, setVendor func(uint32)) {
	setVendor(e.VendorID & 0xFFFFFF)
	putBE32(mad[madAttrMod:], e.AttrMod)
}

// madAttrMod is the offset of the MAD header's AttributeModifier (struct ib_mad_hdr attr_mod).
const madAttrMod = 20
