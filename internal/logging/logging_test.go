package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
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

func TestNewFormats(t *testing.T) {
	lvl := zap.NewAtomicLevelAt(zapcore.InfoLevel)
	var b bytes.Buffer
	log, err := New(&b, "auto", lvl) // a buffer is not a terminal: json
	if err != nil {
		t.Fatal(err)
	}
	log.With(zap.String("target", "demo")).Info("hello", zap.Int("channel", 1))
	log.Debug("hidden")
	var line map[string]any
	if err := json.Unmarshal(b.Bytes(), &line); err != nil {
		t.Fatalf("auto on a buffer is not one JSON line: %v: %q", err, b.String())
	}
	if line["msg"] != "hello" || line["target"] != "demo" || line["channel"] != float64(1) || line["level"] != "info" || line["ts"] == nil {
		t.Errorf("JSON line %v", line)
	}
	lvl.SetLevel(zapcore.DebugLevel)
	b.Reset()
	log.Debug("shown")
	if !strings.Contains(b.String(), "shown") {
		t.Errorf("level change not applied: %q", b.String())
	}

	b.Reset()
	clog, err := New(&b, "console", lvl)
	if err != nil {
		t.Fatal(err)
	}
	clog.Info("people", zap.String("k", "v"))
	if out := b.String(); strings.HasPrefix(out, "{") || !strings.Contains(out, "people") || !strings.Contains(out, `"k": "v"`) {
		t.Errorf("console line %q", out)
	}
	if _, err := New(&b, "xml", lvl); err == nil {
		t.Error("format xml accepted")
	}
	for _, s := range []string{"debug", "info", "warn", "error"} {
		if _, err := ParseLevel(s); err != nil {
			t.Error(err)
		}
	}
	if _, err := ParseLevel("loud"); err == nil {
		t.Error("level loud accepted")
	}
}
