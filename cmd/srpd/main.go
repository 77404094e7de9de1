// Command srpd is the srpd daemon: SRP targets and initiator sessions over RoCEv2.
//
//	srpd -c /etc/srpd/srpd.yaml [--log-format auto|json|console] [--log-level LEVEL]
//	srpd -c FILE --check        # validate the file (- for standard input) and exit
//	srpd demo [flags]           # target and initiator in one process over softroce, verified I/O
//
// The daemon (internal/daemon) runs the targets and initiator sessions of its configuration,
// serves the control API for srpctl on a unix socket, speaks systemd's notify protocol
// (READY=1, RELOADING=1, STOPPING=1, WATCHDOG=1, STATUS=), reloads on SIGHUP and drains on
// SIGTERM or SIGINT.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/logging"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "demo" {
		return demoMain(args, stdout, stderr)
	}
	return daemonMain(args, os.Stdin, stdout, stderr, os.LookupEnv)
}

// demoMain runs `srpd demo`: target and initiator in one process, every byte verified.
func demoMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("srpd demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1", "loopback address both softroce devices bind (UDP, ephemeral ports)")
	size := fs.Int64("lun-mib", 64, "size of the RAM-backed LUN in MiB")
	ios := fs.Int("ios", 200, "number of WRITE+READ pairs")
	maxIO := fs.Int("max-io-kib", 1024, "largest I/O in KiB")
	channels := fs.Int("channels", 2, "SRP channels (RC QPs) of the session, 1..16")
	workers := fs.Int("workers", 4, "concurrent I/O workers, 1..16")
	verbose := fs.Bool("v", false, "log the target, initiator and softroce devices to stderr (debug)")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	a, err := netip.ParseAddr(*addr)
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "srpd demo: -addr: %v\n", err)
		return 2
	case !a.IsLoopback():
		fmt.Fprintf(stderr, "srpd demo: -addr %v: the demo runs on loopback only\n", a)
		return 2
	case *channels < 1 || *channels > 16 || *workers < 1 || *workers > 16:
		fmt.Fprintln(stderr, "srpd demo: -channels and -workers must be 1..16")
		return 2
	case *size < 1 || *ios < 1 || *maxIO < 1 || int64(*maxIO) > *size<<10:
		fmt.Fprintln(stderr, "srpd demo: -lun-mib, -ios and -max-io-kib must be positive, and the I/O must fit the LUN")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	log := zap.NewNop()
	if *verbose {
		log = logging.Console(stderr, true)
	}
	err = runDemo(ctx, stdout, demoConfig{addr: a, lunSize: *size << 20, ios: *ios, maxIO: *maxIO << 10,
		channels: *channels, workers: *workers, log: log})
	if err != nil {
		fmt.Fprintf(stderr, "srpd demo: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, "PASS")
	return 0
}
