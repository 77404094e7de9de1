package initiator

import (
	"testing"
	"time"

	"github.com/srpd/srpd/scsi/backend"
	"github.com/srpd/srpd/target"
	"github.com/srpd/srpd/transport/softroce/link"
)

// TestRescanOnUnitAttention: the target adds a LUN and grows another while the session runs
// I/O; the unit attentions make the session rescan in the background, without logging out:
// the new LUN appears and the grown LUN's size (the same *LUN) follows.
func TestRescanOnUnitAttention(t *testing.T) {
	e := newRealEnv(t, false, link.PipeConfig{}, target.Limits{}, 2, 1<<20)
	s := e.dial(e.config())
	if n := len(s.LUNs()); n != 2 {
		t.Fatalf("%d LUNs, want 2", n)
	}
	ctx := ctxT(t, time.Minute)
	l0, l1 := s.LUN(0), s.LUN(1)
	buf := make([]byte, 4096)
	io := func(l *LUN) {
		t.Helper()
		if err := l.WriteAt(ctx, buf, 0, false); err != nil {
			t.Fatalf("write to LUN %d: %v", l.Info().Number, err)
		}
	}
	io(l0)
	io(l1)
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("no %s (stats %+v)", what, s.Stats())
			}
			io(l0) // the unit attention reaches the session with a command
			time.Sleep(5 * time.Millisecond)
		}
	}

	// A third LUN added to the view.
	e.addRAMLUNs(1, 1<<20, "added")
	acl := &target.ACL{Name: "any"}
	for i, l := range e.luns {
		acl.LUNs = append(acl.LUNs, target.LUNMapping{Number: uint16(i), LUN: l})
	}
	if _, err := e.tgt.Reconfigure(target.Config{PortID: testTargetPort, DefaultACL: acl}); err != nil {
		t.Fatal(err)
	}
	waitUntil("third LUN", func() bool { return len(s.LUNs()) == 3 })
	if s.LUN(0) != l0 || s.LUN(1) != l1 {
		t.Fatal("the rescan replaced the LUN objects of units still present")
	}

	// LUN 1 grown to 2 MiB.
	if _, err := e.luns[1].Backend().(*backend.RAM).Resize(2 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := e.luns[1].Resize(); err != nil {
		t.Fatal(err)
	}
	io(l1) // CAPACITY DATA HAS CHANGED, retried
	waitUntil("new capacity", func() bool { return l1.Size() == 2<<20 })
	if err := l1.WriteAt(ctx, buf, 2<<20-4096, false); err != nil {
		t.Fatalf("write in the grown range: %v", err)
	}
	st := s.Stats()
	if st.Reconnects != 0 || st.Rescans == 0 || st.UnitAttentions == 0 {
		t.Fatalf("stats %+v: want rescans, unit attentions and no reconnect", st)
	}
}
