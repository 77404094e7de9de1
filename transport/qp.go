package transport

import (
	"fmt"
	"math/bits"
	"net/netip"
	"strconv"
	"strings"
)

// QPState is a QP state with the values of enum ib_qp_state.
type QPState uint8

// QP states (IB values). RC QPs never enter SQE.
const (
	QPSReset QPState = 0
	QPSInit  QPState = 1
	QPSRTR   QPState = 2
	QPSRTS   QPState = 3
	QPSSQD   QPState = 4
	QPSSQE   QPState = 5
	QPSErr   QPState = 6
)

func (s QPState) String() string {
	switch s {
	case QPSReset:
		return "RESET"
	case QPSInit:
		return "INIT"
	case QPSRTR:
		return "RTR"
	case QPSRTS:
		return "RTS"
	case QPSSQD:
		return "SQD"
	case QPSSQE:
		return "SQE"
	case QPSErr:
		return "ERR"
	}
	return "QPS(" + strconv.Itoa(int(s)) + ")"
}

// QPType is the transport service type (enum ib_qp_type values). Only RC is implemented.
type QPType uint8

// QP types (IB values).
const (
	QPTypeRC QPType = 2
	QPTypeUC QPType = 3
	QPTypeUD QPType = 4
)

// MTU is an IB path MTU enum (ib_mtu): 1=256 … 5=4096 bytes of payload per packet.
type MTU uint8

// Path MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the payload size, or 0 for an invalid enum.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// MTUFromBytes maps 256, 512, 1024, 2048, 4096 to the enum (0 otherwise).
func MTUFromBytes(n int) MTU {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m
		}
	}
	return 0
}

func (m MTU) String() string {
	if b := m.Bytes(); b != 0 {
		return strconv.Itoa(b)
	}
	return "MTU(" + strconv.Itoa(int(m)) + ")"
}

// GID is a 128-bit RoCEv2 GID: an IPv6 address, or an IPv4-mapped IPv6 address (::ffff:a.b.c.d).
type GID [16]byte

// GIDFromAddr returns the RoCEv2 GID of an IP address.
func GIDFromAddr(a netip.Addr) GID { return GID(a.As16()) }

// Addr returns the IP address of a RoCEv2 GID (IPv4 for a mapped GID).
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

func (g GID) String() string { return netip.AddrFrom16(g).String() }

// RoCEv2Port is the IANA UDP destination port of RoCEv2.
const RoCEv2Port = 4791

// AddressVector is the path of an RC QP (the GRH part of rdma_ah_attr, RoCEv2 flavour).
type AddressVector struct {
	SrcAddr netip.Addr // local IP (the SGID); must be one of the device's addresses
	DstAddr netip.Addr // remote IP (the DGID)
	// DstPort is the remote UDP port; 0 means RoCEv2Port. Other values are a softroce extension
	// for running several devices on one host (tests); the verbs engine accepts only 0 or 4791.
	DstPort uint16
	// SrcPort is the UDP source port for this QP's packets (flow entropy, rdma_get_udp_sport);
	// 0 lets the engine choose (0xC000 | hash of the QPNs). Receivers ignore it; softroce's
	// packets leave from its link's port, so there the value is recorded but not applied.
	SrcPort      uint16
	FlowLabel    uint32 // IPv6 flow label (20 bits); informational for RoCEv2 over IPv4
	TrafficClass uint8  // IPv4 TOS / IPv6 traffic class (per packet in softroce)
	// HopLimit is the TTL / hop limit (0 means 64). softroce's links set it per socket
	// (link.UDPOptions.TTL), so there the per-QP value is recorded but not applied.
	HopLimit uint8
}

// Dst returns the remote UDP endpoint.
func (av AddressVector) Dst() netip.AddrPort {
	p := av.DstPort
	if p == 0 {
		p = RoCEv2Port
	}
	return netip.AddrPortFrom(av.DstAddr, p)
}

// QPCap are the queue sizes requested at creation (ib_qp_cap). Engines may round up; Query
// reports the actual values.
type QPCap struct {
	MaxSendWR     int // SQ slots
	MaxRecvWR     int // RQ slots
	MaxSendSGE    int // SGEs per send WR
	MaxRecvSGE    int // SGEs per receive WR
	MaxInlineData int // bytes per inline WR
}

