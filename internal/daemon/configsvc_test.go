package daemon

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
)

// TestConfigService: --persist adds only the change to a commented file; a run-time change is
// listed as unsaved, a reload preview says it would be discarded, a guarded reload refuses,
// config save writes it (comments kept) and a reload then discards nothing; save refuses to
// overwrite edits of the file that were not loaded.
func TestConfigService(t *testing.T) {
	dir := testutil.ShortTempDir(t, "srpd-d-")
	src := "# operator's notes\n" + strings.Replace(testConfig(dir, testutil.FreeUDPPort(t)),
		"    cm_port: 5556\n", "    cm_port: 5556          # b listens beside a\n", 1)
	h := startHarnessWith(t, dir, src)
	ini, _ := config.ParseInitiatorID("0x00000000000000090000000000000009")

	// --persist: the file gets the ACL's one line, nothing else changes.
	if _, err := h.c.AddACL(h.ctx(), "b", config.ACL{Initiator: ini}, ctlapi.MutateOptions{Persist: true}); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(h.path)
	want := strings.Replace(src, "        size: 4MiB\nsessions:", "        size: 4MiB\n    acls:\n      - initiator: 0x00000000000000090000000000000009\nsessions:", 1)
	if string(data) != want {
		t.Fatalf("after acl add --persist the file is\n%s\nwant\n%s", data, want)
	}

	// A run-time change.
	if _, err := h.c.AddLUN(h.ctx(), "b", config.LUN{ID: 1, Backend: config.BackendRAM, Size: 1 << 20}, ctlapi.MutateOptions{}); err != nil {
		t.Fatal(err)
	}
	info, err := h.c.RunningConfig(h.ctx())
	if err != nil || !slices.Equal(info.Unsaved, []string{"target b: LUN 1 added"}) || info.Config.Target("b").LUN(1) == nil || info.Path != h.path {
		t.Fatalf("running config: %+v, %v", info, err)
	}
	res, err := h.c.ReloadWith(h.ctx(), ctlapi.ReloadOptions{DryRun: true})
	if err != nil || !res.DryRun || !slices.Equal(res.Changes, []string{"target b: LUN 1 removed"}) ||
		!slices.Equal(res.Discarded, []string{"target b: LUN 1 added"}) {
		t.Fatalf("dry run: %+v, %v", res, err)
	}
	if _, err := h.c.ReloadWith(h.ctx(), ctlapi.ReloadOptions{RefuseDiscard: true}); !errors.Is(err, ctlapi.ErrConflict) ||
		!strings.Contains(err.Error(), "target b: LUN 1 added") {
		t.Fatalf("guarded reload: %v", err)
	}
	if h.d.Config().Target("b").LUN(1) == nil {
		t.Fatal("a refused reload discarded the LUN")
	}

	// Saved: the LUN reaches the file, the comments stay, nothing is unsaved any more.
	saved, err := h.c.SaveConfig(h.ctx(), ctlapi.SaveOptions{})
	if err != nil || !slices.Equal(saved.Changes, []string{"target b: LUN 1 added"}) {
		t.Fatalf("save: %+v, %v", saved, err)
	}
	data, _ = os.ReadFile(h.path)
	for _, w := range []string{"# operator's notes\n", "cm_port: 5556          # b listens beside a\n", "      - id: 1\n        backend: ram\n        size: 1MiB\n"} {
		if !strings.Contains(string(data), w) {
			t.Errorf("saved file lacks %q:\n%s", w, data)
		}
	}
	if strings.Contains(string(data), "block_size") || len(data) != saved.Bytes {
		t.Errorf("saved file (%d bytes, said %d) holds defaults:\n%s", len(data), saved.Bytes, data)
	}
	if res, err := h.c.ReloadWith(h.ctx(), ctlapi.ReloadOptions{RefuseDiscard: true}); err != nil || len(res.Changes) != 0 {
		t.Fatalf("reload after save: %+v, %v", res, err)
	}

	// An edit of the file nobody loaded is not overwritten by save, unless forced.
	edited := strings.Replace(string(data), "    reconnect_delay: 1s\n", "    reconnect_delay: 2s\n", 1)
	if err := os.WriteFile(h.path, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.SaveConfig(h.ctx(), ctlapi.SaveOptions{}); !errors.Is(err, ctlapi.ErrConflict) || !strings.Contains(err.Error(), "session s changed") {
		t.Fatalf("save over an edit not loaded: %v", err)
	}
	// --persist keeps that edit (it edits the file, not the running configuration).
	if err := h.c.RemoveACL(h.ctx(), "b", ini, ctlapi.MutateOptions{Persist: true}); err != nil {
		t.Fatal(err)
	}
	data, _ = os.ReadFile(h.path)
	if !strings.Contains(string(data), "reconnect_delay: 2s") || strings.Contains(string(data), "0x00000000000000090000000000000009") {
		t.Fatalf("persist over an edit not loaded:\n%s", data)
	}
	if res, err := h.c.ReloadWith(h.ctx(), ctlapi.ReloadOptions{DryRun: true}); err != nil ||
		!slices.Equal(res.Changes, []string{"session s changed"}) || len(res.Discarded) != 0 {
		t.Fatalf("dry run with the edit: %+v, %v", res, err)
	}
	if _, err := h.c.SaveConfig(h.ctx(), ctlapi.SaveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if data, _ = os.ReadFile(h.path); !strings.Contains(string(data), "reconnect_delay: 1s") {
		t.Fatalf("forced save:\n%s", data)
	}

	// A persisted removal of what only runs (never in the file) is fine.
	if _, err := h.c.CreateTarget(h.ctx(), config.Target{Name: "c", PortID: config.MakePortID(0xc, 0xc), CMPort: 5557}, ctlapi.MutateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.c.DeleteTarget(h.ctx(), "c", ctlapi.DeleteOptions{Persist: true}); err != nil {
		t.Fatalf("persisted delete of a run-time target: %v", err)
	}
	// A persisted change to what only runs is refused whole.
	if _, err := h.c.CreateTarget(h.ctx(), config.Target{Name: "c", PortID: config.MakePortID(0xc, 0xc), CMPort: 5557}, ctlapi.MutateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.AddLUN(h.ctx(), "c", config.LUN{ID: 0, Backend: config.BackendRAM, Size: 1 << 20}, ctlapi.MutateOptions{Persist: true}); !errors.Is(err, ctlapi.ErrConflict) {
		t.Fatalf("persisted LUN of a run-time target: %v", err)
	}
	if h.d.Config().Target("c").LUN(0) != nil {
		t.Fatal("the refused change was applied")
	}
}
