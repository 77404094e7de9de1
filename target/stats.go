package target

import (
	"sync/atomic"

	"github.com/srpd/srpd/srp"
)

// ChannelStats is a snapshot of one channel.
type ChannelStats struct {
	ID    uint64
	QPN   uint32
	State string
	// QueueDepth is the credit granted at login; ReqLim the initiator's credits as the target
	// accounts them now; PendingCredits the credits owed (aborted commands) not yet returned.
	QueueDepth       int
	ReqLim           int64
	PendingCredits   int64
	MaxITIULen       int
	MaxTIIULen       int
	ImmDataOffset    int  // 0: immediate data not granted
	RemoteInvalidate bool // responses invalidate the command's registration (SEND_WITH_INV)

	IUs          uint64 // IUs received
	Commands     uint64 // SRP_CMDs received
	CmdErrors    uint64 // SRP_RSPs with a status other than GOOD
	BadCommands  uint64 // SRP_CMDs whose descriptors could not be parsed
	ImmCommands  uint64 // SRP_CMDs with immediate data
	RemoteInvs   uint64 // SRP_RSPs sent as SEND_WITH_INV (RemoteInvalidate)
	ExtTables    uint64 // external indirect tables fetched
	TaskMgmt     uint64 // SRP_TSK_MGMTs received
	TMFailed     uint64 // task management answered with a code other than FUNCTION COMPLETE
	TMAborted    uint64 // commands aborted by task management issued on this channel
	LUNResets    uint64
	Aborted      uint64 // requests of this channel ended without a response
	Overruns     uint64 // requests received beyond the initiator's credits
	Parked       uint64 // IUs that waited for a free request context
	Dropped      uint64 // parked IUs discarded at teardown
	SQWaits      uint64 // chains that waited for send-queue room
	BytesIn      uint64 // data-in bytes sent (RDMA WRITE)
	BytesOut     uint64 // data-out bytes received (RDMA READ and immediate data)
	CredReqs     uint64 // SRP_CRED_REQs sent
	TLogouts     uint64 // SRP_T_LOGOUTs sent
	ILogouts     uint64 // SRP_I_LOGOUTs received
	BadIUs       uint64 // IUs that caused a T_LOGOUT
	Errors       uint64 // transport errors
	CreditsGiven uint64 // credits returned after the login's
	// RWTransfers counts the RDMA transfers (external tables, data-out, data-in) that the
	// channel's frpool RW contexts completed; BigTransfers those that needed more work requests
	// than a request slot's own RW context holds (rwSmall) and borrowed a large one.
	RWTransfers  uint64
	BigTransfers uint64
	// LentReads counts the READs whose data-in was sent from the LUN's memory as it lies (a
	// RAM LUN on a device that takes process memory as a source: no copy into the request
	// slot; scsi.Command.DataInViews).
	LentReads uint64
	// KeepAlives counts keep-alive probes sent (Limits.KeepAliveInterval); Stalls the
	// commands found stalled on the transport (Limits.StallTimeout).
	KeepAlives uint64
	Stalls     uint64
	// Responses counts the SRP_RSPs built for SRP_CMDs and ResponseLatencyNS the time from
	// their commands' arrival to them (mean latency: its rate over Responses's). ResetUAs
	// counts the POWER ON/RESET unit attentions among CmdErrors: every new nexus gets one, and
	// ErrorCount leaves them out.
	Responses         uint64
	ResponseLatencyNS uint64
	ResetUAs          uint64
}

// ErrorCount is the channel's errors: commands answered with a status other than GOOD (the
// unit attention of a new nexus excepted), transport errors and IUs that ended the channel.
func (c *ChannelStats) ErrorCount() uint64 {
	return c.CmdErrors - min(c.ResetUAs, c.CmdErrors) + c.Errors + c.BadIUs
}

