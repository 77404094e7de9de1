package main

import (
	"strings"
	"testing"

	"github.com/srpd/srpd/internal/config"
)

// TestLUNAddRBD: lun add --backend rbd passes the image settings to the daemon (whose config
// validation refuses them in a build without the rbd backend, naming the build tag); the flags
// are checked before anything is sent.
func TestLUNAddRBD(t *testing.T) {
	h := newHarness(t)
	args := []string{"lun", "add", "demo", "4", "--backend", "rbd", "--pool", "rbd", "--namespace", "gw",
		"--image", "vm-disk-1", "--client", "client.srpd", "--keyring", "/etc/ceph/k", "--block-size", "4096"}
	code, stdout, stderr := h.run("", args...)
	if !config.RBDSupported {
		// A configuration error, as the verbs driver in a build without it: invalid argument.
		if code != exitError || !strings.Contains(stderr, "backend: this build of srpd has no rbd support (rebuild with -tags rbd") {
			t.Fatalf("exit %d, want %d and the build tag named:\n%s%s", code, exitError, stdout, stderr)
		}
	} else {
		if code != exitOK || !strings.Contains(stdout, "LUN 4 added to target demo: rbd (rbd/gw/vm-disk-1, ") {
			t.Fatalf("exit %d:\n%s%s", code, stdout, stderr)
		}
		got := h.fake.Config().Target("demo").LUN(4).RBD
		want := config.RBD{ClusterConfig: config.DefaultRBDClusterConfig, Client: "client.srpd", Keyring: "/etc/ceph/k",
			Pool: "rbd", Namespace: "gw", Image: "vm-disk-1"}
		if got == nil || *got != want {
			t.Fatalf("RBD settings %+v, want %+v", got, want)
		}
	}

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no image", []string{"lun", "add", "demo", "4", "--backend", "rbd", "--pool", "rbd"}, exitUsage, "--backend rbd needs --pool and --image"},
		{"no pool", []string{"lun", "add", "demo", "4", "--backend", "rbd", "--image", "x"}, exitUsage, "--backend rbd needs --pool and --image"},
		{"image on ram", []string{"lun", "add", "demo", "4", "--backend", "ram", "--size", "1MiB", "--image", "x"}, exitError,
			"rbd: does not apply to the ram backend"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := h.run("", tc.args...)
			if code != tc.code || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d (want %d), stderr lacks %q:\n%s%s", code, tc.code, tc.want, stdout, stderr)
			}
		})
	}
}
