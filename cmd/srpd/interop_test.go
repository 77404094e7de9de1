package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/testutil"
)

// interopScript is what `make interop` runs under the kernel harness, in both roles.
const interopScript = "../../scripts/interop-srpd.sh"

// runInteropRole starts scripts/interop-srpd.sh ROLE DIR with the harness' variables in env
// and the test's binaries, as its own process group (so that a timeout ends the srpd it
// started too, by that group's id).
func runInteropRole(ctx context.Context, t *testing.T, role, dir string, env []string) *exec.Cmd {
	t.Helper()
	srpd, srpctlBin := binaries(t)
	cmd := exec.CommandContext(ctx, "bash", interopScript, role, dir)
	cmd.Env = append(append(os.Environ(), env...), "SRPD="+srpd, "SRPCTL="+srpctlBin,
		"NBDCHECK="+filepath.Join(filepath.Dir(srpd), "nbdcheck"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return cmd
}

// TestInteropScript runs scripts/interop-srpd.sh in both roles on loopback with the variables
// the kernel harness gives its command (on a UDP port other than 4791, so no root is needed):
// srpd as the target on 127.0.0.1, and srpd as the initiator on 127.0.0.2 logging in to it,
// its NBD export driven by nbdcheck. The initiator role must exit 0 and print one harness hash
// line per range; the target's RAM then gets the check the kernel target does: each range,
// read through a third srpd's session and NBD export, must have the line's SHA-256. The
// target role's srpd exits 0 on SIGTERM.
func TestInteropScript(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	port := testutil.FreeUDPPort(t)
	dir := testutil.ShortTempDir(t, "srpd-i-")
	const lunMiB = 16
	common := []string{"SRP_INTEROP_ROCE_PORT=" + strconv.Itoa(port), "SRP_INTEROP_PORT=5555",
		"SRP_INTEROP_ID_EXT=5352500000000003", "SRP_INTEROP_IOC_GUID=5352500000000003"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var tout, terr testutil.SyncBuffer
	tgt := runInteropRole(ctx, t, "target", filepath.Join(dir, "t"), append(common, "SRP_INTEROP_ROLE=target",
		"SRP_INTEROP_ADDR=127.0.0.1", "SRP_INTEROP_TARGET_PORT_ID=53525000000000035352500000000003",
		"SRPD_INTEROP_LUN_MIB="+strconv.Itoa(lunMiB)))
	tgt.Stdout, tgt.Stderr = &tout, &terr
	if err := tgt.Start(); err != nil {
		t.Fatal(err)
	}
	tdone := make(chan error, 1)
	go func() { tdone <- tgt.Wait() }()
	defer func() {
		select {
		case <-tdone:
		default:
			_ = syscall.Kill(-tgt.Process.Pid, syscall.SIGKILL)
			<-tdone
		}
		if t.Failed() {
			t.Logf("target role stderr:\n%s", tail(terr.String(), 60))
		}
	}()
	// The role execs srpd: wait for its RoCEv2 socket, as the harness does (ss -lun).
	for !strings.Contains(terr.String(), "transport up") {
		select {
		case err := <-tdone:
			tdone <- err
			t.Fatalf("the target role exited at start-up: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if ctx.Err() != nil {
			t.Fatal("the target role's srpd did not come up")
		}
	}

	ini := runInteropRole(ctx, t, "initiator", filepath.Join(dir, "i"), append(common, "SRP_INTEROP_ROLE=initiator",
		"SRP_INTEROP_ADDR=127.0.0.2", "SRP_INTEROP_TARGET_ADDR=127.0.0.1",
		"SRP_INTEROP_LUN_BYTES="+strconv.Itoa(lunMiB<<20)))
	var iout, ierr bytes.Buffer
	ini.Stdout, ini.Stderr = &iout, &ierr
	if err := ini.Run(); err != nil {
		t.Fatalf("initiator role: %v\nstdout:\n%s\nstderr:\n%s", err, iout.String(), tail(ierr.String(), 80))
	}
	re := regexp.MustCompile(`^SRP_INTEROP_SHA256=([0-9a-f]{64}) OFFSET=(\d+) LEN=(\d+)$`)
	type hashed struct {
		sum      string
		off, len int64
	}
	var lines []hashed
	for _, l := range strings.Split(strings.TrimSpace(iout.String()), "\n") {
		m := re.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("initiator role stdout line %q is not a harness hash line", l)
		}
		off, _ := strconv.ParseInt(m[2], 10, 64)
		n, _ := strconv.ParseInt(m[3], 10, 64)
		lines = append(lines, hashed{m[1], off, n})
	}
	if len(lines) != 6 {
		t.Fatalf("%d hash lines, want 6 (five ranges and the unaligned one):\n%s", len(lines), iout.String())
	}
	if !strings.Contains(ierr.String(), "srpd logged out and exited 0") {
		t.Errorf("initiator role stderr does not report the logout:\n%s", tail(ierr.String(), 40))
	}

	// The kernel target's side of the check: hash the ranges on the target's LUN.
	vdir := filepath.Join(dir, "v")
	if err := os.MkdirAll(vdir, 0o700); err != nil {
		t.Fatal(err)
	}
	vcfg := filepath.Join(vdir, "srpd.yaml")
	sock := filepath.Join(vdir, "lun0.nbd")
	if err := os.WriteFile(vcfg, []byte(fmt.Sprintf(`version: 1
transports:
  - {name: lo, address: 127.0.0.3, udp_port: %d}
sessions:
  - name: verify
    address: 127.0.0.1
    port: 5555
    target_port_id: 0x53525000000000035352500000000003
    nbd:
      - {lun: 0, socket: %s}
control: {socket: %s}
`, port, sock, filepath.Join(vdir, "srpd.sock"))), 0o600); err != nil {
		t.Fatal(err)
	}
	v := startDaemon(t, vcfg, nil)
	deadline := time.Now().Add(time.Minute)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no NBD export from the verifying srpd:\n%s", tail(v.stderr.String(), 40))
		}
		time.Sleep(50 * time.Millisecond)
	}
	nc, err := dialNBD(sock, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range lines {
		buf := make([]byte, h.len)
		if err := nc.ReadAt(buf, h.off); err != nil {
			t.Fatalf("read %d bytes at %d: %v", h.len, h.off, err)
		}
		if s := sha256.Sum256(buf); hex.EncodeToString(s[:]) != h.sum {
			t.Errorf("%d bytes at %d on the target: SHA-256 %x, the initiator role printed %s", h.len, h.off, s, h.sum)
		}
	}
	_ = nc.Close()
	v.signal(t, syscall.SIGTERM)
	if code := v.exit(t, time.Minute); code != 0 {
		t.Errorf("verifying srpd exit %d", code)
	}

	if err := tgt.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-tdone:
		tdone <- err
		if err != nil {
			t.Errorf("target role's srpd after SIGTERM: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the target role's srpd did not exit within a minute of SIGTERM")
	}
}
