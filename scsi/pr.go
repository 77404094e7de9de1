package scsi

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
)

// Persistent reservations (SPC-4 5.9, 6.15, 6.16), keyed by I_T nexus. Registrations and the
// reservation live in memory only: APTPL, SPEC_I_PT, ALL_TG_PT and REGISTER AND MOVE are not
// supported (REPORT CAPABILITIES says so). PREEMPT AND ABORT also aborts every task of the
// preempted nexuses (SPC-4 5.9.11.5) through the transport's task aborters
// (LUN.SetTaskAborter), on every gateway of a shared unit (prstore.go).
type prState struct {
	mu     sync.Mutex
	active atomic.Bool // a reservation exists (or may, stale): commands must be checked
	stale  atomic.Bool // PRStore: another gateway changed the stored state
	gen    uint32      // PRGENERATION
	regs   []prReg     // in registration order
	resv   bool
	holder Nexus // the reservation holder (not used for the all-registrants types)
	typ    uint8

	// Unit attentions a PR OUT owes to other nexuses (prUA): pending until the command's
	// change is committed, then established here and, with a PRStore, logged in the stored
	// state for the other gateways (prstore.go). log is the stored log as last read; uaSeen the
	// newest entry delivered here; loaded tells that the store was read once.
	pend   []prUA
	log    []prUA
	uaSeen uint64
	loaded bool
	// aborting: the PR OUT being applied is PREEMPT AND ABORT (its preempted nexuses' tasks
	// are aborted once it is committed). due: nexuses whose tasks are to be aborted, by the
	// holder of mu once it has let go of it (prUnlock).
	aborting bool
	due      []Nexus
}

// prUA is a unit attention owed to a nexus because of a persistent reservation change.
type prUA struct {
	seq   uint64 // its place in the stored log (PRStore); 0 while pending
	nexus Nexus
	code  uaCode
}

// prUA queues unit attention c for nexus n, owed by the PR OUT being applied (pr.mu held).
func (l *LUN) prUA(n *Nexus, c uaCode) {
	l.pr.pend = append(l.pr.pend, prUA{nexus: *n, code: c})
}

// prFlushUAs establishes the pending unit attentions here (the change is committed), and for
// PREEMPT AND ABORT makes the preempted nexuses' tasks due for abort.
func (l *LUN) prFlushUAs() {
	p := &l.pr
	for i := range p.pend {
		l.ua.establish(&p.pend[i].nexus, p.pend[i].code)
		if p.aborting && p.pend[i].code == uaRegistrationsPreem {
			p.due = append(p.due, p.pend[i].nexus)
		}
	}
	p.pend = p.pend[:0]
	p.aborting = false
}

// prUnlock releases pr.mu, then aborts the tasks of the nexuses that became due meanwhile
// (outside pr.mu: the transport's aborter takes its own locks), except self: the command
// that read the abort from the shared state arrived after the PREEMPT AND ABORT.
func (l *LUN) prUnlock(self *Command) {
	p := &l.pr
	due := p.due
	p.due = nil
	p.mu.Unlock()
	if len(due) > 0 {
		l.abortTasks(due, self)
	}
}

// TaskAborter aborts, as task management would (no status for them), every command in a
// LUN's task set whose I_T nexus match selects, except the command except (nil: none).
type TaskAborter func(match func(*Nexus) bool, except *Command)

// SetTaskAborter registers (f not nil) or removes (nil) the transport owner's way of aborting
// commands in this LUN's task set. The device server uses it for PERSISTENT RESERVE OUT
// PREEMPT AND ABORT. A target registers one per queue of the LUN.
func (l *LUN) SetTaskAborter(owner any, f TaskAborter) {
	l.abortMu.Lock()
	defer l.abortMu.Unlock()
	if f == nil {
		delete(l.aborters, owner)
		return
	}
	if l.aborters == nil {
		l.aborters = map[any]TaskAborter{}
	}
	l.aborters[owner] = f
}

