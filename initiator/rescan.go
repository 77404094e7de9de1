package initiator

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/scsi"
)

// Discovery again after the target says its LUNs changed. Linux does the same from the unit
// attentions its SCSI midlayer sees (torvalds/linux:drivers/scsi/scsi_error.c
// scsi_report_sense: REPORTED LUNS DATA HAS CHANGED → SDEV_EVT_LUN_CHANGE_REPORTED, CAPACITY
// DATA HAS CHANGED → SDEV_EVT_CAPACITY_CHANGE_REPORTED, which udev turns into a rescan).
// Here the session rescans itself, in the background, without logging out: new LUNs appear in
// LUNs(), a LUN's Info (capacity, write protection) is refreshed in place, so the next NBD
// handshake of its export offers the new size.

// rescanTimeout bounds one background rescan.
const rescanTimeout = 30 * time.Second

// Rescan states (Session.rescanState).
const (
	rescanIdle    = iota
	rescanRunning // a rescan runs
	rescanAgain   // a rescan runs, and another was asked for meanwhile
)

// rescanUA tells whether a unit attention means the LUN inventory or a LUN's data changed.
func rescanUA(sn *scsi.Sense) bool {
	switch uint16(sn.ASC)<<8 | uint16(sn.ASCQ) {
	case 0x3F0E, // REPORTED LUNS DATA HAS CHANGED
		0x3F03, // INQUIRY DATA HAS CHANGED
		0x2A09, // CAPACITY DATA HAS CHANGED
		0x2A01: // MODE PARAMETERS CHANGED (write protection)
		return true
	}
	return false
}

// requestRescan starts a background rescan, or asks the running one to run once more (the
// change may have come after its REPORT LUNS). It never blocks: the I/O path calls it.
func (s *Session) requestRescan() {
	for {
		switch st := s.rescanState.Load(); st {
		case rescanIdle:
			if s.rescanState.CompareAndSwap(rescanIdle, rescanRunning) {
				s.rescanMu.Lock()
				defer s.rescanMu.Unlock()
				if s.rescanStop { // shutting down: Add must not race shutdown's Wait
					s.rescanState.Store(rescanIdle)
					return
				}
				s.rescanWG.Add(1)
				go s.rescanLoop()
				return
			}
		case rescanRunning:
			if s.rescanState.CompareAndSwap(rescanRunning, rescanAgain) {
				return
			}
		default:
			return
		}
	}
}

func (s *Session) rescanLoop() {
	defer s.rescanWG.Done()
	for {
		ctx, cancel := context.WithTimeout(s.ctx, rescanTimeout)
		before := len(s.LUNs())
		err := s.Rescan(ctx)
		cancel()
		s.stats.rescans.Add(1)
		if err != nil {
			if s.ctx.Err() == nil {
				s.log.Warn("rescan after a unit attention failed", zap.Error(err))
			}
		} else {
			s.log.Info("rescanned after a unit attention", zap.Int("luns_before", before), zap.Int("luns", len(s.LUNs())))
		}
		if s.ctx.Err() != nil {
			s.rescanState.Store(rescanIdle)
			return
		}
		if s.rescanState.CompareAndSwap(rescanRunning, rescanIdle) {
			return
		}
		s.rescanState.Store(rescanRunning) // rescanAgain: once more
	}
}
