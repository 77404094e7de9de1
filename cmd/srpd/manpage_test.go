package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
)

// flagLine matches a flag in the flag package's usage output: "  -name type" or "  -name\t...".
var flagLine = regexp.MustCompile(`(?m)^  -([a-z][a-z0-9-]*)`)

// usageFlags returns the flag names `srpd ARGS -h` prints.
func usageFlags(t *testing.T, args ...string) []string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(append(args, "-h"), &out, &errb); code != exitOK && code != exitUsage {
		t.Fatalf("srpd %v -h: exit %d\n%s", args, code, errb.String())
	}
	var names []string
	for _, m := range flagLine.FindAllStringSubmatch(errb.String(), -1) {
		names = append(names, m[1])
	}
	return names
}

// documented reports whether the roff source mentions the flag: \-name or \-\-name, with the
// name's dashes escaped (\-), not followed by more of a name (so -c is not found in -check).
func documented(page, name string) bool {
	esc := regexp.QuoteMeta(strings.ReplaceAll(name, "-", `\-`))
	return regexp.MustCompile(`\\-(\\-)?` + esc + `([^a-z0-9\\]|\\[^-]|$)`).MatchString(page)
}

// TestManPageFlags: packaging/srpd.8 is written by hand; every flag of the daemon and of
// `srpd demo` must be in it.
func TestManPageFlags(t *testing.T) {
	b, err := os.ReadFile("../../packaging/srpd.8")
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	daemon, demo := usageFlags(t), usageFlags(t, "demo")
	if len(daemon) < 6 || len(demo) < 8 {
		t.Fatalf("parsed too few flags from the usage (daemon %v, demo %v): has its format changed?", daemon, demo)
	}
	for _, name := range append(daemon, demo...) {
		if !documented(page, name) {
			t.Errorf("packaging/srpd.8 does not document -%s", name)
		}
	}
	// The matcher has teeth: a prefix of a documented flag, or a flag that is not there, is
	// not found.
	for _, name := range []string{"chec", "log", "no-such-flag"} {
		if documented(page, name) {
			t.Errorf("documented(%q) = true, want false", name)
		}
	}
}
