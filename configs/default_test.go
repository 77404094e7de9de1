package configs_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/srpd/srpd/configs"
	"github.com/srpd/srpd/internal/config"
)

// commentedYAML matches the commented-out examples of srpd.default.yaml: a top-level key
// ("# targets:") or a line of a block ("#   - name: x", "#     port_id: ...").
var commentedYAML = regexp.MustCompile(`(?m)^# ([a-z_]+:.*|  .*)$`)

// TestDefaultConfigExamples: the package's /etc/srpd/srpd.yaml serves nothing as installed
// (internal/config's tests load it as it is, with every file here); its commented examples
// must be valid once uncommented, since that is what an operator does with them.
func TestDefaultConfigExamples(t *testing.T) {
	data, err := configs.FS().ReadFile("srpd.default.yaml")
	if err != nil {
		t.Fatal(err)
	}
	as, err := config.Parse("srpd.default.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	if len(as.Transports)+len(as.Targets)+len(as.Sessions) != 0 {
		t.Fatalf("as installed, the default configuration serves something: %d transport(s), %d target(s), %d session(s)",
			len(as.Transports), len(as.Targets), len(as.Sessions))
	}
	// The header's shell lines ("#   srpd --check ...") come before `version:`; uncomment
	// only what follows it.
	head, body, ok := strings.Cut(string(data), "\nversion: 1\n")
	if !ok {
		t.Fatal("no `version: 1` line")
	}
	body = commentedYAML.ReplaceAllString(body, "$1")
	c, err := config.Parse("srpd.default.yaml (uncommented)", []byte(head+"\nversion: 1\n"+body))
	if err != nil {
		t.Fatalf("the commented examples, uncommented, are invalid: %v\n%s", err, body)
	}
	if len(c.Transports) != 1 || len(c.Targets) != 1 || len(c.Sessions) != 1 || c.Metrics.Listen == "" {
		t.Fatalf("uncommented: %d transport(s), %d target(s), %d session(s), metrics %q; want one of each",
			len(c.Transports), len(c.Targets), len(c.Sessions), c.Metrics.Listen)
	}
}
