//go:build !linux

package link

import (
	"context"
	"errors"
	"net/netip"
)

// UDP is the UDP link; it is implemented on Linux only.
type UDP struct{ Link }

// ListenUDP is implemented on Linux only.
func ListenUDP(ctx context.Context, addr netip.AddrPort, opts UDPOptions) (*UDP, error) {
	return nil, errors.ErrUnsupported
}

// ListenUDPQueues is implemented on Linux only.
func ListenUDPQueues(ctx context.Context, addr netip.AddrPort, opts UDPOptions, n int) ([]*UDP, error) {
	return nil, errors.ErrUnsupported
}
