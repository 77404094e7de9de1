package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/srpd/srpd/internal/config"
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
			if a.json() {
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
				if err := a.printJSON(res); err != nil {
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
	return newGroup("config", "Work with configuration files", validate)
}

// silentError carries an exit code without printing anything more (the output already says
// what is wrong).
type silentError struct{ err error }

func (e *silentError) Error() string { return e.err.Error() }
func (e *silentError) Unwrap() error { return e.err }
