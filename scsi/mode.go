package scsi

import (
	"encoding/binary"
	"math/bits"
)

// Mode pages (SPC-4 7.5, SBC-3 6.4). Only WCE (caching page) and D_SENSE (control page) are
// changeable; nothing can be saved.
const (
	modePageRWRecovery     = 0x01
	modePageCaching        = 0x08
	modePageControl        = 0x0A
	modePageInfoExceptions = 0x1C
	modePageAll            = 0x3F

	modePCCurrent    = 0
	modePCChangeable = 1
	modePCDefault    = 2

	maxModePageLen = 20
)

// modePage writes page `code` as the page control pc asks (current, changeable mask or
// default values) into b and returns its length, or 0 for a page we do not have.
func (l *LUN) modePage(code, pc uint8, b []byte) int {
	switch code {
	case modePageRWRecovery:
		// Read-write error recovery (sbc4r15 6.5.9): all zero and nothing changeable, as LIO's
		// spc_modesense_rwrecovery — no retries to tune, errors are reported as they happen.
		b = b[:12]
		clear(b)
		b[0], b[1] = modePageRWRecovery, 0x0A
		return 12
	case modePageCaching:
		b = b[:20]
		clear(b)
		b[0], b[1] = modePageCaching, 0x12
		switch pc {
		case modePCCurrent:
			if l.wce.Load() {
				b[2] |= 0x04
			}
		case modePCChangeable:
			b[2] = 0x04
		case modePCDefault:
			if l.defaultWCE {
				b[2] |= 0x04
			}
		}
		return 20
	case modePageControl:
		b = b[:12]
		clear(b)
		b[0], b[1] = modePageControl, 0x0A
		switch pc {
		case modePCChangeable:
			b[2] = 0x04 // D_SENSE
		default:
			if pc == modePCCurrent && l.dsense.Load() {
				b[2] |= 0x04
			}
			b[3] = 0x10 // QUEUE ALGORITHM MODIFIER: unrestricted reordering allowed
			b[8], b[9] = 0xFF, 0xFF
		}
		return 12
	case modePageInfoExceptions:
		b = b[:12]
		clear(b)
		b[0], b[1] = modePageInfoExceptions, 0x0A
		if pc != modePCChangeable {
			b[2] = 0x08 // DEXCPT: informational exceptions reporting disabled
		}
		return 12
	}
	return 0
}

func (x *exec) modeSense() Status {
	l, cdb := x.l, x.cdb
	ten := cdb[0] == OpModeSense10
	pc, page := cdb[2]>>6, cdb[2]&0x3F
	var b [8 + 16 + 4*maxModePageLen]byte
	hdr := 4
	if ten {
		hdr = 8
	}
	n := hdr
	if !x.info.flag2 { // DBD clear: one block descriptor
		if ten && x.info.flag { // LLBAA
			binary.BigEndian.PutUint64(b[n:], l.blocks.Load())
			binary.BigEndian.PutUint32(b[n+12:], uint32(l.blockSize))
			b[4] |= 0x01 // LONGLBA
			n += 16
		} else {
			binary.BigEndian.PutUint32(b[n:], uint32(min(l.blocks.Load(), 0xFFFFFFFF)))
			b[n+5], b[n+6], b[n+7] = 0, uint8(l.blockSize>>8), uint8(l.blockSize)
			n += 8
		}
	}
	bdl := n - hdr
	if page == modePageAll {
		for _, p := range [...]uint8{modePageRWRecovery, modePageCaching, modePageControl, modePageInfoExceptions} {
			n += l.modePage(p, pc, b[n:])
		}
	} else {
		n += l.modePage(page, pc, b[n:])
	}
	dsp := uint8(0x10) // DPOFUA
	if l.readOnly.Load() || x.cmd.WriteProtected {
		dsp |= 0x80 // WP
	}
	if ten {
		binary.BigEndian.PutUint16(b[0:], uint16(n-2))
		b[3] = dsp
		binary.BigEndian.PutUint16(b[6:], uint16(bdl))
	} else {
		b[0], b[2], b[3] = uint8(n-1), dsp, uint8(bdl)
	}
	return x.reply(b[:n])
}

