package scsi

import "encoding/binary"

// Operation codes this package implements (SPC-4, SBC-3). Service actions of the opcodes that
// have them are listed after.
const (
	OpTestUnitReady      = 0x00
	OpRequestSense       = 0x03
	OpRead6              = 0x08
	OpWrite6             = 0x0A
	OpInquiry            = 0x12
	OpModeSelect6        = 0x15
	OpModeSense6         = 0x1A
	OpStartStopUnit      = 0x1B
	OpReadCapacity10     = 0x25
	OpRead10             = 0x28
	OpWrite10            = 0x2A
	OpVerify10           = 0x2F
	OpSynchronizeCache10 = 0x35
	OpWriteSame10        = 0x41
	OpUnmap              = 0x42
	OpLogSense           = 0x4D
	OpModeSelect10       = 0x55
	OpModeSense10        = 0x5A
	OpPersistentResvIn   = 0x5E
	OpPersistentResvOut  = 0x5F
	OpRead16             = 0x88
	OpCompareAndWrite    = 0x89
	OpWrite16            = 0x8A
	OpVerify16           = 0x8F
	OpSynchronizeCache16 = 0x91
	OpWriteSame16        = 0x93
	OpServiceActionIn16  = 0x9E
	OpReportLUNs         = 0xA0
	OpMaintenanceIn      = 0xA3
	OpRead12             = 0xA8
	OpWrite12            = 0xAA
)

// Service actions.
const (
	SAReadCapacity16       = 0x10 // SERVICE ACTION IN(16)
	SAGetLBAStatus         = 0x12 // SERVICE ACTION IN(16)
	SAReportTargetPortGrps = 0x0A // MAINTENANCE IN
	SAReportSupportedOpcds = 0x0C // MAINTENANCE IN
	SAReportSupportedTMFs  = 0x0D // MAINTENANCE IN

	// PERSISTENT RESERVE IN
	PRInReadKeys          = 0x00
	PRInReadReservation   = 0x01
	PRInReportCapabilites = 0x02
	PRInReadFullStatus    = 0x03

	// PERSISTENT RESERVE OUT
	PROutRegister             = 0x00
	PROutReserve              = 0x01
	PROutRelease              = 0x02
	PROutClear                = 0x03
	PROutPreempt              = 0x04
	PROutPreemptAndAbort      = 0x05
	PROutRegisterAndIgnore    = 0x06
	PROutRegisterAndMove      = 0x07
	prOutParamListLen         = 24
	prTypeWriteExclusive      = 0x1
	prTypeExclusiveAccess     = 0x3
	prTypeWriteExclusiveRegs  = 0x5
	prTypeExclusiveAccessRegs = 0x6
	prTypeWriteExclusiveAll   = 0x7
	prTypeExclusiveAccessAll  = 0x8
)

// Direction is the data transfer direction of a command, seen from the initiator.
type Direction uint8

const (
	DirNone Direction = iota // no data transfer
	DirIn                    // data-in: device to initiator (READ, INQUIRY, ...)
	DirOut                   // data-out: initiator to device (WRITE, MODE SELECT, ...)
)

func (d Direction) String() string {
	switch d {
	case DirIn:
		return "in"
	case DirOut:
		return "out"
	}
	return "none"
}

// CDBInfo is what a CDB asks for, as far as the transport needs to know before executing it.
type CDBInfo struct {
	Opcode        uint8
	ServiceAction uint8 // for PERSISTENT RESERVE IN/OUT, SERVICE ACTION IN(16), MAINTENANCE IN
	// Dir and Length give the data transfer the CDB specifies. For DirOut, Length is exactly
	// the number of bytes Execute needs in Command.DataOut. For DirIn, Length is the most the
	// command may return (the transfer length of a READ, the allocation length of INQUIRY and
	// the like); Result.DataInLen tells how many bytes it actually produced.
	Dir    Direction
	Length uint32
	// LBA and Blocks address the medium for READ, WRITE, VERIFY, COMPARE AND WRITE, WRITE SAME
	// and SYNCHRONIZE CACHE (Blocks 0 for SYNCHRONIZE CACHE means "to the last LBA").
	LBA    uint64
	Blocks uint32
	FUA    bool

	cmd    *cmdInfo
	bytchk uint8 // VERIFY
	flag   bool  // IMMED, UNMAP (WRITE SAME), DESC (REQUEST SENSE), EVPD (INQUIRY), ...
	flag2  bool  // NDOB (WRITE SAME), DBD (MODE SENSE), ...
}

