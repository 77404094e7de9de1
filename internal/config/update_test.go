package config

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/srpd/srpd/configs"
)

// commented is an operator's file: comments above, beside and below values, blank lines,
// aligned line comments, a flow list, and explicit defaults (block_size: 512, cm_port).
const commented = `# storage host A: one target, two initiators.
version: 1

# LUNs only from here.
allowed_paths: [/var/lib/srpd, /dev]

transports:
  - name: lo
    address: 127.0.0.1          # loopback for the test

targets:
  - name: t
    port_id: 0x00000000000000010000000000000001
    cm_port: 5555               # the default, written out on purpose
    luns:
      - id: 0
        backend: ram
        size: 64MiB
        block_size: 512
    acls:
      - initiator: "*"          # anyone, for now
      # the backup host, read-only
      - initiator: 0x00000000000000005054000000000002
        read_only: true

logging:
  level: info                   # debug | info | warn | error
`

func commentLines(src string) []string {
	var out []string
	for _, l := range strings.Split(src, "\n") {
		if _, c, ok := strings.Cut(l, "#"); ok {
			out = append(out, strings.TrimSpace(c))
		}
	}
	return out
}

func mustUpdate(t *testing.T, data string, c *Config) string {
	t.Helper()
	out, err := Update([]byte(data), c)
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	got, err := Parse("updated.yaml", out)
	if err != nil {
		t.Fatalf("the updated file does not parse: %v\n%s", err, out)
	}
	if !Equal(got, c) {
		t.Fatalf("the updated file does not hold the configuration:\n%s", out)
	}
	return string(out)
}

// TestUpdateUnchangedIsIdentical: a file whose configuration did not change is left byte for
// byte, including the example configurations (comments, blank lines, flow lists).
func TestUpdateUnchangedIsIdentical(t *testing.T) {
	files, _ := fs.Glob(configs.FS(), "*.yaml")
	srcs := map[string]string{"commented": commented}
	for _, f := range files {
		data, _ := fs.ReadFile(configs.FS(), f)
		srcs[f] = string(data)
	}
	for name, src := range srcs {
		c := mustParse(t, src)
		if out := mustUpdate(t, src, c); out != src {
			t.Errorf("%s: an unchanged configuration rewrote the file:\n%s", name, out)
		}
	}
}

