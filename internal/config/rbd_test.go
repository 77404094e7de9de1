package config

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// rbdLUN is minimal with LUN 1 on an RBD image.
var rbdLUN = strings.Replace(minimal, "    acls:", `      - id: 1
        backend: rbd
        rbd:
          pool: rbd
          image: vm-disk-1
    acls:`, 1)

// TestRBDLUN: an rbd LUN parses with its defaults in a build with the backend, and fails as
// unsupported, saying how to get it, in one without.
func TestRBDLUN(t *testing.T) {
	c, err := Parse("test.yaml", []byte(rbdLUN))
	if !RBDSupported {
		if err == nil || !errors.Is(err, ErrUnsupported) ||
			!strings.Contains(err.Error(), `target "t" LUN 1: backend: this build of srpd has no rbd support (rebuild with -tags rbd`) {
			t.Fatalf("Parse without the rbd tag = %v; want ErrUnsupported naming the build tag", err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	got := c.Targets[0].LUNs[1].RBD
	want := RBD{ClusterConfig: DefaultRBDClusterConfig, Client: DefaultRBDClient, Pool: "rbd", Image: "vm-disk-1",
		ExclusiveLock: RBDLockManaged}
	if got == nil || *got != want {
		t.Fatalf("RBD = %+v, want %+v", got, want)
	}
	if got.Spec() != "rbd/vm-disk-1" {
		t.Errorf("Spec() = %q", got.Spec())
	}
	out, err := Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := Parse("marshalled", out)
	if err != nil || !Equal(c, c2) {
		t.Fatalf("round trip: %v\n%s", err, out)
	}
	// Clone copies the RBD settings, not a pointer to them.
	cp := c.Clone()
	cp.Targets[0].LUNs[1].RBD.Image = "other"
	if c.Targets[0].LUNs[1].RBD.Image != "vm-disk-1" {
		t.Error("Clone shares the RBD settings with the original")
	}
}

func TestRBDLUNErrors(t *testing.T) {
	unsupported := `target "t" LUN 1: backend: this build of srpd has no rbd support`
	tests := []struct {
		name, old, new string
		want           []string
		is             error
	}{
		{"no rbd settings", "        rbd:\n          pool: rbd\n          image: vm-disk-1\n", "",
			[]string{`target "t" LUN 1: rbd: the rbd backend needs rbd: {pool: ..., image: ...}`}, ErrMissing},
		{"no pool", "          pool: rbd\n", "", []string{`target "t" LUN 1: rbd.pool: required`}, ErrMissing},
		{"no image", "          image: vm-disk-1\n", "", []string{`target "t" LUN 1: rbd.image: required`}, ErrMissing},
		{"image with a slash", "image: vm-disk-1", "image: a/b", []string{`target "t" LUN 1: rbd.image: "a/b" must be`}, ErrInvalid},
		{"namespace with an at", "image: vm-disk-1", "image: vm-disk-1\n          namespace: x@y",
			[]string{`target "t" LUN 1: rbd.namespace: "x@y" must be`}, ErrInvalid},
		{"relative cluster config", "image: vm-disk-1", "image: vm-disk-1\n          cluster_config: ceph.conf",
			[]string{`target "t" LUN 1: rbd.cluster_config: "ceph.conf" must be an absolute path`}, ErrInvalid},
		{"relative keyring", "image: vm-disk-1", "image: vm-disk-1\n          keyring: k",
			[]string{`target "t" LUN 1: rbd.keyring: "k" must be an absolute path`}, ErrInvalid},
		{"client without type", "image: vm-disk-1", "image: vm-disk-1\n          client: admin",
			[]string{`target "t" LUN 1: rbd.client: "admin" must be client.<id>`}, ErrInvalid},
		{"path on rbd", "        backend: rbd\n", "        backend: rbd\n        path: /x\n",
			[]string{`target "t" LUN 1: path: does not apply to the rbd backend`}, ErrInvalid},
		{"size on rbd", "        backend: rbd\n", "        backend: rbd\n        size: 1GiB\n",
			[]string{`target "t" LUN 1: size: does not apply to the rbd backend`}, ErrInvalid},
		{"rbd on ram", "        backend: rbd\n", "        backend: ram\n        size: 1GiB\n",
			[]string{`target "t" LUN 1: rbd: does not apply to the ram backend`}, ErrInvalid},
		{"image twice", "    acls:", "      - id: 2\n        backend: rbd\n        rbd: {pool: rbd, image: vm-disk-1}\n    acls:",
			[]string{`target "t" LUN 2: rbd.image: image rbd/vm-disk-1 is already exported by target "t" LUN 1`}, ErrDuplicate},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := strings.Replace(rbdLUN, tt.old, tt.new, 1)
			if src == rbdLUN {
				t.Fatalf("%q is not in the config", tt.old)
			}
			want := tt.want
			if !RBDSupported && tt.name != "rbd on ram" {
				want = append([]string{unsupported}, want...)
				if tt.name == "image twice" {
					want = []string{unsupported, `target "t" LUN 2: backend: this build`, want[1]}
				}
			}
			_, err := Parse("test.yaml", []byte(src))
			var list ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("Parse = %v, want an ErrorList", err)
			}
			if len(list) != len(want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(list), len(want), err)
			}
			for _, w := range want { // in any order: errors are sorted by position
				if !slices.ContainsFunc(list, func(e *Error) bool { return strings.Contains(e.Error(), w) }) {
					t.Errorf("no error contains %q:\n%v", w, err)
				}
			}
			if !errors.Is(err, tt.is) {
				t.Errorf("errors.Is(err, %v) = false: %v", tt.is, err)
			}
		})
	}
}