// Name is the command's name, e.g. "READ(16)", or "" for an unsupported opcode.
func (i *CDBInfo) Name() string {
	if i.cmd == nil {
		return ""
	}
	return i.cmd.name
}

// cdbLen is the CDB length of an opcode's group (SAM-5 5.2): 0 for groups we never support.
func cdbLen(op uint8) int {
	switch op >> 5 {
	case 0:
		return 6
	case 1, 2:
		return 10
	case 4:
		return 16
	case 5:
		return 12
	}
	return 0
}

func be16(b []byte) uint32 { return uint32(binary.BigEndian.Uint16(b)) }
func be32(b []byte) uint32 { return binary.BigEndian.Uint32(b) }
func be64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

// ParseCDB validates cdb against this LUN (opcode, service action, reserved and unsupported
// fields, transfer length limits, LBA range) and returns its data transfer direction and
// length. On an invalid CDB the error is the Sense that Execute reports for it (a Sense value;
// use errors.As), and the returned CDBInfo has Dir DirNone: the transport should move no data
// and let Execute produce the CHECK CONDITION. ParseCDB does not allocate for a valid CDB.
func (l *LUN) ParseCDB(cdb []byte) (CDBInfo, error) {
	var i CDBInfo
	if s := l.parse(cdb, &i); s.Key != NoSense {
		return i.failed(), s
	}
	return i, nil
}

// parseFor is parse for cmd's CDB, with the write protection of cmd's I_T nexus: a valid
// medium write from a nexus that sees the LUN write-protected is WRITE PROTECTED (the only
// source of that sense here: parse itself ignores the LUN's own read-only state, which run
// checks in SPC order).
func (l *LUN) parseFor(cmd *Command, i *CDBInfo) Sense {
	s := l.parse(cmd.CDB, i)
	if s.Key == NoSense && cmd.WriteProtected && i.cmd.flags&cmdWrite != 0 {
		return senseWriteProtected
	}
	return s
}

// parsedCDB is what LUNSet.Parse learnt about a command, kept in it so that Execute does not
// parse the CDB again. It is keyed by the LUN, the CDB bytes the parse looked at (at most 16:
// no supported CDB is longer) and WriteProtected, so that a Command reused for another CDB,
// or one changed after Parse, is parsed afresh instead of run on a stale result.
type parsedCDB struct {
	lun   *LUN // nil: nothing recorded
	key   [16]byte
	n     uint8
	wp    bool
	info  CDBInfo
	sense Sense
}

// cdbKeyLen is how many CDB bytes a parse depends on: it reads at most the first 16, and
// beyond those only whether the CDB is long enough, which 16 bytes always are.
func cdbKeyLen(cdb []byte) int { return min(len(cdb), 16) }

// record parses cmd's CDB for l and keeps the result in cmd.
func (p *parsedCDB) record(l *LUN, cmd *Command) {
	n := cdbKeyLen(cmd.CDB)
	*p = parsedCDB{lun: l, n: uint8(n), wp: cmd.WriteProtected}
	copy(p.key[:], cmd.CDB[:n])
	p.sense = l.parseFor(cmd, &p.info)
}

// matches reports whether p holds the parse of cmd as it is now, for l.
func (p *parsedCDB) matches(l *LUN, cmd *Command) bool {
	n := cdbKeyLen(cmd.CDB)
	return p.lun == l && l != nil && int(p.n) == n && p.wp == cmd.WriteProtected &&
		string(p.key[:n]) == string(cmd.CDB[:n])
}

// failed is the CDBInfo ParseCDB returns for an invalid CDB: what it is, no data transfer.
func (i *CDBInfo) failed() CDBInfo {
	return CDBInfo{Opcode: i.Opcode, ServiceAction: i.ServiceAction, cmd: i.cmd}
}

