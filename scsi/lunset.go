package scsi

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
)

// LUNAddress is an 8-byte SAM LUN as it travels in SRP_CMD and REPORT LUNS data.
type LUNAddress [8]byte

// MaxLUN is the largest LUN number a LUNSet can hold (flat space addressing).
const MaxLUN = 0x3FFF

// LUNAddressOf encodes LUN number n (0..MaxLUN) as Linux does: peripheral device addressing
// (00 nn) below 256, flat space addressing (01b in the top bits) above.
func LUNAddressOf(n uint16) LUNAddress {
	var a LUNAddress
	if n < 256 {
		a[1] = uint8(n)
	} else {
		a[0], a[1] = 0x40|uint8(n>>8)&0x3F, uint8(n)
	}
	return a
}

// Number decodes a single-level LUN in peripheral (bus 0) or flat space addressing. ok is
// false for any other form.
func (a LUNAddress) Number() (n uint16, ok bool) {
	if binary.BigEndian.Uint64(a[:])&0x0000FFFFFFFFFFFF != 0 {
		return 0, false
	}
	switch a[0] >> 6 {
	case 0: // peripheral device addressing, bus identifier must be 0
		if a[0] != 0 {
			return 0, false
		}
		return uint16(a[1]), true
	case 1: // flat space addressing
		return uint16(a[0]&0x3F)<<8 | uint16(a[1]), true
	}
	return 0, false
}

func (a LUNAddress) String() string {
	if n, ok := a.Number(); ok {
		return fmt.Sprint(n)
	}
	return fmt.Sprintf("%x", a[:])
}

// LUNSet is the logical unit inventory one target presents: it maps LUN numbers to LUNs,
// answers REPORT LUNS, and answers for LUNs that do not exist as SPC requires (INQUIRY with
// peripheral qualifier 011b, REQUEST SENSE and every other command with LOGICAL UNIT NOT
// SUPPORTED). A LUN may be in several sets (e.g. one per ACL) under different numbers.
type LUNSet struct {
	mu    sync.RWMutex
	luns  map[uint16]*LUN
	order []uint16 // sorted
	// bound counts the I_T nexuses that see the LUNs through this set (Bind); nil until the
	// first Bind.
	bound map[Nexus]int
}

// NewLUNSet returns an empty set.
func NewLUNSet() *LUNSet { return &LUNSet{luns: make(map[uint16]*LUN)} }

// Add maps LUN number n to l. The LUNs already in the set report REPORTED LUNS DATA HAS
// CHANGED to the set's I_T nexuses (see Bind); the new LUN does not (LIO's skip_new): a nexus
// meets it with POWER ON first.
func (s *LUNSet) Add(n uint16, l *LUN) error {
	if n > MaxLUN {
		return fmt.Errorf("scsi: LUN %d: the largest is %d", n, MaxLUN)
	}
	if l == nil {
		return fmt.Errorf("scsi: LUN %d: nil", n)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.luns[n]; dup {
		return fmt.Errorf("scsi: LUN %d already exists", n)
	}
	s.changed()
	s.luns[n] = l
	i, _ := slices.BinarySearch(s.order, n)
	s.order = slices.Insert(s.order, i, n)
	l.set.Store(s)
	return nil
}

// Remove unmaps LUN number n and returns the LUN (nil if there was none); the remaining LUNs
// report REPORTED LUNS DATA HAS CHANGED to the set's nexuses, and LUN number n answers
// LOGICAL UNIT NOT SUPPORTED from now on (commands already admitted to it finish). The caller
// closes the LUN when it is done with it.
func (s *LUNSet) Remove(n uint16) *LUN {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.luns[n]
	if l == nil {
		return nil
	}
	delete(s.luns, n)
	if i, ok := slices.BinarySearch(s.order, n); ok {
		s.order = slices.Delete(s.order, i, i+1)
	}
	l.set.CompareAndSwap(s, nil)
	s.changed()
	return l
}

func (s *LUNSet) changed() {
	for _, l := range s.luns {
		s.establishLocked(l, uaReportedLUNsChange)
	}
}

// Get returns LUN number n, or nil.
func (s *LUNSet) Get(n uint16) *LUN {
	s.mu.RLock()
	l := s.luns[n]
	s.mu.RUnlock()
	return l
}

// Lookup returns the LUN an 8-byte LUN field addresses, or nil.
func (s *LUNSet) Lookup(a LUNAddress) *LUN {
	n, ok := a.Number()
	if !ok {
		return nil
	}
	return s.Get(n)
}

// Numbers lists the LUN numbers in ascending order.
func (s *LUNSet) Numbers() []uint16 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.order)
}

