package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

func parseLUN(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > config.MaxLUNID {
		return 0, usagef("LUN %q: want a number between 0 and %d", s, config.MaxLUNID)
	}
	return n, nil
}

func newLUNCmd(a *app) *cobra.Command {
	return newGroup("lun", "List, add, remove, resize and write-protect the LUNs of a target",
		listCmd("list TARGET", "List a target's LUNs", 1, query(a,
			func(ctx context.Context, c *ctlapi.Client, argv []string) (ctlapi.LUNList, error) {
				ls, err := c.ListLUNs(ctx, argv[0])
				return ctlapi.LUNList{LUNs: nonNil(ls)}, err
			},
			func(l ctlapi.LUNList) error { a.printLUNs(l.LUNs); return nil })),
		newLUNAddCmd(a),
		newLUNRemoveCmd(a),
		newLUNResizeCmd(a),
		newLUNSetCmd(a),
	)
}

func (a *app) printLUNs(ls []ctlapi.LUNInfo) {
	tw := a.table("LUN", "BACKEND", "PATH", "CAPACITY", "BLOCK", "READ-ONLY", "STATE")
	for _, l := range ls {
		state := l.State
		if l.Error != "" {
			state += ": " + l.Error
		}
		row(tw, l.ID, l.Backend, lunSource(l.LUN), config.Size(l.Capacity), l.BlockSize, yesNo(l.ReadOnly), state)
	}
	tw.Flush()
}

