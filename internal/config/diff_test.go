package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

const diffBase = `
transports:
  - name: lo
    address: 127.0.0.1
targets:
  - name: a
    port_id: 00000000000000010000000000000001
    luns:
      - {id: 0, backend: ram, size: 1MiB}
      - {id: 1, backend: ram, size: 1MiB}
    acls:
      - initiator: 00000000000000000000000000000009
        luns: [0]
  - name: b
    port_id: 00000000000000010000000000000002
sessions:
  - name: s
    address: 127.0.0.1
    target_port_id: 00000000000000010000000000000001
`

func TestDiff(t *testing.T) {
	old := mustParse(t, diffBase)
	if d := Diff(old, old.Clone()); !d.Empty() || len(d.Summary()) != 0 {
		t.Fatalf("diff of equal configs: %+v", d)
	}

	nw := old.Clone()
	a := nw.Target("a")
	a.LUNs[1].Size = 2 << 20                                           // LUN 1 changed
	a.LUNs = append(a.LUNs, LUN{ID: 5, Backend: "ram", Size: 1 << 20}) // LUN 5 added
	a.LUNs = slices.Delete(a.LUNs, 0, 1)                               // LUN 0 removed
	a.ACLs[0].LUNs = nil                                               // ACL changed
	a.ACLs = append(a.ACLs, ACL{Initiator: AnyInitiator, ReadOnly: true})
	if err := nw.RemoveTarget("b"); err != nil {
		t.Fatal(err)
	}
	if err := nw.AddTarget(Target{Name: "c", PortID: MakePortID(1, 3)}); err != nil {
		t.Fatal(err)
	}
	nw.Sessions[0].ChCount = 4
	nw.Logging.Level = "debug"
	nw.SetDefaults()
	if err := nw.Validate(); err != nil {
		t.Fatal(err)
	}

	d := Diff(old, nw)
	if !reflect.DeepEqual(d.Targets, Changes[string]{Added: []string{"c"}, Removed: []string{"b"}, Changed: []string{"a"}}) {
		t.Errorf("targets: %+v", d.Targets)
	}
	td := d.Target("a")
	if td == nil || td.Settings {
		t.Fatalf("target a diff: %+v", td)
	}
	if !reflect.DeepEqual(td.LUNs, Changes[int]{Added: []int{5}, Removed: []int{0}, Changed: []int{1}}) {
		t.Errorf("LUNs: %+v", td.LUNs)
	}
	if !reflect.DeepEqual(td.ACLs, Changes[string]{Added: []string{"*"}, Changed: []string{"0x00000000000000000000000000000009"}}) {
		t.Errorf("ACLs: %+v", td.ACLs)
	}
	if !reflect.DeepEqual(d.Sessions, Changes[string]{Changed: []string{"s"}}) || !d.Logging || d.Control || d.Metrics {
		t.Errorf("diff %+v", d)
	}
	sum := d.String()
	for _, want := range []string{"target c added", "target b removed", "target a: LUN 5 added", "target a: LUN 0 removed",
		"target a: LUN 1 changed", "target a: ACL * added", "session s changed", "logging settings changed"} {
		if !strings.Contains(sum, want) {
			t.Errorf("summary lacks %q:\n%s", want, sum)
		}
	}

	// A limit change is a settings change of the target.
	nw2 := old.Clone()
	nw2.Target("b").Limits.QueueDepth = 16
	if td := Diff(old, nw2).Target("b"); td == nil || !td.Settings {
		t.Errorf("limits change: %+v", td)
	}
}

