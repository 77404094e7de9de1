package scsi

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
)

var (
	nexA = Nexus{InitiatorPortID: [16]byte{0xA}, TargetPortID: [16]byte{0x1}}
	nexB = Nexus{InitiatorPortID: [16]byte{0xB}, TargetPortID: [16]byte{0x1}}
	nexC = Nexus{InitiatorPortID: [16]byte{0xC}, TargetPortID: [16]byte{0x1}}
)

const testBlocks = 2048

// testConfig is a LUN config with small limits that tests can reach.
func testConfig() LUNConfig {
	return LUNConfig{
		Serial:              "SRPDTEST0001",
		MaxTransferLength:   256,
		MaxUnmapLBACount:    1024,
		MaxUnmapDescriptors: 4,
		MaxWriteSameLength:  1024,
		MaxCompareAndWrite:  8,
	}
}

// newTestLUN returns a LUN over a fresh memBackend of testBlocks blocks, with the power-on
// unit attention already consumed for nexA and nexB.
func newTestLUN(t testing.TB, cfg LUNConfig) (*LUN, *memBackend) {
	t.Helper()
	bs := cfg.BlockSize
	if bs == 0 {
		bs = 512
	}
	m := newMemBackend(int64(bs) * testBlocks)
	l, err := NewLUN(cfg, m)
	if err != nil {
		t.Fatal(err)
	}
	clearUA(t, l, nexA)
	clearUA(t, l, nexB)
	return l, m
}

// clearUA consumes pending unit attentions of n until TEST UNIT READY is GOOD.
func clearUA(t testing.TB, l *LUN, n Nexus) {
	t.Helper()
	if err := clearUAErr(l, n); err != nil {
		t.Fatal(err)
	}
}

// clearUAErr is clearUA for callers that must not stop the test's goroutine (fuzzbound.Run).
func clearUAErr(l *LUN, n Nexus) error {
	for range uaQueueLen + 2 {
		r, _ := do(l, n, cdbTUR(), nil, 0)
		if r.Status == StatusGood {
			return nil
		}
		if r.Status != StatusCheckCondition || r.Sense.Key != UnitAttention {
			return fmt.Errorf("clearUA: %v %v", r.Status, r.Sense)
		}
	}
	return errors.New("clearUA: unit attention does not clear")
}

// do executes one SIMPLE command and returns the result and data-in.
func do(l *LUN, n Nexus, cdb, out []byte, inLen int) (Result, []byte) {
	cmd := &Command{CDB: cdb, Nexus: n, DataOut: out, Sense: make([]byte, MaxSenseLen)}
	if inLen > 0 {
		cmd.DataIn = make([]byte, inLen)
	}
	r := l.Execute(context.Background(), cmd)
	checkSenseBytes(r, cmd.Sense)
	return r, cmd.DataIn[:r.DataInLen]
}

// checkSenseBytes panics if the encoded sense disagrees with Result.Sense.
func checkSenseBytes(r Result, b []byte) {
	if r.Status != StatusCheckCondition {
		if r.SenseLen != 0 {
			panic("sense without CHECK CONDITION")
		}
		return
	}
	s, err := ParseSense(b[:r.SenseLen])
	if err != nil {
		panic(err)
	}
	if s.Key != r.Sense.Key || s.ASC != r.Sense.ASC || s.ASCQ != r.Sense.ASCQ || s.Field != r.Sense.Field {
		panic("encoded sense differs: " + s.String() + " vs " + r.Sense.String())
	}
}

func wantGood(t testing.TB, r Result) {
	t.Helper()
	if r.Status != StatusGood {
		t.Fatalf("status %v, sense %v; want GOOD", r.Status, r.Sense)
	}
}

func wantSense(t testing.TB, r Result, key SenseKey, asc, ascq uint8) {
	t.Helper()
	if r.Status != StatusCheckCondition || !r.Sense.Match(key, asc, ascq) {
		t.Fatalf("got %v %v; want CHECK CONDITION %v %02X/%02X", r.Status, r.Sense, key, asc, ascq)
	}
}

