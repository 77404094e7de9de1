package scsi

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Status is a SAM status code.
type Status uint8

// SAM-5 status codes.
const (
	StatusGood                Status = 0x00
	StatusCheckCondition      Status = 0x02
	StatusConditionMet        Status = 0x04
	StatusBusy                Status = 0x08
	StatusReservationConflict Status = 0x18
	StatusTaskSetFull         Status = 0x28
	StatusACAActive           Status = 0x30
	StatusTaskAborted         Status = 0x40
)

func (s Status) String() string {
	switch s {
	case StatusGood:
		return "GOOD"
	case StatusCheckCondition:
		return "CHECK CONDITION"
	case StatusConditionMet:
		return "CONDITION MET"
	case StatusBusy:
		return "BUSY"
	case StatusReservationConflict:
		return "RESERVATION CONFLICT"
	case StatusTaskSetFull:
		return "TASK SET FULL"
	case StatusACAActive:
		return "ACA ACTIVE"
	case StatusTaskAborted:
		return "TASK ABORTED"
	}
	return fmt.Sprintf("status 0x%02x", uint8(s))
}

// SenseKey is the 4-bit SPC sense key.
type SenseKey uint8

// SPC-4 sense keys.
const (
	NoSense        SenseKey = 0x0
	RecoveredError SenseKey = 0x1
	NotReady       SenseKey = 0x2
	MediumError    SenseKey = 0x3
	HardwareError  SenseKey = 0x4
	IllegalRequest SenseKey = 0x5
	UnitAttention  SenseKey = 0x6
	DataProtect    SenseKey = 0x7
	BlankCheck     SenseKey = 0x8
	VendorSpecific SenseKey = 0x9
	CopyAborted    SenseKey = 0xA
	AbortedCommand SenseKey = 0xB
	VolumeOverflow SenseKey = 0xD
	Miscompare     SenseKey = 0xE
	Completed      SenseKey = 0xF
)

var senseKeyNames = [16]string{
	"NO SENSE", "RECOVERED ERROR", "NOT READY", "MEDIUM ERROR", "HARDWARE ERROR",
	"ILLEGAL REQUEST", "UNIT ATTENTION", "DATA PROTECT", "BLANK CHECK", "VENDOR SPECIFIC",
	"COPY ABORTED", "ABORTED COMMAND", "RESERVED (0xC)", "VOLUME OVERFLOW", "MISCOMPARE",
	"COMPLETED",
}

func (k SenseKey) String() string {
	if k < 16 {
		return senseKeyNames[k]
	}
	return fmt.Sprintf("sense key 0x%x", uint8(k))
}

// Sense response codes (SPC-4 4.5.1).
const (
	SenseFixedCurrent       = 0x70
	SenseFixedDeferred      = 0x71
	SenseDescriptorCurrent  = 0x72
	SenseDescriptorDeferred = 0x73
)

// MaxSenseLen is the largest sense data SPC allows (additional length is one byte).
const MaxSenseLen = 252

// Lengths of the sense data this package produces.
const (
	fixedSenseLen = 18
	// header + information descriptor + sense key specific descriptor
	maxDescSenseLen = 8 + 12 + 8
)

// FieldPointer is the sense-key specific field of ILLEGAL REQUEST sense data: which byte (and
// optionally which bit) of the CDB or parameter list was rejected (SPC-4 4.5.2.4.2).
type FieldPointer struct {
	Valid    bool   // SKSV
	CDB      bool   // C/D: true = CDB, false = parameter list (data-out)
	BitValid bool   // BPV
	Bit      uint8  // bit pointer (0..7), the most significant bit of the field
	Byte     uint16 // field pointer: byte offset of the field's first byte
}

// Sense is decoded sense data: a key, an additional sense code and qualifier, the INFORMATION
// field and the field pointer. The zero value is NO SENSE.
type Sense struct {
	Key       SenseKey
	ASC, ASCQ uint8
	// InfoValid tells whether Info is meaningful (the VALID bit of fixed format sense, or the
	// presence of an information descriptor).
	InfoValid bool
	Info      uint64
	Field     FieldPointer
	// Deferred is set by ParseSense for deferred errors (0x71 / 0x73); never produced here.
	Deferred bool
}

// Match reports whether s has the given key, ASC and ASCQ.
func (s Sense) Match(key SenseKey, asc, ascq uint8) bool {
	return s.Key == key && s.ASC == asc && s.ASCQ == ascq
}

// Error makes a Sense usable as an error (ParseCDB returns one for an invalid CDB).
func (s Sense) Error() string { return s.String() }

