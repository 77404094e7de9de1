package scsi

import "encoding/binary"

// CDB encoders, for initiators. Each appends one CDB to dst and returns the extended slice,
// like strconv.AppendInt: with a [16]byte array's dst[:0] they do not allocate. Reserved
// bytes, CONTROL (no NACA, no LINK) and the fields an encoder has no parameter for are zero.
// The layouts are SBC-3 and SPC-4's, as Linux sd builds them (torvalds/linux:
// drivers/scsi/sd.c sd_setup_rw16_cmnd, sd_setup_unmap_cmnd, sd_setup_write_same16_cmnd,
// sd_sync_cache; drivers/scsi/scsi_scan.c for INQUIRY and REPORT LUNS). This package's own
// parser (ParseCDB) accepts every CDB they produce for values a LUN supports.

// AppendTestUnitReady appends TEST UNIT READY (SPC-4 6.47): 6 bytes.
func AppendTestUnitReady(dst []byte) []byte {
	return append(dst, OpTestUnitReady, 0, 0, 0, 0, 0)
}

// AppendRequestSense appends REQUEST SENSE (SPC-4 6.39): 6 bytes. desc asks for descriptor
// format sense data.
func AppendRequestSense(dst []byte, desc bool, alloc uint8) []byte {
	return append(dst, OpRequestSense, bit(desc, 0x01), 0, 0, alloc, 0)
}

// AppendInquiry appends INQUIRY (SPC-4 6.6): 6 bytes. With evpd the VPD page page is asked
// for; without it page must be 0 (standard INQUIRY data).
func AppendInquiry(dst []byte, evpd bool, page uint8, alloc uint16) []byte {
	return append(dst, OpInquiry, bit(evpd, 0x01), page, uint8(alloc>>8), uint8(alloc), 0)
}

// AppendReadCapacity10 appends READ CAPACITY(10) (SBC-3 5.15): 10 bytes, LBA and PMI zero.
func AppendReadCapacity10(dst []byte) []byte {
	return append(dst, OpReadCapacity10, 0, 0, 0, 0, 0, 0, 0, 0, 0)
}

// AppendReadCapacity16 appends READ CAPACITY(16) (SBC-3 5.16: SERVICE ACTION IN(16) 0x10):
// 16 bytes, LBA and PMI zero.
func AppendReadCapacity16(dst []byte, alloc uint32) []byte {
	dst, c := grow(dst, 16)
	c[0], c[1] = OpServiceActionIn16, SAReadCapacity16
	binary.BigEndian.PutUint32(c[10:], alloc)
	return dst
}

// AppendRead16 appends READ(16) (SBC-3 5.8): 16 bytes; fua sets FUA.
func AppendRead16(dst []byte, lba uint64, blocks uint32, fua bool) []byte {
	return appendLBA16(dst, OpRead16, bit(fua, 0x08), lba, blocks)
}

// AppendWrite16 appends WRITE(16) (SBC-3 5.40): 16 bytes; fua sets FUA.
func AppendWrite16(dst []byte, lba uint64, blocks uint32, fua bool) []byte {
	return appendLBA16(dst, OpWrite16, bit(fua, 0x08), lba, blocks)
}

// AppendSynchronizeCache16 appends SYNCHRONIZE CACHE(16) (SBC-3 5.23): 16 bytes. blocks 0
// means through the last LBA, so lba 0 and blocks 0 is the whole medium; immed sets IMMED.
func AppendSynchronizeCache16(dst []byte, lba uint64, blocks uint32, immed bool) []byte {
	return appendLBA16(dst, OpSynchronizeCache16, bit(immed, 0x02), lba, blocks)
}

// AppendWriteSame16 appends WRITE SAME(16) (SBC-3 5.42): 16 bytes; unmap sets UNMAP (the
// blocks may be deallocated instead of written), ndob NDOB (no data-out block: zeroes).
func AppendWriteSame16(dst []byte, lba uint64, blocks uint32, unmap, ndob bool) []byte {
	return appendLBA16(dst, OpWriteSame16, bit(unmap, 0x08)|bit(ndob, 0x01), lba, blocks)
}

// AppendUnmap appends UNMAP (SBC-3 5.28): 10 bytes, the parameter list of paramLen bytes (an
// 8-byte header and 16 bytes per block descriptor: AppendUnmapParams) to follow as data-out.
func AppendUnmap(dst []byte, paramLen uint16) []byte {
	return append(dst, OpUnmap, 0, 0, 0, 0, 0, 0, uint8(paramLen>>8), uint8(paramLen), 0)
}

