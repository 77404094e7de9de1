package config

import (
	"io/fs"
	"testing"

	"github.com/srpd/srpd/configs"
	"github.com/srpd/srpd/internal/fuzzbound"
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
	fuzzbound.Fuzz(f, func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			if _, ok := err.(ErrorList); !ok {
				t.Errorf("Parse returned %T, not ErrorList: %v", err, err)
				return
			}
			return
		}
		out, err := Marshal(c)
		if err != nil {
			t.Errorf("Marshal of a valid config: %v", err)
			return
		}
		c2, err := Parse("marshalled.yaml", out)
		if err != nil {
			t.Errorf("Parse(Marshal(c)): %v\n%s", err, out)
			return
		}
		if !Equal(c, c2) {
			t.Errorf("round trip changed the config:\n%s", out)
			return
		}
		_ = Diff(c, c2)
	})
}
