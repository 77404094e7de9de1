package softroce

import "sync/atomic"

// Stats is a snapshot of a device's counters (engine counters plus its link's).
type Stats struct {
	TxPackets, TxBytes uint64 // handed to the link
	RxPackets, RxBytes uint64 // received from the link (after the link's ICRC check)
	// Retransmits counts packets sent again by go-back-N retries; RetryEvents counts retries
	// started (NAK-seq, timeout, RNR), Timeouts local ACK timeouts.
	Retransmits, RetryEvents, Timeouts uint64
	RetryExceeded, RNRRetryExceeded    uint64
	// NAKsSent / NAKsRcvd are indexed by NAK code - 0x60 (0: PSN sequence, 1: invalid request,
	// 2: remote access, 3: remote operational; 4: anything else).
	NAKsSent, NAKsRcvd       [5]uint64
	RNRNAKsSent, RNRNAKsRcvd uint64
	AcksSent, AcksRcvd       uint64
	OutOfSequence            uint64 // requests with PSN beyond the expected one (dropped)
	Duplicates               uint64 // duplicate requests (re-ACKed or replayed)
	ReadReplays              uint64 // READ requests answered from a saved read resource
	CNPs                     uint64 // congestion notification packets received
	ICRCDrops                uint64 // from the link
	LinkDrops                uint64 // link malformed + queue drops
	Dropped                  uint64 // packets dropped by the engine (no QP, wrong state, bad header, ...)
	CQOverruns               uint64
	// LoopPackets/LoopBytes count packets the device sent to itself without the link
	// (loopback, loop.go; not in Tx/Rx); LoopDrops those dropped because its queue was full.
	LoopPackets, LoopBytes, LoopDrops uint64
	// LoopRefPackets/LoopRefBytes count the loopback packets (and their payload bytes) carried
	// by reference: their payload was copied once, from the source MR straight into the
	// destination (loopref.go). LoopRefDrops counts those dropped on receipt because their
	// source memory had been freed meanwhile (also in Dropped).
	LoopRefPackets, LoopRefBytes, LoopRefDrops uint64
	// HeldPackets counts the packets of posts inside BeginPosts/EndPosts brackets that were
	// held back and sent together (postbatch.go), HeldSends the link sends that took them.
	HeldPackets, HeldSends uint64
	// BusyPolls, BusyPollHits and BusyPollSkips are the link's receive busy polling
	// (link.Stats RxBusyPolls, RxBusyPollHits, RxBusyPollSkips).
	BusyPolls, BusyPollHits, BusyPollSkips uint64
	// ICRCWaived counts the packets accepted without an ICRC check: from srpd peers that
	// negotiated the waiver (Config.KeepICRC; link.Stats RxICRCWaived).
	ICRCWaived uint64
	// TxRefPackets/TxRefBytes count the packets sent to the link with their payload by
	// reference (and those payload bytes): read by the kernel straight from registered memory
	// instead of copied into a packet buffer first (srpd peers without ICRC, linkref.go).
	TxRefPackets, TxRefBytes uint64
	// Forwarded counts the packets a queue of a multi-queue device received for a QP or a
	// connection of another queue and handed to it (group.go).
	Forwarded uint64
}

type counters struct {
	txPackets, txBytes, rxPackets, rxBytes       atomic.Uint64
	retransmits, retryEvents, timeouts           atomic.Uint64
	retryExceeded, rnrRetryExceeded              atomic.Uint64
	naksSent, naksRcvd                           [5]atomic.Uint64
	rnrNaksSent, rnrNaksRcvd, acksSent, acksRcvd atomic.Uint64
	oos, dups, readReplays, cnps, dropped        atomic.Uint64
	cqOverruns                                   atomic.Uint64
	loopPackets, loopBytes, loopDrops            atomic.Uint64
	loopRefPackets, loopRefBytes, loopRefDrops   atomic.Uint64
	heldPackets, heldSends                       atomic.Uint64
	txRefPackets, txRefBytes                     atomic.Uint64
	forwarded                                    atomic.Uint64
}

func nakIndex(code uint8) int {
	if code >= 0x60 && code <= 0x63 {
		return int(code - 0x60)
	}
	return 4
}

func (c *counters) snapshot() Stats {
	s := Stats{
		TxPackets: c.txPackets.Load(), TxBytes: c.txBytes.Load(),
		RxPackets: c.rxPackets.Load(), RxBytes: c.rxBytes.Load(),
		Retransmits: c.retransmits.Load(), RetryEvents: c.retryEvents.Load(), Timeouts: c.timeouts.Load(),
		RetryExceeded: c.retryExceeded.Load(), RNRRetryExceeded: c.rnrRetryExceeded.Load(),
		RNRNAKsSent: c.rnrNaksSent.Load(), RNRNAKsRcvd: c.rnrNaksRcvd.Load(),
		AcksSent: c.acksSent.Load(), AcksRcvd: c.acksRcvd.Load(),
		OutOfSequence: c.oos.Load(), Duplicates: c.dups.Load(), ReadReplays: c.readReplays.Load(),
		CNPs: c.cnps.Load(), Dropped: c.dropped.Load(), CQOverruns: c.cqOverruns.Load(),
		LoopPackets: c.loopPackets.Load(), LoopBytes: c.loopBytes.Load(), LoopDrops: c.loopDrops.Load(),
		LoopRefPackets: c.loopRefPackets.Load(), LoopRefBytes: c.loopRefBytes.Load(),
		LoopRefDrops: c.loopRefDrops.Load(),
		HeldPackets:  c.heldPackets.Load(), HeldSends: c.heldSends.Load(),
		TxRefPackets: c.txRefPackets.Load(), TxRefBytes: c.txRefBytes.Load(),
		Forwarded: c.forwarded.Load(),
	}
	for i := range c.naksSent {
		s.NAKsSent[i] = c.naksSent[i].Load()
		s.NAKsRcvd[i] = c.naksRcvd[i].Load()
	}
	return s
}