func (s Sense) String() string {
	str := fmt.Sprintf("%s: %s (%02X/%02X)", s.Key, ascString(s.ASC, s.ASCQ), s.ASC, s.ASCQ)
	if s.InfoValid {
		str += fmt.Sprintf(" info 0x%x", s.Info)
	}
	if f := s.Field; f.Valid {
		where := "parameter list"
		if f.CDB {
			where = "CDB"
		}
		str += fmt.Sprintf(" at %s byte %d", where, f.Byte)
		if f.BitValid {
			str += fmt.Sprintf(" bit %d", f.Bit)
		}
	}
	return str
}

// EncodeFixed writes fixed-format (0x70) sense data into dst and returns its length (18), or
// less when dst is shorter (sense data may be truncated, SPC-4 4.5.1). The INFORMATION field is
// 4 bytes: an Info that does not fit is reported with VALID clear.
func (s Sense) EncodeFixed(dst []byte) int {
	var b [fixedSenseLen]byte
	b[0] = SenseFixedCurrent
	if s.InfoValid && s.Info <= 0xFFFFFFFF {
		b[0] |= 0x80
		binary.BigEndian.PutUint32(b[3:7], uint32(s.Info))
	}
	b[2] = uint8(s.Key) & 0x0F
	b[7] = fixedSenseLen - 8
	b[12], b[13] = s.ASC, s.ASCQ
	s.Field.put(b[15:18])
	return copy(dst, b[:])
}

// EncodeDescriptor writes descriptor-format (0x72) sense data into dst and returns its length
// (8, plus 12 for an information descriptor, plus 8 for a sense key specific descriptor), or
// less when dst is shorter.
func (s Sense) EncodeDescriptor(dst []byte) int {
	var b [maxDescSenseLen]byte
	b[0] = SenseDescriptorCurrent
	b[1] = uint8(s.Key) & 0x0F
	b[2], b[3] = s.ASC, s.ASCQ
	n := 8
	if s.InfoValid {
		b[n], b[n+1], b[n+2] = 0x00, 0x0A, 0x80
		binary.BigEndian.PutUint64(b[n+4:n+12], s.Info)
		n += 12
	}
	if s.Field.Valid {
		b[n], b[n+1] = 0x02, 0x06
		s.Field.put(b[n+4 : n+7])
		n += 8
	}
	b[7] = uint8(n - 8)
	return copy(dst, b[:n])
}

// Encode writes descriptor format when desc is set and fixed format otherwise.
func (s Sense) Encode(dst []byte, desc bool) int {
	if desc {
		return s.EncodeDescriptor(dst)
	}
	return s.EncodeFixed(dst)
}

func (f FieldPointer) put(b []byte) {
	if !f.Valid {
		return
	}
	b[0] = 0x80
	if f.CDB {
		b[0] |= 0x40
	}
	if f.BitValid {
		b[0] |= 0x08 | f.Bit&7
	}
	binary.BigEndian.PutUint16(b[1:3], f.Byte)
}

func getFieldPointer(b []byte) FieldPointer {
	if b[0]&0x80 == 0 {
		return FieldPointer{}
	}
	return FieldPointer{
		Valid:    true,
		CDB:      b[0]&0x40 != 0,
		BitValid: b[0]&0x08 != 0,
		Bit:      b[0] & 7,
		Byte:     binary.BigEndian.Uint16(b[1:3]),
	}
}

// Errors returned by ParseSense.
var (
	ErrSenseTooShort    = errors.New("scsi: sense data too short")
	ErrSenseCode        = errors.New("scsi: unknown sense response code")
	ErrSenseDescriptors = errors.New("scsi: malformed sense descriptors")
)