// QPInitAttr are the creation attributes of a QP (ib_qp_init_attr).
type QPInitAttr struct {
	Type     QPType // QPTypeRC (zero value is accepted as RC)
	SendCQ   CQ
	RecvCQ   CQ
	Cap      QPCap
	SQSigAll bool // every send WR completes with a WC (IB_SIGNAL_ALL_WR)
}

// QPAttrMask selects QPAttr fields in Modify; the bit values are those of enum ib_qp_attr_mask.
type QPAttrMask uint32

// Attribute mask bits (IB values).
const (
	AttrState           QPAttrMask = 1 << 0
	AttrCurState        QPAttrMask = 1 << 1
	AttrAccessFlags     QPAttrMask = 1 << 3
	AttrPKeyIndex       QPAttrMask = 1 << 4
	AttrPort            QPAttrMask = 1 << 5
	AttrAV              QPAttrMask = 1 << 7
	AttrPathMTU         QPAttrMask = 1 << 8
	AttrTimeout         QPAttrMask = 1 << 9
	AttrRetryCnt        QPAttrMask = 1 << 10
	AttrRNRRetry        QPAttrMask = 1 << 11
	AttrRQPSN           QPAttrMask = 1 << 12
	AttrMaxQPRdAtomic   QPAttrMask = 1 << 13
	AttrMinRNRTimer     QPAttrMask = 1 << 15
	AttrSQPSN           QPAttrMask = 1 << 16
	AttrMaxDestRdAtomic QPAttrMask = 1 << 17
	AttrDestQPN         QPAttrMask = 1 << 20

	attrAll = AttrState | AttrCurState | AttrAccessFlags | AttrPKeyIndex | AttrPort | AttrAV |
		AttrPathMTU | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrRQPSN | AttrMaxQPRdAtomic |
		AttrMinRNRTimer | AttrSQPSN | AttrMaxDestRdAtomic | AttrDestQPN
)

var attrNames = map[QPAttrMask]string{
	AttrState: "STATE", AttrCurState: "CUR_STATE", AttrAccessFlags: "ACCESS_FLAGS",
	AttrPKeyIndex: "PKEY_INDEX", AttrPort: "PORT", AttrAV: "AV", AttrPathMTU: "PATH_MTU",
	AttrTimeout: "TIMEOUT", AttrRetryCnt: "RETRY_CNT", AttrRNRRetry: "RNR_RETRY",
	AttrRQPSN: "RQ_PSN", AttrMaxQPRdAtomic: "MAX_QP_RD_ATOMIC", AttrMinRNRTimer: "MIN_RNR_TIMER",
	AttrSQPSN: "SQ_PSN", AttrMaxDestRdAtomic: "MAX_DEST_RD_ATOMIC", AttrDestQPN: "DEST_QPN",
}

func (m QPAttrMask) String() string {
	var parts []string
	for v := m; v != 0; v &= v - 1 {
		bit := QPAttrMask(1) << bits.TrailingZeros32(uint32(v))
		if n, ok := attrNames[bit]; ok {
			parts = append(parts, n)
		} else {
			parts = append(parts, fmt.Sprintf("%#x", uint32(bit)))
		}
	}
	return strings.Join(parts, "|")
}

// QPAttr are the modifiable (and queryable) QP attributes (ib_qp_attr, RC subset).
type QPAttr struct {
	State    QPState // target state (AttrState)
	CurState QPState // asserted current state (AttrCurState)
	// AccessFlags: which remote operations the responder accepts (RemoteWrite, RemoteRead,
	// RemoteAtomic); LocalWrite is accepted and ignored.
	AccessFlags     Access
	PKeyIndex       uint16 // only 0 (P_Key 0xFFFF)
	Port            uint8  // only 1
	AV              AddressVector
	PathMTU         MTU
	Timeout         uint8  // local ACK timeout 4.096 µs × 2^Timeout; 0 = no retransmission; ≤ 31
	RetryCnt        uint8  // ≤ 7 (7 = infinite, as rxe)
	RNRRetry        uint8  // ≤ 7 (7 = infinite)
	RQPSN           uint32 // first PSN expected from the peer (24 bits)
	SQPSN           uint32 // first PSN sent (24 bits)
	MaxRdAtomic     uint8  // RDMA READs (and atomics) outstanding as requester
	MaxDestRdAtomic uint8  // RDMA READs (and atomics) accepted outstanding as responder
	MinRNRTimer     uint8  // RNR NAK timer code sent to the peer (0..31)
	DestQPN         uint32 // remote QPN (24 bits)
	Cap             QPCap  // query only
	SQSigAll        bool   // query only
}

