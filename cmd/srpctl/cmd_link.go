package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

func newLinkCmd(a *app) *cobra.Command {
	var netdev, typ string
	add := &cobra.Command{
		Use:   "add NAME --netdev DEV [--type rxe|siw]",
		Short: "Create a software RDMA link on a network interface (rdma link add), as root",
		Long: `Create a kernel software RDMA device on a network interface through RDMA netlink, as
` + "`rdma link add NAME type rxe netdev DEV`" + ` does. Needs root (CAP_NET_ADMIN) and a kernel with
rdma_rxe (or siw). srpd's embedded softroce transport needs none of this; kernel links are
for the verbs transport and for Linux peers (ib_srp, ib_srpt) on this host.`,
		Example: "  srpctl link add rxe0 --netdev eth0",
		Args:    args(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if netdev == "" {
				return usagef("link add: --netdev is required")
			}
			if typ != "rxe" && typ != "siw" {
				return usagef("--type %q: want rxe or siw", typ)
			}
			if err := a.links.Add(argv[0], typ, netdev); err != nil {
				return err
			}
			return a.done(nil, "RDMA link %s (%s) created on %s", argv[0], typ, netdev)
		},
	}
	add.Flags().StringVar(&netdev, "netdev", "", "network interface to bind the link to")
	add.Flags().StringVar(&typ, "type", "rxe", "link type: rxe (RoCEv2) or siw (iWARP)")
	_ = add.RegisterFlagCompletionFunc("type", cobra.FixedCompletions([]string{"rxe", "siw"}, cobra.ShellCompDirectiveNoFileComp))

	return newGroup("link", "List, add and delete kernel RDMA links (RDMA netlink; no daemon needed)",
		&cobra.Command{
			Use:     "list",
			Aliases: []string{"ls"},
			Short:   "List the kernel's RDMA devices",
			Long: `List the kernel's RDMA devices through RDMA netlink, like ` + "`rdma dev`" + `.
Exits 7 when the kernel has no RDMA netlink support.`,
			Args: args(0),
			RunE: func(cmd *cobra.Command, _ []string) error {
				ls, err := a.links.List()
				if err != nil {
					return err
				}
				if a.json() {
					return a.printJSON(struct {
						Links []rdmaLink `json:"links"`
					}{nonNil(ls)})
				}
				if len(ls) == 0 {
					fmt.Fprintln(a.stdout, "no RDMA devices (create one with `srpctl link add rxe0 --netdev eth0`)")
					return nil
				}
				tw := a.table("NAME", "INDEX", "NODE GUID", "PORTS", "FIRMWARE")
				for _, l := range ls {
					row(tw, l.Name, l.Index, strings.ToLower(l.NodeGUID), l.Ports, l.FirmwareVersion)
				}
				return tw.Flush()
			},
		},
		add,
		&cobra.Command{
			Use:     "delete NAME",
			Aliases: []string{"del", "rm"},
			Short:   "Delete a software RDMA link (rdma link delete), as root",
			Args:    args(1),
			RunE: func(cmd *cobra.Command, argv []string) error {
				if err := a.links.Delete(argv[0]); err != nil {
					return err
				}
				return a.done(nil, "RDMA link %s deleted", argv[0])
			},
		},
	)
}
