package initiator

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// rcap10 is READ CAPACITY(10) parameter data: the last LBA and the block size.
func rcap10(lba, bs uint32) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint32(b, lba)
	binary.BigEndian.PutUint32(b[4:], bs)
	return b
}

// rcap16 is the first n bytes of READ CAPACITY(16) parameter data: the last LBA, the block
// size, and bytes 13 and 14 (logical blocks per physical block exponent; LBPME, LBPRZ and the
// lowest aligned LBA).
func rcap16(lba uint64, bs uint32, b13, b14 byte, n int) []byte {
	b := make([]byte, 32)
	binary.BigEndian.PutUint64(b, lba)
	binary.BigEndian.PutUint32(b[8:], bs)
	b[13], b[14] = b13, b14
	return b[:n]
}

// TestReadCapacityRejects: capacities and block sizes a target may report that the block API
// cannot use are refused with ErrLUNData, never stored (a last LBA of 2^64-1 used to wrap the
// capacity to 0 blocks, 2^61 blocks of 4 KiB overflowed LUN.Size, and READ CAPACITY(10)'s
// 0xFFFFFFFF, which means "ask READ CAPACITY(16)", was taken as 2^32 blocks).
func TestReadCapacityRejects(t *testing.T) {
	rc16 := func(lba uint64, bs uint32, n int) []byte { return rcap16(lba, bs, 0x03, 0xC0, n) }
	rc10 := rcap10
	cases := []struct {
		name   string
		rc16   []byte // nil: READ CAPACITY(10) with rc10
		rc10   []byte
		ok     bool // READ CAPACITY(16) data long enough
		err    error
		blocks uint64
		bs     int
	}{
		{name: "rc16", rc16: rc16(99, 512, 32), ok: true, blocks: 100, bs: 512},
		{name: "rc16 without byte 14", rc16: rc16(99, 4096, 14), ok: true, blocks: 100, bs: 4096},
		{name: "rc16 too short", rc16: rc16(99, 512, 11)},
		{name: "rc16 last LBA 2^64-1", rc16: rc16(math.MaxUint64, 512, 32), ok: true, err: ErrLUNData},
		{name: "rc16 beyond 2^63 bytes", rc16: rc16(1<<61, 4096, 32), ok: true, err: ErrLUNData},
		{name: "rc16 at 2^63 bytes less one block", rc16: rc16(1<<51-2, 4096, 32), ok: true, blocks: 1<<51 - 1, bs: 4096},
		{name: "rc16 block size 0", rc16: rc16(99, 0, 32), ok: true, err: ErrLUNData},
		{name: "rc16 block size 520", rc16: rc16(99, 520, 32), ok: true, err: ErrLUNData},
		{name: "rc16 block size 128 KiB", rc16: rc16(99, 128<<10, 32), ok: true, err: ErrLUNData},
		{name: "rc10", rc10: rc10(99, 512), blocks: 100, bs: 512},
		{name: "rc10 needs rc16", rc10: rc10(math.MaxUint32, 512), err: ErrLUNData},
		{name: "rc10 block size 0", rc10: rc10(99, 0), err: ErrLUNData},
		{name: "rc10 short", rc10: rc10(99, 512)[:7], err: ErrLUNData},
	}
	for _, c := range cases {
		var info LUNInfo
		var err error
		if c.rc16 != nil {
			var ok bool
			ok, err = parseReadCap16(c.rc16, &info)
			if ok != c.ok {
				t.Errorf("%s: ok %v", c.name, ok)
			}
		} else {
			err = parseReadCap10(c.rc10, &info)
		}
		if !errors.Is(err, c.err) || c.err == nil && err != nil {
			t.Errorf("%s: error %v, want %v", c.name, err, c.err)
			continue
		}
		if err == nil && c.blocks != 0 && (info.Blocks != c.blocks || info.BlockSize != c.bs) {
			t.Errorf("%s: %d blocks of %d", c.name, info.Blocks, info.BlockSize)
		}
	}
}

// TestReportLUNsBounded: a target that announces a longer list with every answer gets
// maxReportLUNsTries commands (it used to get one per answer until the buffer reached
// 128 KiB, up to 16,000 commands for one discovery); a LUN listed twice is found once; a list
// length past the data takes only what was transferred.
func TestReportLUNsBounded(t *testing.T) {
	answer := func(listLen uint32, luns ...byte) []byte {
		b := make([]byte, 8+8*len(luns))
		binary.BigEndian.PutUint32(b, listLen)
		for i, n := range luns {
			b[8+8*i+1] = n
		}
		return b
	}
	cases := []struct {
		name    string
		answers [][]byte
		cmds    int
		luns    int
		err     error
	}{
		{name: "two LUNs", answers: [][]byte{answer(16, 0, 1)}, cmds: 1, luns: 2},
		{name: "growing", answers: func() (a [][]byte) {
			for i := range 100 {
				a = append(a, answer(uint32(520+8*i), 0))
			}
			return a
		}(), cmds: maxReportLUNsTries, luns: 1},
		{name: "duplicates", answers: [][]byte{answer(32, 1, 1, 2, 1)}, cmds: 1, luns: 2},
		{name: "list length beyond the data", answers: [][]byte{answer(0xffffffff, 0, 1), answer(0xffffffff, 0, 1, 2)}, cmds: 2, luns: 3},
		{name: "short", answers: [][]byte{{0, 0, 0}}, cmds: 1, err: ErrLUNData},
	}
	for _, c := range cases {
		cmds := 0
		luns, err := reportLUNs(func(cdb, in []byte) (int, error) {
			a := c.answers[min(cmds, len(c.answers)-1)]
			cmds++
			return copy(in, a), nil
		})
		if !errors.Is(err, c.err) || c.err == nil && err != nil {
			t.Errorf("%s: error %v, want %v", c.name, err, c.err)
		}
		if cmds != c.cmds || len(luns) != c.luns {
			t.Errorf("%s: %d commands, %d LUNs; want %d, %d", c.name, cmds, len(luns), c.cmds, c.luns)
		}
	}
}
