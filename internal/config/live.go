package config

import (
	"fmt"
	"reflect"
	"slices"
)

// A running target takes most changes of its configuration live: the daemon applies them
// without a restart, so that the initiators logged in stay logged in and are told with unit
// attentions. Only port-level changes (the transport, the port ID, the listen addresses, the
// CM port) restart it; limits apply to new logins (and their run-time bounds at once), and a
// change of the alua section reopens every LUN (each is built with its port groups). PlanTarget decides which; the daemon's apply, its reload
// and `srpctl reload --dry-run` / `config diff` all use it.

// LiveOpKind is the kind of one live change of a target.
type LiveOpKind string

// The live changes.
const (
	// LUNAdd: the LUN is opened and mapped into the views of the ACLs that show it.
	LUNAdd LiveOpKind = "lun-add"
	// LUNRemove: the LUN leaves every view (it answers LOGICAL UNIT NOT SUPPORTED), the
	// commands admitted to it finish, and it is closed.
	LUNRemove LiveOpKind = "lun-remove"
	// LUNResize: the backend grows to the new size (never shrinks) and the initiators that use
	// the LUN are told CAPACITY DATA HAS CHANGED.
	LUNResize LiveOpKind = "lun-resize"
	// LUNReadOnly: the LUN's write protection is set or lifted (MODE PARAMETERS CHANGED). A
	// LUN whose backend was opened read-only is opened again read-write.
	LUNReadOnly LiveOpKind = "lun-read-only"
	// LUNReopen: another backend or identity; the LUN is opened anew and replaces the old one
	// under the same number (REPORTED LUNS DATA HAS CHANGED, then POWER ON on it).
	LUNReopen LiveOpKind = "lun-reopen"
	// ACLAdd: new logins of the initiator get the ACL's view; a session of it that the "*"
	// ACL admitted is logged out to log in again under its own.
	ACLAdd LiveOpKind = "acl-add"
	// ACLRemove: the sessions the ACL admitted are logged out.
	ACLRemove LiveOpKind = "acl-remove"
	// ACLChange: the view changes in place (LUNs in or out: REPORTED LUNS DATA HAS CHANGED;
	// write protection: MODE PARAMETERS CHANGED), to that ACL's sessions only.
	ACLChange LiveOpKind = "acl-change"
	// LimitsChange: new logins negotiate the new limits; the channels logged in keep what
	// they negotiated and take the run-time bounds (keep-alive, stall, timeouts) at once.
	LimitsChange LiveOpKind = "limits"
)

// LiveOp is one live change of a target.
type LiveOp struct {
	Kind LiveOpKind `json:"kind"`
	// LUN is the LUN ID of the LUN changes.
	LUN int `json:"lun,omitempty"`
	// ACL is the initiator ("*" or the port ID) of the ACL changes.
	ACL string `json:"acl,omitempty"`
	// Detail says what changes, for people ("16MiB → 32MiB").
	Detail string `json:"detail,omitempty"`
}

func (o LiveOp) String() string {
	s := string(o.Kind)
	switch {
	case o.ACL != "":
		s += " " + o.ACL
	case o.Kind != "":
		s += fmt.Sprintf(" %d", o.LUN)
	}
	if o.Detail != "" {
		s += " (" + o.Detail + ")"
	}
	return s
}

// TargetPlan is how a target present in two configurations goes from one to the other.
type TargetPlan struct {
	Name string `json:"name"`
	// Restart: the target is stopped and started again (its initiators are logged out and
	// log in again); Why says what forces it. Ops are then empty.
	Restart bool     `json:"restart,omitempty"`
	Why     []string `json:"why,omitempty"`
	// Ops are the live changes, in the order they are applied: LUNs opened, resized,
	// protected first, then the views, then the LUNs removed.
	Ops []LiveOp `json:"ops,omitempty"`
}

// Empty reports whether nothing changes.
func (p *TargetPlan) Empty() bool { return !p.Restart && len(p.Ops) == 0 }

// Summary is one line per change, "target t1: restart (port_id changed)" or
// "target t1: lun-resize 1 (16MiB → 32MiB)".
func (p *TargetPlan) Summary() []string {
	if p.Restart {
		return []string{fmt.Sprintf("target %s: restart (%s)", p.Name, joinWhy(p.Why))}
	}
	out := make([]string, 0, len(p.Ops))
	for _, o := range p.Ops {
		out = append(out, fmt.Sprintf("target %s: %s", p.Name, o))
	}
	return out
}

func joinWhy(w []string) string {
	s := ""
	for i, x := range w {
		if i > 0 {
			s += ", "
		}
		s += x
	}
	return s
}

