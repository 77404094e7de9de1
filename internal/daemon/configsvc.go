package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

// The running configuration against the file (ctlapi.ConfigService): d.loaded is the file as
// srpd last read it (start, reload) or wrote it (--persist, config save), so that
// Diff(d.loaded, d.cfg) are the run-time changes not in the file, and a reload can tell which
// of them it would undo.

var _ ctlapi.ConfigService = (*Daemon)(nil)

// newConfigFileMode is the mode of a configuration file srpd creates (an existing file keeps
// its own): it may name keyrings and initiators, so not world-readable.
const newConfigFileMode = 0o640

// RunningConfig implements ctlapi.ConfigService.
func (d *Daemon) RunningConfig(context.Context) (*ctlapi.ConfigInfo, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return &ctlapi.ConfigInfo{Path: d.opts.ConfigPath, Config: d.cfg.Clone(), Unsaved: config.Diff(d.loaded, d.cfg).Summary()}, nil
}

// readConfigFile reads and parses the configuration file: its bytes and configuration. A
// missing file is an error that unwraps to fs.ErrNotExist.
func (d *Daemon) readConfigFile() ([]byte, *config.Config, error) {
	path := d.opts.ConfigPath
	if path == "" {
		return nil, nil, fmt.Errorf("srpd runs without a configuration file: %w", ctlapi.ErrUnsupported)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("configuration file: %w", err)
	}
	c, err := config.Parse(path, data)
	if err != nil {
		return data, nil, err
	}
	return data, c, nil
}

// SaveConfig implements ctlapi.ConfigService.
func (d *Daemon) SaveConfig(_ context.Context, opts ctlapi.SaveOptions) (*ctlapi.SaveResult, error) {
	d.opMu.Lock()
	defer d.opMu.Unlock()
	path := d.opts.ConfigPath
	data, file, err := d.readConfigFile()
	if errors.Is(err, os.ErrNotExist) {
		data, file, err = nil, emptyConfig(), nil // saving creates it
	}
	if errors.Is(err, ctlapi.ErrUnsupported) {
		return nil, err
	}
	d.mu.RLock()
	running, loaded := d.cfg.Clone(), d.loaded
	d.mu.RUnlock()
	var out []byte
	res := &ctlapi.SaveResult{Path: path}
	switch {
	case err != nil && !opts.Force:
		return nil, fmt.Errorf("%s does not parse (%v), so saving would lose what it holds (fix it, or force to overwrite it): %w",
			path, err, ctlapi.ErrConflict)
	case err != nil:
		// Forced over a file that does not parse: its text cannot be edited, only replaced.
		if out, err = config.MarshalMinimal(running); err != nil {
			return nil, err
		}
		res.Changes = []string{"file replaced (it did not parse)"}
	default:
		if edits := config.Diff(loaded, file); !edits.Empty() && !opts.Force {
			return nil, fmt.Errorf("%s has edits srpd has not loaded (%s); saving would overwrite them (reload to load them, or force to overwrite them): %w",
				path, strings.Join(edits.Summary(), "; "), ctlapi.ErrConflict)
		}
		res.Changes = config.Diff(file, running).Summary()
		if out, err = config.Update(data, running); err != nil {
			return nil, fmt.Errorf("save %s: %w", path, err)
		}
	}
	res.Bytes = len(out)
	if data == nil || !bytes.Equal(out, data) {
		if err := d.writeConfig(path, out, newConfigFileMode); err != nil {
			return nil, err
		}
	}
	d.mu.Lock()
	d.loaded = running
	d.mu.Unlock()
	d.log.Info("running configuration saved", zap.String("config", path), zap.Strings("changes", res.Changes))
	return res, nil
}

// ReloadWith implements ctlapi.ConfigService.
func (d *Daemon) ReloadWith(ctx context.Context, opts ctlapi.ReloadOptions) (*ctlapi.ReloadResult, error) {
	return d.reload(ctx, opts)
}

// discardError is the refusal of a reload that would undo run-time changes.
func discardError(p *config.ReloadPreview) error {
	lines := p.Discarded.Summary()
	return fmt.Errorf("the reload would discard %d run-time change(s) made without --persist: %s (`srpctl config save` writes them to the file first; `srpctl reload --force` discards them): %w",
		len(lines), strings.Join(lines, "; "), ctlapi.ErrConflict)
}

// preparePersist prepares writing an API change to the configuration file: fn, which the
// running configuration took as old → next, is applied to what the file holds (not the
// running configuration: run-time changes made without --persist stay out of it, and edits
// of the file not yet loaded stay in), and the file's text is edited to match (config.Update).
// The returned write does it and records the file as loaded. opMu held.
func (d *Daemon) preparePersist(old, next *config.Config, fn func(*config.Config) error) (write func() error, err error) {
	path := d.opts.ConfigPath
	data, file, err := d.readConfigFile()
	if err != nil {
		if errors.Is(err, ctlapi.ErrUnsupported) {
			return nil, err
		}
		return nil, fmt.Errorf("the change was not applied: %s cannot take it (%v): %w", path, err, ctlapi.ErrConflict)
	}
	fileNext := file.Clone()
	if err := fn(fileNext); err != nil {
		if isNotFound(err) && onlyRemovals(config.Diff(old, next)) {
			return func() error { return nil }, nil // what is removed was never in the file
		}
		return nil, fmt.Errorf("the change was not applied: %s differs from the running configuration there (%v); `srpctl config diff` shows how, `srpctl config save` writes the running configuration: %w",
			path, err, ctlapi.ErrConflict)
	}
	fileNext.SetDefaults()
	if err := fileNext.Validate(); err != nil {
		return nil, fmt.Errorf("the change was not applied: with it, %s would not be valid (%v): %w", path, err, ctlapi.ErrConflict)
	}
	out, err := config.Update(data, fileNext)
	if err != nil {
		return nil, fmt.Errorf("the change was not applied: %w", err)
	}
	d.mu.RLock()
	loaded := d.loaded.Clone()
	d.mu.RUnlock()
	if fn(loaded) == nil {
		loaded.SetDefaults()
	} else {
		loaded = fileNext
	}
	return func() error {
		if data == nil || !bytes.Equal(out, data) {
			if err := d.writeConfig(path, out, newConfigFileMode); err != nil {
				return err
			}
		}
		d.mu.Lock()
		d.loaded = loaded
		d.mu.Unlock()
		return nil
	}, nil
}

// writeConfig writes the configuration file atomically (config.AtomicWrite), or what a test
// put in d.writeConfigFile.
func (d *Daemon) writeConfig(path string, data []byte, perm os.FileMode) error {
	if d.writeConfigFile != nil {
		return d.writeConfigFile(path, data, perm)
	}
	return config.AtomicWrite(path, data, perm)
}

func isNotFound(err error) bool {
	return errors.Is(err, config.ErrNotFound) || errors.Is(err, ctlapi.ErrNotFound)
}

// onlyRemovals reports whether d only removes objects.
func onlyRemovals(d *config.Changeset) bool {
	if len(d.Transports.Added)+len(d.Transports.Changed)+len(d.Targets.Added)+len(d.Sessions.Added)+len(d.Sessions.Changed) > 0 ||
		d.Control || d.Logging || d.Metrics || d.Limits || d.AllowedPaths {
		return false
	}
	for _, t := range d.TargetDiffs {
		if t.Settings || len(t.LUNs.Added)+len(t.LUNs.Changed)+len(t.ACLs.Added)+len(t.ACLs.Changed) > 0 {
			return false
		}
	}
	return true
}
