package initiator

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/srpd/srpd/srp"
)

// Decoding of the discovery responses of a logical unit (REPORT LUNS, INQUIRY and its VPD
// pages, READ CAPACITY, MODE SENSE). Each decoder takes the data-in bytes the target actually
// transferred (buffer[:n]) and nothing beyond: bytes past n are whatever the target wrote or
// left there, not data. Layouts are SPC-4 / SBC-3 (as Linux sd reads them:
// torvalds/linux:drivers/scsi/sd.c, read_capacity_16, sd_read_block_limits).

const (
	// maxReportLUNs bounds the REPORT LUNS list we accept (the buffer grows to 128 KiB at
	// most, and each LUN is probed with a handful of commands).
	maxReportLUNs = 16384
	// maxReportLUNsTries bounds the REPORT LUNS commands of one discovery: one with the default
	// buffer, one with the length the target announced, one more in case the list grew in
	// between. A target whose announced length keeps growing gets no more.
	maxReportLUNsTries = 3
	minBlockSize       = 512
	maxBlockSize       = 65536
)

// parseReportLUNs decodes REPORT LUNS parameter data: the LUN LIST LENGTH (in bytes) it
// announces and the LUNs of the list that were transferred, duplicates dropped (a LUN listed
// twice is one logical unit).
func parseReportLUNs(b []byte) (listLen uint32, luns []srp.LUN, err error) {
	if len(b) < 8 {
		return 0, nil, fmt.Errorf("%w: REPORT LUNS returned %d bytes, want at least 8", ErrLUNData, len(b))
	}
	listLen = binary.BigEndian.Uint32(b)
	end := 8 + min(uint64(listLen), uint64(len(b)-8))
	n := int(end-8) / 8
	if n > maxReportLUNs {
		n = maxReportLUNs
	}
	seen := make(map[srp.LUN]struct{}, n)
	for i := 0; i < n; i++ {
		var a srp.LUN
		copy(a[:], b[8+8*i:])
		if _, dup := seen[a]; dup {
			continue
		}
		seen[a] = struct{}{}
		luns = append(luns, a)
	}
	return listLen, luns, nil
}

// reportLUNsAlloc is the allocation length a REPORT LUNS list of listLen bytes needs, capped at
// maxReportLUNs entries.
func reportLUNsAlloc(listLen uint32) int {
	return 8 + int(min(uint64(listLen), 8*maxReportLUNs))
}

// parseStdInquiry decodes standard INQUIRY data into info: a connected direct-access block
// device (peripheral qualifier 0, device type 0) with its vendor, product and revision.
func parseStdInquiry(b []byte, info *LUNInfo) error {
	if len(b) < 36 {
		return fmt.Errorf("%w: LUN %d: INQUIRY returned %d bytes, want at least 36", ErrLUNData, info.Number, len(b))
	}
	if q, t := b[0]>>5, b[0]&0x1f; q != 0 || t != 0 {
		return fmt.Errorf("LUN %d: peripheral qualifier %d, device type %#x: %w", info.Number, q, t, errNotDisk)
	}
	info.Vendor, info.Product, info.Revision = trimASCII(b[8:16]), trimASCII(b[16:32]), trimASCII(b[32:36])
	return nil
}

// trimASCII is an INQUIRY/VPD ASCII field without its padding (spaces or NULs).
func trimASCII(b []byte) string { return string(bytes.TrimRight(b, " \x00")) }

// vpdPayload is the VPD page page in b (what INQUIRY with EVPD returned): the page cut to its
// PAGE LENGTH, or nil if b is not that page.
func vpdPayload(page byte, b []byte) []byte {
	if len(b) < 4 || b[1] != page {
		return nil
	}
	return b[:min(len(b), 4+int(binary.BigEndian.Uint16(b[2:])))]
}

// supportedVPD is the set of VPD pages a SUPPORTED VPD PAGES page (0x00) lists.
type supportedVPD [256]bool

func parseSupportedVPD(p []byte) (s supportedVPD) {
	if len(p) >= 4 {
		for _, c := range p[4:] {
			s[c] = true
		}
	}
	return s
}

