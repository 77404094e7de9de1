//go:build !verbs || !linux || !cgo

package stack

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/transport/verbs"
)

// TestOpenTransportVerbsNotBuilt: a transport with driver verbs in a build without the engine
// fails at once, naming the transport and the build tag.
func TestOpenTransportVerbsNotBuilt(t *testing.T) {
	if verbs.Built {
		t.Skip("this build has the verbs engine")
	}
	cfg := config.Transport{Name: "rdma0", Driver: config.DriverVerbs, Device: "rxe0", Port: 1}
	tr, err := OpenTransport(context.Background(), cfg, TransportOptions{Logger: zap.NewNop()})
	if err == nil {
		tr.Close(context.Background())
		t.Fatal("OpenTransport succeeded without the verbs engine")
	}
	for _, want := range []string{"transport rdma0", "rxe0", "srpd was built without -tags verbs"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if !errors.Is(err, verbs.ErrUnavailable) || !errors.Is(err, ctlapi.ErrUnsupported) {
		t.Errorf("error %q: want both verbs.ErrUnavailable and ctlapi.ErrUnsupported", err)
	}
}
