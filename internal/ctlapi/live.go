package ctlapi

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/srpd/srpd/internal/config"
)

// LUNUpdate changes a LUN of a running target in place (PATCH /v1/targets/{target}/luns/{lun}):
// its initiators stay logged in and are told with unit attentions. Fields left out do not
// change.
type LUNUpdate struct {
	// Size grows the LUN (ram, file, rbd) to this many bytes, a multiple of its block size:
	// CAPACITY DATA HAS CHANGED. LUNs never shrink.
	Size *config.Size `json:"size,omitempty"`
	// ReadOnly sets or lifts the LUN's write protection: MODE PARAMETERS CHANGED.
	ReadOnly *bool `json:"read_only,omitempty"`
	// Rescan reads the backend's size again (a block device grown by lvextend, an image or
	// file grown by other means) without changing the configuration.
	Rescan bool `json:"rescan,omitempty"`
}

// Validate checks the update on its own.
func (u *LUNUpdate) Validate() error {
	switch {
	case u.Size == nil && u.ReadOnly == nil && !u.Rescan:
		return fmt.Errorf("nothing to change: give size, read_only or rescan")
	case u.Size != nil && *u.Size == 0:
		return fmt.Errorf("size 0: want the new capacity")
	case u.Size != nil && u.Rescan:
		return fmt.Errorf("size and rescan exclude each other")
	}
	return nil
}

// LiveService is the optional part of Service that changes LUNs and ACLs in place (a Service
// without it answers the routes with ErrUnsupported).
type LiveService interface {
	UpdateLUN(ctx context.Context, target string, id int, u LUNUpdate, opts MutateOptions) (*LUNInfo, error)
	// UpdateACL replaces the ACL of a.Initiator (its LUNs and write protection).
	UpdateACL(ctx context.Context, target string, a config.ACL, opts MutateOptions) (*ACLInfo, error)
}

func (h *handler) liveService() (LiveService, error) {
	l, ok := h.svc.(LiveService)
	if !ok {
		return nil, fmt.Errorf("live changes: %w", ErrUnsupported)
	}
	return l, nil
}

func (h *handler) updateLUN(w http.ResponseWriter, r *http.Request, q query) error {
	target, id, opts, err := lunMutation(r, q)
	if err != nil {
		return err
	}
	var u LUNUpdate
	if err := decodeObject(w, r, "LUN update", &u); err != nil {
		return err
	}
	if err := u.Validate(); err != nil {
		return badRequest("LUN update: %v", err)
	}
	l, err := h.liveService()
	if err != nil {
		return err
	}
	info, err := l.UpdateLUN(r.Context(), target, id, u, opts)
	return ok(w, info, err)
}

func (h *handler) updateACL(w http.ResponseWriter, r *http.Request, q query) error {
	target, ini, opts, err := aclMutation(r, q)
	if err != nil {
		return err
	}
	var a config.ACL
	if err := decodeObject(w, r, "ACL", &a); err != nil {
		return err
	}
	if a.Initiator != (config.InitiatorID{}) && a.Initiator != ini {
		return badRequest("ACL for %s sent to the path of %s", a.Initiator, ini)
	}
	a.Initiator = ini
	l, err := h.liveService()
	if err != nil {
		return err
	}
	info, err := l.UpdateACL(r.Context(), target, a, opts)
	return ok(w, info, err)
}

// UpdateLUN implements LiveService.
func (c *Client) UpdateLUN(ctx context.Context, target string, id int, u LUNUpdate, opts MutateOptions) (*LUNInfo, error) {
	return call[LUNInfo](ctx, c, http.MethodPatch, targetPath(target)+"/luns/"+strconv.Itoa(id), mutateQuery(opts), u)
}

// UpdateACL implements LiveService.
func (c *Client) UpdateACL(ctx context.Context, target string, a config.ACL, opts MutateOptions) (*ACLInfo, error) {
	return call[ACLInfo](ctx, c, http.MethodPut, targetPath(target)+"/acls/"+url.PathEscape(a.Initiator.String()), mutateQuery(opts), a)
}