// parse fills i from cdb and returns the zero Sense for a valid CDB.
func (l *LUN) parse(cdb []byte, i *CDBInfo) Sense {
	if len(cdb) == 0 {
		return senseInvalidOpcode
	}
	op := cdb[0]
	i.Opcode = op
	n := cdbLen(op)
	if n == 0 || opIndex[op] == 0 {
		return senseInvalidOpcode
	}
	if len(cdb) < n {
		return Sense{Key: IllegalRequest, ASC: 0x24}
	}
	cdb = cdb[:n]
	if cdb[n-1]&0x04 != 0 { // NACA: ACA is not supported
		return invalidCDB(n-1, 2)
	}
	i.cmd = &commands[opIndex[op]-1]
	bs := uint32(l.blockSize)

	switch op {
	case OpTestUnitReady:
	case OpRequestSense:
		i.flag = cdb[1]&0x01 != 0
		i.Dir, i.Length = DirIn, uint32(cdb[4])
	case OpInquiry:
		if cdb[1]&0x02 != 0 { // CMDDT (obsolete)
			return invalidCDB(1, 1)
		}
		i.flag = cdb[1]&0x01 != 0
		if !i.flag && cdb[2] != 0 {
			return invalidCDB(2, 7)
		}
		if i.flag && !vpdSupported(cdb[2]) {
			return invalidCDB(2, 7)
		}
		i.Dir, i.Length = DirIn, be16(cdb[3:])
	case OpModeSelect6, OpModeSelect10:
		if cdb[1]&0x01 != 0 { // SP: saved pages are not supported
			return invalidCDB(1, 0)
		}
		if cdb[1]&0x10 == 0 { // PF=0: vendor specific page format
			return invalidCDB(1, 4)
		}
		i.Dir = DirOut
		if op == OpModeSelect6 {
			i.Length = uint32(cdb[4])
		} else {
			i.Length = be16(cdb[7:])
		}
	case OpModeSense6, OpModeSense10:
		if s := checkModeSenseCDB(cdb); s.Key != NoSense {
			return s
		}
		i.flag2 = cdb[1]&0x08 != 0 // DBD
		i.Dir = DirIn
		if op == OpModeSense6 {
			i.Length = uint32(cdb[4])
		} else {
			i.flag = cdb[1]&0x10 != 0 // LLBAA
			i.Length = be16(cdb[7:])
		}
	case OpStartStopUnit:
		pc := cdb[4] >> 4
		switch pc {
		case 0, 1, 2, 3, 7, 0xA, 0xB:
		default:
			return invalidCDB(4, 7)
		}
		if pc == 0 && cdb[4]&0x02 != 0 { // LOEJ: no removable medium
			return invalidCDB(4, 1)
		}
	case OpReadCapacity10:
		if cdb[8]&0x01 == 0 && be32(cdb[2:]) != 0 {
			return invalidCDB(2, 7)
		}
		i.Dir, i.Length = DirIn, 8
	case OpRead6, OpWrite6:
		i.LBA = uint64(cdb[1]&0x1F)<<16 | uint64(cdb[2])<<8 | uint64(cdb[3])
		i.Blocks = uint32(cdb[4])
		if i.Blocks == 0 {
			i.Blocks = 256
		}
		return l.parseRW(i, 4)
	case OpRead10, OpWrite10, OpRead12, OpWrite12, OpRead16, OpWrite16:
		if cdb[1]&0xE0 != 0 { // RDPROTECT/WRPROTECT: no protection information
			return invalidCDB(1, 7)
		}
		i.FUA = cdb[1]&0x08 != 0
		switch op {
		case OpRead10, OpWrite10:
			i.LBA, i.Blocks = uint64(be32(cdb[2:])), be16(cdb[7:])
			return l.parseRW(i, 7)
		case OpRead12, OpWrite12:
			i.LBA, i.Blocks = uint64(be32(cdb[2:])), be32(cdb[6:])
			return l.parseRW(i, 6)
		}
		i.LBA, i.Blocks = be64(cdb[2:]), be32(cdb[10:])
		return l.parseRW(i, 10)
	case OpVerify10, OpVerify16:
		if cdb[1]&0xE0 != 0 { // VRPROTECT
			return invalidCDB(1, 7)
		}
		i.bytchk = cdb[1] >> 1 & 3
		if i.bytchk == 2 {
			return invalidCDB(1, 2)
		}
		lenByte := 7
		if op == OpVerify10 {
			i.LBA, i.Blocks = uint64(be32(cdb[2:])), be16(cdb[7:])
		} else {
			lenByte = 10
			i.LBA, i.Blocks = be64(cdb[2:]), be32(cdb[10:])
		}
		switch i.bytchk {
		case 1:
			if i.Blocks > l.maxXfer {
				return invalidCDB(lenByte, 7)
			}
			i.Dir, i.Length = DirOut, i.Blocks*bs
		case 3:
			if i.Blocks > 0 {
				i.Dir, i.Length = DirOut, bs
			}
		}
		return l.checkRange(i.LBA, uint64(i.Blocks))
	case OpSynchronizeCache10, OpSynchronizeCache16:
		i.flag = cdb[1]&0x02 != 0 // IMMED
		if op == OpSynchronizeCache10 {
			i.LBA, i.Blocks = uint64(be32(cdb[2:])), be16(cdb[7:])
		} else {
			i.LBA, i.Blocks = be64(cdb[2:]), be32(cdb[10:])
		}
		return l.checkRange(i.LBA, uint64(i.Blocks))
	case OpWriteSame10, OpWriteSame16:
		if cdb[1]&0xE0 != 0 {
			return invalidCDB(1, 7)
		}
		if cdb[1]&0x10 != 0 { // ANCHOR: not supported (ANC_SUP=0)
			return invalidCDB(1, 4)
		}
		i.flag = cdb[1]&0x08 != 0 // UNMAP
		lenByte := 7
		if op == OpWriteSame10 {
			i.LBA, i.Blocks = uint64(be32(cdb[2:])), be16(cdb[7:])
		} else {
			lenByte = 10
			i.flag2 = cdb[1]&0x01 != 0 // NDOB
			i.LBA, i.Blocks = be64(cdb[2:]), be32(cdb[10:])
		}
		if i.Blocks == 0 || uint64(i.Blocks) > l.maxWriteSame { // WSNZ=1
			return invalidCDB(lenByte, 7)
		}
		if !i.flag2 {
			i.Dir, i.Length = DirOut, bs
		}
		return l.checkRange(i.LBA, uint64(i.Blocks))
	case OpUnmap:
		if !l.canUnmap {
			return senseInvalidOpcode
		}
		if cdb[1]&0x01 != 0 { // ANCHOR
			return invalidCDB(1, 0)
		}
		i.Dir, i.Length = DirOut, be16(cdb[7:])
	case OpCompareAndWrite:
		if cdb[1]&0xE0 != 0 {
			return invalidCDB(1, 7)
		}
		i.FUA = cdb[1]&0x08 != 0
		i.LBA, i.Blocks = be64(cdb[2:]), uint32(cdb[13])
		if i.Blocks > uint32(l.maxCAW) {
			return invalidCDB(13, 7)
		}
		i.Dir, i.Length = DirOut, 2*i.Blocks*bs
		if i.Blocks == 0 {
			i.Dir = DirNone
		}
		return l.checkRange(i.LBA, uint64(i.Blocks))
	case OpPersistentResvIn:
		i.ServiceAction = cdb[1] & 0x1F
		if i.ServiceAction > PRInReadFullStatus {
			return invalidCDB(1, 4)
		}
		i.cmd = lookupCmd(op, i.ServiceAction)
		i.Dir, i.Length = DirIn, be16(cdb[7:])
	case OpPersistentResvOut:
		sa := cdb[1] & 0x1F
		i.ServiceAction = sa
		if sa > PROutRegisterAndIgnore {
			return invalidCDB(1, 4)
		}
		i.cmd = lookupCmd(op, sa)
		switch sa {
		case PROutReserve, PROutRelease, PROutPreempt, PROutPreemptAndAbort:
			if cdb[2]>>4 != 0 { // SCOPE: only LU_SCOPE
				return invalidCDB(2, 7)
			}
			if !validPRType(cdb[2] & 0x0F) {
				return invalidCDB(2, 3)
			}
		}
		// Without SPEC_I_PT (unsupported) the parameter list is exactly 24 bytes: reject any
		// other length here, before a transport fetches up to 4 GiB of it.
		if be32(cdb[5:]) != prOutParamListLen {
			return senseParamListLength
		}
		i.Dir, i.Length = DirOut, prOutParamListLen
	case OpServiceActionIn16:
		i.ServiceAction = cdb[1] & 0x1F
		switch i.ServiceAction {
		case SAReadCapacity16:
			if cdb[14]&0x01 == 0 && be64(cdb[2:]) != 0 {
				return invalidCDB(2, 7)
			}
		case SAGetLBAStatus:
			i.cmd = lookupCmd(op, SAGetLBAStatus)
			if !validLBAReportType(cdb[14]) { // REPORT TYPE (sbc4r15 5.8)
				return invalidCDB(14, 7)
			}
			i.LBA = be64(cdb[2:])
			if i.LBA >= l.blocks.Load() {
				return senseLBAOutOfRange
			}
		default:
			return invalidCDB(1, 4)
		}
		i.Dir, i.Length = DirIn, be32(cdb[10:])
	case OpLogSense:
		if cdb[1]&0x01 != 0 { // SP: nothing is saved
			return invalidCDB(1, 0)
		}
		if cdb[1]&0x02 != 0 { // PPC (obsolete)
			return invalidCDB(1, 1)
		}
		if s := checkLogSenseCDB(cdb); s.Key != NoSense {
			return s
		}
		i.Dir, i.Length = DirIn, be16(cdb[7:])
	case OpReportLUNs:
		switch cdb[2] {
		case 0x00, 0x01, 0x02:
		default:
			return invalidCDB(2, 7)
		}
		i.Length = be32(cdb[6:])
		if i.Length < 16 {
			return invalidCDB(6, 7)
		}
		i.Dir = DirIn
	case OpMaintenanceIn:
		i.ServiceAction = cdb[1] & 0x1F
		i.cmd = lookupCmd(op, i.ServiceAction)
		if !l.supports(i.cmd) {
			i.cmd = &commands[opIndex[op]-1]
			return invalidCDB(1, 4)
		}
		switch i.ServiceAction {
		case SAReportSupportedOpcds:
			if cdb[2]&0x07 > 3 {
				return invalidCDB(2, 2)
			}
		case SAReportTargetPortGrps:
			switch cdb[1] >> 5 { // PARAMETER DATA FORMAT
			case rtpgFormatLength:
			case rtpgFormatExtended:
				i.flag = true
			default:
				return invalidCDB(1, 7)
			}
		case SAReportSupportedTMFs:
			i.flag = cdb[2]&0x80 != 0 // REPD
			if be32(cdb[6:]) < 4 {    // spc4r37 6.40: an allocation length under 4 is invalid
				return invalidCDB(6, 7)
			}
		}
		i.Dir, i.Length = DirIn, be32(cdb[6:])
	default:
		return senseInvalidOpcode
	}
	return senseNone
}

