package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

// newTargetALUACmd is `srpctl target alua TARGET [--group G --state S [--lun N]]`: show the
// target port groups of the target's LUNs, or change one group's state live.
func newTargetALUACmd(a *app) *cobra.Command {
	var (
		group int
		state string
		lun   int
	)
	cmd := &cobra.Command{
		Use:   "alua TARGET [--group G --state STATE [--lun N]]",
		Short: "Show or change the ALUA target port group states of a target's LUNs",
		Long: "Without --state: the target port groups of each LUN and their asymmetric access states.\n" +
			"With --group and --state: an implicit ALUA transition of that group, live (logged-in\n" +
			"initiators get ASYMMETRIC ACCESS STATE CHANGED); states: " + strings.Join(config.ALUAStates, ", ") + ".\n" +
			"The configuration file is not changed.",
		Args: args(1),
	}
	cmd.Flags().IntVar(&group, "group", -1, "target port group to change")
	cmd.Flags().StringVar(&state, "state", "", "new state of the group")
	cmd.Flags().IntVar(&lun, "lun", -1, "change this LUN only (default: every LUN of the target)")
	cmd.RunE = func(c *cobra.Command, argv []string) error {
		if state == "" && group < 0 {
			return query(a, func(ctx context.Context, cl *ctlapi.Client, argv []string) (ctlapi.ALUAList, error) {
				ls, err := cl.GetALUA(ctx, argv[0])
				return ctlapi.ALUAList{LUNs: nonNil(ls)}, err
			}, a.printALUA)(c, argv)
		}
		if state == "" || group < 0 {
			return &usageError{errors.New("--group and --state go together")}
		}
		ch := ctlapi.ALUAChange{Group: group, State: state}
		if lun >= 0 {
			ch.LUN = &lun
		}
		if err := ch.Validate(); err != nil {
			return &usageError{err}
		}
		return query(a, func(ctx context.Context, cl *ctlapi.Client, argv []string) (ctlapi.ALUAList, error) {
			ls, err := cl.SetALUA(ctx, argv[0], ch)
			return ctlapi.ALUAList{LUNs: nonNil(ls)}, err
		}, a.printALUA)(c, argv)
	}
	return cmd
}

func (a *app) printALUA(l ctlapi.ALUAList) error {
	tw := a.table("LUN", "GROUP", "STATE", "RELATIVE PORTS", "")
	for _, li := range l.LUNs {
		for _, g := range li.Groups {
			ports := make([]string, len(g.RelativePorts))
			for i, p := range g.RelativePorts {
				ports[i] = fmt.Sprint(p)
			}
			where := "peer"
			if g.Local {
				where = "this target"
			}
			row(tw, li.LUN, g.Group, g.State, strings.Join(ports, ","), where)
		}
	}
	return tw.Flush()
}
