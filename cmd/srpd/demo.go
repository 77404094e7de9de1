package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/stack"
)

// `srpd demo` is a self-checking smoke test that needs no configuration file: an SRP target
// (package target) with a RAM-backed LUN on one softroce device, and an SRP initiator (package
// initiator) on another, both on UDP loopback, built here straight from the packages. The
// initiator logs in over softroce's RDMA CM, discovers the LUN and runs random writes and reads
// from several goroutines (at most 16, one slot each in moved); every byte read back is
// compared with what was written. The daemon itself runs the same arrangement from
// configs/demo-loopback.yaml (`srpd -c`), with NBD exports and the control socket.

type demoConfig struct {
	addr     netip.Addr
	lunSize  int64
	ios      int
	maxIO    int
	channels int
	workers  int
	log      *zap.Logger
}

const demoCMPort = 5555

// demoPortIDHalf is both halves of the demo target's port ID: "SRPD" and 1.
const demoPortIDHalf = 0x5352504400000001

// demoTarget is the demo's target: one RAM LUN for any initiator.
func demoTarget(lunSize int64) config.Target {
	return config.Target{
		Name: "demo", PortID: config.MakePortID(demoPortIDHalf, demoPortIDHalf), CMPort: demoCMPort,
		LUNs: []config.LUN{{ID: 0, Backend: config.BackendRAM, Size: config.Size(lunSize), BlockSize: 512, Serial: "srpd-demo-0"}},
		ACLs: []config.ACL{{Initiator: config.AnyInitiator}},
	}
}

// demoTransport is a softroce transport on addr with an ephemeral UDP port.
func demoTransport(name string, addr netip.Addr) config.Transport {
	return config.Transport{Name: name, Driver: config.DriverSoftRoCE, Address: addr.String()}
}

func runDemo(ctx context.Context, out io.Writer, cfg demoConfig) (err error) {
	const bs = 512
	bg := context.Background()

	// Target side.
	ttr, err := stack.OpenTransport(ctx, demoTransport("demo-target", cfg.addr), stack.TransportOptions{Logger: cfg.log.Named("target")})
	if err != nil {
		return fmt.Errorf("target device: %w", err)
	}
	defer ttr.Close(bg)
	tcfg := demoTarget(cfg.lunSize)
	lun, err := stack.OpenLUN(&tcfg, tcfg.LUNs[0], stack.LUNOptions{})
	if err != nil {
		return err
	}
	tgt, err := stack.StartTarget(tcfg, ttr, map[int]*stack.LUN{0: lun}, stack.TargetOptions{Logger: cfg.log.Named("target")})
	if err != nil {
		_ = lun.Close()
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(bg, 5*time.Second)
		defer cancel()
		tgt.Stop(cctx, nil)
	}()

	// Initiator side. Both devices use ephemeral UDP ports on one address, so the initiator's
	// device is told where the target's RoCEv2 socket is (a softroce extension; the kernel
	// always uses 4791).
	itr, err := stack.OpenTransport(ctx, demoTransport("demo-initiator", cfg.addr), stack.TransportOptions{Logger: cfg.log.Named("initiator")})
	if err != nil {
		return fmt.Errorf("initiator device: %w", err)
	}
	defer itr.Close(bg)
	sess, err := stack.Dial(ctx, config.Session{Name: "demo", Address: ttr.Bound.Addr().String(), Port: demoCMPort,
		TargetPortID: tcfg.PortID, ChCount: cfg.channels}, itr,
		stack.SessionOptions{Logger: cfg.log.Named("initiator"), PeerUDPPort: ttr.Bound.Port()})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(bg, 5*time.Second)
		defer cancel()
		if cerr := sess.Close(cctx); cerr != nil && err == nil {
			err = fmt.Errorf("logout: %w", cerr)
		}
	}()
	l := sess.LUN(0)
	if l == nil {
		return errors.New("the target reports no LUN 0")
	}
	info := l.Info()
	fmt.Fprintf(out, "softroce: initiator %v -> target %v (RDMA CM port %d), %d channel(s)\n", itr.Bound, ttr.Bound, demoCMPort, cfg.channels)
	fmt.Fprintf(out, "LUN 0: %s %s, %d MiB, %d-byte blocks, %s\n", info.Vendor, info.Product, l.Size()>>20, l.BlockSize(), info.IDString())

	// Each worker owns a disjoint slice of the LUN so that its read-back check is exact.
	region := l.Size() / int64(cfg.workers) / bs * bs
	maxIO := min(int64(cfg.maxIO), region)
	var moved [16]int64
	errs := make(chan error, cfg.workers)
	start := time.Now()
	for w := range cfg.workers {
		go func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			buf := make([]byte, maxIO)
			got := make([]byte, maxIO)
			for i := w; i < cfg.ios; i += cfg.workers {
				n := (1 + rng.Int64N(maxIO/bs)) * bs
				off := int64(w)*region + rng.Int64N((region-n)/bs+1)*bs
				for j := range buf[:n] {
					buf[j] = byte(rng.Uint32())
				}
				if err := l.WriteAt(ctx, buf[:n], off, false); err != nil {
					errs <- fmt.Errorf("write %d bytes at %d: %w", n, off, err)
					return
				}
				if err := l.ReadAt(ctx, got[:n], off); err != nil {
					errs <- fmt.Errorf("read %d bytes at %d: %w", n, off, err)
					return
				}
				for j := range got[:n] {
					if got[j] != buf[j] {
						errs <- fmt.Errorf("read back %d bytes at %d: byte %d is %#x, wrote %#x", n, off, j, got[j], buf[j])
						return
					}
				}
				moved[w] += 2 * n
			}
			errs <- nil
		}()
	}
	for range cfg.workers {
		if e := <-errs; e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		return err
	}
	if err := l.Flush(ctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	el := time.Since(start)
	var total int64
	for _, m := range moved {
		total += m
	}
	fmt.Fprintf(out, "%d WRITE+READ pairs from %d workers, 512 B..%d KiB, every byte verified: %.1f MiB in %v (%.0f MiB/s, %.0f commands/s)\n",
		cfg.ios, cfg.workers, maxIO>>10, float64(total)/(1<<20), el.Round(time.Millisecond),
		float64(total)/(1<<20)/el.Seconds(), float64(2*cfg.ios)/el.Seconds())
	st, _, _ := itr.SoftRoCEStats()
	fmt.Fprintf(out, "initiator device: %d packets sent, %d received, %d retransmits\n", st.TxPackets, st.RxPackets, st.Retransmits)
	return nil
}
