package config

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// Changes lists the keys of what was added, removed or changed between two configurations,
// each in the order of the config they come from (Removed: the old one).
type Changes[K comparable] struct {
	Added   []K `json:"added,omitempty"`
	Removed []K `json:"removed,omitempty"`
	Changed []K `json:"changed,omitempty"`
}

// Empty reports whether nothing changed.
func (c Changes[K]) Empty() bool {
	return len(c.Added) == 0 && len(c.Removed) == 0 && len(c.Changed) == 0
}

// summary appends a line per key to out, "<what> <key> added" (removed, changed); the changed
// keys only with changed.
func (c Changes[K]) summary(out []string, what string, changed bool) []string {
	for _, k := range c.Added {
		out = append(out, fmt.Sprintf("%s %v added", what, k))
	}
	for _, k := range c.Removed {
		out = append(out, fmt.Sprintf("%s %v removed", what, k))
	}
	if changed {
		for _, k := range c.Changed {
			out = append(out, fmt.Sprintf("%s %v changed", what, k))
		}
	}
	return out
}

// TargetDiff is how one target present in both configurations changed.
type TargetDiff struct {
	Name string `json:"name"`
	// Settings: the transport, port ID, listen addresses, CM port or limits changed; the
	// target's listener and sessions must be restarted.
	Settings bool `json:"settings,omitempty"`
	// LUNs by ID; a changed LUN has a new backend or settings.
	LUNs Changes[int] `json:"luns"`
	// ACLs by initiator ("*" or the port ID).
	ACLs Changes[string] `json:"acls"`
}

// Changeset is what a reload has to apply to go from the old configuration to the new one.
type Changeset struct {
	// Transports by name. The daemon cannot swap a transport under live targets; a changed
	// transport means restarting what uses it.
	Transports Changes[string] `json:"transports"`
	// Targets by name; Targets.Changed names the targets described in TargetDiffs.
	Targets     Changes[string] `json:"targets"`
	TargetDiffs []TargetDiff    `json:"target_diffs,omitempty"`
	// Sessions (initiator connections) by name; a changed session reconnects.
	Sessions Changes[string] `json:"sessions"`
	// Multipath groups by name; a changed group (or one whose paths' sessions changed) is
	// started again.
	Multipath Changes[string] `json:"multipath"`
	// Control, Logging, Metrics, Limits: whether that section changed. New daemon-wide
	// limits apply to what is admitted next; nothing admitted is taken back.
	Control bool `json:"control,omitempty"`
	Logging bool `json:"logging,omitempty"`
	Metrics bool `json:"metrics,omitempty"`
	Limits  bool `json:"limits,omitempty"`
	// AllowedPaths: allowed_paths changed. The LUNs that follow symlinks are then listed as
	// changed too, so that they are opened (and their real paths checked) again.
	AllowedPaths bool `json:"allowed_paths,omitempty"`
}

// Empty reports whether the configurations are equivalent.
func (d *Changeset) Empty() bool {
	return d.Transports.Empty() && d.Targets.Empty() && d.Sessions.Empty() && d.Multipath.Empty() &&
		!d.Control && !d.Logging && !d.Metrics && !d.Limits && !d.AllowedPaths
}

// Target returns the diff of the changed target named name, or nil.
func (d *Changeset) Target(name string) *TargetDiff {
	for i := range d.TargetDiffs {
		if d.TargetDiffs[i].Name == name {
			return &d.TargetDiffs[i]
		}
	}
	return nil
}

// Summary describes the diff in one line per change, e.g. "target demo: LUN 1 added".
func (d *Changeset) Summary() []string {
	var out []string
	out = d.Transports.summary(out, "transport", true)
	out = d.Targets.summary(out, "target", false) // a changed target: the lines below
	for _, t := range d.TargetDiffs {
		if t.Settings {
			out = append(out, fmt.Sprintf("target %s: settings changed", t.Name))
		}
		out = t.LUNs.summary(out, "target "+t.Name+": LUN", true)
		out = t.ACLs.summary(out, "target "+t.Name+": ACL", true)
	}
	out = d.Sessions.summary(out, "session", true)
	out = d.Multipath.summary(out, "multipath", true)
	for _, s := range []struct {
		name    string
		changed bool
	}{{"control", d.Control}, {"logging", d.Logging}, {"metrics", d.Metrics}, {"limits", d.Limits},
		{"allowed_paths", d.AllowedPaths}} {
		if s.changed {
			out = append(out, s.name+" settings changed")
		}
	}
	return out
}

