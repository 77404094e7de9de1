// Command srpinitiator is an SRP initiator interop check over RoCEv2 (the embedded soft-RoCE
// engine on a UDP socket): it logs in to an SRP target over RDMA CM (the Linux kernel's ib_srpt
// under /work/shared/interop/srp-interop kernel-target, or srptarget), discovers the target's
// logical units, takes LUN 0 and writes random data at several sizes and offsets, flushes, reads
// every range back and compares it byte for byte. For each range it prints on stdout
//
//	SRP_INTEROP_SHA256=<sha256 hex of the bytes written> OFFSET=<byte offset> LEN=<byte count>
//
// so that the interop tool has the target hash the same range of its backing store. Then it
// closes the session (logout) and the device, bounded, and exits 0; on any failure it exits
// non-zero with the reason on stderr.
//
// Every flag takes its default from the environment that srp-interop kernel-target gives its
// command:
//
//	-addr        $SRP_INTEROP_ADDR (0.0.0.0)          address to bind UDP on
//	-roce-port   $SRP_INTEROP_ROCE_PORT (4791)        UDP port (0: ephemeral, for tests)
//	-target      $SRP_INTEROP_TARGET_ADDR             the target's IP address (required)
//	-port        $SRP_INTEROP_PORT (5555)             the target's RDMA CM port
//	-port-id     $SRP_INTEROP_TARGET_PORT_ID          32 hex digits; default id_ext ‖ ioc_guid of
//	             $SRP_INTEROP_ID_EXT / $SRP_INTEROP_IOC_GUID (required one way or the other)
//	-lun-bytes   $SRP_INTEROP_LUN_BYTES (0)           expected LUN size (0: do not check)
//	-timeout     120s                                 bound on the whole run
//	-v                                                debug logs
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
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

	"github.com/srpd/srpd/initiator"
	"github.com/srpd/srpd/internal/logging"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport/softroce"
	"github.com/srpd/srpd/transport/softroce/link"
)

const (
	// closeTimeout bounds Session.Close (logout, DREQ) and devCloseTimeout the device's drain.
	closeTimeout    = 5 * time.Second
	devCloseTimeout = 2 * time.Second
)

type options struct {
	addr     netip.Addr
	rocePort uint16
	target   netip.Addr
	port     uint16
	portID   srp.PortID
	lunBytes int64
	timeout  time.Duration
	verbose  bool
}

// parseArgs parses the command line with defaults from getenv.
func parseArgs(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	env := func(k, def string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return def
	}
	fs := flag.NewFlagSet("srpinitiator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", env("SRP_INTEROP_ADDR", "0.0.0.0"), "address to bind the RoCEv2 UDP socket on ($SRP_INTEROP_ADDR)")
	rocePort := fs.String("roce-port", env("SRP_INTEROP_ROCE_PORT", strconv.Itoa(link.UDPPort)), "RoCEv2 UDP port (0: ephemeral)")
	target := fs.String("target", env("SRP_INTEROP_TARGET_ADDR", ""), "the target's IP address ($SRP_INTEROP_TARGET_ADDR)")
	port := fs.String("port", env("SRP_INTEROP_PORT", strconv.Itoa(initiator.DefaultPort)), "the target's RDMA CM port ($SRP_INTEROP_PORT)")
	defPortID := env("SRP_INTEROP_TARGET_PORT_ID", "")
	if defPortID == "" {
		if x, g := getenv("SRP_INTEROP_ID_EXT"), getenv("SRP_INTEROP_IOC_GUID"); x != "" && g != "" {
			defPortID = x + g
		}
	}
	portID := fs.String("port-id", defPortID, "SRP target port identifier, 32 hex digits: id_ext ‖ ioc_guid ($SRP_INTEROP_TARGET_PORT_ID)")
	lunBytes := fs.String("lun-bytes", env("SRP_INTEROP_LUN_BYTES", "0"), "expected LUN 0 size in bytes, 0: any ($SRP_INTEROP_LUN_BYTES)")
	timeout := fs.Duration("timeout", 120*time.Second, "bound on the whole run")
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
	rp, err := strconv.ParseUint(*rocePort, 10, 16)
	if err != nil {
		return o, fmt.Errorf("-roce-port %q: want 0..65535", *rocePort)
	}
	o.rocePort = uint16(rp)
	if *target == "" {
		return o, errors.New("-target (or $SRP_INTEROP_TARGET_ADDR) is required")
	}
	if o.target, err = netip.ParseAddr(*target); err != nil {
		return o, fmt.Errorf("-target: %w", err)
	}
	o.target = o.target.Unmap()
	p, err := strconv.ParseUint(*port, 10, 16)
	if err != nil || p == 0 {
		return o, fmt.Errorf("-port %q: want 1..65535", *port)
	}
	o.port = uint16(p)
	if *portID == "" {
		return o, errors.New("-port-id (or $SRP_INTEROP_TARGET_PORT_ID) is required")
	}
	if o.portID, err = srp.ParsePortID(*portID); err != nil {
		return o, fmt.Errorf("-port-id %q: %w", *portID, err)
	}
	if o.portID == (srp.PortID{}) {
		return o, errors.New("-port-id: must not be zero")
	}
	if o.lunBytes, err = strconv.ParseInt(*lunBytes, 10, 64); err != nil || o.lunBytes < 0 {
		return o, fmt.Errorf("-lun-bytes %q: want a byte count", *lunBytes)
	}
	if *timeout <= 0 {
		return o, fmt.Errorf("-timeout %v: want > 0", *timeout)
	}
	o.timeout = *timeout
	o.verbose = *verbose
	return o, nil
}

