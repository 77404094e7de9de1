// Command srpctl controls srpd through its control socket, manages RDMA links through netlink
// and validates configuration files. Run `srpctl --help` for the commands and exit codes.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], newEnv())
	stop()
	os.Exit(code)
}
