package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

// The stats commands are iostat-like views (what scstadmin's and SPDK's bdev_get_iostat
// give): srpd keeps cumulative counters (GET /v1/stats), and srpctl prints their rates over an
// interval between two snapshots: IOPS, MiB/s, the mean latency of the commands completed in
// the interval, and the errors in it. --watch repeats, each report covering the time since the
// previous one.
const (
	defaultStatsInterval = time.Second
	minStatsInterval     = 100 * time.Millisecond
	maxStatsInterval     = time.Hour
)

// statsFlags are the flags of both stats commands.
type statsFlags struct {
	interval, watch time.Duration
	count           int
}

func (f *statsFlags) add(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&f.interval, "interval", defaultStatsInterval,
		fmt.Sprintf("measure over this long (%s..%s)", minStatsInterval, maxStatsInterval))
	cmd.Flags().DurationVar(&f.watch, "watch", 0, fmt.Sprintf("report every interval until Ctrl-C (--watch alone: %s; %s..%s)",
		defaultWatchInterval, minWatchInterval, maxWatchInterval))
	cmd.Flags().Lookup("watch").NoOptDefVal = defaultWatchInterval.String()
	cmd.Flags().IntVar(&f.count, "count", 0, "with --watch: stop after this many reports (0: until Ctrl-C)")
}

func (f *statsFlags) check() error {
	switch {
	case f.interval < minStatsInterval || f.interval > maxStatsInterval:
		return usagef("--interval %s: want %s to %s", f.interval, minStatsInterval, maxStatsInterval)
	case f.watch != 0 && (f.watch < minWatchInterval || f.watch > maxWatchInterval):
		return usagef("--watch %s: want %s to %s", f.watch, minWatchInterval, maxWatchInterval)
	case f.count < 0:
		return usagef("--count %d: want 0 or more", f.count)
	case f.count > 0 && f.watch == 0:
		return usagef("--count needs --watch")
	}
	return nil
}

// addStatsCmds gives the lun and session groups under root their stats commands.
func addStatsCmds(a *app, root *cobra.Command) {
	for _, c := range root.Commands() {
		switch c.Name() {
		case "lun":
			c.AddCommand(newLUNStatsCmd(a))
		case "session":
			c.AddCommand(newSessionStatsCmd(a))
		}
	}
}

func newLUNStatsCmd(a *app) *cobra.Command {
	var f statsFlags
	cmd := &cobra.Command{
		Use:   "stats TARGET [LUN]",
		Short: "I/O rates of a target's LUNs over an interval: IOPS, MiB/s, mean latency, errors (iostat-like)",
		Long: `Print the I/O rates of the LUNs of TARGET (or of LUN alone), measured over --interval:
reads, writes and other commands per second, MiB/s read and written, the mean latency
(the SRP_CMD's arrival to its response, in ms) of the reads and writes completed, and the
commands answered with an error (the unit attention of a new login is not one).
With --watch every report covers the time since the previous one.`,
		Args: argsRange(1, 2),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if err := f.check(); err != nil {
				return err
			}
			tgt, lun := argv[0], -1
			if len(argv) == 2 {
				n, err := parseLUN(argv[1])
				if err != nil {
					return err
				}
				lun = n
			}
			return a.runStats(cmd, &f, ctlapi.StatsFilter{Target: tgt}, func(prev, cur *ctlapi.Stats) error {
				rates := lunRates(prev, cur)
				if lun >= 0 {
					var one []lunRate
					for _, r := range rates {
						if r.LUN == lun {
							one = append(one, r)
						}
					}
					if one == nil {
						return fmt.Errorf("LUN %d of target %s: %w", lun, tgt, errNotFound)
					}
					rates = one
				}
				if a.structured() {
					return a.printData(lunStatsReport{Time: cur.Time, IntervalSeconds: interval(prev, cur).Seconds(), LUNs: rates})
				}
				return a.printLUNRates(rates)
			})
		},
	}
	f.add(cmd)
	return cmd
}