// parseBlockLimits decodes the Block Limits VPD page (0xB0) into info.
func parseBlockLimits(p []byte, info *LUNInfo) {
	if len(p) < 16 {
		return
	}
	info.MaxTransfer = binary.BigEndian.Uint32(p[8:])
	info.OptimalTransfer = binary.BigEndian.Uint32(p[12:])
	if len(p) >= 28 {
		info.MaxUnmapLBAs = binary.BigEndian.Uint32(p[20:])
		info.MaxUnmapDescs = binary.BigEndian.Uint32(p[24:])
	}
	if len(p) >= 44 {
		info.MaxWriteSame = binary.BigEndian.Uint64(p[36:])
	}
}

// parseLBP decodes the Logical Block Provisioning VPD page (0xB2) into info.
func parseLBP(p []byte, info *LUNInfo) {
	if len(p) < 6 {
		return
	}
	info.UnmapSupported = p[5]&0x80 != 0
	info.WriteSameUnmap = p[5]&0x40 != 0
	info.ZeroesAfterUnmap = info.ZeroesAfterUnmap || p[5]&0x04 != 0
}

// parseReadCap16 decodes READ CAPACITY(16) parameter data into info. ok is false when b is too
// short to carry the capacity (the caller asks READ CAPACITY(10) then).
func parseReadCap16(b []byte, info *LUNInfo) (ok bool, err error) {
	if len(b) < 12 {
		return false, nil
	}
	lba := binary.BigEndian.Uint64(b)
	if lba == math.MaxUint64 {
		return true, fmt.Errorf("%w: LUN %d: READ CAPACITY(16) returned last LBA 2^64-1", ErrLUNData, info.Number)
	}
	info.Blocks = lba + 1
	info.BlockSize = int(binary.BigEndian.Uint32(b[8:]))
	if len(b) >= 14 {
		info.PhysBlockExp = b[13] & 0x0f
	}
	if len(b) >= 15 {
		info.Provisioning = b[14]&0x80 != 0
		info.ZeroesAfterUnmap = b[14]&0x40 != 0
	}
	return true, checkGeometry(info, "READ CAPACITY(16)")
}

// parseReadCap10 decodes READ CAPACITY(10) parameter data into info.
func parseReadCap10(b []byte, info *LUNInfo) error {
	if len(b) < 8 {
		return fmt.Errorf("%w: LUN %d: READ CAPACITY(10) returned %d bytes, want 8", ErrLUNData, info.Number, len(b))
	}
	lba := binary.BigEndian.Uint32(b)
	if lba == math.MaxUint32 {
		// SBC: the capacity does not fit; READ CAPACITY(16) tells it, and this LUN refused it.
		return fmt.Errorf("%w: LUN %d: READ CAPACITY(10) says the capacity needs READ CAPACITY(16), which the LUN refused", ErrLUNData, info.Number)
	}
	info.Blocks = uint64(lba) + 1
	info.BlockSize = int(binary.BigEndian.Uint32(b[4:]))
	return checkGeometry(info, "READ CAPACITY(10)")
}

// checkGeometry refuses a block size the block API cannot use (a power of two in
// [512, 65536]; zero among them) and a capacity whose size in bytes does not fit an int64.
func checkGeometry(info *LUNInfo, op string) error {
	bs := info.BlockSize
	if bs < minBlockSize || bs > maxBlockSize || bs&(bs-1) != 0 {
		return fmt.Errorf("%w: LUN %d: %s: block size %d (want a power of two in [%d, %d])", ErrLUNData, info.Number, op, bs, minBlockSize, maxBlockSize)
	}
	if info.Blocks > uint64(math.MaxInt64)/uint64(bs) {
		return fmt.Errorf("%w: LUN %d: %s: %d blocks of %d bytes exceed 2^63 bytes", ErrLUNData, info.Number, op, info.Blocks, bs)
	}
	return nil
}

// parseModeSenseWP reads the WP bit of a MODE SENSE(10) parameter header; ok is false when b is
// too short to carry it.
func parseModeSenseWP(b []byte) (wp, ok bool) {
	if len(b) < 4 {
		return false, false
	}
	return b[3]&0x80 != 0, true
}
