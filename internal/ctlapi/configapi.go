package ctlapi

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/srpd/srpd/internal/config"
)

// ConfigService is the optional part of Service for the running configuration: show it,
// save it to the daemon's file, and preview or guard a reload. A Service without it answers
// GET /v1/config and POST /v1/config/save, and a reload with dry_run or refuse_discard, with
// ErrUnsupported.
type ConfigService interface {
	// RunningConfig is the configuration that runs now (defaults applied), with the
	// run-time changes that are not in the file.
	RunningConfig(ctx context.Context) (*ConfigInfo, error)
	// SaveConfig writes the running configuration to the daemon's file (only what differs
	// from the defaults, the file's comments and layout kept, atomically, mode and owner
	// kept). Without Force, a file edited since the daemon last read or wrote it is
	// ErrConflict: saving would overwrite edits nobody has loaded.
	SaveConfig(ctx context.Context, opts SaveOptions) (*SaveResult, error)
	// ReloadWith is Reload with options: DryRun only tells what a reload would do;
	// RefuseDiscard makes a reload that would undo run-time changes ErrConflict instead.
	ReloadWith(ctx context.Context, opts ReloadOptions) (*ReloadResult, error)
}

// ConfigInfo is the body of GET /v1/config.
type ConfigInfo struct {
	// Path is the daemon's configuration file.
	Path   string         `json:"path"`
	Config *config.Config `json:"config"`
	// Unsaved has one line per run-time change not in the file ("target demo: LUN 3 added").
	Unsaved []string `json:"unsaved"`
}

// SaveOptions apply to POST /v1/config/save.
type SaveOptions struct {
	// Force saves even over edits of the file that were not loaded (?force=1).
	Force bool
}

// SaveResult tells what POST /v1/config/save wrote.
type SaveResult struct {
	Path string `json:"path"`
	// Bytes is the file's new size.
	Bytes int `json:"bytes"`
	// Changes has one line per change the file got ("target demo: LUN 3 added"); empty:
	// the file already held the running configuration and was not written.
	Changes []string `json:"changes"`
}

// ReloadOptions apply to POST /v1/reload.
type ReloadOptions struct {
	// DryRun computes what the reload would change and discard, and changes nothing
	// (?dry_run=1).
	DryRun bool
	// RefuseDiscard answers ErrConflict, changing nothing, when the reload would undo
	// run-time changes made without --persist (?refuse_discard=1). Without it a reload
	// applies the file as SIGHUP does.
	RefuseDiscard bool
}

func (o ReloadOptions) query() url.Values {
	q := url.Values{}
	if o.DryRun {
		q.Set("dry_run", "1")
	}
	if o.RefuseDiscard {
		q.Set("refuse_discard", "1")
	}
	return q
}

func (h *handler) configService() (ConfigService, error) {
	s, ok := h.svc.(ConfigService)
	if !ok {
		return nil, fmt.Errorf("configuration: %w", ErrUnsupported)
	}
	return s, nil
}

func (h *handler) runningConfig(w http.ResponseWriter, r *http.Request, _ query) error {
	s, err := h.configService()
	if err != nil {
		return err
	}
	info, err := s.RunningConfig(r.Context())
	if info != nil && info.Unsaved == nil {
		info.Unsaved = []string{}
	}
	return ok(w, info, err)
}

func (h *handler) saveConfig(w http.ResponseWriter, r *http.Request, q query) error {
	force, err := q.bool("force")
	if err != nil {
		return err
	}
	s, err := h.configService()
	if err != nil {
		return err
	}
	res, err := s.SaveConfig(r.Context(), SaveOptions{Force: force})
	if res != nil && res.Changes == nil {
		res.Changes = []string{}
	}
	return ok(w, res, err)
}

// reloadOptions reads ?dry_run and ?refuse_discard.
func reloadOptions(q query) (o ReloadOptions, err error) {
	if o.DryRun, err = q.bool("dry_run"); err != nil {
		return o, err
	}
	o.RefuseDiscard, err = q.bool("refuse_discard")
	return o, err
}

// RunningConfig implements ConfigService.
func (c *Client) RunningConfig(ctx context.Context) (*ConfigInfo, error) {
	return call[ConfigInfo](ctx, c, http.MethodGet, "/v1/config", nil, nil)
}

// SaveConfig implements ConfigService.
func (c *Client) SaveConfig(ctx context.Context, opts SaveOptions) (*SaveResult, error) {
	var q url.Values
	if opts.Force {
		q = url.Values{"force": {"1"}}
	}
	return call[SaveResult](ctx, c, http.MethodPost, "/v1/config/save", q, nil)
}

// ReloadWith implements ConfigService.
func (c *Client) ReloadWith(ctx context.Context, opts ReloadOptions) (*ReloadResult, error) {
	return call[ReloadResult](ctx, c, http.MethodPost, "/v1/reload", opts.query(), nil)
}
