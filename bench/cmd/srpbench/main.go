// Command srpbench is the helper program of bench/bench.sh (make bench): the SRP target and the
// SRP initiator with its NBD export as two processes over softroce on UDP loopback (or across
// a veth pair into a network namespace), a memory probe that logs many sessions in to a target
// process and reads its resident size, and a transport benchmark (RDMA WRITE / READ streams
// between two processes beside a TCP stream of the same bytes).
//
//	srpbench target -ready FILE [-addr 127.0.0.1] [-mtu 4096] [-stats-socket PATH] [-lun-size 1G] [-qd 128]
//	    An SRP target with one RAM LUN on a softroce device bound to -addr (ephemeral UDP
//	    port). Once it listens it writes "udp=ADDR:PORT pid=PID" to FILE. With
//	    -stats-socket, every connection to that unix socket gets one JSON line: the process'
//	    VmRSS/VmHWM, Go runtime memory and the target's statistics.
//	srpbench nbd -target ADDR:PORT -socket PATH [-addr LOCAL] [-mtu 4096] [-export disk] [-channels 2] [-qd 64]
//	    An SRP initiator session with the target (RDMA CM over softroce) whose LUN 0 is served
//	    as an NBD export on a unix socket (package initiator/nbd), as srpd would.
//	srpbench mem -target 127.0.0.1:PORT -pid PID -stats-socket PATH [-sessions 64] [-channels 2]
//	    Logs in -sessions sessions of -channels channels at queue depth -qd, fills the LUN, then
//	    runs random I/O and prints the target process' VmRSS (from /proc/PID/status) after the
//	    logins, after N and after 10N I/Os.
//	srpbench rdma-server / tcp-server / rdma: the transport benchmark (rdma.go).
//	srpbench free-port -addr ADDR: a TCP port free on ADDR, below the ephemeral range.
//
// Every mode runs until its work is done or SIGINT/SIGTERM, bounds every wait, starts no
// process and signals none, and uses unix sockets and loopback or private addresses only
// (benchAddr): the network-namespace set-up of bench.sh puts a private /30 on a veth pair.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/initiator"
	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/logging"
	"github.com/srpd/srpd/internal/stack"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/target"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce"
)