// Set copies into a the fields of from that mask selects: what a Modify records. State and
// CurState are left alone (the transition decides the state), as are Cap and SQSigAll.
func (a *QPAttr) Set(from *QPAttr, mask QPAttrMask) {
	for _, f := range [...]struct {
		attr QPAttrMask
		set  func()
	}{
		{AttrAccessFlags, func() { a.AccessFlags = from.AccessFlags }},
		{AttrPKeyIndex, func() { a.PKeyIndex = from.PKeyIndex }},
		{AttrPort, func() { a.Port = from.Port }},
		{AttrAV, func() { a.AV = from.AV }},
		{AttrPathMTU, func() { a.PathMTU = from.PathMTU }},
		{AttrTimeout, func() { a.Timeout = from.Timeout }},
		{AttrRetryCnt, func() { a.RetryCnt = from.RetryCnt }},
		{AttrRNRRetry, func() { a.RNRRetry = from.RNRRetry }},
		{AttrRQPSN, func() { a.RQPSN = from.RQPSN }},
		{AttrMaxQPRdAtomic, func() { a.MaxRdAtomic = from.MaxRdAtomic }},
		{AttrMinRNRTimer, func() { a.MinRNRTimer = from.MinRNRTimer }},
		{AttrSQPSN, func() { a.SQPSN = from.SQPSN }},
		{AttrMaxDestRdAtomic, func() { a.MaxDestRdAtomic = from.MaxDestRdAtomic }},
		{AttrDestQPN, func() { a.DestQPN = from.DestQPN }},
	} {
		if mask&f.attr != 0 {
			f.set()
		}
	}
}

type transition struct{ req, opt QPAttrMask }

// rcTransitions is the RC column of the IBA / ib_modify_qp_is_ok table (alternate-path and
// path-migration attributes omitted: not supported). Every state may go to RESET and ERR.
var rcTransitions = map[[2]QPState]transition{
	{QPSReset, QPSReset}: {},
	{QPSReset, QPSInit}:  {req: AttrPKeyIndex | AttrPort | AttrAccessFlags},
	{QPSInit, QPSInit}:   {opt: AttrPKeyIndex | AttrPort | AttrAccessFlags},
	{QPSInit, QPSRTR}: {
		req: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer,
		opt: AttrAccessFlags | AttrPKeyIndex,
	},
	{QPSRTR, QPSRTS}: {
		req: AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrSQPSN | AttrMaxQPRdAtomic,
		opt: AttrCurState | AttrAccessFlags | AttrMinRNRTimer,
	},
	{QPSRTS, QPSRTS}: {opt: AttrCurState | AttrAccessFlags | AttrMinRNRTimer},
	{QPSRTS, QPSSQD}: {},
	{QPSSQD, QPSRTS}: {opt: AttrCurState | AttrAccessFlags | AttrMinRNRTimer},
	{QPSSQD, QPSSQD}: {opt: AttrPKeyIndex | AttrPort | AttrAV | AttrAccessFlags | AttrMinRNRTimer |
		AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic | AttrMaxDestRdAtomic},
}

// ModifyLimits are the device limits ValidateModify checks values against.
type ModifyLimits struct {
	MaxQPRdAtom     int // max MaxRdAtomic
	MaxQPInitRdAtom int // max MaxDestRdAtomic
	MaxMTU          MTU
	// LocalAddr reports whether an IP is one of the device's addresses (nil: any).
	LocalAddr func(netip.Addr) bool
}

