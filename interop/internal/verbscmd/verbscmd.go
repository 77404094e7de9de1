// Package verbscmd holds what the verbs interop commands (verbs-srptarget, verbs-srpinitiator)
// share: the environment's defaults, their logger and the verbs transport they open.
package verbscmd

import (
	"context"
	"flag"
	"fmt"
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/stack"
	"github.com/srpd/srpd/transport/verbs"
)

// Env is the environment variable k, or def when it is unset or empty.
func Env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Flags registers the flags both commands take: -dev (the RDMA device, $SRPD_VERBS_DEVICE) and
// -port-id (the SRP target port ID, $SRP_INTEROP_TARGET_PORT_ID or id_ext ‖ ioc_guid from
// $SRP_INTEROP_ID_EXT and $SRP_INTEROP_IOC_GUID, 5352500000000003 each).
func Flags() (dev, portID *string) {
	dev = flag.String("dev", os.Getenv("SRPD_VERBS_DEVICE"), "RDMA device (default: the first one)")
	portID = flag.String("port-id", Env("SRP_INTEROP_TARGET_PORT_ID",
		Env("SRP_INTEROP_ID_EXT", "5352500000000003")+Env("SRP_INTEROP_IOC_GUID", "5352500000000003")), "SRP target port ID (32 hex digits)")
	return dev, portID
}

// Logger is a development logger at lvl that writes to standard error.
func Logger(lvl zapcore.Level) *zap.Logger {
	zc := zap.NewDevelopmentConfig()
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.OutputPaths = []string{"stderr"}
	log, _ := zc.Build()
	return log
}

// OpenTransport opens the RDMA device devName (the first one when empty) as srpd's verbs
// transport, through internal/stack as srpd does. It returns the device's name too.
func OpenTransport(ctx context.Context, devName string, log *zap.Logger) (*stack.Transport, string, error) {
	if devName == "" {
		names, err := verbs.DeviceNames()
		if err != nil {
			return nil, "", err
		}
		if len(names) == 0 {
			return nil, "", fmt.Errorf("%w: no RDMA device", verbs.ErrUnavailable)
		}
		devName = names[0]
	}
	tr, err := stack.OpenTransport(ctx, config.Transport{Name: "verbs", Driver: config.DriverVerbs, Device: devName},
		stack.TransportOptions{Logger: log})
	return tr, devName, err
}