const (
	defaultPortID = "53525042454e434853525042454e4348" // "SRPBENCH" twice
	cmPort        = 5555
	closeTimeout  = 10 * time.Second
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: srpbench target|nbd|mem|lat|udp-echo|udp-ping|rdma-server|tcp-server|rdma|free-port [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	switch os.Args[1] {
	case "target":
		err = runTarget(ctx, os.Args[2:])
	case "nbd":
		err = runNBD(ctx, os.Args[2:])
	case "mem":
		err = runMem(ctx, os.Args[2:])
	case "lat":
		err = runLat(ctx, os.Args[2:])
	case "udp-echo":
		err = runUDPEcho(ctx, os.Args[2:])
	case "udp-ping":
		err = runUDPPing(ctx, os.Args[2:])
	case "rdma-server":
		err = runRDMAServer(ctx, os.Args[2:])
	case "tcp-server":
		err = runTCPServer(ctx, os.Args[2:])
	case "rdma":
		err = runRDMAStream(ctx, os.Args[2:])
	case "free-port":
		err = runFreePort(os.Args[2:])
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "srpbench %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// parseSize parses 512, 64k, 16M, 1G (binary units).
func parseSize(s string) (int64, error) {
	mult := int64(1)
	if s == "" {
		return 0, errors.New("empty size")
	}
	switch strings.ToUpper(s[len(s)-1:]) {
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
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("size %q", s)
	}
	return n * mult, nil
}

// startProfile starts a CPU profile into path ("" : none) and returns its stop function.
func startProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, nil
}

// writeHeapProfile writes the heap profile (with allocations since the start) to path.
func writeHeapProfile(path string) {
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	defer f.Close()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
}

// writeReady writes s to path atomically (the script polls for the file).
func writeReady(path, s string) error {
	if path == "" {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(s+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// openDevice opens a softroce transport (internal/stack, as srpd does) on addr with an
// ephemeral UDP port, polling its socket for busyPoll after each empty receive (srpd's default
// is config.DefaultBusyPoll for a target-only transport, off for one that sessions use). mtu is the largest path MTU the device offers when it dials (0:
// softroce's default, 4096); softroce caps the offer by the MTU of the interface holding addr
// as rxe does (iboe_get_mtu: a 9000-byte veth gets 4096, a 1500-byte one 1024), and the
// accepting side takes the REQ's.
func openDevice(ctx context.Context, name string, addr netip.Addr, mtu transport.MTU, maxMR int, busyPoll time.Duration, queues int, log *zap.Logger) (*stack.Transport, netip.AddrPort, error) {
	tr, err := stack.OpenTransport(ctx, config.Transport{Name: name, Driver: config.DriverSoftRoCE, Address: addr.String(), MTU: mtu.Bytes(), Queues: queues},
		stack.TransportOptions{Logger: log, MaxQP: 4096, MaxMR: maxMR, BusyPoll: busyPoll})
	if err != nil {
		return nil, netip.AddrPort{}, err
	}
	return tr, tr.Bound, nil
}

// softroceOf is the softroce device of a transport openDevice opened.
func softroceOf(tr *stack.Transport) *softroce.Device { return tr.Device.(*softroce.Device) }

func closeDevice(dev *stack.Transport) { dev.Close(context.Background()) }

// parseBenchAddr parses an address flag and checks it with benchAddr.
func parseBenchAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, err
	}
	return a, benchAddr(a)
}

// benchAddr accepts the addresses the benchmark may use: loopback, or private (RFC 1918, ULA),
// which bench.sh's network-namespace set-up puts on both ends of a veth pair. Anything else
// would send benchmark traffic out of the host.
func benchAddr(a netip.Addr) error {
	if !a.IsLoopback() && !a.IsPrivate() {
		return fmt.Errorf("%v is neither a loopback nor a private address", a)
	}
	return nil
}

// mtuFlag registers -mtu (a path MTU in bytes; 0: the device default).
func mtuFlag(fs *flag.FlagSet) *int {
	return fs.Int("mtu", 0, "largest RoCE path MTU the softroce device offers when dialling: 256..4096 bytes (0: 4096, capped by the interface's MTU)")
}

// parseMTU maps -mtu's bytes to the enum (0 stays 0: the device default).
func parseMTU(n int) (transport.MTU, error) {
	if n == 0 {
		return 0, nil
	}
	m := transport.MTUFromBytes(n)
	if m == 0 {
		return 0, fmt.Errorf("-mtu %d: want 256, 512, 1024, 2048 or 4096", n)
	}
	return m, nil
}

// ---- target ----

// targetOpts are the flags of the SRP target (mode target, and nbd -local).
type targetOpts struct {
	size    int64
	bs      int
	qd      int
	maxXfer int
	portID  srp.PortID
	file    string // LUN 0 is this file (created with the LUN's size if missing), not RAM
	sizeS   *string
	portS   *string
}

func (o *targetOpts) flags(fs *flag.FlagSet, qdName string) {
	o.sizeS = fs.String("lun-size", "1G", "size of the RAM LUN 0")
	fs.IntVar(&o.bs, "block-size", 512, "logical block size")
	fs.IntVar(&o.qd, qdName, 128, "queue depth granted per channel (target.Limits.QueueDepth)")
	fs.IntVar(&o.maxXfer, "max-transfer", 0, "data buffer per request slot in bytes (0: target default, 1 MiB)")
	fs.StringVar(&o.file, "file", "", "serve this file as LUN 0 (backend file, created with -lun-size if missing) instead of RAM")
}

func (o *targetOpts) parse(portID string) error {
	var err error
	if o.size, err = parseSize(*o.sizeS); err != nil {
		return err
	}
	o.portID, err = srp.ParsePortID(portID)
	return err
}

// serveTarget starts an SRP target with one RAM (or file) LUN (internal/stack, as srpd does), listening
// on dev's RDMA CM at addr. stop closes it.
func serveTarget(dev *stack.Transport, addr netip.Addr, o targetOpts, log *zap.Logger) (tgt *target.Target, stop func() error, err error) {
	cfg := config.Target{
		Name: "srpbench", PortID: config.PortID(o.portID), CMPort: cmPort, Listen: []string{addr.String()},
		LUNs:   []config.LUN{{ID: 0, Backend: config.BackendRAM, Size: config.Size(o.size), BlockSize: o.bs, Serial: "srpbench-0"}},
		ACLs:   []config.ACL{{Initiator: config.AnyInitiator}},
		Limits: config.Limits{QueueDepth: o.qd, MaxChannels: 4},
	}
	if o.file != "" {
		cfg.LUNs[0].Backend, cfg.LUNs[0].Path, cfg.LUNs[0].Create = config.BackendFile, o.file, true
	}
	lun, err := stack.OpenLUN(&cfg, cfg.LUNs[0], stack.LUNOptions{})
	if err != nil {
		return nil, nil, err
	}
	st, err := stack.StartTarget(cfg, dev, map[int]*stack.LUN{0: lun}, stack.TargetOptions{Logger: log.Named("target"), MaxTransfer: o.maxXfer})
	if err != nil {
		_ = lun.Close()
		return nil, nil, err
	}
	stop = func() error {
		cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		st.Stop(cctx, nil) // logs a drain that does not finish in time
		return nil
	}
	return st.Port, stop, nil
}

func runTarget(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("target", flag.ContinueOnError)
	addrS := fs.String("addr", "127.0.0.1", "loopback or private address to bind the RoCEv2 UDP socket on")
	mtuB := mtuFlag(fs)
	ready := fs.String("ready", "", "file to write \"udp=ADDR:PORT pid=PID\" to once listening")
	statsSock := fs.String("stats-socket", "", "unix socket answering each connection with a JSON line of memory figures and statistics")
	var to targetOpts
	to.flags(fs, "qd")
	portID := fs.String("port-id", defaultPortID, "SRP target port identifier (32 hex digits)")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile here until shutdown")
	memprofile := fs.String("memprofile", "", "write a heap profile (allocations since start) here at shutdown")
	verbose := fs.Bool("v", false, "info logs (default: warnings only)")
	queues := fs.Int("queues", 1, "softroce receive queues (config transport queues): channels are spread over them")
	busyPoll := fs.Duration("busy-poll", config.DefaultBusyPoll, "receive busy poll of the softroce UDP socket (link.UDPOptions.BusyPoll; srpd's default for a target-only transport; 0: off)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *memprofile != "" {
		defer writeHeapProfile(*memprofile)
	}
	addr, err := parseBenchAddr(*addrS)
	if err != nil {
		return err
	}
	mtu, err := parseMTU(*mtuB)
	if err != nil {
		return err
	}
	if err := to.parse(*portID); err != nil {
		return err
	}
	log := newLog(*verbose)
	stopProf, err := startProfile(*cpuprofile)
	if err != nil {
		return err
	}
	defer stopProf()

	dev, udp, err := openDevice(ctx, "bench-target", addr, mtu, 0, *busyPoll, *queues, log.Named("softroce"))
	if err != nil {
		return err
	}
	defer closeDevice(dev)
	tgt, stopTarget, err := serveTarget(dev, addr, to, log)
	if err != nil {
		return err
	}
	var sl net.Listener
	var swg sync.WaitGroup
	if *statsSock != "" {
		_ = os.Remove(*statsSock)
		if sl, err = net.Listen("unix", *statsSock); err != nil {
			_ = stopTarget()
			return err
		}
		swg.Add(1)
		go func() {
			defer swg.Done()
			serveStats(sl, tgt)
		}()
	}
	if err := writeReady(*ready, fmt.Sprintf("udp=%v pid=%d", udp, os.Getpid())); err != nil {
		_ = stopTarget()
		return err
	}
	<-ctx.Done()
	if sl != nil {
		_ = sl.Close()
		swg.Wait()
	}
	if sd := dev.SoftRoCE(); sd != nil {
		fmt.Fprintf(os.Stderr, "target device: %+v\n", sd.Stats())
		if qs := sd.QueueStats(); len(qs) > 1 {
			for i, q := range qs {
				fmt.Fprintf(os.Stderr, "target queue %d: rx %d tx %d packets, %d forwarded\n", i, q.RxPackets, q.TxPackets, q.Forwarded)
			}
		}
	}
	return stopTarget()
}

// memStatus is what the stats socket answers.
type memStatus struct {
	PID        int                `json:"pid"`
	VmRSSKiB   int64              `json:"vmrss_kib"`
	VmHWMKiB   int64              `json:"vmhwm_kib"`
	HeapInuse  uint64             `json:"go_heap_inuse"`
	GoSys      uint64             `json:"go_sys"`
	Goroutines int                `json:"goroutines"`
	Target     target.TargetStats `json:"target"`
}

func serveStats(l net.Listener, tgt *target.Target) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		st := memStatus{PID: os.Getpid(), HeapInuse: ms.HeapInuse, GoSys: ms.Sys,
			Goroutines: runtime.NumGoroutine(), Target: tgt.Stats()}
		st.VmRSSKiB, st.VmHWMKiB, _ = procMem(os.Getpid())
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_ = json.NewEncoder(c).Encode(&st)
		_ = c.Close()
	}
}

// procMem reads VmRSS and VmHWM (KiB) from /proc/PID/status.
func procMem(pid int) (rss, hwm int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		switch fields[0] {
		case "VmRSS:":
			rss, _ = strconv.ParseInt(fields[1], 10, 64)
		case "VmHWM:":
			hwm, _ = strconv.ParseInt(fields[1], 10, 64)
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return rss, hwm, sc.Err()
}

func newLog(verbose bool) *zap.Logger {
	if verbose {
		return logging.Console(os.Stderr, false)
	}
	return logging.Console(os.Stderr, false).WithOptions(zap.IncreaseLevel(zap.WarnLevel))
}

// ---- initiator sessions ----

type sessOpts struct {
	target   netip.AddrPort
	portID   srp.PortID
	channels int
	qd       int
	maxIO    int
}

func (o *sessOpts) flags(fs *flag.FlagSet) (targetS, portID *string) {
	targetS = fs.String("target", "", "the target device's RoCEv2 UDP address (ADDR:PORT, from its ready file)")
	portID = fs.String("port-id", defaultPortID, "SRP target port identifier (32 hex digits)")
	fs.IntVar(&o.channels, "channels", 2, "channels per session")
	fs.IntVar(&o.qd, "qd", 64, "queue depth per channel")
	fs.IntVar(&o.maxIO, "max-io", 0, "initiator MaxIOSize (0: default)")
	return targetS, portID
}

func (o *sessOpts) parse(targetS, portID string) error {
	var err error
	if o.target, err = netip.ParseAddrPort(targetS); err != nil {
		return fmt.Errorf("-target %q: %w", targetS, err)
	}
	if err := benchAddr(o.target.Addr()); err != nil {
		return err
	}
	o.portID, err = srp.ParsePortID(portID)
	return err
}

// dial logs a session in to the target whose RoCEv2 socket is o.target (internal/stack, as
// srpd does).
func dial(ctx context.Context, dev *stack.Transport, o *sessOpts, ext uint64, log *zap.Logger) (*initiator.Session, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return stack.Dial(ctx, config.Session{Name: fmt.Sprintf("bench-%d", ext), Address: o.target.Addr().String(), Port: cmPort,
		TargetPortID: config.PortID(o.portID), InitiatorExt: config.ID64(ext), ChCount: o.channels, QueueDepth: o.qd},
		dev, stack.SessionOptions{Logger: log, PeerUDPPort: o.target.Port(), MaxIOSize: o.maxIO})
}

func closeSession(s *initiator.Session) error {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	return s.Close(ctx)
}

// ---- nbd ----

func runNBD(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("nbd", flag.ContinueOnError)
	var o sessOpts
	targetS, portID := o.flags(fs)
	local := fs.Bool("local", false, "run the target in this process, on the same softroce device (as srpd's loopback demo does): no -target")
	addrS := fs.String("addr", "", "address to bind the RoCEv2 UDP socket on (default: with -local 127.0.0.1, otherwise the target's address)")
	mtuB := mtuFlag(fs)
	var to targetOpts
	to.flags(fs, "target-qd")
	sock := fs.String("socket", "", "unix socket of the NBD server")
	export := fs.String("export", "disk", "export name")
	workers := fs.Int("workers", 0, "NBD worker goroutines per connection (0: nbd default)")
	readSpin := fs.Duration("read-spin", 0, "NBD connections' read spin (nbd.Config.ReadSpin; 0: nbd default, negative: off)")
	heapBufs := fs.Bool("heap-buffers", false, "NBD request buffers from the Go heap (copied through the initiator's slot buffers), not the session's device memory (mapped directly)")
	ready := fs.String("ready", "", "file to write \"pid=PID\" to once serving")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile here until shutdown")
	traceFile := fs.String("trace", "", "write a runtime execution trace (go tool trace) here until shutdown")
	verbose := fs.Bool("v", false, "info logs (default: warnings only)")
	queues := fs.Int("queues", 1, "softroce receive queues of the initiator's device (-local: of the one device)")
	busyPoll := fs.Duration("busy-poll", 0, "receive busy poll of the softroce UDP socket when not -local (link.UDPOptions.BusyPoll; srpd's default for a transport that sessions use is off)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *traceFile != "" {
		f, err := os.Create(*traceFile)
		if err != nil {
			return err
		}
		if err := trace.Start(f); err != nil {
			_ = f.Close()
			return err
		}
		defer func() { trace.Stop(); _ = f.Close() }()
	}
	if *sock == "" {
		return errors.New("-socket is required")
	}
	log := newLog(*verbose)
	mtu, err := parseMTU(*mtuB)
	if err != nil {
		return err
	}
	var dev *stack.Transport
	if *local {
		if *addrS == "" {
			*addrS = "127.0.0.1"
		}
		addr, err := parseBenchAddr(*addrS)
		if err != nil {
			return err
		}
		if err := to.parse(*portID); err != nil {
			return err
		}
		o.portID = to.portID
		d, udp, err := openDevice(ctx, "bench-local", addr, mtu, 0, 0, *queues, log.Named("softroce"))
		if err != nil {
			return err
		}
		defer closeDevice(d)
		_, stopTarget, err := serveTarget(d, addr, to, log)
		if err != nil {
			return err
		}
		defer func() {
			if err := stopTarget(); err != nil {
				log.Warn("target", zap.Error(err))
			}
		}()
		dev, o.target = d, udp
	} else {
		if err := o.parse(*targetS, *portID); err != nil {
			return err
		}
		addr := o.target.Addr() // same host: the target's loopback address
		if *addrS != "" {
			if addr, err = parseBenchAddr(*addrS); err != nil {
				return err
			}
		}
		d, _, err := openDevice(ctx, "bench-initiator", addr, mtu, 0, *busyPoll, *queues, log.Named("softroce"))
		if err != nil {
			return err
		}
		defer closeDevice(d)
		dev = d
	}
	stopProf, err := startProfile(*cpuprofile)
	if err != nil {
		return err
	}
	defer stopProf()
	sess, err := dial(ctx, dev, &o, 1, log.Named("initiator"))
	if err != nil {
		return err
	}
	defer func() {
		if err := closeSession(sess); err != nil {
			log.Warn("logout", zap.Error(err))
		}
	}()
	lun := sess.LUN(0)
	if lun == nil {
		return errors.New("no LUN 0")
	}
	x, err := stack.ServeNBD(sess, config.NBDExport{LUN: 0, Socket: *sock}, stack.NBDOptions{Logger: log, Session: "srpbench",
		Names: []string{*export}, Workers: *workers, ReadSpin: *readSpin, HeapBuffers: *heapBufs})
	if err != nil {
		return err
	}
	defer func() { x.Stop(); <-x.Done() }() // a graceful shutdown, bounded by the server's ShutdownTimeout
	if err := writeReady(*ready, fmt.Sprintf("pid=%d", os.Getpid())); err != nil {
		return err
	}
	<-ctx.Done() // until SIGTERM
	return nil
}

// ---- lat ----

// runLat measures the SRP round trip without NBD: one goroutine issues -bs reads (or writes)
// at random block-aligned offsets, one at a time, for -time, and prints the mean, p50 and p99
// latency. It separates the cost of the SRP path (initiator, softroce, target) from the NBD
// front end that `make bench-nbd` includes.
func runLat(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("lat", flag.ContinueOnError)
	var o sessOpts
	targetS, portID := o.flags(fs)
	bsS := fs.String("bs", "4k", "I/O size")
	write := fs.Bool("write", false, "writes instead of reads")
	async := fs.Bool("async", false, "through ReadAtAsync/WriteAtAsync (waiting for each)")
	dur := fs.Duration("time", 5*time.Second, "how long to measure")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile here")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := o.parse(*targetS, *portID); err != nil {
		return err
	}
	bs, err := parseSize(*bsS)
	if err != nil {
		return err
	}
	log := newLog(false)
	dev, _, err := openDevice(ctx, "bench-lat", o.target.Addr(), 0, 0, 0, 1, log.Named("softroce"))
	if err != nil {
		return err
	}
	defer closeDevice(dev)
	sess, err := dial(ctx, dev, &o, 2, log.Named("initiator"))
	if err != nil {
		return err
	}
	defer func() { _ = closeSession(sess) }()
	lun := sess.LUN(0)
	if lun == nil {
		return errors.New("no LUN 0")
	}
	blocks := lun.Size() / bs
	if blocks < 1 {
		return fmt.Errorf("LUN of %d bytes is smaller than -bs %d", lun.Size(), bs)
	}
	stopProf, err := startProfile(*cpuprofile)
	if err != nil {
		return err
	}
	defer stopProf()
	buf := make([]byte, bs)
	errc := make(chan error, 1)
	done := func(err error) { errc <- err }
	rng := rand.New(rand.NewPCG(1, 2))
	lats := make([]time.Duration, 0, 1<<16)
	end := time.Now().Add(*dur)
	for time.Now().Before(end) && ctx.Err() == nil {
		off := rng.Int64N(blocks) * bs
		t0 := time.Now()
		switch {
		case *async && *write:
			lun.WriteAtAsync(ctx, buf, off, false, done)
			err = <-errc
		case *async:
			lun.ReadAtAsync(ctx, buf, off, done)
			err = <-errc
		case *write:
			err = lun.WriteAt(ctx, buf, off, false)
		default:
			err = lun.ReadAt(ctx, buf, off)
		}
		if err != nil {
			return err
		}
		lats = append(lats, time.Since(t0))
	}
	fmt.Fprintf(os.Stderr, "initiator stats: %+v\ninitiator device: %+v\n", sess.Stats(), dev.SoftRoCE().Stats())
	op := "lat read"
	if *write {
		op = "lat write"
	}
	return printLats(op, int(bs), lats)
}

// ---- udp-echo / udp-ping: the raw transport baseline ----

// runUDPEcho answers every datagram on a UDP socket with -reply bytes: with
// udp-ping in another process it measures what one request/response exchange between two Go
// processes costs on this machine without any RDMA or SRP on top (the floor under an SRP
// command's round trip: the SEND of the command and the RDMA WRITE + SEND of the answer).
func runUDPEcho(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("udp-echo", flag.ContinueOnError)
	ready := fs.String("ready", "", "file to write \"udp=ADDR:PORT pid=PID\" to once listening")
	addrS := fs.String("addr", "127.0.0.1", "loopback or private address to listen on")
	reply := fs.Int("reply", 4096+64, "reply size in bytes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	addr, err := parseBenchAddr(*addrS)
	if err != nil {
		return err
	}
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 0)))
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		c.Close()
	}()
	if err := writeReady(*ready, fmt.Sprintf("udp=%s pid=%d", c.LocalAddr(), os.Getpid())); err != nil {
		return err
	}
	buf := make([]byte, max(*reply, 65536))
	for {
		_, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if _, err := c.WriteToUDPAddrPort(buf[:*reply], from); err != nil {
			return err
		}
	}
}