func TestMutations(t *testing.T) {
	c := mustParse(t, diffBase)
	checks := []struct {
		name string
		err  error
		want error
	}{
		{"add existing target", c.AddTarget(Target{Name: "a"}), ErrExists},
		{"remove missing target", c.RemoveTarget("zz"), ErrNotFound},
		{"add LUN to missing target", c.AddLUN("zz", LUN{}), ErrNotFound},
		{"add existing LUN", c.AddLUN("a", LUN{ID: 1}), ErrExists},
		{"remove LUN named by an ACL", c.RemoveLUN("a", 0), ErrInUse},
		{"remove missing LUN", c.RemoveLUN("a", 7), ErrNotFound},
		{"add existing ACL", c.AddACL("a", ACL{Initiator: InitiatorID{ID: MakePortID(0, 9)}}), ErrExists},
		{"remove missing ACL", c.RemoveACL("a", AnyInitiator), ErrNotFound},
		{"add existing session", c.AddSession(Session{Name: "s"}), ErrExists},
		{"remove missing session", c.RemoveSession("zz"), ErrNotFound},
	}
	for _, ck := range checks {
		if !errors.Is(ck.err, ck.want) {
			t.Errorf("%s: %v, want %v", ck.name, ck.err, ck.want)
		}
	}
	for _, err := range []error{
		c.RemoveLUN("a", 1), c.AddLUN("a", LUN{ID: 2, Backend: "ram", Size: 1 << 20}),
		c.AddACL("a", ACL{Initiator: AnyInitiator}), c.RemoveACL("a", InitiatorID{ID: MakePortID(0, 9)}),
		c.RemoveLUN("a", 0), c.RemoveSession("s"), c.AddSession(Session{Name: "s2", Address: "h", TargetPortID: MakePortID(1, 1)}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	a := c.Target("a")
	if len(a.LUNs) != 1 || a.LUNs[0].ID != 2 || len(a.ACLs) != 1 || !a.ACLs[0].Initiator.Any || c.Session("s2") == nil {
		t.Fatalf("after mutations: %+v %+v", a, c.Sessions)
	}
}

func TestAdmit(t *testing.T) {
	tg := &Target{ACLs: []ACL{{Initiator: AnyInitiator, ReadOnly: true}, {Initiator: InitiatorID{ID: MakePortID(0, 5)}, LUNs: []int{2}}}}
	if a := tg.Admit(MakePortID(0, 5)); a == nil || a.ReadOnly || !a.Visible(2) || a.Visible(1) {
		t.Errorf("named initiator: %+v", a)
	}
	if a := tg.Admit(MakePortID(0, 6)); a == nil || !a.ReadOnly || !a.Visible(1) {
		t.Errorf("other initiator: %+v", a)
	}
	tg.ACLs = tg.ACLs[1:]
	if a := tg.Admit(MakePortID(0, 6)); a != nil {
		t.Errorf("without *: %+v", a)
	}
}

func TestCloneIsDeep(t *testing.T) {
	c := mustParse(t, diffBase)
	cp := c.Clone()
	cp.Targets[0].LUNs[0].Size = 1
	cp.Targets[0].ACLs[0].LUNs[0] = 1
	*cp.Targets[0].Limits.ImmediateData = false
	cp.Sessions[0].ReconnectDelay = TimeoutOff()
	if c.Targets[0].LUNs[0].Size == 1 || c.Targets[0].ACLs[0].LUNs[0] == 1 || !*c.Targets[0].Limits.ImmediateData ||
		c.Sessions[0].ReconnectDelay.Off() {
		t.Fatal("Clone shares memory with the original")
	}
}

func TestAtomicWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "srpd.yaml")
	c := mustParse(t, diffBase)
	if err := Save(path, c, 0o640); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("new file: %v %v", fi.Mode(), err)
	}
	back, err := Load(path)
	if err != nil || !Equal(c, back) {
		t.Fatalf("Load(Save(c)) = %v", err)
	}
	// Replacing keeps the existing mode and leaves no temporary file behind.
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := AtomicWrite(path, []byte("version: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fi, _ = os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode after replace: %v", fi.Mode())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want 1: %v", len(entries), entries)
	}
	// Failures name the path and leave nothing behind.
	if err := AtomicWrite(filepath.Join(dir, "missing", "x.yaml"), nil, 0o600); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("write into a missing directory: %v", err)
	}
	if err := AtomicWrite(dir, nil, 0o600); err == nil {
		t.Error("writing over a directory succeeded")
	}
	if _, err := Load(filepath.Join(dir, "nope.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v", err)
	}
}
