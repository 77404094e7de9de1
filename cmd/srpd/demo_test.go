package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestDemo runs the README's first command in-process (smaller): target and initiator
// over softroce's RDMA CM on UDP loopback with every byte verified, and checks the flag validation.
func TestDemo(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := run([]string{"demo", "-ios", "20", "-max-io-kib", "256", "-lun-mib", "8", "-channels", "2", "-workers", "3", "-timeout", "60s"}, &out, &errb); rc != 0 {
		t.Fatalf("srpd demo: exit %d\nstdout:\n%s\nstderr:\n%s", rc, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "every byte verified") || !strings.HasSuffix(out.String(), "PASS\n") {
		t.Fatalf("unexpected output:\n%s", out.String())
	}
}

func TestDemoUsage(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"-c"},
		{"--log-format", "xml", "-c", "x.yaml"},
		{"-c", "x.yaml", "extra"},
		{"demo", "-addr", "192.0.2.1"},
		{"demo", "-channels", "0"},
		{"demo", "-workers", "17"},
		{"demo", "-lun-mib", "1", "-max-io-kib", "4096"},
		{"demo", "-nosuchflag"},
	} {
		var out, errb bytes.Buffer
		if rc := run(args, &out, &errb); rc != 2 || errb.Len() == 0 {
			t.Errorf("srpd %q: exit %d, stderr %q; want exit 2 with a message", args, rc, errb.String())
		}
	}
}
