package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/srpd/srpd/internal/ctlapi"
)

// env is everything srpctl takes from its surroundings, so that tests can replace it.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	links          linkManager
	now            func() time.Time
}

func newEnv() *env {
	return &env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, links: netlinkLinks{}, now: time.Now}
}

// app holds the state of one invocation: the environment and the global flags.
type app struct {
	*env
	socket    string
	output    string
	noHeaders bool
	timeout   time.Duration
}

// The --output formats. JSON and YAML carry the same fields (the control API's JSON names).
const (
	outputTable = "table"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

var outputFormats = []string{outputTable, outputJSON, outputYAML}

// run executes srpctl with args and returns the exit code.
func run(ctx context.Context, args []string, e *env) int {
	a := &app{env: e}
	root := newRootCmd(a)
	root.SetArgs(args)
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	code := exitCode(err)
	var silent *silentError
	if errors.As(err, &silent) {
		return code
	}
	h := hint(err, a.socket)
	if a.structured() {
		// Scripts that asked for JSON or YAML get the error in that form too, on stderr.
		a.printErr(err, code, h)
		return code
	}
	fmt.Fprintf(e.stderr, "srpctl: %v\n", err)
	if h != "" {
		fmt.Fprintf(e.stderr, "hint: %s\n", h)
	}
	if code == exitUsage {
		fmt.Fprintln(e.stderr, "Run 'srpctl --help' for usage.")
	}
	return code
}

func newRootCmd(a *app) *cobra.Command {
	defSocket := ctlapi.DefaultSocket
	if s := a.getenv("SRPCTL_SOCKET"); s != "" {
		defSocket = s
	}
	root := &cobra.Command{
		Use:   "srpctl",
		Short: "Control srpd, the SRP (SCSI RDMA Protocol) target and initiator daemon",
		Long: `srpctl controls a running srpd through its control socket: targets, LUNs, ACLs,
sessions of initiators logged in to our targets, and our own initiator connections
to remote targets. It also manages RDMA links (rxe) through netlink and validates
configuration files without a daemon.

Mutating commands take --persist to also rewrite srpd's configuration file;
without it the change lasts until srpd restarts or reloads.

` + exitCodesHelp,
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: false},
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if !slices.Contains(outputFormats, a.output) {
				return usagef("--output %q: want %s", a.output, strings.Join(outputFormats, ", "))
			}
			return nil
		},
		Args:    cobra.ArbitraryArgs,
		RunE:    groupRunE,
		Version: versionString(),
	}
	root.SetVersionTemplate("srpctl {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVarP(&a.output, "output", "o", outputTable, "output format: "+strings.Join(outputFormats, ", "))
	pf.BoolVar(&a.noHeaders, "no-headers", false, "tables without their header line")
	pf.StringVar(&a.socket, "socket", defSocket, "srpd's control socket ($SRPCTL_SOCKET)")
	pf.DurationVar(&a.timeout, "timeout", 60*time.Second, "give up on the daemon after this long")
	root.AddCommand(
		newStatusCmd(a),
		newTargetCmd(a),
		newLUNCmd(a),
		newACLCmd(a),
		newSessionCmd(a),
		newConnectCmd(a),
		newDisconnectCmd(a),
		newConnectionsCmd(a),
		newDiscoverCmd(a),
		newReloadCmd(a),
		newLinkCmd(a),
		newConfigCmd(a),
	)
	root.AddCommand(newVersionCmd(a))
	root.AddCommand(packagingCmds(a)...)
	addStatsCmds(a, root)
	addWatchToLists(a, root)
	addCompletions(a, root)
	return root
}

// groupRunE runs a command that only groups subcommands: help without arguments, a usage
// error (exit 2) for an unknown subcommand (cobra would print help and exit 0).
func groupRunE(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return cmd.Help()
	}
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			names = append(names, c.Name())
		}
	}
	return usagef("unknown command %q for %q (available: %s)", args[0], cmd.CommandPath(), strings.Join(names, ", "))
}

func newGroup(use, short string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{Use: use, Short: short, Args: cobra.ArbitraryArgs, RunE: groupRunE}
	c.AddCommand(subs...)
	return c
}

// args returns an argument validator that reports usage errors with the command's use line.
func args(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if len(a) != n {
			return usagef("%s: want %d argument(s), got %d (usage: %s)", cmd.CommandPath(), n, len(a), cmd.UseLine())
		}
		return nil
	}
}

func argsRange(lo, hi int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if len(a) < lo || len(a) > hi {
			return usagef("%s: want %d to %d arguments, got %d (usage: %s)", cmd.CommandPath(), lo, hi, len(a), cmd.UseLine())
		}
		return nil
	}
}

// client returns a control API client and a context bounded by --timeout.
func (a *app) client(ctx context.Context) (*ctlapi.Client, context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	c := ctlapi.NewClient(a.socket)
	return c, ctx, func() { cancel(); c.Close() }
}