type chanCounters struct {
	ius, commands, cmdErrors, badCmds, immCmds, extTables, remoteInv atomic.Uint64
	taskMgmt, tmFailed, tmAborted, lunResets, aborted, overruns      atomic.Uint64
	parked, dropped, sqWaits, bytesIn, bytesOut, credReqs            atomic.Uint64
	bigRW, lentReads                                                 atomic.Uint64
	tlogouts, ilogouts, badIUs, errors                               atomic.Uint64
	reqLim, pending                                                  atomic.Int64
	returned                                                         atomic.Uint64
	keepAlives, stalls                                               atomic.Uint64
	responses, rspLatNS, resetUAs                                    atomic.Uint64 // lunstats.go
}

func (ch *channel) snapshot() ChannelStats {
	c := &ch.stats
	return ChannelStats{
		ID: ch.id, QPN: ch.qp.QPN(), State: ch.st().String(),
		QueueDepth: ch.depth, ReqLim: c.reqLim.Load(), PendingCredits: c.pending.Load(),
		MaxITIULen: ch.itLen, MaxTIIULen: ch.tiLen, ImmDataOffset: ch.immOff,
		RemoteInvalidate: ch.remInv,
		IUs:              c.ius.Load(), Commands: c.commands.Load(), CmdErrors: c.cmdErrors.Load(),
		BadCommands: c.badCmds.Load(), ImmCommands: c.immCmds.Load(), ExtTables: c.extTables.Load(),
		RemoteInvs: c.remoteInv.Load(),
		TaskMgmt:   c.taskMgmt.Load(), TMFailed: c.tmFailed.Load(), TMAborted: c.tmAborted.Load(),
		LUNResets: c.lunResets.Load(), Aborted: c.aborted.Load(), Overruns: c.overruns.Load(),
		Parked: c.parked.Load(), Dropped: c.dropped.Load(), SQWaits: c.sqWaits.Load(),
		BytesIn: c.bytesIn.Load(), BytesOut: c.bytesOut.Load(), CredReqs: c.credReqs.Load(),
		TLogouts: c.tlogouts.Load(), ILogouts: c.ilogouts.Load(), BadIUs: c.badIUs.Load(),
		Errors: c.errors.Load(), CreditsGiven: c.returned.Load(),
		RWTransfers: ch.pool.Stats().RWTransfers, BigTransfers: c.bigRW.Load(), LentReads: c.lentReads.Load(),
		KeepAlives: c.keepAlives.Load(), Stalls: c.stalls.Load(),
		Responses: c.responses.Load(), ResponseLatencyNS: c.rspLatNS.Load(), ResetUAs: c.resetUAs.Load(),
	}
}

// sessionTotals accumulates the counters of a session's closed channels.
type sessionTotals struct {
	channels                    int
	commands, bytesIn, bytesOut uint64
	taskMgmt, errors, aborted   uint64
	responses, latencyNS        uint64
}

func (s *sessionTotals) add(c ChannelStats) {
	s.channels++
	s.commands += c.Commands
	s.bytesIn += c.BytesIn
	s.bytesOut += c.BytesOut
	s.taskMgmt += c.TaskMgmt
	s.errors += c.ErrorCount()
	s.aborted += c.Aborted
	s.responses += c.Responses
	s.latencyNS += c.ResponseLatencyNS
}

// SessionStats is a snapshot of one I_T nexus.
type SessionStats struct {
	ID        uint64
	Initiator srp.PortID
	ACL       string
	Channels  []ChannelStats // live channels
	// Totals over live and closed channels.
	ClosedChannels int
	Commands       uint64
	BytesIn        uint64
	BytesOut       uint64
	TaskMgmt       uint64
	Errors         uint64
	Aborted        uint64
	// Responses and ResponseLatencyNS: see ChannelStats.
	Responses         uint64
	ResponseLatencyNS uint64
}