// extent is one write-and-verify range.
type extent struct {
	off, n int64
}

// plan returns the ranges to exercise on a LUN of size bytes with blocks of bs bytes: 4 KiB at
// 0, 64 KiB at 8 KiB, 1 MiB at 4 MiB+12 KiB, 4 KiB at the end and, with 512-byte blocks, one
// 512-byte write at an offset that is not 4 KiB aligned. Ranges that do not fit are left out.
func plan(size int64, bs int) []extent {
	all := []extent{
		{0, 4 << 10},
		{8 << 10, 64 << 10},
		{4<<20 + 12<<10, 1 << 20},
		{size - 4<<10, 4 << 10},
	}
	if bs == 512 {
		all = append(all, extent{2<<20 + 512, 512})
	}
	var out []extent
	for _, e := range all {
		if e.off >= 0 && e.off%int64(bs) == 0 && e.n%int64(bs) == 0 && e.off+e.n <= size {
			out = append(out, e)
		}
	}
	return out
}

// run logs in, exercises LUN 0 and logs out. Hash lines go to stdout.
func run(ctx context.Context, o options, log *zap.Logger, stdout io.Writer) (err error) {
	lnk, err := link.ListenUDP(ctx, netip.AddrPortFrom(o.addr, o.rocePort), link.UDPOptions{})
	if err != nil {
		return fmt.Errorf("binding UDP %v: %w", netip.AddrPortFrom(o.addr, o.rocePort), err)
	}
	dev, err := softroce.Open(softroce.Config{Name: "srpinitiator0", Link: lnk, Logger: log.Named("softroce")})
	if err != nil {
		_ = lnk.Close()
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), devCloseTimeout)
		defer cancel()
		devErr := dev.Close(cctx)
		st := dev.CMStats()
		log.Info("device closed", zap.Uint64("cm_mads_in", st.RxMADs), zap.Uint64("cm_mads_out", st.TxMADs),
			zap.Uint64("cm_malformed", st.RxMalformed), zap.Any("device", dev.Stats()))
		if devErr != nil && !errors.Is(devErr, context.DeadlineExceeded) {
			log.Warn("closing the device", zap.Error(devErr))
		}
	}()
	remote := netip.AddrPortFrom(o.target, o.port)
	log.Info("logging in", zap.Stringer("udp", lnk.LocalAddrPort()), zap.Stringer("target", remote),
		zap.Stringer("target_port_id", o.portID), zap.String("ca_guid", fmt.Sprintf("%#016x", dev.CMConfig().GUID)))
	start := time.Now()
	sess, err := initiator.Dial(ctx, initiator.Config{
		Name:         "srpinitiator",
		Device:       dev,
		Dialer:       &initiator.CMDialer{CM: dev, Remote: remote},
		LoginForm:    initiator.LoginRDMACM,
		TargetPortID: o.portID,
		Logger:       log.Named("initiator"),
	})
	if err != nil {
		return fmt.Errorf("login to %v: %w", remote, err)
	}
	log.Info("session up", zap.Duration("after", time.Since(start).Round(time.Microsecond)),
		zap.Stringer("initiator_port_id", sess.InitiatorPortID()), zap.Int("luns", len(sess.LUNs())))
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
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
	for _, l := range sess.LUNs() {
		i := l.Info()
		log.Info("LUN", zap.Uint64("lun", i.Number), zap.String("vendor", i.Vendor), zap.String("product", i.Product),
			zap.String("revision", i.Revision), zap.String("serial", i.Serial), zap.String("id", i.IDString()),
			zap.Int("block_size", i.BlockSize), zap.Uint64("blocks", i.Blocks), zap.Bool("read_only", i.ReadOnly),
			zap.Uint32("max_transfer_blocks", i.MaxTransfer))
	}
	lun := sess.LUN(0)
	if lun == nil {
		return fmt.Errorf("the target reports no LUN 0 (%d LUNs)", len(sess.LUNs()))
	}
	if o.lunBytes != 0 && lun.Size() != o.lunBytes {
		return fmt.Errorf("LUN 0 has %d bytes, want %d", lun.Size(), o.lunBytes)
	}
	if lun.ReadOnly() {
		return errors.New("LUN 0 is write protected")
	}
	return exercise(ctx, lun, plan(lun.Size(), lun.BlockSize()), log, stdout)
}

