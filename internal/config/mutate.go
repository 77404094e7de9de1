package config

import (
	"fmt"
	"slices"
)

// The mutation helpers edit a Config the way the control API does (target create, lun add, acl
// remove, connect, ...). They check identity only (ErrNotFound, ErrExists, ErrInUse); the
// caller applies them to a Clone, then runs SetDefaults and Validate on the result before
// making it the running (and, with persist, saved) configuration.

// AddTarget appends t.
func (c *Config) AddTarget(t Target) error {
	if c.Target(t.Name) != nil {
		return fmt.Errorf("target %q: %w", t.Name, ErrExists)
	}
	c.Targets = append(c.Targets, *t.Clone())
	return nil
}

// RemoveTarget removes the target named name.
func (c *Config) RemoveTarget(name string) error {
	return remove(&c.Targets, func(t Target) bool { return t.Name == name }, fmt.Sprintf("target %q", name))
}

// remove deletes the first element of *xs that is, or fails with ErrNotFound for what.
func remove[T any](xs *[]T, is func(T) bool, what string) error {
	i := slices.IndexFunc(*xs, is)
	if i < 0 {
		return fmt.Errorf("%s: %w", what, ErrNotFound)
	}
	*xs = slices.Delete(*xs, i, i+1)
	return nil
}

func (c *Config) mustTarget(name string) (*Target, error) {
	if t := c.Target(name); t != nil {
		return t, nil
	}
	return nil, fmt.Errorf("target %q: %w", name, ErrNotFound)
}

// AddLUN adds l to the target named target.
func (c *Config) AddLUN(target string, l LUN) error {
	t, err := c.mustTarget(target)
	if err != nil {
		return err
	}
	if t.LUN(l.ID) != nil {
		return fmt.Errorf("target %q: LUN %d: %w", target, l.ID, ErrExists)
	}
	t.LUNs = append(t.LUNs, l)
	return nil
}

// RemoveLUN removes LUN id from the target. A LUN that an ACL lists is ErrInUse: dropping it
// from the ACL could leave the ACL with no LUN list, which means every LUN.
func (c *Config) RemoveLUN(target string, id int) error {
	t, err := c.mustTarget(target)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(t.LUNs, func(l LUN) bool { return l.ID == id })
	if i < 0 {
		return fmt.Errorf("target %q: LUN %d: %w", target, id, ErrNotFound)
	}
	for _, a := range t.ACLs {
		if slices.Contains(a.LUNs, id) {
			return fmt.Errorf("target %q: LUN %d is listed by the ACL of %s; remove it there first: %w",
				target, id, a.Initiator, ErrInUse)
		}
	}
	t.LUNs = slices.Delete(t.LUNs, i, i+1)
	return nil
}

// AddACL adds a to the target.
func (c *Config) AddACL(target string, a ACL) error {
	t, err := c.mustTarget(target)
	if err != nil {
		return err
	}
	if t.ACL(a.Initiator) != nil {
		return fmt.Errorf("target %q: ACL for %s: %w", target, a.Initiator, ErrExists)
	}
	a.LUNs = slices.Clone(a.LUNs)
	t.ACLs = append(t.ACLs, a)
	return nil
}

// RemoveACL removes the ACL of ini from the target.
func (c *Config) RemoveACL(target string, ini InitiatorID) error {
	t, err := c.mustTarget(target)
	if err != nil {
		return err
	}
	return remove(&t.ACLs, func(a ACL) bool { return a.Initiator == ini }, fmt.Sprintf("target %q: ACL for %s", target, ini))
}

// AddSession appends s.
func (c *Config) AddSession(s Session) error {
	if c.Session(s.Name) != nil {
		return fmt.Errorf("session %q: %w", s.Name, ErrExists)
	}
	c.Sessions = append(c.Sessions, *s.Clone())
	return nil
}

// RemoveSession removes the session named name.
func (c *Config) RemoveSession(name string) error {
	return remove(&c.Sessions, func(s Session) bool { return s.Name == name }, fmt.Sprintf("session %q", name))
}
