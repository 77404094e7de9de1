// Package testutil holds small helpers that tests of several packages share: free loopback
// ports and short temporary directories (unix socket paths are limited to 107 bytes, and
// t.TempDir() embeds the test's name). Only _test.go files import it.
package testutil

import (
	"net"
	"os"
	"testing"
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
