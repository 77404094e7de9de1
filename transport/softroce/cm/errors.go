package cm

// Error is the type of the sentinel errors this package returns for malformed or unexpected
// input and for API misuse. The values are comparable (errors.Is and == both work) and
// returning one never allocates.
type Error uint8

// Parse errors: a MAD that cannot be a CM message we understand. HandleMAD returns them (so the
// engine can count them) and otherwise ignores the MAD, as ib_mad / ib_cm drop such MADs.
const (
	// ErrTooShort: fewer than 256 bytes (a CM MAD is always a full 256-byte MAD).
	ErrTooShort Error = iota + 1
	// ErrBaseVersion: MAD base version is not 1 (IB_MGMT_BASE_VERSION).
	ErrBaseVersion
	// ErrNotCM: management class is not 0x07 (IB_MGMT_CLASS_CM).
	ErrNotCM
	// ErrClassVersion: CM class version is not 2 (IB_CM_CLASS_VERSION).
	ErrClassVersion
	// ErrMethod: method is not SEND (0x03); the CM never uses Get/Set or responses.
	ErrMethod
	// ErrUnknownAttribute: attribute ID is not a CM message (REQ..APR).
	ErrUnknownAttribute
	// ErrWrongAttribute: a typed Parse function was given a different CM message.
	ErrWrongAttribute
	// ErrStatus: the MAD status field is non-zero (the kernel CM never sends one).
	ErrStatus
	// ErrCMAHeader: REQ private data does not start with a valid RDMA CM header (version 0,
	// IP version 4 or 6).
	ErrCMAHeader
	// ErrServiceID: the service ID is not an RDMA IP CM service ID (prefix 0x0000000001).
	ErrServiceID
)

// API and state errors.
const (
	// ErrUnknownConn: no connection with that ID (never existed, or released).
	ErrUnknownConn Error = iota + 64
	// ErrState: the call is not allowed in the connection's current state.
	ErrState
	// ErrPrivateDataTooLong: private data longer than the message can carry.
	ErrPrivateDataTooLong
	// ErrAddrInUse: a listener already exists for that address and port.
	ErrAddrInUse
	// ErrNotListening: Unlisten for an address and port nobody listens on.
	ErrNotListening
	// ErrInvalidArgument: an argument is out of range (QPN 0 or > 24 bits, bad MTU, invalid
	// address, mixed address families, ...).
	ErrInvalidArgument
	// ErrNoResources: the manager holds Config.MaxConns connections already.
	ErrNoResources
	// ErrTimeout: retries exhausted (carried by Unreachable / Disconnected events).
	ErrTimeout
	// ErrDecisionTimeout: the ULP neither accepted nor rejected a request in time; the
	// manager rejected it (carried by an Unreachable event).
	ErrDecisionTimeout
)

var errText = map[Error]string{
	ErrTooShort:           "cm: MAD shorter than 256 bytes",
	ErrBaseVersion:        "cm: MAD base version is not 1",
	ErrNotCM:              "cm: management class is not CM (0x07)",
	ErrClassVersion:       "cm: CM class version is not 2",
	ErrMethod:             "cm: MAD method is not SEND",
	ErrUnknownAttribute:   "cm: unknown CM attribute ID",
	ErrWrongAttribute:     "cm: MAD carries a different CM message",
	ErrStatus:             "cm: non-zero MAD status",
	ErrCMAHeader:          "cm: invalid RDMA CM private-data header",
	ErrServiceID:          "cm: not an RDMA IP CM service ID",
	ErrUnknownConn:        "cm: unknown connection",
	ErrState:              "cm: operation not allowed in the connection's state",
	ErrPrivateDataTooLong: "cm: private data too long",
	ErrAddrInUse:          "cm: address and port already listened on",
	ErrNotListening:       "cm: not listening on that address and port",
	ErrInvalidArgument:    "cm: invalid argument",
	ErrNoResources:        "cm: too many connections",
	ErrTimeout:            "cm: retries exhausted",
	ErrDecisionTimeout:    "cm: request not answered by the ULP in time",
}

func (e Error) Error() string {
	if s, ok := errText[e]; ok {
		return s
	}
	return "cm: unknown error"
}
