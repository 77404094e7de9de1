package cm

import (
	"cmp"
	crand "crypto/rand"
	"math"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/srpd/srpd/transport"
)

// State is a connection's IB CM state (torvalds/linux:include/rdma/ib_cm.h enum ib_cm_state,
// the subset a RoCE RC connection without LAP can be in).
type State uint8

// Connection states.
const (
	StateIdle        State = iota // released (never observable through Conn)
	StateReqSent                  // active: REQ sent, waiting for REP
	StateReqRcvd                  // passive: REQ handed to the ULP, waiting for Accept/Reject
	StateMRAReqSent               // passive: as ReqRcvd, and an MRA was sent
	StateMRAReqRcvd               // active: REQ sent, peer MRAed it (longer timeout)
	StateRepSent                  // passive: REP sent, waiting for RTU
	StateRepRcvd                  // active: REP received (transient: RTU follows at once)
	StateMRARepRcvd               // passive: REP sent, peer MRAed it
	StateEstablished              // connected
	StateDreqSent                 // DREQ sent, waiting for DREP
	StateDreqRcvd                 // DREQ received (transient: the DREP follows at once)
	StateTimewait                 // waiting for stray packets to die out
)

var stateNames = [...]string{
	StateIdle: "IDLE", StateReqSent: "REQ_SENT", StateReqRcvd: "REQ_RCVD",
	StateMRAReqSent: "MRA_REQ_SENT", StateMRAReqRcvd: "MRA_REQ_RCVD", StateRepSent: "REP_SENT",
	StateRepRcvd: "REP_RCVD", StateMRARepRcvd: "MRA_REP_RCVD", StateEstablished: "ESTABLISHED",
	StateDreqSent: "DREQ_SENT", StateDreqRcvd: "DREQ_RCVD", StateTimewait: "TIMEWAIT",
}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "State(?)"
}

// Defaults (torvalds/linux:drivers/infiniband/core/cma.c and rxe).
const (
	// DefaultAckDelay is rxe's local_ca_ack_delay (the REP Target ACK Delay a kernel rxe target
	// sends, 15).
	DefaultAckDelay = 15
	// DefaultPacketLifeTime is CMA_IBOE_PACKET_LIFETIME of the kernel in the testdata captures
	// (18: their REQ Local ACK Timeout is cm_ack_timeout(15, 18) = 19; kernels from 2023 on use
	// 16).
	DefaultPacketLifeTime = 18
	// DefaultCMResponseTimeout is CMA_CM_RESPONSE_TIMEOUT (20: 4.096 µs × 2^20 ≈ 4.3 s).
	DefaultCMResponseTimeout = 20
	// DefaultMaxCMRetries is CMA_MAX_CM_RETRIES.
	DefaultMaxCMRetries = 15
	// DefaultMRAServiceTimeout is the service timeout of CMA_CM_MRA_SETTING (24: 4.096 µs ×
	// 2^24 ≈ 68.7 s by IBA, 65.536 s by cm_convert_to_ms).
	DefaultMRAServiceTimeout = 24
	// DefaultHopLimit is the route hop limit the kernel puts in RoCE REQs (0x40).
	DefaultHopLimit = 64
	// DefaultMaxConns bounds the connections of one Manager.
	DefaultMaxConns = 1 << 16
	// PermissiveLID is IB_LID_PERMISSIVE, put in both REQ LIDs when the hop limit is > 1.
	PermissiveLID = 0xFFFF
	// DefaultPKey is the only P_Key on RoCE.
	DefaultPKey = 0xFFFF
)

