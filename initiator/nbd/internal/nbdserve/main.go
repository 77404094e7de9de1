// Command nbdserve serves RAM-backed exports with package nbd, for benchmarks (bench.sh) and
// for trying NBD clients by hand:
//
//	go run ./initiator/nbd/internal/nbdserve -socket /tmp/x.sock -size 1G -export disk
//
// It runs until SIGINT or SIGTERM, then shuts down gracefully. It is not part of srpd.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"go.uber.org/zap"

	"github.com/srpd/srpd/initiator/nbd"
)

// ram is a RAM Device: a byte slice behind a reader/writer lock.
type ram struct {
	mu   sync.RWMutex
	data []byte
	bs   int
}

func (r *ram) ReadAt(_ context.Context, p []byte, off int64) error {
	r.mu.RLock()
	copy(p, r.data[off:])
	r.mu.RUnlock()
	return nil
}

func (r *ram) WriteAt(_ context.Context, p []byte, off int64, _ bool) error {
	r.mu.Lock()
	copy(r.data[off:], p)
	r.mu.Unlock()
	return nil
}

func (r *ram) Flush(context.Context) error { return nil }

func (r *ram) Discard(ctx context.Context, off, n int64) error {
	return r.WriteZeroes(ctx, off, n, false)
}

func (r *ram) WriteZeroes(_ context.Context, off, n int64, _ bool) error {
	r.mu.Lock()
	clear(r.data[off : off+n])
	r.mu.Unlock()
	return nil
}

func (r *ram) Size() int64      { return int64(len(r.data)) }
func (r *ram) BlockSize() int   { return r.bs }
func (r *ram) ReadOnly() bool   { return false }
func (r *ram) CanDiscard() bool { return true }

// parseSize parses 512, 64k, 16M, 1G (binary units).
func parseSize(s string) (int64, error) {
	mult := int64(1)
	switch u := strings.ToUpper(s[len(s)-1:]); u {
	case "K":
		mult = 1 << 10
	case "M":
		mult = 1 << 20
	case "G":
		mult = 1 << 30
	}
	if mult != 1 {
		s = s[:len(s)-1]
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n * mult, err
}

func main() {
	socket := flag.String("socket", "", "unix socket path to listen on")
	tcp := flag.String("tcp", "", "loopback TCP address to listen on (e.g. 127.0.0.1:10809)")
	sizeStr := flag.String("size", "1G", "export size")
	bs := flag.Int("bs", 512, "logical block size")
	name := flag.String("export", "disk", "export name")
	workers := flag.Int("workers", 0, "worker goroutines per connection (0: default)")
	procs := flag.Int("procs", 0, "GOMAXPROCS (0: leave)")
	verbose := flag.Bool("v", false, "log connections")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile to this file until shutdown")
	flag.Parse()
	if *procs > 0 {
		runtime.GOMAXPROCS(*procs)
	}
	size, err := parseSize(*sizeStr)
	if err != nil || (*socket == "" && *tcp == "") {
		fmt.Fprintln(os.Stderr, "usage: nbdserve -socket PATH|-tcp ADDR [-size 1G] [-bs 512] [-export disk]")
		os.Exit(2)
	}
	log := zap.NewNop()
	if *verbose {
		log, _ = zap.NewDevelopment()
	}
	srv, err := nbd.NewServer(nbd.Config{Logger: log, Workers: *workers})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := srv.AddExport(*name, &ram{data: make([]byte, size), bs: *bs}, nbd.ExportOptions{Description: "nbdserve RAM disk"}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if *socket != "" {
		if _, err := srv.ListenUnix(*socket); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if *tcp != "" {
		if _, err := srv.ListenTCP(*tcp); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if err := srv.Serve(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