// abortTasks aborts the tasks of the nexuses ns but except through every registered aborter.
func (l *LUN) abortTasks(ns []Nexus, except *Command) {
	l.abortMu.Lock()
	fs := make([]TaskAborter, 0, len(l.aborters))
	for _, f := range l.aborters {
		fs = append(fs, f)
	}
	l.abortMu.Unlock()
	match := func(n *Nexus) bool {
		for i := range ns {
			if ns[i] == *n {
				return true
			}
		}
		return false
	}
	for _, f := range fs {
		f(match, except)
	}
}

type prReg struct {
	nexus Nexus
	key   uint64
	rtp   uint16 // the relative target port it came through (0: unknown, reported as 1)
}

func (p *prState) find(n *Nexus) int {
	for i := range p.regs {
		if p.regs[i].nexus == *n {
			return i
		}
	}
	return -1
}

func prAllRegistrants(t uint8) bool {
	return t == prTypeWriteExclusiveAll || t == prTypeExclusiveAccessAll
}
func prRegistrantsOnly(t uint8) bool {
	return t == prTypeWriteExclusiveRegs || t == prTypeExclusiveAccessRegs
}
func prWriteExclusive(t uint8) bool {
	return t == prTypeWriteExclusive || t == prTypeWriteExclusiveRegs || t == prTypeWriteExclusiveAll
}

// isHolder: for the all-registrants types every registrant holds the reservation.
func (p *prState) isHolder(n *Nexus) bool {
	if !p.resv {
		return false
	}
	if prAllRegistrants(p.typ) {
		return p.find(n) >= 0
	}
	return p.holder == *n
}

func (p *prState) setReservation(holder *Nexus, typ uint8) {
	p.resv, p.holder, p.typ = true, *holder, typ
	p.active.Store(true)
}

func (p *prState) clearReservation() {
	p.resv, p.holder, p.typ = false, Nexus{}, 0
	p.active.Store(false)
}

// prAllows reports whether a command of class c from n may run under the current
// reservation (SPC-4 5.9.1 Table 59 and SBC-3 Table 13, for the I_T nexuses that do not hold
// it).
func (l *LUN) prAllows(cmd *Command, c *cmdInfo, cdb []byte) bool {
	n := &cmd.Nexus
	class := c.pr
	switch class {
	case prAllowed, prOut:
		return true
	case prStartStop:
		if cdb[4]>>4 == 0 && cdb[4]&0x01 != 0 {
			return true
		}
		class = prWrite
	}
	p := &l.pr
	p.mu.Lock()
	defer l.prUnlock(cmd)
	if l.prStore != nil {
		// Another gateway changed the state: read it (a store that cannot be read leaves the
		// last state in force; the next command tries again).
		_, _, _ = l.prSync(context.Background(), false)
	}
	if !p.resv || p.isHolder(n) {
		return true
	}
	registered := p.find(n) >= 0
	we := prWriteExclusive(p.typ)
	regsType := prRegistrantsOnly(p.typ) || prAllRegistrants(p.typ)
	switch class {
	case prInfo:
		return we || registered
	case prRead:
		return we || registered && regsType
	}
	return registered && regsType
}