// ParseCDB is LUN.ParseCDB for the LUN that a addresses; for a LUN that does not exist it
// reports the transfer that Execute will make (INQUIRY, REQUEST SENSE and REPORT LUNS return
// data; anything else fails with LOGICAL UNIT NOT SUPPORTED).
func (s *LUNSet) ParseCDB(a LUNAddress, cdb []byte) (CDBInfo, error) {
	if l := s.Lookup(a); l != nil {
		return l.ParseCDB(cdb)
	}
	var x exec
	x.cdb = cdb
	if st := x.parseNoLUN(); st != StatusGood {
		return CDBInfo{}, x.sense
	}
	return x.info, nil
}

// Parse is ParseCDB for cmd (its LUN, CDB and WriteProtected), and keeps the result in cmd:
// Execute then runs the command without parsing its CDB again, unless cmd.LUN, cmd.CDB or
// cmd.WriteProtected changed since. A valid medium write with WriteProtected set fails here
// with DATA PROTECT, WRITE PROTECTED, which a target may answer at once, before any data moves
// or the command enters the task set (LIO's transport_lookup_cmd_lun).
func (s *LUNSet) Parse(cmd *Command) (CDBInfo, error) {
	l := s.Lookup(cmd.LUN)
	if l == nil || (len(cmd.CDB) > 0 && cmd.CDB[0] == OpReportLUNs) {
		// The set answers these itself (without a LUN's parse), from memory.
		cmd.pc = parsedCDB{}
		return s.ParseCDB(cmd.LUN, cmd.CDB)
	}
	cmd.pc.record(l, cmd)
	if cmd.pc.sense.Key != NoSense {
		return cmd.pc.info.failed(), cmd.pc.sense
	}
	return cmd.pc.info, nil
}

// Admit is LUN.Admit for the LUN that cmd.LUN addresses (a no-op when there is none, or for
// REPORT LUNS, which the set answers itself).
func (s *LUNSet) Admit(cmd *Command) {
	if len(cmd.CDB) > 0 && cmd.CDB[0] == OpReportLUNs {
		return
	}
	if l := s.Lookup(cmd.LUN); l != nil {
		l.Admit(cmd)
	}
}

// Withdraw takes an admitted command that will not be executed out of its LUN's task set.
func (s *LUNSet) Withdraw(cmd *Command) {
	if l := cmd.ts.lun; l != nil {
		l.Withdraw(cmd)
	}
}

// Execute runs cmd on the LUN that cmd.LUN addresses; REPORT LUNS and commands to LUNs that
// do not exist are answered by the set.
func (s *LUNSet) Execute(ctx context.Context, cmd *Command) Result {
	l := cmd.ts.lun // admitted earlier: stay with that LUN even if it was removed since
	if l == nil {
		l = s.Lookup(cmd.LUN)
	}
	if len(cmd.CDB) > 0 && cmd.CDB[0] == OpReportLUNs {
		if l != nil {
			l.Withdraw(cmd)
			l.ua.remove(&cmd.Nexus, uaReportedLUNsChange)
		}
		x := exec{cmd: cmd, cdb: cmd.CDB}
		if st := x.parseNoLUN(); st != StatusGood {
			if l != nil {
				x.l = l // sense format follows the LUN's D_SENSE
			}
			return x.result(st)
		}
		return x.result(x.reportLUNs(s))
	}
	if l != nil {
		return l.Execute(ctx, cmd)
	}
	x := exec{cmd: cmd, cdb: cmd.CDB}
	return x.result(x.executeNoLUN())
}

