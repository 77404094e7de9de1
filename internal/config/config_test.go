package config

import (
	"errors"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/configs"
)

// minimal is a small valid configuration that the tests extend.
const minimal = `
transports:
  - name: lo
    address: 127.0.0.1
targets:
  - name: t
    port_id: 0x00000000000000010000000000000001
    luns:
      - id: 0
        backend: ram
        size: 64MiB
    acls:
      - initiator: "*"
`

func mustParse(t *testing.T, src string) *Config {
	t.Helper()
	c, err := Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func TestExampleConfigsValidate(t *testing.T) {
	files, err := fs.Glob(configs.FS(), "*.yaml")
	if err != nil || len(files) < 4 {
		t.Fatalf("configs: %v files, err %v (want the reference, demo, target-only and initiator-only configs)", files, err)
	}
	for _, name := range files {
		t.Run(name, func(t *testing.T) {
			data, err := fs.ReadFile(configs.FS(), name)
			if err != nil {
				t.Fatal(err)
			}
			c, err := Parse(name, data)
			if err != nil {
				t.Fatalf("configs/%s does not validate:\n%v", name, err)
			}
			out, err := Marshal(c)
			if err != nil {
				t.Fatal(err)
			}
			c2, err := Parse(name+" (marshalled)", out)
			if err != nil {
				t.Fatalf("marshalled configs/%s does not parse:\n%v\n%s", name, err, out)
			}
			if !Equal(c, c2) {
				t.Fatalf("configs/%s changes through Marshal/Parse:\n%s", name, out)
			}
		})
	}
	// The reference config documents every option: it must use every field of the schema.
	data, _ := fs.ReadFile(configs.FS(), "srpd.reference.yaml")
	ref := string(data)
	for _, key := range []string{"version", "transports", "driver", "address", "interface", "udp_port",
		"socket_buffer", "mtu", "busy_poll", "keep_icrc", "device", "port", "targets", "transport", "port_id", "id_ext", "ioc_guid", "listen",
		"cm_port", "luns", "id", "backend", "path", "size", "create", "direct", "block_size", "read_only",
		"serial", "acls", "initiator", "limits", "max_channels", "queue_depth", "max_it_iu_len",
		"max_ti_iu_len", "immediate_data", "sessions", "source", "target_port_id", "initiator_ext",
		"ch_count", "connect_timeout", "reconnect_delay", "fast_io_fail_tmo", "dev_loss_tmo", "nbd", "lun",
		"socket", "max_connections", "write_timeout", "control", "mode", "group", "logging", "level", "format", "metrics",
		"max_sessions", "max_registered_memory", "keepalive_interval", "stall_timeout", "stall_action",
		"max_sessions_per_initiator", "max_pending_logins", "max_pending_logins_per_source",
		"login_rate_per_source", "login_timeout", "allowed_paths", "follow_symlinks",
		"rbd", "cluster_config", "client", "keyring", "pool", "namespace", "image",
		"multipath", "no_path_timeout", "shared", "packet_life_time"} {
		if !strings.Contains(ref, key+":") {
			t.Errorf("srpd.reference.yaml does not document %q", key)
		}
	}
}

func TestDemoConfig(t *testing.T) {
	c, err := Parse(configs.DemoFile, configs.Demo())
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Targets) != 1 || len(c.Targets[0].LUNs) != 1 || c.Targets[0].LUNs[0].Backend != BackendRAM {
		t.Fatalf("the demo config should have one target with one RAM LUN: %+v", c.Targets)
	}
	if tr := c.Transports[0]; tr.Driver != DriverSoftRoCE || tr.Address != "127.0.0.1" {
		t.Fatalf("the demo config should use softroce on 127.0.0.1: %+v", tr)
	}
}

