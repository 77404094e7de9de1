package scsi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"

	"github.com/srpd/srpd/scsi/backend"
)

// Medium access: READ, WRITE, VERIFY, COMPARE AND WRITE, WRITE SAME, UNMAP, SYNCHRONIZE CACHE,
// READ CAPACITY (SBC-3).
//
// Durability: a write's data reaches the backend before status. It is flushed (Backend.Flush,
// coalesced between concurrent callers) before GOOD status when the CDB has FUA set or the
// caching mode page has WCE=0; SYNCHRONIZE CACHE flushes everything written before it. A
// failed flush is MEDIUM ERROR, WRITE ERROR.
//
// Atomicity: every command that modifies the medium holds a range lock on its LBAs while it
// touches the backend; COMPARE AND WRITE holds it across its read, compare and write, so no
// other write to an overlapping range can come between them. Reads take no lock: as SAM
// allows, a READ concurrent with an overlapping WRITE may see either or a mix.

// ioError maps a backend error to sense data. lba is the first block not transferred.
func (l *LUN) ioError(err error, write bool, lba uint64) Sense {
	switch {
	case errors.Is(err, backend.ErrReadOnly):
		return senseWriteProtected
	case errors.Is(err, backend.ErrClosed):
		return senseNotReady
	case errors.Is(err, backend.ErrFenced):
		// Another gateway took the unit over: this port is in transition (SPC-4 5.15.2.6),
		// and the initiator retries, on another path if it has one.
		return senseALUATransitioning
	case errors.Is(err, backend.ErrOutOfRange):
		return senseLBAOutOfRange
	case write:
		return writeError(lba)
	}
	return readError(lba)
}

// flushSense is the sense of a failed flush: MEDIUM ERROR, or the transition of a fenced
// backend (see ioError).
func flushSense(err error) Sense {
	if errors.Is(err, backend.ErrFenced) {
		return senseALUATransitioning
	}
	return senseFlushFailed
}

// readAt fills p from byte offset off, mapping a failure to sense data.
func (l *LUN) readAt(p []byte, off int64) (Sense, bool) {
	n, err := l.be.ReadAt(p, off)
	if err != nil && !(n == len(p) && errors.Is(err, io.EOF)) {
		return l.ioError(err, false, uint64(off+int64(n))>>l.blockShift), false
	}
	return senseNone, true
}

func (x *exec) read() Status {
	l, i := x.l, &x.info
	if i.FUA && l.wce.Load() {
		// FUA on a read: the data must come from the medium, so write back the cache first.
		if err := l.flusher.flush(); err != nil {
			return x.check(flushSense(err))
		}
	}
	buf := x.din()
	if len(buf) == 0 {
		return x.good()
	}
	off := int64(i.LBA << l.blockShift)
	if v := x.cmd.DataInViews; cap(v) > 0 && l.viewer != nil {
		k, ok, err := l.viewer.ViewAt(v[:0], off, len(buf))
		if err != nil {
			return x.check(l.ioError(err, false, i.LBA))
		}
		if ok {
			x.views, x.dataIn = v[:k], len(buf)
			return x.good()
		}
	}
	if s, ok := l.readAt(buf, off); !ok {
		return x.check(s)
	}
	x.dataIn = len(buf)
	return x.good()
}

func (x *exec) write() Status {
	l, i := x.l, &x.info
	if i.Length == 0 {
		return x.good()
	}
	id := l.locks.lock(i.LBA, uint64(i.Blocks))
	n, err := l.be.WriteAt(x.cmd.DataOut[:i.Length], int64(i.LBA<<l.blockShift))
	l.locks.unlock(id)
	if err != nil {
		return x.check(l.ioError(err, true, i.LBA+uint64(n)>>l.blockShift))
	}
	return x.commit(i.FUA)
}

