package initiator

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/initiator/nbd"
	"github.com/srpd/srpd/target"
	"github.com/srpd/srpd/transport/softroce/link"
)

func needTool(t *testing.T, tools ...string) {
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
}

func runTool(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "LANG=C", "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// serveUnix serves srv on a unix socket in t.TempDir() until the test ends and returns its path.
func serveUnix(t *testing.T, srv *nbd.Server) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	if _, err := srv.ListenUnix(sock); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return sock
}

// TestNBDExport runs the whole chain: qemu-io and nbdcopy talk NBD to the NBD server, which
// serves a LUN of an SRP session (NBDDevice) to the srpd target over softroce.
func TestNBDExport(t *testing.T) {
	needTool(t, "qemu-io", "nbdcopy")
	// heap: request buffers on the Go heap, copied through the slots' buffers; direct: the
	// session's Buffers (NBDAllocator), mapped for the target without a copy.
	for _, direct := range []bool{false, true} {
		name := map[bool]string{false: "heap", true: "direct"}[direct]
		t.Run(name, func(t *testing.T) { testNBDExport(t, direct) })
	}
}

func testNBDExport(t *testing.T, direct bool) {
	e := newRealEnv(t, false, link.PipeConfig{}, target.Limits{}, 1, 32<<20)
	cfg := e.config()
	cfg.ChCount = 2
	s := e.dial(cfg)
	l := s.LUNs()[0]
	ncfg := nbd.Config{Logger: testLogger(t)}
	if direct {
		ncfg.Allocator = NBDAllocator(s)
	}
	srv, err := nbd.NewServer(ncfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddExport("lun0", NBDDevice(l), nbd.ExportOptions{Description: l.Info().IDString()}); err != nil {
		t.Fatal(err)
	}
	sock := serveUnix(t, srv)
	uri := fmt.Sprintf("nbd+unix:///lun0?socket=%s", sock)
	out := runTool(t, "qemu-io", "-f", "raw",
		"-c", "write -P 0xab 0 1M",
		"-c", "read -P 0xab 0 1M",
		"-c", "write -f -P 0x11 4M 64k",
		"-c", "read -P 0x11 4M 64k",
		"-c", "write -z 1M 256k",
		"-c", "read -P 0 1M 256k",
		"-c", "write -P 0x22 8M 8M",
		"-c", "discard 8M 4M",
		"-c", "read -P 0x22 12M 4M",
		"-c", "aio_write -P 0x33 20M 64k",
		"-c", "aio_write -P 0x44 21M 64k",
		"-c", "aio_flush",
		"-c", "read -P 0x33 20M 64k",
		"-c", "read -P 0x44 21M 64k",
		"-c", "flush",
		uri)
	for _, bad := range []string{"failed", "error", "Error", "Pattern verification"} {
		if strings.Contains(out, bad) {
			t.Fatalf("qemu-io reported %q:\n%s", bad, out)
		}
	}
	// A random image copied in and out again with nbdcopy (several connections, many requests
	// in flight).
	data := make([]byte, 32<<20)
	if _, err := io.ReadFull(rand.Reader, data); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	in, back := filepath.Join(dir, "in.img"), filepath.Join(dir, "out.img")
	if err := os.WriteFile(in, data, 0o600); err != nil {
		t.Fatal(err)
	}
	runTool(t, "nbdcopy", in, uri)
	runTool(t, "nbdcopy", uri, back)
	got, err := os.ReadFile(back)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("image read back through NBD differs from what was written")
	}
	// And the same bytes through the block API directly.
	p := make([]byte, 1<<20)
	if err := l.ReadAt(ctxT(t, 10*time.Second), p, 5<<20); err != nil || !bytes.Equal(p, data[5<<20:6<<20]) {
		t.Fatalf("block API read: %v", err)
	}
	st := s.Stats()
	if direct && st.Direct == 0 || !direct && st.Direct != 0 {
		t.Fatalf("%d of %d commands mapped NBD buffers directly (direct %v)", st.Direct, st.Commands, direct)
	}
	t.Logf("%d of %d commands direct", st.Direct, st.Commands)
}
