package logging

import (
	"bytes"
	"strings"
	"testing"
)

func TestConsoleLevels(t *testing.T) {
	for _, debug := range []bool{false, true} {
		var b bytes.Buffer
		log := Console(&b, debug)
		log.Debug("dbg-line")
		log.Info("info-line")
		out := b.String()
		if !strings.Contains(out, "info-line") || strings.Contains(out, "dbg-line") != debug {
			t.Errorf("debug=%v: output %q", debug, out)
		}
	}
}