// blockDev is what exercise needs of a LUN.
type blockDev interface {
	WriteAt(ctx context.Context, p []byte, off int64, fua bool) error
	ReadAt(ctx context.Context, p []byte, off int64) error
	Flush(ctx context.Context) error
}

// exercise writes random data to every extent, flushes, prints the hash line of each, then reads
// each back and compares it.
func exercise(ctx context.Context, d blockDev, exts []extent, log *zap.Logger, stdout io.Writer) error {
	if len(exts) == 0 {
		return errors.New("LUN 0 is too small for any test range")
	}
	data := make([][]byte, len(exts))
	for i, e := range exts {
		data[i] = make([]byte, e.n)
		if _, err := rand.Read(data[i]); err != nil {
			return err
		}
		t := time.Now()
		if err := d.WriteAt(ctx, data[i], e.off, false); err != nil {
			return fmt.Errorf("write %d bytes at %d: %w", e.n, e.off, err)
		}
		log.Info("wrote", zap.Int64("offset", e.off), zap.Int64("len", e.n), zap.Duration("took", time.Since(t)))
	}
	if err := d.Flush(ctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	// The hash lines go out before the read-back, so that the target's view of what landed is
	// checked even when reading it back fails.
	for i, e := range exts {
		fmt.Fprintf(stdout, "SRP_INTEROP_SHA256=%x OFFSET=%d LEN=%d\n", sha256.Sum256(data[i]), e.off, e.n)
	}
	for i, e := range exts {
		got := make([]byte, e.n)
		t := time.Now()
		if err := d.ReadAt(ctx, got, e.off); err != nil {
			return fmt.Errorf("read %d bytes at %d: %w", e.n, e.off, err)
		}
		log.Info("read", zap.Int64("offset", e.off), zap.Int64("len", e.n), zap.Duration("took", time.Since(t)))
		for j := range got {
			if got[j] != data[i][j] {
				return fmt.Errorf("read back %d bytes at %d: first difference at byte %d (offset %d): got %#02x, wrote %#02x",
					e.n, e.off, j, e.off+int64(j), got[j], data[i][j])
			}
		}
	}
	log.Info("verified", zap.Int("ranges", len(exts)))
	return nil
}

func main() {
	o, err := parseArgs(os.Args[1:], os.Getenv, os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "srpinitiator: %v\n", err)
		os.Exit(2)
	}
	log := logging.Console(os.Stderr, o.verbose)
	defer func() { _ = log.Sync() }()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if err := run(ctx, o, log, os.Stdout); err != nil {
		log.Error("srpinitiator", zap.Error(err))
		_ = log.Sync()
		fmt.Fprintf(os.Stderr, "srpinitiator: FAILED: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "srpinitiator: OK")
}