func (d *Changeset) String() string { return strings.Join(d.Summary(), "\n") }

// diffKeyed compares two lists of items identified by key.
func diffKeyed[T any, K comparable](old, new []T, key func(*T) K, same func(a, b *T) bool) (c Changes[K]) {
	idx := make(map[K]int, len(old))
	for i := range old {
		idx[key(&old[i])] = i
	}
	seen := make(map[K]bool, len(new))
	for i := range new {
		k := key(&new[i])
		seen[k] = true
		j, ok := idx[k]
		switch {
		case !ok:
			c.Added = append(c.Added, k)
		case !same(&old[j], &new[i]):
			c.Changed = append(c.Changed, k)
		}
	}
	for i := range old {
		if k := key(&old[i]); !seen[k] {
			c.Removed = append(c.Removed, k)
		}
	}
	return c
}

func deepEqual[T any](a, b *T) bool { return reflect.DeepEqual(a, b) }

// Diff tells which transports, targets (and within them LUNs and ACLs), sessions and
// sections differ from old to new, for a SIGHUP reload that applies only the difference. Both
// configurations should have their defaults applied.
func Diff(old, new *Config) *Changeset {
	d := &Changeset{
		Transports: diffKeyed(old.Transports, new.Transports, func(t *Transport) string { return t.Name }, deepEqual[Transport]),
		Sessions:   diffKeyed(old.Sessions, new.Sessions, func(s *Session) string { return s.Name }, deepEqual[Session]),
		Multipath:  diffKeyed(old.Multipath, new.Multipath, func(m *Multipath) string { return m.Name }, deepEqual[Multipath]),
		Control:    old.Control != new.Control,
		Logging:    old.Logging != new.Logging,
		Metrics:    old.Metrics != new.Metrics,
		Limits:     old.Limits != new.Limits,
	}
	d.AllowedPaths = !slices.Equal(old.AllowedPaths, new.AllowedPaths)
	d.Targets = diffKeyed(old.Targets, new.Targets, func(t *Target) string { return t.Name }, func(a, b *Target) bool {
		td := diffTarget(a, b)
		if d.AllowedPaths {
			recheckSymlinkLUNs(&td, b)
		}
		if !td.Settings && td.LUNs.Empty() && td.ACLs.Empty() {
			return true
		}
		d.TargetDiffs = append(d.TargetDiffs, td)
		return false
	})
	return d
}

func diffTarget(a, b *Target) TargetDiff {
	td := TargetDiff{
		Name: b.Name,
		Settings: a.Transport != b.Transport || a.PortID != b.PortID || !slices.Equal(a.Listen, b.Listen) ||
			a.CMPort != b.CMPort || !reflect.DeepEqual(a.Limits, b.Limits),
		LUNs: diffKeyed(a.LUNs, b.LUNs, func(l *LUN) int { return l.ID }, deepEqual[LUN]),
		ACLs: diffKeyed(a.ACLs, b.ACLs, func(x *ACL) string { return x.Initiator.String() }, deepEqual[ACL]),
	}
	if !reflect.DeepEqual(a.ALUA, b.ALUA) {
		// The LUNs were created with the old target port groups: all of them are opened
		// again with the new ones.
		td.Settings = true
		for _, l := range b.LUNs {
			if !slices.Contains(td.LUNs.Added, l.ID) && !slices.Contains(td.LUNs.Changed, l.ID) {
				td.LUNs.Changed = append(td.LUNs.Changed, l.ID)
			}
		}
	}
	return td
}

// recheckSymlinkLUNs lists as changed the LUNs of t that follow symlinks: their real paths,
// which only opening tells, must be checked against the new allowed_paths. (The others lie
// beneath it by name, which Validate checks, and have no symlink on the way.)
func recheckSymlinkLUNs(td *TargetDiff, t *Target) {
	for _, l := range t.LUNs {
		if !l.FollowSymlinks || l.Path == "" || slices.Contains(td.LUNs.Added, l.ID) || slices.Contains(td.LUNs.Changed, l.ID) {
			continue
		}
		td.LUNs.Changed = append(td.LUNs.Changed, l.ID)
	}
}
