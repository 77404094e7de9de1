package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/daemon"
	"github.com/srpd/srpd/internal/logging"
	"github.com/srpd/srpd/internal/sdnotify"
)

// version is set at build time (-ldflags "-X main.version=1.2.3"); empty: the build info's.
var version string

// Exit codes of the daemon.
const (
	exitOK     = 0
	exitFailed = 1 // invalid configuration, or start-up failed
	exitUsage  = 2
)

// startTimeout bounds start-up: transports, targets, and the first login of each session.
const startTimeout = 2 * time.Minute

func daemonUsage(fs *flag.FlagSet, w io.Writer) func() {
	return func() {
		fmt.Fprintln(w, `usage: srpd -c FILE [flags]     run the daemon (see configs/srpd.reference.yaml)
       srpd -c FILE --check       validate FILE (- for standard input) and exit
       srpd demo [flags]          target and initiator over softroce on loopback, verified I/O

flags:`)
		fs.PrintDefaults()
	}
}

// printConfigError prints a Load error: one "file:line: field: message" line per problem.
func printConfigError(w io.Writer, err error) {
	var list config.ErrorList
	if errors.As(err, &list) {
		fmt.Fprintf(w, "srpd: invalid configuration (%d problem(s)):\n", len(list))
		for _, e := range list {
			fmt.Fprintf(w, "  %s\n", e)
		}
		return
	}
	fmt.Fprintf(w, "srpd: %v\n", err)
}

// checkStdin is `srpd --check -c -`: the configuration read from standard input, validated.
func checkStdin(stdin io.Reader, stdout, stderr io.Writer) int {
	data, err := io.ReadAll(io.LimitReader(stdin, config.MaxFileSize+1))
	if err != nil {
		fmt.Fprintf(stderr, "srpd: reading standard input: %v\n", err)
		return exitFailed
	}
	if len(data) > config.MaxFileSize {
		fmt.Fprintf(stderr, "srpd: standard input: larger than %d bytes\n", config.MaxFileSize)
		return exitFailed
	}
	cfg, err := config.Parse("<stdin>", data)
	if err != nil {
		printConfigError(stderr, err)
		return exitFailed
	}
	fmt.Fprintf(stdout, "<stdin>: configuration OK (%d transport(s), %d target(s), %d session(s))\n",
		len(cfg.Transports), len(cfg.Targets), len(cfg.Sessions))
	return exitOK
}