// runUDPPing sends -size bytes to a udp-echo process and waits for its reply, one at a time,
// for -time, and prints the mean, p50 and p99 round trip.
func runUDPPing(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("udp-ping", flag.ContinueOnError)
	targetS := fs.String("target", "", "the udp-echo address (from its ready file)")
	size := fs.Int("size", 64, "request size in bytes")
	dur := fs.Duration("time", 5*time.Second, "how long to measure")
	if err := fs.Parse(args); err != nil {
		return err
	}
	to, err := netip.ParseAddrPort(*targetS)
	if err != nil {
		return fmt.Errorf("-target %q: %w", *targetS, err)
	}
	if err := benchAddr(to.Addr()); err != nil {
		return err
	}
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 65536)
	lats := make([]time.Duration, 0, 1<<16)
	end := time.Now().Add(*dur)
	for time.Now().Before(end) && ctx.Err() == nil {
		t0 := time.Now()
		if _, err := c.Write(buf[:*size]); err != nil {
			return err
		}
		if err := c.SetReadDeadline(time.Now().Add(time.Second)); err != nil {
			return err
		}
		if _, err := c.Read(buf); err != nil {
			return err // a lost datagram on loopback: say so rather than skew the figures
		}
		lats = append(lats, time.Since(t0))
	}
	return printLats("udp-ping", *size, lats)
}

