package config

import (
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
)

// ALUA states, as the configuration and srpctl spell them.
const (
	ALUAActiveOptimized    = "active/optimized"
	ALUAActiveNonOptimized = "active/non-optimized"
	ALUAStandby            = "standby"
	ALUAUnavailable        = "unavailable"
	ALUATransitioning      = "transitioning"
)

// ALUAStates lists the states an ALUA target port group may be in.
var ALUAStates = []string{ALUAActiveOptimized, ALUAActiveNonOptimized, ALUAStandby, ALUAUnavailable, ALUATransitioning}

// ALUA puts a target's port into a target port group (implicit asymmetric logical unit access,
// SPC-4 5.15): its LUNs then report TPGS in INQUIRY, answer REPORT TARGET PORT GROUPS with
// this group and the peers', carry the relative target port and group in VPD page 0x83, and
// refuse media access while the group is standby, unavailable or transitioning. Gateways that
// export the same images list each other as peers, each with its own group and relative port,
// and give each LUN the same naa.
type ALUA struct {
	// Group is this target port's target port group, 0..65535.
	Group int `yaml:"group" json:"group"`
	// RelativePort is this target port's relative target port identifier, 1..65535, unique
	// among all the ports (of every gateway) that export the same LUNs.
	RelativePort int `yaml:"relative_port" json:"relative_port"`
	// State is the group's asymmetric access state for the target's LUNs: active/optimized
	// (default), active/non-optimized, standby, unavailable or transitioning. A LUN's
	// alua_states override it; `srpctl target alua` changes it live.
	State string `yaml:"state,omitempty" json:"state,omitempty"`
	// Peers are the target port groups of the other gateways exporting the same LUNs, as
	// REPORT TARGET PORT GROUPS reports them from here.
	Peers []ALUAPeer `yaml:"peers,omitempty" json:"peers,omitempty"`
}

// ALUAPeer is another gateway's target port group.
type ALUAPeer struct {
	Group         int    `yaml:"group" json:"group"`
	RelativePorts []int  `yaml:"relative_ports" json:"relative_ports"`
	State         string `yaml:"state,omitempty" json:"state,omitempty"`
}

// ALUAGroupState sets one target port group's state for one LUN (LUN.ALUAStates).
type ALUAGroupState struct {
	Group int    `yaml:"group" json:"group"`
	State string `yaml:"state" json:"state"`
}

// Groups lists every group of a: this target's first, then the peers'.
func (a *ALUA) Groups() []int {
	gs := []int{a.Group}
	for _, p := range a.Peers {
		gs = append(gs, p.Group)
	}
	return gs
}

// ParseNAA decodes a LUN's naa: 32 hexadecimal digits (colons, dashes and a leading "naa." or
// "0x" allowed), an NAA IEEE Registered Extended identifier whose first digit is 6.
func ParseNAA(s string) ([16]byte, error) {
	var naa [16]byte
	t := strings.ToLower(s)
	t = strings.TrimPrefix(strings.TrimPrefix(t, "naa."), "0x")
	t = strings.NewReplacer(":", "", "-", "").Replace(t)
	b, err := hex.DecodeString(t)
	if err != nil || len(b) != 16 {
		return naa, fmt.Errorf("%q: want 32 hexadecimal digits", s)
	}
	if b[0]>>4 != 6 {
		return naa, fmt.Errorf("%q: must start with 6 (NAA IEEE Registered Extended)", s)
	}
	copy(naa[:], b)
	return naa, nil
}

func (v *validator) aluaState(p, s string, required bool) {
	if s == "" && !required {
		return
	}
	if !slices.Contains(ALUAStates, s) {
		v.errorf(p, ErrInvalid, "%q must be one of %s", s, strings.Join(ALUAStates, ", "))
	}
}

func (v *validator) alua(p string, a *ALUA) {
	v.rng(join(p, "group"), int64(a.Group), 0, 65535, "")
	v.rng(join(p, "relative_port"), int64(a.RelativePort), 1, 65535, "")
	v.aluaState(join(p, "state"), a.State, false)
	groups := map[int]bool{a.Group: true}
	ports := map[int]bool{a.RelativePort: true}
	for i := range a.Peers {
		pp := index(p, "peers", i)
		g := &a.Peers[i]
		v.rng(join(pp, "group"), int64(g.Group), 0, 65535, "")
		if groups[g.Group] {
			v.errorf(join(pp, "group"), ErrDuplicate, "target port group %d is listed twice", g.Group)
		}
		groups[g.Group] = true
		if len(g.RelativePorts) == 0 {
			v.errorf(join(pp, "relative_ports"), ErrMissing, "a peer group needs its relative target ports")
		}
		for j, r := range g.RelativePorts {
			rp := index(pp, "relative_ports", j)
			v.rng(rp, int64(r), 1, 65535, "")
			if ports[r] {
				v.errorf(rp, ErrDuplicate, "relative target port %d is listed twice", r)
			}
			ports[r] = true
		}
		v.aluaState(join(pp, "state"), g.State, false)
	}
}

// lunALUA checks a LUN's naa and alua_states (the groups they name exist only with the
// target's alua: targetALUA checks that).
func (v *validator) lunALUA(p string, l *LUN) {
	if l.NAA != "" {
		if _, err := ParseNAA(l.NAA); err != nil {
			v.errorf(join(p, "naa"), ErrInvalid, "%v", err)
		}
	}
	for i, s := range l.ALUAStates {
		sp := index(p, "alua_states", i)
		v.rng(join(sp, "group"), int64(s.Group), 0, 65535, "")
		v.aluaState(join(sp, "state"), s.State, true)
	}
}

// targetALUA checks that the LUNs' alua_states name groups of the target's alua.
func (v *validator) targetALUA(p string, t *Target) {
	if t.ALUA != nil {
		v.alua(join(p, "alua"), t.ALUA)
	}
	for i := range t.LUNs {
		l := &t.LUNs[i]
		for j, s := range l.ALUAStates {
			sp := index(index(p, "luns", i), "alua_states", j)
			if t.ALUA == nil {
				v.errorf(sp, ErrInvalid, "the target has no alua section")
				continue
			}
			if !slices.Contains(t.ALUA.Groups(), s.Group) {
				v.errorf(join(sp, "group"), ErrInvalid, "target port group %d is not in the target's alua section", s.Group)
			}
		}
	}
}