func TestDefaults(t *testing.T) {
	c := mustParse(t, minimal+`
sessions:
  - name: s
    address: 127.0.0.1
    target_port_id: 00000000000000010000000000000001
`)
	tg := c.Targets[0]
	s := c.Sessions[0]
	checks := []struct {
		name      string
		got, want any
	}{
		{"version", c.Version, 1},
		{"driver", c.Transports[0].Driver, "softroce"},
		{"udp_port", c.Transports[0].UDPPort, 4791},
		{"socket_buffer", c.Transports[0].SocketBuffer, Size(4 << 20)},
		{"mtu", c.Transports[0].MTU, 4096},
		{"target transport", tg.Transport, "lo"},
		{"cm_port", tg.CMPort, 5555},
		{"block_size", tg.LUNs[0].BlockSize, 512},
		{"max_channels", tg.Limits.MaxChannels, 8},
		{"queue_depth", tg.Limits.QueueDepth, 128},
		{"max_it_iu_len", tg.Limits.MaxITIULen, Size(8276)},
		{"max_ti_iu_len", tg.Limits.MaxTIIULen, Size(256)},
		{"immediate_data", *tg.Limits.ImmediateData, true},
		{"session transport", s.Transport, "lo"},
		{"session port", s.Port, 5555},
		{"ch_count", s.ChCount, 1},
		{"session queue_depth", s.QueueDepth, 64},
		{"reconnect_delay", s.ReconnectDelay.String(), "10s"},
		{"fast_io_fail_tmo", s.FastIOFailTmo.String(), "15s"},
		{"dev_loss_tmo", s.DevLossTmo.String(), "10m0s"},
		{"connect_timeout", s.ConnectTimeout.String(), "10s"},
		{"control socket", c.Control.Socket, "/run/srpd/srpd.sock"},
		{"control mode", c.Control.Mode, FileMode(0o660)},
		{"log level", c.Logging.Level, "info"},
		{"log format", c.Logging.Format, "auto"},
	}
	for _, ck := range checks {
		if ck.got != ck.want {
			t.Errorf("%s = %v, want %v", ck.name, ck.got, ck.want)
		}
	}
	// SetDefaults is idempotent.
	cp := c.Clone()
	cp.SetDefaults()
	if !Equal(c, cp) {
		t.Error("SetDefaults changed a defaulted config")
	}
}

func TestEmptyConfig(t *testing.T) {
	for _, src := range []string{"", "\n# nothing\n", "---\n", "~\n"} {
		c, err := Parse("empty.yaml", []byte(src))
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		if c.Control.Socket != DefaultControlSocket || len(c.Targets) != 0 {
			t.Fatalf("%q: %+v", src, c)
		}
	}
}