func (x *exec) persistentReserveIn() Status {
	p := &x.l.pr
	p.mu.Lock()
	defer x.l.prUnlock(x.cmd)
	if _, _, err := x.l.prSync(context.Background(), true); err != nil {
		return x.check(senseInternalTargetFailure)
	}
	w := x.dataInWriter()
	var h [8]byte
	binary.BigEndian.PutUint32(h[0:], p.gen)
	switch x.info.ServiceAction {
	case PRInReadKeys:
		binary.BigEndian.PutUint32(h[4:], uint32(8*len(p.regs)))
		w.write(h[:])
		for i := range p.regs {
			var k [8]byte
			binary.BigEndian.PutUint64(k[:], p.regs[i].key)
			w.write(k[:])
		}
	case PRInReadReservation:
		if !p.resv {
			w.write(h[:])
			break
		}
		binary.BigEndian.PutUint32(h[4:], 16)
		w.write(h[:])
		var d [16]byte
		if !prAllRegistrants(p.typ) {
			if i := p.find(&p.holder); i >= 0 {
				binary.BigEndian.PutUint64(d[0:], p.regs[i].key)
			}
		}
		d[13] = p.typ // SCOPE 0 (LU_SCOPE) | TYPE
		w.write(d[:])
	case PRInReportCapabilites:
		var b [8]byte
		b[1] = 8
		b[3] = 0x80                             // TMV; ALLOW COMMANDS 0; PTPL_A 0. CRH, SIP_C, ATP_C, PTPL_C all 0.
		b[4] = 0x80 | 0x40 | 0x20 | 0x08 | 0x02 // WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX
		b[5] = 0x01                             // EX_AC_AR
		w.write(b[:])
	case PRInReadFullStatus:
		const descLen = 24 + 24 // descriptor header + SRP TransportID
		binary.BigEndian.PutUint32(h[4:], uint32(descLen*len(p.regs)))
		w.write(h[:])
		for i := range p.regs {
			r := &p.regs[i]
			var d [descLen]byte
			binary.BigEndian.PutUint64(d[0:], r.key)
			if p.isHolder(&r.nexus) {
				d[12] = 0x01 // R_HOLDER
				d[13] = p.typ
			}
			// RELATIVE TARGET PORT IDENTIFIER: the port the registration came through (the
			// ALUA configuration's; without one srpd's targets have one port, reported as 1).
			binary.BigEndian.PutUint16(d[18:], max(r.rtp, 1))
			binary.BigEndian.PutUint32(d[20:], 24)
			d[24] = 0x04 // TransportID: FORMAT CODE 00b, PROTOCOL IDENTIFIER SRP (4)
			copy(d[32:48], r.nexus.InitiatorPortID[:])
			w.write(d[:])
		}
	}
	return x.written(&w)
}

func (x *exec) persistentReserveOut() Status {
	l := x.l
	n := &x.cmd.Nexus
	sa := x.info.ServiceAction
	plen := int(x.info.Length)
	prm := x.cmd.DataOut
	if len(prm) > plen {
		prm = prm[:plen]
	}
	if plen != prOutParamListLen || len(prm) < prOutParamListLen {
		return x.check(senseParamListLength)
	}
	key, saKey := binary.BigEndian.Uint64(prm[0:]), binary.BigEndian.Uint64(prm[8:])
	switch {
	case prm[20]&0x08 != 0: // SPEC_I_PT
		return x.check(invalidParam(20, 3))
	case prm[20]&0x04 != 0: // ALL_TG_PT
		return x.check(invalidParam(20, 2))
	case prm[20]&0x01 != 0: // APTPL
		return x.check(invalidParam(20, 0))
	}
	typ := x.cdb[2] & 0x0F

	p := &l.pr
	p.mu.Lock()
	defer l.prUnlock(x.cmd)
	if l.prStore != nil {
		return x.prOutShared(context.Background(), func() Status { return x.prOutLocked(n, sa, key, saKey, typ) })
	}
	p.pend = p.pend[:0]
	p.aborting = false
	st := x.prOutLocked(n, sa, key, saKey, typ)
	l.prFlushUAs()
	return st
}

// prOutLocked applies a PERSISTENT RESERVE OUT to the LUN's PR state (pr.mu held).
func (x *exec) prOutLocked(n *Nexus, sa uint8, key, saKey uint64, typ uint8) Status {
	l, p := x.l, &x.l.pr
	idx := p.find(n)

	switch sa {
	case PROutRegister, PROutRegisterAndIgnore:
		if idx < 0 {
			if sa == PROutRegister && key != 0 {
				return StatusReservationConflict
			}
			if saKey != 0 {
				p.regs = append(p.regs, prReg{nexus: *n, key: saKey, rtp: l.relativePort(n)})
				p.gen++
			}
			return x.good()
		}
		if sa == PROutRegister && key != p.regs[idx].key {
			return StatusReservationConflict
		}
		if saKey == 0 {
			l.unregister(idx)
		} else {
			p.regs[idx].key = saKey
		}
		p.gen++
		return x.good()
	}

	// Every other service action needs a registration with a matching key.
	if idx < 0 || key != p.regs[idx].key {
		return StatusReservationConflict
	}
	switch sa {
	case PROutReserve:
		if !p.resv {
			p.setReservation(n, typ)
			return x.good()
		}
		if !p.isHolder(n) || p.typ != typ {
			return StatusReservationConflict
		}
		return x.good()
	case PROutRelease:
		if !p.resv || !p.isHolder(n) {
			return x.good()
		}
		if p.typ != typ {
			return x.check(senseInvalidRelease)
		}
		l.release(n)
		return x.good()
	case PROutClear:
		for i := range p.regs {
			if r := &p.regs[i]; r.nexus != *n {
				l.prUA(&r.nexus, uaReservationsPreemp)
			}
		}
		p.regs = p.regs[:0]
		p.clearReservation()
		p.gen++
		return x.good()
	case PROutPreempt, PROutPreemptAndAbort:
		p.aborting = sa == PROutPreemptAndAbort
		return x.preempt(idx, saKey, typ)
	}
	return x.check(invalidCDB(1, 4))
}

