package config

import (
	"io/fs"
	"testing"

	"github.com/srpd/srpd/configs"
)

// FuzzParse: Parse never panics, and whatever it accepts survives Marshal → Parse unchanged.
func FuzzParse(f *testing.F) {
	files, _ := fs.Glob(configs.FS(), "*.yaml")
	for _, name := range files {
		data, _ := fs.ReadFile(configs.FS(), name)
		f.Add(data)
	}
	for _, s := range []string{minimal, diffBase, "", "a: &a [*a]", "targets: [{luns: [{size: 1PiB}]}]",
		"control: {mode: 0o777}", "sessions: [{dev_loss_tmo: off, fast_io_fail_tmo: false}]",
		pathsConfig("/srv/luns/a.img", "        follow_symlinks: true\n", "allowed_paths: [/srv/luns, /]\n")} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			if _, ok := err.(ErrorList); !ok {
				t.Fatalf("Parse returned %T, not ErrorList: %v", err, err)
			}
			return
		}
		out, err := Marshal(c)
		if err != nil {
			t.Fatalf("Marshal of a valid config: %v", err)
		}
		c2, err := Parse("marshalled.yaml", out)
		if err != nil {
			t.Fatalf("Parse(Marshal(c)): %v\n%s", err, out)
		}
		if !Equal(c, c2) {
			t.Fatalf("round trip changed the config:\n%s", out)
		}
		_ = Diff(c, c2)
	})
}
