package main

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

// newDiscoverCmd is `srpctl discover HOST[:PORT]`: srpd logs in to the target with a probe
// identity, reads its LUNs and logs out; srpctl prints what it found and the lines that
// connect to it, from srpd and from the Linux kernel's ib_srp.
func newDiscoverCmd(a *app) *cobra.Command {
	var transport, portID string
	cmd := &cobra.Command{
		Use:   "discover HOST[:PORT] [--target-port-id ID] [--transport T]",
		Short: "Log in to a remote SRP target with a probe identity and show its LUNs and how to connect",
		Long: `srpd logs in to the target at HOST (RDMA CM port PORT, 5555 by default) through one of its
transports, as initiator port ` + fmt.Sprintf("0x%016x", probeExt) + `<GUID> (the probe identity), reads its
LUNs (REPORT LUNS, INQUIRY, READ CAPACITY) and logs out. Then srpctl prints the target port ID,
the LUNs, a ready 'srpctl connect' line and the string the Linux ib_srp initiator's add_target
takes. An srpd target names its target port ID when a login names another; other targets (the
kernel's ib_srpt) need --target-port-id. The target's ACLs must admit the probe identity.`,
		Example: `  srpctl discover 192.0.2.20
  srpctl discover 192.0.2.21:5555 --target-port-id 0x0002c903000f12340002c903000f1234`,
		Args: args(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			host, port, err := splitAddress(argv[0])
			if err != nil {
				return err
			}
			req := ctlapi.DiscoverRequest{Address: host, Port: port, Transport: transport}
			if portID != "" {
				id, err := config.ParsePortID(portID)
				if err != nil {
					return usagef("--target-port-id: %v", err)
				}
				req.TargetPortID = &id
			}
			return a.call(cmd, func(ctx context.Context, c *ctlapi.Client) error {
				d, err := c.Discover(ctx, req)
				if err != nil {
					return err
				}
				if a.structured() {
					return a.printData(d)
				}
				conns, err := c.ListConnections(ctx)
				if err != nil {
					return err
				}
				// A socket given with --socket must be in the line too ($SRPCTL_SOCKET is
				// still set where the line is pasted).
				sock := ""
				if f := cmd.Flag("socket"); f != nil && f.Changed {
					sock = a.socket
				}
				return a.printDiscovery(d, host, freeConnName(host, d, conns), sock)
			})
		},
	}
	cmd.Flags().StringVar(&portID, "target-port-id", "", "the target port ID to log in to (needed for targets other than srpd)")
	cmd.Flags().StringVar(&transport, "transport", "", "the transport to log in through (default: the first)")
	return cmd
}

// probeExt is stack.ProbeInitiatorExt ("SRPDPROB"), for the help text (srpctl does not link
// the stack).
const probeExt = 0x5352504450524f42

func (a *app) printDiscovery(d *ctlapi.Discovery, host, name, socket string) error {
	how := "given"
	if d.TargetPortIDFromHint {
		how = "named by the target"
	}
	id := d.TargetPortID.SRP()
	fmt.Fprintf(a.stdout, "Target %s (through transport %s)\n", d.Address, d.Transport)
	fmt.Fprintf(a.stdout, "  target port ID %v (id_ext 0x%016x, ioc_guid 0x%016x), %s\n", d.TargetPortID, id.IDExt(), id.GUID(), how)
	fmt.Fprintf(a.stdout, "  probed as initiator %v, logged out\n\n", d.ProbeInitiatorPortID)
	tw := a.table("LUN", "VENDOR", "PRODUCT", "REV", "CAPACITY", "BLOCK", "RO", "ID")
	for _, l := range d.LUNs {
		row(tw, l.LUN, l.Vendor, l.Product, l.Revision, config.Size(l.Capacity), l.BlockSize, yesNo(l.ReadOnly), l.ID)
	}
	tw.Flush()
	_, port, err := net.SplitHostPort(d.Address)
	if err != nil {
		return fmt.Errorf("discover: address %q from srpd: %w", d.Address, err)
	}
	addr := net.JoinHostPort(host, port)
	fmt.Fprintf(a.stdout, "\nConnect from this srpd (add --nbd LUN=SOCKET to export a LUN over NBD, --persist to keep it):\n")
	line := "srpctl "
	if socket != "" {
		line += "--socket " + shellQuote(socket) + " "
	}
	line += fmt.Sprintf("connect %s --address %s --target-port-id %v", name, addr, d.TargetPortID)
	if d.InitiatorExt != 0 {
		// Another connection of ours to this target port uses the default: a login with the
		// same initiator port ID would take its I_T nexus over.
		line += fmt.Sprintf(" --initiator-ext 0x%x", d.InitiatorExt)
	}
	if d.Transport != "" {
		line += " --transport " + d.Transport
	}
	fmt.Fprintf(a.stdout, "  %s\n", line)
	// ib_srp's RDMA CM login (torvalds/linux:drivers/infiniband/ulp/srp/ib_srp.c
	// srp_opt_tokens: id_ext, ioc_guid and dest are SRP_OPT_RDMA_CM_REQUIRED).
	fmt.Fprintf(a.stdout, "Connect from Linux ib_srp (as root; srp-rxe0-1 stands for your RDMA device and port):\n")
	fmt.Fprintf(a.stdout, "  echo id_ext=%016x,ioc_guid=%016x,dest=%s > /sys/class/infiniband_srp/srp-rxe0-1/add_target\n",
		id.IDExt(), id.GUID(), addr)
	return nil
}

var nonName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// freeConnName is a connection name for the target that no connection of ours has: the host
// and port, then -2, -3, ...
func freeConnName(host string, d *ctlapi.Discovery, conns []ctlapi.ConnectionInfo) string {
	_, port, _ := net.SplitHostPort(d.Address)
	base := strings.Trim(nonName.ReplaceAllString(host+"-"+port, "-"), "-.")
	if base == "" || len(base) > 56 {
		base = "target"
	}
	taken := map[string]bool{}
	for _, c := range conns {
		taken[c.Name] = true
	}
	name := base
	for i := 2; taken[name]; i++ {
		name = base + "-" + strconv.Itoa(i)
	}
	return name
}

// shellQuote quotes s for a POSIX shell where it needs it.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+=:,@", r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
