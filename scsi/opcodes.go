package scsi

import "encoding/binary"

// cmdInfo describes one supported command (opcode and, where it has them, service action).
type cmdInfo struct {
	op    uint8
	sa    uint8
	hasSA bool
	name  string
	flags cmdFlags
	pr    prClass
	// usage is the CDB USAGE DATA of REPORT SUPPORTED OPERATION CODES: the opcode, then for
	// each further CDB byte the bits the device server looks at. Its length is the CDB length.
	usage []byte
}

type cmdFlags uint8

const (
	cmdMedia   cmdFlags = 1 << iota // accesses the medium: NOT READY while stopped
	cmdWrite                        // modifies the medium: DATA PROTECT on a read-only LUN
	cmdDiscard                      // exists only when the backend can discard (UNMAP)
	cmdNoUA                         // does not report unit attention (INQUIRY, REPORT LUNS, REQUEST SENSE)
	cmdALUA                         // exists only on a LUN with ALUA (REPORT TARGET PORT GROUPS)
	// cmdStandbyOK and cmdUnavailableOK: allowed through a target port in the ALUA standby, and
	// in the unavailable or transitioning, state (see LUN.aluaRefusal).
	cmdStandbyOK
	cmdUnavailableOK

	cmdAnyALUAState = cmdStandbyOK | cmdUnavailableOK
)

// prClass is how a command fares under a persistent reservation held by another I_T nexus
// (SPC-4 5.9.1 tables, SBC-3 4.16).
type prClass uint8

const (
	prAllowed   prClass = iota // always allowed
	prInfo                     // allowed for Write Exclusive types and registered nexuses (MODE SENSE, ...)
	prRead                     // allowed for Write Exclusive types; for registrants of *_RO/*_AR
	prWrite                    // allowed only for registrants of *_RO/*_AR types
	prOut                      // PERSISTENT RESERVE OUT: checked by the service action itself
	prStartStop                // START STOP UNIT: allowed when it starts the unit, prWrite otherwise
)