// wantField checks INVALID FIELD IN CDB (cdb) or IN PARAMETER LIST with the field pointer.
func wantField(t testing.TB, r Result, cdb bool, byteOff, bit int) {
	t.Helper()
	asc := uint8(0x26)
	if cdb {
		asc = 0x24
	}
	wantSense(t, r, IllegalRequest, asc, 0)
	f := r.Sense.Field
	want := FieldPointer{Valid: true, CDB: cdb, Byte: uint16(byteOff)}
	if bit >= 0 {
		want.BitValid, want.Bit = true, uint8(bit)
	}
	if f != want {
		t.Fatalf("field pointer %+v; want %+v", f, want)
	}
}

// CDB builders.

func cdbTUR() []byte { return []byte{OpTestUnitReady, 0, 0, 0, 0, 0} }

func cdbInquiry(evpd bool, page uint8, alloc uint16) []byte {
	c := []byte{OpInquiry, 0, page, 0, 0, 0}
	if evpd {
		c[1] = 1
	}
	binary.BigEndian.PutUint16(c[3:], alloc)
	return c
}

func cdbRequestSense(desc bool, alloc uint8) []byte {
	c := []byte{OpRequestSense, 0, 0, 0, alloc, 0}
	if desc {
		c[1] = 1
	}
	return c
}

func cdbRW6(op uint8, lba uint32, n uint8) []byte {
	return []byte{op, uint8(lba>>16) & 0x1F, uint8(lba >> 8), uint8(lba), n, 0}
}

// cdbRW is a READ or WRITE CDB of size 10, 12 or 16 bytes (SBC-4): the opcode, FUA, and the
// LBA and transfer length at that size's offsets.
func cdbRW(size int, op uint8, lba uint64, n uint32, fua bool) []byte {
	c := make([]byte, size)
	c[0] = op
	if fua {
		c[1] = 0x08
	}
	be := binary.BigEndian
	switch size {
	case 10:
		be.PutUint32(c[2:], uint32(lba))
		be.PutUint16(c[7:], uint16(n))
	case 12:
		be.PutUint32(c[2:], uint32(lba))
		be.PutUint32(c[6:], n)
	case 16:
		be.PutUint64(c[2:], lba)
		be.PutUint32(c[10:], n)
	}
	return c
}

func cdbRW10(op uint8, lba uint32, n uint16, fua bool) []byte {
	return cdbRW(10, op, uint64(lba), uint32(n), fua)
}
func cdbRW12(op uint8, lba uint32, n uint32, fua bool) []byte {
	return cdbRW(12, op, uint64(lba), n, fua)
}
func cdbRW16(op uint8, lba uint64, n uint32, fua bool) []byte { return cdbRW(16, op, lba, n, fua) }

func cdbRead16(lba uint64, n uint32) []byte  { return cdbRW16(OpRead16, lba, n, false) }
func cdbWrite16(lba uint64, n uint32) []byte { return cdbRW16(OpWrite16, lba, n, false) }

func cdbCAW(lba uint64, n uint8) []byte {
	c := make([]byte, 16)
	c[0] = OpCompareAndWrite
	binary.BigEndian.PutUint64(c[2:], lba)
	c[13] = n
	return c
}

func cdbVerify16(lba uint64, n uint32, bytchk uint8) []byte {
	c := cdbRW16(OpVerify16, lba, n, false)
	c[1] = bytchk << 1
	return c
}

func cdbWriteSame16(lba uint64, n uint32, unmap, ndob bool) []byte {
	c := cdbRW16(OpWriteSame16, lba, n, false)
	if unmap {
		c[1] |= 0x08
	}
	if ndob {
		c[1] |= 0x01
	}
	return c
}

func cdbSync16(lba uint64, n uint32) []byte { return cdbRW16(OpSynchronizeCache16, lba, n, false) }

