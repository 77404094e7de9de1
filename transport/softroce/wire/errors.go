package wire

// Error is the type of every error this package returns. The values are comparable sentinels
// (errors.Is works, and so does ==); returning one never allocates.
type Error uint8

// Errors.
const (
	// ErrTooShort: the packet is shorter than a BTH.
	ErrTooShort Error = iota + 1
	// ErrBadTVer: BTH TVer is not 0.
	ErrBadTVer
	// ErrUnknownOpcode: the BTH opcode is not in the opcode table.
	ErrUnknownOpcode
	// ErrTruncated: the packet is shorter than its opcode's headers + PadCnt + ICRC.
	ErrTruncated
	// ErrBadPad: PadCnt is non-zero on an opcode that carries no payload, or payload plus pad
	// is not a multiple of 4 bytes.
	ErrBadPad
	// ErrUnexpectedPayload: an opcode that carries no payload (ACK, READ request, ...) has bytes
	// between its headers and the ICRC.
	ErrUnexpectedPayload
	// ErrBadICRC: the ICRC does not match.
	ErrBadICRC
	// ErrIPHeader: an IP header is not a plain 20-byte IPv4 (IHL 5) or 40-byte IPv6 header
	// carrying UDP, or is inconsistent with the UDP datagram.
	ErrIPHeader
	// ErrBufferTooSmall: a buffer given to Layout or an encoder is too small.
	ErrBufferTooSmall
	// ErrPayloadTooLarge: a payload does not fit a RoCEv2 datagram.
	ErrPayloadTooLarge
	// ErrMADTooShort: a MAD is shorter than its 24-byte common header.
	ErrMADTooShort
	// ErrAddress: addresses of mixed families or an invalid address (ParseEncap: an
	// IPv4-mapped address in an IPv6 header).
	ErrAddress
)

var errText = [...]string{
	ErrTooShort:          "wire: packet shorter than BTH",
	ErrBadTVer:           "wire: BTH TVer not 0",
	ErrUnknownOpcode:     "wire: unknown BTH opcode",
	ErrTruncated:         "wire: packet shorter than headers + pad + ICRC",
	ErrBadPad:            "wire: inconsistent BTH PadCnt",
	ErrUnexpectedPayload: "wire: payload on an opcode that has none",
	ErrBadICRC:           "wire: bad ICRC",
	ErrIPHeader:          "wire: unsupported or inconsistent IP/UDP header",
	ErrBufferTooSmall:    "wire: buffer too small",
	ErrPayloadTooLarge:   "wire: payload too large",
	ErrMADTooShort:       "wire: MAD shorter than its common header",
	ErrAddress:           "wire: bad or mixed-family addresses",
}

func (e Error) Error() string {
	if int(e) < len(errText) && errText[e] != "" {
		return errText[e]
	}
	return "wire: unknown error"
}
