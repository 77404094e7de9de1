package scsi

import (
	"encoding/binary"
	"math"
)

// GET LBA STATUS (sbc4r15 5.8) and the logical block provisioning log page (sbc4r15 6.4.6),
// from the backend's backend.Allocation when it has one.

const (
	lbaStatusHeaderLen = 8
	lbaStatusDescLen   = 16

	provisionMapped      = 0x0 // PROVISIONING STATUS: mapped (or unknown)
	provisionDeallocated = 0x1 // deallocated

	// REPORT TYPE of GET LBA STATUS (CDB byte 14; sbc4r12 added it, sg_get_lba_status
	// --report-type sends it): which LBAs the descriptors cover.
	lbaReportAll           = 0x00
	lbaReportNonzero       = 0x01 // PROVISIONING STATUS other than mapped
	lbaReportMapped        = 0x02
	lbaReportDeallocated   = 0x03
	lbaReportAnchored      = 0x04 // none here: no LUN of this package anchors LBAs
	lbaReportUnrecoverable = 0x10 // LBAs that may return unrecovered errors: none known

	// maxAllocationQueries bounds the backend calls of one GET LBA STATUS: a fragmented file
	// answers with as many descriptors as that many calls find.
	maxAllocationQueries = 1024
)

// validLBAReportType reports whether rt is a REPORT TYPE GET LBA STATUS answers.
func validLBAReportType(rt uint8) bool {
	return rt <= lbaReportAnchored || rt == lbaReportUnrecoverable
}

// lbaReported reports whether a run with provisioning status status is reported under REPORT
// TYPE rt.
func lbaReported(rt, status uint8) bool {
	switch rt {
	case lbaReportAll:
		return true
	case lbaReportNonzero:
		return status != provisionMapped
	case lbaReportMapped:
		return status == provisionMapped
	case lbaReportDeallocated:
		return status == provisionDeallocated
	}
	return false
}

// getLBAStatus is GET LBA STATUS: descriptors of consecutive runs of mapped and deallocated
// blocks from the STARTING LOGICAL BLOCK ADDRESS on, as many as the allocation length holds
// (at least one with REPORT TYPE 0, all LBAs). A block only partly allocated in the backend is
// mapped. Without a backend.Allocation every block is mapped, one descriptor per 2^32-1
// blocks. Another REPORT TYPE reports only the runs of its status, from the first at or after
// the start, as far as maxAllocationQueries backend calls reach (none for anchored LBAs and
// LBAs that may return unrecovered errors: this package has neither).
func (x *exec) getLBAStatus() Status {
	l := x.l
	rt := x.cdb[14]
	maxDesc := 1
	if n := (int(min(x.info.Length, 1<<24)) - lbaStatusHeaderLen) / lbaStatusDescLen; n > 1 {
		maxDesc = n
	}
	w := x.dataInWriter()
	var hdr [lbaStatusHeaderLen]byte
	w.write(hdr[:])
	count := 0
	var cur struct {
		lba, n uint64
		status uint8
		valid  bool
	}
	emit := func() {
		if !lbaReported(rt, cur.status) {
			return
		}
		var d [lbaStatusDescLen]byte
		binary.BigEndian.PutUint64(d[0:], cur.lba)
		binary.BigEndian.PutUint32(d[8:], uint32(cur.n))
		d[12] = cur.status
		w.write(d[:])
		count++
	}
	lba, shift, blocks := x.info.LBA, l.blockShift, l.blocks.Load()
	if rt == lbaReportAnchored || rt == lbaReportUnrecoverable {
		lba = blocks // nothing to look for
	}
	for q := 0; lba < blocks && q < maxAllocationQueries; q++ {
		status, n := uint8(provisionMapped), blocks-lba
		if l.alloc != nil {
			off := int64(lba << shift)
			alloc, run, err := l.alloc.Allocated(off, int64(n<<shift))
			if err != nil {
				return x.check(readError(lba))
			}
			if alloc {
				n = (uint64(off+run)+uint64(l.blockSize)-1)>>shift - lba
			} else if n = uint64(run) >> shift; n == 0 {
				n = 1 // a hole smaller than a block: the block is (partly) mapped
			} else {
				status = provisionDeallocated
			}
		}
		if cur.valid && cur.status == status && cur.n < math.MaxUint32 {
			add := min(n, math.MaxUint32-cur.n)
			cur.n += add
			lba += add
			continue
		}
		if cur.valid {
			emit()
			if count == maxDesc {
				cur.valid = false
				break
			}
		}
		cur.lba, cur.n, cur.status, cur.valid = lba, min(n, math.MaxUint32), status, true
		lba += cur.n
	}
	if cur.valid {
		emit()
	}
	binary.BigEndian.PutUint32(hdr[:], uint32(4+lbaStatusDescLen*count))
	if rt != lbaReportAll {
		// RTP (byte 7 bit 0, sbc4r12, with REPORT TYPE): the REPORT TYPE was applied, which
		// tells this answer from that of a device server that ignores the field and reports
		// every LBA.
		hdr[7] = 0x01
	}
	w.patch(0, hdr[:])
	return x.written(&w)
}

