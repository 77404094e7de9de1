package ctlapi

import (
	"context"
	"fmt"
	"net/http"

	"github.com/srpd/srpd/internal/config"
)

// DiscoverRequest is the body of POST /v1/discover: log in to the SRP target at Address and
// Port through one of the daemon's transports with a probe initiator identity, read what it
// exports, log out.
type DiscoverRequest struct {
	// Address is the target's IP address or host name; Port its RDMA CM port (0: 5555).
	Address string `json:"address"`
	Port    int    `json:"port,omitempty"`
	// Transport names the transport to log in through ("": the only one, or the first).
	Transport string `json:"transport,omitempty"`
	// TargetPortID is the target port identifier to log in to. Without it the daemon asks
	// the target: an srpd target names its identifier when it rejects a login naming
	// another (srp/porthint.go); other targets (the kernel's ib_srpt) need it given.
	TargetPortID *config.PortID `json:"target_port_id,omitempty"`
}

// Validate checks the request's fields.
func (r *DiscoverRequest) Validate() error {
	if r.Address == "" {
		return fmt.Errorf("address: %w", ErrInvalidArgument)
	}
	if r.Port < 0 || r.Port > 65535 {
		return fmt.Errorf("port %d: %w", r.Port, ErrInvalidArgument)
	}
	if r.Transport != "" && !nameRE.MatchString(r.Transport) {
		return fmt.Errorf("transport %q: not a transport name: %w", r.Transport, ErrInvalidArgument)
	}
	return nil
}

// Discovery is the answer to POST /v1/discover.
type Discovery struct {
	Address      string        `json:"address"` // ip:port logged in to
	Transport    string        `json:"transport"`
	TargetPortID config.PortID `json:"target_port_id"`
	// TargetPortIDFromHint: the target named its identifier (an srpd target); false: the
	// request gave it.
	TargetPortIDFromHint bool `json:"target_port_id_from_hint"`
	// ProbeInitiatorPortID is the identity the probe logged in with.
	ProbeInitiatorPortID config.PortID `json:"probe_initiator_port_id"`
	// InitiatorExt is an initiator extension no connection of this daemon to that target
	// uses: a connection made with it does not take over an existing one's I_T nexus.
	InitiatorExt uint64          `json:"initiator_ext"`
	LUNs         []DiscoveredLUN `json:"luns"`
}

// DiscoveredLUN is one logical unit of a discovered target.
type DiscoveredLUN struct {
	LUN       uint64 `json:"lun"`
	Vendor    string `json:"vendor"`
	Product   string `json:"product"`
	Revision  string `json:"revision"`
	Serial    string `json:"serial,omitempty"`
	ID        string `json:"id,omitempty"` // the VPD 0x83 designator, e.g. naa.6001405...
	BlockSize int    `json:"block_size"`
	Capacity  int64  `json:"capacity"` // bytes
	ReadOnly  bool   `json:"read_only"`
}

// DiscoverService is the optional part of Service that answers POST /v1/discover (a Service
// without it answers with ErrUnsupported).
type DiscoverService interface {
	Discover(ctx context.Context, r DiscoverRequest) (*Discovery, error)
}

func (h *handler) discover(w http.ResponseWriter, r *http.Request, _ query) error {
	var req DiscoverRequest
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	if err := req.Validate(); err != nil {
		return badRequest("%v", err)
	}
	s, isDiscover := h.svc.(DiscoverService)
	if !isDiscover {
		return fmt.Errorf("discover: %w", ErrUnsupported)
	}
	d, err := s.Discover(r.Context(), req)
	if err == nil && d.LUNs == nil {
		d.LUNs = []DiscoveredLUN{}
	}
	return ok(w, d, err)
}

// Discover implements DiscoverService.
func (c *Client) Discover(ctx context.Context, r DiscoverRequest) (*Discovery, error) {
	return call[Discovery](ctx, c, http.MethodPost, "/v1/discover", nil, r)
}
