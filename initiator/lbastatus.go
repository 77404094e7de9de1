package initiator

import (
	"context"
	"errors"
	"fmt"

	"github.com/srpd/srpd/scsi"
)

// Run is a stretch of a LUN's bytes with one provisioning status (GET LBA STATUS).
type Run struct {
	Off, Len int64
	// Deallocated: no storage behind it (sbc4 PROVISIONING STATUS deallocated or anchored);
	// Zero: it reads as zeroes (deallocated or anchored on a LUN with LBPRZ).
	Deallocated, Zero bool
	// Anchored: deallocated, but the storage is reserved (a write cannot fail for want of it).
	Anchored bool
}

// maxLBAStatusDescs bounds the descriptors one GET LBA STATUS asks for (the NBD server sends
// at most 32 extents a reply).
const maxLBAStatusDescs = 32

// Provisioning reports the provisioning of [off, off+n) as consecutive runs from off, with one
// GET LBA STATUS (sbc4r15 5.8): they may cover less than n (at least one block), never more.
// A LUN without logical block provisioning (READ CAPACITY(16) LBPME clear), or one that refused
// the command, is one mapped run over the whole range. off and n must be multiples of the
// block size.
func (l *LUN) Provisioning(ctx context.Context, off, n int64) ([]Run, error) {
	if err := l.check(off, n); err != nil {
		return nil, err
	}
	i := l.info.Load()
	if n == 0 {
		return nil, nil
	}
	if !i.Provisioning || l.noLBAStat.Load() {
		return []Run{{Off: off, Len: n}}, nil
	}
	var cdb [16]byte
	buf := make([]byte, 8+16*maxLBAStatusDescs)
	got, err := l.Command(ctx, scsi.AppendGetLBAStatus(cdb[:0], uint64(off)>>l.bsShift, uint32(len(buf))), buf, nil)
	if errors.Is(err, ErrIllegalRequest) || errors.Is(err, ErrNotSupported) {
		l.noLBAStat.Store(true) // remembered: a target without it says so every time
		return []Run{{Off: off, Len: n}}, nil
	}
	if err != nil {
		return nil, err
	}
	descs, err := scsi.ParseLBAStatus(nil, buf[:got])
	if err != nil {
		return nil, fmt.Errorf("initiator: LUN %d: %w", i.Number, err)
	}
	end := off + n
	runs := make([]Run, 0, len(descs)+1)
	pos := off
	for _, d := range descs {
		s := int64(d.LBA) << l.bsShift
		e := s + int64(d.Blocks)<<l.bsShift
		if e <= pos || d.Blocks == 0 {
			continue
		}
		if s > pos { // a gap the target left undescribed: say mapped, the safe answer
			runs = append(runs, Run{Off: pos, Len: min(s, end) - pos})
			if pos = min(s, end); pos >= end {
				break
			}
		}
		r := Run{Off: pos, Len: min(e, end) - pos}
		switch d.Status {
		case scsi.LBADeallocated:
			r.Deallocated, r.Zero = true, i.ZeroesAfterUnmap
		case scsi.LBAAnchored:
			r.Deallocated, r.Anchored, r.Zero = true, true, i.ZeroesAfterUnmap
		}
		runs = append(runs, r)
		if pos += r.Len; pos >= end {
			break
		}
	}
	if len(runs) == 0 {
		return nil, fmt.Errorf("initiator: LUN %d: GET LBA STATUS at LBA %d described none of it: %w",
			i.Number, uint64(off)>>l.bsShift, scsi.ErrLBAStatusData)
	}
	return runs, nil
}
