package target

import (
	"github.com/srpd/srpd/frpool"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
)

// descSet is the resolved list of direct descriptors of one data buffer: the direct
// descriptor, the in-IU list of an indirect descriptor, or an external indirect table read from
// the initiator.
type descSet struct {
	direct   srp.DirectDesc
	isDirect bool
	list     srp.DescList
}

func (s *descSet) count() int {
	if s.isDirect {
		return 1
	}
	return s.list.Len()
}

func (s *descSet) at(i int) srp.DirectDesc {
	if s.isDirect {
		return s.direct
	}
	return s.list.At(i)
}

// length is the number of bytes the descriptors describe.
func (s *descSet) length() uint64 {
	if s.isDirect {
		return uint64(s.direct.Len)
	}
	return s.list.TotalLen()
}

// segments appends the remote side of a transfer of the first n bytes of the buffer that s
// describes to dst: one segment per non-empty descriptor, the last one trimmed. The local side
// is the request's data buffer from offset 0 (the segments map consecutive local bytes). The
// caller guarantees n <= s.length().
func (s *descSet) segments(dst []frpool.RemoteSeg, n uint32) []frpool.RemoteSeg {
	var off uint32
	for i := 0; i < s.count() && off < n; i++ {
		d := s.at(i)
		if d.Len == 0 {
			continue
		}
		k := min(d.Len, n-off)
		dst = append(dst, frpool.RemoteSeg{Addr: d.VA, RKey: d.Key, Len: k})
		off += k
	}
	return dst
}

// residuals is the outcome of one command's data transfer in SRP_RSP terms.
type residuals struct {
	xferOut, xferIn uint32 // bytes moved by RDMA READ (or taken from immediate data) / RDMA WRITE
	flags           srp.RspFlags
	doResid         uint32
	diResid         uint32
}

// computeResiduals compares, per direction, what the command transfers with what the
// initiator's descriptors describe (SAM-5 residuals, as LIO reports them for ib_srpt):
//
//   - data-out: the command wants want = the CDB's transfer length (cdbLen, DirOut only); the
//     descriptors hold dOut bytes; min(want, dOut) move. want > dOut is an overflow (DOOVER,
//     residual want − dOut: bytes the command wanted but the buffer did not have); dOut > want
//     an underflow (DOUNDER, residual dOut − want: bytes of the buffer never fetched).
//   - data-in: the command produced produced bytes (DirIn only; at most the CDB's length); the
//     descriptors have room for dIn; min(produced, dIn) move. produced > dIn is an overflow
//     (DIOVER, residual produced − dIn), dIn > produced an underflow (DIUNDER, residual
//     dIn − produced, e.g. a short INQUIRY, or a READ whose buffer is larger than its CDB).
//
// A descriptor for a direction the CDB does not use is all underflow; a CDB transfer with no
// descriptor all overflow. Counts saturate at 2^32−1.
func computeResiduals(dir scsi.Direction, cdbLen uint32, produced int, dOut, dIn uint64) residuals {
	var wantOut, got uint64
	if dir == scsi.DirOut {
		wantOut = uint64(cdbLen)
	}
	if dir == scsi.DirIn && produced > 0 {
		got = uint64(produced)
	}
	var r residuals
	var fOut, fIn srp.RspFlags
	r.xferOut, fOut, r.doResid = residual(wantOut, dOut, srp.DOOver, srp.DOUnder)
	r.xferIn, fIn, r.diResid = residual(got, dIn, srp.DIOver, srp.DIUnder)
	r.flags = fOut | fIn
	return r
}

// residual is one direction of computeResiduals: of want bytes that the command moves and have
// bytes that the descriptors describe, min(want, have) move; more wanted is an overflow (flag
// over, residual want − have), more described an underflow (flag under, residual have − want).
func residual(want, have uint64, over, under srp.RspFlags) (xfer uint32, flag srp.RspFlags, resid uint32) {
	switch {
	case want > have:
		flag, resid = over, sat32(want-have)
	case have > want:
		flag, resid = under, sat32(have-want)
	}
	return uint32(min(want, have)), flag, resid
}

func sat32(v uint64) uint32 {
	if v > 1<<32-1 {
		return 1<<32 - 1
	}
	return uint32(v)
}

// Sense data the target itself produces.
var (
	// senseInvalidIUField: ILLEGAL REQUEST, INVALID FIELD IN COMMAND INFORMATION UNIT (0E/03):
	// an SRP_CMD whose descriptors cannot be used.
	senseInvalidIUField = scsi.Sense{Key: scsi.IllegalRequest, ASC: 0x0E, ASCQ: 0x03}
	// senseOverlapped: ABORTED COMMAND, OVERLAPPED COMMANDS ATTEMPTED (4E/00): a tag already in
	// use on the channel.
	senseOverlapped = scsi.Sense{Key: scsi.AbortedCommand, ASC: 0x4E}
	// senseTooLong: ILLEGAL REQUEST, INVALID FIELD IN CDB (24/00) with the field pointer on the
	// transfer length: a transfer larger than the channel's data buffer.
	senseTooLong = scsi.Sense{Key: scsi.IllegalRequest, ASC: 0x24}
	// senseNoResources: ILLEGAL REQUEST, INSUFFICIENT RESOURCES (55/03): more descriptors than
	// Limits.MaxDescriptors.
	senseNoResources = scsi.Sense{Key: scsi.IllegalRequest, ASC: 0x55, ASCQ: 0x03}
)