// parseRW finishes READ and WRITE: transfer length limit, LBA range, data length. lenByte is
// the CDB offset of the TRANSFER LENGTH field.
func (l *LUN) parseRW(i *CDBInfo, lenByte int) Sense {
	if i.Blocks > l.maxXfer {
		return invalidCDB(lenByte, 7)
	}
	if s := l.checkRange(i.LBA, uint64(i.Blocks)); s.Key != NoSense {
		return s
	}
	i.Length = i.Blocks * uint32(l.blockSize)
	if i.Length > 0 {
		i.Dir = DirIn
		if i.cmd.flags&cmdWrite != 0 {
			i.Dir = DirOut
		}
	}
	return senseNone
}

// checkRange is LBA OUT OF RANGE unless [lba, lba+n) lies within the medium.
func (l *LUN) checkRange(lba, n uint64) Sense {
	blocks := l.blocks.Load()
	if lba > blocks || n > blocks-lba {
		return senseLBAOutOfRange
	}
	return senseNone
}

func checkModeSenseCDB(cdb []byte) Sense {
	if cdb[2]>>6 == 3 { // saved values
		return senseSavingUnsupported
	}
	page, sub := cdb[2]&0x3F, cdb[3]
	switch page {
	case modePageRWRecovery, modePageCaching, modePageControl, modePageInfoExceptions:
		if sub != 0 {
			return invalidCDB(3, 7)
		}
	case modePageAll:
		if sub != 0 && sub != 0xFF {
			return invalidCDB(3, 7)
		}
	default:
		return invalidCDB(2, 5)
	}
	return senseNone
}

func validPRType(t uint8) bool {
	switch t {
	case prTypeWriteExclusive, prTypeExclusiveAccess, prTypeWriteExclusiveRegs,
		prTypeExclusiveAccessRegs, prTypeWriteExclusiveAll, prTypeExclusiveAccessAll:
		return true
	}
	return false
}