// Log pages (spc4r37 7.3).
const (
	logPageSupported    = 0x00
	logPageProvisioning = 0x0C
	logSubpageAll       = 0xFF
)

// checkLogSenseCDB checks LOG SENSE's page, subpage and parameter pointer.
func checkLogSenseCDB(cdb []byte) Sense {
	page, sub, ptr := cdb[2]&0x3F, cdb[3], be16(cdb[5:])
	switch {
	case page == logPageSupported && (sub == 0 || sub == logSubpageAll):
		if ptr != 0 { // the supported pages pages have no parameters to start from
			return invalidCDB(5, 7)
		}
	case page == logPageProvisioning && sub == 0:
		if ptr > lbpParamUsed { // beyond the largest parameter code (spc4r37 6.8)
			return invalidCDB(5, 7)
		}
	case page == logPageSupported || page == logPageProvisioning:
		return invalidCDB(3, 7)
	default:
		return invalidCDB(2, 5)
	}
	return senseNone
}

// Logical block provisioning log parameters (sbc4r15 6.4.6).
const (
	lbpParamAvailable = 0x0001 // AVAILABLE LBA MAPPING RESOURCE COUNT
	lbpParamUsed      = 0x0002 // USED LBA MAPPING RESOURCE COUNT
)

// logSense is LOG SENSE (spc4r37 6.8): the supported log pages (0x00, and 0x00/0xFF with
// subpages) and the logical block provisioning page (0x0C). The page control is accepted and
// ignored: these parameters have no thresholds, so every PC reports the current counts.
func (x *exec) logSense() Status {
	cdb := x.cdb
	page, sub, ptr := cdb[2]&0x3F, cdb[3], be16(cdb[5:])
	var b [4 + 2*lbpParamLen]byte
	n := 4
	switch page {
	case logPageSupported:
		b[0] = logPageSupported
		if sub == logSubpageAll {
			b[0] |= 0x40 // SPF
			b[1] = logSubpageAll
			n += copy(b[n:], []byte{logPageSupported, 0, logPageSupported, logSubpageAll, logPageProvisioning, 0})
		} else {
			n += copy(b[n:], []byte{logPageSupported, logPageProvisioning})
		}
	case logPageProvisioning:
		b[0] = logPageProvisioning
		used, avail, ok := x.l.usageBlocks()
		if !ok {
			return x.check(readError(0))
		}
		if avail >= 0 && ptr <= lbpParamAvailable {
			n += putLBPParam(b[n:], lbpParamAvailable, uint64(avail))
		}
		n += putLBPParam(b[n:], lbpParamUsed, used)
	}
	binary.BigEndian.PutUint16(b[2:], uint16(n-4))
	return x.reply(b[:n])
}

const lbpParamLen = 12

// putLBPParam writes one logical block provisioning log parameter: the code, the control byte
// (FORMAT AND LINKING 11b, a binary format list), length 8, the RESOURCE COUNT in logical
// blocks (THRESHOLD EXPONENT is 0 in VPD page 0xB2, so a threshold set is one block) saturated
// at 2^32-1, and SCOPE 00b (not reported).
func putLBPParam(b []byte, code uint16, count uint64) int {
	binary.BigEndian.PutUint16(b[0:], code)
	b[2], b[3] = 0x03, 8
	binary.BigEndian.PutUint32(b[4:], uint32(min(count, math.MaxUint32)))
	return lbpParamLen
}

// usageBlocks is the backend's usage in logical blocks: used (everything without a
// backend.Allocation) and available (-1 unknown).
func (l *LUN) usageBlocks() (used uint64, avail int64, ok bool) {
	if l.alloc == nil {
		return l.blocks.Load(), -1, true
	}
	u, a, err := l.alloc.Usage()
	if err != nil {
		return 0, 0, false
	}
	used = min(uint64(max(u, 0))>>l.blockShift, l.blocks.Load())
	avail = -1
	if a >= 0 {
		avail = a >> l.blockShift
	}
	return used, avail, true
}

// reportSupportedTMFs is REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS (spc4r37 6.40): what a target
// built on this package does with LUN.Reset and the aborts of its tasks — ABORT TASK (ATS),
// ABORT TASK SET (ATSS), CLEAR TASK SET (CTSS), LOGICAL UNIT RESET (LURS) — as srpd's target
// does (target/cmd.go: CLEAR ACA and the QUERY functions answer "not supported"). With REPD the
// 16-byte extended form, with no timeouts reported.
func (x *exec) reportSupportedTMFs() Status {
	var b [16]byte
	b[0] = 0x80 | 0x40 | 0x10 | 0x08
	n := 4
	if x.info.flag {
		b[3] = 0x0C // ADDITIONAL DATA LENGTH
		n = 16
	}
	return x.reply(b[:n])
}