func newSessionStatsCmd(a *app) *cobra.Command {
	var f statsFlags
	var target string
	cmd := &cobra.Command{
		Use:   "stats [--target TARGET]",
		Short: "I/O rates of the sessions logged in to our targets over an interval (iostat-like)",
		Long: `Print the I/O rates of the initiators' sessions (all, or those of --target), measured over
--interval: commands per second, MiB/s read and written, the mean latency of the commands
answered (in ms), and the errors. With --watch every report covers the time since the
previous one.`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(); err != nil {
				return err
			}
			return a.runStats(cmd, &f, ctlapi.StatsFilter{Target: target}, func(prev, cur *ctlapi.Stats) error {
				rates := sessionRates(prev, cur)
				if a.structured() {
					return a.printData(sessionStatsReport{Time: cur.Time, IntervalSeconds: interval(prev, cur).Seconds(), Sessions: rates})
				}
				return a.printSessionRates(rates)
			})
		},
	}
	cmd.Flags().StringVar(&target, "target", "", "only the sessions of this target")
	f.add(cmd)
	return cmd
}

// runStats takes a snapshot, then another one --interval later (or every --watch), and reports
// the rates between each and the one before. A failing snapshot ends a single report; with
// --watch it is printed and the watch goes on from the last good one.
func (a *app) runStats(cmd *cobra.Command, f *statsFlags, filter ctlapi.StatsFilter, report func(prev, cur *ctlapi.Stats) error) error {
	ctx := cmd.Context()
	c := ctlapi.NewClient(a.socket)
	defer c.Close()
	get := func() (*ctlapi.Stats, error) {
		cctx, cancel := context.WithTimeout(ctx, a.timeout)
		defer cancel()
		s, err := c.Stats(cctx, filter)
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			return nil, fmt.Errorf("no answer from srpd within %s (--timeout): %w", a.timeout, err)
		}
		return s, err
	}
	prev, err := get()
	if err != nil {
		return err
	}
	every := f.interval
	if f.watch > 0 {
		every = f.watch
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for n := 0; ; {
		select {
		case <-ctx.Done():
			if f.watch > 0 {
				return nil // Ctrl-C ends a watch
			}
			return ctx.Err()
		case <-tick.C:
		}
		cur, err := get()
		switch {
		case err != nil && f.watch > 0 && ctx.Err() != nil:
			return nil // Ctrl-C during the call
		case err != nil && f.watch == 0:
			return err
		case err != nil:
			fmt.Fprintf(a.stdout, "error: %v\n", err)
			continue
		}
		if f.watch > 0 && !a.structured() {
			fmt.Fprintf(a.stdout, "--- %s, every %s (Ctrl-C stops)\n", a.now().Format(time.DateTime), every)
		}
		if err := report(prev, cur); err != nil {
			return err
		}
		prev = cur
		n++
		if f.watch == 0 || (f.count > 0 && n >= f.count) {
			return nil
		}
	}
}

// interval is the time between two snapshots (at least a nanosecond).
func interval(prev, cur *ctlapi.Stats) time.Duration {
	return max(cur.Time.Sub(prev.Time), time.Nanosecond)
}

// delta is the increase of a counter, b after a; a counter that went back started again from
// zero (its LUN was opened again, its session logged in again), so all of b is new.
func delta(a, b uint64) uint64 {
	if b >= a {
		return b - a
	}
	return b
}

// awaitMS is the mean latency in ms of n commands taking ns nanoseconds together; nil for none.
func awaitMS(ns, n uint64) *float64 {
	if n == 0 {
		return nil
	}
	v := float64(ns) / float64(n) / 1e6
	return &v
}

const mib = 1 << 20

// lunRate is one LUN's row of srpctl lun stats (also its -o json).
type lunRate struct {
	Target       string   `json:"target"`
	LUN          int      `json:"lun"`
	ReadIOPS     float64  `json:"read_iops"`
	WriteIOPS    float64  `json:"write_iops"`
	OtherIOPS    float64  `json:"other_iops"`
	ReadMiBps    float64  `json:"read_mib_per_second"`
	WriteMiBps   float64  `json:"write_mib_per_second"`
	ReadAwaitMS  *float64 `json:"read_await_ms"`  // null: no reads in the interval
	WriteAwaitMS *float64 `json:"write_await_ms"` // null: no writes in the interval
	OtherAwaitMS *float64 `json:"other_await_ms"`
	Errors       uint64   `json:"errors"` // in the interval
}

type lunStatsReport struct {
	Time            time.Time `json:"time"`
	IntervalSeconds float64   `json:"interval_seconds"`
	LUNs            []lunRate `json:"luns"`
}

