package config

import (
	"reflect"
	"testing"
)

func TestPlanTarget(t *testing.T) {
	ini := InitiatorID{ID: MakePortID(1, 2)}
	other := InitiatorID{ID: MakePortID(3, 4)}
	base := func() Target {
		return Target{Name: "t1", Transport: "lo", PortID: MakePortID(0x11, 0x11), CMPort: 5555,
			LUNs: []LUN{
				{ID: 0, Backend: BackendRAM, Size: 8 << 20, BlockSize: 512},
				{ID: 1, Backend: BackendFile, Path: "/srv/lun1.img", Size: 16 << 20, Create: true, BlockSize: 512},
			},
			ACLs:   []ACL{{Initiator: ini, LUNs: []int{0, 1}}},
			Limits: Limits{QueueDepth: 64, MaxChannels: 4},
		}
	}
	tests := []struct {
		name    string
		change  func(t *Target)
		recheck []int
		restart []string
		ops     []LiveOp
	}{
		{name: "nothing", change: func(*Target) {}},
		{name: "port id", change: func(t *Target) { t.PortID = MakePortID(0x12, 0x12) }, restart: []string{"port_id changed"}},
		{name: "listen and cm port", change: func(t *Target) { t.Listen = []string{"10.0.0.1"}; t.CMPort = 5556 },
			restart: []string{"listen changed", "cm_port changed"}},
		{name: "transport", change: func(t *Target) { t.Transport = "eth" }, restart: []string{"transport changed"}},
		{name: "limits: live, for new logins", change: func(t *Target) { t.Limits.QueueDepth = 128 },
			ops: []LiveOp{{Kind: LimitsChange, Detail: "new logins negotiate them"}}},
		{name: "alua: every LUN reopened", change: func(t *Target) { t.ALUA = &ALUA{Group: 1} },
			ops: []LiveOp{{Kind: LUNReopen, LUN: 0, Detail: "alua changed"}, {Kind: LUNReopen, LUN: 1, Detail: "alua changed"}}},
		{name: "restart wins over live changes", change: func(t *Target) { t.PortID = MakePortID(9, 9); t.LUNs = t.LUNs[:1] },
			restart: []string{"port_id changed"}},
		{name: "LUN added", change: func(t *Target) {
			t.LUNs = append(t.LUNs, LUN{ID: 2, Backend: BackendRAM, Size: 1 << 20, BlockSize: 512})
		}, ops: []LiveOp{{Kind: LUNAdd, LUN: 2, Detail: "ram"}}},
		{name: "LUN removed", change: func(t *Target) { t.LUNs = t.LUNs[:1]; t.ACLs[0].LUNs = []int{0} },
			ops: []LiveOp{{Kind: ACLChange, ACL: ini.String()}, {Kind: LUNRemove, LUN: 1}}},
		{name: "grown", change: func(t *Target) { t.LUNs[1].Size = 32 << 20 },
			ops: []LiveOp{{Kind: LUNResize, LUN: 1, Detail: "16MiB → 32MiB"}}},
		{name: "size omitted: the file keeps its size", change: func(t *Target) { t.LUNs[1].Size = 0 }},
		{name: "create flag only", change: func(t *Target) { t.LUNs[1].Create = false }},
		{name: "read-only", change: func(t *Target) { t.LUNs[0].ReadOnly = true },
			ops: []LiveOp{{Kind: LUNReadOnly, LUN: 0, Detail: "read-only"}}},
		{name: "resized and read-only", change: func(t *Target) { t.LUNs[0].Size = 16 << 20; t.LUNs[0].ReadOnly = true },
			ops: []LiveOp{{Kind: LUNResize, LUN: 0, Detail: "8MiB → 16MiB"}, {Kind: LUNReadOnly, LUN: 0, Detail: "read-only"}}},
		{name: "new path: reopened", change: func(t *Target) { t.LUNs[1].Path = "/srv/other.img" },
			ops: []LiveOp{{Kind: LUNReopen, LUN: 1, Detail: "backend or identity changed"}}},
		{name: "new serial: reopened", change: func(t *Target) { t.LUNs[0].Serial = "S0" },
			ops: []LiveOp{{Kind: LUNReopen, LUN: 0, Detail: "backend or identity changed"}}},
		{name: "allowed_paths recheck", change: func(*Target) {}, recheck: []int{1},
			ops: []LiveOp{{Kind: LUNReopen, LUN: 1, Detail: "allowed_paths changed"}}},
		{name: "ACL added and removed", change: func(t *Target) { t.ACLs = []ACL{{Initiator: other}} },
			ops: []LiveOp{{Kind: ACLAdd, ACL: other.String()}, {Kind: ACLRemove, ACL: ini.String()}}},
		{name: "ACL read-only", change: func(t *Target) { t.ACLs[0].ReadOnly = true },
			ops: []LiveOp{{Kind: ACLChange, ACL: ini.String()}}},
		{name: "any ACL", change: func(t *Target) { t.ACLs = append(t.ACLs, ACL{Initiator: AnyInitiator}) },
			ops: []LiveOp{{Kind: ACLAdd, ACL: "*"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			old, new := base(), base()
			tc.change(&new)
			p := PlanTarget(&old, &new, tc.recheck...)
			if p.Name != "t1" || p.Restart != (tc.restart != nil) || !reflect.DeepEqual(p.Why, tc.restart) {
				t.Fatalf("restart %v %q; want %q", p.Restart, p.Why, tc.restart)
			}
			if p.Restart && len(p.Ops) != 0 {
				t.Fatalf("a restart with live ops %v", p.Ops)
			}
			if !reflect.DeepEqual(p.Ops, tc.ops) {
				t.Fatalf("ops\n got %v\nwant %v", p.Ops, tc.ops)
			}
			if p.Empty() != (tc.restart == nil && tc.ops == nil) {
				t.Fatalf("Empty() = %v", p.Empty())
			}
		})
	}
}

func TestPlanTargetsSummary(t *testing.T) {
	c := func(size Size, port uint64) *Config {
		return &Config{Targets: []Target{
			{Name: "a", PortID: MakePortID(1, 1), LUNs: []LUN{{ID: 0, Backend: BackendRAM, Size: size}}},
			{Name: "b", PortID: MakePortID(port, 2)},
			{Name: "c", PortID: MakePortID(3, 3)},
		}}
	}
	plans := PlanTargets(c(1<<20, 2), c(2<<20, 7))
	var lines []string
	for _, p := range plans {
		lines = append(lines, p.Summary()...)
	}
	want := []string{"target a: lun-resize 0 (1MiB → 2MiB)", "target b: restart (port_id changed)"}
	if !reflect.DeepEqual(lines, want) {
		t.Fatalf("summary\n got %q\nwant %q", lines, want)
	}
}
