package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

func newSessionCmd(a *app) *cobra.Command {
	var target string
	list := listCmd("list [--target TARGET]", "List the initiators logged in to our targets", 0, query(a,
		func(ctx context.Context, c *ctlapi.Client, _ []string) (ctlapi.SessionList, error) {
			ss, err := c.ListSessions(ctx, ctlapi.SessionFilter{Target: target})
			return ctlapi.SessionList{Sessions: nonNil(ss)}, err
		},
		func(l ctlapi.SessionList) error { a.printSessions(l.Sessions); return nil }))
	list.Flags().StringVar(&target, "target", "", "only the sessions of this target")
	return newGroup("session", "List, show and kill the sessions of initiators logged in to our targets",
		list,
		&cobra.Command{
			Use:   "show ID",
			Short: "Show a session: initiator, channels, negotiated limits, I/O counters",
			Args:  args(1),
			RunE: query(a, func(ctx context.Context, c *ctlapi.Client, argv []string) (*ctlapi.SessionInfo, error) {
				return c.GetSession(ctx, argv[0])
			}, a.printSession),
		},
		&cobra.Command{
			Use:   "kill ID",
			Short: "Log an initiator out (it may log in again if its ACL allows)",
			Args:  args(1),
			RunE: func(cmd *cobra.Command, argv []string) error {
				return a.act(cmd, func(ctx context.Context, c *ctlapi.Client) error {
					return c.KillSession(ctx, argv[0])
				}, "session %s killed", argv[0])
			},
		},
	)
}

func (a *app) printSession(s *ctlapi.SessionInfo) error {
	tw := a.table()
	row(tw, "ID:", s.ID)
	row(tw, "Target:", s.Target)
	row(tw, "Initiator:", s.Initiator)
	row(tw, "Remote:", s.Remote)
	row(tw, "State:", s.State)
	row(tw, "Logged in:", fmt.Sprintf("%s (%s ago)", s.LoginAt.Format(time.RFC3339), since(a.now(), s.LoginAt)))
	row(tw, "Channels:", s.Channels)
	row(tw, "Queue depth:", s.QueueDepth)
	row(tw, "IU lengths:", fmt.Sprintf("it %d, ti %d", s.MaxITIULen, s.MaxTIIULen))
	row(tw, "Immediate data:", yesNo(s.ImmediateData))
	row(tw, "LUNs:", joinInts(s.LUNs))
	row(tw, "Read-only:", yesNo(s.ReadOnly))
	st := s.Stats
	row(tw, "I/O:", fmt.Sprintf("%d commands, %s read, %s written, %d errors, %d task management, %d credit stalls",
		st.Commands, config.Size(st.ReadBytes), config.Size(st.WriteBytes), st.Errors, st.TaskMgmt, st.CreditStalls))
	return tw.Flush()
}

func (a *app) printSessions(ss []ctlapi.SessionInfo) {
	tw := a.table("ID", "TARGET", "INITIATOR", "REMOTE", "CHANNELS", "QUEUE", "STATE", "UP")
	for _, s := range ss {
		row(tw, s.ID, s.Target, s.Initiator, s.Remote, s.Channels, s.QueueDepth, s.State, since(a.now(), s.LoginAt))
	}
	tw.Flush()
}

// timeoutFlag is a --reconnect-delay/--fast-io-fail-tmo/--dev-loss-tmo value: "off" or a duration.
type timeoutFlag struct{ t *config.Timeout }

func (f *timeoutFlag) String() string {
	if f.t == nil {
		return ""
	}
	return f.t.String()
}
func (f *timeoutFlag) Type() string { return "duration|off" }
func (f *timeoutFlag) Set(s string) error {
	t, err := config.ParseTimeout(s)
	if err != nil {
		return err
	}
	f.t = t
	return nil
}