func lunRates(prev, cur *ctlapi.Stats) []lunRate {
	type key struct {
		t string
		l int
	}
	before := map[key]ctlapi.LUNStats{}
	for _, l := range prev.LUNs {
		before[key{l.Target, l.LUN}] = l
	}
	secs := interval(prev, cur).Seconds()
	out := []lunRate{}
	for _, l := range cur.LUNs {
		b := before[key{l.Target, l.LUN}] // zero for a LUN that is new
		r, w, o := delta(b.Commands.Read, l.Commands.Read), delta(b.Commands.Write, l.Commands.Write), delta(b.Commands.Other, l.Commands.Other)
		out = append(out, lunRate{Target: l.Target, LUN: l.LUN,
			ReadIOPS: float64(r) / secs, WriteIOPS: float64(w) / secs, OtherIOPS: float64(o) / secs,
			ReadMiBps:    float64(delta(b.ReadBytes, l.ReadBytes)) / mib / secs,
			WriteMiBps:   float64(delta(b.WriteBytes, l.WriteBytes)) / mib / secs,
			ReadAwaitMS:  awaitMS(delta(b.LatencyNS.Read, l.LatencyNS.Read), r),
			WriteAwaitMS: awaitMS(delta(b.LatencyNS.Write, l.LatencyNS.Write), w),
			OtherAwaitMS: awaitMS(delta(b.LatencyNS.Other, l.LatencyNS.Other), o),
			Errors:       delta(b.Errors, l.Errors),
		})
	}
	return out
}

// sessionRate is one session's row of srpctl session stats (also its -o json).
type sessionRate struct {
	ID         string        `json:"id"`
	Target     string        `json:"target"`
	Initiator  config.PortID `json:"initiator"`
	IOPS       float64       `json:"iops"`
	ReadMiBps  float64       `json:"read_mib_per_second"`
	WriteMiBps float64       `json:"write_mib_per_second"`
	AwaitMS    *float64      `json:"await_ms"` // null: no command answered in the interval
	Errors     uint64        `json:"errors"`
}

type sessionStatsReport struct {
	Time            time.Time     `json:"time"`
	IntervalSeconds float64       `json:"interval_seconds"`
	Sessions        []sessionRate `json:"sessions"`
}

func sessionRates(prev, cur *ctlapi.Stats) []sessionRate {
	before := map[string]ctlapi.SessionStats{}
	for _, s := range prev.Sessions {
		before[s.ID] = s
	}
	secs := interval(prev, cur).Seconds()
	out := []sessionRate{}
	for _, s := range cur.Sessions {
		b := before[s.ID] // zero for a session that logged in since
		out = append(out, sessionRate{ID: s.ID, Target: s.Target, Initiator: s.Initiator,
			IOPS:       float64(delta(b.Commands, s.Commands)) / secs,
			ReadMiBps:  float64(delta(b.ReadBytes, s.ReadBytes)) / mib / secs,
			WriteMiBps: float64(delta(b.WriteBytes, s.WriteBytes)) / mib / secs,
			AwaitMS:    awaitMS(delta(b.LatencyNS, s.LatencyNS), delta(b.Responses, s.Responses)),
			Errors:     delta(b.Errors, s.Errors),
		})
	}
	return out
}

func fmtRate(v float64) string { return fmt.Sprintf("%.1f", v) }

func fmtMiB(v float64) string { return fmt.Sprintf("%.2f", v) }

func fmtAwait(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.3f", *v)
}

func (a *app) printLUNRates(rs []lunRate) error {
	tw := a.table("TARGET", "LUN", "R/S", "W/S", "O/S", "R_MIB/S", "W_MIB/S", "R_AWAIT_MS", "W_AWAIT_MS", "ERRORS")
	for _, r := range rs {
		row(tw, r.Target, r.LUN, fmtRate(r.ReadIOPS), fmtRate(r.WriteIOPS), fmtRate(r.OtherIOPS), fmtMiB(r.ReadMiBps), fmtMiB(r.WriteMiBps),
			fmtAwait(r.ReadAwaitMS), fmtAwait(r.WriteAwaitMS), r.Errors)
	}
	return tw.Flush()
}

func (a *app) printSessionRates(rs []sessionRate) error {
	tw := a.table("SESSION", "TARGET", "INITIATOR", "IOPS", "R_MIB/S", "W_MIB/S", "AWAIT_MS", "ERRORS")
	for _, r := range rs {
		row(tw, r.ID, r.Target, r.Initiator, fmtRate(r.IOPS), fmtMiB(r.ReadMiBps), fmtMiB(r.WriteMiBps), fmtAwait(r.AwaitMS), r.Errors)
	}
	return tw.Flush()
}