// Config configures a Manager. Zero fields take the defaults named.
type Config struct {
	// GUID is the local CA GUID (an EUI-64 of ours) put in REQ and REP. Required.
	GUID uint64
	// HiTID is the upper 32 bits of the transaction IDs we originate (the kernel's MAD agent
	// hi_tid). 0 means 1.
	HiTID uint32
	// AckDelay is our CA ACK delay exponent (REP Target ACK Delay; REQ Local ACK Timeout is
	// derived from it). 0 means DefaultAckDelay.
	AckDelay uint8
	// PacketLifeTime is the path packet life time exponent used when dialling. 0 means
	// DefaultPacketLifeTime.
	PacketLifeTime uint8
	// CMResponseTimeout is the REQ Remote/Local CM Response Timeout when dialling. 0 means
	// DefaultCMResponseTimeout.
	CMResponseTimeout uint8
	// MaxCMRetries is the REQ Max CM Retries when dialling. 0 means DefaultMaxCMRetries.
	MaxCMRetries uint8
	// MRAServiceTimeout is the service timeout of the MRA sent for a duplicate REQ while the
	// ULP decides. 0 means DefaultMRAServiceTimeout.
	MRAServiceTimeout uint8
	// DecisionTimeout bounds how long a request may wait for Accept/Reject before the Manager
	// rejects it (reason 28) and reports EventUnreachable with ErrDecisionTimeout. 0 means
	// TimeoutDuration(MRAServiceTimeout) (the time the MRA asked the peer to wait).
	DecisionTimeout time.Duration
	// HopLimit is the hop limit when dialling. 0 means DefaultHopLimit.
	HopLimit uint8
	// MaxConns bounds the number of connections (including those in timewait); a REQ beyond
	// it is rejected with reason 3. 0 means DefaultMaxConns.
	MaxConns int
	// MaxRdAtomic and MaxDestRdAtomic are the device's max_qp_rd_atom and
	// max_qp_init_rd_atom: derived QP attributes are clamped to them. 0 means no clamp.
	MaxRdAtomic, MaxDestRdAtomic uint8
	// Rand is the source of comm IDs, starting PSNs and RDMA CM ports. nil means a ChaCha8
	// generator seeded from crypto/rand. Tests pass a seeded source for determinism.
	Rand rand.Source
	// CommIDMod and CommIDRem put every local comm ID in a residue class: id % CommIDMod ==
	// CommIDRem (0 or 1: any). A multi-queue device gives each queue's Manager its own class,
	// so that a MAD naming one of our comm IDs reaches the queue that owns the connection
	// (Steer). The IDs stay random within the class.
	CommIDMod, CommIDRem uint32
}

func (c *Config) setDefaults() {
	c.HiTID = cmp.Or(c.HiTID, 1)
	c.AckDelay = cmp.Or(c.AckDelay, DefaultAckDelay)
	c.PacketLifeTime = cmp.Or(c.PacketLifeTime, DefaultPacketLifeTime)
	c.CMResponseTimeout = cmp.Or(c.CMResponseTimeout, DefaultCMResponseTimeout)
	c.MaxCMRetries = cmp.Or(c.MaxCMRetries, DefaultMaxCMRetries)
	c.MaxCMRetries = min(c.MaxCMRetries, 15)
	c.MRAServiceTimeout = cmp.Or(c.MRAServiceTimeout, DefaultMRAServiceTimeout)
	c.DecisionTimeout = cmp.Or(c.DecisionTimeout, TimeoutDuration(c.MRAServiceTimeout))
	c.HopLimit = cmp.Or(c.HopLimit, DefaultHopLimit)
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.Rand == nil {
		var seed [32]byte
		_, _ = crand.Read(seed[:]) // never fails (crypto/rand panics rather than return an error)
		c.Rand = rand.NewChaCha8(seed)
	}
}

type remoteKey struct {
	guid uint64
	id   uint32 // remote comm ID or remote QPN
}

type listenKey struct {
	addr netip.Addr // invalid Addr = wildcard
	port uint16
}

type timerKind uint8

const (
	timerNone timerKind = iota
	timerRetry
	timerTimewait
	timerDecision
)

// Manager is the IB CM (with RDMA CM conventions) of one device: every connection and
// listener, as a pure, deterministic state machine. It does no I/O, starts no goroutine and
// reads no clock: inputs are received MADs, API calls and timer expiries, each with the
// current time as a monotonic duration; outputs go to an *Outputs. A Manager is not safe for
// concurrent use: the engine calls it from one goroutine (or under one lock).
type Manager struct {
	cfg         Config
	rng         *rand.Rand
	conns       map[ConnID]*conn
	byRemoteID  map[remoteKey]*conn // (remote CA GUID, remote comm ID)
	byRemoteQPN map[remoteKey]*conn // (remote CA GUID, remote QPN)
	listeners   map[listenKey]struct{}
	ports       map[uint16]int // listeners per port
	timers      timerHeap
	free        []*conn
}

// NewManager returns a Manager. cfg.GUID must be non-zero.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.GUID == 0 || (cfg.CommIDMod > 1 && cfg.CommIDRem >= cfg.CommIDMod) {
		return nil, ErrInvalidArgument
	}
	cfg.setDefaults()
	return &Manager{
		cfg:         cfg,
		rng:         rand.New(cfg.Rand),
		conns:       make(map[ConnID]*conn),
		byRemoteID:  make(map[remoteKey]*conn),
		byRemoteQPN: make(map[remoteKey]*conn),
		listeners:   make(map[listenKey]struct{}),
		ports:       make(map[uint16]int),
	}, nil
}

