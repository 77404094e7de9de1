package ctlapi_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

// shortDir returns a temporary directory with a path short enough for unix sockets.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "ctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// serve runs Handler(svc) on a unix socket and returns a client of it.
func serve(t *testing.T, svc ctlapi.Service) *ctlapi.Client {
	t.Helper()
	sock := filepath.Join(shortDir(t), "srpd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: ctlapi.Handler(svc), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	c := ctlapi.NewClient(sock)
	t.Cleanup(c.Close)
	return c
}

func TestClientRoundTrips(t *testing.T) {
	f := newFake(t)
	c := serve(t, f)
	ctx := context.Background()

	st, err := c.Status(ctx)
	if err != nil || st.APIVersion != 1 || st.Targets != 1 || st.Connections != 1 || st.Transports[0].Name != "lo" {
		t.Fatalf("Status = %+v, %v", st, err)
	}
	tg := config.Target{Name: "t2", PortID: config.MakePortID(1, 2), LUNs: []config.LUN{{ID: 3, Backend: "ram", Size: 1 << 20}}}
	info, err := c.CreateTarget(ctx, tg, ctlapi.MutateOptions{Persist: true})
	if err != nil || info.Name != "t2" || len(info.LUNs) != 1 || info.LUNs[0].BlockSize != 512 {
		t.Fatalf("CreateTarget = %+v, %v", info, err)
	}
	if len(f.Persisted()) != 1 {
		t.Fatal("persist not forwarded")
	}
	ts, err := c.ListTargets(ctx)
	if err != nil || len(ts) != 2 {
		t.Fatalf("ListTargets = %v, %v", ts, err)
	}
	if _, err := c.AddLUN(ctx, "t2", config.LUN{ID: 4, Backend: "ram", Size: 2 << 20}, ctlapi.MutateOptions{}); err != nil {
		t.Fatal(err)
	}
	ls, err := c.ListLUNs(ctx, "t2")
	if err != nil || len(ls) != 2 || ls[1].Capacity != 2<<20 {
		t.Fatalf("ListLUNs = %+v, %v", ls, err)
	}
	if err := c.RemoveLUN(ctx, "t2", 4, ctlapi.MutateOptions{}); err != nil {
		t.Fatal(err)
	}
	ini := config.InitiatorID{ID: config.MakePortID(7, 8)}
	if _, err := c.AddACL(ctx, "t2", config.ACL{Initiator: ini, LUNs: []int{3}}, ctlapi.MutateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddACL(ctx, "t2", config.ACL{Initiator: config.AnyInitiator}, ctlapi.MutateOptions{}); err != nil {
		t.Fatal(err)
	}
	as, err := c.ListACLs(ctx, "t2")
	if err != nil || len(as) != 2 {
		t.Fatalf("ListACLs = %+v, %v", as, err)
	}
	if err := c.RemoveACL(ctx, "t2", config.AnyInitiator, ctlapi.MutateOptions{}); err != nil {
		t.Fatalf("RemoveACL(*) = %v", err)
	}
	if err := c.RemoveACL(ctx, "t2", ini, ctlapi.MutateOptions{}); err != nil {
		t.Fatalf("RemoveACL = %v", err)
	}
	got, err := c.GetTarget(ctx, "t2")
	if err != nil || len(got.ACLs) != 0 {
		t.Fatalf("GetTarget = %+v, %v", got, err)
	}
	if err := c.DeleteTarget(ctx, "t2", ctlapi.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	ss, err := c.ListSessions(ctx, ctlapi.SessionFilter{Target: "demo"})
	if err != nil || len(ss) != 1 || ss[0].Initiator != config.MakePortID(0, 9) {
		t.Fatalf("ListSessions = %+v, %v", ss, err)
	}
	if s, err := c.GetSession(ctx, "s1"); err != nil || s.Channels != 2 {
		t.Fatalf("GetSession = %+v, %v", s, err)
	}
	if err := c.DeleteTarget(ctx, "demo", ctlapi.DeleteOptions{}); !errors.Is(err, ctlapi.ErrConflict) {
		t.Fatalf("DeleteTarget with sessions = %v, want ErrConflict", err)
	}
	if err := c.KillSession(ctx, "s1"); err != nil {
		t.Fatal(err)
	}

	s := config.Session{Name: "c2", Address: "10.0.0.2", TargetPortID: config.MakePortID(5, 5), DevLossTmo: config.TimeoutOff(),
		NBD: []config.NBDExport{{LUN: 0, Socket: "/run/srpd/c2.nbd"}}}
	ci, err := c.Connect(ctx, s, ctlapi.MutateOptions{})
	if err != nil || ci.Address != "10.0.0.2:5555" || !ci.Config.DevLossTmo.Off() || ci.LUNs[0].NBDSocket != "/run/srpd/c2.nbd" {
		t.Fatalf("Connect = %+v, %v", ci, err)
	}
	cs, err := c.ListConnections(ctx)
	if err != nil || len(cs) != 2 {
		t.Fatalf("ListConnections = %+v, %v", cs, err)
	}
	if gc, err := c.GetConnection(ctx, "c2"); err != nil || gc.State != ctlapi.StateRunning {
		t.Fatalf("GetConnection = %+v, %v", gc, err)
	}
	if err := c.Disconnect(ctx, "c2", ctlapi.MutateOptions{Persist: true}); err != nil {
		t.Fatal(err)
	}

	next := f.Config()
	next.Logging.Level = "debug"
	f.SetReloadSource(next)
	res, err := c.Reload(ctx)
	if err != nil || len(res.Changes) != 1 || res.Changes[0] != "logging settings changed" || !res.Diff.Logging {
		t.Fatalf("Reload = %+v, %v", res, err)
	}
}

func TestClientTypedErrors(t *testing.T) {
	c := serve(t, newFake(t))
	ctx := context.Background()

	_, err := c.GetTarget(ctx, "nope")
	var apiErr *ctlapi.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != ctlapi.CodeNotFound {
		t.Fatalf("GetTarget(nope) = %#v", err)
	}
	if !errors.Is(err, ctlapi.ErrNotFound) || errors.Is(err, ctlapi.ErrConflict) {
		t.Fatalf("errors.Is mapping wrong for %v", err)
	}
	_, err = c.CreateTarget(ctx, config.Target{Name: "x", PortID: config.MakePortID(1, 9), LUNs: []config.LUN{{Backend: "ram"}}}, ctlapi.MutateOptions{})
	if !errors.Is(err, ctlapi.ErrInvalidArgument) || !errors.As(err, &apiErr) || len(apiErr.Details) != 1 || apiErr.Details[0].Path != "luns[0].size" {
		t.Fatalf("CreateTarget(invalid) = %#v", err)
	}
	if err.Error() != "invalid target: LUN 0: size: the ram backend needs a size (e.g. 64MiB)" || apiErr.Details[0].Location != "LUN 0: size" {
		t.Fatalf("message %q", err)
	}
	_, err = c.CreateTarget(ctx, config.Target{Name: "demo", PortID: config.MakePortID(1, 9)}, ctlapi.MutateOptions{})
	if !errors.Is(err, ctlapi.ErrAlreadyExists) {
		t.Fatalf("CreateTarget(existing) = %v", err)
	}
}

func TestDaemonNotRunning(t *testing.T) {
	dir := shortDir(t)
	// No socket at all.
	c := ctlapi.NewClient(filepath.Join(dir, "none.sock"))
	_, err := c.Status(context.Background())
	var se *ctlapi.SocketError
	if !errors.Is(err, ctlapi.ErrDaemonNotRunning) || !errors.As(err, &se) || errors.Is(err, ctlapi.ErrPermission) {
		t.Fatalf("missing socket: %v", err)
	}
	if !strings.Contains(err.Error(), "srpd is not running") || !strings.Contains(err.Error(), "none.sock") {
		t.Fatalf("message %q", err)
	}
	// A stale socket file nobody listens on (the daemon died).
	sock := filepath.Join(dir, "stale.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	_, err = ctlapi.NewClient(sock).ListTargets(context.Background())
	if !errors.Is(err, ctlapi.ErrDaemonNotRunning) {
		t.Fatalf("stale socket: %v", err)
	}
	// Something that is not a socket.
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	if _, err := ctlapi.NewClient(file).Status(context.Background()); !errors.Is(err, ctlapi.ErrDaemonNotRunning) {
		t.Fatalf("regular file: %v", err)
	}
	// A cancelled context is neither.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ctlapi.NewClient(sock).Status(ctx); !errors.Is(err, context.Canceled) || errors.Is(err, ctlapi.ErrDaemonNotRunning) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestNonJSONErrorResponse(t *testing.T) {
	sock := filepath.Join(shortDir(t), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "upstream broke", http.StatusServiceUnavailable)
	})}
	go srv.Serve(l)
	defer srv.Close()
	_, err = ctlapi.NewClient(sock).Status(context.Background())
	if !errors.Is(err, ctlapi.ErrUnavailable) {
		t.Fatalf("%v", err)
	}
}
