package scsi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// ALUAState is a primary target port asymmetric access state (SPC-4 5.15.2.4; the ASYMMETRIC
// ACCESS STATE field of REPORT TARGET PORT GROUPS, Table 198 of spc4r37).
type ALUAState uint8

// The states srpd implements (implicit ALUA only: they change by configuration, never by SET
// TARGET PORT GROUPS). LBA dependent (4h) and offline (Eh) are not supported.
const (
	ALUAActiveOptimized    ALUAState = 0x0
	ALUAActiveNonOptimized ALUAState = 0x1
	ALUAStandby            ALUAState = 0x2
	ALUAUnavailable        ALUAState = 0x3
	ALUATransitioning      ALUAState = 0xF
)

// aluaSupportedStates is the supported-states byte of every target port group descriptor:
// T_SUP, U_SUP, S_SUP, AN_SUP, AO_SUP (spc4r37 Table 197).
const aluaSupportedStates = 0x80 | 0x08 | 0x04 | 0x02 | 0x01

// aluaStatusImplicit is the STATUS CODE "altered by implicit asymmetric logical unit access
// behavior" of a target port group whose state changed since the LUN was created.
const aluaStatusImplicit = 0x02

var aluaStateNames = map[ALUAState]string{
	ALUAActiveOptimized:    "active/optimized",
	ALUAActiveNonOptimized: "active/non-optimized",
	ALUAStandby:            "standby",
	ALUAUnavailable:        "unavailable",
	ALUATransitioning:      "transitioning",
}

// String is the state's name as the configuration and srpctl spell it ("active/optimized").
func (s ALUAState) String() string {
	if n, ok := aluaStateNames[s]; ok {
		return n
	}
	return fmt.Sprintf("alua state 0x%x", uint8(s))
}

// Valid reports whether s is one of the states srpd implements.
func (s ALUAState) Valid() bool {
	_, ok := aluaStateNames[s]
	return ok
}

// ErrUnknownALUAState: a name ParseALUAState does not know, or a state value that is not one
// of the implemented ones.
var ErrUnknownALUAState = errors.New("scsi: unknown ALUA state")

// ErrUnknownPortGroup: SetALUAState named a target port group the LUN does not have.
var ErrUnknownPortGroup = errors.New("scsi: no such target port group")

// ParseALUAState parses a state name: "active/optimized" (or "ao", "optimized"),
// "active/non-optimized" ("an", "ano", "non-optimized"), "standby", "unavailable",
// "transitioning".
func ParseALUAState(s string) (ALUAState, error) {
	switch s {
	case "active/optimized", "ao", "optimized", "active-optimized":
		return ALUAActiveOptimized, nil
	case "active/non-optimized", "an", "ano", "non-optimized", "active-non-optimized":
		return ALUAActiveNonOptimized, nil
	case "standby":
		return ALUAStandby, nil
	case "unavailable":
		return ALUAUnavailable, nil
	case "transitioning":
		return ALUATransitioning, nil
	}
	return 0, fmt.Errorf("%w %q (want active/optimized, active/non-optimized, standby, unavailable or transitioning)",
		ErrUnknownALUAState, s)
}

// PortGroup is one target port group of a logical unit: its identifier, its asymmetric
// access state and the relative target port identifiers of its target ports. A LUN exported
// by several gateways lists the groups of all of them, so that REPORT TARGET PORT GROUPS
// through any port describes every path.
type PortGroup struct {
	ID    uint16
	State ALUAState
	// Preferred sets PREF in the group's descriptor (a hint to the initiator).
	Preferred bool
	// RelativePorts are the relative target port identifiers of the group (1..65535, unique
	// across all groups of the LUN).
	RelativePorts []uint16
}

// TargetPort is a local target port through which a LUN is reached: the SCSI target port
// identifier that Nexus.TargetPortID carries for it, and its relative target port identifier,
// which must be one of the PortGroups' RelativePorts (that group is the port's).
type TargetPort struct {
	ID         [16]byte
	RelativeID uint16
}