// Config returns the configuration in force (defaults filled in).
func (m *Manager) Config() Config { return m.cfg }

func normListenAddr(a netip.Addr) netip.Addr {
	if !a.IsValid() || a.IsUnspecified() {
		return netip.Addr{}
	}
	return a.Unmap()
}

// Listen starts accepting REQs for RDMA CM port port (TCP port space) whose RDMA CM header
// names addr as destination; an invalid or unspecified addr listens on every address.
func (m *Manager) Listen(addr netip.Addr, port uint16) error {
	k := listenKey{normListenAddr(addr), port}
	if _, ok := m.listeners[k]; ok {
		return ErrAddrInUse
	}
	m.listeners[k] = struct{}{}
	m.ports[port]++
	return nil
}

// Unlisten stops listening. Connections already requested are not affected.
func (m *Manager) Unlisten(addr netip.Addr, port uint16) error {
	k := listenKey{normListenAddr(addr), port}
	if _, ok := m.listeners[k]; !ok {
		return ErrNotListening
	}
	delete(m.listeners, k)
	if m.ports[port]--; m.ports[port] == 0 {
		delete(m.ports, port)
	}
	return nil
}

// findListener returns the listener for a header destination address and port: an exact
// address match first, then the wildcard.
func (m *Manager) findListener(dst netip.Addr, port uint16) (netip.AddrPort, bool) {
	if dst.IsValid() {
		if _, ok := m.listeners[listenKey{dst.Unmap(), port}]; ok {
			return netip.AddrPortFrom(dst.Unmap(), port), true
		}
	}
	if _, ok := m.listeners[listenKey{netip.Addr{}, port}]; ok {
		if dst.Unmap().Is6() {
			return netip.AddrPortFrom(netip.IPv6Unspecified(), port), true
		}
		return netip.AddrPortFrom(netip.IPv4Unspecified(), port), true
	}
	return netip.AddrPort{}, false
}

// NumConns returns the number of connections held (in any state, timewait included).
func (m *Manager) NumConns() int { return len(m.conns) }

// NextDeadline returns the earliest armed timer; the engine calls Expire when it passes.
func (m *Manager) NextDeadline() (time.Duration, bool) {
	c := m.timers.peek()
	if c == nil {
		return 0, false
	}
	return c.deadline, true
}

// ConnInfo is a snapshot of a connection.
type ConnInfo struct {
	ID                    ConnID
	State                 State
	Active                bool // we dialled
	LocalAddr, RemoteAddr netip.Addr
	// RDMA CM endpoints: for the dialling side LocalCM is (our IP, source port) and RemoteCM
	// the listener; for the accepting side the reverse.
	LocalCM, RemoteCM  netip.AddrPort
	LocalQPN           uint32
	RemoteQPN          uint32
	RemoteCommID       uint32
	RemoteGUID         uint64
	SQPSN, RQPSN       uint32
	PathMTU            transport.MTU
	ResponderResources uint8 // our max_dest_rd_atomic
	InitiatorDepth     uint8 // our max_rd_atomic
	RetryCount         uint8
	RNRRetryCount      uint8
	AckTimeout         uint8 // local ACK timeout exponent (and timewait length)
}

// Conn returns a snapshot of connection id.
func (m *Manager) Conn(id ConnID) (ConnInfo, bool) {
	c := m.conns[id]
	if c == nil {
		return ConnInfo{}, false
	}
	i := ConnInfo{
		ID: c.id, State: c.state, Active: c.active, LocalAddr: c.local, RemoteAddr: c.remote,
		LocalQPN: c.localQPN, RemoteQPN: c.remoteQPN, RemoteCommID: c.remoteID,
		RemoteGUID: c.remoteGUID, SQPSN: c.sqPSN, RQPSN: c.rqPSN,
		PathMTU: transport.MTU(c.mtu), ResponderResources: c.respRes,
		InitiatorDepth: c.initDepth, RetryCount: c.retryCount, RNRRetryCount: c.rnrRetry,
		AckTimeout: c.avTimeout,
	}
	if c.active {
		i.LocalCM, i.RemoteCM = c.cmaSrc, c.cmaDst
	} else {
		i.LocalCM, i.RemoteCM = c.cmaDst, c.cmaSrc
	}
	return i, true
}

// random helpers

func (m *Manager) psn() uint32 { return uint32(m.rng.Uint64()) & 0xFFFFFF }

