package daemon

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/srpd/srpd/transport/softroce"
)

func TestConnStateFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "connections.json")
	if recs, err := readConnState(path); err != nil || recs != nil {
		t.Fatalf("missing file: %v %v, want none and no error", recs, err)
	}
	r := &connRecorder{d: New(Options{}), path: path, log: New(Options{}).log, stop: make(chan struct{})}
	r.sync() // no transports: an empty list
	recs, err := readConnState(path)
	if err != nil || len(recs) != 0 {
		t.Fatalf("empty state: %v %v", recs, err)
	}
	want := connRecord{Transport: "lo", ConnIdentity: softroce.ConnIdentity{
		Local: netip.MustParseAddr("10.0.0.1"), Remote: netip.MustParseAddrPort("10.0.0.2:4791"),
		LocalCommID: 0x1234, RemoteCommID: 0xabcd, RemoteQPN: 0x11}}
	if err := writeFileAtomic(path, []byte(`{"version":1,"pid":1,"connections":[{"transport":"lo","local":"10.0.0.1",`+
		`"remote":"10.0.0.2:4791","local_comm_id":4660,"remote_comm_id":43981,"remote_qpn":17}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if recs, err := readConnState(path); err != nil || len(recs) != 1 || recs[0] != want {
		t.Fatalf("read %+v %v, want %+v", recs, err, want)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v", fi.Mode(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}
	for _, bad := range []string{`{"version":2,"connections":[]}`, `{"version":1,"connections":[{"local":"nonsense"}]}`, `not json`} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := readConnState(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error %v, want one naming the file", bad, err)
		}
	}
}

func TestConnStatePath(t *testing.T) {
	for _, tc := range []struct {
		run  []string
		sock string
		want string
	}{
		{[]string{"/run/srpd"}, "/run/srpd/srpd.sock", "/run/srpd/connections.json"},
		{nil, "/tmp/x/ctl.sock", "/tmp/x/ctl.connections.json"},
		{[]string{}, "", ""},
	} {
		d := &Daemon{opts: Options{RunDirs: tc.run}}
		if got := d.connStatePath(tc.sock); got != tc.want {
			t.Errorf("run dirs %v, socket %q: %q, want %q", tc.run, tc.sock, got, tc.want)
		}
	}
}