// ParseSense decodes fixed (0x70/0x71) or descriptor (0x72/0x73) format sense data. Truncated
// sense data (shorter than its additional length says) is decoded as far as it goes; fields
// beyond the end read as zero. For a sense key specific field, only the field pointer form
// (the one ILLEGAL REQUEST uses) is decoded.
func ParseSense(b []byte) (Sense, error) {
	var s Sense
	if len(b) < 1 {
		return s, ErrSenseTooShort
	}
	code := b[0] & 0x7F
	switch code {
	case SenseFixedCurrent, SenseFixedDeferred:
		if len(b) < 8 {
			return s, ErrSenseTooShort
		}
		s.Deferred = code == SenseFixedDeferred
		end := min(len(b), 8+int(b[7]))
		var f [fixedSenseLen]byte
		copy(f[:], b[:end])
		s.Key = SenseKey(f[2] & 0x0F)
		if f[0]&0x80 != 0 {
			s.InfoValid = true
			s.Info = uint64(binary.BigEndian.Uint32(f[3:7]))
		}
		s.ASC, s.ASCQ = f[12], f[13]
		if s.Key == IllegalRequest {
			s.Field = getFieldPointer(f[15:18])
		}
		return s, nil
	case SenseDescriptorCurrent, SenseDescriptorDeferred:
		if len(b) < 8 {
			return s, ErrSenseTooShort
		}
		s.Deferred = code == SenseDescriptorDeferred
		s.Key = SenseKey(b[1] & 0x0F)
		s.ASC, s.ASCQ = b[2], b[3]
		end := min(len(b), 8+int(b[7]))
		truncated := end < 8+int(b[7])
		for p := 8; p < end; {
			if end-p < 2 {
				if truncated {
					return s, nil // cut inside a descriptor header: as cut inside its body
				}
				return s, ErrSenseDescriptors
			}
			typ, l := b[p], int(b[p+1])
			if p+2+l > end {
				if truncated {
					return s, nil // truncated by the transfer: keep what we have
				}
				return s, ErrSenseDescriptors
			}
			d := b[p : p+2+l]
			switch typ {
			case 0x00: // information
				if l >= 0x0A {
					s.InfoValid = d[2]&0x80 != 0
					s.Info = binary.BigEndian.Uint64(d[4:12])
				}
			case 0x02: // sense key specific
				if l >= 0x06 && s.Key == IllegalRequest {
					s.Field = getFieldPointer(d[4:7])
				}
			}
			p += 2 + l
		}
		return s, nil
	}
	return s, fmt.Errorf("%w 0x%02x", ErrSenseCode, code)
}

// Sense values this package reports. Helpers build the ones with parameters.
var (
	senseNone              = Sense{}
	senseInvalidOpcode     = Sense{Key: IllegalRequest, ASC: 0x20}
	senseLBAOutOfRange     = Sense{Key: IllegalRequest, ASC: 0x21}
	senseParamListLength   = Sense{Key: IllegalRequest, ASC: 0x1A}
	senseLUNNotSupported   = Sense{Key: IllegalRequest, ASC: 0x25}
	senseSavingUnsupported = Sense{Key: IllegalRequest, ASC: 0x39}
	senseInvalidRelease    = Sense{Key: IllegalRequest, ASC: 0x26, ASCQ: 0x04}
	senseInvalidMessage    = Sense{Key: IllegalRequest, ASC: 0x49}
	senseWriteProtected    = Sense{Key: DataProtect, ASC: 0x27}
	senseNotReadyStopped   = Sense{Key: NotReady, ASC: 0x04, ASCQ: 0x02}
	senseNotReady          = Sense{Key: NotReady, ASC: 0x04, ASCQ: 0x00}
	senseFlushFailed       = Sense{Key: MediumError, ASC: 0x0C}
	// INTERNAL TARGET FAILURE (44h/00h): the shared persistent reservation state could not be
	// read or written.
	senseInternalTargetFailure = Sense{Key: HardwareError, ASC: 0x44}
	// LOGICAL UNIT NOT ACCESSIBLE, ASYMMETRIC ACCESS STATE TRANSITION / TARGET PORT IN
	// STANDBY STATE / TARGET PORT IN UNAVAILABLE STATE
	senseALUATransitioning = Sense{Key: NotReady, ASC: 0x04, ASCQ: 0x0A}
	senseALUAStandby       = Sense{Key: NotReady, ASC: 0x04, ASCQ: 0x0B}
	senseALUAUnavailable   = Sense{Key: NotReady, ASC: 0x04, ASCQ: 0x0C}
)

// invalidCDB is INVALID FIELD IN CDB (24/00) pointing at CDB byte b, bit bit (bit < 0: no bit).
func invalidCDB(b int, bit int) Sense {
	return Sense{Key: IllegalRequest, ASC: 0x24, Field: fieldPointer(true, b, bit)}
}

// invalidParam is INVALID FIELD IN PARAMETER LIST (26/00) pointing at byte b, bit bit.
func invalidParam(b int, bit int) Sense {
	return Sense{Key: IllegalRequest, ASC: 0x26, Field: fieldPointer(false, b, bit)}
}

func fieldPointer(cdb bool, b, bit int) FieldPointer {
	f := FieldPointer{Valid: true, CDB: cdb, Byte: uint16(b)}
	if bit >= 0 {
		f.BitValid, f.Bit = true, uint8(bit)
	}
	return f
}