// printLats prints the mean, p50 and p99 of lats as one line.
func printLats(what string, size int, lats []time.Duration) error {
	if len(lats) == 0 {
		return errors.New("nothing completed")
	}
	slices.Sort(lats)
	var sum time.Duration
	for _, l := range lats {
		sum += l
	}
	fmt.Printf("%s bs=%d n=%d mean_us=%.1f p50_us=%.1f p99_us=%.1f\n", what, size, len(lats),
		float64(sum.Nanoseconds())/1e3/float64(len(lats)), float64(lats[len(lats)/2].Nanoseconds())/1e3,
		float64(lats[len(lats)*99/100].Nanoseconds())/1e3)
	return nil
}

// ---- mem ----

func runMem(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("mem", flag.ContinueOnError)
	var o sessOpts
	targetS, portID := o.flags(fs)
	pid := fs.Int("pid", 0, "PID of the target process (VmRSS from /proc/PID/status)")
	statsSock := fs.String("stats-socket", "", "the target's stats socket")
	sessions := fs.Int("sessions", 1, "initiator sessions")
	ios := fs.Int("ios", 20000, "N: I/Os of the first measurement (the second is after 10N)")
	workers := fs.Int("workers", 0, "I/O goroutines per session (0: channels × qd / 2)")
	sizesS := fs.String("sizes", "4k,4k,16k,64k", "I/O sizes drawn at random")
	label := fs.String("label", "", "label of the result lines")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := o.parse(*targetS, *portID); err != nil {
		return err
	}
	if *pid <= 0 {
		return errors.New("-pid is required")
	}
	var sizes []int
	for _, s := range strings.Split(*sizesS, ",") {
		n, err := parseSize(s)
		if err != nil {
			return err
		}
		sizes = append(sizes, int(n))
	}
	if *workers == 0 {
		*workers = max(1, o.channels*o.qd/2)
	}
	maxSize := 0
	for _, s := range sizes {
		maxSize = max(maxSize, s)
	}
	if o.maxIO == 0 {
		o.maxIO = max(128<<10, (maxSize+4095)&^4095)
	}
	log := newLog(false)
	// One device for every session (as one host's RNIC): its MR table must hold every
	// channel's pool.
	dev, _, err := openDevice(ctx, "bench-mem", o.target.Addr(), 0, 1<<20, 0, 1, log.Named("softroce"))
	if err != nil {
		return err
	}
	defer closeDevice(dev)

	report := func(what string, done int64) error {
		rss, hwm, err := procMem(*pid)
		if err != nil {
			return err
		}
		st, err := queryStats(*statsSock)
		if err != nil {
			return err
		}
		ch := max(st.Target.Channels, 1)
		fmt.Printf("%s sessions=%d channels=%d qd=%d phase=%s ios=%d vmrss_kib=%d vmhwm_kib=%d registered_kib=%d registered_per_channel_kib=%d go_heap_inuse_kib=%d goroutines=%d\n",
			*label, st.Target.Sessions, st.Target.Channels, o.qd, what, done, rss, hwm, st.Target.MemoryBytes>>10,
			st.Target.MemoryBytes/ch>>10, st.HeapInuse>>10, st.Goroutines)
		return nil
	}
	if err := report("before-login", 0); err != nil {
		return err
	}
	sess := make([]*initiator.Session, 0, *sessions)
	defer func() {
		var wg sync.WaitGroup
		for _, s := range sess {
			wg.Add(1)
			go func() { defer wg.Done(); _ = closeSession(s) }()
		}
		wg.Wait()
	}()
	for i := 0; i < *sessions; i++ {
		s, err := dial(ctx, dev, &o, uint64(i+1), log.Named("initiator"))
		if err != nil {
			return fmt.Errorf("session %d: %w", i, err)
		}
		sess = append(sess, s)
	}
	luns := make([]*initiator.LUN, len(sess))
	for i, s := range sess {
		if luns[i] = s.LUN(0); luns[i] == nil {
			return fmt.Errorf("session %d: no LUN 0", i)
		}
	}
	size := luns[0].Size()
	bs := int64(luns[0].BlockSize())
	// Fill the LUN once so that its RAM backend is resident before the measurements.
	fill := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(fill)) {
		n := min(int64(len(fill)), size-off)
		if err := luns[0].WriteAt(ctx, fill[:n], off, false); err != nil {
			return fmt.Errorf("fill: %w", err)
		}
	}
	if err := report("after-login+fill", 0); err != nil {
		return err
	}
	var done atomic.Int64
	// runPhase runs I/O from nw goroutines per session, sizes drawn from sz, until done
	// reaches target.
	runPhase := func(target int64, nw int, sz []int) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		errc := make(chan error, 1)
		for si, l := range luns {
			for w := 0; w < nw; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(si), uint64(w)))
					buf := make([]byte, maxSize)
					for done.Add(1) <= target {
						n := int64(sz[rng.IntN(len(sz))])
						off := rng.Int64N((size-n)/bs+1) * bs
						var err error
						if rng.IntN(2) == 0 {
							err = l.ReadAt(ctx, buf[:n], off)
						} else {
							err = l.WriteAt(ctx, buf[:n], off, false)
						}
						if err != nil {
							select {
							case errc <- err:
							default:
							}
							cancel()
							return
						}
					}
				}()
			}
		}
		wg.Wait()
		done.Store(target)
		select {
		case err := <-errc:
			return err
		default:
			return nil
		}
	}
	// The warm-up drives every channel at its full queue depth with the largest size, so that
	// every request slot the workload can reach has been touched as far as the workload goes;
	// then RSS is read after N and after 10N I/Os of the mix.
	n := int64(*ios)
	warm := int64(max(*ios, 4*len(luns)*o.channels*o.qd))
	t0 := time.Now()
	if err := runPhase(warm, o.channels*o.qd, []int{maxSize}); err != nil {
		return err
	}
	el0 := time.Since(t0)
	if err := report("after-warmup", warm); err != nil {
		return err
	}
	done.Store(0)
	t1 := time.Now()
	if err := runPhase(n, *workers, sizes); err != nil {
		return err
	}
	if err := report("after-N", n); err != nil {
		return err
	}
	if err := runPhase(10*n, *workers, sizes); err != nil {
		return err
	}
	el := time.Since(t1)
	if err := report("after-10N", 10*n); err != nil {
		return err
	}
	fmt.Printf("%s warmup_ios=%d io_rate_warmup=%.0f/s io_rate=%.0f/s workers_per_session=%d sizes=%s\n", *label,
		warm, float64(warm)/el0.Seconds(), float64(10*n)/el.Seconds(), *workers, *sizesS)
	return nil
}

func queryStats(path string) (memStatus, error) {
	var st memStatus
	if path == "" {
		return st, nil
	}
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return st, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(io.LimitReader(c, 1<<20))
	if err != nil {
		return st, err
	}
	err = json.Unmarshal(b, &st)
	return st, err
}
