package nbd

// Interoperability with external NBD clients (Debian packages libnbd-bin, qemu-utils, fio).
// Each test skips, naming the missing binary and package, when its tool is not installed; CI
// installs them.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// needTools skips the test when a binary is missing.
func needTools(t *testing.T, tools ...string) {
	t.Helper()
	pkg := map[string]string{
		"nbdinfo": "libnbd-bin", "nbdcopy": "libnbd-bin",
		"qemu-io": "qemu-utils", "qemu-img": "qemu-utils", "qemu-nbd": "qemu-utils",
		"fio": "fio", "nbdkit": "nbdkit",
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("SKIP: %s not found in PATH (install Debian package %s)", tool, pkg[tool])
		}
	}
}

// run runs a command with a timeout and returns its combined output; it fails the test on a
// non-zero exit unless allowFail.
func run(t *testing.T, allowFail bool, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "LANG=C", "LC_ALL=C")
	cmd.Dir = t.TempDir() // fio leaves verify state files in its working directory
	out, err := cmd.CombinedOutput()
	if err != nil && !allowFail {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out), err
}

// uris returns the unix-socket and TCP URIs of an export of ts.
func (ts *testServer) uris(export string) map[string]string {
	return map[string]string{
		"unix": fmt.Sprintf("nbd+unix:///%s?socket=%s", export, ts.sock),
		"tcp":  fmt.Sprintf("nbd://%s/%s", ts.tcp, export),
	}
}

func randomFile(t *testing.T, size int) (string, []byte) {
	t.Helper()
	data := make([]byte, size)
	if _, err := io.ReadFull(rand.Reader, data); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "random.img")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, data
}

func TestExternalNbdinfo(t *testing.T) {
	needTools(t, "nbdinfo")
	disk := newRAM(64<<20, 512)
	ro := newRAM(16<<20, 4096)
	ro.ro = true
	ts := startServer(t, Config{}, map[string]Device{"disk": disk, "ro": ro})
	for transport, uri := range ts.uris("disk") {
		t.Run(transport, func(t *testing.T) {
			out, _ := run(t, false, "nbdinfo", "--json", uri)
			var info struct {
				Protocol   string `json:"protocol"`
				Structured bool   `json:"structured"`
				Exports    []struct {
					Name        string `json:"export-name"`
					Description string `json:"description"`
					Size        int64  `json:"export-size"`
					ReadOnly    bool   `json:"is_read_only"`
					CanCache    bool   `json:"can_cache"`
					CanDF       bool   `json:"can_df"`
					CanFlush    bool   `json:"can_flush"`
					CanFUA      bool   `json:"can_fua"`
					CanMulti    bool   `json:"can_multi_conn"`
					CanTrim     bool   `json:"can_trim"`
					CanZero     bool   `json:"can_zero"`
					Min         int    `json:"block_size_minimum"`
					Pref        int    `json:"block_size_preferred"`
					Max         int    `json:"block_size_maximum"`
				} `json:"exports"`
			}
			if err := json.Unmarshal([]byte(out), &info); err != nil {
				t.Fatalf("nbdinfo output: %v\n%s", err, out)
			}
			if info.Protocol != "newstyle-fixed" || !info.Structured || len(info.Exports) != 1 {
				t.Fatalf("nbdinfo: %s", out)
			}
			e := info.Exports[0]
			if e.Name != "disk" || e.Description != "test export disk" || e.Size != 64<<20 || e.ReadOnly ||
				!e.CanCache || !e.CanDF || !e.CanFlush || !e.CanFUA || !e.CanMulti || !e.CanTrim || !e.CanZero ||
				e.Min != 512 || e.Pref != 512 || e.Max != DefaultMaxRequestSize {
				t.Fatalf("nbdinfo: %+v", e)
			}
		})
	}
	t.Run("list", func(t *testing.T) {
		out, _ := run(t, false, "nbdinfo", "--list", fmt.Sprintf("nbd+unix:///?socket=%s", ts.sock))
		for _, want := range []string{`export="disk"`, `export="ro"`, "is_read_only: true", "block_size_minimum: 4096"} {
			if !strings.Contains(out, want) {
				t.Errorf("nbdinfo --list lacks %q:\n%s", want, out)
			}
		}
	})
	t.Run("read-only", func(t *testing.T) {
		if _, err := run(t, true, "nbdinfo", "--is", "read-only", ts.uris("ro")["unix"]); err != nil {
			t.Fatalf("nbdinfo --is read-only: %v", err)
		}
	})
}

