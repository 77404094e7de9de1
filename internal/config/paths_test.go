package config

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// pathsBase has one file LUN whose path the cases replace (PATH), a control socket and an NBD
// socket, and an allowed_paths list the cases may replace (ALLOWED).
const pathsBase = `
transports:
  - name: lo
    address: 127.0.0.1
targets:
  - name: t
    port_id: 0x00000000000000010000000000000001
    luns:
      - id: 3
        backend: file
        path: PATH
EXTRA    acls:
      - initiator: "*"
sessions:
  - name: s
    address: 127.0.0.1
    target_port_id: 0x00000000000000010000000000000001
    nbd:
      - {lun: 0, socket: /run/srpd/s-lun0.nbd}
control:
  socket: /run/srpd/srpd.sock
ALLOWED`

func pathsConfig(path, extra, allowed string) string {
	r := strings.NewReplacer("PATH", path, "EXTRA", extra, "ALLOWED", allowed)
	return r.Replace(pathsBase)
}

// TestLUNPathValidation: a LUN path is refused (ErrInvalid, naming the field, the LUN and the
// path) when it is srpd's control socket or an NBD socket, or lies outside allowed_paths —
// by name, so /srv/luns-old is outside /srv/luns; ".." cannot escape because paths must be
// clean; allowed_paths entries must be clean absolute directories, listed once.
func TestLUNPathValidation(t *testing.T) {
	const allowed = "allowed_paths: [/srv/luns, /var/lib/srpd]\n"
	tests := []struct {
		name             string
		path, extra, lst string
		want             string // "" = valid
		is               error
	}{
		{"anywhere without allowed_paths", "/tmp/a.img", "", "", "", nil},
		{"beneath an allowed directory", "/srv/luns/a.img", "", allowed, "", nil},
		{"deep beneath", "/var/lib/srpd/x/y/a.img", "", allowed, "", nil},
		{"outside", "/etc/srpd/srpd.yaml", "", allowed,
			`target "t" LUN 3: path: ` + "/etc/srpd/srpd.yaml is outside allowed_paths (/srv/luns, /var/lib/srpd)", ErrInvalid},
		{"sibling with the same prefix", "/srv/luns-old/a.img", "", allowed, "is outside allowed_paths", ErrInvalid},
		{"the allowed directory itself", "/srv/luns", "", allowed, "is outside allowed_paths", ErrInvalid},
		{"dot-dot escape", "/srv/luns/../../etc/shadow", "", allowed, `is not a clean path (use "/etc/shadow")`, ErrInvalid},
		{"dot-dot without allowed_paths", "/srv/luns/../x.img", "", "", "is not a clean path", ErrInvalid},
		{"root allows everything", "/etc/x.img", "", "allowed_paths: [/]\n", "", nil},
		{"control socket", "/run/srpd/srpd.sock", "", "",
			`target "t" LUN 3: path: ` + "/run/srpd/srpd.sock is srpd's control socket (control.socket), not a LUN", ErrInvalid},
		{"NBD socket", "/run/srpd/s-lun0.nbd", "", "", "is the NBD socket of session \"s\" nbd[0]", ErrInvalid},
		{"relative allowed path", "/srv/luns/a.img", "", "allowed_paths: [srv/luns]\n", `allowed_paths[0]: "srv/luns" must be an absolute path`, ErrInvalid},
		{"unclean allowed path", "/srv/luns/a.img", "", "allowed_paths: [/srv/luns/]\n", `allowed_paths[0]: "/srv/luns/" is not a clean path`, ErrInvalid},
		{"duplicate allowed path", "/srv/luns/a.img", "", "allowed_paths: [/srv/luns, /srv/luns]\n", "allowed_paths[1]: /srv/luns is already listed as allowed_paths[0]", ErrDuplicate},
		{"follow_symlinks on a file", "/srv/luns/a.img", "        follow_symlinks: true\n", allowed, "", nil},
		{"follow_symlinks on ram", "", "", "", "target \"t\" LUN 3: follow_symlinks: does not apply to the ram backend", ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := pathsConfig(tt.path, tt.extra, tt.lst)
			if tt.path == "" { // the ram case
				src = strings.Replace(pathsConfig("x", "", ""), "backend: file\n        path: x\n",
					"backend: ram\n        size: 1MiB\n        follow_symlinks: true\n", 1)
			}
			c, err := Parse("test.yaml", []byte(src))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Parse: %v\n%s", err, src)
				}
				if got := c.Targets[0].LUNs[0].FollowSymlinks; got != strings.Contains(tt.extra, "follow_symlinks") {
					t.Errorf("follow_symlinks = %v", got)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse accepted it; want %q\n%s", tt.want, src)
			}
			if !strings.Contains(err.Error(), tt.want) || !errors.Is(err, tt.is) {
				t.Fatalf("Parse = %v\nwant %q (%v)", err, tt.want, tt.is)
			}
			var list ErrorList
			if !errors.As(err, &list) || list[0].Line == 0 {
				t.Errorf("want an ErrorList with a line: %#v", err)
			}
		})
	}
}