// commands lists every supported command, sorted by opcode then service action. It is never
// modified.
var commands = [...]cmdInfo{
	{op: OpTestUnitReady, name: "TEST UNIT READY", flags: cmdMedia, pr: prAllowed,
		usage: []byte{0x00, 0, 0, 0, 0, 0x04}},
	{op: OpRequestSense, name: "REQUEST SENSE", flags: cmdNoUA | cmdAnyALUAState, pr: prAllowed,
		usage: []byte{0x03, 0x01, 0, 0, 0xFF, 0x04}},
	{op: OpRead6, name: "READ(6)", flags: cmdMedia, pr: prRead,
		usage: []byte{0x08, 0x1F, 0xFF, 0xFF, 0xFF, 0x04}},
	{op: OpWrite6, name: "WRITE(6)", flags: cmdMedia | cmdWrite, pr: prWrite,
		usage: []byte{0x0A, 0x1F, 0xFF, 0xFF, 0xFF, 0x04}},
	{op: OpInquiry, name: "INQUIRY", flags: cmdNoUA | cmdAnyALUAState, pr: prAllowed,
		usage: []byte{0x12, 0x03, 0xFF, 0xFF, 0xFF, 0x04}},
	{op: OpModeSelect6, name: "MODE SELECT(6)", flags: cmdStandbyOK, pr: prWrite,
		usage: []byte{0x15, 0x11, 0, 0, 0xFF, 0x04}},
	{op: OpModeSense6, name: "MODE SENSE(6)", flags: cmdStandbyOK, pr: prInfo,
		usage: []byte{0x1A, 0x08, 0xFF, 0xFF, 0xFF, 0x04}},
	{op: OpStartStopUnit, name: "START STOP UNIT", pr: prStartStop,
		usage: []byte{0x1B, 0x01, 0, 0, 0xF7, 0x04}},
	{op: OpReadCapacity10, name: "READ CAPACITY(10)", flags: cmdMedia | cmdStandbyOK, pr: prAllowed,
		usage: []byte{0x25, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0x01, 0x04}},
	{op: OpRead10, name: "READ(10)", flags: cmdMedia, pr: prRead,
		usage: []byte{0x28, 0xF8, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0xFF, 0xFF, 0x04}},
	{op: OpWrite10, name: "WRITE(10)", flags: cmdMedia | cmdWrite, pr: prWrite,
		usage: []byte{0x2A, 0xF8, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0xFF, 0xFF, 0x04}},
	{op: OpVerify10, name: "VERIFY(10)", flags: cmdMedia, pr: prRead,
		usage: []byte{0x2F, 0xE6, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0xFF, 0xFF, 0x04}},
	{op: OpSynchronizeCache10, name: "SYNCHRONIZE CACHE(10)", flags: cmdMedia, pr: prWrite,
		usage: []byte{0x35, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0xFF, 0xFF, 0x04}},
	{op: OpWriteSame10, name: "WRITE SAME(10)", flags: cmdMedia | cmdWrite, pr: prWrite,
		usage: []byte{0x41, 0xF8, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0xFF, 0xFF, 0x04}},
	{op: OpUnmap, name: "UNMAP", flags: cmdMedia | cmdWrite | cmdDiscard, pr: prWrite,
		usage: []byte{0x42, 0x01, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0x04}},
	{op: OpLogSense, name: "LOG SENSE", flags: cmdStandbyOK, pr: prAllowed,
		usage: []byte{0x4D, 0x01, 0xFF, 0xFF, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0x04}},
	{op: OpModeSelect10, name: "MODE SELECT(10)", flags: cmdStandbyOK, pr: prWrite,
		usage: []byte{0x55, 0x11, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0x04}},
	{op: OpModeSense10, name: "MODE SENSE(10)", flags: cmdStandbyOK, pr: prInfo,
		usage: []byte{0x5A, 0x18, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0x04}},
	prInCmd(PRInReadKeys, "READ KEYS"),
	prInCmd(PRInReadReservation, "READ RESERVATION"),
	prInCmd(PRInReportCapabilites, "REPORT CAPABILITIES"),
	prInCmd(PRInReadFullStatus, "READ FULL STATUS"),
	prOutCmd(PROutRegister, "REGISTER", false),
	prOutCmd(PROutReserve, "RESERVE", true),
	prOutCmd(PROutRelease, "RELEASE", true),
	prOutCmd(PROutClear, "CLEAR", false),
	prOutCmd(PROutPreempt, "PREEMPT", true),
	prOutCmd(PROutPreemptAndAbort, "PREEMPT AND ABORT", true),
	prOutCmd(PROutRegisterAndIgnore, "REGISTER AND IGNORE EXISTING KEY", false),
	{op: OpRead16, name: "READ(16)", flags: cmdMedia, pr: prRead,
		usage: []byte{0x88, 0xF8, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x04}},
	{op: OpCompareAndWrite, name: "COMPARE AND WRITE", flags: cmdMedia | cmdWrite, pr: prWrite,
		usage: []byte{0x89, 0xF8, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0, 0x04}},
	{op: OpWrite16, name: "WRITE(16)", flags: cmdMedia | cmdWrite, pr: prWrite,
		usage: []byte{0x8A, 0xF8, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x04}},
	{op: OpVerify16, name: "VERIFY(16)", flags: cmdMedia, pr: prRead,
		usage: []byte{0x8F, 0xE6, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x04}},
	{op: OpSynchronizeCache16, name: "SYNCHRONIZE CACHE(16)", flags: cmdMedia, pr: prWrite,
		usage: []byte{0x91, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x04}},
	{op: OpWriteSame16, name: "WRITE SAME(16)", flags: cmdMedia | cmdWrite, pr: prWrite,
		usage: []byte{0x93, 0xF9, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x04}},
	{op: OpServiceActionIn16, sa: SAReadCapacity16, hasSA: true, name: "READ CAPACITY(16)", flags: cmdMedia | cmdStandbyOK, pr: prAllowed,
		usage: []byte{0x9E, 0x1F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01, 0x04}},
	{op: OpServiceActionIn16, sa: SAGetLBAStatus, hasSA: true, name: "GET LBA STATUS", flags: cmdMedia, pr: prRead,
		usage: []byte{0x9E, 0x1F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x04}}, // byte 14: REPORT TYPE
	{op: OpReportLUNs, name: "REPORT LUNS", flags: cmdNoUA | cmdAnyALUAState, pr: prAllowed,
		usage: []byte{0xA0, 0, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x04}},
	{op: OpMaintenanceIn, sa: SAReportTargetPortGrps, hasSA: true, name: "REPORT TARGET PORT GROUPS",
		flags: cmdALUA | cmdAnyALUAState, pr: prAllowed,
		usage: []byte{0xA3, 0xFF, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x04}},
	{op: OpMaintenanceIn, sa: SAReportSupportedOpcds, hasSA: true, name: "REPORT SUPPORTED OPERATION CODES",
		flags: cmdStandbyOK, pr: prInfo,
		usage: []byte{0xA3, 0x1F, 0x87, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x04}},
	{op: OpMaintenanceIn, sa: SAReportSupportedTMFs, hasSA: true, name: "REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS",
		flags: cmdStandbyOK, pr: prAllowed,
		usage: []byte{0xA3, 0x1F, 0x80, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x04}},
	{op: OpRead12, name: "READ(12)", flags: cmdMedia, pr: prRead,
		usage: []byte{0xA8, 0xF8, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x04}},
	{op: OpWrite12, name: "WRITE(12)", flags: cmdMedia | cmdWrite, pr: prWrite,
		usage: []byte{0xAA, 0xF8, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0x04}},
}

