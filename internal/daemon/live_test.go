package daemon

import (
	"errors"
	"testing"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

// TestLiveChangesInProcess: LUN and ACL changes through the control API keep the session on
// target a (same ID and login time) — except removing the ACL that admitted it.
func TestLiveChangesInProcess(t *testing.T) {
	h := startHarness(t)
	ctx := h.ctx()
	s0 := h.waitSessions("a", 1)[0]
	same := func(when string) {
		t.Helper()
		ss := h.waitSessions("a", 1)
		if ss[0].ID != s0.ID || !ss[0].LoginAt.Equal(s0.LoginAt) {
			t.Fatalf("%s: session %+v, want %s logged in at %v", when, ss[0], s0.ID, s0.LoginAt)
		}
	}
	size := func(s config.Size) *config.Size { return &s }
	yes, no := true, false

	li, err := h.c.UpdateLUN(ctx, "a", 0, ctlapi.LUNUpdate{Size: size(8 << 20)}, ctlapi.MutateOptions{})
	if err != nil || li.Capacity != 8<<20 || li.Size != 8<<20 {
		t.Fatalf("grow: %+v, %v", li, err)
	}
	if _, err := h.c.UpdateLUN(ctx, "a", 0, ctlapi.LUNUpdate{Size: size(2 << 20)}, ctlapi.MutateOptions{}); !errors.Is(err, ctlapi.ErrInvalidArgument) {
		t.Fatalf("shrink: %v", err)
	}
	if _, err := h.c.UpdateLUN(ctx, "a", 0, ctlapi.LUNUpdate{Size: size(1 << 40)}, ctlapi.MutateOptions{}); !errors.Is(err, ctlapi.ErrInvalidArgument) {
		t.Fatalf("beyond what a RAM LUN can grow to: %v", err)
	}
	if li, err = h.c.UpdateLUN(ctx, "a", 0, ctlapi.LUNUpdate{Rescan: true}, ctlapi.MutateOptions{}); err != nil || li.Capacity != 8<<20 {
		t.Fatalf("rescan: %+v, %v", li, err)
	}
	if li, err = h.c.UpdateLUN(ctx, "a", 0, ctlapi.LUNUpdate{ReadOnly: &yes}, ctlapi.MutateOptions{}); err != nil || !li.ReadOnly {
		t.Fatalf("read-only: %+v, %v", li, err)
	}
	if li, err = h.c.UpdateLUN(ctx, "a", 0, ctlapi.LUNUpdate{ReadOnly: &no}, ctlapi.MutateOptions{}); err != nil || li.ReadOnly {
		t.Fatalf("read-write: %+v, %v", li, err)
	}
	if _, err := h.c.UpdateLUN(ctx, "a", 9, ctlapi.LUNUpdate{Rescan: true}, ctlapi.MutateOptions{}); !errors.Is(err, ctlapi.ErrNotFound) {
		t.Fatalf("rescan of a missing LUN: %v", err)
	}
	if _, err := h.c.AddLUN(ctx, "a", config.LUN{ID: 1, Backend: config.BackendRAM, Size: 1 << 20}, ctlapi.MutateOptions{}); err != nil {
		t.Fatal(err)
	}
	same("after the LUN changes")
	ti, err := h.c.GetTarget(ctx, "a")
	if err != nil || len(ti.LUNs) != 2 || ti.LUNs[0].Capacity != 8<<20 || ti.LUNs[1].State != ctlapi.StateUp {
		t.Fatalf("target a: %+v, %v", ti, err)
	}

	other, _ := config.ParseInitiatorID("0x00000000000000090000ffff7f000009")
	if _, err := h.c.AddACL(ctx, "a", config.ACL{Initiator: other, LUNs: []int{1}}, ctlapi.MutateOptions{}); err != nil {
		t.Fatal(err)
	}
	ai, err := h.c.UpdateACL(ctx, "a", config.ACL{Initiator: other, LUNs: []int{0}, ReadOnly: true}, ctlapi.MutateOptions{})
	if err != nil || !ai.ReadOnly || len(ai.LUNs) != 1 || ai.LUNs[0] != 0 {
		t.Fatalf("acl set: %+v, %v", ai, err)
	}
	if err := h.c.RemoveACL(ctx, "a", other, ctlapi.MutateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.UpdateACL(ctx, "a", config.ACL{Initiator: other}, ctlapi.MutateOptions{}); !errors.Is(err, ctlapi.ErrNotFound) {
		t.Fatalf("acl set of a missing ACL: %v", err)
	}
	if err := h.c.RemoveLUN(ctx, "a", 1, ctlapi.MutateOptions{}); err != nil {
		t.Fatal(err)
	}
	same("after the ACL changes and the LUN removal")

	// The ACL that admitted the session goes: the session is logged out (and may not return).
	if err := h.c.RemoveACL(ctx, "a", config.AnyInitiator, ctlapi.MutateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitSessions("a", 0)
	if ti, err := h.c.GetTarget(ctx, "a"); err != nil || ti.State != ctlapi.StateListening {
		t.Fatalf("target a after its ACL went: %+v, %v", ti, err)
	}
}
