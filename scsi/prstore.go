package scsi

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
)

// Persistent reservations shared by several exporters (gateways) of one logical unit.
//
// SPC-4 keeps one set of registrations and one reservation per logical unit, whichever target
// port a nexus comes through; gateways that export one image through several target ports
// (ALUA) must therefore share them. A LUN given a PRStore (LUNConfig.PRStore) keeps its PR
// state there: every PERSISTENT RESERVE OUT reads the stored state, applies the command to it
// and writes it back with compare-and-swap on the store's version (retrying when another
// gateway wrote in between); every command that a reservation could refuse, and PERSISTENT
// RESERVE IN, first re-reads the state if the store said it changed (PRStore.Watch). The
// store's writer tells the other gateways before its PR OUT completes (the RBD store notifies
// and waits for their acknowledgements), so a RESERVE answered through one gateway is in force
// at the others. The unit attentions a PR change owes to other nexuses (RESERVATIONS
// PREEMPTED, RESERVATIONS RELEASED, REGISTRATIONS PREEMPTED) go into the stored state too, as
// a log of the newest prUALogMax entries numbered in sequence: a gateway that reads the state
// establishes the entries it has not seen for the nexuses it knows (those that logged in
// through it), so a PREEMPT through one gateway reaches a nexus of another. PREEMPT AND ABORT
// logs an abort entry (prAbortTasks) per preempted nexus too: every gateway aborts that
// nexus's tasks when it reads the entry.

// PRStore keeps a LUN's persistent reservation state for every gateway of the unit.
type PRStore interface {
	// Load returns the stored state and its version; an empty state (nil) with version 0 when
	// none was stored yet.
	Load(ctx context.Context) (data []byte, version uint64, err error)
	// CompareAndSwap stores data if the stored version is still version (0: nothing stored
	// yet), telling the other gateways; ErrPRStoreConflict if it is not.
	CompareAndSwap(ctx context.Context, version uint64, data []byte) error
	// Watch calls changed (from a goroutine of the store's) whenever another gateway stored a
	// new state.
	Watch(changed func())
}

// ErrPRStoreConflict: the stored state changed since it was read.
var ErrPRStoreConflict = errors.New("scsi: persistent reservation state changed meanwhile")

// ErrPRData: a stored persistent reservation state that cannot be decoded.
var ErrPRData = errors.New("scsi: malformed persistent reservation state")

// prStoreTries bounds the read-apply-swap rounds of one PR OUT.
const prStoreTries = 16

// The stored form (big endian): version (1), PRGENERATION (4), a reservation flag (1), its type
// (1), the holder's nexus (32: initiator then target port ID), the registration count (2), then
// per registration the nexus (32), its relative target port (2) and its key (8). Version 2
// adds the unit attention log: a count (2), then per entry its sequence number (8), the nexus
// (32) and the additional sense code and qualifier (2). Version 1 (no log) is read too.
const (
	prEncVersion1 = 1
	prEncVersion  = 2
	prEncHeader   = 1 + 4 + 1 + 1 + 32 + 2
	prEncReg      = 32 + 2 + 8
	prEncUA       = 8 + 32 + 2
	prMaxRegs     = 4096
	prUALogMax    = 64
)

func (p *prState) encode() []byte {
	b := make([]byte, prEncHeader, prEncHeader+prEncReg*len(p.regs)+2+prEncUA*len(p.log))
	b[0] = prEncVersion
	binary.BigEndian.PutUint32(b[1:], p.gen)
	if p.resv {
		b[5] = 1
	}
	b[6] = p.typ
	copy(b[7:23], p.holder.InitiatorPortID[:])
	copy(b[23:39], p.holder.TargetPortID[:])
	binary.BigEndian.PutUint16(b[39:], uint16(len(p.regs)))
	for _, r := range p.regs {
		var e [prEncReg]byte
		copy(e[0:16], r.nexus.InitiatorPortID[:])
		copy(e[16:32], r.nexus.TargetPortID[:])
		binary.BigEndian.PutUint16(e[32:], r.rtp)
		binary.BigEndian.PutUint64(e[34:], r.key)
		b = append(b, e[:]...)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(p.log)))
	for _, u := range p.log {
		var e [prEncUA]byte
		binary.BigEndian.PutUint64(e[0:], u.seq)
		copy(e[8:24], u.nexus.InitiatorPortID[:])
		copy(e[24:40], u.nexus.TargetPortID[:])
		binary.BigEndian.PutUint16(e[40:], uint16(u.code))
		b = append(b, e[:]...)
	}
	return b
}

