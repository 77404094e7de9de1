package main

import (
	"context"
	"encoding/json"
	"fmt"
	"go.yaml.in/yaml/v3"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

func newStatusCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the daemon's state: version, uptime, transports, counts",
		Args:  args(0),
		RunE: query(a, func(ctx context.Context, c *ctlapi.Client, _ []string) (*ctlapi.Status, error) {
			return c.Status(ctx)
		}, a.printStatus),
	}
}

func (a *app) printStatus(st *ctlapi.Status) error {
	tw := a.table()
	row(tw, "Daemon:", fmt.Sprintf("srpd %s (pid %d), API v%d", st.Version, st.PID, st.APIVersion))
	row(tw, "Started:", fmt.Sprintf("%s (up %s)", st.StartedAt.Format("2006-01-02 15:04:05 MST"), since(a.now(), st.StartedAt)))
	row(tw, "Config:", st.ConfigPath)
	if h := st.Health; h != nil {
		row(tw, "Health:", healthLine(h))
		for _, f := range h.Failed {
			what := f.Kind
			if f.Name != "" {
				what += " " + f.Name
			}
			msg := f.Error
			if !f.NextRetryAt.IsZero() {
				msg += fmt.Sprintf(" (next try in %s)", until(a.now(), f.NextRetryAt))
			}
			row(tw, "  "+what+":", msg)
		}
	}
	row(tw, "Socket:", a.socket)
	row(tw, "Targets:", st.Targets)
	row(tw, "Sessions:", fmt.Sprintf("%d (initiators logged in to our targets)", st.Sessions))
	row(tw, "Connections:", fmt.Sprintf("%d (our initiator sessions)", st.Connections))
	tw.Flush()
	if len(st.Transports) > 0 {
		fmt.Fprintln(a.stdout)
		tw = a.table("TRANSPORT", "DRIVER", "DEVICE", "ADDRESSES", "STATE")
		for _, t := range st.Transports {
			state := t.State
			if t.Error != "" {
				state += ": " + t.Error
			}
			row(tw, t.Name, t.Driver, t.Device, strings.Join(t.Addresses, ","), state)
		}
		tw.Flush()
	}
	return nil
}

func newTargetCmd(a *app) *cobra.Command {
	return newGroup("target", "List, show, create and delete SRP targets",
		listCmd("list", "List the targets", 0, query(a,
			func(ctx context.Context, c *ctlapi.Client, _ []string) (ctlapi.TargetList, error) {
				ts, err := c.ListTargets(ctx)
				return ctlapi.TargetList{Targets: nonNil(ts)}, err
			},
			func(l ctlapi.TargetList) error {
				tw := a.table("NAME", "PORT ID", "TRANSPORT", "LISTEN", "LUNS", "ACLS", "SESSIONS", "STATE")
				for _, t := range l.Targets {
					row(tw, t.Name, t.PortID, t.Transport, strings.Join(t.Listen, ","), len(t.LUNs), len(t.ACLs), t.Sessions, t.State)
				}
				return tw.Flush()
			})),
		&cobra.Command{
			Use:   "show TARGET",
			Short: "Show a target: settings, LUNs, ACLs and logged-in sessions",
			Args:  args(1),
			RunE: query(a, func(ctx context.Context, c *ctlapi.Client, argv []string) (targetShow, error) {
				t, err := c.GetTarget(ctx, argv[0])
				if err != nil {
					return targetShow{}, err
				}
				ss, err := c.ListSessions(ctx, ctlapi.SessionFilter{Target: t.Name})
				return targetShow{t, nonNil(ss)}, err
			}, func(ts targetShow) error { a.printTarget(ts.TargetInfo, ts.SessionList); return nil }),
		},
		newTargetCreateCmd(a),
		newTargetDeleteCmd(a),
		newTargetALUACmd(a),
	)
}

// targetShow is `target show -o json`: the target with its logged-in sessions.
type targetShow struct {
	*ctlapi.TargetInfo
	SessionList []ctlapi.SessionInfo `json:"session_list"`
}