// TestParseErrors checks the message (file:line: path: text) and the sentinel of each problem.
func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string // substrings, one per expected error, in order
		is   error
	}{
		{"syntax", "targets:\n  - name: [\n", []string{"test.yaml:2: invalid YAML"}, ErrSyntax},
		{"two documents", "version: 1\n---\nversion: 1\n", []string{"more than one YAML document"}, ErrSyntax},
		{"root not a mapping", "- a\n- b\n", []string{"test.yaml:1: the configuration must be a mapping"}, ErrType},
		{"unknown top-level", "verison: 1\n", []string{`test.yaml:1: verison: unknown field (did you mean "version"?)`}, ErrUnknownField},
		{"unknown nested", minimal + "    limits:\n      queue_dept: 4\n",
			[]string{`test.yaml:15: target "t": limits.queue_dept: unknown field (did you mean "queue_depth"?)`}, ErrUnknownField},
		{"unknown far off", "control:\n  flavour: x\n", []string{"control.flavour: unknown field (valid: socket, mode, group)"}, ErrUnknownField},
		{"duplicate key", "logging:\n  level: info\n  level: debug\n", []string{"test.yaml:3: logging.level: duplicate key (first at line 2)"}, ErrDuplicate},
		{"wrong kind list", "targets:\n  name: t\n", []string{"test.yaml:2: targets: must be a list, not a mapping"}, ErrType},
		{"wrong kind int", minimal + "    cm_port: high\n", []string{`test.yaml:14: target "t": cm_port: must be an integer, not "high"`}, ErrType},
		{"wrong kind bool", minimal + "    limits:\n      immediate_data: yes\n", []string{`target "t": limits.immediate_data: must be true or false, not "yes"`}, ErrType},
		{"busy poll too long", strings.Replace(minimal, "address: 127.0.0.1", "address: 127.0.0.1\n    busy_poll: 2ms", 1),
			[]string{`busy_poll: 2ms is longer than 1ms`}, ErrInvalid},
		{"busy poll negative", strings.Replace(minimal, "address: 127.0.0.1", "address: 127.0.0.1\n    busy_poll: -1us", 1),
			[]string{`busy_poll: invalid timeout "-1us"`}, ErrInvalid},
		{"bad size unit", strings.Replace(minimal, "64MiB", "64XB", 1), []string{`test.yaml:11: target "t" LUN 0: size: invalid size "64XB": unknown unit`}, ErrInvalid},
		{"size not multiple", strings.Replace(minimal, "size: 64MiB", "size: 65000\n        block_size: 4096", 1),
			[]string{"test.yaml:11: target \"t\" LUN 0: size: 65000 must be a multiple of the block size (4096)"}, ErrInvalid},
		{"bad block size", strings.Replace(minimal, "size: 64MiB", "size: 64MiB\n        block_size: 1024", 1),
			[]string{"test.yaml:12: target \"t\" LUN 0: block_size: 1024 must be 512 or 4096"}, ErrInvalid},
		{"ram without size", strings.Replace(minimal, "        size: 64MiB\n", "", 1),
			[]string{"test.yaml:9: target \"t\" LUN 0: size: the ram backend needs a size"}, ErrMissing},
		{"missing port id", strings.Replace(minimal, "    port_id: 0x00000000000000010000000000000001\n", "", 1),
			[]string{"test.yaml:6: target \"t\": port_id: required"}, ErrMissing},
		{"bad port id", strings.Replace(minimal, "0x00000000000000010000000000000001", "0x1234", 1),
			[]string{`test.yaml:7: target "t": port_id: invalid port id "0x1234"`}, ErrInvalid},
		{"undefined transport", strings.Replace(minimal, "  - name: t\n", "  - name: t\n    transport: eth9\n", 1),
			[]string{`test.yaml:7: target "t": transport: transport "eth9" is not defined`}, ErrReference},
		{"acl names missing LUN", minimal + "        luns: [0, 3]\n",
			[]string{"test.yaml:14: target \"t\" ACL *: luns[1]: LUN 3 is not defined in this target"}, ErrReference},
		{"duplicate LUN", strings.Replace(minimal, "    acls:", "      - id: 0\n        backend: ram\n        size: 1MiB\n    acls:", 1),
			[]string{"test.yaml:12: target \"t\": luns[1].id: LUN 0 is already defined by luns[0]"}, ErrDuplicate},
		{"duplicate target", minimal + "  - name: t\n    port_id: 0x00000000000000010000000000000002\n",
			[]string{`test.yaml:14: targets[1].name: target "t" is already defined by targets[0]`}, ErrDuplicate},
		{"listen outside the transport", minimal + "    listen: [10.1.1.1]\n",
			[]string{`target "t": listen[0]: 10.1.1.1 is not an address of transport "lo"`}, ErrInvalid},
		{"softroce needs an address", "transports:\n  - name: x\n", []string{"test.yaml:2: transport \"x\": address: the softroce driver needs an address or an interface"}, ErrMissing},
		{"verbs without the tag", "transports:\n  - name: x\n    driver: verbs:mlx5_0\n", []string{"transport \"x\": driver: this build of srpd has no verbs support"}, ErrUnsupported},
		{"stall action", minimal + "    limits:\n      stall_action: panic\n",
			[]string{`test.yaml:15: target "t": limits.stall_action: "panic" must be close or log`}, ErrInvalid},
		{"keepalive too short", minimal + "    limits:\n      keepalive_interval: 1ms\n",
			[]string{`target "t": limits.keepalive_interval: 1ms is too short: at least 100ms, or off`}, ErrInvalid},
		{"negative max sessions", minimal + "    limits:\n      max_sessions: -1\n",
			[]string{`target "t": limits.max_sessions: -1 is out of range`}, ErrInvalid},
		{"global login timeout", "limits:\n  login_timeout: 1ms\n",
			[]string{`limits.login_timeout: 1ms is too short: at least 100ms`}, ErrInvalid},
		{"global unknown", "limits:\n  max_session: 4\n",
			[]string{`limits.max_session: unknown field (did you mean "max_sessions"?)`}, ErrUnknownField},
		{"mtu", "transports:\n  - name: x\n    address: ::1\n    mtu: 1500\n", []string{"test.yaml:4: transport \"x\": mtu: 1500 must be 256, 512, 1024, 2048 or 4096"}, ErrInvalid},
		{"log level", "logging:\n  level: verbose\n", []string{`test.yaml:2: logging.level: "verbose" must be debug, info, warn or error`}, ErrInvalid},
		{"control mode", "control:\n  mode: \"0440\"\n", []string{"control.mode: 0440 must give the owner read and write"}, ErrInvalid},
		{"control mode syntax", "control:\n  mode: rw\n", []string{`control.mode: invalid mode "rw"`}, ErrInvalid},
		{"relative path", strings.Replace(minimal, "backend: ram\n        size: 64MiB", "backend: file\n        path: disk.img", 1),
			[]string{`target "t" LUN 0: path: "disk.img" must be an absolute path`}, ErrInvalid},
		{"create read-only", strings.Replace(minimal, "backend: ram\n        size: 64MiB", "backend: file\n        path: /d.img\n        create: true\n        size: 1GiB\n        read_only: true", 1),
			[]string{"target \"t\" LUN 0: create: a read-only LUN cannot create its file"}, ErrInvalid},
		{"blockdev size", strings.Replace(minimal, "backend: ram", "backend: blockdev\n        path: /dev/sdb", 1),
			[]string{"target \"t\" LUN 0: size: does not apply to the blockdev backend"}, ErrInvalid},
		{"shared file", strings.Replace(minimal, "    acls:", "      - id: 1\n        backend: file\n        path: /d.img\n      - id: 2\n        backend: file\n        path: /d.img\n    acls:", 1),
			[]string{"test.yaml:17: target \"t\" LUN 2: path: /d.img is already exported by target \"t\" LUN 1"}, ErrDuplicate},
		{"no transports", "targets:\n  - name: t\n    port_id: 00000000000000010000000000000001\n", []string{"transports: at least one transport is required"}, ErrMissing},
		{"alias bomb", "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n", []string{"a: unknown field", "b: unknown field", "c: unknown field"}, ErrUnknownField},
		{"merge key", "logging:\n  <<: {level: info}\n", []string{"logging.<<: merge keys (<<) are not supported"}, ErrSyntax},
		{"several at once", "version: 2\nlogging:\n  level: loud\n  format: xml\n", []string{
			"test.yaml:1: version: unsupported version 2",
			`test.yaml:3: logging.level: "loud" must be`,
			`test.yaml:4: logging.format: "xml" must be auto, json or console`}, ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("test.yaml", []byte(tt.src))
			if err == nil {
				t.Fatalf("no error; config %+v", c)
			}
			var list ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("error %T is not an ErrorList: %v", err, err)
			}
			if len(list) != len(tt.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(list), len(tt.want), err)
			}
			for i, w := range tt.want {
				if !strings.Contains(list[i].Error(), w) {
					t.Errorf("error %d = %q, want it to contain %q", i, list[i].Error(), w)
				}
			}
			if !errors.Is(err, tt.is) {
				t.Errorf("errors.Is(err, %v) = false: %v", tt.is, err)
			}
			var e *Error
			if !errors.As(err, &e) || e.File != "test.yaml" {
				t.Errorf("errors.As(*Error) = %+v", e)
			}
		})
	}
}

