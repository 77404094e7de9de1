package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

// validateResult is `config validate -o json`.
type validateResult struct {
	File   string          `json:"file"`
	Valid  bool            `json:"valid"`
	Errors []validateError `json:"errors"`
	Config *config.Config  `json:"config,omitempty"`
}

type validateError struct {
	Line    int    `json:"line,omitempty"`
	Column  int    `json:"column,omitempty"`
	Path    string `json:"path,omitempty"`
	Message string `json:"message"`
	Kind    string `json:"kind"`
}

func newConfigCmd(a *app) *cobra.Command {
	var print bool
	validate := &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a configuration file (no daemon needed); - reads standard input",
		Long: `Check a configuration file the way srpd reads it: strict YAML (unknown fields are errors),
every value, and the rules between sections. Every problem is reported with its line and field,
e.g.

  srpd.yaml:14: targets[0].luns[1].size: 65000 must be a multiple of the block size (4096)

Exits 0 when the file is valid, 1 when it is not (or cannot be read). --print writes the file
back with every default spelled out.`,
		Example: "  srpctl config validate /etc/srpd/srpd.yaml",
		Args:    args(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			name, data, err := a.readSpec(argv[0])
			if err != nil {
				return err
			}
			c, perr := config.Parse(name, data)
			if a.structured() {
				res := validateResult{File: name, Valid: perr == nil, Errors: []validateError{}}
				var list config.ErrorList
				if errors.As(perr, &list) {
					for _, e := range list {
						res.Errors = append(res.Errors, validateError{Line: e.Line, Column: e.Column, Path: e.Path, Message: e.Msg, Kind: e.Err.Error()})
					}
				}
				if print {
					res.Config = c
				}
				if err := a.printData(res); err != nil {
					return err
				}
				if perr != nil {
					return &silentError{perr}
				}
				return nil
			}
			if perr != nil {
				var list config.ErrorList
				if errors.As(perr, &list) {
					return fmt.Errorf("%s is not valid (%d problems):\n%w", name, len(list), perr)
				}
				return perr
			}
			if print {
				out, err := config.Marshal(c)
				if err != nil {
					return err
				}
				_, err = a.stdout.Write(out)
				return err
			}
			luns := 0
			for _, t := range c.Targets {
				luns += len(t.LUNs)
			}
			fmt.Fprintf(a.stdout, "%s: valid (%d transports, %d targets, %d LUNs, %d sessions)\n",
				name, len(c.Transports), len(c.Targets), luns, len(c.Sessions))
			return nil
		},
	}
	validate.Flags().BoolVar(&print, "print", false, "print the configuration with its defaults applied")
	return newGroup("config", "Work with configuration files and srpd's running configuration",
		validate, newConfigShowCmd(a), newConfigSaveCmd(a), newConfigDiffCmd(a))
}

func newConfigShowCmd(a *app) *cobra.Command {
	var full bool
	cmd := &cobra.Command{
		Use:   "show [--full]",
		Short: "Print srpd's running configuration as YAML (only what differs from the defaults)",
		Long: `Print the configuration srpd runs now, run-time changes included, as YAML that srpd -c
accepts: only the settings that differ from the defaults, so that a file made from it does
not freeze today's defaults (--full writes every setting). -o json prints the API's answer:
the file's path, the configuration with every default, and the run-time changes that are not
in the file.`,
		Example: `  srpctl config show
  srpctl config show | srpd --check -c -`,
		Args: args(0),
		RunE: query(a, func(ctx context.Context, c *ctlapi.Client, _ []string) (*ctlapi.ConfigInfo, error) {
			return c.RunningConfig(ctx)
		}, func(info *ctlapi.ConfigInfo) error {
			marshal := config.MarshalMinimal
			if full {
				marshal = config.Marshal
			}
			out, err := marshal(info.Config)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "# srpd's running configuration (%s)", info.Path)
			if n := len(info.Unsaved); n > 0 {
				fmt.Fprintf(a.stdout, "; %d run-time change(s) not in the file", n)
			}
			fmt.Fprintln(a.stdout)
			_, err = a.stdout.Write(out)
			return err
		}),
	}
	cmd.Flags().BoolVar(&full, "full", false, "write every setting, defaults included")
	return cmd
}