// PlanTarget decides how target old becomes new (the same name; both with their defaults
// applied). recheck lists LUN IDs to open again even though their configuration is the same
// (their real paths must be checked against new allowed_paths; Changeset lists them).
func PlanTarget(old, new *Target, recheck ...int) TargetPlan {
	p := TargetPlan{Name: new.Name}
	why := func(c bool, w string) {
		if c {
			p.Why = append(p.Why, w)
		}
	}
	why(old.Transport != new.Transport, "transport changed")
	why(old.PortID != new.PortID, "port_id changed")
	why(!slices.Equal(old.Listen, new.Listen), "listen changed")
	why(old.CMPort != new.CMPort, "cm_port changed")
	if len(p.Why) > 0 {
		p.Restart = true
		return p
	}
	if !reflect.DeepEqual(old.Limits, new.Limits) {
		p.Ops = append(p.Ops, LiveOp{Kind: LimitsChange, Detail: "new logins negotiate them"})
	}
	aluaChanged := !reflect.DeepEqual(old.ALUA, new.ALUA)
	var removed []LiveOp
	for _, ol := range old.LUNs {
		nl := new.LUN(ol.ID)
		if nl == nil {
			removed = append(removed, LiveOp{Kind: LUNRemove, LUN: ol.ID})
			continue
		}
		ops := planLUN(&ol, nl, slices.Contains(recheck, ol.ID))
		if aluaChanged && !slices.ContainsFunc(ops, func(o LiveOp) bool { return o.Kind == LUNReopen }) {
			ops = append(ops, LiveOp{Kind: LUNReopen, LUN: nl.ID, Detail: "alua changed"})
		}
		p.Ops = append(p.Ops, ops...)
	}
	for _, nl := range new.LUNs {
		if old.LUN(nl.ID) == nil {
			p.Ops = append(p.Ops, LiveOp{Kind: LUNAdd, LUN: nl.ID, Detail: nl.Backend})
		}
	}
	acls := diffKeyed(old.ACLs, new.ACLs, func(x *ACL) string { return x.Initiator.String() }, deepEqual[ACL])
	for _, k := range acls.Added {
		p.Ops = append(p.Ops, LiveOp{Kind: ACLAdd, ACL: k})
	}
	for _, k := range acls.Changed {
		p.Ops = append(p.Ops, LiveOp{Kind: ACLChange, ACL: k})
	}
	for _, k := range acls.Removed {
		p.Ops = append(p.Ops, LiveOp{Kind: ACLRemove, ACL: k})
	}
	p.Ops = append(p.Ops, removed...)
	return p
}

// planLUN is the live change of one LUN present in both.
func planLUN(o, n *LUN, recheck bool) []LiveOp {
	a, b := *o, *n
	// What a running LUN can change in place: its size and its write protection. Create
	// only matters when the file is missing at open.
	a.Size, b.Size, a.ReadOnly, b.ReadOnly, a.Create, b.Create = 0, 0, false, false, false, false
	if !reflect.DeepEqual(a, b) {
		return []LiveOp{{Kind: LUNReopen, LUN: n.ID, Detail: "backend or identity changed"}}
	}
	if recheck {
		return []LiveOp{{Kind: LUNReopen, LUN: n.ID, Detail: "allowed_paths changed"}}
	}
	var ops []LiveOp
	if o.Size != n.Size && n.Size != 0 {
		ops = append(ops, LiveOp{Kind: LUNResize, LUN: n.ID, Detail: fmt.Sprintf("%v → %v", o.Size, n.Size)})
	}
	if o.ReadOnly != n.ReadOnly {
		d := "read-write"
		if n.ReadOnly {
			d = "read-only"
		}
		ops = append(ops, LiveOp{Kind: LUNReadOnly, LUN: n.ID, Detail: d})
	}
	return ops
}

// PlanTargets plans every target present in both configurations that changed (Diff's
// TargetDiffs), in the new configuration's order. Added and removed targets are started and
// stopped; a target whose transport is reopened restarts whatever its plan says.
func PlanTargets(old, new *Config) []TargetPlan {
	d := Diff(old, new)
	var out []TargetPlan
	for _, td := range d.TargetDiffs {
		ot, nt := old.Target(td.Name), new.Target(td.Name)
		if ot == nil || nt == nil {
			continue
		}
		var recheck []int
		if d.AllowedPaths {
			for _, id := range td.LUNs.Changed {
				if ol, nl := ot.LUN(id), nt.LUN(id); ol != nil && nl != nil && reflect.DeepEqual(*ol, *nl) {
					recheck = append(recheck, id)
				}
			}
		}
		if p := PlanTarget(ot, nt, recheck...); !p.Empty() {
			out = append(out, p)
		}
	}
	return out
}