// TestSessionTimeouts checks the srp_tmo_valid rules of scsi_transport_srp.c.
func TestSessionTimeouts(t *testing.T) {
	tests := []struct {
		rd, ff, dl string
		want       string // "" = valid
		path       string
	}{
		{"10s", "15s", "600s", "", ""},
		{"off", "15s", "600s", "", ""},
		{"10s", "off", "off", "", ""},
		{"10s", "0s", "1s", "", ""}, // fast_io_fail 0 is valid: fail at once
		{"10s", "15s", "off", "", ""},
		{"off", "off", "600s", "", ""},
		{"off", "off", "off", "must not all be off", "reconnect_delay"},
		{"0s", "15s", "600s", "must not be 0s", "reconnect_delay"},
		{"10s", "601s", "off", "at most 10m0s (SCSI_DEVICE_BLOCK_MAX_TIMEOUT)", "fast_io_fail_tmo"},
		{"10s", "600s", "off", "", ""},
		{"10s", "off", "601s", "while fast_io_fail_tmo is off", "dev_loss_tmo"},
		{"10s", "off", "3600s", "while fast_io_fail_tmo is off", "dev_loss_tmo"},
		{"10s", "15s", "3600s", "", ""}, // dev_loss may exceed 600 s while fast_io_fail is set
		{"10s", "15s", "15s", "must be less than dev_loss_tmo", "fast_io_fail_tmo"},
		{"10s", "20s", "15s", "must be less than dev_loss_tmo", "fast_io_fail_tmo"},
		{"1500ms", "15s", "600s", "whole number of seconds", "reconnect_delay"},
	}
	for _, tt := range tests {
		name := tt.rd + "/" + tt.ff + "/" + tt.dl
		t.Run(name, func(t *testing.T) {
			src := minimal + "sessions:\n  - name: s\n    address: 127.0.0.1\n    target_port_id: 00000000000000010000000000000001\n" +
				"    reconnect_delay: " + tt.rd + "\n    fast_io_fail_tmo: " + tt.ff + "\n    dev_loss_tmo: " + tt.dl + "\n"
			_, err := Parse("test.yaml", []byte(src))
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.want != "" && err == nil:
				t.Fatalf("no error, want %q", tt.want)
			case tt.want != "":
				if !strings.Contains(err.Error(), `session "s": `+tt.path+": ") || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("error %q, want %q on %s", err, tt.want, tt.path)
				}
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("not ErrInvalid: %v", err)
				}
			}
		})
	}
}

