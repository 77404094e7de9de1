package stack

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/verbs"
)

// TestOpenTransportVerbsErrors: the verbs driver's errors name the transport and the device.
func TestOpenTransportVerbsErrors(t *testing.T) {
	var got verbs.Config
	openVerbs := func(name string, cfg verbs.Config) (transport.Device, error) {
		got = cfg
		return nil, fmt.Errorf("%w: open %q: no such device", verbs.ErrUnavailable, name)
	}
	o := TransportOptions{Logger: zap.NewNop(), OpenVerbs: openVerbs}
	_, err := OpenTransport(context.Background(), config.Transport{Name: "hw", Driver: config.DriverVerbs, Device: "mlx5_9", Port: 2}, o)
	if err == nil || !strings.Contains(err.Error(), "transport hw") || !strings.Contains(err.Error(), "mlx5_9") {
		t.Fatalf("error %v: want one naming transport hw and device mlx5_9", err)
	}
	if verbs.Built && (!errors.Is(err, ctlapi.ErrUnavailable) || strings.Contains(err.Error(), "without -tags verbs")) {
		t.Errorf("error %q: want ctlapi.ErrUnavailable and no build-tag advice in a verbs build", err)
	}
	if !errors.Is(err, verbs.ErrUnavailable) {
		t.Errorf("error %q does not wrap verbs.ErrUnavailable", err)
	}
	if got.Port != 2 || got.Logger == nil {
		t.Errorf("verbs.Config = %+v, want Port 2 and a logger", got)
	}
	_, err = OpenTransport(context.Background(), config.Transport{Name: "hw", Driver: config.DriverVerbs}, o)
	if !errors.Is(err, ctlapi.ErrInvalidArgument) {
		t.Errorf("no device: %v, want ErrInvalidArgument", err)
	}
}