// UnmapDescriptor is one UNMAP block descriptor (SBC-4 5.32.2): Blocks logical blocks from LBA
// are to be unmapped (0 blocks: none).
type UnmapDescriptor struct {
	LBA    uint64
	Blocks uint32
}

// MaxUnmapParamDescriptors is the most block descriptors one UNMAP parameter list can hold: its
// length, 8 + 16 per descriptor, must fit the CDB's 16-bit PARAMETER LIST LENGTH.
const MaxUnmapParamDescriptors = (0xFFFF - unmapParamHeaderLen) / unmapDescriptorLen

const (
	unmapParamHeaderLen = 8
	unmapDescriptorLen  = 16
)

// AppendUnmapParams appends the UNMAP parameter list (SBC-4 5.32.2) for descs, the data-out of
// the UNMAP that AppendUnmap encodes with paramLen the list's length: an 8-byte header (UNMAP
// DATA LENGTH, the bytes after that field; UNMAP BLOCK DESCRIPTOR DATA LENGTH; 4 reserved),
// then per descriptor its LBA (8 bytes), NUMBER OF LOGICAL BLOCKS (4) and 4 reserved bytes, as
// Linux sd builds its one-descriptor list (drivers/scsi/sd.c sd_setup_unmap_cmnd). Appending
// into a buffer with room does not allocate. More than MaxUnmapParamDescriptors descriptors
// do not fit an UNMAP command: that panics.
func AppendUnmapParams(dst []byte, descs []UnmapDescriptor) []byte {
	if len(descs) > MaxUnmapParamDescriptors {
		panic("scsi: AppendUnmapParams: more block descriptors than one UNMAP parameter list holds")
	}
	descLen := unmapDescriptorLen * len(descs)
	dst, h := grow(dst, unmapParamHeaderLen)
	binary.BigEndian.PutUint16(h[0:], uint16(unmapParamHeaderLen-2+descLen))
	binary.BigEndian.PutUint16(h[2:], uint16(descLen))
	for _, d := range descs {
		var c []byte
		dst, c = grow(dst, unmapDescriptorLen)
		binary.BigEndian.PutUint64(c[0:], d.LBA)
		binary.BigEndian.PutUint32(c[8:], d.Blocks)
	}
	return dst
}

// AppendModeSense10 appends MODE SENSE(10) (SPC-4 6.14): 10 bytes. dbd asks for no block
// descriptors, llbaa allows long LBA ones; pc is the page control (0 current, 1 changeable,
// 2 default, 3 saved).
func AppendModeSense10(dst []byte, dbd, llbaa bool, pc, page, subpage uint8, alloc uint16) []byte {
	return append(dst, OpModeSense10, bit(dbd, 0x08)|bit(llbaa, 0x10), pc<<6|page&0x3F, subpage,
		0, 0, 0, uint8(alloc>>8), uint8(alloc), 0)
}

// AppendReportLUNs appends REPORT LUNS (SPC-4 6.33): 12 bytes. selectReport 0 lists the
// logical units (1: well known ones only, 2: both).
func AppendReportLUNs(dst []byte, selectReport uint8, alloc uint32) []byte {
	dst, c := grow(dst, 12)
	c[0], c[2] = OpReportLUNs, selectReport
	binary.BigEndian.PutUint32(c[6:], alloc)
	return dst
}

// appendLBA16 is the common layout of the 16-byte LBA commands: opcode, flags, 8-byte LBA,
// 4-byte block count, group number 0, CONTROL 0.
func appendLBA16(dst []byte, op, flags uint8, lba uint64, blocks uint32) []byte {
	dst, c := grow(dst, 16)
	c[0], c[1] = op, flags
	binary.BigEndian.PutUint64(c[2:], lba)
	binary.BigEndian.PutUint32(c[10:], blocks)
	return dst
}

// grow appends n zero bytes to dst and returns the result and the new bytes.
func grow(dst []byte, n int) ([]byte, []byte) {
	l := len(dst)
	var zero [16]byte
	dst = append(dst, zero[:n]...)
	return dst, dst[l:]
}

func bit(b bool, v uint8) uint8 {
	if b {
		return v
	}
	return 0
}

// AppendGetLBAStatus appends GET LBA STATUS (sbc4r15 5.8: SERVICE ACTION IN(16) 0x12): 16 bytes,
// the starting LBA and the allocation length; REPORT TYPE 0 (all descriptors).
func AppendGetLBAStatus(dst []byte, lba uint64, alloc uint32) []byte {
	dst, c := grow(dst, 16)
	c[0], c[1] = OpServiceActionIn16, SAGetLBAStatus
	binary.BigEndian.PutUint64(c[2:], lba)
	binary.BigEndian.PutUint32(c[10:], alloc)
	return dst
}