func TestNoLineForConfigBuiltInCode(t *testing.T) {
	c := &Config{Logging: Logging{Level: "chatty"}}
	c.SetDefaults()
	err := c.Validate()
	if err == nil || err.Error() != `logging.level: "chatty" must be debug, info, warn or error` {
		t.Fatalf("Validate = %v", err)
	}
	// A parsed config keeps its positions for a later Validate.
	p := mustParse(t, minimal)
	p.Targets[0].LUNs[0].BlockSize = 4000
	if err := p.Validate(); err == nil || !strings.HasPrefix(err.Error(), `test.yaml:9: target "t" LUN 0: block_size: 4000`) {
		t.Fatalf("Validate = %v", err)
	}
}

func TestStandaloneValidate(t *testing.T) {
	tg := &Target{Name: "x", PortID: MakePortID(1, 2), LUNs: []LUN{{ID: 0, Backend: "ram", Size: 1000}}}
	tg.SetDefaults()
	if err := tg.Validate(); err == nil || err.Error() != "LUN 0: size: 1000 must be a multiple of the block size (512)" {
		t.Fatalf("Target.Validate = %v", err)
	}
	l := &LUN{ID: 99999, Backend: "file", Path: "/a/../b"}
	l.SetDefaults()
	err := l.Validate()
	if err == nil || !strings.Contains(err.Error(), "id: 99999 is out of range") || !strings.Contains(err.Error(), `path: "/a/../b" is not a clean path (use "/b")`) {
		t.Fatalf("LUN.Validate = %v", err)
	}
	a := &ACL{}
	if err := a.Validate(); !errors.Is(err, ErrMissing) {
		t.Fatalf("ACL.Validate = %v", err)
	}
	s := &Session{Name: "s", Address: "host.example", TargetPortID: MakePortID(1, 1), NBD: []NBDExport{{LUN: 0, Socket: "/run/" + strings.Repeat("x", 120)}}}
	s.SetDefaults()
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "nbd[0].socket: path is 125 bytes long, longer than 107") {
		t.Fatalf("Session.Validate = %v", err)
	}
}