// TargetStats is a snapshot of the target.
type TargetStats struct {
	Name           string
	Sessions       int64
	Channels       int64 // live channels
	ClosedChannels uint64
	LoginsAccepted uint64
	LoginsRejected uint64
	// LoginsUnfinished counts accepted logins whose connection never completed (no RTU in
	// time, evicted by newer requests, or the CM failed): what forged requests cost.
	LoginsUnfinished uint64
	// KeepAliveTimeouts counts channels closed because their peer did not acknowledge the
	// keep-alive probe (gone without a DREQ); Stalls counts stalls found (see Limits.StallTimeout).
	KeepAliveTimeouts uint64
	Stalls            uint64
	// Rejects counts rejected logins by cause (indexed by RejectCause).
	Rejects          [numCauses]uint64
	TeardownTimeouts uint64 // channels whose drain hit Limits.TeardownTimeout
	// Resources held by channels: registered memory regions and their bytes.
	MRs         int64
	MemoryBytes int64
	// LUNWorkers is the number of LUN worker goroutines running.
	LUNWorkers int64
	// InlineExecs counts the commands executed inline on their channel's goroutine (fast
	// LUNs; see Limits.NoInline) instead of on a LUN worker.
	InlineExecs uint64
	// HandlerBatches counts completion batches that channels handled on the transport's
	// receive goroutine (transport.CompletionHandler; Limits.NoCompletionHandler) instead of
	// their own.
	HandlerBatches uint64
	// Totals over every session, live and closed.
	Commands uint64
	BytesIn  uint64
	BytesOut uint64
	Errors   uint64
}

const numCauses = NumRejectCauses

type targetCounters struct {
	sessions, channels, mrs, memBytes, workers atomic.Int64
	closedChannels                             atomic.Uint64
	loginsAccepted, loginsRejected             atomic.Uint64
	loginsUnfinished                           atomic.Uint64
	keepAliveTimeouts, stalls                  atomic.Uint64
	rejects                                    [numCauses]atomic.Uint64
	teardownTimeouts                           atomic.Uint64
	inline                                     atomic.Uint64
	handlerBatches                             atomic.Uint64
	commands, bytesIn, bytesOut, errors        atomic.Uint64 // of closed channels
}

// Stats returns a snapshot of the target's counters.
func (t *Target) Stats() TargetStats {
	s := TargetStats{
		Name:              t.name,
		Sessions:          t.stats.sessions.Load(),
		Channels:          t.stats.channels.Load(),
		ClosedChannels:    t.stats.closedChannels.Load(),
		LoginsAccepted:    t.stats.loginsAccepted.Load(),
		LoginsRejected:    t.stats.loginsRejected.Load(),
		LoginsUnfinished:  t.stats.loginsUnfinished.Load(),
		KeepAliveTimeouts: t.stats.keepAliveTimeouts.Load(),
		Stalls:            t.stats.stalls.Load(),
		TeardownTimeouts:  t.stats.teardownTimeouts.Load(),
		MRs:               t.stats.mrs.Load(),
		MemoryBytes:       t.stats.memBytes.Load(),
		LUNWorkers:        t.stats.workers.Load(),
		InlineExecs:       t.stats.inline.Load(),
		HandlerBatches:    t.stats.handlerBatches.Load(),
		Commands:          t.stats.commands.Load(),
		BytesIn:           t.stats.bytesIn.Load(),
		BytesOut:          t.stats.bytesOut.Load(),
		Errors:            t.stats.errors.Load(),
	}
	for i := range s.Rejects {
		s.Rejects[i] = t.stats.rejects[i].Load()
	}
	for _, ss := range t.Sessions() {
		for _, c := range ss.Channels {
			s.Commands += c.Commands
			s.BytesIn += c.BytesIn
			s.BytesOut += c.BytesOut
			s.Errors += c.ErrorCount()
		}
	}
	return s
}

// Sessions returns a snapshot of every live session.
func (t *Target) Sessions() []SessionStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]SessionStats, 0, len(t.sessions))
	for _, s := range t.sessions {
		var live []ChannelStats
		all := s.closed // the closed channels' counters, plus the live ones'
		for _, ch := range s.channels {
			c := ch.snapshot()
			live = append(live, c)
			all.add(c)
		}
		out = append(out, SessionStats{
			ID: s.id, Initiator: s.initiator, ACL: s.view.name, Channels: live,
			ClosedChannels: s.closed.channels,
			Commands:       all.commands, BytesIn: all.bytesIn, BytesOut: all.bytesOut,
			TaskMgmt: all.taskMgmt, Errors: all.errors, Aborted: all.aborted,
			Responses: all.responses, ResponseLatencyNS: all.latencyNS,
		})
	}
	return out
}
