package daemon

import (
	"errors"
	"fmt"
	"testing"

	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
)

// TestALUAControl changes a target port group's state over the control API: every LUN (or one)
// of the target takes it, GET reports it, and a bad group, state, LUN or a target without
// alua are refused with the right codes.
func TestALUAControl(t *testing.T) {
	dir := testutil.ShortTempDir(t, "srpd-alua-")
	src := testutil.LoopbackConfig(testutil.FreeUDPPort(t)) + fmt.Sprintf(`targets:
  - name: gw
    port_id: %s
    alua:
      group: 1
      relative_port: 1
      peers:
        - group: 2
          relative_ports: [2]
          state: standby
    luns:
      - id: 0
        backend: ram
        size: 4MiB
      - id: 1
        backend: ram
        size: 4MiB
        alua_states:
          - group: 2
            state: active/non-optimized
  - name: plain
    port_id: %s
    cm_port: 5556
    luns:
      - id: 0
        backend: ram
        size: 4MiB
control:
  socket: %s/ctl.sock
`, portA, portB, dir)
	h := startHarnessWith(t, dir, src)
	ls, err := h.c.GetALUA(h.ctx(), "gw")
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 2 || ls[0].Groups[0].State != "active/optimized" || !ls[0].Groups[0].Local ||
		ls[0].Groups[1].State != "standby" || ls[1].Groups[1].State != "active/non-optimized" ||
		ls[1].Groups[1].RelativePorts[0] != 2 {
		t.Fatalf("%+v", ls)
	}
	ls, err = h.c.SetALUA(h.ctx(), "gw", ctlapi.ALUAChange{Group: 1, State: "standby"})
	if err != nil {
		t.Fatal(err)
	}
	if ls[0].Groups[0].State != "standby" || ls[1].Groups[0].State != "standby" {
		t.Fatalf("%+v", ls)
	}
	one := 1
	ls, err = h.c.SetALUA(h.ctx(), "gw", ctlapi.ALUAChange{Group: 1, State: "active/optimized", LUN: &one})
	if err != nil || ls[0].Groups[0].State != "standby" || ls[1].Groups[0].State != "active/optimized" {
		t.Fatalf("%+v %v", ls, err)
	}
	nine := 9
	for _, c := range []struct {
		target string
		ch     ctlapi.ALUAChange
		want   error
	}{
		{"gw", ctlapi.ALUAChange{Group: 3, State: "standby"}, ctlapi.ErrNotFound},
		{"gw", ctlapi.ALUAChange{Group: 1, State: "asleep"}, ctlapi.ErrInvalidArgument},
		{"gw", ctlapi.ALUAChange{Group: 1, State: "standby", LUN: &nine}, ctlapi.ErrNotFound},
		{"plain", ctlapi.ALUAChange{Group: 1, State: "standby"}, ctlapi.ErrInvalidArgument},
		{"nope", ctlapi.ALUAChange{Group: 1, State: "standby"}, ctlapi.ErrNotFound},
	} {
		if _, err := h.c.SetALUA(h.ctx(), c.target, c.ch); !errors.Is(err, c.want) {
			t.Errorf("%s %+v: %v, want %v", c.target, c.ch, err, c.want)
		}
	}
}