// TestExternalNbdinfoMap: nbdinfo --map negotiates base:allocation and reads the map: one data
// extent over the whole export (the initiator's devices have no allocation map yet).
func TestExternalNbdinfoMap(t *testing.T) {
	needTools(t, "nbdinfo")
	const size = 64 << 20
	ts := startServer(t, Config{}, map[string]Device{"disk": newRAM(size, 512)})
	for transport, uri := range ts.uris("disk") {
		t.Run(transport, func(t *testing.T) {
			out, _ := run(t, false, "nbdinfo", "--map", "--json", uri)
			var extents []struct {
				Offset      int64  `json:"offset"`
				Length      int64  `json:"length"`
				Type        int    `json:"type"`
				Description string `json:"description"`
			}
			if err := json.Unmarshal([]byte(out), &extents); err != nil {
				t.Fatalf("nbdinfo --map output: %v\n%s", err, out)
			}
			if len(extents) != 1 || extents[0].Offset != 0 || extents[0].Length != size ||
				extents[0].Type != 0 || extents[0].Description != "data" {
				t.Fatalf("nbdinfo --map: %s", out)
			}
			// --totals agrees: all of it is data.
			out, _ = run(t, false, "nbdinfo", "--map", "--totals", uri)
			if !strings.Contains(out, "100.0%") || !strings.Contains(out, "data") {
				t.Fatalf("nbdinfo --map --totals: %s", out)
			}
		})
	}
}

// TestExternalQemuImgMap: qemu-img map reads the same map through qemu's NBD client.
func TestExternalQemuImgMap(t *testing.T) {
	needTools(t, "qemu-img")
	const size = 16 << 20
	ts := startServer(t, Config{}, map[string]Device{"disk": newRAM(size, 512)})
	out, _ := run(t, false, "qemu-img", "map", "--output=json", "-f", "raw", ts.uris("disk")["unix"])
	var extents []struct {
		Start  int64 `json:"start"`
		Length int64 `json:"length"`
		Data   bool  `json:"data"`
		Zero   bool  `json:"zero"`
	}
	if err := json.Unmarshal([]byte(out), &extents); err != nil {
		t.Fatalf("qemu-img map output: %v\n%s", err, out)
	}
	if len(extents) != 1 || extents[0].Start != 0 || extents[0].Length != size || !extents[0].Data || extents[0].Zero {
		t.Fatalf("qemu-img map: %s", out)
	}
}

func TestExternalNbdcopy(t *testing.T) {
	needTools(t, "nbdcopy")
	const size = 64 << 20
	src, data := randomFile(t, size)
	want := sha256.Sum256(data)
	for transport := range map[string]bool{"unix": true, "tcp": true} {
		t.Run(transport, func(t *testing.T) {
			disk := newRAM(size, 512)
			ts := startServer(t, Config{}, map[string]Device{"disk": disk})
			uri := ts.uris("disk")[transport]
			run(t, false, "nbdcopy", "--flush", src, uri)
			if got := sha256.Sum256(disk.snapshot(0, size)); got != want {
				t.Fatal("device content differs from the source file")
			}
			dst := filepath.Join(t.TempDir(), "copy.img")
			run(t, false, "nbdcopy", uri, dst)
			back, err := os.ReadFile(dst)
			if err != nil {
				t.Fatal(err)
			}
			if got := sha256.Sum256(back); got != want {
				t.Fatalf("sha256 of the copy %x, want %x", got, want)
			}
			st := ts.Stats()
			if st.Exports[0].BytesWritten != size || st.Exports[0].BytesRead < size || st.Exports[0].Errors != 0 {
				t.Fatalf("export counters %+v", st.Exports[0].Counters)
			}
			t.Logf("nbdcopy used %d connections in total", st.Accepted)
		})
	}
}

func TestExternalQemuIO(t *testing.T) {
	needTools(t, "qemu-io")
	ro := newRAM(4<<20, 4096)
	ro.ro = true
	ro.fill(0, bytes.Repeat([]byte{0x5a}, 4<<20))
	ts := startServer(t, Config{}, map[string]Device{"disk": newRAM(64<<20, 512), "ro": ro})
	for transport, uri := range ts.uris("disk") {
		t.Run(transport, func(t *testing.T) {
			out, _ := run(t, false, "qemu-io", "-f", "raw",
				"-c", "write -P 0xab 0 1M",
				"-c", "read -P 0xab 0 1M",
				"-c", "write -f -P 0x11 4M 64k", // FUA
				"-c", "read -P 0x11 4M 64k",
				"-c", "write -z 1M 256k", // WRITE_ZEROES
				"-c", "read -P 0 1M 256k",
				"-c", "write -P 0x22 8M 8M",
				"-c", "discard 8M 4M",
				"-c", "read -P 0x22 12M 4M",
				"-c", "aio_write -P 0x33 16M 64k",
				"-c", "aio_write -P 0x44 17M 64k",
				"-c", "aio_flush",
				"-c", "read -P 0x33 16M 64k",
				"-c", "read -P 0x44 17M 64k",
				"-c", "flush",
				uri)
			for _, bad := range []string{"failed", "error", "Error"} {
				if strings.Contains(out, bad) {
					t.Fatalf("qemu-io reported %q:\n%s", bad, out)
				}
			}
			if n := strings.Count(out, "read "); n < 5 {
				t.Fatalf("qemu-io ran %d reads:\n%s", n, out)
			}
		})
	}
	t.Run("read-only", func(t *testing.T) {
		uri := ts.uris("ro")["unix"]
		out, _ := run(t, false, "qemu-io", "-r", "-f", "raw", "-c", "read -P 0x5a 0 4M", uri)
		if strings.Contains(out, "failed") {
			t.Fatal(out)
		}
		// Opening read-write must fail: the export is read-only.
		if out, err := run(t, true, "qemu-io", "-f", "raw", "-c", "write -P 1 0 4k", uri); err == nil && !strings.Contains(out, "failed") && !strings.Contains(out, "read-only") {
			t.Fatalf("write to a read-only export succeeded:\n%s", out)
		}
	})
}