func TestParseTarget(t *testing.T) {
	tg, err := ParseTarget("t.yaml", []byte("name: x\nport_id: {id_ext: 1, ioc_guid: 0x2}\nluns:\n  - {id: 3, backend: ram, size: 1MiB}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if tg.PortID != MakePortID(1, 2) || tg.LUNs[0].BlockSize != 512 || tg.CMPort != 5555 {
		t.Fatalf("%+v", tg)
	}
	_, err = ParseTarget("t.yaml", []byte("name: x\nport_id: 00000000000000010000000000000001\nluns:\n  - {id: 3, backend: ram}\n"))
	if err == nil || err.Error() != "t.yaml:4: LUN 3: size: the ram backend needs a size (e.g. 64MiB)" {
		t.Fatalf("ParseTarget = %v", err)
	}
	s, err := ParseSession("s.json", []byte(`{"name": "s", "address": "10.0.0.2", "target_port_id": "0x00000000000000010000000000000001", "dev_loss_tmo": "off"}`))
	if err != nil {
		t.Fatal(err)
	}
	if !s.DevLossTmo.Off() || s.Port != 5555 {
		t.Fatalf("%+v", s)
	}
}

func TestPortIDForms(t *testing.T) {
	want := MakePortID(0x0002c903000f1234, 0x0002c903000f5678)
	for _, src := range []string{
		"0x0002c903000f12340002c903000f5678",
		"0002c903000f12340002c903000f5678",
		`"0002:c903:000f:1234:0002:c903:000f:5678"`,
		"{id_ext: 0002c903000f1234, ioc_guid: 0x0002c903000f5678}",
	} {
		c := mustParse(t, strings.Replace(minimal, "0x00000000000000010000000000000001", src, 1))
		if got := c.Targets[0].PortID; got != want {
			t.Errorf("%s: %v, want %v", src, got, want)
		}
	}
	for _, src := range []string{"{id_ext: 1}", "{id_ext: 1, ioc_guid: 2, x: 3}", "[1, 2]", "{id_ext: zz, ioc_guid: 1}"} {
		if _, err := Parse("t.yaml", []byte(strings.Replace(minimal, "0x00000000000000010000000000000001", src, 1))); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", src, err)
		}
	}
}

// TestErrorsNameObjects checks that problems are located by object name, that an object whose
// name cannot identify it (a duplicate) keeps its index, and that cross-references name the
// other object: an operator knows targets and sessions by name, and an object sent through
// the control API has no index in any file.
func TestErrorsNameObjects(t *testing.T) {
	c := mustParse(t, minimal)
	c.Targets = append(c.Targets, Target{Name: "storage", PortID: c.Targets[0].PortID,
		LUNs: []LUN{{ID: 3, Backend: BackendRAM, Size: 1000}}})
	c.Targets = append(c.Targets, Target{Name: "storage", PortID: MakePortID(9, 9)})
	sess := Session{Address: "10.0.0.2", TargetPortID: MakePortID(1, 1)}
	for _, n := range []string{"a", "b"} {
		s := sess
		s.Name = n
		c.Sessions = append(c.Sessions, s)
	}
	c.SetDefaults()
	err := c.Validate()
	for _, want := range []string{
		`target "storage": port_id: port id ` + c.Targets[0].PortID.String() + ` is already used by target "t" on the same transport`,
		`target "storage" LUN 3: size: 1000 must be a multiple of the block size (512)`,
		`targets[2].name: target "storage" is already defined by targets[1]`,
		`session "b": initiator_ext: session "a" already logs in to target port`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v\nwant a line containing %q", err, want)
		}
	}
	var list ErrorList
	if !errors.As(err, &list) || list[0].Path == "" || !strings.HasPrefix(list[0].Path, "targets[") {
		t.Errorf("Path keeps the field path for programs: %+v", list)
	}
}

