package scsi

import (
	"crypto/sha256"
	"encoding/binary"
)

// VPD pages served by INQUIRY with EVPD=1, in the order page 0x00 lists them.
var vpdPages = [...]uint8{0x00, 0x80, 0x83, 0x86, 0xB0, 0xB1, 0xB2}

func vpdSupported(page uint8) bool {
	for _, p := range vpdPages {
		if p == page {
			return true
		}
	}
	return false
}

// Version descriptors in standard INQUIRY data (SPC-4 Table 146).
const (
	versionSAM5 = 0x00A0
	versionSPC4 = 0x0460
	versionSBC3 = 0x04C0
	versionSRP  = 0x0940
)

const stdInquiryLen = 96

// deriveNAA computes the 16-byte NAA IEEE Registered Extended designator (NAA 6) of a LUN:
//
//	byte 0..3, upper nibble:  NAA = 6 and the 24-bit IEEE company ID
//	the remaining 100 bits:   the first 100 bits of SHA-256(input), taken as the low nibble
//	                          of byte 0 of the hash followed by hash bytes 1..12
//
// where input is "srpd-naa-v1\x00id\x00" followed by the 16 DeviceID bytes when DeviceID is
// non-zero, and "srpd-naa-v1\x00serial\x00" followed by the Serial string otherwise. The
// identifier therefore depends only on the configuration (company ID and DeviceID, or
// Serial): it is the same after every restart, and changes only if they do.
func deriveNAA(companyID uint32, id [16]byte, serial string) [16]byte {
	h := sha256.New()
	if id != ([16]byte{}) {
		h.Write([]byte("srpd-naa-v1\x00id\x00"))
		h.Write(id[:])
	} else {
		h.Write([]byte("srpd-naa-v1\x00serial\x00"))
		h.Write([]byte(serial))
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	var naa [16]byte
	naa[0] = 0x60 | uint8(companyID>>20)&0x0F
	naa[1] = uint8(companyID >> 12)
	naa[2] = uint8(companyID >> 4)
	naa[3] = uint8(companyID&0x0F)<<4 | sum[0]&0x0F
	copy(naa[4:], sum[1:13])
	return naa
}

// NAA is the LUN's NAA 6 identifier, as reported in VPD page 0x83 (see deriveNAA).
func (l *LUN) NAA() [16]byte { return l.naa }

func (x *exec) inquiry() Status {
	l := x.l
	if !x.info.flag {
		var b [stdInquiryLen]byte
		fillStandardInquiry(b[:], 0x00, l.vendor[:], l.product[:], l.revision[:])
		if l.alua != nil {
			b[5] |= 0x10 // TPGS 01b: implicit asymmetric logical unit access only
		}
		return x.reply(b[:])
	}
	var b [256]byte
	return x.reply(l.vpdPage(x.cdb[2], &x.cmd.Nexus, b[:]))
}

// fillStandardInquiry writes standard INQUIRY data with the given peripheral byte (0x00 for a
// direct access block device, 0x7F for a LUN that does not exist).
func fillStandardInquiry(b []byte, peripheral uint8, vendor, product, revision []byte) {
	b[0] = peripheral
	b[2] = 0x06 // VERSION: SPC-4
	b[3] = 0x12 // HISUP, RESPONSE DATA FORMAT 2
	b[4] = stdInquiryLen - 5
	b[7] = 0x02 // CMDQUE
	copy(b[8:16], vendor)
	copy(b[16:32], product)
	copy(b[32:36], revision)
	for k, v := range [...]uint16{versionSAM5, versionSRP, versionSPC4, versionSBC3} {
		binary.BigEndian.PutUint16(b[58+2*k:], v)
	}
}

// vpdPage builds VPD page `page`, as seen through nexus nx, into b and returns it.
func (l *LUN) vpdPage(page uint8, nx *Nexus, b []byte) []byte {
	b[0] = 0x00 // peripheral qualifier 0, direct access block device
	b[1] = page
	n := 4
	switch page {
	case 0x00: // Supported VPD pages
		n += copy(b[4:], vpdPages[:])
	case 0x80: // Unit serial number
		n += copy(b[4:], l.serial)
	case 0x83: // Device identification
		// NAA designator: code set binary, association logical unit, type NAA.
		b[n], b[n+1], b[n+3] = 0x01, 0x03, 16
		copy(b[n+4:], l.naa[:])
		n += 4 + 16
		// T10 vendor ID designator: code set ASCII, type T10 vendor ID: vendor + serial.
		d := b[n:]
		d[0], d[1] = 0x02, 0x01
		m := copy(d[4:], l.vendor[:])
		m += copy(d[4+m:], l.serial)
		d[3] = uint8(m)
		n += 4 + m
		n = l.appendPortDesignators(b, n, nx)
	case 0x86: // Extended INQUIRY data (spc4r37 7.8.8), as LIO's spc_emulate_evpd_86
		b[5] = 0x07 // HEADSUP, ORDSUP, SIMPSUP: the task attributes the task set implements
		b[6] = 0x01 // V_SUP: a volatile write cache (WCE) that SYNCHRONIZE CACHE flushes
		n = 64
	case 0xB0: // Block limits
		b[4] = 0x01 // WSNZ: WRITE SAME with NUMBER OF LOGICAL BLOCKS 0 is not supported
		b[5] = l.maxCAW
		granularity := uint16(1) << l.physExp
		binary.BigEndian.PutUint16(b[6:], granularity)
		binary.BigEndian.PutUint32(b[8:], l.maxXfer)
		binary.BigEndian.PutUint32(b[12:], l.maxXfer) // optimal transfer length
		binary.BigEndian.PutUint32(b[20:], l.maxUnmapLBAs)
		binary.BigEndian.PutUint32(b[24:], l.maxUnmapDesc)
		if l.canUnmap {
			binary.BigEndian.PutUint32(b[28:], uint32(granularity)) // optimal unmap granularity
		}
		binary.BigEndian.PutUint64(b[36:], l.maxWriteSame)
		n = 64
	case 0xB1: // Block device characteristics
		if !l.rotational {
			binary.BigEndian.PutUint16(b[4:], 1) // MEDIUM ROTATION RATE: non-rotating
		}
		n = 64
	case 0xB2: // Logical block provisioning
		if l.canUnmap {
			b[5] = 0x80 | 0x40 | 0x20 // LBPU, LBPWS, LBPWS10
			if l.lbprz {
				b[5] |= 0x04 // LBPRZ
			}
			b[6] = 0x02 // PROVISIONING TYPE: thin
		}
		n = 8
	}
	binary.BigEndian.PutUint16(b[2:], uint16(n-4))
	return b[:n]
}
