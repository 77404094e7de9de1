// Command srptarget is a standalone SRP target over RoCEv2 (the embedded soft-RoCE engine on a
// UDP socket), until the srpd daemon serves targets from its configuration. It exports one RAM
// LUN (LUN 0) to any initiator that logs in over RDMA CM and runs until SIGTERM or SIGINT; then
// it closes the target (SRP_T_LOGOUT and a CM DREQ on every channel) and the device, bounded,
// and exits 0.
//
// Every flag takes its default from the environment that /work/shared/interop/srp-interop
// kernel-initiator gives its command:
//
//	-addr        $SRP_INTEROP_ADDR (0.0.0.0)              address to bind UDP on
//	-port        $SRP_INTEROP_PORT (5555)                 RDMA CM port to listen on
//	-roce-port   $SRP_INTEROP_ROCE_PORT (4791)            UDP port (0: ephemeral, for tests)
//	-port-id     $SRP_INTEROP_TARGET_PORT_ID              32 hex digits; default id_ext ‖ ioc_guid of
//	             $SRP_INTEROP_ID_EXT / $SRP_INTEROP_IOC_GUID (5352500000000003 each)
//	-lun-mib     64                                       size of the RAM LUN in MiB
//	-block-size  512                                      logical block size (512 or 4096)
//	-v                                                    debug logs
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/logging"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/scsi/backend"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/target"
	"github.com/srpd/srpd/transport/softroce"
	"github.com/srpd/srpd/transport/softroce/link"
)

const (
	defaultIDExt   = "5352500000000003"
	defaultIOCGUID = "5352500000000003"

	// closeTimeout bounds Target.Close (T_LOGOUT, DREQ, drain) and devCloseTimeout the device's
	// drain: together well inside the 5 s the interop tool gives between SIGTERM and SIGKILL.
	closeTimeout    = 3 * time.Second
	devCloseTimeout = time.Second
)

type options struct {
	addr      netip.Addr
	port      uint16
	rocePort  uint16
	portID    srp.PortID
	lunMiB    int
	blockSize int
	keepalive time.Duration
	verbose   bool
}

