package target

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/srpd/srpd/scsi"
)

// TestLUNStats: the per-LUN counters over a login, writes, reads, a command refused by the
// LUN, and a command to a LUN number outside the view: commands by operation, bytes, latency
// observations, errors by sense key, and the new nexus's unit attention counted apart (not an
// error, at the LUN, the channel and the target).
func TestLUNStats(t *testing.T) {
	e := newEnv(t, envOpts{nLUNs: 2})
	in := e.mustLogin(defaultLogin())
	in.clearUA(0) // TEST UNIT READY: the POWER ON/RESET unit attention (other)
	rng := rand.New(rand.NewPCG(1, 2))
	const writes, reads, blocks = 3, 2, 4
	for i := range writes {
		x := &xfer{lun: 0, write: true, lba: uint64(i * blocks), blocks: blocks, mode: modeDirect}
		in.issue(x, 1, rng)
		in.complete(x)
		in.resetHeap()
	}
	for i := range reads {
		x := &xfer{lun: 0, lba: uint64(i * blocks), blocks: blocks, mode: modeDirect}
		in.issue(x, 1, rng)
		in.complete(x)
		in.resetHeap()
	}
	// A READ past the end: ILLEGAL REQUEST, LOGICAL BLOCK ADDRESS OUT OF RANGE.
	r, _ := in.simple(0, rw16(false, testLUNSize/testBlock, 1), testBlock)
	wantCheck(t, r, scsi.IllegalRequest, 0x21, 0x00)
	// LUN 9 is not in the view: answered, but no LUN's.
	r, _ = in.simple(9, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, 0)
	wantCheck(t, r, scsi.IllegalRequest, 0x25, 0x00)

	s := e.tgt.LUNStats(e.luns[0])
	if got, want := s.Commands, [NumLUNOps]uint64{LUNOpRead: reads + 1, LUNOpWrite: writes, LUNOpOther: 1}; got != want {
		t.Errorf("commands by op %v, want %v", got, want)
	}
	if n := uint64(blocks * testBlock); s.WriteBytes != writes*n || s.ReadBytes != reads*n {
		t.Errorf("bytes: read %d, written %d; want %d and %d", s.ReadBytes, s.WriteBytes, reads*n, writes*n)
	}
	for op := range NumLUNOps {
		if c := s.Latency[op].Count(); c != s.Commands[op] || (c > 0 && s.Latency[op].SumNS == 0) {
			t.Errorf("%v latency: %d observations summing %d ns, for %d commands", op, c, s.Latency[op].SumNS, s.Commands[op])
		}
	}
	if s.ResetUAs != 1 || s.SenseErrors[scsi.IllegalRequest] != 1 || s.Errors() != 1 {
		t.Errorf("reset UAs %d, errors %v / %v (total %d); want 1 reset UA and 1 ILLEGAL REQUEST",
			s.ResetUAs, s.SenseErrors, s.StatusErrors, s.Errors())
	}
	if z := e.tgt.LUNStats(e.luns[1]); z != (LUNStats{}) {
		t.Errorf("LUN 1, never addressed: %+v", z)
	}
	if z := e.tgt.LUNStats(nil); z != (LUNStats{}) {
		t.Errorf("no LUN: %+v", z)
	}

	// The channel and target: 8 responses, the two ILLEGAL REQUESTs are errors, the unit
	// attention is not.
	cs := in.ch.Stats()
	if cs.Responses != writes+reads+3 || cs.ResponseLatencyNS == 0 || cs.ResetUAs != 1 || cs.CmdErrors != 3 || cs.ErrorCount() != 2 {
		t.Errorf("channel: %d responses (%d ns), %d reset UAs, %d non-GOOD, %d errors; want %d, >0, 1, 3, 2",
			cs.Responses, cs.ResponseLatencyNS, cs.ResetUAs, cs.CmdErrors, cs.ErrorCount(), writes+reads+3)
	}
	if ts := e.tgt.Stats(); ts.Errors != 2 {
		t.Errorf("target errors %d, want 2", ts.Errors)
	}
	ss := e.tgt.Sessions()
	if len(ss) != 1 || ss[0].Responses != cs.Responses || ss[0].ResponseLatencyNS != cs.ResponseLatencyNS || ss[0].Errors != 2 {
		t.Errorf("session stats %+v", ss)
	}
}

