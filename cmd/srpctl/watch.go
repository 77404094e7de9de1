package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

// --watch repeats a list command: it polls the control API (srpd has no event stream), so
// the interval is bounded below to keep a forgotten terminal from loading the daemon.
const (
	defaultWatchInterval = 2 * time.Second
	minWatchInterval     = time.Second
	maxWatchInterval     = time.Hour
)

// addWatchToLists gives every list command under root (and connections) a --watch flag.
func addWatchToLists(a *app, root *cobra.Command) {
	for _, c := range root.Commands() {
		if c.Name() == "list" || c.Name() == "connections" {
			addWatch(a, c)
		}
		addWatchToLists(a, c)
	}
}

// addWatch adds --watch[=INTERVAL] to cmd: run it every INTERVAL (default 2s) until Ctrl-C,
// each round under a header line with the time. An error (srpd restarting, say) is printed
// and the watch goes on; a usage error ends it.
func addWatch(a *app, cmd *cobra.Command) {
	var every time.Duration
	cmd.Flags().DurationVar(&every, "watch", 0, fmt.Sprintf("repeat every interval until Ctrl-C (--watch alone: %s; %s..%s)",
		defaultWatchInterval, minWatchInterval, maxWatchInterval))
	cmd.Flags().Lookup("watch").NoOptDefVal = defaultWatchInterval.String()
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, argv []string) error {
		if every == 0 {
			return run(c, argv)
		}
		if every < minWatchInterval || every > maxWatchInterval {
			return usagef("--watch %s: want %s to %s", every, minWatchInterval, maxWatchInterval)
		}
		ctx := c.Context()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if !a.structured() {
				fmt.Fprintf(a.stdout, "--- %s, every %s (Ctrl-C stops)\n", a.now().Format(time.DateTime), every)
			}
			if err := run(c, argv); err != nil {
				if ctx.Err() != nil {
					return nil // Ctrl-C during the call
				}
				var ue *usageError
				if errors.As(err, &ue) {
					return err
				}
				fmt.Fprintf(a.stdout, "error: %v\n", err)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
	}
}
