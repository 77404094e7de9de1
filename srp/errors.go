package srp

import (
	"errors"
	"strconv"
)

// Sentinel errors. A *ParseError or *EncodeError wraps exactly one of them;
// test with errors.Is.
var (
	// ErrTruncated: the buffer ends before a fixed field, or before the
	// data that the IU's own length fields announce.
	ErrTruncated = errors.New("truncated IU")
	// ErrBadOpcode: the opcode byte is not the one of the IU being parsed.
	ErrBadOpcode = errors.New("unexpected opcode")
	// ErrDescriptorOverrun: SRP_CMD's descriptors (counts, formats,
	// additional CDB length) extend past the end of the IU.
	ErrDescriptorOverrun = errors.New("descriptors overrun the IU")
	// ErrTableLenMismatch: an indirect descriptor's table length is not a
	// multiple of 16 or is too short for the descriptors carried in the IU.
	ErrTableLenMismatch = errors.New("indirect table length does not match descriptor count")
	// ErrTotalLenMismatch: an indirect descriptor whose complete table is
	// in the IU has a TOTAL LENGTH that is not the sum of its descriptors.
	ErrTotalLenMismatch = errors.New("indirect total length does not match descriptor lengths")
	// ErrImmOffset: the immediate-data offset lies outside the IU or
	// before the end of the descriptors.
	ErrImmOffset = errors.New("immediate data offset outside the IU")
	// ErrLengthOverflow: lengths that add up past 2^32-1.
	ErrLengthOverflow = errors.New("length overflow")
	// ErrUnsupportedFormat: a descriptor format that is reserved, not
	// allowed in this direction, or immediate data that was not negotiated.
	ErrUnsupportedFormat = errors.New("unsupported buffer descriptor format")
	// ErrConflictingFlags: flags that contradict each other or the
	// lengths they qualify.
	ErrConflictingFlags = errors.New("conflicting flags")
	// ErrShortBuffer: (encoding) the destination buffer is too small.
	ErrShortBuffer = errors.New("buffer too small")
	// ErrInvalidField: (encoding) a field value that cannot be encoded.
	ErrInvalidField = errors.New("invalid field value")
)

// ParseError reports why an IU was rejected.
type ParseError struct {
	IU     Opcode // IU being parsed
	Field  string // offending field, named as in include/scsi/srp.h
	Off    int    // byte offset of that field within the IU
	Reason error  // one of the Err* sentinels
}

func (e *ParseError) Error() string {
	return "srp: parse " + e.IU.String() + ": " + e.Field + " at offset " +
		strconv.Itoa(e.Off) + ": " + e.Reason.Error()
}

func (e *ParseError) Unwrap() error { return e.Reason }

// EncodeError reports why an IU could not be encoded.
type EncodeError struct {
	IU     Opcode
	Field  string
	Reason error // one of the Err* sentinels
}

func (e *EncodeError) Error() string {
	return "srp: encode " + e.IU.String() + ": " + e.Field + ": " + e.Reason.Error()
}

func (e *EncodeError) Unwrap() error { return e.Reason }

func perr(op Opcode, field string, off int, reason error) error {
	return &ParseError{IU: op, Field: field, Off: off, Reason: reason}
}

func eerr(op Opcode, field string, reason error) error {
	return &EncodeError{IU: op, Field: field, Reason: reason}
}

// checkFixed validates the length and opcode of an IU of at least n bytes.
func checkFixed(b []byte, op Opcode, n int) error {
	if len(b) < n {
		return perr(op, "length", len(b), ErrTruncated)
	}
	if Opcode(b[0]) != op {
		return perr(op, "opcode", 0, ErrBadOpcode)
	}
	return nil
}

// prepare checks that b can hold n bytes and clears them.
func prepare(b []byte, op Opcode, n int) error {
	if len(b) < n {
		return eerr(op, "buffer", ErrShortBuffer)
	}
	clear(b[:n])
	b[0] = byte(op)
	return nil
}

// PeekOpcode returns the opcode of an IU received by SEND (byte 0), to
// choose the ParseXxx function. It does not apply to the RDMA CM form of
// SRP_LOGIN_REQ, whose opcode is byte 11. An empty b yields a *ParseError
// wrapping ErrTruncated (its IU field is then meaningless).
func PeekOpcode(b []byte) (Opcode, error) {
	if len(b) == 0 {
		return 0, perr(0, "opcode", 0, ErrTruncated)
	}
	return Opcode(b[0]), nil
}