// ALUAConfig turns on implicit asymmetric logical unit access for a LUN (LUNConfig.ALUA):
// INQUIRY reports TPGS=01b, REPORT TARGET PORT GROUPS answers, VPD page 0x83 carries the
// relative target port and target port group of the port a command came through, and commands
// through a port whose group is standby, unavailable or transitioning are refused as SPC-4
// requires.
type ALUAConfig struct {
	Groups []PortGroup
	// Ports are the local target ports. A command through a port not listed is not subject to
	// ALUA restrictions and its VPD page 0x83 has no port designators.
	Ports []TargetPort
}

// alua is a LUN's ALUA state. The configuration is fixed at NewLUN; only the states change.
type alua struct {
	groups []aluaGroup
	ports  map[[16]byte]aluaPort
	// restricted counts the groups with a local port whose state refuses commands (standby,
	// unavailable, transitioning): while it is zero, the command path looks no further.
	restricted atomic.Int32
	mu         sync.Mutex // serializes SetALUAState
}

type aluaGroup struct {
	id     uint16
	pref   bool
	ports  []uint16
	local  bool // has a port in alua.ports
	state  atomic.Uint32
	status atomic.Uint32
}

type aluaPort struct {
	rel   uint16
	group int // index in alua.groups
}

func refuses(s ALUAState) bool {
	return s == ALUAStandby || s == ALUAUnavailable || s == ALUATransitioning
}

func newALUA(c *ALUAConfig) (*alua, error) {
	if len(c.Groups) == 0 {
		return nil, errors.New("scsi: ALUA: no target port groups")
	}
	if len(c.Groups) > 255 {
		return nil, fmt.Errorf("scsi: ALUA: %d target port groups: at most 255", len(c.Groups))
	}
	a := &alua{groups: make([]aluaGroup, len(c.Groups)), ports: make(map[[16]byte]aluaPort, len(c.Ports))}
	rels := make(map[uint16]int)
	ids := make(map[uint16]bool)
	for i, g := range c.Groups {
		if ids[g.ID] {
			return nil, fmt.Errorf("scsi: ALUA: target port group %d listed twice", g.ID)
		}
		ids[g.ID] = true
		if !g.State.Valid() {
			return nil, fmt.Errorf("scsi: ALUA: target port group %d: %w 0x%x", g.ID, ErrUnknownALUAState, uint8(g.State))
		}
		if len(g.RelativePorts) > 255 { // TARGET PORT COUNT is one byte
			return nil, fmt.Errorf("scsi: ALUA: target port group %d: %d ports, at most 255", g.ID, len(g.RelativePorts))
		}
		for _, r := range g.RelativePorts {
			if r == 0 { // relative port 0 is reserved (spc4r37 Table 505)
				return nil, fmt.Errorf("scsi: ALUA: target port group %d: relative target port 0 is reserved", g.ID)
			}
			if _, dup := rels[r]; dup {
				return nil, fmt.Errorf("scsi: ALUA: relative target port %d is in two groups, or twice in one", r)
			}
			rels[r] = i
		}
		ag := &a.groups[i]
		ag.id, ag.pref, ag.ports = g.ID, g.Preferred, slices.Clone(g.RelativePorts)
		ag.state.Store(uint32(g.State))
	}
	for _, p := range c.Ports {
		gi, ok := rels[p.RelativeID]
		if !ok {
			return nil, fmt.Errorf("scsi: ALUA: local target port %x: relative target port %d is in no group", p.ID, p.RelativeID)
		}
		if _, dup := a.ports[p.ID]; dup {
			return nil, fmt.Errorf("scsi: ALUA: local target port %x listed twice", p.ID)
		}
		a.ports[p.ID] = aluaPort{rel: p.RelativeID, group: gi}
		a.groups[gi].local = true
	}
	for i := range a.groups {
		if g := &a.groups[i]; g.local && refuses(ALUAState(g.state.Load())) {
			a.restricted.Add(1)
		}
	}
	return a, nil
}

// portOf returns the local port a nexus came through.
func (a *alua) portOf(n *Nexus) (aluaPort, bool) {
	p, ok := a.ports[n.TargetPortID]
	return p, ok
}

