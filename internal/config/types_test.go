package config

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want Size
		err  string
	}{
		{"0", 0, ""},
		{"4096", 4096, ""},
		{"64MiB", 64 << 20, ""},
		{"64 MiB", 64 << 20, ""},
		{"1GiB", 1 << 30, ""},
		{"1G", 1 << 30, ""},
		{"1gib", 1 << 30, ""},
		{"2Ti", 2 << 40, ""},
		{"1KB", 1000, ""},
		{"1kB", 1000, ""},
		{"3MB", 3_000_000, ""},
		{"512B", 512, ""},
		{"1PiB", 1 << 50, ""},
		{"8191PiB", 8191 << 50, ""},
		{"8192PiB", 0, "too large"},
		{"99999999999999999999", 0, "too large"},
		{"1.5GiB", 0, "unknown unit"},
		{"-1", 0, "want a whole number"},
		{"MiB", 0, "want a whole number"},
		{"", 0, "want a whole number"},
		{"12XB", 0, `unknown unit "XB"`},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ParseSize(%q) = %v, %v; want error %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseSize(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestSizeString(t *testing.T) {
	for _, tt := range []struct {
		in   Size
		want string
	}{{0, "0"}, {512, "512"}, {1024, "1KiB"}, {64 << 20, "64MiB"}, {1536 << 20, "1536MiB"}, {8276, "8276"}, {1 << 50, "1PiB"}} {
		if got := tt.in.String(); got != tt.want {
			t.Errorf("Size(%d).String() = %q, want %q", int64(tt.in), got, tt.want)
		}
		back, err := ParseSize(tt.in.String())
		if err != nil || back != tt.in {
			t.Errorf("ParseSize(%q) = %v, %v", tt.in.String(), back, err)
		}
	}
}

func TestTimeoutParse(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want string
		err  bool
	}{{"off", "off", false}, {"OFF", "off", false}, {"15s", "15s", false}, {"0s", "0s", false}, {"10m", "10m0s", false},
		{"-1s", "", true}, {"15", "", true}, {"never", "", true}} {
		got, err := ParseTimeout(tt.in)
		if (err != nil) != tt.err || (err == nil && got.String() != tt.want) {
			t.Errorf("ParseTimeout(%q) = %v, %v", tt.in, got, err)
		}
	}
	if d := TimeoutOff().Duration(); d != 0 {
		t.Errorf("off duration %v", d)
	}
	if d := TimeoutOf(3 * time.Second).Duration(); d != 3*time.Second {
		t.Errorf("duration %v", d)
	}
}

func TestSmallTypes(t *testing.T) {
	if m, err := ParseFileMode("0660"); err != nil || m != 0o660 || m.String() != "0660" {
		t.Errorf("ParseFileMode(0660) = %v, %v", m, err)
	}
	if m, err := ParseFileMode("0o600"); err != nil || m != 0o600 {
		t.Errorf("ParseFileMode(0o600) = %v, %v", m, err)
	}
	for _, bad := range []string{"1777", "888", "", "rw"} {
		if _, err := ParseFileMode(bad); err == nil {
			t.Errorf("ParseFileMode(%q) accepted", bad)
		}
	}
	if x, err := ParseID64("10"); err != nil || x != 16 || x.String() != "0x0000000000000010" {
		t.Errorf("ParseID64(10) = %v, %v (hexadecimal, like ib_srp)", x, err)
	}
	for _, bad := range []string{"", "0x", "12345678901234567", "g"} {
		if _, err := ParseID64(bad); err == nil {
			t.Errorf("ParseID64(%q) accepted", bad)
		}
	}
	if i, err := ParseInitiatorID("*"); err != nil || !i.Any || i.String() != "*" {
		t.Errorf("ParseInitiatorID(*) = %v, %v", i, err)
	}
	p := MakePortID(1, 2)
	if i, err := ParseInitiatorID(p.String()); err != nil || i.Any || !i.Matches(p) {
		t.Errorf("ParseInitiatorID(%s) = %v, %v", p, i, err)
	}
	if p.IDExt() != 1 || p.GUID() != 2 || p.SRP().GUID() != 2 {
		t.Errorf("PortID halves")
	}
}

func TestJSONRoundTrip(t *testing.T) {
	tg := Target{
		Name: "t", PortID: MakePortID(1, 2), Listen: []string{"::1"},
		LUNs: []LUN{{ID: 1, Backend: "file", Path: "/x", Size: 1 << 30, Create: true}},
		ACLs: []ACL{{Initiator: AnyInitiator, LUNs: []int{1}}, {Initiator: InitiatorID{ID: MakePortID(3, 4)}, ReadOnly: true}},
	}
	tg.SetDefaults()
	b, err := json.Marshal(tg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"port_id":"0x00000000000000010000000000000002"`, `"size":1073741824`, `"initiator":"*"`, `"immediate_data":true`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("JSON %s lacks %s", b, want)
		}
	}
	var back Target
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !deepEqual(&tg, &back) {
		t.Fatalf("JSON round trip:\n%+v\n%+v", tg, back)
	}
	s := Session{Name: "s", Address: "h", TargetPortID: MakePortID(1, 1), InitiatorExt: 7}
	s.SetDefaults()
	s.DevLossTmo = TimeoutOff()
	b, _ = json.Marshal(s)
	if !strings.Contains(string(b), `"dev_loss_tmo":"off"`) || !strings.Contains(string(b), `"initiator_ext":"0x0000000000000007"`) {
		t.Errorf("session JSON %s", b)
	}
	var sb Session
	if err := json.Unmarshal(b, &sb); err != nil || !deepEqual(&s, &sb) {
		t.Fatalf("session JSON round trip: %v\n%+v\n%+v", err, s, sb)
	}
	// Sizes in JSON may be strings with units too; negative and fractional ones are refused.
	var l LUN
	if err := json.Unmarshal([]byte(`{"size":"2MiB"}`), &l); err != nil || l.Size != 2<<20 {
		t.Errorf("size string: %v %v", l.Size, err)
	}
	for _, bad := range []string{`{"size":-1}`, `{"size":1.5}`, `{"size":"1.5G"}`} {
		if err := json.Unmarshal([]byte(bad), &l); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