// TestUpdateAddLUNKeepsCommentsAndAddsOnlyNonDefaults is the --persist case of issue 21 (a
// 587-byte file became 1788 bytes, without its comments): adding a LUN adds the LUN's lines
// and nothing else.
func TestUpdateAddLUNKeepsCommentsAndAddsOnlyNonDefaults(t *testing.T) {
	c := mustParse(t, commented)
	next := c.Clone()
	if err := next.AddLUN("t", LUN{ID: 1, Backend: BackendRAM, Size: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	next.SetDefaults()
	out := mustUpdate(t, commented, next)
	want := strings.Replace(commented, "        block_size: 512\n",
		"        block_size: 512\n      - id: 1\n        backend: ram\n        size: 1GiB\n", 1)
	if out != want {
		t.Fatalf("adding a LUN:\n--- got (%d bytes)\n%s--- want (%d bytes)\n%s", len(out), out, len(want), want)
	}
	if full, _ := Marshal(next); len(out) >= len(full) {
		t.Errorf("the updated file (%d bytes) is not smaller than the full encoding (%d)", len(out), len(full))
	}
}

func TestUpdateEdits(t *testing.T) {
	base := mustParse(t, commented)
	for _, tc := range []struct {
		name string
		edit func(c *Config)
		// want: the lines the result must hold (in order), gone: text it must not hold.
		want, gone []string
	}{
		{"remove the commented ACL", func(c *Config) {
			if err := c.RemoveACL("t", InitiatorID{ID: MakePortID(0x5054000000000002>>64, 0x5054000000000002)}); err != nil {
				t.Fatal(err)
			}
		}, []string{`      - initiator: "*"          # anyone, for now`, "logging:"}, []string{"backup host", "read_only"}},
		{"change a value with a line comment", func(c *Config) { c.Logging.Level = "debug" },
			[]string{"  level: debug # debug | info | warn | error"}, []string{"level: info"}},
		{"back to a default removes the key", func(c *Config) { c.Targets[0].LUNs[0].Size = 32 << 20 },
			[]string{"        size: 32MiB", "        block_size: 512"}, nil},
		{"flow list stays a flow list", func(c *Config) { c.AllowedPaths = append(c.AllowedPaths, "/srv") },
			[]string{"# LUNs only from here.", "allowed_paths: [/var/lib/srpd, /dev, /srv]"}, nil},
		{"new section goes in struct order with its non-defaults only", func(c *Config) { c.Metrics.Listen = "127.0.0.1:9650" },
			[]string{"targets:", "metrics:", "  listen: 127.0.0.1:9650"}, []string{"control:", "socket:"}},
		{"new target with only its non-defaults", func(c *Config) {
			if err := c.AddTarget(Target{Name: "u", PortID: MakePortID(2, 2), CMPort: 5556,
				LUNs: []LUN{{ID: 0, Backend: BackendRAM, Size: 1 << 20}}, ACLs: []ACL{{Initiator: AnyInitiator}}}); err != nil {
				t.Fatal(err)
			}
		}, []string{"  - name: u", "    port_id: 0x00000000000000020000000000000002", "    cm_port: 5556", "      - id: 0", "        size: 1MiB"},
			[]string{"transport: lo", "max_channels", "queue_depth"}},
		{"explicit default dropped when the target setting goes back to it", func(c *Config) { c.Targets[0].Limits.MaxChannels = 2 },
			[]string{"    cm_port: 5555               # the default, written out on purpose", "    limits:", "      max_channels: 2"}, []string{"queue_depth"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := base.Clone()
			tc.edit(next)
			next.SetDefaults()
			if err := next.Validate(); err != nil {
				t.Fatal(err)
			}
			out := mustUpdate(t, commented, next)
			lines := strings.Split(out, "\n")
			at := 0
			for _, w := range tc.want {
				i := slices.Index(lines[at:], w)
				if i < 0 {
					t.Fatalf("want line %q (in this order):\n%s", w, out)
				}
				at += i + 1
			}
			for _, g := range tc.gone {
				if strings.Contains(out, g) {
					t.Errorf("%q should be gone:\n%s", g, out)
				}
			}
			// Every comment of the file is kept unless its object went away.
			for _, cm := range commentLines(commented) {
				if !strings.Contains(out, cm) && !slices.ContainsFunc(tc.gone, func(g string) bool { return strings.Contains(cm, g) }) {
					t.Errorf("comment %q lost:\n%s", cm, out)
				}
			}
			// A blank line still separates the sections.
			if !strings.Contains(out, "\n\ntargets:") {
				t.Errorf("blank lines lost:\n%s", out)
			}
		})
	}
}

func TestUpdateAliasReplaced(t *testing.T) {
	src := "transports:\n  - name: lo\n    address: 127.0.0.1\ntargets:\n  - name: t\n    port_id: 0x00000000000000010000000000000001\n" +
		"    limits: &lim\n      max_channels: 4\n  - name: u\n    port_id: 0x00000000000000020000000000000002\n    cm_port: 5556\n    limits: *lim\n"
	c := mustParse(t, src)
	c.Targets[1].Limits.MaxChannels = 2
	out := mustUpdate(t, src, c)
	if !strings.Contains(out, "limits: &lim\n      max_channels: 4") || strings.Contains(out, "*lim") {
		t.Fatalf("the alias should be replaced, the anchor kept:\n%s", out)
	}
}

func TestUpdateEmptyFile(t *testing.T) {
	c := mustParse(t, commented)
	out := mustUpdate(t, "", c)
	if strings.Contains(out, "#") || strings.Contains(out, "block_size") || strings.Contains(out, "cm_port") {
		t.Fatalf("an empty file takes the minimal encoding:\n%s", out)
	}
}

func TestMarshalMinimal(t *testing.T) {
	files, _ := fs.Glob(configs.FS(), "*.yaml")
	for _, f := range files {
		data, _ := fs.ReadFile(configs.FS(), f)
		c := mustParse(t, string(data))
		out, err := MarshalMinimal(c)
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(f+" (minimal)", out)
		if err != nil || !Equal(back, c) {
			t.Fatalf("%s: the minimal encoding does not round-trip (%v):\n%s", f, err, out)
		}
		full, _ := Marshal(c)
		if len(out) >= len(full) {
			t.Errorf("%s: minimal %d bytes, full %d", f, len(out), len(full))
		}
	}
	out, err := MarshalMinimal(&Config{})
	if err != nil || string(out) != "version: 1\n" {
		t.Fatalf("the empty configuration: %q, %v", out, err)
	}
	c := mustParse(t, minimal)
	out, _ = MarshalMinimal(c)
	for _, d := range []string{"block_size", "cm_port", "max_channels", "immediate_data", "socket:", "level:", "transport: lo", "driver"} {
		if strings.Contains(string(out), d) {
			t.Errorf("default %q written:\n%s", d, out)
		}
	}
}

func TestUpdateFileKeepsModeAndSkipsUnchanged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "srpd.yaml")
	if err := os.WriteFile(path, []byte(commented), 0o604); err != nil {
		t.Fatal(err)
	}
	c := mustParse(t, commented)
	before, _ := os.Stat(path)
	if _, err := UpdateFile(path, c, 0o600); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(path); !os.SameFile(before, after) {
		t.Error("an unchanged configuration replaced the file")
	}
	c.Logging.Level = "warn"
	if _, err := UpdateFile(path, c, 0o600); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(path)
	data, _ := os.ReadFile(path)
	if fi.Mode().Perm() != 0o604 || !strings.Contains(string(data), "level: warn") || !strings.HasPrefix(string(data), "# storage host A") {
		t.Fatalf("mode %v, data:\n%s", fi.Mode(), data)
	}
}