// prAbortTasks marks a log entry that is no unit attention: PREEMPT AND ABORT preempted the
// entry's nexus, whose tasks every gateway aborts.
const prAbortTasks uaCode = 0xFF01

// prLoggedUA: the codes the log may carry.
func prLoggedUA(c uaCode) bool {
	return c == uaReservationsPreemp || c == uaReservationsRel || c == uaRegistrationsPreem || c == prAbortTasks
}

// decodePR reads a stored state into p (its registrations, reservation and unit attention
// log; mu held).
func (p *prState) decode(b []byte) error {
	if len(b) == 0 {
		p.gen, p.regs, p.log = 0, p.regs[:0], p.log[:0]
		p.clearReservation()
		return nil
	}
	if len(b) < prEncHeader || (b[0] != prEncVersion && b[0] != prEncVersion1) || b[5] > 1 {
		return fmt.Errorf("%w: %d bytes, version %d", ErrPRData, len(b), b[0])
	}
	n := int(binary.BigEndian.Uint16(b[39:]))
	end := prEncHeader + n*prEncReg
	switch {
	case n > prMaxRegs || len(b) < end:
		return fmt.Errorf("%w: %d registrations in %d bytes", ErrPRData, n, len(b))
	case b[0] == prEncVersion1 && len(b) != end:
		return fmt.Errorf("%w: %d registrations in %d bytes", ErrPRData, n, len(b))
	}
	if b[5] == 1 && !validPRType(b[6]) {
		return fmt.Errorf("%w: reservation type %d", ErrPRData, b[6])
	}
	if b[5] == 0 && (b[6] != 0 || !allZero(b[7:39])) {
		return fmt.Errorf("%w: a holder without a reservation", ErrPRData)
	}
	log := p.log[:0]
	if b[0] == prEncVersion {
		if len(b) < end+2 {
			return fmt.Errorf("%w: no unit attention log", ErrPRData)
		}
		k := int(binary.BigEndian.Uint16(b[end:]))
		if k > prUALogMax || len(b) != end+2+k*prEncUA {
			return fmt.Errorf("%w: %d unit attentions in %d bytes", ErrPRData, k, len(b)-end-2)
		}
		for i := range k {
			e := b[end+2+i*prEncUA:]
			var u prUA
			u.seq = binary.BigEndian.Uint64(e)
			copy(u.nexus.InitiatorPortID[:], e[8:24])
			copy(u.nexus.TargetPortID[:], e[24:40])
			u.code = uaCode(binary.BigEndian.Uint16(e[40:]))
			if !prLoggedUA(u.code) || (len(log) > 0 && u.seq <= log[len(log)-1].seq) || u.seq == 0 {
				return fmt.Errorf("%w: unit attention log entry %d", ErrPRData, i)
			}
			log = append(log, u)
		}
	}
	regs := p.regs[:0]
	for i := range n {
		e := b[prEncHeader+i*prEncReg:]
		var r prReg
		copy(r.nexus.InitiatorPortID[:], e[0:16])
		copy(r.nexus.TargetPortID[:], e[16:32])
		r.rtp = binary.BigEndian.Uint16(e[32:])
		r.key = binary.BigEndian.Uint64(e[34:])
		regs = append(regs, r)
	}
	p.regs, p.log = regs, log
	p.gen = binary.BigEndian.Uint32(b[1:])
	if b[5] == 1 {
		var h Nexus
		copy(h.InitiatorPortID[:], b[7:23])
		copy(h.TargetPortID[:], b[23:39])
		p.setReservation(&h, b[6])
	} else {
		p.clearReservation()
	}
	return nil
}