// NexusLost is LUN.NexusLost for every LUN in the set.
func (s *LUNSet) NexusLost(n Nexus) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, l := range s.luns {
		l.NexusLost(n)
	}
}

// parseNoLUN validates the commands a non-existent LUN answers (INQUIRY, REQUEST SENSE,
// REPORT LUNS); anything else is LOGICAL UNIT NOT SUPPORTED.
func (x *exec) parseNoLUN() Status {
	cdb := x.cdb
	if len(cdb) == 0 {
		return x.check(senseLUNNotSupported)
	}
	x.info.Opcode = cdb[0]
	switch cdb[0] {
	case OpInquiry, OpRequestSense, OpReportLUNs:
	default:
		return x.check(senseLUNNotSupported)
	}
	n := cdbLen(cdb[0])
	if len(cdb) < n {
		return x.check(Sense{Key: IllegalRequest, ASC: 0x24})
	}
	x.cdb = cdb[:n]
	x.info.cmd = lookupCmd(cdb[0], 0)
	if cdb[n-1]&0x04 != 0 {
		return x.check(invalidCDB(n-1, 2))
	}
	x.info.Dir = DirIn
	switch cdb[0] {
	case OpInquiry:
		if cdb[1]&0x02 != 0 {
			return x.check(invalidCDB(1, 1))
		}
		if cdb[1]&0x01 != 0 { // no VPD pages for a LUN that is not there
			return x.check(senseLUNNotSupported)
		}
		if cdb[2] != 0 {
			return x.check(invalidCDB(2, 7))
		}
		x.info.Length = be16(cdb[3:])
	case OpRequestSense:
		x.info.flag = cdb[1]&0x01 != 0
		x.info.Length = uint32(cdb[4])
	case OpReportLUNs:
		switch cdb[2] {
		case 0x00, 0x01, 0x02:
		default:
			return x.check(invalidCDB(2, 7))
		}
		x.info.Length = be32(cdb[6:])
		if x.info.Length < 16 {
			return x.check(invalidCDB(6, 7))
		}
	}
	return StatusGood
}

func (x *exec) executeNoLUN() Status {
	if st := x.parseNoLUN(); st != StatusGood {
		return st
	}
	switch x.cdb[0] {
	case OpInquiry:
		var b [stdInquiryLen]byte
		var sp [16]byte
		for i := range sp {
			sp[i] = ' '
		}
		fillStandardInquiry(b[:], 0x7F, sp[:8], sp[:], sp[:4])
		return x.reply(b[:])
	case OpRequestSense:
		var b [maxDescSenseLen]byte
		n := senseLUNNotSupported.Encode(b[:], x.info.flag)
		return x.reply(b[:n])
	}
	return x.check(senseLUNNotSupported)
}

// reportLUNs is REPORT LUNS (SPC-4 6.33) for set s, or for a LUN outside any set (it reports
// itself as LUN 0).
func (x *exec) reportLUNs(s *LUNSet) Status {
	if s == nil && x.l != nil {
		s = x.l.set.Load()
	}
	w := x.dataInWriter()
	var h [8]byte
	w.write(h[:])
	count := 0
	if x.cdb[2] != 0x01 { // 0x01: well known logical units only; we have none
		if s == nil {
			a := LUNAddressOf(0)
			w.write(a[:])
			count = 1
		} else {
			s.mu.RLock()
			for _, n := range s.order {
				a := LUNAddressOf(n)
				w.write(a[:])
			}
			count = len(s.order)
			s.mu.RUnlock()
		}
	}
	binary.BigEndian.PutUint32(h[:], uint32(8*count))
	w.patch(0, h[:4])
	return x.written(&w)
}