func newConfigSaveCmd(a *app) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "save [--force]",
		Short: "Write srpd's running configuration to its configuration file",
		Long: `Write the running configuration, run-time changes made without --persist included, to
srpd's configuration file (the file of srpd -c), so that a reload or restart keeps them. The
file is edited, not regenerated: its comments, order and layout stay, changed values are
replaced in place, new objects are written with only their non-default settings. The write
is atomic (a temporary file in the same directory, fsync, rename) and keeps the file's mode
and owner.

If the file was edited since srpd last read or wrote it, saving would overwrite those edits:
srpctl refuses (exit 6) and names them; reload first, or --force to overwrite them.`,
		Example: "  srpctl config save",
		Args:    args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, func(ctx context.Context, c *ctlapi.Client) error {
				res, err := c.SaveConfig(ctx, ctlapi.SaveOptions{Force: force})
				if err != nil {
					return err
				}
				if a.structured() {
					return a.printData(res)
				}
				if len(res.Changes) == 0 {
					fmt.Fprintf(a.stdout, "%s already holds the running configuration\n", res.Path)
					return nil
				}
				fmt.Fprintf(a.stdout, "%s saved (%d bytes):\n", res.Path, res.Bytes)
				for _, l := range res.Changes {
					fmt.Fprintln(a.stdout, "  "+l)
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "overwrite edits of the file that srpd has not loaded")
	return cmd
}

func newConfigDiffCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "diff",
		Short: "Show what a reload would change, and which run-time changes it would discard",
		Long: `Compare srpd's configuration file with what runs (like srpctl reload --dry-run): the
objects (transports, targets, LUNs, ACLs, sessions) and sections a reload would add, remove
or change, by name, and the run-time changes made without --persist that it would discard.
Nothing changes.`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error { return a.reloadPreview(cmd) },
	}
}

func (a *app) reloadPreview(cmd *cobra.Command) error {
	return a.call(cmd, func(ctx context.Context, c *ctlapi.Client) error {
		res, err := c.ReloadWith(ctx, ctlapi.ReloadOptions{DryRun: true})
		if err != nil {
			return err
		}
		if a.structured() {
			return a.printData(res)
		}
		a.printReload(res, "a reload would change nothing", "a reload would:")
		return nil
	})
}

// printReload prints the changes of a reload (or a dry run) and what it discards.
func (a *app) printReload(res *ctlapi.ReloadResult, none, some string) {
	if len(res.Changes) == 0 {
		fmt.Fprintln(a.stdout, none)
	} else {
		fmt.Fprintln(a.stdout, some)
		for _, ch := range res.Changes {
			fmt.Fprintln(a.stdout, "  "+ch)
		}
		// How each changed target takes it: live (its initiators stay logged in) or restarted.
		verb := "applied"
		if res.DryRun {
			verb = "would apply"
		}
		for _, p := range res.Plans {
			for _, l := range p.Summary() {
				fmt.Fprintf(a.stdout, "  %s: %s\n", verb, l)
			}
		}
	}
	if len(res.Discarded) > 0 {
		verb := "discarded"
		if res.DryRun {
			verb = "would discard"
		}
		fmt.Fprintf(a.stdout, "run-time changes made without --persist it %s (srpctl config save keeps them):\n", verb)
		for _, ch := range res.Discarded {
			fmt.Fprintln(a.stdout, "  "+ch)
		}
	}
}

func newReloadCmd(a *app) *cobra.Command {
	var dryRun, force bool
	cmd := &cobra.Command{
		Use:   "reload [--dry-run] [--force]",
		Short: "Make srpd re-read its configuration file and apply what changed (like SIGHUP)",
		Long: `Make srpd re-read its configuration file and apply the difference, as SIGHUP and
systemctl reload srpd do.

A reload makes srpd run what the file says, so it discards the changes made at run time
without --persist to the objects the file sets otherwise. srpctl reload refuses that
(exit 6, nothing changes) and lists those changes: save them first with srpctl config save,
or pass --force to discard them. systemctl reload srpd runs srpctl reload (srpd.service's
ExecReload=): it waits for the reload and fails, with srpd's error in the journal, on an
invalid file or a run-time change it would discard, changing nothing. SIGHUP cannot ask: it
reloads, and srpd logs a warning for each run-time change discarded.

--dry-run only shows what the reload would change and discard (as srpctl config diff).`,
		Example: `  srpctl reload --dry-run
  srpctl config save && srpctl reload`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dryRun {
				return a.reloadPreview(cmd)
			}
			return a.call(cmd, func(ctx context.Context, c *ctlapi.Client) error {
				res, err := c.ReloadWith(ctx, ctlapi.ReloadOptions{RefuseDiscard: !force})
				if err != nil {
					return err
				}
				if a.structured() {
					if err := a.printData(res); err != nil {
						return err
					}
				} else {
					a.printReload(res, "configuration reloaded: no changes", "configuration reloaded:")
				}
				if len(res.Failed) > 0 {
					// The new configuration runs, but not all of it: a reload that systemctl
					// must not report as a success.
					return fmt.Errorf("reloaded, but %d object(s) did not start: %s", len(res.Failed), strings.Join(res.Failed, "; "))
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only show what the reload would change and discard")
	cmd.Flags().BoolVar(&force, "force", false, "reload even if that discards run-time changes made without --persist")
	return cmd
}

// silentError carries an exit code without printing anything more (the output already says
// what is wrong).
type silentError struct{ err error }

func (e *silentError) Error() string { return e.err.Error() }
func (e *silentError) Unwrap() error { return e.err }