func TestPreviewReload(t *testing.T) {
	loaded := mustParse(t, commented)
	running := loaded.Clone()
	// Run-time changes: a LUN, a new target, the log level.
	if err := running.AddLUN("t", LUN{ID: 1, Backend: BackendRAM, Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if err := running.AddTarget(Target{Name: "u", PortID: MakePortID(2, 2), CMPort: 5556}); err != nil {
		t.Fatal(err)
	}
	running.Logging.Level = "debug"
	running.SetDefaults()
	// The file meanwhile: the same log level by hand, and a new ACL.
	file := loaded.Clone()
	file.Logging.Level = "debug"
	if err := file.AddACL("t", ACL{Initiator: InitiatorID{ID: MakePortID(0, 7)}}); err != nil {
		t.Fatal(err)
	}
	file.SetDefaults()
	p := PreviewReload(loaded, running, file)
	if got, want := p.Changes.Summary(), []string{"target u removed", "target t: LUN 1 removed",
		"target t: ACL 0x00000000000000000000000000000007 added"}; !slices.Equal(got, want) {
		t.Errorf("changes %q, want %q", got, want)
	}
	// The log level is in the file too: not lost.
	if got, want := p.Discarded.Summary(), []string{"target u added", "target t: LUN 1 added"}; !slices.Equal(got, want) {
		t.Errorf("discarded %q, want %q", got, want)
	}
	if got := p.Unsaved.Summary(); len(got) != 3 {
		t.Errorf("unsaved %q", got)
	}
	if p := PreviewReload(loaded, loaded, file); !p.Discarded.Empty() {
		t.Errorf("nothing changed at run time, yet discarded %q", p.Discarded.Summary())
	}
}