// readError is MEDIUM ERROR, UNRECOVERED READ ERROR with the failing LBA.
func readError(lba uint64) Sense {
	return Sense{Key: MediumError, ASC: 0x11, InfoValid: true, Info: lba}
}

// writeError is MEDIUM ERROR, WRITE ERROR with the failing LBA.
func writeError(lba uint64) Sense {
	return Sense{Key: MediumError, ASC: 0x0C, InfoValid: true, Info: lba}
}

// miscompare is MISCOMPARE, MISCOMPARE DURING VERIFY OPERATION with the byte offset of the
// first difference.
func miscompare(off uint64) Sense {
	return Sense{Key: Miscompare, ASC: 0x1D, InfoValid: true, Info: off}
}

// Unit attention additional sense codes.
type uaCode uint16

const (
	uaPowerOnReset       uaCode = 0x2900 // POWER ON, RESET, OR BUS DEVICE RESET OCCURRED
	uaLUNReset           uaCode = 0x2903 // BUS DEVICE RESET FUNCTION OCCURRED
	uaNexusLoss          uaCode = 0x2907 // I_T NEXUS LOSS OCCURRED
	uaModeChanged        uaCode = 0x2A01 // MODE PARAMETERS CHANGED
	uaReservationsPreemp uaCode = 0x2A03 // RESERVATIONS PREEMPTED
	uaReservationsRel    uaCode = 0x2A04 // RESERVATIONS RELEASED
	uaRegistrationsPreem uaCode = 0x2A05 // REGISTRATIONS PREEMPTED
	uaAccessStateChanged uaCode = 0x2A06 // ASYMMETRIC ACCESS STATE CHANGED
	uaCapacityChanged    uaCode = 0x2A09 // CAPACITY DATA HAS CHANGED
	uaReportedLUNsChange uaCode = 0x3F0E // REPORTED LUNS DATA HAS CHANGED
)

func (c uaCode) sense() Sense {
	return Sense{Key: UnitAttention, ASC: uint8(c >> 8), ASCQ: uint8(c)}
}

func ascString(asc, ascq uint8) string {
	switch uint16(asc)<<8 | uint16(ascq) {
	case 0x0000:
		return "NO ADDITIONAL SENSE INFORMATION"
	case 0x0400:
		return "LOGICAL UNIT NOT READY, CAUSE NOT REPORTABLE"
	case 0x0402:
		return "LOGICAL UNIT NOT READY, INITIALIZING COMMAND REQUIRED"
	case 0x040A:
		return "LOGICAL UNIT NOT ACCESSIBLE, ASYMMETRIC ACCESS STATE TRANSITION"
	case 0x040B:
		return "LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE"
	case 0x040C:
		return "LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE STATE"
	case 0x0C00:
		return "WRITE ERROR"
	case 0x1100:
		return "UNRECOVERED READ ERROR"
	case 0x1A00:
		return "PARAMETER LIST LENGTH ERROR"
	case 0x1D00:
		return "MISCOMPARE DURING VERIFY OPERATION"
	case 0x2000:
		return "INVALID COMMAND OPERATION CODE"
	case 0x2100:
		return "LOGICAL BLOCK ADDRESS OUT OF RANGE"
	case 0x2400:
		return "INVALID FIELD IN CDB"
	case 0x2500:
		return "LOGICAL UNIT NOT SUPPORTED"
	case 0x2600:
		return "INVALID FIELD IN PARAMETER LIST"
	case 0x2604:
		return "INVALID RELEASE OF PERSISTENT RESERVATION"
	case 0x2700:
		return "WRITE PROTECTED"
	case 0x2900:
		return "POWER ON, RESET, OR BUS DEVICE RESET OCCURRED"
	case 0x2903:
		return "BUS DEVICE RESET FUNCTION OCCURRED"
	case 0x2907:
		return "I_T NEXUS LOSS OCCURRED"
	case 0x2A01:
		return "MODE PARAMETERS CHANGED"
	case 0x2A03:
		return "RESERVATIONS PREEMPTED"
	case 0x2A04:
		return "RESERVATIONS RELEASED"
	case 0x2A05:
		return "REGISTRATIONS PREEMPTED"
	case 0x2A06:
		return "ASYMMETRIC ACCESS STATE CHANGED"
	case 0x3900:
		return "SAVING PARAMETERS NOT SUPPORTED"
	case 0x2A09:
		return "CAPACITY DATA HAS CHANGED"
	case 0x3F0E:
		return "REPORTED LUNS DATA HAS CHANGED"
	case 0x4900:
		return "INVALID MESSAGE ERROR"
	}
	return "ASC/ASCQ"
}
