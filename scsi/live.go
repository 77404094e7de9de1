package scsi

import (
	"errors"
	"fmt"
)

// Changes to a logical unit while initiators use it. Each tells the I_T nexuses that see the
// change with a unit attention, as Linux's LIO target does (torvalds/linux:
// drivers/target/target_core_device.c target_luns_data_has_changed for REPORTED LUNS DATA HAS
// CHANGED per node ACL, target_dev_ua_allocate for conditions of the whole device).

// ErrBackendReadOnly: the LUN cannot be made writable because its backend was opened
// read-only; it has to be opened again.
var ErrBackendReadOnly = errors.New("scsi: the backend is read-only")

// ErrCapacity: the backend's size cannot be the LUN's capacity (zero, or not a multiple of
// the block size).
var ErrCapacity = errors.New("scsi: invalid capacity")

// Resize makes the LUN's capacity its backend's size now: the caller has grown (or the
// storage behind it has changed) the backend first. When the number of blocks changes, every
// I_T nexus that has used the LUN gets CAPACITY DATA HAS CHANGED (2Ah/09h, SBC-4 4.6); those
// that have not will see POWER ON first, which supersedes it. Commands in flight finish
// against the capacity they were checked with. It returns the capacity in blocks.
func (l *LUN) Resize() (uint64, error) {
	size := l.be.Size()
	if size <= 0 || size%int64(l.blockSize) != 0 {
		return l.blocks.Load(), fmt.Errorf("scsi: backend size %d is not a positive multiple of the block size %d: %w",
			size, l.blockSize, ErrCapacity)
	}
	blocks := uint64(size) >> l.blockShift
	if l.blocks.Swap(blocks) != blocks {
		l.ua.establishAll(uaCapacityChanged, nil)
	}
	return blocks, nil
}

// SetReadOnly write-protects the LUN for every initiator, or lifts that protection (not below
// an ACL's own). A change gives every I_T nexus that has used the LUN MODE PARAMETERS CHANGED
// (2Ah/01h): the WP bit of the mode parameter header is a mode parameter, and Linux's sd
// re-reads it when revalidating. Making a LUN over a read-only backend writable fails with
// ErrBackendReadOnly. Thin provisioning (UNMAP, LBPME) stays as the LUN was created: UNMAP is
// a medium write and refused while the LUN is read-only.
func (l *LUN) SetReadOnly(ro bool) error {
	if !ro && l.be.Info().ReadOnly {
		return ErrBackendReadOnly
	}
	if l.readOnly.Swap(ro) != ro {
		l.ua.establishAll(uaModeChanged, nil)
	}
	return nil
}

// Bind tells the set that I_T nexus n sees the LUNs through it (a target calls it when a
// session of the view begins, Unbind when it ends; a nexus bound twice needs two Unbinds).
// Once a set has had a nexus bound, its changes (Add, Remove, ModeChanged) report their unit
// attentions to the bound nexuses only: a LUN shared by several sets is not changed for the
// nexuses of the others. A set never bound reports them to every nexus its LUNs know.
func (s *LUNSet) Bind(n Nexus) {
	s.mu.Lock()
	if s.bound == nil {
		s.bound = make(map[Nexus]int)
	}
	s.bound[n]++
	s.mu.Unlock()
}

// Unbind undoes one Bind of n.
func (s *LUNSet) Unbind(n Nexus) {
	s.mu.Lock()
	if c := s.bound[n]; c > 1 {
		s.bound[n] = c - 1
	} else {
		delete(s.bound, n)
	}
	s.mu.Unlock()
}

// establishLocked queues c on l for the nexuses the set's changes concern (s.mu held).
func (s *LUNSet) establishLocked(l *LUN, c uaCode) {
	if s.bound == nil {
		l.ua.establishAll(c, nil)
		return
	}
	l.ua.establishWhere(c, func(n *Nexus) bool { return s.bound[*n] > 0 })
}

// ModeChanged reports MODE PARAMETERS CHANGED on LUN number n to the set's nexuses: a target
// calls it when the write protection its view gives the LUN changes. False if n is not in the
// set.
func (s *LUNSet) ModeChanged(n uint16) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	l := s.luns[n]
	if l == nil {
		return false
	}
	s.establishLocked(l, uaModeChanged)
	return true
}
