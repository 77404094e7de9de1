package stack

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
	"github.com/srpd/srpd/scsi/backend"
)

// closeCounter counts the Close calls its backend gets (LUNOptions.Wrap).
type closeCounter struct {
	backend.Backend
	closed *atomic.Int32
}

func (c closeCounter) Close() error { c.closed.Add(1); return c.Backend.Close() }

// TestLoopback builds a stack the way the demo does, from config values: two softroce
// transports on ephemeral ports of 127.0.0.1, a target with two RAM LUNs of which its "*" ACL
// shows one, a session that logs in to it, and an NBD export of that LUN. The session sees
// the masked view, the target records the channel, the export serves the LUN's size, and Stop
// closes exactly the LUNs it is not told to keep.
func TestLoopback(t *testing.T) {
	log := zap.NewNop()
	if testing.Verbose() {
		log = zaptest.NewLogger(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	open := func(name string) *Transport {
		tr, err := OpenTransport(ctx, config.Transport{Name: name, Driver: config.DriverSoftRoCE, Address: "127.0.0.1"},
			TransportOptions{Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close(context.Background()) })
		if !tr.Bound.IsValid() || tr.Bound.Port() == 0 || tr.SoftRoCE() == nil {
			t.Fatalf("transport %s: bound %v, softroce %v", name, tr.Bound, tr.SoftRoCE())
		}
		return tr
	}
	ttr, itr := open("t"), open("i")

	tc := config.Target{
		Name: "t", PortID: config.MakePortID(1, 1), CMPort: 5555,
		LUNs: []config.LUN{
			{ID: 0, Backend: config.BackendRAM, Size: 8 << 20, BlockSize: 512},
			{ID: 3, Backend: config.BackendRAM, Size: 1 << 20, BlockSize: 512},
		},
		ACLs: []config.ACL{{Initiator: config.AnyInitiator, LUNs: []int{0}}},
	}
	closes := map[int]*atomic.Int32{}
	luns := map[int]*LUN{}
	for _, l := range tc.LUNs {
		n := &atomic.Int32{}
		closes[l.ID] = n
		sl, err := OpenLUN(&tc, l, LUNOptions{Wrap: func(b backend.Backend) backend.Backend { return closeCounter{b, n} }})
		if err != nil {
			t.Fatal(err)
		}
		if sl.Capacity != int64(l.Size) {
			t.Fatalf("LUN %d capacity %d, want %d", l.ID, sl.Capacity, l.Size)
		}
		luns[l.ID] = sl
	}
	st, err := StartTarget(tc, ttr, luns, TargetOptions{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{netip.AddrPortFrom(ttr.Bound.Addr(), 5555).String()}; !slices.Equal(st.Listen, want) {
		t.Errorf("listening on %v, want %v", st.Listen, want)
	}

	sess, err := Dial(ctx, config.Session{Name: "s", Address: "127.0.0.1", Port: 5555, TargetPortID: tc.PortID, ChCount: 2,
		ConnectTimeout: config.Duration(10 * time.Second)}, itr, SessionOptions{Logger: log, PeerUDPPort: ttr.Bound.Port()})
	if err != nil {
		t.Fatal(err)
	}
	if ls := sess.LUNs(); len(ls) != 1 || ls[0].Info().Number != 0 || ls[0].Size() != 8<<20 {
		t.Fatalf("the session sees %d LUN(s); want LUN 0 of 8 MiB only (ACL masking)", len(ls))
	}
	chs := st.Channels(sess.InitiatorPortID())
	if len(chs) != 2 {
		t.Fatalf("target records %d channel(s) of the initiator, want 2", len(chs))
	}
	for _, c := range chs {
		if c.Remote.Addr() != itr.Bound.Addr() || c.Initiator != sess.InitiatorPortID() || c.At.IsZero() {
			t.Errorf("channel record %+v: want remote %v, initiator %v and a login time", c, itr.Bound.Addr(), sess.InitiatorPortID())
		}
	}

	if _, err := ServeNBD(sess, config.NBDExport{LUN: 3, Socket: filepath.Join(t.TempDir(), "x.nbd")}, NBDOptions{}); !errors.Is(err, ctlapi.ErrNotFound) {
		t.Errorf("export of a masked LUN: %v, want ErrNotFound", err)
	}
	sock := filepath.Join(testutil.ShortTempDir(t, "stack-"), "sub", "lun0.nbd") // its directory is created
	x, err := ServeNBD(sess, config.NBDExport{LUN: 0, Socket: sock}, NBDOptions{Logger: log, Session: "s"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", "lun0"} {
		c, size, err := testutil.DialNBD(sock, name, 10*time.Second)
		if err != nil {
			t.Fatalf("export %q: %v", name, err)
		}
		_ = c.Close()
		if size != 8<<20 {
			t.Errorf("export %q has %d bytes, want %d", name, size, 8<<20)
		}
	}
	x.Stop()
	select {
	case <-x.Done():
	case <-ctx.Done():
		t.Fatal("the NBD export did not stop")
	}
	if err := sess.Close(ctx); err != nil {
		t.Fatalf("logout: %v", err)
	}

	st.Stop(ctx, func(id int) bool { return id == 3 })
	if n := closes[0].Load(); n != 1 {
		t.Errorf("LUN 0 closed %d time(s) by Stop, want 1", n)
	}
	if n := closes[3].Load(); n != 0 {
		t.Errorf("LUN 3 (kept) closed %d time(s) by Stop, want 0", n)
	}
	_ = luns[3].Close()
}

func TestLifeTimeExponent(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want uint8
	}{
		{time.Nanosecond, 1}, {time.Millisecond, 8}, {100 * time.Millisecond, 15}, {1100 * time.Millisecond, 19},
		{time.Duration(4096) << 18, 18}, {time.Duration(4096)<<18 + 1, 19}, {time.Hour, 30},
	} {
		if got := LifeTimeExponent(tc.d); got != tc.want {
			t.Errorf("LifeTimeExponent(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}
