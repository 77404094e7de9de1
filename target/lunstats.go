package target

import (
	"sync/atomic"
	"time"

	"github.com/srpd/srpd/scsi"
)

// Per-LUN I/O statistics: what the target answered for each logical unit (commands by
// operation, data moved, latency, errors by status and sense key). The channel accounts a
// command when it builds its SRP_RSP (respondCmd): a handful of atomic adds, no lock, no
// allocation. Readers (metrics, srpctl lun stats) take snapshots with Target.LUNStats.
//
// The counters live in the LUN's queue (lunQueue), which the target keeps per *scsi.LUN from
// the LUN's first command until DrainLUN forgets it (the LUN was removed): a LUN reopened with
// a new *scsi.LUN starts from zero, as a restarted daemon would.

// LUNOp is the operation class of a command, for the per-LUN counters and latency histograms.
type LUNOp uint8

// Operation classes.
const (
	LUNOpRead  LUNOp = iota // READ(6/10/12/16)
	LUNOpWrite              // WRITE(6/10/12/16), WRITE SAME(10/16), COMPARE AND WRITE
	LUNOpOther              // everything else (INQUIRY, TEST UNIT READY, SYNCHRONIZE CACHE, UNMAP, ...)
	NumLUNOps
)

var lunOpNames = [NumLUNOps]string{"read", "write", "other"}

func (o LUNOp) String() string {
	if o < NumLUNOps {
		return lunOpNames[o]
	}
	return "op?"
}

// lunOpOf classifies a CDB by its operation code.
func lunOpOf(cdb []byte) LUNOp {
	if len(cdb) == 0 {
		return LUNOpOther
	}
	switch cdb[0] {
	case scsi.OpRead6, scsi.OpRead10, scsi.OpRead12, scsi.OpRead16:
		return LUNOpRead
	case scsi.OpWrite6, scsi.OpWrite10, scsi.OpWrite12, scsi.OpWrite16,
		scsi.OpWriteSame10, scsi.OpWriteSame16, scsi.OpCompareAndWrite:
		return LUNOpWrite
	}
	return LUNOpOther
}

// LatencyBounds returns the upper bounds, in seconds, of the latency histogram buckets: 10 µs
// to 10 s (a last, unbounded bucket follows).
func LatencyBounds() []float64 {
	out := make([]float64, len(latencyBoundsNS))
	for i, ns := range latencyBoundsNS {
		out[i] = float64(ns) / 1e9
	}
	return out
}

// latencyBoundsNS are LatencyBounds in nanoseconds, for the accounting's integer compare.
var latencyBoundsNS = [...]int64{
	10e3, 25e3, 50e3, 100e3, 250e3, 500e3,
	1e6, 2.5e6, 5e6, 10e6, 25e6, 50e6, 100e6, 250e6, 500e6,
	1e9, 2.5e9, 5e9, 10e9,
}

// NumLatencyBuckets is the number of latency buckets: one per bound and the unbounded one.
const NumLatencyBuckets = len(latencyBoundsNS) + 1

// LatencyBucket returns the index of the latency bucket d falls in (a negative d, from a clock
// step, in the first).
func LatencyBucket(d time.Duration) int { return latencyBucket(int64(d)) }

