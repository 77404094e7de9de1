package main

import (
	"strings"
	"testing"
)

// TestLiveCommandUsage: the live-change commands refuse what they cannot send, before any
// call to srpd (exit 2, the message naming the flags to give).
func TestLiveCommandUsage(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"lun", "resize", "demo", "0"}, "give --size or --rescan"},
		{[]string{"lun", "resize", "demo", "0", "--size", "1GiB", "--rescan"}, "give --size or --rescan"},
		{[]string{"lun", "resize", "demo", "0", "--size", "lots"}, "--size"},
		{[]string{"lun", "resize", "demo", "x", "--rescan"}, `LUN "x"`},
		{[]string{"lun", "set", "demo", "0"}, "nothing to change"},
		{[]string{"acl", "set", "demo", "nonsense"}, "nonsense"},
	} {
		code, stdout, stderr := h.run("", tc.args...)
		if code != exitUsage || !strings.Contains(stderr, tc.msg) {
			t.Errorf("srpctl %s: exit %d, stderr %q, stdout %q; want exit %d and %q", strings.Join(tc.args, " "), code, stderr, stdout, exitUsage, tc.msg)
		}
	}
}