// uaLogSeq is the newest sequence number of the log (0: empty).
func (p *prState) uaLogSeq() uint64 {
	if len(p.log) == 0 {
		return 0
	}
	return p.log[len(p.log)-1].seq
}

// deliverLogged establishes the logged unit attentions not delivered yet, for the nexuses
// this LUN knows (a nexus of another gateway never comes here; one not seen yet gets the
// power-on condition, which supersedes them). The first read of the store only notes where
// the log stands: what it holds happened before this gateway was there (pr.mu held).
func (l *LUN) deliverLogged() {
	p := &l.pr
	if !p.loaded {
		p.loaded, p.uaSeen = true, p.uaLogSeq()
		return
	}
	for i := range p.log {
		u := &p.log[i]
		if u.seq <= p.uaSeen {
			continue
		}
		if u.code == prAbortTasks {
			p.due = append(p.due, u.nexus) // aborted once pr.mu is let go (prUnlock)
		} else {
			target := u.nexus
			l.ua.establishWhere(u.code, func(n *Nexus) bool { return *n == target })
		}
		p.uaSeen = u.seq
	}
}

// prSync re-reads the stored state when the store said it changed (pr.mu held). It returns
// the version read, or 0 when nothing was re-read.
func (l *LUN) prSync(ctx context.Context, force bool) (uint64, []byte, error) {
	p := &l.pr
	if l.prStore == nil || (!force && !p.stale.Load()) {
		return 0, nil, nil
	}
	p.stale.Store(false)
	data, ver, err := l.prStore.Load(ctx)
	if err == nil {
		err = p.decode(data)
	}
	if err != nil {
		p.stale.Store(true) // try again on the next command
		return 0, nil, err
	}
	l.deliverLogged()
	return ver, data, nil
}

// prRefresh reads the stored state again after another gateway changed it, delivering the
// unit attentions it logged (a store that cannot be read leaves the last state in force; the
// next command tries again).
func (l *LUN) prRefresh(self *Command) {
	l.pr.mu.Lock()
	_, _, _ = l.prSync(context.Background(), false)
	l.prUnlock(self)
}

// prOutShared runs a PR OUT (apply, with pr.mu held) against the shared store: read, apply,
// compare-and-swap, again when another gateway wrote meanwhile.
func (x *exec) prOutShared(ctx context.Context, apply func() Status) Status {
	l := x.l
	p := &l.pr
	for range prStoreTries {
		p.pend, p.aborting = p.pend[:0], false
		ver, old, err := l.prSync(ctx, true)
		if err != nil {
			return x.check(senseInternalTargetFailure)
		}
		st := apply()
		if st != StatusGood {
			p.pend, p.aborting = p.pend[:0], false // nothing was stored: nothing is owed
			return st
		}
		// The unit attentions this change owes go into the log with the change itself, and
		// for PREEMPT AND ABORT the preempted nexuses, whose tasks every gateway aborts.
		seq := p.uaLogSeq()
		for _, u := range p.pend {
			seq++
			u.seq = seq
			p.log = append(p.log, u)
			if p.aborting && u.code == uaRegistrationsPreem {
				seq++
				p.log = append(p.log, prUA{seq: seq, nexus: u.nexus, code: prAbortTasks})
			}
		}
		if k := len(p.log) - prUALogMax; k > 0 {
			p.log = append(p.log[:0], p.log[k:]...)
		}
		data := p.encode()
		if bytes.Equal(data, old) || (len(old) == 0 && len(p.regs) == 0 && !p.resv && p.gen == 0 && len(p.log) == 0) {
			return st
		}
		err = l.prStore.CompareAndSwap(ctx, ver, data)
		if err == nil {
			p.uaSeen = p.uaLogSeq() // delivered here now
			l.prFlushUAs()
			return st
		}
		if !errors.Is(err, ErrPRStoreConflict) {
			l.pr.stale.Store(true)
			return x.check(senseInternalTargetFailure)
		}
	}
	l.pr.stale.Store(true)
	return StatusBusy
}