func TestExternalQemuImgCompare(t *testing.T) {
	needTools(t, "qemu-img", "nbdcopy")
	const size = 16 << 20
	src, _ := randomFile(t, size)
	disk := newRAM(size, 4096)
	ts := startServer(t, Config{}, map[string]Device{"disk": disk})
	uri := ts.uris("disk")["unix"]
	// Write through qemu's NBD client, then compare through it.
	run(t, false, "qemu-img", "convert", "-n", "-f", "raw", "-O", "raw", src, uri)
	out, _ := run(t, false, "qemu-img", "compare", "-f", "raw", "-F", "raw", src, uri)
	if !strings.Contains(out, "identical") {
		t.Fatalf("qemu-img compare: %s", out)
	}
	// A difference is found (exit status 1) at the right offset.
	b := disk.snapshot(5<<20+4096, 1)
	b[0] ^= 0xff
	disk.fill(5<<20+4096, b)
	out, err := run(t, true, "qemu-img", "compare", "-f", "raw", "-F", "raw", src, uri)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(out, fmt.Sprint(5<<20+4096)) {
		t.Fatalf("qemu-img compare after a change: %v\n%s", err, out)
	}
	// TCP as well.
	b[0] ^= 0xff
	disk.fill(5<<20+4096, b)
	out, _ = run(t, false, "qemu-img", "compare", "-f", "raw", "-F", "raw", src, ts.uris("disk")["tcp"])
	if !strings.Contains(out, "identical") {
		t.Fatalf("qemu-img compare over TCP: %s", out)
	}
}

func TestExternalFioVerify(t *testing.T) {
	needTools(t, "fio")
	ts := startServer(t, Config{}, map[string]Device{"disk": newRAM(64<<20, 512)})
	for transport, uri := range ts.uris("disk") {
		t.Run(transport, func(t *testing.T) {
			out, _ := run(t, false, "fio", "--name=verify", "--ioengine=nbd", "--uri="+uri,
				"--rw=randwrite", "--bs=4k", "--verify=crc32c", "--size=16m", "--iodepth=16",
				"--verify_fatal=1", "--do_verify=1")
			if !strings.Contains(out, "err= 0") || strings.Contains(out, "verify: bad") {
				t.Fatalf("fio:\n%s", out)
			}
			st := ts.Stats()
			if st.Exports[0].Errors != 0 || st.Exports[0].Writes < 4096 || st.Exports[0].Reads < 4096 {
				t.Fatalf("export counters after fio %+v", st.Exports[0].Counters)
			}
		})
	}
}

// TestExternalNbdinfoRefused: a client over Config.MaxConnections is refused in a way nbdinfo
// reports (libnbd 1.14: "handshake: server policy prevents NBD_OPT_GO"; its debug log carries
// the server's message), while the established client keeps working.
func TestExternalNbdinfoRefused(t *testing.T) {
	needTools(t, "nbdinfo")
	ts := startServer(t, Config{MaxConnections: 1}, map[string]Device{"disk": newRAM(1<<20, 512)})
	c := dialUnix(t, ts.sock)
	c.connect("disk", false)
	out, err := run(t, true, "nbdinfo", "--size", ts.uris("disk")["unix"])
	if err == nil {
		t.Fatalf("nbdinfo succeeded over max_connections:\n%s", out)
	}
	if !strings.Contains(out, "policy") && !strings.Contains(out, "too many connections") {
		t.Fatalf("nbdinfo does not say the server refused by policy:\n%s", out)
	}
	t.Logf("nbdinfo says: %s", strings.TrimSpace(out))
	t.Setenv("LIBNBD_DEBUG", "1")
	if out, err := run(t, true, "nbdinfo", "--size", ts.uris("disk")["unix"]); err == nil || !strings.Contains(out, "too many connections") {
		t.Fatalf("nbdinfo's debug log lacks the server's message (err %v):\n%s", err, out)
	}
	t.Setenv("LIBNBD_DEBUG", "")
	if st := ts.Stats(); st.Refused != 2 {
		t.Fatalf("Refused %d, want 2", st.Refused)
	}
	if r := c.do(cmdRead, 0, 0, 4096, nil); r.errno != 0 {
		t.Fatalf("established client: %v", r.errno)
	}
	// Once it leaves, nbdinfo gets in.
	c.send(cmdDisc, 0, 1, 0, 0, nil)
	c.expectClosed()
	waitFor(t, "the slot freed", func() bool { return ts.Stats().Active == 0 })
	if out, _ := run(t, false, "nbdinfo", "--size", ts.uris("disk")["unix"]); strings.TrimSpace(out) != "1048576" {
		t.Fatalf("nbdinfo --size: %q", out)
	}
}