func newConnectCmd(a *app) *cobra.Command {
	var (
		s                       config.Session
		file, addr, portID, ext string
		maxIT                   string
		noImm, persist          bool
		connectTimeout          time.Duration
		rd, ff, dl              timeoutFlag
		nbd                     []string
		nbdMode, nbdGroup       string
	)
	cmd := &cobra.Command{
		Use:   "connect NAME --address HOST[:PORT] --target-port-id ID [flags] | connect [NAME] -f FILE",
		Short: "Log in to a remote SRP target and keep the session up (initiator side)",
		Long: `Log in to a remote SRP target as an initiator. srpd keeps the connection up, reconnecting
after failures with the Linux scsi_transport_srp rules: --reconnect-delay between attempts,
--fast-io-fail-tmo before queued I/O fails, --dev-loss-tmo before the remote LUNs are given up
("off" disables a timer; not all three may be off; see srpd.reference.yaml).

Remote LUNs can be exported over NBD with --nbd LUN=SOCKET.`,
		Example: `  srpctl connect storage --address 192.0.2.20 --target-port-id 0x0002c903000f12340002c903000f1234 \
      --ch-count 2 --nbd 0=/run/srpd/storage-lun0.nbd --persist
  srpctl connect -f session.yaml`,
		Args: argsRange(0, 1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if file != "" {
				ps, err := fromFile(a, cmd, argv, file, []string{"address", "port", "target-port-id", "initiator-ext", "transport", "source", "ch-count",
					"queue-depth", "max-it-iu-len", "no-immediate-data", "connect-timeout", "reconnect-delay", "fast-io-fail-tmo", "dev-loss-tmo", "nbd", "nbd-mode", "nbd-group"},
					config.ParseSession, func(s *config.Session) string { return s.Name })
				if err != nil {
					return err
				}
				s = *ps
			} else {
				if len(argv) != 1 {
					return usagef("connect: NAME is required without -f")
				}
				if addr == "" || portID == "" {
					return usagef("connect: --address and --target-port-id are required without -f")
				}
				s.Name = argv[0]
				host, port, err := splitAddress(addr)
				if err != nil {
					return err
				}
				s.Address = host
				if port != 0 {
					if cmd.Flags().Changed("port") && s.Port != port {
						return usagef("--address %s and --port %d disagree", addr, s.Port)
					}
					s.Port = port
				}
				if s.TargetPortID, err = config.ParsePortID(portID); err != nil {
					return usagef("--target-port-id: %v", err)
				}
				if ext != "" {
					if s.InitiatorExt, err = config.ParseID64(ext); err != nil {
						return usagef("--initiator-ext: %v", err)
					}
				}
				if s.MaxITIULen, err = optSize("max-it-iu-len", maxIT); err != nil {
					return err
				}
				if noImm {
					s.ImmediateData = config.Bool(false)
				}
				s.ConnectTimeout = config.Duration(connectTimeout)
				s.ReconnectDelay, s.FastIOFailTmo, s.DevLossTmo = rd.t, ff.t, dl.t
				for _, e := range nbd {
					lun, sock, ok := strings.Cut(e, "=")
					if !ok {
						return usagef("--nbd %q: want LUN=SOCKET, e.g. 0=/run/srpd/lun0.nbd", e)
					}
					n, err := parseLUN(lun)
					if err != nil {
						return err
					}
					e := config.NBDExport{LUN: n, Socket: sock, Group: nbdGroup}
					if nbdMode != "" {
						if e.Mode, err = config.ParseFileMode(nbdMode); err != nil {
							return usagef("--nbd-mode %q: %v", nbdMode, err)
						}
					}
					s.NBD = append(s.NBD, e)
				}
			}
			return a.call(cmd, func(ctx context.Context, c *ctlapi.Client) error {
				info, err := c.Connect(ctx, s, ctlapi.MutateOptions{Persist: persist})
				if err != nil {
					return err
				}
				if a.structured() {
					return a.printData(info)
				}
				fmt.Fprintf(a.stdout, "connection %s to %s: %s, initiator port id %s%s\n", info.Name, info.Address, info.State,
					info.InitiatorPortID, persisted(persist))
				if len(info.LUNs) > 0 {
					a.printRemoteLUNs(info.LUNs)
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "file", "f", "", "YAML or JSON file with the whole session (- for standard input)")
	f.StringVar(&addr, "address", "", "target IP address or host name, optionally with :port ([v6]:port)")
	f.IntVar(&s.Port, "port", 0, "target RDMA CM port (default 5555)")
	f.StringVar(&portID, "target-port-id", "", "target port ID: 32 hex digits, id_ext then ioc_guid")
	f.StringVar(&ext, "initiator-ext", "", "initiator port ID extension, hex (default 0)")
	f.StringVar(&s.Transport, "transport", "", "local transport (default: the only one)")
	f.StringVar(&s.Source, "source", "", "local IP address to connect from")
	f.IntVar(&s.ChCount, "ch-count", 0, "RDMA channels (default 1)")
	f.IntVar(&s.QueueDepth, "queue-depth", 0, "requests in flight per channel (default 64)")
	f.StringVar(&maxIT, "max-it-iu-len", "", "cap on the IU length asked at login")
	f.BoolVar(&noImm, "no-immediate-data", false, "do not ask for SRP-2 immediate data")
	f.DurationVar(&connectTimeout, "connect-timeout", 0, "one connection attempt (default 10s)")
	f.Var(&rd, "reconnect-delay", "delay between reconnect attempts, or off (default 10s)")
	f.Var(&ff, "fast-io-fail-tmo", "fail queued I/O after the link is down this long, or off (default 15s)")
	f.Var(&dl, "dev-loss-tmo", "give the remote LUNs up after this long, or off (default 600s)")
	f.StringArrayVar(&nbd, "nbd", nil, "export remote LUN over NBD: LUN=SOCKET (repeatable)")
	f.StringVar(&nbdMode, "nbd-mode", "", "permission bits of the --nbd sockets, octal (default 0660)")
	f.StringVar(&nbdGroup, "nbd-group", "", "group owning the --nbd sockets, name or id (default: the control socket's group)")
	f.BoolVar(&persist, "persist", false, "also write the session to srpd's configuration file")
	return cmd
}

// splitAddress accepts host, host:port, [v6] and [v6]:port.
func splitAddress(s string) (string, int, error) {
	if host, port, err := net.SplitHostPort(s); err == nil {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return "", 0, usagef("--address %q: port %q must be between 1 and 65535", s, port)
		}
		return host, n, nil
	}
	return strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"), 0, nil
}

func newDisconnectCmd(a *app) *cobra.Command {
	var persist bool
	cmd := &cobra.Command{
		Use:   "disconnect NAME",
		Short: "Log out of a remote target and forget the connection (initiator side)",
		Args:  args(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			return a.act(cmd, func(ctx context.Context, c *ctlapi.Client) error {
				return c.Disconnect(ctx, argv[0], ctlapi.MutateOptions{Persist: persist})
			}, "connection %s closed%s", argv[0], persisted(persist))
		},
	}
	cmd.Flags().BoolVar(&persist, "persist", false, "also remove the session from srpd's configuration file")
	return cmd
}

func newConnectionsCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "connections [NAME]",
		Aliases: []string{"conn"},
		Short:   "List our initiator connections, or show one with its remote LUNs",
		Args:    argsRange(0, 1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if len(argv) == 1 {
				return query(a, func(ctx context.Context, c *ctlapi.Client, argv []string) (*ctlapi.ConnectionInfo, error) {
					return c.GetConnection(ctx, argv[0])
				}, func(ci *ctlapi.ConnectionInfo) error { a.printConnection(ci); return nil })(cmd, argv)
			}
			return query(a, func(ctx context.Context, c *ctlapi.Client, _ []string) (ctlapi.ConnectionList, error) {
				cs, err := c.ListConnections(ctx)
				return ctlapi.ConnectionList{Connections: nonNil(cs)}, err
			}, a.printConnections)(cmd, argv)
		},
	}
}

func (a *app) printConnections(l ctlapi.ConnectionList) error {
	tw := a.table("NAME", "ADDRESS", "TARGET PORT ID", "STATE", "CHANNELS", "QUEUE", "LUNS", "UP")
	for _, ci := range l.Connections {
		state := ci.State
		if ci.FailedReconnects > 0 {
			state = fmt.Sprintf("%s (%d failed reconnects)", state, ci.FailedReconnects)
		}
		if !ci.NextRetryAt.IsZero() {
			state = strings.TrimSuffix(state, ")") + fmt.Sprintf(", next in %s)", until(a.now(), ci.NextRetryAt))
		}
		row(tw, ci.Name, ci.Address, ci.TargetPortID, state, ci.Channels, ci.QueueDepth, len(ci.LUNs), since(a.now(), ci.ConnectedAt))
	}
	return tw.Flush()
}

func (a *app) printConnection(ci *ctlapi.ConnectionInfo) {
	tw := a.table()
	row(tw, "Name:", ci.Name)
	row(tw, "Address:", ci.Address)
	state := ci.State
	if ci.Error != "" {
		state += ": " + ci.Error
	}
	row(tw, "State:", state)
	row(tw, "Target port ID:", ci.TargetPortID)
	row(tw, "Initiator port ID:", ci.InitiatorPortID)
	row(tw, "Channels:", fmt.Sprintf("%d, queue depth %d", ci.Channels, ci.QueueDepth))
	row(tw, "Connected:", since(a.now(), ci.ConnectedAt))
	row(tw, "Failed reconnects:", ci.FailedReconnects)
	if !ci.NextRetryAt.IsZero() {
		row(tw, "Next retry:", fmt.Sprintf("%s (in %s)", ci.NextRetryAt.Format(time.RFC3339), until(a.now(), ci.NextRetryAt)))
	}
	cfg := ci.Config
	if cfg.ReconnectDelay != nil && cfg.FastIOFailTmo != nil && cfg.DevLossTmo != nil {
		row(tw, "Timeouts:", fmt.Sprintf("reconnect_delay %s, fast_io_fail_tmo %s, dev_loss_tmo %s", cfg.ReconnectDelay, cfg.FastIOFailTmo, cfg.DevLossTmo))
	}
	tw.Flush()
	fmt.Fprintf(a.stdout, "\nRemote LUNs (%d):\n", len(ci.LUNs))
	a.printRemoteLUNs(ci.LUNs)
}

func (a *app) printRemoteLUNs(ls []ctlapi.RemoteLUN) {
	tw := a.table("LUN", "CAPACITY", "BLOCK", "READ-ONLY", "PRODUCT", "NBD SOCKET")
	for _, l := range ls {
		row(tw, l.LUN, config.Size(l.Capacity), l.BlockSize, yesNo(l.ReadOnly), strings.TrimSpace(l.Vendor+" "+l.Product), l.NBDSocket)
	}
	tw.Flush()
}