// TestLUNCountersRecord: the classification of answers into the counters.
func TestLUNCountersRecord(t *testing.T) {
	var l lunCounters
	l.record(LUNOpRead, 5*time.Microsecond, 4096, 0, scsi.StatusGood, 0, 0)
	l.record(LUNOpWrite, 300*time.Microsecond, 0, 512, scsi.StatusGood, 0, 0)
	l.record(LUNOpWrite, 20*time.Second, 0, 0, scsi.StatusCheckCondition, scsi.MediumError, 0x0c)
	l.record(LUNOpOther, time.Millisecond, 0, 0, scsi.StatusCheckCondition, scsi.UnitAttention, ascPowerOnReset)
	l.record(LUNOpOther, time.Millisecond, 0, 0, scsi.StatusCheckCondition, scsi.UnitAttention, 0x2a) // other UAs are errors
	l.record(LUNOpOther, -time.Second, 0, 0, scsi.StatusReservationConflict, 0, 0)                    // a clock step: 0
	l.record(LUNOpOther, 0, 0, 0, scsi.StatusBusy, 0, 0)
	l.record(LUNOpOther, 0, 0, 0, scsi.StatusACAActive, 0, 0)
	s := l.snapshot()
	var twice LUNStats
	twice.Add(s)
	twice.Add(s)
	if twice.Commands[LUNOpOther] != 10 || twice.Latency[LUNOpWrite].Buckets[5] != 2 || twice.ResetUAs != 2 || twice.Errors() != 10 || twice.WriteBytes != 1024 {
		t.Errorf("Add twice: %+v", twice)
	}
	if s.ReadBytes != 4096 || s.WriteBytes != 512 || s.Commands != [NumLUNOps]uint64{1, 2, 5} {
		t.Errorf("bytes %d/%d, commands %v", s.ReadBytes, s.WriteBytes, s.Commands)
	}
	if s.Latency[LUNOpRead].Buckets[0] != 1 || s.Latency[LUNOpWrite].Buckets[5] != 1 || s.Latency[LUNOpWrite].Buckets[NumLatencyBuckets-1] != 1 {
		t.Errorf("latency buckets: read %v, write %v", s.Latency[LUNOpRead].Buckets, s.Latency[LUNOpWrite].Buckets)
	}
	if got := s.Latency[LUNOpWrite].SumNS; got != uint64(20*time.Second+300*time.Microsecond) {
		t.Errorf("write latency sum %d", got)
	}
	if s.Latency[LUNOpOther].Buckets[0] != 3 { // 0 (twice) and the negative one
		t.Errorf("other latency buckets %v", s.Latency[LUNOpOther].Buckets)
	}
	if s.ResetUAs != 1 || s.SenseErrors[scsi.MediumError] != 1 || s.SenseErrors[scsi.UnitAttention] != 1 ||
		s.StatusErrors != [NumStatusErrs]uint64{StatusErrBusy: 1, StatusErrReservationConflict: 1, StatusErrOther: 1} || s.Errors() != 5 {
		t.Errorf("errors: reset UAs %d, sense %v, status %v, total %d", s.ResetUAs, s.SenseErrors, s.StatusErrors, s.Errors())
	}
}

// TestLatencyBucket: the bucket search agrees with the bounds.
func TestLatencyBucket(t *testing.T) {
	b := LatencyBounds()
	if len(b) != NumLatencyBuckets-1 || b[0] != 10e-6 || b[len(b)-1] != 10 {
		t.Fatalf("bounds %v", b)
	}
	for i, ns := range latencyBoundsNS {
		if got := latencyBucket(ns); got != i {
			t.Errorf("latencyBucket(%d) = %d, want %d (bounds are inclusive)", ns, got, i)
		}
		if got := latencyBucket(ns + 1); got != i+1 {
			t.Errorf("latencyBucket(%d) = %d, want %d", ns+1, got, i+1)
		}
	}
	if latencyBucket(0) != 0 || latencyBucket(1<<62) != NumLatencyBuckets-1 || LatencyBucket(-time.Second) != 0 || LatencyBucket(time.Millisecond) != 6 {
		t.Error("extremes")
	}
}