// prInCmd is the entry of PERSISTENT RESERVE IN with service action sa, named "PERSISTENT
// RESERVE IN (what)".
func prInCmd(sa uint8, what string) cmdInfo {
	return cmdInfo{op: OpPersistentResvIn, sa: sa, hasSA: true, name: "PERSISTENT RESERVE IN (" + what + ")",
		flags: cmdStandbyOK, pr: prAllowed, usage: []byte{0x5E, 0x1F, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0x04}}
}

// prOutCmd is the entry of PERSISTENT RESERVE OUT with service action sa, named "PERSISTENT
// RESERVE OUT (what)"; typed when the action looks at SCOPE and TYPE (CDB byte 2).
func prOutCmd(sa uint8, what string, typed bool) cmdInfo {
	var scopeType byte
	if typed {
		scopeType = 0xFF
	}
	return cmdInfo{op: OpPersistentResvOut, sa: sa, hasSA: true, name: "PERSISTENT RESERVE OUT (" + what + ")",
		flags: cmdStandbyOK, pr: prOut, usage: []byte{0x5F, 0x1F, scopeType, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0x04}}
}

// opIndex maps an opcode to 1 + the index of its first entry in commands (0: unsupported).
var opIndex = func() (ix [256]uint8) {
	for i := len(commands) - 1; i >= 0; i-- {
		ix[commands[i].op] = uint8(i + 1)
	}
	return ix
}()

// lookupCmd finds the entry for op and, for opcodes with service actions, sa.
func lookupCmd(op, sa uint8) *cmdInfo {
	k := opIndex[op]
	if k == 0 {
		return nil
	}
	for i := int(k - 1); i < len(commands) && commands[i].op == op; i++ {
		if c := &commands[i]; !c.hasSA || c.sa == sa {
			return c
		}
	}
	return nil
}

// supports reports whether this LUN implements c (UNMAP needs a backend that can discard,
// REPORT TARGET PORT GROUPS an ALUA configuration).
func (l *LUN) supports(c *cmdInfo) bool {
	return c != nil && (c.flags&cmdDiscard == 0 || l.canUnmap) && (c.flags&cmdALUA == 0 || l.alua != nil)
}

const rsocTimeoutsLen = 12

// reportSupportedOpcodes is REPORT SUPPORTED OPERATION CODES (SPC-4 6.35).
func (x *exec) reportSupportedOpcodes() Status {
	cdb := x.cdb
	rctd := cdb[2]&0x80 != 0
	opts := cdb[2] & 0x07
	reqOp, reqSA := cdb[3], binary.BigEndian.Uint16(cdb[4:6])
	l := x.l
	if opts == 0 {
		// All commands: header (4) then one 8-byte descriptor (+12 with RCTD) per command.
		dlen := 8
		if rctd {
			dlen += rsocTimeoutsLen
		}
		w := x.dataInWriter()
		var hdr [4]byte
		w.write(hdr[:])
		total := 0
		for i := range commands {
			c := &commands[i]
			if !l.supports(c) {
				continue
			}
			var d [8 + rsocTimeoutsLen]byte
			d[0] = c.op
			if c.hasSA {
				binary.BigEndian.PutUint16(d[2:4], uint16(c.sa))
				d[5] |= 0x01 // SERVACTV
			}
			binary.BigEndian.PutUint16(d[6:8], uint16(len(c.usage)))
			if rctd {
				d[5] |= 0x02 // CTDP
				binary.BigEndian.PutUint16(d[8:10], 0x0A)
			}
			w.write(d[:dlen])
			total += dlen
		}
		binary.BigEndian.PutUint32(hdr[:], uint32(total))
		w.patch(0, hdr[:])
		return x.written(&w)
	}
	// One command.
	var c *cmdInfo
	k := opIndex[reqOp]
	hasSA := k != 0 && commands[k-1].hasSA
	switch opts {
	case 1: // opcode only
		if hasSA {
			return x.check(invalidCDB(2, 2))
		}
		if reqSA != 0 {
			return x.check(invalidCDB(4, 7))
		}
		c = lookupCmd(reqOp, 0)
	case 2: // opcode and service action
		if k != 0 && !hasSA {
			return x.check(invalidCDB(2, 2))
		}
		if reqSA <= 0xFF {
			c = lookupCmd(reqOp, uint8(reqSA))
		}
	case 3: // opcode, and service action when it has them
		if hasSA {
			if reqSA <= 0xFF {
				c = lookupCmd(reqOp, uint8(reqSA))
			}
		} else {
			c = lookupCmd(reqOp, 0)
		}
	}
	var b [4 + 16 + rsocTimeoutsLen]byte
	n := 4
	if l.supports(c) {
		b[1] = 0x03 // SUPPORT: supported, per standard
		binary.BigEndian.PutUint16(b[2:4], uint16(len(c.usage)))
		n += copy(b[4:], c.usage)
	} else {
		b[1] = 0x01 // not supported
	}
	if rctd {
		b[1] |= 0x80 // CTDP
		binary.BigEndian.PutUint16(b[n:], 0x0A)
		n += rsocTimeoutsLen
	}
	return x.reply(b[:n])
}