// ALUAStates returns the LUN's target port groups with their current states (nil without
// ALUA).
func (l *LUN) ALUAStates() []PortGroup {
	a := l.alua
	if a == nil {
		return nil
	}
	gs := make([]PortGroup, len(a.groups))
	for i := range a.groups {
		g := &a.groups[i]
		gs[i] = PortGroup{ID: g.id, State: ALUAState(g.state.Load()), Preferred: g.pref,
			RelativePorts: slices.Clone(g.ports)}
	}
	return gs
}

// SetALUAState changes the asymmetric access state of target port group id (an implicit
// transition). When the state changes, every I_T nexus that came through a port of that group
// gets ASYMMETRIC ACCESS STATE CHANGED (2A/06), as LIO does
// (torvalds/linux:drivers/target/target_core_alua.c core_alua_do_transition_tg_pt_work, which
// queues it for the ACLs of the group's member ports); the group's STATUS CODE becomes
// "altered by implicit ALUA". A group of another gateway (no local port) changes what REPORT
// TARGET PORT GROUPS reports, and its nexuses, being elsewhere, get nothing from here.
func (l *LUN) SetALUAState(id uint16, s ALUAState) error {
	a := l.alua
	if a == nil {
		return fmt.Errorf("%w %d: the LUN has no ALUA configuration", ErrUnknownPortGroup, id)
	}
	if !s.Valid() {
		return fmt.Errorf("%w 0x%x", ErrUnknownALUAState, uint8(s))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	gi := -1
	for i := range a.groups {
		if a.groups[i].id == id {
			gi = i
		}
	}
	if gi < 0 {
		return fmt.Errorf("%w %d", ErrUnknownPortGroup, id)
	}
	g := &a.groups[gi]
	old := ALUAState(g.state.Swap(uint32(s)))
	if old == s {
		return nil
	}
	g.status.Store(aluaStatusImplicit)
	if g.local {
		switch {
		case refuses(s) && !refuses(old):
			a.restricted.Add(1)
		case !refuses(s) && refuses(old):
			a.restricted.Add(-1)
		}
		l.ua.establishWhere(uaAccessStateChanged, func(n *Nexus) bool {
			p, ok := a.portOf(n)
			return ok && p.group == gi
		})
	}
	return nil
}

// aluaSense is the NOT READY sense a command through a port in state s gets (spc4r37
// 5.15.2.4.4-5.15.2.5; LIO's set_ascq): LOGICAL UNIT NOT ACCESSIBLE, ASYMMETRIC ACCESS STATE
// TRANSITION (04/0A), TARGET PORT IN STANDBY STATE (04/0B), TARGET PORT IN UNAVAILABLE STATE
// (04/0C).
func aluaSense(s ALUAState) Sense {
	switch s {
	case ALUAStandby:
		return senseALUAStandby
	case ALUAUnavailable:
		return senseALUAUnavailable
	}
	return senseALUATransitioning
}

// aluaRefusal returns the NOT READY sense for a command (cdb) through n's port while its group
// refuses it, or false. The lists of commands allowed are LIO's
// (torvalds/linux:drivers/target/target_core_alua.c core_alua_state_standby,
// core_alua_state_unavailable, core_alua_state_transition, after spc4r17 5.9.2.4.4-5.9.2.5),
// by way of each command's cmdStandbyOK and cmdUnavailableOK flags; an opcode we do not
// implement is refused with the state's NOT READY too, as LIO does (the check comes before the
// CDB is judged).
func (l *LUN) aluaRefusal(n *Nexus, cdb []byte) (Sense, bool) {
	a := l.alua
	if a == nil || a.restricted.Load() == 0 {
		return Sense{}, false
	}
	p, ok := a.portOf(n)
	if !ok {
		return Sense{}, false
	}
	s := a.state(p.group)
	if !refuses(s) {
		return Sense{}, false
	}
	var c *cmdInfo
	if len(cdb) >= 2 {
		c = lookupCmd(cdb[0], cdb[1]&0x1F)
	}
	if c != nil {
		need := cmdUnavailableOK
		if s == ALUAStandby {
			need = cmdStandbyOK
		}
		if c.flags&need != 0 {
			return Sense{}, false
		}
	}
	return aluaSense(s), true
}

func (a *alua) state(gi int) ALUAState { return ALUAState(a.groups[gi].state.Load()) }

// aluaNotReady is the sense REQUEST SENSE reports while n's port refuses commands.
func (l *LUN) aluaNotReady(n *Nexus) (Sense, bool) {
	a := l.alua
	if a == nil || a.restricted.Load() == 0 {
		return Sense{}, false
	}
	p, ok := a.portOf(n)
	if !ok || !refuses(a.state(p.group)) {
		return Sense{}, false
	}
	return aluaSense(a.state(p.group)), true
}

// RTPG parameter data formats (MAINTENANCE IN, REPORT TARGET PORT GROUPS byte 1 bits 7:5).
const (
	rtpgFormatLength   = 0 // length only header
	rtpgFormatExtended = 1 // extended header
)

// reportTargetPortGroups is REPORT TARGET PORT GROUPS (spc4r37 6.36): a header, then one
// descriptor per target port group — PREF and the asymmetric access state, the supported
// states, the group identifier, the status code, the target port count — each followed by a
// 4-byte descriptor per relative target port. RETURN DATA LENGTH counts the bytes after
// itself, n-3 (spc4r37 Tables 193 and 194): so with the extended header it includes that
// header's other 4 bytes, as Linux's scsi_dh_alua and sg3_utils' sg_rtpg read it (both add 4 to
// it for the end of the data and start the descriptors at 8).
func (x *exec) reportTargetPortGroups() Status {
	a := x.l.alua
	w := x.dataInWriter()
	var hdr [8]byte
	hlen := 4
	if x.info.flag {
		hlen = 8
		hdr[4] = 0x10 // FORMAT TYPE 001b: extended header; IMPLICIT TRANSITION TIME 0: unspecified
	}
	w.write(hdr[:hlen])
	total := hlen - 4
	for i := range a.groups {
		g := &a.groups[i]
		var d [8]byte
		d[0] = uint8(g.state.Load()) & 0x0F
		if g.pref {
			d[0] |= 0x80
		}
		d[1] = aluaSupportedStates
		binary.BigEndian.PutUint16(d[2:], g.id)
		d[5] = uint8(g.status.Load())
		d[7] = uint8(len(g.ports))
		w.write(d[:])
		for _, r := range g.ports {
			var p [4]byte
			binary.BigEndian.PutUint16(p[2:], r)
			w.write(p[:])
		}
		total += 8 + 4*len(g.ports)
	}
	binary.BigEndian.PutUint32(hdr[:], uint32(total))
	w.patch(0, hdr[:4])
	return x.written(&w)
}

// protocolSRP is the SRP protocol identifier of SCSI transport protocol specific designators
// (spc4r37 Table 362).
const protocolSRP = 0x4

// appendPortDesignators appends to b (at n) the VPD page 0x83 designators of the target port n
// came through: relative target port (type 4h) and target port group (type 5h), both with
// association "target port" and PIV set with the SRP protocol identifier, as LIO writes them
// (torvalds/linux:drivers/target/target_core_spc.c spc_emulate_evpd_83). It returns the new
// length.
func (l *LUN) appendPortDesignators(b []byte, n int, nx *Nexus) int {
	a := l.alua
	if a == nil {
		return n
	}
	p, ok := a.portOf(nx)
	if !ok {
		return n
	}
	d := b[n : n+16]
	d[0], d[1], d[3] = protocolSRP<<4|0x01, 0x80|0x10|0x04, 4
	binary.BigEndian.PutUint16(d[6:], p.rel)
	d[8], d[9], d[11] = protocolSRP<<4|0x01, 0x80|0x10|0x05, 4
	binary.BigEndian.PutUint16(d[14:], a.groups[p.group].id)
	return n + 16
}

// relativePort is the relative target port identifier of the port n came through (0 when the
// LUN has no ALUA configuration or does not know the port).
func (l *LUN) relativePort(n *Nexus) uint16 {
	if l.alua == nil {
		return 0
	}
	if p, ok := l.alua.portOf(n); ok {
		return p.rel
	}
	return 0
}
