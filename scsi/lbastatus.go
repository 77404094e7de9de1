package scsi

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// LBAStatus is one GET LBA STATUS descriptor (sbc4r15 5.8.2 table 66): Blocks blocks from LBA
// with one provisioning status.
type LBAStatus struct {
	LBA    uint64
	Blocks uint32
	// Status is the PROVISIONING STATUS field (byte 12, bits 3-0): 0 mapped or unknown,
	// 1 deallocated, 2 anchored.
	Status uint8
}

// Provisioning statuses of an LBAStatus.
const (
	LBAMapped      = provisionMapped
	LBADeallocated = provisionDeallocated
	LBAAnchored    = 0x2
)

// ErrLBAStatusData means GET LBA STATUS parameter data that does not decode.
var ErrLBAStatusData = errors.New("scsi: malformed GET LBA STATUS parameter data")

// ParseLBAStatus decodes GET LBA STATUS parameter data (sbc4r15 5.8.2: an 8-byte header whose
// PARAMETER DATA LENGTH counts the bytes after its own 4, then 16-byte descriptors), appending
// the descriptors to dst. Data cut short by the allocation length yields the whole descriptors
// it holds; a length that is not 4 + a multiple of 16, or descriptors that do not follow each
// other in ascending LBA order, is ErrLBAStatusData.
func ParseLBAStatus(dst []LBAStatus, b []byte) ([]LBAStatus, error) {
	if len(b) < lbaStatusHeaderLen {
		return dst, fmt.Errorf("%w: %d bytes, want at least %d", ErrLBAStatusData, len(b), lbaStatusHeaderLen)
	}
	pl := binary.BigEndian.Uint32(b)
	if pl < 4 || (pl-4)%lbaStatusDescLen != 0 {
		return dst, fmt.Errorf("%w: parameter data length %d", ErrLBAStatusData, pl)
	}
	n := min(int((pl-4)/lbaStatusDescLen), (len(b)-lbaStatusHeaderLen)/lbaStatusDescLen)
	var next uint64
	for i := range n {
		d := b[lbaStatusHeaderLen+i*lbaStatusDescLen:]
		s := LBAStatus{LBA: binary.BigEndian.Uint64(d), Blocks: binary.BigEndian.Uint32(d[8:]), Status: d[12] & 0x0F}
		if i > 0 && s.LBA < next {
			return dst, fmt.Errorf("%w: descriptor %d starts at LBA %d, before the end of the previous one (%d)",
				ErrLBAStatusData, i, s.LBA, next)
		}
		next = s.LBA + uint64(s.Blocks)
		dst = append(dst, s)
	}
	return dst, nil
}