// modeSelect is MODE SELECT(6/10): a header, at most one block descriptor (which must match
// the capacity and block size, as neither can change) and pages whose unchangeable bits must
// equal the current values. The whole list is checked before anything is applied. A change
// establishes MODE PARAMETERS CHANGED for the other I_T nexuses; turning the write cache off
// flushes it.
func (x *exec) modeSelect() Status {
	l := x.l
	ten := x.cdb[0] == OpModeSelect10
	p, ok := x.paramList()
	if !ok {
		return x.good()
	}
	hdr, bdlByte := 4, 3
	if ten {
		hdr, bdlByte = 8, 6
	}
	if len(p) < hdr {
		return x.check(senseParamListLength)
	}
	bdl, descLen := int(p[3]), 8
	if ten {
		bdl = int(binary.BigEndian.Uint16(p[6:]))
		if p[4]&0x01 != 0 {
			descLen = 16
		}
	}
	if bdl != 0 && bdl != descLen {
		return x.check(invalidParam(bdlByte, 7))
	}
	if hdr+bdl > len(p) {
		return x.check(senseParamListLength)
	}
	if bdl > 0 {
		d := p[hdr : hdr+bdl]
		var nb uint64
		var blen uint32
		blenAt := hdr + 5
		if descLen == 8 {
			nb = uint64(binary.BigEndian.Uint32(d))
			blen = uint32(d[5])<<16 | uint32(d[6])<<8 | uint32(d[7])
		} else {
			nb, blen, blenAt = binary.BigEndian.Uint64(d), binary.BigEndian.Uint32(d[12:]), hdr+12
		}
		if blen != uint32(l.blockSize) {
			return x.check(invalidParam(blenAt, 7))
		}
		want := l.blocks.Load()
		if descLen == 8 {
			want = min(want, 0xFFFFFFFF)
		}
		if nb != 0 && nb != want {
			return x.check(invalidParam(hdr, 7))
		}
	}

	l.modeMu.Lock()
	defer l.modeMu.Unlock()
	wce, dsense := l.wce.Load(), l.dsense.Load()
	for pos := hdr + bdl; pos < len(p); {
		if len(p)-pos < 2 {
			return x.check(senseParamListLength)
		}
		if p[pos]&0x40 != 0 { // SPF: we have no subpages
			return x.check(invalidParam(pos, 6))
		}
		code := p[pos] & 0x3F
		var cur, mask [maxModePageLen]byte
		n := l.modePage(code, modePCCurrent, cur[:])
		if n == 0 {
			return x.check(invalidParam(pos, 5))
		}
		l.modePage(code, modePCChangeable, mask[:])
		if int(p[pos+1]) != n-2 {
			return x.check(invalidParam(pos+1, 7))
		}
		if pos+n > len(p) {
			return x.check(senseParamListLength)
		}
		pg := p[pos : pos+n]
		for k := 2; k < n; k++ {
			if diff := (pg[k] ^ cur[k]) &^ mask[k]; diff != 0 {
				return x.check(invalidParam(pos+k, bits.Len8(diff)-1))
			}
		}
		switch code {
		case modePageCaching:
			wce = pg[2]&0x04 != 0
		case modePageControl:
			dsense = pg[2]&0x04 != 0
		}
		pos += n
	}
	changed := wce != l.wce.Load() || dsense != l.dsense.Load()
	if !changed {
		return x.good()
	}
	l.dsense.Store(dsense)
	if wce != l.wce.Load() {
		l.wce.Store(wce)
		if !wce {
			if err := l.flusher.flush(); err != nil {
				l.ua.establishAll(uaModeChanged, &x.cmd.Nexus)
				return x.check(flushSense(err))
			}
		}
	}
	l.ua.establishAll(uaModeChanged, &x.cmd.Nexus)
	return x.good()
}