// latencyBucket returns the index of the first bucket whose bound is at least ns.
func latencyBucket(ns int64) int {
	lo, hi := 0, len(latencyBoundsNS)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if latencyBoundsNS[m] < ns {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// Status classes of the errors that are not CHECK CONDITION.
const (
	StatusErrBusy                = iota // BUSY
	StatusErrReservationConflict        // RESERVATION CONFLICT
	StatusErrTaskSetFull                // TASK SET FULL
	StatusErrTaskAborted                // TASK ABORTED
	StatusErrOther                      // ACA ACTIVE and anything else that is not GOOD
	NumStatusErrs
)

var statusErrNames = [NumStatusErrs]string{"busy", "reservation_conflict", "task_set_full", "task_aborted", "other"}

// StatusErrName is the snake-case name of a status class (a metric label value).
func StatusErrName(i int) string { return statusErrNames[i] }

func statusErrOf(st scsi.Status) int {
	switch st {
	case scsi.StatusBusy:
		return StatusErrBusy
	case scsi.StatusReservationConflict:
		return StatusErrReservationConflict
	case scsi.StatusTaskSetFull:
		return StatusErrTaskSetFull
	case scsi.StatusTaskAborted:
		return StatusErrTaskAborted
	}
	return StatusErrOther
}

// ascPowerOnReset is the ASC of POWER ON, RESET, OR BUS DEVICE RESET OCCURRED (SPC-4 table
// F.1), the unit attention every new I_T nexus gets on its first command: an initiator
// expects it (Linux's scsi_error.c retries it silently), so it is not an error.
const ascPowerOnReset = 0x29

// LatencyHistogram is a snapshot of a latency histogram: per-bucket (not cumulative) counts, the
// bounds being LatencyBounds, and the sum of the latencies.
type LatencyHistogram struct {
	Buckets [NumLatencyBuckets]uint64
	SumNS   uint64
}

// Count is the number of observations.
func (h *LatencyHistogram) Count() uint64 {
	var n uint64
	for _, b := range h.Buckets {
		n += b
	}
	return n
}

// LUNStats is a snapshot of a LUN's counters, totals over every session and channel of the
// target that answered them.
type LUNStats struct {
	// Commands answered, by operation (LUNOp).
	Commands [NumLUNOps]uint64
	// ReadBytes and WriteBytes are the data-in bytes sent and the data-out bytes received.
	ReadBytes, WriteBytes uint64
	// Latency from the SRP_CMD's arrival to its SRP_RSP being posted, by operation.
	Latency [NumLUNOps]LatencyHistogram
	// SenseErrors counts CHECK CONDITION answers by sense key (scsi.SenseKey), the unit
	// attention for a new nexus (ResetUAs) excepted.
	SenseErrors [16]uint64
	// StatusErrors counts the answers with another status that is not GOOD (StatusErr*).
	StatusErrors [NumStatusErrs]uint64
	// ResetUAs counts the POWER ON/RESET unit attentions reported (each new nexus gets one).
	ResetUAs uint64
}

// Add adds o's counts to s (the counters of a LUN carried over a restart of its target).
func (s *LUNStats) Add(o LUNStats) {
	for op := range s.Commands {
		s.Commands[op] += o.Commands[op]
		for b := range s.Latency[op].Buckets {
			s.Latency[op].Buckets[b] += o.Latency[op].Buckets[b]
		}
		s.Latency[op].SumNS += o.Latency[op].SumNS
	}
	s.ReadBytes += o.ReadBytes
	s.WriteBytes += o.WriteBytes
	for i := range s.SenseErrors {
		s.SenseErrors[i] += o.SenseErrors[i]
	}
	for i := range s.StatusErrors {
		s.StatusErrors[i] += o.StatusErrors[i]
	}
	s.ResetUAs += o.ResetUAs
}

// Errors is the total of SenseErrors and StatusErrors.
func (s *LUNStats) Errors() uint64 {
	var n uint64
	for _, v := range s.SenseErrors {
		n += v
	}
	for _, v := range s.StatusErrors {
		n += v
	}
	return n
}

// lunCounters are the live counters behind LUNStats.
type lunCounters struct {
	commands              [NumLUNOps]atomic.Uint64
	readBytes, writeBytes atomic.Uint64
	latency               [NumLUNOps]struct {
		buckets [NumLatencyBuckets]atomic.Uint64
		sumNS   atomic.Uint64
	}
	senseErrors  [16]atomic.Uint64
	statusErrors [NumStatusErrs]atomic.Uint64
	resetUAs     atomic.Uint64
}

// record accounts one answered command. It runs on the channel's goroutine for every command:
// atomic adds only.
func (l *lunCounters) record(op LUNOp, lat time.Duration, in, out uint32, st scsi.Status, key scsi.SenseKey, asc uint8) {
	l.commands[op].Add(1)
	if in > 0 {
		l.readBytes.Add(uint64(in))
	}
	if out > 0 {
		l.writeBytes.Add(uint64(out))
	}
	ns := max(int64(lat), 0)
	h := &l.latency[op]
	h.buckets[latencyBucket(ns)].Add(1)
	h.sumNS.Add(uint64(ns))
	switch {
	case st == scsi.StatusGood || st == scsi.StatusConditionMet:
	case st == scsi.StatusCheckCondition && key == scsi.UnitAttention && asc == ascPowerOnReset:
		l.resetUAs.Add(1)
	case st == scsi.StatusCheckCondition:
		l.senseErrors[key&0xf].Add(1)
	default:
		l.statusErrors[statusErrOf(st)].Add(1)
	}
}

func (l *lunCounters) snapshot() LUNStats {
	var s LUNStats
	for op := range l.commands {
		s.Commands[op] = l.commands[op].Load()
		for b := range l.latency[op].buckets {
			s.Latency[op].Buckets[b] = l.latency[op].buckets[b].Load()
		}
		s.Latency[op].SumNS = l.latency[op].sumNS.Load()
	}
	s.ReadBytes, s.WriteBytes = l.readBytes.Load(), l.writeBytes.Load()
	for i := range l.senseErrors {
		s.SenseErrors[i] = l.senseErrors[i].Load()
	}
	for i := range l.statusErrors {
		s.StatusErrors[i] = l.statusErrors[i].Load()
	}
	s.ResetUAs = l.resetUAs.Load()
	return s
}

// LUNStats returns a snapshot of l's counters on this target (zero if no command reached l).
func (t *Target) LUNStats(l *scsi.LUN) LUNStats {
	if l == nil {
		return LUNStats{}
	}
	t.mu.Lock()
	q := t.queues[l]
	t.mu.Unlock()
	if q == nil {
		return LUNStats{}
	}
	return q.stats.snapshot()
}

// account records an answered command in its channel's counters and its LUN's (a command to
// a LUN number outside the view, or refused before its LUN was looked up, has none). in and
// out are the data-in and data-out bytes moved.
func (ch *channel) account(c *ioCtx, st scsi.Status, in, out uint32) {
	lat := max(time.Since(c.start), 0)
	sns := &c.res.Sense
	if c.hasPre {
		sns = &c.preSns
	}
	ch.stats.rspLatNS.Add(uint64(lat))
	ch.stats.responses.Add(1)
	if st == scsi.StatusCheckCondition && sns.Key == scsi.UnitAttention && sns.ASC == ascPowerOnReset {
		ch.stats.resetUAs.Add(1)
	}
	if c.lun == nil {
		return
	}
	q := c.lq // admitted commands
	if q == nil {
		q = ch.queueFor(c.lun) // refused before admission (write protected, too long)
	}
	q.stats.record(lunOpOf(c.cmd.CDB), lat, in, out, st, sns.Key, sns.ASC)
}