func newLUNAddCmd(a *app) *cobra.Command {
	var (
		l              config.LUN
		size           string
		persist        bool
		rbd            config.RBD
		backendChoices = []string{config.BackendRAM, config.BackendFile, config.BackendBlockDev, config.BackendRBD}
	)
	cmd := &cobra.Command{
		Use:   "add TARGET LUN --backend ram|file|blockdev|rbd [flags]",
		Short: "Add a LUN to a target",
		Long:  "Add a LUN to a target.\n\n" + liveNote,
		Example: `  srpctl lun add demo 1 --backend ram --size 1GiB
  srpctl lun add demo 2 --backend file --path /var/lib/srpd/d2.img --create --size 64GiB --block-size 4096
  srpctl lun add demo 3 --backend blockdev --path /dev/disk/by-id/wwn-0x5000c500a1b2c3d4 --direct --persist
  srpctl lun add demo 4 --backend rbd --pool rbd --image vm-disk-1 --client client.srpd \
    --keyring /etc/ceph/ceph.client.srpd.keyring --block-size 4096   # srpd built with -tags rbd`,
		Args: args(2),
		RunE: func(cmd *cobra.Command, argv []string) error {
			id, err := parseLUN(argv[1])
			if err != nil {
				return err
			}
			if l.Backend == "" {
				return usagef("lun add: --backend is required (%s, %s, %s or %s)", backendChoices[0], backendChoices[1],
					backendChoices[2], backendChoices[3])
			}
			switch {
			case l.Backend == config.BackendRBD && (rbd.Pool == "" || rbd.Image == ""):
				return usagef("lun add: --backend rbd needs --pool and --image")
			case rbd != (config.RBD{}):
				l.RBD = &rbd // on another backend: the daemon says the settings do not apply
			}
			l.ID = id
			if l.Size, err = optSize("size", size); err != nil {
				return err
			}
			return add(a, cmd, func(ctx context.Context, c *ctlapi.Client) (*ctlapi.LUNInfo, error) {
				return c.AddLUN(ctx, argv[0], l, ctlapi.MutateOptions{Persist: persist})
			}, func(info *ctlapi.LUNInfo) string {
				return fmt.Sprintf("LUN %d added to target %s: %s %s%s", info.ID, argv[0], info.Backend,
					describeBackend(info), persisted(persist))
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&l.Backend, "backend", "", "ram, file, blockdev or rbd")
	f.StringVar(&l.Path, "path", "", "file or block device path (file, blockdev)")
	f.StringVar(&size, "size", "", "capacity, e.g. 64MiB (ram: required; file: create or extend to it)")
	f.BoolVar(&l.Create, "create", false, "create the file if it does not exist (file; needs --size)")
	f.BoolVar(&l.Direct, "direct", false, "O_DIRECT I/O (file, blockdev)")
	f.BoolVar(&l.FollowSymlinks, "follow-symlinks", false, "allow a symbolic link in the path, e.g. /dev/disk/by-id/... (file, blockdev)")
	f.IntVar(&l.BlockSize, "block-size", 0, "logical block size: 512 (default) or 4096")
	f.BoolVar(&l.ReadOnly, "read-only", false, "write-protect the LUN")
	f.StringVar(&l.Serial, "serial", "", "unit serial number (default: derived)")
	f.StringVar(&rbd.Pool, "pool", "", "RBD pool (rbd; required)")
	f.StringVar(&rbd.Namespace, "namespace", "", "RBD namespace (rbd; default none)")
	f.StringVar(&rbd.Image, "image", "", "RBD image, which must exist (rbd; required)")
	f.StringVar(&rbd.ClusterConfig, "cluster-config", "", "Ceph cluster configuration file (rbd; default "+config.DefaultRBDClusterConfig+")")
	f.StringVar(&rbd.Client, "client", "", "cephx user, client.<id> (rbd; default "+config.DefaultRBDClient+")")
	f.StringVar(&rbd.Keyring, "keyring", "", "keyring file with the client's key (rbd; default: the cluster configuration's)")
	f.StringVar(&rbd.ExclusiveLock, "exclusive-lock", "", "managed (default: take the image's lock on first I/O, fencing "+
		"the gateway that had it) or auto (librbd hands it over) (rbd)")
	persistFlag(cmd, &persist)
	_ = cmd.RegisterFlagCompletionFunc("backend", cobra.FixedCompletions(backendChoices, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("exclusive-lock", cobra.FixedCompletions([]string{config.RBDLockManaged, config.RBDLockAuto},
		cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("block-size", cobra.FixedCompletions([]string{"512", "4096"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func describeBackend(l *ctlapi.LUNInfo) string {
	s := fmt.Sprintf("%s, block size %d", config.Size(l.Capacity), l.BlockSize)
	if src := lunSource(l.LUN); src != "" {
		s = src + ", " + s
	}
	return "(" + s + ")"
}

// lunSource is where a LUN's data is: its file or device path, or its RBD image spec.
func lunSource(l config.LUN) string {
	if l.RBD != nil {
		return l.RBD.Spec()
	}
	return l.Path
}

func newLUNRemoveCmd(a *app) *cobra.Command {
	return removeCmd(a, "remove TARGET LUN", "Remove a LUN from a target",
		"Remove a LUN from a target. A LUN that an ACL lists must be removed from the ACL first.\n\n"+liveNote,
		parseLUN, (*ctlapi.Client).RemoveLUN, "LUN %d removed from target %s%s")
}

// removeCmd is the "remove" (alias "rm") subcommand of the LUNs or ACLs of a target: it
// removes the one that parse reads from the second argument from the target the first names.
// The confirmation's format takes that key, the target's name and persisted.
func removeCmd[K any](a *app, use, short, long string, parse func(string) (K, error),
	remove func(c *ctlapi.Client, ctx context.Context, target string, key K, opts ctlapi.MutateOptions) error, format string,
) *cobra.Command {
	var persist bool
	cmd := &cobra.Command{
		Use:     use,
		Aliases: []string{"rm"},
		Short:   short,
		Long:    long,
		Args:    args(2),
		RunE: func(cmd *cobra.Command, argv []string) error {
			key, err := parse(argv[1])
			if err != nil {
				return err
			}
			return a.act(cmd, func(ctx context.Context, c *ctlapi.Client) error {
				return remove(c, ctx, argv[0], key, ctlapi.MutateOptions{Persist: persist})
			}, format, key, argv[0], persisted(persist))
		},
	}
	persistFlag(cmd, &persist)
	return cmd
}

func newACLCmd(a *app) *cobra.Command {
	return newGroup("acl", "List, add and remove the initiators allowed to log in to a target",
		listCmd("list TARGET", "List a target's ACLs", 1, query(a,
			func(ctx context.Context, c *ctlapi.Client, argv []string) (ctlapi.ACLList, error) {
				as, err := c.ListACLs(ctx, argv[0])
				return ctlapi.ACLList{ACLs: nonNil(as)}, err
			},
			func(l ctlapi.ACLList) error { a.printACLs(l.ACLs); return nil })),
		newACLAddCmd(a),
		newACLRemoveCmd(a),
		newACLSetCmd(a),
	)
}

func (a *app) printACLs(as []ctlapi.ACLInfo) {
	tw := a.table("INITIATOR", "LUNS", "READ-ONLY", "SESSIONS")
	for _, x := range as {
		row(tw, x.Initiator, joinInts(x.LUNs), yesNo(x.ReadOnly), x.Sessions)
	}
	tw.Flush()
}

func parseInitiator(s string) (config.InitiatorID, error) {
	ini, err := config.ParseInitiatorID(s)
	if err != nil {
		return ini, usagef("%v", err)
	}
	return ini, nil
}

func newACLAddCmd(a *app) *cobra.Command {
	return aclCmd(a, &cobra.Command{
		Use:   "add TARGET INITIATOR [--luns 0,1] [--read-only]",
		Short: `Allow an initiator (port ID, or "*" for any other) to log in to a target`,
		Long: `Allow an initiator to log in to a target. INITIATOR is the initiator port ID (32 hex
digits: initiator_ext, then the GUID of the initiator's port; srpd's own sessions use the low
64 bits of their transport's GID 0, e.g. 0000ffff7f000001 for 127.0.0.1), or "*" for every
initiator no other ACL names.

` + liveNote,
		Example: `  srpctl acl add demo 0x00000000000000005054000000000001 --luns 0,1
  srpctl acl add demo '*' --read-only`,
	}, (*ctlapi.Client).AddACL, "initiator %s may log in to target %s (LUNs: %s, read-only: %s)%s")
}

// aclCmd completes cmd (its texts set) as a command that sends an ACL (TARGET INITIATOR
// --luns --read-only) with call and reports the result with done's format (initiator, target,
// LUNs, read-only, persisted).
func aclCmd(a *app, cmd *cobra.Command,
	call func(*ctlapi.Client, context.Context, string, config.ACL, ctlapi.MutateOptions) (*ctlapi.ACLInfo, error),
	done string) *cobra.Command {
	var (
		luns     []int
		readOnly bool
		persist  bool
	)
	cmd.Args = args(2)
	cmd.RunE = func(cmd *cobra.Command, argv []string) error {
		ini, err := parseInitiator(argv[1])
		if err != nil {
			return err
		}
		acl := config.ACL{Initiator: ini, LUNs: luns, ReadOnly: readOnly}
		return add(a, cmd, func(ctx context.Context, c *ctlapi.Client) (*ctlapi.ACLInfo, error) {
			return call(c, ctx, argv[0], acl, ctlapi.MutateOptions{Persist: persist})
		}, func(info *ctlapi.ACLInfo) string {
			return fmt.Sprintf(done, info.Initiator, argv[0], joinInts(info.LUNs), yesNo(info.ReadOnly), persisted(persist))
		})
	}
	cmd.Flags().IntSliceVar(&luns, "luns", nil, "LUNs the initiator may see (default: all)")
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "write-protect every LUN for this initiator")
	persistFlag(cmd, &persist)
	return cmd
}

func newACLRemoveCmd(a *app) *cobra.Command {
	return removeCmd(a, "remove TARGET INITIATOR", "Remove an initiator's ACL", "Remove an initiator's ACL.\n\n"+liveNote,
		parseInitiator, (*ctlapi.Client).RemoveACL, "ACL of %s removed from target %s%s")
}