// commit makes a completed write durable when FUA or WCE=0 ask for it.
func (x *exec) commit(fua bool) Status {
	if fua || !x.l.wce.Load() {
		if err := x.l.flusher.flush(); err != nil {
			return x.check(flushSense(err))
		}
	}
	return x.good()
}

func (x *exec) synchronizeCache() Status {
	if err := x.l.flusher.flush(); err != nil {
		return x.check(flushSense(err))
	}
	return x.good()
}

// firstDiff is the offset of the first byte where a and b differ, or -1.
func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

const verifyChunk = 256 << 10

// verify is VERIFY(10/16): BYTCHK 0 reads the range back, 1 compares it with the data-out
// buffer, 3 compares every block with the one block of data-out. A miscompare reports the byte
// offset from the start of the range in INFORMATION.
func (x *exec) verify() Status {
	l, i := x.l, &x.info
	if i.Blocks == 0 {
		return x.good()
	}
	total := uint64(i.Blocks) << l.blockShift
	buf := make([]byte, min(total, verifyChunk))
	off := int64(i.LBA << l.blockShift)
	bs := l.blockSize
	for pos := uint64(0); pos < total; {
		m := min(uint64(len(buf)), total-pos)
		chunk := buf[:m]
		if s, ok := l.readAt(chunk, off+int64(pos)); !ok {
			return x.check(s)
		}
		switch i.bytchk {
		case 1:
			if k := firstDiff(chunk, x.cmd.DataOut[pos:pos+m]); k >= 0 {
				return x.check(miscompare(pos + uint64(k)))
			}
		case 3:
			pat := x.cmd.DataOut[:bs]
			for b := 0; b < len(chunk); b += bs {
				if k := firstDiff(chunk[b:b+bs], pat); k >= 0 {
					return x.check(miscompare(pos + uint64(b+k)))
				}
			}
		}
		pos += m
	}
	return x.good()
}

