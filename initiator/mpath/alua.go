package mpath

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ALUA data the path checker reads: REPORT TARGET PORT GROUPS (SPC-4 6.36, length-only
// format) and the target port group designator of VPD page 0x83 (SPC-4 7.8.6.7), the way
// torvalds/linux:drivers/scsi/device_handler/scsi_dh_alua.c (alua_rtpg, alua_check_vpd) reads
// them.

// State is an asymmetric access state (SPC-4 table 166).
type State uint8

const (
	ActiveOptimized    State = 0x0
	ActiveNonOptimized State = 0x1
	Standby            State = 0x2
	Unavailable        State = 0x3
	Offline            State = 0xE
	Transitioning      State = 0xF
)

func (s State) String() string {
	switch s {
	case ActiveOptimized:
		return "active/optimized"
	case ActiveNonOptimized:
		return "active/non-optimized"
	case Standby:
		return "standby"
	case Unavailable:
		return "unavailable"
	case Offline:
		return "offline"
	case Transitioning:
		return "transitioning"
	}
	return fmt.Sprintf("State(%#x)", uint8(s))
}

// usable reports whether I/O may go to a path in state s (scsi_dh_alua's alua_prep_fn lets
// active/optimized and active/non-optimized through; the others are refused).
func (s State) usable() bool { return s == ActiveOptimized || s == ActiveNonOptimized }

// ErrALUAData: a malformed REPORT TARGET PORT GROUPS or VPD 0x83 answer.
var ErrALUAData = errors.New("mpath: malformed ALUA data")

// rtpgCDB is REPORT TARGET PORT GROUPS (MAINTENANCE IN 0xA3, service action 0x0A), length-only
// format, for n bytes.
func rtpgCDB(n uint32) []byte {
	cdb := make([]byte, 12)
	cdb[0], cdb[1] = 0xA3, 0x0A
	binary.BigEndian.PutUint32(cdb[6:], n)
	return cdb
}

// ParseRTPG returns the asymmetric access state of each target port group in an RTPG answer
// (length-only format: a 4-byte RETURN DATA LENGTH, then 8-byte descriptors each followed by
// 4 bytes per target port). A truncated last descriptor is an error; what the allocation
// length cut off after whole descriptors is not.
func ParseRTPG(b []byte) (map[uint16]State, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("%w: RTPG answer of %d bytes", ErrALUAData, len(b))
	}
	n := int(binary.BigEndian.Uint32(b))
	if n > len(b)-4 {
		n = len(b) - 4
	}
	d := b[4 : 4+n]
	out := map[uint16]State{}
	for len(d) > 0 {
		if len(d) < 8 {
			return nil, fmt.Errorf("%w: RTPG descriptor of %d bytes", ErrALUAData, len(d))
		}
		ports := int(d[7])
		if len(d) < 8+4*ports {
			return nil, fmt.Errorf("%w: RTPG descriptor with %d target ports in %d bytes", ErrALUAData, ports, len(d))
		}
		out[binary.BigEndian.Uint16(d[2:])] = State(d[0] & 0x0F)
		d = d[8+4*ports:]
	}
	return out, nil
}

// ParseTPGDesignator returns the target port group of the TARGET PORT GROUP designator
// (association 1: target port, type 5) in a VPD page 0x83 answer; ok false when it has none.
func ParseTPGDesignator(page []byte) (tpg uint16, ok bool, err error) {
	if len(page) < 4 || page[1] != 0x83 {
		return 0, false, fmt.Errorf("%w: not a VPD 0x83 page", ErrALUAData)
	}
	n := int(binary.BigEndian.Uint16(page[2:]))
	if n > len(page)-4 {
		n = len(page) - 4
	}
	d := page[4 : 4+n]
	for len(d) >= 4 {
		l := int(d[3])
		if len(d) < 4+l {
			return 0, false, fmt.Errorf("%w: designator of %d bytes in %d", ErrALUAData, l, len(d)-4)
		}
		assoc, typ := (d[1]>>4)&3, d[1]&0x0F
		if assoc == 1 && typ == 5 && l >= 4 {
			return binary.BigEndian.Uint16(d[6:]), true, nil
		}
		d = d[4+l:]
	}
	return 0, false, nil
}