// release drops the reservation held by n; for the registrants-only and all-registrants types
// the other registrants learn of it (RESERVATIONS RELEASED). Called with pr.mu held.
func (l *LUN) release(n *Nexus) {
	p := &l.pr
	t := p.typ
	p.clearReservation()
	if prRegistrantsOnly(t) || prAllRegistrants(t) {
		for i := range p.regs {
			if r := &p.regs[i]; r.nexus != *n {
				l.prUA(&r.nexus, uaReservationsRel)
			}
		}
	}
}

// unregister removes registration idx. A holder that unregisters releases its reservation;
// an all-registrants reservation lasts until the last registrant goes. Called with pr.mu held.
func (l *LUN) unregister(idx int) {
	p := &l.pr
	n := p.regs[idx].nexus
	holder := p.resv && !prAllRegistrants(p.typ) && p.holder == n
	p.regs = append(p.regs[:idx], p.regs[idx+1:]...)
	switch {
	case holder:
		l.release(&n)
	case p.resv && prAllRegistrants(p.typ) && len(p.regs) == 0:
		p.clearReservation()
	}
}

// removeKey removes every registration with key k other than the one at keep, telling each
// removed nexus REGISTRATIONS PREEMPTED; it returns how many it removed and the new index of
// keep. Called with pr.mu held.
func (l *LUN) removeKey(k uint64, all bool, keep int) (int, int) {
	p := &l.pr
	removed, out := 0, 0
	newKeep := -1
	for i := range p.regs {
		r := p.regs[i]
		if i != keep && (all || r.key == k) {
			l.prUA(&r.nexus, uaRegistrationsPreem)
			removed++
			continue
		}
		if i == keep {
			newKeep = out
		}
		p.regs[out] = r
		out++
	}
	clear(p.regs[out:])
	p.regs = p.regs[:out]
	return removed, newKeep
}

// preempt is PREEMPT (SPC-4 5.9.11.4). Called with pr.mu held; idx is the issuer's
// registration.
func (x *exec) preempt(idx int, saKey uint64, typ uint8) Status {
	l := x.l
	p := &l.pr
	n := &x.cmd.Nexus
	switch {
	case !p.resv:
		if saKey == 0 {
			return x.check(invalidParam(8, 7))
		}
		if removed, _ := l.removeKey(saKey, false, idx); removed == 0 {
			return StatusReservationConflict
		}
	case prAllRegistrants(p.typ):
		if saKey == 0 {
			l.removeKey(0, true, idx)
			p.setReservation(n, typ)
		} else if removed, _ := l.removeKey(saKey, false, idx); removed == 0 {
			return StatusReservationConflict
		}
	default:
		holderKey := uint64(0)
		if h := p.find(&p.holder); h >= 0 {
			holderKey = p.regs[h].key
		}
		if saKey == holderKey {
			oldType := p.typ
			l.removeKey(saKey, false, idx)
			p.setReservation(n, typ)
			if oldType != typ {
				for i := range p.regs {
					if r := &p.regs[i]; r.nexus != *n {
						l.prUA(&r.nexus, uaReservationsRel)
					}
				}
			}
		} else {
			if saKey == 0 {
				return x.check(invalidParam(8, 7))
			}
			if removed, _ := l.removeKey(saKey, false, idx); removed == 0 {
				return StatusReservationConflict
			}
		}
	}
	p.gen++
	return x.good()
}
