package config

import (
	"errors"
	"strings"
	"testing"
)

const aluaTarget = `
transports:
  - name: lo
    address: 127.0.0.1
targets:
  - name: t
    port_id: 0x00000000000000010000000000000001
    alua:
      group: 1
      relative_port: 1
      state: active/optimized
      peers:
        - group: 2
          relative_ports: [2]
          state: active/non-optimized
    luns:
      - id: 0
        backend: ram
        size: 64MiB
        naa: 6001405abcdef0123456789abcdef012
        alua_states:
          - group: 2
            state: standby
    acls:
      - initiator: "*"
`

func TestALUAConfig(t *testing.T) {
	c := mustParse(t, aluaTarget)
	a := c.Targets[0].ALUA
	if a == nil || a.Group != 1 || a.RelativePort != 1 || len(a.Peers) != 1 || a.Peers[0].RelativePorts[0] != 2 {
		t.Fatalf("%+v", a)
	}
	l := c.Targets[0].LUNs[0]
	if l.NAA != "6001405abcdef0123456789abcdef012" || len(l.ALUAStates) != 1 || l.ALUAStates[0].State != ALUAStandby {
		t.Fatalf("%+v", l)
	}
	naa, err := ParseNAA(l.NAA)
	if err != nil || naa[0] != 0x60 || naa[15] != 0x12 {
		t.Fatalf("%x %v", naa, err)
	}
	for _, c := range []struct{ from, to, msg string }{
		{"state: active/optimized", "state: asleep", "must be one of"},
		{"relative_port: 1", "relative_port: 0", "out of range"},
		{"relative_ports: [2]", "relative_ports: [1]", "listed twice"},
		{"- group: 2\n          relative_ports", "- group: 1\n          relative_ports", "listed twice"},
		{"naa: 6001405abcdef0123456789abcdef012", "naa: 5001405abcdef0123456789abcdef012", "must start with 6"},
		{"naa: 6001405abcdef0123456789abcdef012", "naa: 6001", "32 hexadecimal digits"},
		{"- group: 2\n            state: standby", "- group: 3\n            state: standby", "not in the target's alua"},
	} {
		src := strings.Replace(aluaTarget, c.from, c.to, 1)
		if src == aluaTarget {
			t.Fatalf("%q not in the test config", c.from)
		}
		_, err := Parse("test.yaml", []byte(src))
		if err == nil || !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrDuplicate) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v", c.to, err)
		}
	}
}

// TestALUADiff: a changed alua section restarts the target and reopens every LUN, which were
// created with the old groups.
func TestALUADiff(t *testing.T) {
	old := mustParse(t, aluaTarget)
	new := mustParse(t, strings.Replace(aluaTarget, "state: active/non-optimized", "state: standby", 1))
	d := Diff(old, new)
	td := d.Target("t")
	if td == nil || !td.Settings || len(td.LUNs.Changed) != 1 {
		t.Fatalf("%+v", d)
	}
	if d := Diff(old, mustParse(t, aluaTarget)); !d.Empty() {
		t.Fatalf("same config: %v", d)
	}
}
