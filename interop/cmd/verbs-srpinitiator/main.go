// Command verbs-srpinitiator is the SRP initiator (package initiator, its device and session
// built by internal/stack as srpd builds them) on the kernel verbs engine (transport/verbs):
// what interop/srp-verbs runs inside a QEMU guest on kernel rxe to log in to an SRP target
// elsewhere on the bridge (srpd with softroce on the host side, scripts/interop-srpd.sh). Its data
// buffers are registered through frpool's fast-reg MRs, which the verbs engine carries as type-2
// memory windows. Build it with `-tags verbs`.
//
// It logs in, takes LUN 0, writes random data at several sizes and offsets, flushes, prints
//
//	SRP_INTEROP_SHA256=<sha256 hex> OFFSET=<byte offset> LEN=<byte count>
//
// for each range, reads every range back and compares it, logs out and exits 0 (1 on a failure).
//
//	-dev      $SRPD_VERBS_DEVICE (the first RDMA device)
//	-target   the target's IP address (required)
//	-port     5555                                        the target's RDMA CM port
//	-port-id  $SRP_INTEROP_TARGET_PORT_ID (id_ext ‖ ioc_guid, 5352500000000003 each)
//	-lun-bytes 0                                          expected LUN 0 size (0: any)
//	-timeout  180s
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/stack"
	"github.com/srpd/srpd/interop/internal/verbscmd"
	"github.com/srpd/srpd/srp"
)

func main() {
	dev, portIDS := verbscmd.Flags()
	target := flag.String("target", "", "the target's IP address")
	port := flag.Uint("port", 5555, "the target's RDMA CM port")
	lunBytes := flag.Int64("lun-bytes", 0, "expected LUN 0 size in bytes (0: any)")
	timeout := flag.Duration("timeout", 180*time.Second, "bound on the whole run")
	flag.Parse()
	log := verbscmd.Logger(zap.InfoLevel)
	defer func() { _ = log.Sync() }()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if err := run(ctx, *dev, *target, uint16(*port), *portIDS, *lunBytes, log); err != nil {
		log.Error("verbs-srpinitiator", zap.Error(err))
		_ = log.Sync()
		fmt.Fprintf(os.Stderr, "verbs-srpinitiator: FAILED: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "verbs-srpinitiator: OK")
}

func run(ctx context.Context, devName, targetS string, port uint16, portIDS string, lunBytes int64, log *zap.Logger) (err error) {
	tip, err := netip.ParseAddr(targetS)
	if err != nil {
		return fmt.Errorf("-target: %w", err)
	}
	portID, err := srp.ParsePortID(portIDS)
	if err != nil {
		return fmt.Errorf("-port-id: %w", err)
	}
	tr, devName, err := verbscmd.OpenTransport(ctx, devName, log)
	if err != nil {
		return err
	}
	defer tr.Close(context.Background())
	remote := netip.AddrPortFrom(tip, port)
	log.Info("logging in", zap.String("dev", devName), zap.Stringer("target", remote), zap.Stringer("target_port_id", portID),
		zap.Int("max_mr_pages", tr.Device.Attr().MaxMRPages))
	start := time.Now()
	sess, err := stack.Dial(ctx, config.Session{Name: "verbs-srpinitiator", Address: tip.String(), Port: int(port),
		TargetPortID: config.PortID(portID)}, tr, stack.SessionOptions{Logger: log.Named("initiator")})
	if err != nil {
		return err
	}
	log.Info("session up", zap.Duration("after", time.Since(start).Round(time.Microsecond)), zap.Int("luns", len(sess.LUNs())))
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if cerr := sess.Close(cctx); cerr != nil {
			log.Warn("logout", zap.Error(cerr))
			if err == nil {
				err = fmt.Errorf("logout: %w", cerr)
			}
		} else {
			log.Info("logged out", zap.Any("stats", sess.Stats()))
		}
	}()
	lun := sess.LUN(0)
	if lun == nil {
		return fmt.Errorf("the target reports no LUN 0 (%d LUNs)", len(sess.LUNs()))
	}
	if lunBytes != 0 && lun.Size() != lunBytes {
		return fmt.Errorf("LUN 0 has %d bytes, want %d", lun.Size(), lunBytes)
	}
	size, bs := lun.Size(), int64(lun.BlockSize())
	type extent struct{ off, n int64 }
	var exts []extent
	for _, e := range []extent{{0, 4 << 10}, {8 << 10, 64 << 10}, {1<<20 + 4<<10, 64 << 10}, {4<<20 + 12<<10, 1 << 20}, {size - 4<<10, 4 << 10}} {
		if e.off >= 0 && e.off%bs == 0 && e.n%bs == 0 && e.off+e.n <= size {
			exts = append(exts, e)
		}
	}
	for pass := 1; pass <= 2; pass++ {
		data := make([][]byte, len(exts))
		t0 := time.Now()
		var moved int64
		for i, e := range exts {
			data[i] = make([]byte, e.n)
			if _, err := rand.Read(data[i]); err != nil {
				return err
			}
			if err := lun.WriteAt(ctx, data[i], e.off, false); err != nil {
				return fmt.Errorf("pass %d: write %d bytes at %d: %w", pass, e.n, e.off, err)
			}
			moved += e.n
		}
		if err := lun.Flush(ctx); err != nil {
			return fmt.Errorf("pass %d: flush: %w", pass, err)
		}
		for i, e := range exts {
			fmt.Printf("SRP_INTEROP_SHA256=%x OFFSET=%d LEN=%d\n", sha256.Sum256(data[i]), e.off, e.n)
		}
		for i, e := range exts {
			got := make([]byte, e.n)
			if err := lun.ReadAt(ctx, got, e.off); err != nil {
				return fmt.Errorf("pass %d: read %d bytes at %d: %w", pass, e.n, e.off, err)
			}
			moved += e.n
			if sha256.Sum256(got) != sha256.Sum256(data[i]) {
				return fmt.Errorf("pass %d: read back %d bytes at %d: data differs", pass, e.n, e.off)
			}
		}
		el := time.Since(t0)
		log.Info("pass verified", zap.Int("pass", pass), zap.Int("ranges", len(exts)), zap.Int64("bytes", moved),
			zap.Duration("took", el), zap.Float64("MB_per_s", float64(moved)/el.Seconds()/1e6))
	}
	return nil
}