func cdbUnmap(plen uint16) []byte {
	c := make([]byte, 10)
	c[0] = OpUnmap
	binary.BigEndian.PutUint16(c[7:], plen)
	return c
}

// unmapParams builds an UNMAP parameter list from (lba, count) pairs.
func unmapParams(ranges ...[2]uint64) []byte {
	p := make([]byte, 8+16*len(ranges))
	binary.BigEndian.PutUint16(p[0:], uint16(len(p)-2))
	binary.BigEndian.PutUint16(p[2:], uint16(16*len(ranges)))
	for i, r := range ranges {
		binary.BigEndian.PutUint64(p[8+16*i:], r[0])
		binary.BigEndian.PutUint32(p[8+16*i+8:], uint32(r[1]))
	}
	return p
}

func cdbReadCap10() []byte { return make10(OpReadCapacity10) }

func cdbReadCap16(alloc uint32) []byte {
	c := make([]byte, 16)
	c[0], c[1] = OpServiceActionIn16, SAReadCapacity16
	binary.BigEndian.PutUint32(c[10:], alloc)
	return c
}

func make10(op uint8) []byte { c := make([]byte, 10); c[0] = op; return c }

func cdbModeSense6(dbd bool, pc, page, sub, alloc uint8) []byte {
	c := []byte{OpModeSense6, 0, pc<<6 | page, sub, alloc, 0}
	if dbd {
		c[1] = 0x08
	}
	return c
}

func cdbModeSense10(dbd, llbaa bool, pc, page, sub uint8, alloc uint16) []byte {
	c := make([]byte, 10)
	c[0], c[2], c[3] = OpModeSense10, pc<<6|page, sub
	if dbd {
		c[1] |= 0x08
	}
	if llbaa {
		c[1] |= 0x10
	}
	binary.BigEndian.PutUint16(c[7:], alloc)
	return c
}

func cdbModeSelect6(plen uint8) []byte { return []byte{OpModeSelect6, 0x10, 0, 0, plen, 0} }

func cdbModeSelect10(plen uint16) []byte {
	c := make([]byte, 10)
	c[0], c[1] = OpModeSelect10, 0x10
	binary.BigEndian.PutUint16(c[7:], plen)
	return c
}

func cdbStartStop(start bool, noFlush bool) []byte {
	c := []byte{OpStartStopUnit, 0, 0, 0, 0, 0}
	if start {
		c[4] |= 0x01
	}
	if noFlush {
		c[4] |= 0x04
	}
	return c
}

func cdbReportLUNs(sel uint8, alloc uint32) []byte {
	c := make([]byte, 12)
	c[0], c[2] = OpReportLUNs, sel
	binary.BigEndian.PutUint32(c[6:], alloc)
	return c
}

func cdbRSOC(rctd bool, opts, op uint8, sa uint16, alloc uint32) []byte {
	c := make([]byte, 12)
	c[0], c[1], c[2], c[3] = OpMaintenanceIn, SAReportSupportedOpcds, opts, op
	if rctd {
		c[2] |= 0x80
	}
	binary.BigEndian.PutUint16(c[4:], sa)
	binary.BigEndian.PutUint32(c[6:], alloc)
	return c
}

func cdbPRIn(sa uint8, alloc uint16) []byte {
	c := make([]byte, 10)
	c[0], c[1] = OpPersistentResvIn, sa
	binary.BigEndian.PutUint16(c[7:], alloc)
	return c
}

func cdbPROut(sa, typ uint8) []byte {
	c := make([]byte, 10)
	c[0], c[1], c[2] = OpPersistentResvOut, sa, typ
	binary.BigEndian.PutUint32(c[5:], prOutParamListLen)
	return c
}

func prParams(key, saKey uint64) []byte {
	p := make([]byte, prOutParamListLen)
	binary.BigEndian.PutUint64(p[0:], key)
	binary.BigEndian.PutUint64(p[8:], saKey)
	return p
}

func fill(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
