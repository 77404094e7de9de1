package main

import (
	"strings"
	"testing"
)

// TestVersionFlag: --version (and -v) print "srpctl VERSION" and need no daemon; VERSION is
// what the build stamped (make release: git describe) or the build info's.
func TestVersionFlag(t *testing.T) {
	h := newHarness(t)
	want := "srpctl " + versionString() + "\n"
	if strings.TrimSpace(versionString()) == "" {
		t.Fatal("versionString() is empty")
	}
	for _, flag := range []string{"--version", "-v"} {
		code, stdout, stderr := h.run("", "--socket", "/nonexistent/srpd.sock", flag)
		if code != exitOK || stdout != want || stderr != "" {
			t.Errorf("srpctl %s: exit %d, stdout %q (want %q), stderr %q", flag, code, stdout, want, stderr)
		}
	}
}
