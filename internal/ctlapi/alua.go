package ctlapi

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/srpd/srpd/internal/config"
)

// ALUAChange changes the asymmetric access state of one target port group of a target's LUNs
// live (an implicit ALUA transition: the initiators logged in through the group's port get
// ASYMMETRIC ACCESS STATE CHANGED). The configuration is not changed: its states apply again
// when the target's alua section changes or the daemon restarts.
type ALUAChange struct {
	// Group is the target port group: the target's own or a peer's.
	Group int `json:"group"`
	// State is active/optimized, active/non-optimized, standby, unavailable or transitioning.
	State string `json:"state"`
	// LUN, if set, changes that LUN only; otherwise every LUN of the target.
	LUN *int `json:"lun,omitempty"`
}

// Validate checks the change on its own.
func (c *ALUAChange) Validate() error {
	if c.Group < 0 || c.Group > 65535 {
		return fmt.Errorf("group %d: want 0..65535", c.Group)
	}
	if !slices.Contains(config.ALUAStates, c.State) {
		return fmt.Errorf("state %q: want one of %s", c.State, strings.Join(config.ALUAStates, ", "))
	}
	if c.LUN != nil && (*c.LUN < 0 || *c.LUN > config.MaxLUNID) {
		return fmt.Errorf("LUN %d: want 0..%d", *c.LUN, config.MaxLUNID)
	}
	return nil
}

// ALUAInfo is the ALUA state of one LUN: its target port groups as REPORT TARGET PORT GROUPS
// reports them.
type ALUAInfo struct {
	LUN    int             `json:"lun"`
	Groups []ALUAGroupInfo `json:"groups"`
}

// ALUAGroupInfo is one target port group of a LUN.
type ALUAGroupInfo struct {
	Group         int    `json:"group"`
	State         string `json:"state"`
	RelativePorts []int  `json:"relative_ports"`
	// Local: the group of this target's port (the others are peers').
	Local bool `json:"local,omitempty"`
}

// ALUAList is the body of GET and POST /v1/targets/{target}/alua.
type ALUAList struct {
	LUNs []ALUAInfo `json:"luns"`
}

// ALUAService is the optional part of Service for ALUA (a Service without it answers the
// routes with ErrUnsupported).
type ALUAService interface {
	GetALUA(ctx context.Context, target string) ([]ALUAInfo, error)
	SetALUA(ctx context.Context, target string, c ALUAChange) ([]ALUAInfo, error)
}

func (h *handler) aluaService() (ALUAService, error) {
	a, ok := h.svc.(ALUAService)
	if !ok {
		return nil, fmt.Errorf("ALUA: %w", ErrUnsupported)
	}
	return a, nil
}

func (h *handler) getALUA(w http.ResponseWriter, r *http.Request, _ query) error {
	return byName(w, r, "target", func(ctx context.Context, target string) (ALUAList, error) {
		a, err := h.aluaService()
		if err != nil {
			return ALUAList{}, err
		}
		ls, err := a.GetALUA(ctx, target)
		return ALUAList{LUNs: nonNil(ls)}, err
	})
}

func (h *handler) setALUA(w http.ResponseWriter, r *http.Request, _ query) error {
	target, err := pathName(r, "target")
	if err != nil {
		return err
	}
	var c ALUAChange
	if err := decodeObject(w, r, "ALUA change", &c); err != nil {
		return err
	}
	a, err := h.aluaService()
	if err != nil {
		return err
	}
	ls, err := a.SetALUA(r.Context(), target, c)
	return ok(w, ALUAList{LUNs: nonNil(ls)}, err)
}

// GetALUA implements ALUAService.
func (c *Client) GetALUA(ctx context.Context, target string) ([]ALUAInfo, error) {
	var l ALUAList
	err := c.do(ctx, http.MethodGet, targetPath(target)+"/alua", nil, nil, &l)
	return l.LUNs, err
}

// SetALUA implements ALUAService.
func (c *Client) SetALUA(ctx context.Context, target string, ch ALUAChange) ([]ALUAInfo, error) {
	var l ALUAList
	err := c.do(ctx, http.MethodPost, targetPath(target)+"/alua", nil, ch, &l)
	return l.LUNs, err
}