// newCommID returns a random, non-zero comm ID not used by any connection held (cm.c XORs an
// allocated id with a random operand; the effect on the wire is a random-looking non-zero ID).
func (m *Manager) newCommID() ConnID {
	mod, rem := uint64(m.cfg.CommIDMod), uint64(m.cfg.CommIDRem)
	for {
		v := uint64(m.rng.Uint32())
		if mod > 1 {
			if v = v - v%mod + rem; v > math.MaxUint32 {
				continue
			}
		}
		if id := ConnID(v); id != 0 && m.conns[id] == nil {
			return id
		}
	}
}

// ephemeralPort picks an RDMA CM source port the way cma_alloc_any_port does: random in
// the default ip_local_port_range 32768..60999.
func (m *Manager) ephemeralPort() uint16 { return uint16(32768 + m.rng.IntN(60999-32768+1)) }

func (m *Manager) newConn(id ConnID) *conn {
	var c *conn
	if n := len(m.free); n > 0 {
		c = m.free[n-1]
		m.free[n-1] = nil
		m.free = m.free[:n-1]
		*c = conn{}
	} else {
		c = new(conn)
	}
	c.id = id
	c.heapIdx = -1
	m.conns[id] = c
	return c
}

// release forgets c entirely.
func (m *Manager) release(c *conn, out *Outputs) {
	m.cancelTimer(c, out)
	if c.remoteIDSet {
		k := remoteKey{c.remoteGUID, c.remoteID}
		if m.byRemoteID[k] == c {
			delete(m.byRemoteID, k)
		}
		k = remoteKey{c.remoteGUID, c.remoteQPN}
		if m.byRemoteQPN[k] == c {
			delete(m.byRemoteQPN, k)
		}
	}
	delete(m.conns, c.id)
	c.state = StateIdle
	if len(m.free) < 1024 {
		m.free = append(m.free, c)
	}
}

// setRemote records the peer's comm ID, CA GUID and QPN and indexes the connection by them.
func (m *Manager) setRemote(c *conn, guid uint64, id, qpn uint32) {
	c.remoteGUID, c.remoteID, c.remoteQPN, c.remoteIDSet = guid, id, qpn, true
	m.byRemoteID[remoteKey{guid, id}] = c
	m.byRemoteQPN[remoteKey{guid, qpn}] = c
}

// timers

func (m *Manager) arm(c *conn, at time.Duration, k timerKind, out *Outputs) {
	c.timer = k
	m.timers.set(c, at)
	out.Timers = append(out.Timers, TimerOp{Conn: c.id, At: at})
}

func (m *Manager) cancelTimer(c *conn, out *Outputs) {
	if c.heapIdx < 0 {
		return
	}
	m.timers.remove(c)
	c.timer = timerNone
	out.Timers = append(out.Timers, TimerOp{Conn: c.id, Cancel: true})
}

// Expire handles every timer due at now: retransmissions (REQ, REP, DREQ), retry exhaustion,
// timewait exit and unanswered requests.
func (m *Manager) Expire(now time.Duration, out *Outputs) {
	for {
		c := m.timers.peek()
		if c == nil || c.deadline > now {
			return
		}
		m.timers.remove(c)
		k := c.timer
		c.timer = timerNone
		switch k {
		case timerRetry:
			m.retryExpired(now, c, out)
		case timerTimewait:
			m.emit(c, out, Event{Kind: EventTimewaitExit})
			m.release(c, out)
		case timerDecision:
			if c.state == StateReqRcvd || c.state == StateMRAReqSent {
				m.sendREJ(c, transport.RejectConsumerDefined, nil, nil, out)
				m.emit(c, out, Event{Kind: EventUnreachable, Err: ErrDecisionTimeout})
				m.release(c, out)
			}
		}
	}
}

// retryExpired is the MAD layer's response timeout for the pending message (REQ, REP or
// DREQ): resend while retries remain (ib_mad retries = max_cm_retries), else the cm.c
// cm_process_send_error transitions.
func (m *Manager) retryExpired(now time.Duration, c *conn, out *Outputs) {
	if !c.pending {
		return
	}
	if c.retriesLeft > 0 {
		c.retriesLeft--
		m.resendPending(c, c.remote, out)
		m.arm(c, now+c.msgTimeout, timerRetry, out)
		return
	}
	c.pending = false
	switch c.state {
	case StateReqSent, StateMRAReqRcvd, StateRepSent, StateMRARepRcvd:
		// IB_CM_REQ_ERROR / IB_CM_REP_ERROR -> RDMA_CM_EVENT_UNREACHABLE; no REJ is sent.
		m.qpError(c, out)
		m.emit(c, out, Event{Kind: EventUnreachable, Err: ErrTimeout})
		m.release(c, out)
	case StateDreqSent:
		// IB_CM_DREQ_ERROR: timewait, RDMA_CM_EVENT_DISCONNECTED.
		m.enterTimewait(now, c, out)
		m.disconnected(c, out, Event{Kind: EventDisconnected, Err: ErrTimeout})
	}
}

