// Package testutil holds small helpers that tests of several packages share: free loopback
// ports, short temporary directories and the module's binaries built once (unix socket paths are limited to 107 bytes, and
// t.TempDir() embeds the test's name). Only _test.go files import it.
package testutil

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// FreeUDPPort returns a UDP port on 127.0.0.1 that was free a moment ago.
func FreeUDPPort(t testing.TB) int {
	t.Helper()
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// FreeTCPPort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreeTCPPort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// ShortTempDir is a temporary directory with a short path, removed when the test ends.
func ShortTempDir(t testing.TB, prefix string) string {
	t.Helper()
	d, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// Builder builds commands of the module once per test binary, into a temporary directory that
// Remove deletes (call it from TestMain after m.Run).
type Builder struct {
	// Race builds with -race (when the tests run with it, so the binaries are checked too).
	Race bool
	// Prefix names the temporary directory.
	Prefix string
	// Tags are build tags for the binaries (e.g. "rbd": a test file under that tag sets it,
	// so that `go test -tags rbd` tests binaries built with it).
	Tags string

	once sync.Once
	dir  string
	err  error
}

// Build builds pkgs (import paths) on the first call and returns the directory holding the
// binaries; a build failure fails t, on this call and every later one.
func (b *Builder) Build(t testing.TB, pkgs ...string) string {
	t.Helper()
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", b.Prefix+"bin-"); b.err != nil {
			return
		}
		for _, pkg := range pkgs {
			args := []string{"build", "-o", b.dir}
			if b.Race {
				args = append(args, "-race")
			}
			if b.Tags != "" {
				args = append(args, "-tags", b.Tags)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			out, err := exec.CommandContext(ctx, GoTool(), append(args, pkg)...).CombinedOutput()
			cancel()
			if err != nil {
				b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
				return
			}
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.dir
}

// Remove deletes the binaries.
func (b *Builder) Remove() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

// GoTool is the go command of the toolchain running the tests.
func GoTool() string {
	root := os.Getenv("GOROOT")
	if root == "" {
		if out, err := exec.Command("go", "env", "GOROOT").Output(); err == nil {
			root = strings.TrimSpace(string(out))
		}
	}
	if root == "" {
		root = "/usr/local/go"
	}
	return filepath.Join(root, "bin", "go")
}

// SyncBuffer is a bytes.Buffer safe for concurrent use: a child process's output written by
// exec's copying goroutine while the test reads it. It keeps the first 64 MiB and drops the
// rest (the start holds the configuration and the first errors).
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() > 64<<20 {
		return len(p), nil
	}
	return s.b.Write(p)
}

// String returns what was written (up to the bound).
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// LoopbackConfig is the start of an srpd configuration (YAML, version 1) with one softroce
// transport, lo, on 127.0.0.1 and udpPort; the test's targets, sessions and other sections
// follow it.
func LoopbackConfig(udpPort int) string {
	return fmt.Sprintf("version: 1\ntransports:\n  - name: lo\n    address: 127.0.0.1\n    udp_port: %d\n", udpPort)
}

// Proc is a child process that a test started (StartProc).
type Proc struct {
	Cmd  *exec.Cmd
	Done chan struct{} // closed once the process has exited
	Err  error         // what Wait returned; set before Done is closed
}

// StartProc starts cmd and waits for it in the background. When the test ends, a process
// still running is killed (by its PID: only the process this test started) and waited for; if
// the test failed, what output returns then (e.g. the last lines the process wrote) is logged.
func StartProc(t testing.TB, cmd *exec.Cmd, output func() string) *Proc {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Proc{Cmd: cmd, Done: make(chan struct{})}
	go func() {
		p.Err = cmd.Wait()
		close(p.Done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.Done:
		default:
			_ = cmd.Process.Kill()
			<-p.Done
		}
		if t.Failed() {
			t.Logf("%s (pid %d) output:\n%s", filepath.Base(cmd.Path), cmd.Process.Pid, output())
		}
	})
	return p
}