// ValidateModify checks a Modify request against the RC state table and value ranges, as
// ib_modify_qp_is_ok plus the range checks of rxe_qp_chk_attr. It returns the next state, or a
// *ModifyError. Engines call it with their current state before changing anything.
func ValidateModify(cur QPState, attr *QPAttr, mask QPAttrMask, lim ModifyLimits) (QPState, error) {
	next := cur
	if mask&AttrState != 0 {
		next = attr.State
	}
	fail := func(err error, attrs QPAttrMask, detail string) (QPState, error) {
		return cur, &ModifyError{From: cur, To: next, Attrs: attrs, Err: err, Detail: detail}
	}
	if bad := mask &^ attrAll; bad != 0 {
		return fail(ErrInvalidAttr, bad, "unknown or unsupported attribute bits")
	}
	if next > QPSErr || next == QPSSQE {
		return fail(ErrInvalidTransition, 0, "")
	}
	if mask&AttrCurState != 0 && attr.CurState != cur {
		return fail(ErrInvalidAttr, AttrCurState, fmt.Sprintf("current state is %v", cur))
	}
	var tr transition
	switch next {
	case QPSReset, QPSErr:
		tr = transition{} // always allowed, no attributes
		if mask&^(AttrState|AttrCurState) != 0 {
			return fail(ErrInvalidAttr, mask&^(AttrState|AttrCurState), "not allowed for this transition")
		}
		return next, nil
	default:
		var ok bool
		tr, ok = rcTransitions[[2]QPState{cur, next}]
		if !ok {
			return fail(ErrInvalidTransition, 0, "")
		}
	}
	if miss := tr.req &^ mask; miss != 0 {
		return fail(ErrMissingAttr, miss, "")
	}
	if extra := mask &^ (tr.req | tr.opt | AttrState | AttrCurState); extra != 0 {
		return fail(ErrInvalidAttr, extra, "not allowed for this transition")
	}
	// Value ranges, checked in this order.
	for _, c := range [...]struct {
		attr QPAttrMask
		bad  bool
		why  string
	}{
		{AttrAccessFlags, attr.AccessFlags&^(AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead|AccessRemoteAtomic) != 0, "unknown access bits"},
		{AttrPKeyIndex, attr.PKeyIndex != 0, "only P_Key index 0 exists"},
		{AttrPort, attr.Port != 1, "only port 1 exists"},
		{AttrPathMTU, attr.PathMTU.Bytes() == 0 || (lim.MaxMTU != 0 && attr.PathMTU > lim.MaxMTU), "path MTU must be 256..4096 and ≤ the port MTU"},
		{AttrTimeout, attr.Timeout > 31, "timeout > 31"},
		{AttrRetryCnt, attr.RetryCnt > 7, "retry_cnt > 7"},
		{AttrRNRRetry, attr.RNRRetry > 7, "rnr_retry > 7"},
		{AttrMinRNRTimer, attr.MinRNRTimer > 31, "min_rnr_timer > 31"},
		{AttrRQPSN, attr.RQPSN > 0xFFFFFF, "PSN wider than 24 bits"},
		{AttrSQPSN, attr.SQPSN > 0xFFFFFF, "PSN wider than 24 bits"},
		{AttrDestQPN, attr.DestQPN > 0xFFFFFF || attr.DestQPN == 0, "QPN must be 1..2^24-1"},
	} {
		if mask&c.attr != 0 && c.bad {
			return fail(ErrInvalidAttr, c.attr, c.why)
		}
	}
	if mask&AttrMaxQPRdAtomic != 0 && int(attr.MaxRdAtomic) > lim.MaxQPRdAtom {
		return fail(ErrInvalidAttr, AttrMaxQPRdAtomic, fmt.Sprintf("> device max %d", lim.MaxQPRdAtom))
	}
	if mask&AttrMaxDestRdAtomic != 0 && int(attr.MaxDestRdAtomic) > lim.MaxQPInitRdAtom {
		return fail(ErrInvalidAttr, AttrMaxDestRdAtomic, fmt.Sprintf("> device max %d", lim.MaxQPInitRdAtom))
	}
	if mask&AttrAV != 0 {
		av := attr.AV
		if !av.SrcAddr.IsValid() || !av.DstAddr.IsValid() || av.DstAddr.IsUnspecified() ||
			av.SrcAddr.Unmap().Is4() != av.DstAddr.Unmap().Is4() {
			return fail(ErrInvalidAttr, AttrAV, "source and destination must be valid IPs of one family")
		}
		if lim.LocalAddr != nil && !lim.LocalAddr(av.SrcAddr.Unmap()) {
			return fail(ErrInvalidAttr, AttrAV, "source address is not one of the device's")
		}
		if av.FlowLabel > 0xFFFFF {
			return fail(ErrInvalidAttr, AttrAV, "flow label wider than 20 bits")
		}
	}
	return next, nil
}