func (a *app) printTarget(t *ctlapi.TargetInfo, ss []ctlapi.SessionInfo) {
	tw := a.table()
	row(tw, "Name:", t.Name)
	state := t.State
	if t.Error != "" {
		state += ": " + t.Error
	}
	row(tw, "State:", state)
	row(tw, "Port ID:", fmt.Sprintf("%s (id_ext 0x%016x, ioc_guid 0x%016x)", t.PortID, t.PortID.IDExt(), t.PortID.GUID()))
	row(tw, "Transport:", t.Transport)
	row(tw, "Listen:", strings.Join(t.Listen, ", "))
	l := t.Limits
	imm := l.ImmediateData != nil && *l.ImmediateData
	row(tw, "Limits:", fmt.Sprintf("max_channels %d, queue_depth %d, max_it_iu_len %d, max_ti_iu_len %d, immediate_data %s",
		l.MaxChannels, l.QueueDepth, int64(l.MaxITIULen), int64(l.MaxTIIULen), yesNo(imm)))
	tw.Flush()
	fmt.Fprintf(a.stdout, "\nLUNs (%d):\n", len(t.LUNs))
	a.printLUNs(t.LUNs)
	fmt.Fprintf(a.stdout, "\nACLs (%d):\n", len(t.ACLs))
	a.printACLs(t.ACLs)
	fmt.Fprintf(a.stdout, "\nSessions (%d):\n", len(ss))
	a.printSessions(ss)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// readSpec reads a YAML/JSON file ("-" = standard input) for -f.
func (a *app) readSpec(path string) (string, []byte, error) {
	if path == "-" {
		b, err := io.ReadAll(io.LimitReader(a.stdin, config.MaxFileSize))
		return "<stdin>", b, err
	}
	b, err := os.ReadFile(path)
	return path, b, err
}

// fromFile reads the whole object that -f FILE gives (parse reads it): the flags that would
// describe it too may not be given as well, and NAME, when given, must be the file's.
func fromFile[T any](a *app, cmd *cobra.Command, argv []string, file string, flags []string, parse func(string, []byte) (*T, error), name func(*T) string) (*T, error) {
	for _, f := range flags {
		if cmd.Flags().Changed(f) {
			return nil, usagef("--%s cannot be combined with -f (put it in the file)", f)
		}
	}
	src, data, err := a.readSpec(file)
	if err != nil {
		return nil, err
	}
	data, err = specOf(src, data)
	if err != nil {
		return nil, err
	}
	v, err := parse(src, data)
	if err != nil {
		return nil, err
	}
	if len(argv) == 1 && argv[0] != name(v) {
		return nil, usagef("NAME %q differs from the name %q in %s", argv[0], name(v), file)
	}
	return v, nil
}

func newTargetCreateCmd(a *app) *cobra.Command {
	var (
		file, portID, transport string
		listen                  []string
		cmPort                  int
		lim                     config.Limits
		maxIT, maxTI            string
		noImm, persist          bool
	)
	cmd := &cobra.Command{
		Use:   "create NAME --port-id ID [flags] | create [NAME] -f FILE",
		Short: "Create a target (add LUNs and ACLs with lun add / acl add, or all at once with -f)",
		Long: `Create a target. Either give its settings as flags, or give a whole target (the YAML
or JSON of one "targets:" entry of srpd.yaml, LUNs and ACLs included) with -f.

Without any ACL no initiator may log in: add one with 'srpctl acl add'.`,
		Example: `  srpctl target create demo --port-id 0x00000000000000010000000000000001 --listen 127.0.0.1
  srpctl target create -f storage.yaml --persist`,
		Args: argsRange(0, 1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			var t config.Target
			if file != "" {
				pt, err := fromFile(a, cmd, argv, file, []string{"port-id", "transport", "listen", "cm-port", "max-channels", "queue-depth", "max-it-iu-len", "max-ti-iu-len", "no-immediate-data"},
					config.ParseTarget, func(t *config.Target) string { return t.Name })
				if err != nil {
					return err
				}
				t = *pt
			} else {
				if len(argv) != 1 {
					return usagef("target create: NAME is required without -f")
				}
				if portID == "" {
					return usagef("target create: --port-id is required without -f")
				}
				p, err := config.ParsePortID(portID)
				if err != nil {
					return usagef("--port-id: %v", err)
				}
				t = config.Target{Name: argv[0], Transport: transport, PortID: p, Listen: listen, CMPort: cmPort, Limits: lim}
				if t.Limits.MaxITIULen, err = optSize("max-it-iu-len", maxIT); err != nil {
					return err
				}
				if t.Limits.MaxTIIULen, err = optSize("max-ti-iu-len", maxTI); err != nil {
					return err
				}
				if noImm {
					t.Limits.ImmediateData = config.Bool(false)
				}
			}
			return add(a, cmd, func(ctx context.Context, c *ctlapi.Client) (*ctlapi.TargetInfo, error) {
				return c.CreateTarget(ctx, t, ctlapi.MutateOptions{Persist: persist})
			}, func(info *ctlapi.TargetInfo) string {
				return fmt.Sprintf("target %s created: port id %s, listening on %s%s", info.Name, info.PortID,
					strings.Join(info.Listen, ", "), persisted(persist))
			})
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "file", "f", "", "YAML or JSON file with the whole target (- for standard input)")
	f.StringVar(&portID, "port-id", "", "target port ID: 32 hex digits, id_ext then ioc_guid")
	f.StringVar(&transport, "transport", "", "transport to listen on (default: the only one)")
	f.StringSliceVar(&listen, "listen", nil, "local IP addresses to listen on (default: all of the transport's)")
	f.IntVar(&cmPort, "cm-port", 0, "RDMA CM port (default 5555)")
	f.IntVar(&lim.MaxChannels, "max-channels", 0, "channels per initiator (default 8)")
	f.IntVar(&lim.QueueDepth, "queue-depth", 0, "credits per channel (default 128)")
	f.StringVar(&maxIT, "max-it-iu-len", "", "largest IU accepted (default 8276)")
	f.StringVar(&maxTI, "max-ti-iu-len", "", "largest IU sent (default 256)")
	f.BoolVar(&noImm, "no-immediate-data", false, "do not offer SRP-2 immediate data")
	persistFlag(cmd, &persist)
	return cmd
}

func optSize(flag, v string) (config.Size, error) {
	if v == "" {
		return 0, nil
	}
	s, err := config.ParseSize(v)
	if err != nil {
		return 0, usagef("--%s: %v", flag, err)
	}
	return s, nil
}

func persisted(p bool) string {
	if p {
		return " (saved to the configuration file)"
	}
	return ""
}

func newTargetDeleteCmd(a *app) *cobra.Command {
	var force, persist bool
	cmd := &cobra.Command{
		Use:     "delete TARGET",
		Aliases: []string{"rm"},
		Short:   "Delete a target (--force logs its initiators out)",
		Args:    args(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			return a.act(cmd, func(ctx context.Context, c *ctlapi.Client) error {
				return c.DeleteTarget(ctx, argv[0], ctlapi.DeleteOptions{Persist: persist, Force: force})
			}, "target %s deleted%s", argv[0], persisted(persist))
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "delete even while initiators are logged in")
	persistFlag(cmd, &persist)
	return cmd
}

// specOf returns the object to create from data: data itself (a "targets:" or "sessions:"
// entry), or the spec it holds when data is what `show -o json` or `-o yaml` printed (a
// target's "spec", a connection's "config"), its status fields left out.
func specOf(src string, data []byte) ([]byte, error) {
	var doc map[string]any
	if yaml.Unmarshal(data, &doc) != nil {
		return data, nil // not a mapping: the parser says what is wrong
	}
	_, hasState := doc["state"]
	for _, key := range []string{"spec", "config"} {
		inner, ok := doc[key].(map[string]any)
		if !ok || !hasState {
			continue
		}
		b, err := json.Marshal(inner)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", src, key, err)
		}
		return b, nil
	}
	return data, nil
}