// parseArgs parses the command line with defaults from getenv.
func parseArgs(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	env := func(k, def string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return def
	}
	fs := flag.NewFlagSet("srptarget", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", env("SRP_INTEROP_ADDR", "0.0.0.0"), "address to bind the RoCEv2 UDP socket on ($SRP_INTEROP_ADDR)")
	port := fs.String("port", env("SRP_INTEROP_PORT", "5555"), "RDMA CM port to listen on ($SRP_INTEROP_PORT)")
	rocePort := fs.String("roce-port", env("SRP_INTEROP_ROCE_PORT", strconv.Itoa(link.UDPPort)), "RoCEv2 UDP port (0: ephemeral)")
	defPortID := env("SRP_INTEROP_TARGET_PORT_ID", "")
	if defPortID == "" {
		defPortID = env("SRP_INTEROP_ID_EXT", defaultIDExt) + env("SRP_INTEROP_IOC_GUID", defaultIOCGUID)
	}
	portID := fs.String("port-id", defPortID, "SRP target port identifier, 32 hex digits: id_ext ‖ ioc_guid ($SRP_INTEROP_TARGET_PORT_ID)")
	lunMiB := fs.Int("lun-mib", 64, "size of the RAM LUN 0 in MiB")
	blockSize := fs.Int("block-size", 512, "logical block size: 512 or 4096")
	keepalive := fs.Duration("keepalive", 0, "keep-alive interval of idle channels (0: the target's default, 30s; negative: off); scripts/interop.sh uses 200ms so the kernel's rxe acknowledges probes during the run")
	verbose := fs.Bool("v", false, "debug logs")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() != 0 {
		return options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var o options
	var err error
	if o.addr, err = netip.ParseAddr(*addr); err != nil {
		return o, fmt.Errorf("-addr: %w", err)
	}
	o.addr = o.addr.Unmap()
	p, err := strconv.ParseUint(*port, 10, 16)
	if err != nil || p == 0 {
		return o, fmt.Errorf("-port %q: want 1..65535", *port)
	}
	o.port = uint16(p)
	rp, err := strconv.ParseUint(*rocePort, 10, 16)
	if err != nil {
		return o, fmt.Errorf("-roce-port %q: want 0..65535", *rocePort)
	}
	o.rocePort = uint16(rp)
	if o.portID, err = srp.ParsePortID(*portID); err != nil {
		return o, fmt.Errorf("-port-id %q: %w", *portID, err)
	}
	if o.portID == (srp.PortID{}) {
		return o, errors.New("-port-id: must not be zero")
	}
	if *lunMiB < 1 || *lunMiB > 1<<16 {
		return o, fmt.Errorf("-lun-mib %d: want 1..65536", *lunMiB)
	}
	o.lunMiB = *lunMiB
	if *blockSize != 512 && *blockSize != 4096 {
		return o, fmt.Errorf("-block-size %d: want 512 or 4096", *blockSize)
	}
	o.blockSize = *blockSize
	if *keepalive > 0 && *keepalive < 100*time.Millisecond {
		return o, fmt.Errorf("-keepalive %v: at least 100ms (or 0, or negative for off)", *keepalive)
	}
	o.keepalive = *keepalive
	o.verbose = *verbose
	return o, nil
}

// listening is what run reports once the UDP socket is bound and the CM listens.
type listening struct {
	udp netip.AddrPort // the RoCEv2 socket
	dev *softroce.Device
	tgt *target.Target
}

// run serves until ctx ends, then shuts down (bounded). ready, if set, is called once the
// target is listening.
func run(ctx context.Context, o options, log *zap.Logger, ready func(listening)) error {
	be, err := backend.NewRAM(int64(o.lunMiB)<<20, false)
	if err != nil {
		return err
	}
	lun, err := scsi.NewLUN(scsi.LUNConfig{
		BlockSize: o.blockSize,
		Product:   "srptarget RAM",
		Serial:    fmt.Sprintf("srptarget-%x", o.portID[8:]),
	}, be)
	if err != nil {
		return err
	}
	tgt, err := target.New(target.Config{
		Name:       "srptarget",
		PortID:     o.portID,
		DefaultACL: &target.ACL{Name: "any", LUNs: []target.LUNMapping{{Number: 0, LUN: lun}}},
		Limits:     target.Limits{KeepAliveInterval: o.keepalive},
		Logger:     log,
	})
	if err != nil {
		return err
	}

	lnk, err := link.ListenUDP(ctx, netip.AddrPortFrom(o.addr, o.rocePort), link.UDPOptions{})
	if err != nil {
		return fmt.Errorf("binding UDP %v: %w", netip.AddrPortFrom(o.addr, o.rocePort), err)
	}
	dev, err := softroce.Open(softroce.Config{Name: "srptarget0", Link: lnk, Logger: log.Named("softroce")})
	if err != nil {
		_ = lnk.Close()
		return err
	}
	closeDev := func() error {
		cctx, cancel := context.WithTimeout(context.Background(), devCloseTimeout)
		defer cancel()
		return dev.Close(cctx)
	}
	ln, err := dev.Listen(o.addr, o.port)
	if err != nil {
		_ = closeDev()
		return fmt.Errorf("RDMA CM listen on %v port %d: %w", o.addr, o.port, err)
	}
	log.Info("listening",
		zap.Stringer("udp", lnk.LocalAddrPort()),
		zap.Uint16("cm_port", o.port),
		zap.String("service_id", fmt.Sprintf("%#016x", uint64(0x0000000001060000)|uint64(o.port))),
		zap.Stringer("target_port_id", o.portID),
		zap.String("ca_guid", fmt.Sprintf("%#016x", dev.CMConfig().GUID)),
		zap.Int("lun_mib", o.lunMiB), zap.Int("block_size", o.blockSize))
	if ready != nil {
		ready(listening{udp: lnk.LocalAddrPort(), dev: dev, tgt: tgt})
	}

	// Serve is ended by Target.Close, not by ctx, so that the channels still have the device
	// to send their T_LOGOUT and DREQ.
	served := make(chan error, 1)
	go func() { served <- tgt.Serve(context.Background(), ln, dev) }()

	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case serveErr = <-served:
		served = nil
		if serveErr != nil {
			log.Error("serve", zap.Error(serveErr))
		}
	}
	cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	closeErr := tgt.Close(cctx)
	cancel()
	if closeErr != nil {
		log.Warn("closing the target", zap.Error(closeErr))
	}
	if served != nil {
		select {
		case serveErr = <-served:
		case <-time.After(closeTimeout):
			serveErr = errors.New("Serve did not return")
		}
	}
	_ = ln.Close()
	devErr := closeDev()
	st := dev.CMStats()
	log.Info("stopped", zap.Any("target", tgt.Stats()), zap.Uint64("cm_mads_in", st.RxMADs),
		zap.Uint64("cm_mads_out", st.TxMADs), zap.Uint64("cm_malformed", st.RxMalformed),
		zap.Any("device", dev.Stats()))
	if devErr != nil && !errors.Is(devErr, context.DeadlineExceeded) {
		log.Warn("closing the device", zap.Error(devErr))
	}
	return serveErr
}

func main() {
	o, err := parseArgs(os.Args[1:], os.Getenv, os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "srptarget: %v\n", err)
		os.Exit(2)
	}
	log := logging.Console(os.Stderr, o.verbose)
	defer func() { _ = log.Sync() }()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, o, log, nil); err != nil {
		log.Error("srptarget", zap.Error(err))
		_ = log.Sync()
		os.Exit(1)
	}
}
