// Command verbs-srptarget is the SRP target (package target, one RAM LUN 0 for any initiator;
// device, LUN and target built by internal/stack as srpd builds them) on the kernel verbs engine
// (transport/verbs): what interop/srp-verbs runs inside a QEMU guest on
// kernel rxe, with the kernel's ib_srp logging in from the other guest. Build it with
// `-tags verbs` (without the tag it exits at once with "built without -tags verbs").
//
// It prints VERBS-TARGET-READY on stdout once it listens, serves until SIGTERM or SIGINT, then
// closes the target (SRP_T_LOGOUT and a CM DREQ on every channel) and the device, bounded, and
// exits 0 (1 on a failure).
//
//	-dev      $SRPD_VERBS_DEVICE (the first RDMA device)   RDMA device
//	-addr     (the device's first IPv4 RoCEv2 address)     address to listen on
//	-port     $SRP_INTEROP_PORT (5555)                      RDMA CM port
//	-port-id  $SRP_INTEROP_TARGET_PORT_ID (id_ext ‖ ioc_guid, 5352500000000003 each)
//	-lun-mib  64                                           size of the RAM LUN
//	-v                                                     debug logs
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/stack"
	"github.com/srpd/srpd/interop/internal/verbscmd"
)

func main() {
	dev, portIDS := verbscmd.Flags()
	addrS := flag.String("addr", "", "address to listen on (default: the device's first IPv4 RoCEv2 address)")
	port := flag.Uint("port", 5555, "RDMA CM port")
	lunMiB := flag.Int("lun-mib", 64, "RAM LUN size in MiB")
	verbose := flag.Bool("v", false, "debug logs")
	flag.Parse()

	lvl := zapcore.InfoLevel
	if *verbose {
		lvl = zapcore.DebugLevel
	}
	log := verbscmd.Logger(lvl)
	defer func() { _ = log.Sync() }()

	if err := run(*dev, *addrS, uint16(*port), *portIDS, *lunMiB, log); err != nil {
		log.Error("verbs-srptarget", zap.Error(err))
		_ = log.Sync()
		os.Exit(1)
	}
}

func run(devName, addrS string, port uint16, portIDS string, lunMiB int, log *zap.Logger) error {
	portID, err := config.ParsePortID(portIDS)
	if err != nil {
		return fmt.Errorf("-port-id: %w", err)
	}
	tr, devName, err := verbscmd.OpenTransport(context.Background(), devName, log)
	if err != nil {
		return err
	}
	defer tr.Close(context.Background())
	var addr netip.Addr
	if addrS != "" {
		if addr, err = netip.ParseAddr(addrS); err != nil {
			return fmt.Errorf("-addr: %w", err)
		}
	} else {
		for _, a := range tr.Addrs() {
			if a.Is4() {
				addr = a
				break
			}
		}
		if !addr.IsValid() {
			return fmt.Errorf("%s has no IPv4 RoCEv2 address (%v)", devName, tr.Device.Addrs())
		}
	}
	cfg := config.Target{
		Name: "verbs-srptarget", PortID: portID, CMPort: int(port), Listen: []string{addr.String()},
		LUNs: []config.LUN{{ID: 0, Backend: config.BackendRAM, Size: config.Size(lunMiB) << 20, BlockSize: 512,
			Serial: fmt.Sprintf("verbs-%016x", portID.GUID())}},
		ACLs: []config.ACL{{Initiator: config.AnyInitiator}},
	}
	lun, err := stack.OpenLUN(&cfg, cfg.LUNs[0], stack.LUNOptions{})
	if err != nil {
		return err
	}
	tgt, err := stack.StartTarget(cfg, tr, map[int]*stack.LUN{0: lun}, stack.TargetOptions{Logger: log})
	if err != nil {
		_ = lun.Close()
		return err
	}
	a := tr.Device.Attr()
	log.Info("listening", zap.String("dev", devName), zap.Stringer("addr", addr), zap.Uint16("cm_port", port),
		zap.Stringer("target_port_id", portID), zap.Int("lun_mib", lunMiB), zap.Int("max_mr_pages", a.MaxMRPages),
		zap.Int("max_qp_wr", a.MaxQPWR), zap.Stringer("mtu", a.ActiveMTU))
	fmt.Println("VERBS-TARGET-READY")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-ctx.Done()
	log.Info("shutting down")
	cctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	tgt.Stop(cctx, nil)
	log.Info("stopped", zap.Any("target", tgt.Port.Stats())) // a drain past 3 s is logged by Stop
	return nil
}