// TestLUNPathIsTheConfigFile: a LUN naming the very file being parsed is reported by Parse
// (so srpd --check and srpctl config validate catch it before any start).
func TestLUNPathIsTheConfigFile(t *testing.T) {
	const file = "/etc/srpd/srpd.yaml"
	_, err := Parse(file, []byte(pathsConfig(file, "        size: 1MiB\n", "")))
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(),
		`target "t" LUN 3: path: `+"/etc/srpd/srpd.yaml is this configuration file, not a LUN") {
		t.Fatalf("Parse = %v; want the LUN refused as the configuration file", err)
	}
	if _, err := Parse("/etc/srpd/other.yaml", []byte(pathsConfig(file, "", ""))); err != nil {
		t.Fatalf("another file's LUN on %s: %v", file, err)
	}
}

// TestLUNPathValidationAfterMutation: the rules hold for a configuration changed in code (the
// control API's AddLUN), not only for a parsed file.
func TestLUNPathValidationAfterMutation(t *testing.T) {
	c := mustParse(t, pathsConfig("/srv/luns/a.img", "", "allowed_paths: [/srv/luns]\n"))
	for _, l := range []LUN{
		{ID: 7, Backend: BackendFile, Path: "/etc/passwd"},
		{ID: 7, Backend: BackendBlockDev, Path: "/dev/sda"},
		{ID: 7, Backend: BackendFile, Path: "/run/srpd/srpd.sock"},
	} {
		next := c.Clone()
		if err := next.AddLUN("t", l); err != nil {
			t.Fatal(err)
		}
		next.SetDefaults()
		err := next.Validate()
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `target "t" LUN 7: path`) ||
			!strings.Contains(err.Error(), l.Path) {
			t.Errorf("AddLUN(%s): Validate = %v; want ErrInvalid at target \"t\" LUN 7: path", l.Path, err)
		}
	}
}

func TestBeneath(t *testing.T) {
	for _, c := range []struct {
		path, dir string
		want      bool
	}{
		{"/srv/luns/a", "/srv/luns", true},
		{"/srv/luns", "/srv/luns", false},
		{"/srv/lunsa", "/srv/luns", false},
		{"/srv/a", "/srv/luns", false},
		{"/a", "/", true},
		{"/", "/", false},
	} {
		if got := Beneath(c.path, c.dir); got != c.want {
			t.Errorf("Beneath(%q, %q) = %v", c.path, c.dir, got)
		}
	}
}

// TestDiffAllowedPaths: changing allowed_paths shows in the diff, and marks the LUNs that
// follow symlinks as changed (so the daemon reopens and re-checks them), not the others.
func TestDiffAllowedPaths(t *testing.T) {
	src := pathsConfig("/srv/luns/a.img", "        follow_symlinks: true\n      - {id: 4, backend: file, path: /srv/luns/b.img}\n",
		"allowed_paths: [/srv/luns]\n")
	old := mustParse(t, src)
	same := mustParse(t, src)
	if d := Diff(old, same); !d.Empty() {
		t.Fatalf("no change, diff %v", d)
	}
	next := mustParse(t, strings.Replace(src, "[/srv/luns]", "[/srv/luns, /srv/more]", 1))
	d := Diff(old, next)
	if !d.AllowedPaths || d.Empty() {
		t.Fatalf("diff misses allowed_paths: %+v", d)
	}
	td := d.Target("t")
	if td == nil || !slices.Equal(td.LUNs.Changed, []int{3}) {
		t.Fatalf("target diff %+v; want LUN 3 (follows symlinks) changed, not LUN 4", td)
	}
	if !slices.Contains(d.Summary(), "allowed_paths settings changed") {
		t.Errorf("summary %q", d.Summary())
	}
}