// call runs fn with a client; a timeout is reported as such.
func (a *app) call(cmd *cobra.Command, fn func(ctx context.Context, c *ctlapi.Client) error) error {
	c, ctx, done := a.client(cmd.Context())
	defer done()
	err := fn(ctx, c)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("no answer from srpd within %s (--timeout): %w", a.timeout, err)
	}
	return err
}

// structured reports whether the output is for programs (-o json or -o yaml).
func (a *app) structured() bool { return a.output == outputJSON || a.output == outputYAML }

// printData writes v as indented JSON, or with -o yaml as YAML with the same field names and
// order (the JSON document re-read as YAML nodes, which keeps the order of the keys).
func (a *app) printData(v any) error {
	return writeData(a.stdout, a.output, v)
}

func writeData(w io.Writer, format string, v any) error {
	if format != outputYAML {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	blockStyle(&doc)
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return err
	}
	return enc.Close()
}

// blockStyle turns the flow style of JSON ({...}, [...]) and its quoting into YAML's plain
// block style, where the value stays the same scalar.
func blockStyle(n *yaml.Node) {
	n.Style &^= yaml.FlowStyle
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
		n.Style &^= yaml.DoubleQuotedStyle // the encoder quotes again where plain would change the type
	}
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// errorDoc is an error in -o json/yaml form.
type errorDoc struct {
	Error    string `json:"error"`
	ExitCode int    `json:"exit_code"`
	Hint     string `json:"hint,omitempty"`
}

func (a *app) printErr(err error, code int, hint string) {
	if werr := writeData(a.stderr, a.output, errorDoc{Error: err.Error(), ExitCode: code, Hint: hint}); werr != nil {
		fmt.Fprintf(a.stderr, "srpctl: %v\n", err)
	}
}

// table returns a tabwriter for aligned columns; call Flush when done.
func (a *app) table(header ...string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	if len(header) > 0 && !a.noHeaders {
		fmt.Fprintln(tw, strings.Join(header, "\t"))
	}
	return tw
}

func row(w io.Writer, cols ...any) {
	s := make([]string, len(cols))
	for i, c := range cols {
		s[i] = fmt.Sprint(c)
		if s[i] == "" {
			s[i] = "-"
		}
	}
	fmt.Fprintln(w, strings.Join(s, "\t"))
}

// query returns the RunE of a command that asks srpd one thing (get) and prints the answer: as
// JSON with -o json, else with text. The list commands return the API's list object (e.g.
// ctlapi.LUNList), so that their JSON is the control API's.
func query[T any](a *app, get func(ctx context.Context, c *ctlapi.Client, argv []string) (T, error), text func(T) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, argv []string) error {
		return a.call(cmd, func(ctx context.Context, c *ctlapi.Client) error {
			v, err := get(ctx, c, argv)
			if err != nil {
				return err
			}
			if a.structured() {
				return a.printData(v)
			}
			return text(v)
		})
	}
}

// listCmd is a group's "list" (alias "ls") subcommand.
func listCmd(use, short string, nargs int, run func(*cobra.Command, []string) error) *cobra.Command {
	return &cobra.Command{Use: use, Aliases: []string{"ls"}, Short: short, Args: args(nargs), RunE: run}
}

// add runs a command that creates something in srpd (do) and confirms it: -o json prints what
// srpd answered, the table mode the line msg makes of it.
func add[T any](a *app, cmd *cobra.Command, do func(ctx context.Context, c *ctlapi.Client) (T, error), msg func(T) string) error {
	return a.call(cmd, func(ctx context.Context, c *ctlapi.Client) error {
		v, err := do(ctx, c)
		if err != nil {
			return err
		}
		return a.done(v, "%s", msg(v))
	})
}

// act runs a command that removes or stops something in srpd (do) and confirms it with the
// message in table mode (nothing in JSON mode).
func (a *app) act(cmd *cobra.Command, do func(ctx context.Context, c *ctlapi.Client) error, format string, args ...any) error {
	return a.call(cmd, func(ctx context.Context, c *ctlapi.Client) error {
		if err := do(ctx, c); err != nil {
			return err
		}
		return a.done(nil, format, args...)
	})
}

// persistFlag adds --persist, which makes a change also rewrite srpd's configuration file.
func persistFlag(cmd *cobra.Command, persist *bool) {
	cmd.Flags().BoolVar(persist, "persist", false, "also write the change to srpd's configuration file")
}

// done prints a confirmation in table mode (JSON mode prints v, or nothing when v is nil).
func (a *app) done(v any, format string, args ...any) error {
	if a.structured() {
		if v == nil {
			return nil
		}
		return a.printData(v)
	}
	fmt.Fprintf(a.stdout, format+"\n", args...)
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func joinInts(xs []int) string {
	if len(xs) == 0 {
		return "all"
	}
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

func since(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return now.Sub(t).Round(time.Second).String()
}
