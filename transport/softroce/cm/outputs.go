package cm

import (
	"net/netip"
	"time"

	"github.com/srpd/srpd/transport"
)

// ConnID identifies a connection within a Manager. It is the connection's local communication
// ID (random, non-zero), the value our CM messages carry in their Local Comm ID field.
type ConnID uint32

// OutMAD is a CM MAD to send: a UD SEND to QP1 of Dst (UDP 4791) from Src (see the package
// documentation for the packet layout).
type OutMAD struct {
	Conn     ConnID // the connection it belongs to; 0 for stateless answers
	Src, Dst netip.Addr
	MAD      [MADLen]byte
}

// Attr returns the MAD's CM attribute ID.
func (o *OutMAD) Attr() uint16 { return be16(o.MAD[16:]) }

// QPUpdate is a QP Modify the engine must apply, in order, before sending the MADs of the same
// Outputs: qp(QPN).Modify(&Attr, Mask).
type QPUpdate struct {
	Conn ConnID
	QPN  uint32
	Attr transport.QPAttr
	Mask transport.QPAttrMask
	// PeerECE is the peer's ECE (from its REQ or REP) on the RTR update; zero otherwise.
	PeerECE ECE
}

// TimerOp records a change of a connection's single timer: armed for At, or cancelled. The
// Manager keeps the timers itself (NextDeadline, Expire); these records are informational.
type TimerOp struct {
	Conn   ConnID
	At     time.Duration
	Cancel bool
}

// EventKind is the kind of a ULP event.
type EventKind uint8

//go:generate go tool stringer -type=EventKind -linecomment -output=eventkind_string.go

// ULP events. The line comments are the String names (eventkind_string.go).
const (
	// EventRequest: a REQ for one of our listeners. The ULP must call Accept, Reject (or MRA
	// first); Request.PrivateData is the ULP part of the REQ private data.
	EventRequest EventKind = iota + 1 // REQUEST
	// EventEstablished: the connection is up (QP in RTS). PrivateData: REP (active) or RTU
	// (passive; nil when established by CommEstablished).
	EventEstablished // ESTABLISHED
	// EventRejected: the peer sent a REJ before the connection was established (Reason,
	// PrivateData, ARI). The connection is released (or in timewait for reason 10).
	EventRejected // REJECTED
	// EventUnreachable: retries exhausted before establishment (Err ErrTimeout), or a request
	// the ULP never answered (Err ErrDecisionTimeout). The connection is released.
	EventUnreachable // UNREACHABLE
	// EventDisconnected: DREQ or DREP received, DREQ retries exhausted (Err ErrTimeout) or a
	// REJ received once connected (Reason). At most once per connection; timewait follows.
	EventDisconnected // DISCONNECTED
	// EventTimewaitExit: timewait is over; the connection is released. Always the last event.
	EventTimewaitExit // TIMEWAIT_EXIT
)

// RequestInfo describes an incoming REQ (EventRequest).
type RequestInfo struct {
	transport.ConnRequestInfo
	Listener  netip.AddrPort // the listener that matched (unspecified address: wildcard)
	ServiceID uint64
	ECE       ECE // the REQ's
}

// Event is a ULP event. Slices point into the Outputs and are valid until its next Reset.
type Event struct {
	Kind        EventKind
	Conn        ConnID
	QPN         uint32 // local QPN (0 before Accept)
	PrivateData []byte
	Reason      transport.RejectReason // EventRejected; EventDisconnected caused by a REJ
	ARI         []byte                 // EventRejected
	Err         error                  // EventUnreachable, EventDisconnected on timeout
	Request     RequestInfo            // EventRequest
}

// Outputs collects what one Manager call produced. Reuse one Outputs (Reset between calls):
// its slices keep their capacity, so steady-state operation does not allocate.
//
// Order matters: apply QP (in order), then send MADs. Events can be delivered afterwards.
type Outputs struct {
	MADs   []OutMAD
	QP     []QPUpdate
	Events []Event
	Timers []TimerOp
	arena  []byte
}

// Reset empties the Outputs, keeping capacity. Slices handed out in Events become invalid.
func (o *Outputs) Reset() {
	o.MADs = o.MADs[:0]
	o.QP = o.QP[:0]
	o.Events = o.Events[:0]
	o.Timers = o.Timers[:0]
	o.arena = o.arena[:0]
}

// Empty reports whether nothing was produced.
func (o *Outputs) Empty() bool {
	return len(o.MADs) == 0 && len(o.QP) == 0 && len(o.Events) == 0 && len(o.Timers) == 0
}

// mad appends an OutMAD slot with a fresh CM header and returns its MAD bytes. The returned
// slice is only valid until the next mad call.
func (o *Outputs) mad(conn ConnID, src, dst netip.Addr, attr uint16, tid uint64) []byte {
	o.MADs = append(o.MADs, OutMAD{Conn: conn, Src: src, Dst: dst})
	m := &o.MADs[len(o.MADs)-1]
	return InitMAD(m.MAD[:], attr, tid)
}

// copyBytes copies b into the arena. Earlier slices stay valid when the arena grows (they keep
// the old backing array).
func (o *Outputs) copyBytes(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	n := len(o.arena)
	o.arena = append(o.arena, b...)
	return o.arena[n:len(o.arena):len(o.arena)]
}
