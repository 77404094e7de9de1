package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
)

func newLinkCmd(a *app) *cobra.Command {
	var netdev, typ string
	add := &cobra.Command{
		Use:   "add NAME [type rxe|siw] netdev DEV  |  add NAME --netdev DEV [--type rxe|siw]",
		Short: "Create a software RDMA link on a network interface (rdma link add), as root",
		Long: `Create a kernel software RDMA device on a network interface through RDMA netlink, as
` + "`rdma link add NAME type rxe netdev DEV`" + ` does (the same words are accepted after NAME, or the
--type and --netdev flags). Needs root (CAP_NET_ADMIN) and a kernel with rdma_rxe (or siw);
without RDMA netlink it exits 7. srpd's embedded softroce transport needs none of this; kernel
links are for the verbs transport and for Linux peers (ib_srp, ib_srpt) on this host.`,
		Example: "  srpctl link add rxe0 type rxe netdev eth0\n  srpctl link add rxe0 --netdev eth0",
		Args:    argsRange(1, 5),
		RunE: func(cmd *cobra.Command, argv []string) error {
			name, words := argv[0], argv[1:]
			for len(words) > 0 {
				if len(words) < 2 {
					return usagef("link add: %q needs a value (usage: %s)", words[0], cmd.UseLine())
				}
				switch words[0] {
				case "type":
					if cmd.Flags().Changed("type") {
						return usagef("link add: type given twice")
					}
					typ = words[1]
				case "netdev":
					if netdev != "" {
						return usagef("link add: netdev given twice")
					}
					netdev = words[1]
				default:
					return usagef("link add: unknown word %q (want type or netdev)", words[0])
				}
				words = words[2:]
			}
			if netdev == "" {
				return usagef("link add: a network interface is required (netdev DEV or --netdev DEV)")
			}
			if typ != "rxe" && typ != "siw" {
				return usagef("--type %q: want rxe or siw", typ)
			}
			if err := a.links.Add(name, typ, netdev); err != nil {
				return err
			}
			return a.done(nil, "RDMA link %s (%s) created on %s", name, typ, netdev)
		},
	}
	add.Flags().StringVar(&netdev, "netdev", "", "network interface to bind the link to")
	add.Flags().StringVar(&typ, "type", "rxe", "link type: rxe (RoCEv2) or siw (iWARP)")
	_ = add.RegisterFlagCompletionFunc("type", cobra.FixedCompletions([]string{"rxe", "siw"}, cobra.ShellCompDirectiveNoFileComp))

	return newGroup("link", "List, add and delete kernel RDMA links (RDMA netlink; no daemon needed)",
		&cobra.Command{
			Use:     "list",
			Aliases: []string{"ls"},
			Short:   "List the kernel's RDMA devices and those the verbs transport can open",
			Long: `List the kernel's RDMA devices through RDMA netlink, like ` + "`rdma dev`" + `, and, in a
build with the verbs transport (-tags verbs), the devices libibverbs opens (the VERBS column:
what a transport with driver verbs can name as its device; "-" when this srpctl has no verbs
support). Exits 7 when the kernel has no RDMA netlink support and libibverbs sees no device.`,
			Args: args(0),
			RunE: func(cmd *cobra.Command, _ []string) error {
				ls, lerr := a.links.List()
				vdevs, verr := a.links.VerbsDevices()
				if lerr != nil && len(vdevs) == 0 {
					return lerr
				}
				inVerbs := func(name string) string {
					switch {
					case verr != nil:
						return ""
					case slices.Contains(vdevs, name):
						return "yes"
					}
					return "no"
				}
				var extra []string // verbs devices RDMA netlink did not list
				for _, v := range vdevs {
					if !slices.ContainsFunc(ls, func(l rdmaLink) bool { return l.Name == v }) {
						extra = append(extra, v)
					}
				}
				if a.structured() {
					out := struct {
						Links        []rdmaLink `json:"links"`
						VerbsDevices []string   `json:"verbs_devices"`
						VerbsError   string     `json:"verbs_error,omitempty"`
						NetlinkError string     `json:"netlink_error,omitempty"`
					}{Links: nonNil(ls), VerbsDevices: nonNil(vdevs)}
					if verr != nil {
						out.VerbsError = verr.Error()
					}
					if lerr != nil {
						out.NetlinkError = lerr.Error()
					}
					return a.printData(out)
				}
				if lerr != nil {
					fmt.Fprintf(a.stderr, "srpctl: warning: %v\n", lerr)
				}
				if len(ls) == 0 && len(extra) == 0 {
					fmt.Fprintln(a.stdout, "no RDMA devices (create one with `srpctl link add rxe0 type rxe netdev eth0`)")
					return nil
				}
				tw := a.table("NAME", "INDEX", "NODE GUID", "PORTS", "FIRMWARE", "VERBS")
				for _, l := range ls {
					row(tw, l.Name, l.Index, strings.ToLower(l.NodeGUID), l.Ports, l.FirmwareVersion, inVerbs(l.Name))
				}
				for _, v := range extra {
					row(tw, v, "", "", "", "", "yes")
				}
				return tw.Flush()
			},
		},
		add,
		&cobra.Command{
			Use:     "delete NAME",
			Aliases: []string{"del", "rm"},
			Short:   "Delete a software RDMA link (rdma link delete), as root",
			Long: `Delete a kernel software RDMA link through RDMA netlink, as ` + "`rdma link delete NAME`" + `
does. Exits 7 when the kernel has no RDMA netlink support, 5 when there is no such link.`,
			Args: args(1),
			RunE: func(cmd *cobra.Command, argv []string) error {
				if err := a.links.Delete(argv[0]); err != nil {
					return err
				}
				return a.done(nil, "RDMA link %s deleted", argv[0])
			},
		},
	)
}
