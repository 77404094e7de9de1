package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

// Dynamic shell completion (cobra's ValidArgsFunction and flag completion): the names srpd
// knows are asked for over the control socket (--socket and $SRPCTL_SOCKET apply), bounded by
// completionTimeout, so that a daemon that is down or slow costs the shell a moment and
// completes nothing instead of hanging it.

const completionTimeout = 2 * time.Second

// nameKind is what a positional argument or flag value names.
type nameKind int

const (
	nameTarget     nameKind = iota + 1
	nameLUN                 // of the target named by the first argument
	nameACL                 // an ACL's initiator, of the target named by the first argument
	nameSession             // a target-side session ID
	nameConnection          // one of our initiator connections
	nameRDMALink            // a kernel RDMA link (netlink, no daemon)
)

// argNames maps a command (its path below srpctl) to what its positional arguments name, in
// order; an argument that names something new (create NAME, lun add's LUN) is not listed.
var argNames = map[string][]nameKind{
	"acl add":       {nameTarget},
	"acl list":      {nameTarget},
	"acl remove":    {nameTarget, nameACL},
	"acl set":       {nameTarget, nameACL},
	"connections":   {nameConnection},
	"disconnect":    {nameConnection},
	"link delete":   {nameRDMALink},
	"lun add":       {nameTarget},
	"lun list":      {nameTarget},
	"lun remove":    {nameTarget, nameLUN},
	"lun resize":    {nameTarget, nameLUN},
	"lun set":       {nameTarget, nameLUN},
	"lun stats":     {nameTarget, nameLUN},
	"session kill":  {nameSession},
	"session show":  {nameSession},
	"target alua":   {nameTarget},
	"target delete": {nameTarget},
	"target show":   {nameTarget},
}

// flagNames maps a command's flags to what they name (completed from the daemon).
var flagNames = map[string]map[string]nameKind{
	"session list":  {"target": nameTarget},
	"session stats": {"target": nameTarget},
	"target alua":   {"lun": nameLUN},
}

// flagValues are flags with a fixed set of values.
var flagValues = map[string]map[string][]string{
	"lun add":     {"backend": {config.BackendRAM, config.BackendFile, config.BackendBlockDev, config.BackendRBD}},
	"target alua": {"state": config.ALUAStates},
	"link add":    {"type": {"rxe", "siw"}},
}

// addCompletions wires the tables above and --output into the command tree under root.
func addCompletions(a *app, root *cobra.Command) {
	_ = root.RegisterFlagCompletionFunc("output", fixed(outputFormats))
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		path := strings.TrimPrefix(strings.TrimPrefix(c.CommandPath(), root.Name()), " ")
		if kinds, ok := argNames[path]; ok && c.ValidArgsFunction == nil {
			c.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
				if len(args) >= len(kinds) {
					return nil, cobra.ShellCompDirectiveNoFileComp
				}
				return a.completeNames(cmd, kinds[len(args)], args)
			}
		}
		for flag, kind := range flagNames[path] {
			_ = c.RegisterFlagCompletionFunc(flag, func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
				return a.completeNames(cmd, kind, args)
			})
		}
		for flag, vals := range flagValues[path] {
			_ = c.RegisterFlagCompletionFunc(flag, fixed(vals))
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
}

func fixed(vals []string) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return vals, cobra.ShellCompDirectiveNoFileComp
	}
}

// completeNames lists the names of kind; args are the positional arguments given so far (the
// first names the target for LUNs and ACLs). Errors complete nothing: a shell has no place to
// show them (cobra logs them with BASH_COMP_DEBUG_FILE).
func (a *app) completeNames(cmd *cobra.Command, kind nameKind, args []string) ([]string, cobra.ShellCompDirective) {
	const none = cobra.ShellCompDirectiveNoFileComp
	if kind == nameRDMALink {
		links, err := a.links.List()
		if err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		names := make([]string, len(links))
		for i, l := range links {
			names[i] = l.Name
		}
		return names, none
	}
	if (kind == nameLUN || kind == nameACL) && len(args) == 0 {
		return nil, none
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), completionTimeout)
	defer cancel()
	c := ctlapi.NewClient(a.socket)
	defer c.Close()
	names, err := listNames(ctx, c, kind, args)
	if err != nil {
		cobra.CompDebugln(fmt.Sprintf("srpctl: completion: %v", err), false)
		return nil, cobra.ShellCompDirectiveError
	}
	return names, none
}

// listNames asks the daemon for the names of kind, each with a description where one helps
// (cobra shows "name<TAB>description" in zsh and fish).
func listNames(ctx context.Context, c *ctlapi.Client, kind nameKind, args []string) ([]string, error) {
	var names []string
	switch kind {
	case nameTarget:
		ts, err := c.ListTargets(ctx)
		if err != nil {
			return nil, err
		}
		for _, t := range ts {
			names = append(names, t.Name+"\t"+t.State)
		}
	case nameLUN:
		ls, err := c.ListLUNs(ctx, args[0])
		if err != nil {
			return nil, err
		}
		for _, l := range ls {
			names = append(names, strconv.Itoa(l.ID)+"\t"+l.Backend)
		}
	case nameACL:
		acls, err := c.ListACLs(ctx, args[0])
		if err != nil {
			return nil, err
		}
		for _, x := range acls {
			names = append(names, x.Initiator.String())
		}
	case nameSession:
		ss, err := c.ListSessions(ctx, ctlapi.SessionFilter{})
		if err != nil {
			return nil, err
		}
		for _, s := range ss {
			names = append(names, s.ID+"\t"+s.Target)
		}
	case nameConnection:
		cs, err := c.ListConnections(ctx)
		if err != nil {
			return nil, err
		}
		for _, x := range cs {
			names = append(names, x.Name+"\t"+x.State)
		}
	}
	return names, nil
}