// compareAndWrite is COMPARE AND WRITE (SBC-3 5.2): the data-out buffer holds the verify data
// then the write data, Blocks blocks each. The range lock makes read, compare and write one
// atomic step against every other write to the range.
func (x *exec) compareAndWrite() Status {
	l, i := x.l, &x.info
	if i.Blocks == 0 {
		return x.good()
	}
	n := int(i.Blocks) << l.blockShift
	verify, data := x.cmd.DataOut[:n], x.cmd.DataOut[n:2*n]
	cur := make([]byte, n)
	off := int64(i.LBA << l.blockShift)
	id := l.locks.lock(i.LBA, uint64(i.Blocks))
	if s, ok := l.readAt(cur, off); !ok {
		l.locks.unlock(id)
		return x.check(s)
	}
	if k := firstDiff(cur, verify); k >= 0 {
		l.locks.unlock(id)
		return x.check(miscompare(uint64(k)))
	}
	w, err := l.be.WriteAt(data, off)
	l.locks.unlock(id)
	if err != nil {
		return x.check(l.ioError(err, true, i.LBA+uint64(w)>>l.blockShift))
	}
	return x.commit(i.FUA)
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

const writeSameChunk = 1 << 20

// writeSame is WRITE SAME(10/16). A zero block (or NDOB) becomes Backend.WriteZeroes, or
// Discard when the UNMAP bit asks for deallocation and discarded blocks read as zeroes; any
// other block is written out repeatedly.
func (x *exec) writeSame() Status {
	l, i := x.l, &x.info
	var pat []byte
	if !i.flag2 {
		pat = x.cmd.DataOut[:l.blockSize]
	}
	off, n := int64(i.LBA<<l.blockShift), int64(i.Blocks)<<l.blockShift
	id := l.locks.lock(i.LBA, uint64(i.Blocks))
	var err error
	var done int64
	switch {
	case pat == nil || allZero(pat):
		if i.flag && l.canUnmap && l.lbprz {
			err = l.be.Discard(off, n)
			if errors.Is(err, backend.ErrNotSupported) {
				err = l.be.WriteZeroes(off, n)
			}
		} else {
			err = l.be.WriteZeroes(off, n)
		}
	default:
		buf := make([]byte, min(n, writeSameChunk))
		for k := 0; k < len(buf); k += len(pat) {
			copy(buf[k:], pat)
		}
		for done < n && err == nil {
			var w int
			w, err = l.be.WriteAt(buf[:min(int64(len(buf)), n-done)], off+done)
			done += int64(w)
		}
	}
	l.locks.unlock(id)
	if err != nil {
		return x.check(l.ioError(err, true, i.LBA+uint64(done)>>l.blockShift))
	}
	return x.commit(false)
}

// paramList is the parameter list that the command carries in DataOut, cut to the length the
// CDB gives. ok is false for a length of zero: no list, which is not an error.
func (x *exec) paramList() (p []byte, ok bool) {
	plen := int(x.info.Length)
	if plen == 0 {
		return nil, false
	}
	p = x.cmd.DataOut
	if len(p) > plen {
		p = p[:plen]
	}
	return p, true
}

// unmap is UNMAP (SBC-3 5.28). The whole parameter list is validated before anything is
// discarded. A backend that turns out not to discard after all gets WriteZeroes when LBPRZ is
// reported (unmapped blocks must read as zeroes), and nothing otherwise (UNMAP is advisory).
func (x *exec) unmap() Status {
	l := x.l
	p, ok := x.paramList()
	if !ok {
		return x.good()
	}
	if len(p) < 8 {
		return x.check(senseParamListLength)
	}
	udl, bddl := int(binary.BigEndian.Uint16(p[0:])), int(binary.BigEndian.Uint16(p[2:]))
	if udl > len(p)-2 || bddl > len(p)-8 {
		return x.check(senseParamListLength)
	}
	nd := bddl / 16
	if uint32(nd) > l.maxUnmapDesc {
		return x.check(invalidParam(2, 7))
	}
	var total uint64
	for k := range nd {
		d := p[8+16*k:]
		lba, cnt := binary.BigEndian.Uint64(d), uint64(binary.BigEndian.Uint32(d[8:]))
		if s := l.checkRange(lba, cnt); s.Key != NoSense {
			return x.check(s)
		}
		if total += cnt; total > uint64(l.maxUnmapLBAs) {
			return x.check(invalidParam(8+16*k+8, 7))
		}
	}
	for k := range nd {
		d := p[8+16*k:]
		lba, cnt := binary.BigEndian.Uint64(d), uint64(binary.BigEndian.Uint32(d[8:]))
		if cnt == 0 {
			continue
		}
		off, n := int64(lba<<l.blockShift), int64(cnt<<l.blockShift)
		id := l.locks.lock(lba, cnt)
		err := l.be.Discard(off, n)
		if errors.Is(err, backend.ErrNotSupported) {
			err = nil
			if l.lbprz {
				err = l.be.WriteZeroes(off, n)
			}
		}
		l.locks.unlock(id)
		if err != nil {
			return x.check(l.ioError(err, true, lba))
		}
	}
	return x.commit(false)
}

func (x *exec) readCapacity10() Status {
	l := x.l
	var b [8]byte
	binary.BigEndian.PutUint32(b[0:], uint32(min(l.blocks.Load()-1, 0xFFFFFFFF)))
	binary.BigEndian.PutUint32(b[4:], uint32(l.blockSize))
	return x.reply(b[:])
}

func (x *exec) readCapacity16() Status {
	l := x.l
	var b [32]byte
	binary.BigEndian.PutUint64(b[0:], l.blocks.Load()-1)
	binary.BigEndian.PutUint32(b[8:], uint32(l.blockSize))
	b[13] = l.physExp & 0x0F
	if l.canUnmap {
		b[14] |= 0x80 // LBPME
		if l.lbprz {
			b[14] |= 0x40 // LBPRZ
		}
	}
	return x.reply(b[:])
}
