package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

// liveNote explains what a LUN or ACL change does to the target's sessions.
const liveNote = `The change applies to the running target: initiators stay logged in and are told with a
unit attention (REPORTED LUNS DATA HAS CHANGED for LUNs added or removed, CAPACITY DATA HAS
CHANGED for a resize, MODE PARAMETERS CHANGED for write protection), only those whose ACL
shows the LUN. Removing an ACL logs out the initiators it admitted, nobody else.`

func newLUNResizeCmd(a *app) *cobra.Command {
	var (
		size    string
		rescan  bool
		persist bool
	)
	cmd := &cobra.Command{
		Use:   "resize TARGET LUN (--size SIZE | --rescan)",
		Short: "Grow a LUN while initiators use it",
		Long: `Grow a LUN while initiators use it: a RAM disk or file to --size (LUNs never shrink; a RAM
disk grows to twice its size at creation, or 1 GiB), or --rescan to read the size of a block
device or RBD image grown by other means (lvextend, rbd resize).

` + liveNote,
		Example: `  srpctl lun resize demo 1 --size 128GiB --persist
  srpctl lun resize demo 3 --rescan`,
		Args: args(2),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id, err := parseLUN(argv[1])
			if err != nil {
				return err
			}
			var u ctlapi.LUNUpdate
			switch s, err := optSize("size", size); {
			case err != nil:
				return err
			case (s == 0) == !rescan:
				return usagef("lun resize: give --size or --rescan")
			case s != 0:
				u.Size = &s
			default:
				u.Rescan = true
			}
			return add(a, cmd, func(ctx context.Context, c *ctlapi.Client) (*ctlapi.LUNInfo, error) {
				return c.UpdateLUN(ctx, argv[0], id, u, ctlapi.MutateOptions{Persist: persist})
			}, func(info *ctlapi.LUNInfo) string {
				return fmt.Sprintf("LUN %d of target %s has %v%s", info.ID, argv[0], config.Size(info.Capacity), persisted(persist))
			})
		},
	}
	cmd.Flags().StringVar(&size, "size", "", "new capacity, e.g. 128GiB (ram, file)")
	cmd.Flags().BoolVar(&rescan, "rescan", false, "read the backend's size again (blockdev, rbd, a file grown by hand)")
	persistFlag(cmd, &persist)
	return cmd
}

func newLUNSetCmd(a *app) *cobra.Command {
	var persist bool
	cmd := &cobra.Command{
		Use:   "set TARGET LUN --read-only=true|false",
		Short: "Write-protect a LUN, or lift its protection, while initiators use it",
		Long:  "Write-protect a LUN for every initiator, or lift that protection.\n\n" + liveNote,
		Example: `  srpctl lun set demo 1 --read-only
  srpctl lun set demo 1 --read-only=false --persist`,
		Args: args(2),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id, err := parseLUN(argv[1])
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("read-only") {
				return usagef("lun set: nothing to change (--read-only=true|false)")
			}
			ro, _ := cmd.Flags().GetBool("read-only")
			u := ctlapi.LUNUpdate{ReadOnly: &ro}
			return add(a, cmd, func(ctx context.Context, c *ctlapi.Client) (*ctlapi.LUNInfo, error) {
				return c.UpdateLUN(ctx, argv[0], id, u, ctlapi.MutateOptions{Persist: persist})
			}, func(info *ctlapi.LUNInfo) string {
				return fmt.Sprintf("LUN %d of target %s is read-only: %s%s", info.ID, argv[0], yesNo(info.ReadOnly), persisted(persist))
			})
		},
	}
	cmd.Flags().Bool("read-only", false, "write-protect the LUN (false: lift the protection)")
	persistFlag(cmd, &persist)
	return cmd
}

func newACLSetCmd(a *app) *cobra.Command {
	return aclCmd(a, &cobra.Command{
		Use:   "set TARGET INITIATOR [--luns 0,1] [--read-only]",
		Short: "Change an initiator's ACL (its LUNs, its write protection) while it is logged in",
		Long: `Replace an initiator's ACL: the LUNs it sees (default: all) and whether they are
write-protected for it. Its sessions stay logged in.

` + liveNote,
		Example: `  srpctl acl set demo 0x00000000000000005054000000000001 --luns 0,1,2
  srpctl acl set demo '*' --read-only`,
	}, (*ctlapi.Client).UpdateACL, "ACL of %s on target %s: LUNs %s, read-only: %s%s")
}