func (m *Manager) enterTimewait(now time.Duration, c *conn, out *Outputs) {
	c.pending = false
	c.state = StateTimewait
	// cm.c cm_enter_timewait: wait cm_convert_to_ms(av.timeout).
	m.arm(c, now+TimeoutDuration(c.avTimeout), timerTimewait, out)
}

// events

func (m *Manager) emit(c *conn, out *Outputs, e Event) {
	if c.silent {
		return
	}
	e.Conn = c.id
	e.QPN = c.localQPN
	out.Events = append(out.Events, e)
}

func (m *Manager) disconnected(c *conn, out *Outputs, e Event) {
	if c.disconnectSent {
		return
	}
	c.disconnectSent = true
	m.emit(c, out, e)
}

// QP updates

func (m *Manager) qpUpdate(c *conn, out *Outputs, attr transport.QPAttr, mask transport.QPAttrMask) {
	c.qpTouched = true
	out.QP = append(out.QP, QPUpdate{Conn: c.id, QPN: c.localQPN, Attr: attr, Mask: mask})
}

// qpInit is cm.c cm_init_qp_init_attr: REMOTE_WRITE, plus REMOTE_READ and REMOTE_ATOMIC when
// this side has responder resources; P_Key index 0, port 1.
func (m *Manager) qpInit(c *conn, out *Outputs) {
	acc := transport.AccessRemoteWrite
	if c.respRes > 0 {
		acc |= transport.AccessRemoteRead | transport.AccessRemoteAtomic
	}
	m.qpUpdate(c, out, transport.QPAttr{State: transport.QPSInit, AccessFlags: acc, Port: 1},
		transport.AttrState|transport.AttrAccessFlags|transport.AttrPKeyIndex|transport.AttrPort)
}

// qpRTR is cm.c cm_init_qp_rtr_attr: AV, path MTU, dest QPN, rq_psn, max_dest_rd_atomic =
// responder resources, min_rnr_timer (0 unless the ULP set one, as rdma_set_min_rnr_timer).
func (m *Manager) qpRTR(c *conn, out *Outputs) {
	m.qpUpdate(c, out, transport.QPAttr{
		State: transport.QPSRTR,
		AV: transport.AddressVector{
			SrcAddr: c.local, DstAddr: c.remote, FlowLabel: c.flowLabel,
			TrafficClass: c.tclass, HopLimit: c.hopLimit,
		},
		PathMTU: transport.MTU(c.mtu), DestQPN: c.remoteQPN, RQPSN: c.rqPSN,
		MaxDestRdAtomic: c.respRes, MinRNRTimer: c.minRNRTimer,
	}, transport.AttrState|transport.AttrAV|transport.AttrPathMTU|transport.AttrDestQPN|
		transport.AttrRQPSN|transport.AttrMaxDestRdAtomic|transport.AttrMinRNRTimer)
	out.QP[len(out.QP)-1].PeerECE = c.peerECE
}

// qpRTS is cm.c cm_init_qp_rts_attr: sq_psn, retry_cnt, rnr_retry, max_rd_atomic = initiator
// depth, timeout = av.timeout.
func (m *Manager) qpRTS(c *conn, out *Outputs) {
	m.qpUpdate(c, out, transport.QPAttr{
		State: transport.QPSRTS, SQPSN: c.sqPSN, RetryCnt: c.retryCount,
		RNRRetry: c.rnrRetry, MaxRdAtomic: c.initDepth, Timeout: c.avTimeout,
	}, transport.AttrState|transport.AttrSQPSN|transport.AttrRetryCnt|transport.AttrRNRRetry|
		transport.AttrMaxQPRdAtomic|transport.AttrTimeout)
}

// qpError moves the QP to ERR once (rdma_disconnect and the RDMA CM REJ handler do).
func (m *Manager) qpError(c *conn, out *Outputs) {
	if !c.qpTouched || c.qpErr || c.localQPN == 0 {
		return
	}
	c.qpErr = true
	out.QP = append(out.QP, QPUpdate{Conn: c.id, QPN: c.localQPN,
		Attr: transport.QPAttr{State: transport.QPSErr}, Mask: transport.AttrState})
}

func clampNZ(v, limit uint8) uint8 {
	if limit != 0 && v > limit {
		return limit
	}
	return v
}

func orDefault7(v uint8) uint8 {
	if v == 0 {
		return 7
	}
	return min(v, 7)
}
