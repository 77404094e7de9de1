package verbs

import (
	"errors"

	"go.uber.org/zap"
)

// ErrUnavailable: srpd was built without the `verbs` build tag (or without cgo), or libibverbs
// finds no RDMA device.
var ErrUnavailable = errors.New("verbs: kernel verbs engine unavailable")

// Config configures OpenDevice. The zero value is the default.
type Config struct {
	// Port is the device port (default 1).
	Port int
	// MaxMRPages is the page-list capacity offered to AllocFastRegMR (default 512).
	MaxMRPages int
	// Logger receives the engine's logs (nil: none).
	Logger *zap.Logger
}

func (c *Config) fill() {
	if c.Port <= 0 {
		c.Port = 1
	}
	if c.MaxMRPages <= 0 {
		c.MaxMRPages = 512
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
}