// TestBusyPollByRole: an omitted busy_poll is on for a transport only targets use (a storage
// host) and off for one that sessions use; a set one is taken as it is.
func TestBusyPollByRole(t *testing.T) {
	const sess = `
sessions:
  - name: s
    transport: lo
    address: 127.0.0.1
    target_port_id: 0x0002c903000f12340002c903000f1234
`
	for _, tc := range []struct {
		name, src string
		want      time.Duration
	}{
		{"target only", minimal, DefaultBusyPoll},
		{"target only, off", strings.Replace(minimal, "address: 127.0.0.1", "address: 127.0.0.1\n    busy_poll: off", 1), 0},
		{"target only, set", strings.Replace(minimal, "address: 127.0.0.1", "address: 127.0.0.1\n    busy_poll: 200us", 1), 200 * time.Microsecond},
		{"with a session", minimal + sess, 0},
		{"with a session, set", strings.Replace(minimal, "address: 127.0.0.1", "address: 127.0.0.1\n    busy_poll: 20us", 1) + sess, 20 * time.Microsecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, tc.src)
			if got := c.BusyPoll(&c.Transports[0]); got != tc.want {
				t.Fatalf("busy poll %v, want %v", got, tc.want)
			}
		})
	}
}

// TestMultipath checks the multipath section: a valid group, and each rule's error.
func TestMultipath(t *testing.T) {
	base := `version: 1
transports:
  - name: lo
    address: 127.0.0.1
sessions:
  - {name: a, address: 127.0.0.2, target_port_id: 0x00000000000000010000000000000001}
  - {name: b, address: 127.0.0.3, target_port_id: 0x00000000000000020000000000000001}
`
	ok := base + "multipath:\n  - name: vol\n    sessions: [a, b]\n    no_path_timeout: 20s\n    nbd:\n      - {lun: 0, socket: /run/srpd/vol.nbd}\n"
	c, err := Parse("test.yaml", []byte(ok))
	if err != nil {
		t.Fatal(err)
	}
	if m := c.MultipathGroup("vol"); m == nil || len(m.Sessions) != 2 || m.NoPathTimeout.Duration() != 20*time.Second || m.NBD[0].Socket != "/run/srpd/vol.nbd" {
		t.Fatalf("parsed %+v", c.Multipath)
	}
	for _, tc := range []struct{ name, src, want string }{
		{"one session", base + "multipath:\n  - {name: vol, sessions: [a]}\n", "needs two or more sessions"},
		{"unknown session", base + "multipath:\n  - {name: vol, sessions: [a, x]}\n", `no session "x"`},
		{"session twice", base + "multipath:\n  - {name: v1, sessions: [a, b]}\n  - {name: v2, sessions: [b, a]}\n", `already a path of multipath "v1"`},
		{"duplicate name", base + "multipath:\n  - {name: v, sessions: [a, b]}\n  - {name: v, sessions: []}\n", "v"},
		{"bad timeout", base + "multipath:\n  - {name: v, sessions: [a, b], no_path_timeout: 2h}\n", "between 1s and 1h"},
		{"socket reused", base + "control: {socket: /run/srpd/x.sock}\nmultipath:\n  - name: v\n    sessions: [a, b]\n    nbd: [{lun: 0, socket: /run/srpd/x.sock}]\n", "already used by control.socket"},
		{"path exports itself", strings.Replace(base, "target_port_id: 0x00000000000000010000000000000001}", "target_port_id: 0x00000000000000010000000000000001, nbd: [{lun: 0, socket: /run/a.nbd}]}", 1) +
			"multipath:\n  - {name: v, sessions: [a, b]}\n", "exports LUNs itself"},
		{"packet life time", strings.Replace(base, "address: 127.0.0.1", "address: 127.0.0.1\n    packet_life_time: 10s", 1), "between 1ms and 4s"},
	} {
		if _, err := Parse("test.yaml", []byte(tc.src)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error with %q", tc.name, err, tc.want)
		}
	}
	// A changed group is in the diff; a reload starts it again.
	c2, err := Parse("test.yaml", []byte(strings.Replace(ok, "20s", "25s", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(c, c2); !slices.Equal(d.Multipath.Changed, []string{"vol"}) || !slices.Contains(d.Summary(), "multipath vol changed") {
		t.Fatalf("diff %+v %q", d.Multipath, d.Summary())
	}
}