func daemonMain(args []string, stdin io.Reader, stdout, stderr io.Writer, lookup func(string) (string, bool)) int {
	fs := flag.NewFlagSet("srpd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = daemonUsage(fs, stderr)
	cfgPath := fs.String("c", "", "configuration file (YAML), e.g. /etc/srpd/srpd.yaml; - reads standard input (with --check)")
	check := fs.Bool("check", false, "validate the configuration file and exit")
	logFormat := fs.String("log-format", "", "log format: auto (console on a terminal, json otherwise), json or console (default: logging.format of the file)")
	logLevel := fs.String("log-level", "", "log level: debug, info, warn or error (default: logging.level of the file)")
	drain := fs.Duration("drain-timeout", daemon.DefaultDrainTimeout, "bound on the shutdown drain (logouts, I/O in flight)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if *showVersion {
		fmt.Fprintln(stdout, "srpd", versionString())
		return exitOK
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "srpd: unexpected argument %q (did you mean `srpd demo`?)\n", fs.Arg(0))
		fs.Usage()
		return exitUsage
	case *cfgPath == "":
		fmt.Fprintln(stderr, "srpd: -c FILE is required (e.g. srpd -c /etc/srpd/srpd.yaml; configs/ has examples)")
		fs.Usage()
		return exitUsage
	case *drain <= 0:
		fmt.Fprintln(stderr, "srpd: --drain-timeout must be positive")
		return exitUsage
	}
	if *logFormat != "" {
		if _, err := logging.ResolveFormat(*logFormat, stderr); err != nil {
			fmt.Fprintf(stderr, "srpd: --log-format: %v\n", err)
			return exitUsage
		}
	}
	var fixedLevel *zap.AtomicLevel
	if *logLevel != "" {
		l, err := logging.ParseLevel(*logLevel)
		if err != nil {
			fmt.Fprintf(stderr, "srpd: --log-level: %v\n", err)
			return exitUsage
		}
		lv := zap.NewAtomicLevelAt(l)
		fixedLevel = &lv
	}

	if *cfgPath == "-" {
		// Standard input only for --check: a running srpd re-reads its file on reload and
		// writes it on --persist.
		if !*check {
			fmt.Fprintln(stderr, "srpd: -c - (standard input) is for --check only; the daemon needs a file it can reload")
			return exitUsage
		}
		return checkStdin(stdin, stdout, stderr)
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		printConfigError(stderr, err)
		return exitFailed
	}
	if abs, err := filepath.Abs(*cfgPath); err == nil {
		*cfgPath = abs // reloads and --persist must not depend on the working directory
	}
	if *check {
		fmt.Fprintf(stdout, "%s: configuration OK (%d transport(s), %d target(s), %d session(s))\n",
			*cfgPath, len(cfg.Transports), len(cfg.Targets), len(cfg.Sessions))
		return exitOK
	}

	format := cfg.Logging.Format
	if *logFormat != "" {
		format = *logFormat
	}
	level := zap.NewAtomicLevel()
	levelForConfig := &level
	if fixedLevel != nil {
		level, levelForConfig = *fixedLevel, nil
	} else if l, err := logging.ParseLevel(cfg.Logging.Level); err == nil {
		level.SetLevel(l)
	}
	log, err := logging.New(stderr, format, level)
	if err != nil {
		fmt.Fprintf(stderr, "srpd: %v\n", err)
		return exitUsage
	}
	defer func() { _ = log.Sync() }()

	// Signals first: SIGHUP's default action would kill a daemon that is still starting.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	n := sdnotify.FromEnv(lookup)
	notifyErr := func(err error) {
		if err != nil {
			log.Warn("sd_notify", zap.Error(err))
		}
	}
	d := daemon.New(daemon.Options{ConfigPath: *cfgPath, Version: versionString(), Logger: log, Level: levelForConfig,
		Notifier: n, DrainTimeout: *drain})

	notifyErr(n.Status("starting: " + *cfgPath))
	sctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	// Signals during start-up: SIGTERM/SIGINT cut the waits short (then srpd stops), SIGHUP
	// is kept for after READY=1.
	var early []os.Signal
	watchDone := make(chan struct{})
	stopWatch := make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			select {
			case s := <-sigs:
				early = append(early, s)
				if s != syscall.SIGHUP {
					cancel()
				}
			case <-stopWatch:
				return
			}
		}
	}()
	err = d.Start(sctx, cfg)
	close(stopWatch)
	<-watchDone
	cancel()
	stopEarly := false
	for _, s := range early {
		stopEarly = stopEarly || s != syscall.SIGHUP
		select {
		case sigs <- s: // SIGHUP: handled after READY=1
		default:
		}
	}
	if stopEarly {
		log.Info("stop requested during start-up", zap.Error(err))
		if err == nil {
			notifyErr(n.Stopping("stopping (requested during start-up)"))
			d.Shutdown(context.Background())
		}
		return exitOK
	}
	if err != nil {
		log.Error("start-up failed", zap.Error(err))
		notifyErr(n.Status("start-up failed: " + firstLine(err.Error())))
		if errors.Is(err, daemon.ErrSocketInUse) {
			notifyErr(n.Errno(unix.EADDRINUSE))
		}
		// The logger writes to stderr already: printing err again would show it twice.
		return exitFailed
	}
	status := d.StatusLine()
	notifyErr(n.Ready(status))

	wd, err := sdnotify.WatchdogInterval(lookup, os.Getpid())
	if err != nil {
		log.Warn("watchdog", zap.Error(err))
	}
	var wdTick <-chan time.Time
	if wd > 0 && n.Enabled() {
		t := time.NewTicker(wd / 2)
		defer t.Stop()
		wdTick = t.C
		log.Info("systemd watchdog on", zap.Duration("interval", wd))
	}
	statusTick := time.NewTicker(10 * time.Second)
	defer statusTick.Stop()
	for {
		select {
		case s := <-sigs:
			switch s {
			case syscall.SIGHUP:
				log.Info("SIGHUP: reloading", zap.String("config", *cfgPath))
				// A reload may drain a restarted target for a while: keep the watchdog fed
				// meanwhile (the reload itself is bounded).
				stopPings := make(chan struct{})
				if wdTick != nil {
					go func() {
						t := time.NewTicker(wd / 2)
						defer t.Stop()
						for {
							select {
							case <-t.C:
								notifyErr(n.Watchdog())
							case <-stopPings:
								return
							}
						}
					}()
				}
				rctx, cancel := context.WithTimeout(context.Background(), startTimeout)
				_, _ = d.Reload(rctx) // logs and notifies itself
				cancel()
				close(stopPings)
				status = d.StatusLine()
			default:
				log.Info("shutting down", zap.Stringer("signal", s))
				notifyErr(n.Stopping("draining: logging out sessions, finishing I/O in flight"))
				d.Shutdown(context.Background())
				return exitOK
			}
		case <-wdTick:
			// Pinged from the loop that handles signals and reloads: a wedged loop stops the pings.
			notifyErr(n.Watchdog())
		case <-statusTick.C:
			if s := d.StatusLine(); s != status {
				status = s
				notifyErr(n.Status(s))
			}
		}
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func versionString() string {
	if version != "" {
		return version
	}
	return daemon.BuildVersion()
}
