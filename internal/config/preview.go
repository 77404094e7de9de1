package config

import "slices"

// ReloadPreview is what re-reading the configuration file would do to a running daemon.
type ReloadPreview struct {
	// Changes go from the running configuration to the file's (Diff(running, file)).
	Changes *Changeset `json:"changes"`
	// Discarded are the run-time changes (made through the control API without persisting
	// them: Diff(loaded, running)) that the reload would undo: those to an object (transport,
	// target, LUN, ACL, session, section) that Changes touches.
	Discarded *Changeset `json:"discarded"`
	// Unsaved are all the run-time changes not in the file, discarded or not.
	Unsaved *Changeset `json:"unsaved"`
}

// PreviewReload compares three configurations, defaults applied: loaded, the file as the
// daemon last read or wrote it; running, what runs now; file, what the file holds now.
func PreviewReload(loaded, running, file *Config) *ReloadPreview {
	changes := Diff(running, file)
	unsaved := Diff(loaded, running)
	return &ReloadPreview{Changes: changes, Discarded: unsaved.Overlap(changes), Unsaved: unsaved}
}

// Overlap returns the changes of d to the objects that o changes too (in any way: added,
// removed or changed): for d the run-time changes and o a reload, those the reload undoes. A
// target o adds or removes takes all of d's changes to it; otherwise d's changes to a
// target's LUNs and ACLs count where o changes that LUN or ACL, and its settings where o
// changes the target's settings.
func (d *Changeset) Overlap(o *Changeset) *Changeset {
	out := &Changeset{
		Transports:   overlapKeys(d.Transports, o.Transports.all()),
		Sessions:     overlapKeys(d.Sessions, o.Sessions.all()),
		Control:      d.Control && o.Control,
		Logging:      d.Logging && o.Logging,
		Metrics:      d.Metrics && o.Metrics,
		Limits:       d.Limits && o.Limits,
		AllowedPaths: d.AllowedPaths && o.AllowedPaths,
	}
	whole := append(slices.Clone(o.Targets.Added), o.Targets.Removed...)
	out.Targets = overlapKeys(Changes[string]{Added: d.Targets.Added, Removed: d.Targets.Removed}, append(whole, o.Targets.Changed...))
	for _, td := range d.TargetDiffs {
		if slices.Contains(whole, td.Name) {
			out.Targets.Changed = append(out.Targets.Changed, td.Name)
			out.TargetDiffs = append(out.TargetDiffs, td)
			continue
		}
		ot := o.Target(td.Name)
		if ot == nil {
			continue
		}
		x := TargetDiff{Name: td.Name, Settings: td.Settings && ot.Settings,
			LUNs: overlapKeys(td.LUNs, ot.LUNs.all()), ACLs: overlapKeys(td.ACLs, ot.ACLs.all())}
		if x.Settings || !x.LUNs.Empty() || !x.ACLs.Empty() {
			out.Targets.Changed = append(out.Targets.Changed, td.Name)
			out.TargetDiffs = append(out.TargetDiffs, x)
		}
	}
	return out
}

// all returns every key of c.
func (c Changes[K]) all() []K {
	return slices.Concat(c.Added, c.Removed, c.Changed)
}

// overlapKeys keeps the entries of c whose key is in keys.
func overlapKeys[K comparable](c Changes[K], keys []K) Changes[K] {
	keep := func(xs []K) []K {
		var out []K
		for _, x := range xs {
			if slices.Contains(keys, x) {
				out = append(out, x)
			}
		}
		return out
	}
	return Changes[K]{Added: keep(c.Added), Removed: keep(c.Removed), Changed: keep(c.Changed)}
}
