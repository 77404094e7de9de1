package initiator

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/cbatch"
	"github.com/srpd/srpd/internal/testutil"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/scsi/backend"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/target"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce"
	"github.com/srpd/srpd/transport/softroce/link"
)

// realEnv runs the initiator against the srpd target (package target), its logins taken out of
// band through Target.Login, the QPs connected directly (until softroce has a CM).
type realEnv struct {
	t    testing.TB
	ini  *softroce.Device
	luns []*scsi.LUN
	lim  target.Limits
	udp  bool
	// local: the target is on the initiator's device (one process, as srpd's loopback demo):
	// their packets take softroce's loopback path.
	local bool

	mu     sync.Mutex
	tdev   *softroce.Device
	tgt    *target.Target
	tconns []*fakeConn
	down   bool

	dialer *testDialer
}

func newRealEnv(t testing.TB, udp bool, pc link.PipeConfig, lim target.Limits, nLUNs int, lunSize int64) *realEnv {
	e := &realEnv{t: t, lim: lim, udp: udp}
	e.addRAMLUNs(nLUNs, lunSize, "real")
	if udp {
		la, err := link.ListenUDP(context.Background(), netip.MustParseAddrPort("127.0.0.1:0"), link.UDPOptions{})
		if err != nil {
			t.Skipf("UDP loopback unavailable: %v", err)
		}
		e.ini = openDev(t, la, "ini")
	} else {
		a, b := link.NewPipe(netip.MustParseAddr("10.0.1.1"), netip.MustParseAddr("10.0.1.2"), pc)
		e.ini = openDev(t, a, "ini")
		e.tdev = openDev(t, b, "tgt")
	}
	e.dialer = &testDialer{local: e.ini.Addrs()[0], accept: e.accept, timeout: 14}
	e.start()
	t.Cleanup(e.stop)
	return e
}

// addRAMLUNs gives the target n RAM LUNs of size bytes, closed when the test ends.
func (e *realEnv) addRAMLUNs(n int, size int64, serial string) {
	t := e.t
	for i := 0; i < n; i++ {
		ram, err := backend.NewRAM(size, false)
		if err != nil {
			t.Fatal(err)
		}
		l, err := scsi.NewLUN(scsi.LUNConfig{Serial: fmt.Sprintf("%s-lun-%d", serial, i)}, ram)
		if err != nil {
			t.Fatal(err)
		}
		e.luns = append(e.luns, l)
	}
	t.Cleanup(func() {
		for _, l := range e.luns {
			l.Close()
		}
	})
}

// newLocalEnv is newRealEnv with the target on the initiator's device (UDP on 127.0.0.1).
func newLocalEnv(t testing.TB, lim target.Limits, nLUNs int, lunSize int64) *realEnv {
	e := &realEnv{t: t, lim: lim, local: true}
	e.addRAMLUNs(nLUNs, lunSize, "local")
	la, err := link.ListenUDP(context.Background(), netip.MustParseAddrPort("127.0.0.1:0"), link.UDPOptions{})
	if err != nil {
		t.Skipf("SKIPPED: UDP loopback unavailable: %v", err)
	}
	e.ini = openDev(t, la, "local")
	e.tdev = e.ini
	e.dialer = &testDialer{local: e.ini.Addrs()[0], accept: e.accept, timeout: 14}
	e.start()
	t.Cleanup(e.stop)
	return e
}

// start creates the target (and, over UDP, a fresh target device on a new port).
func (e *realEnv) start() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.udp {
		lb, err := link.ListenUDP(context.Background(), netip.MustParseAddrPort("127.0.0.1:0"), link.UDPOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		e.tdev = openDev(e.t, lb, "tgt")
	}
	acl := &target.ACL{Name: "any"}
	for i, l := range e.luns {
		acl.LUNs = append(acl.LUNs, target.LUNMapping{Number: uint16(i), LUN: l})
	}
	tg, err := target.New(target.Config{Name: "real", PortID: testTargetPort, DefaultACL: acl, Limits: e.lim,
		Logger: testLogger(e.t)})
	if err != nil {
		e.t.Fatal(err)
	}
	e.tgt, e.down = tg, false
}

// stop shuts the target down gracefully (SRP_T_LOGOUT and disconnect on every channel).
func (e *realEnv) stop() {
	e.mu.Lock()
	tg := e.tgt
	e.down = true
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tg.Close(ctx); err != nil {
		e.t.Errorf("target close: %v", err)
	}
}

// crash kills the target process (UDP only): its device disappears without a word, then the
// target object is shut down (its channels find their QPs gone).
func (e *realEnv) crash() {
	e.mu.Lock()
	dev, tg := e.tdev, e.tgt
	e.down = true
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = dev.Close(ctx)
	_ = tg.Close(ctx)
}

func (e *realEnv) accept(req acceptReq) (acceptRep, error) {
	e.mu.Lock()
	tg, dev, down := e.tgt, e.tdev, e.down
	e.mu.Unlock()
	var rep acceptRep
	if down {
		return rep, transport.ErrConnUnreachable
	}
	lr, err := target.ParseLoginReq(req.priv)
	if err != nil {
		return rep, rejectErr(srp.RejUnableEstablishChannel, 6, srp.Tag{})
	}
	pc, d, err := tg.Login(dev, lr, target.ConnInfo{Remote: req.addr, InitiatorDepth: req.rdRes, DepthKnown: true})
	if !d.Accepted {
		if err != nil {
			e.t.Logf("target login: %v", err)
		}
		return rep, rejectErr(d.Rej.Reason, d.Rej.BufFmt, d.Rej.Tag)
	}
	tq := pc.QP()
	psn := rand.Uint32N(1 << 24)
	taddr := dev.Addrs()[0]
	if err := bringUp(tq, taddr.Addr(), req.addr, req.qpn, req.psn, psn, 16, max(req.rdRes, 1), 14, 6); err != nil {
		pc.Abort()
		return rep, err
	}
	tconn := &fakeConn{qp: tq, events: make(chan transport.CMEvent, 4), local: taddr, remote: req.addr, peer: req.conn}
	req.conn.peer = tconn
	if _, err := pc.Establish(tconn); err != nil {
		return rep, err
	}
	return acceptRep{addr: taddr, qpn: tq.QPN(), psn: psn, priv: append([]byte(nil), pc.LoginRsp()...)}, nil
}

func (e *realEnv) config() Config { return testConfig(e.t, e.ini, e.dialer, 0x2, testLogger(e.t)) }

func (e *realEnv) dial(cfg Config) *Session { e.t.Helper(); return dialSession(e.t, cfg) }

// TestRealTarget runs the random I/O workload against the srpd target: direct and indirect
// descriptors, two channels, immediate data, in memory and over UDP.
func TestRealTarget(t *testing.T) {
	for _, sc := range []struct {
		name  string
		udp   bool
		local bool // target and initiator on one device: softroce's loopback path
		pipe  link.PipeConfig
		setup func(*Config)
	}{
		{name: "mem"},
		{name: "mem-indirect-2ch", setup: func(c *Config) { c.ChCount, c.MaxPagesPerMR, c.CmdSGEntries = 2, 4, 16 }},
		{name: "udp-2ch", udp: true, setup: func(c *Config) { c.ChCount = 2 }},
		{name: "local-2ch", local: true, setup: func(c *Config) { c.ChCount = 2 }},
	} {
		t.Run(sc.name, func(t *testing.T) {
			var e *realEnv
			if sc.local {
				e = newLocalEnv(t, target.Limits{}, 2, 32<<20)
			} else {
				e = newRealEnv(t, sc.udp, sc.pipe, target.Limits{}, 2, 32<<20)
			}
			cfg := e.config()
			cfg.QueueDepth = 64
			if sc.setup != nil {
				sc.setup(&cfg)
			}
			s := e.dial(cfg)
			if n := len(s.LUNs()); n != 2 {
				t.Fatalf("%d LUNs, want 2", n)
			}
			l := s.LUNs()[1]
			m := newModel(int(l.Size())/l.BlockSize(), l.BlockSize())
			ctx := ctxT(t, 5*time.Minute)
			st := runWorkload(ctx, t, l, m, workloadOpts{ops: scaled(30), qds: []int{1, 16, 64}, maxSize: 1 << 20, mixed: true})
			verifyAll(ctx, t, l, m)
			if sc.local {
				// Every packet between them looped back; none reached the UDP socket.
				ds := e.ini.Stats()
				if ds.LoopPackets == 0 || ds.TxPackets != 0 || ds.RxPackets != 0 || ds.LoopDrops != 0 {
					t.Errorf("device: %d packets looped back, %d dropped, %d sent and %d received on the link; want > 0, 0, 0, 0",
						ds.LoopPackets, ds.LoopDrops, ds.TxPackets, ds.RxPackets)
				}
			}
			ts := e.tgt.Stats()
			t.Logf("%d reads, %d writes, %d other; session %+v; target %+v", st.reads.Load(), st.writes.Load(),
				st.others.Load(), s.Stats(), ts)
		})
	}
}

// TestRealTargetRemoteInvalidate: srpd's remote-invalidation extension between our initiator
// and our target. Granted, every command whose data went through one registration comes back
// as SEND_WITH_INV of its key (the target's count of such responses equals the registrations
// the initiator's pool saw invalidated remotely), and the data stays right; refused by either
// side (the offer not made, or not granted), none does.
func TestRealTargetRemoteInvalidate(t *testing.T) {
	for _, sc := range []struct {
		name      string
		lim       target.Limits
		noOffer   bool
		udp       bool
		indirect  bool
		wantNone  bool
		wantGrant bool
	}{
		{name: "granted", wantGrant: true},
		{name: "granted-udp-indirect", udp: true, indirect: true, wantGrant: true},
		{name: "target-refuses", lim: target.Limits{DisableRemoteInvalidate: true}, wantNone: true},
		{name: "initiator-does-not-offer", noOffer: true, wantNone: true},
	} {
		t.Run(sc.name, func(t *testing.T) {
			e := newRealEnv(t, sc.udp, link.PipeConfig{}, sc.lim, 1, 16<<20)
			cfg := e.config()
			cfg.QueueDepth = 32
			cfg.DisableRemoteInvalidate = sc.noOffer
			if sc.indirect {
				cfg.MaxPagesPerMR, cfg.CmdSGEntries = 4, 16 // larger commands take several MRs
			}
			s := e.dial(cfg)
			l := s.LUNs()[0]
			m := newModel(int(l.Size())/l.BlockSize(), l.BlockSize())
			ctx := ctxT(t, 2*time.Minute)
			runWorkload(ctx, t, l, m, workloadOpts{ops: scaled(20), qds: []int{1, 16}, maxSize: 256 << 10, mixed: true})
			verifyAll(ctx, t, l, m)

			var granted bool
			var tinv uint64
			for _, ss := range e.tgt.Sessions() {
				for _, c := range ss.Channels {
					granted = granted || c.RemoteInvalidate
					tinv += c.RemoteInvs
				}
			}
			iinv := s.Stats().RemoteInvalidations
			t.Logf("granted %v; target sent %d SEND_WITH_INV, initiator saw %d remote invalidations", granted, tinv, iinv)
			if granted != sc.wantGrant {
				t.Errorf("extension granted = %v, want %v", granted, sc.wantGrant)
			}
			if sc.wantNone && (tinv != 0 || iinv != 0) {
				t.Errorf("remote invalidations: target %d, initiator %d; want none", tinv, iinv)
			}
			if sc.wantGrant && (tinv == 0 || tinv != iinv) {
				t.Errorf("remote invalidations: target %d, initiator %d; want equal and > 0", tinv, iinv)
			}
		})
	}
}

// countBatcher counts the completion batches the initiator opens for it and the answers
// delivered inside one.
type countBatcher struct {
	mu                  sync.Mutex
	open, begins, ends  int
	inBatch, outOfBatch int
}

func (b *countBatcher) BeginCompletions() { b.mu.Lock(); b.open++; b.begins++; b.mu.Unlock() }
func (b *countBatcher) EndCompletions()   { b.mu.Lock(); b.open--; b.ends++; b.mu.Unlock() }

func (b *countBatcher) answered() {
	b.mu.Lock()
	if b.open > 0 {
		b.inBatch++
	} else {
		b.outOfBatch++
	}
	b.mu.Unlock()
}

// TestAsyncCompletionBatches: answers to ReadAtAsync/WriteAtAsync whose context carries a
// cbatch.Batcher are delivered between its BeginCompletions and EndCompletions, balanced, one
// bracket per completion run however many of its answers are the Batcher's.
func TestAsyncCompletionBatches(t *testing.T) {
	e := newRealEnv(t, true, link.PipeConfig{}, target.Limits{}, 1, 16<<20)
	cfg := e.config()
	cfg.QueueDepth = 32
	s := e.dial(cfg)
	l := s.LUNs()[0]
	if err := l.ReadAt(ctxT(t, 10*time.Second), make([]byte, 4096), 0); err != nil {
		t.Fatal(err) // the new nexus' unit attention, retried synchronously
	}
	b := &countBatcher{}
	ctx := cbatch.With(ctxT(t, time.Minute), b)
	const rounds, n = 20, 16
	for round := 0; round < rounds; round++ {
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			p := make([]byte, 4096)
			done := func(err error) { b.answered(); errs <- err; wg.Done() }
			if i%2 == 0 {
				l.ReadAtAsync(ctx, p, int64(i)*4096, done)
			} else {
				l.WriteAtAsync(ctx, p, int64(i)*4096, false, done)
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	// The last answer is given inside its batch, whose end comes after: wait for it (bounded)
	// before counting.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		b.mu.Lock()
		if b.open == 0 || time.Now().After(deadline) {
			break
		}
		b.mu.Unlock()
	}
	defer b.mu.Unlock()
	t.Logf("%d answers in %d batches, %d outside one", b.inBatch, b.begins, b.outOfBatch)
	if b.begins != b.ends || b.open != 0 {
		t.Fatalf("begins %d, ends %d, open %d: unbalanced", b.begins, b.ends, b.open)
	}
	if b.inBatch+b.outOfBatch != rounds*n || b.inBatch == 0 || b.begins > b.inBatch {
		t.Fatalf("%d answers in batches (%d batches), %d outside: want all %d answered, some in batches, a batch per run at most",
			b.inBatch, b.begins, b.outOfBatch, rounds*n)
	}
}

// TestLUNPostBatch: the commands a caller posts between LUN.BeginPosts and EndPosts (as the
// NBD export does for the requests of one read) leave the initiator's softroce device together:
// held back, then sent with one link send per bracket, and answered correctly.
func TestLUNPostBatch(t *testing.T) {
	e := newRealEnv(t, true, link.PipeConfig{}, target.Limits{}, 1, 16<<20)
	cfg := e.config()
	cfg.QueueDepth = 32
	s := e.dial(cfg)
	l := s.LUNs()[0]
	ctx := ctxT(t, time.Minute)
	const rounds, n, bs = 10, 16, 4096
	want := make([]byte, n*bs)
	for i := range want {
		want[i] = byte(i*7 + i/bs)
	}
	if err := l.WriteAt(ctx, want, 0, false); err != nil {
		t.Fatal(err) // also takes the new nexus' unit attention
	}
	before := e.ini.Stats()
	got := make([]byte, n*bs)
	for round := 0; round < rounds; round++ {
		clear(got)
		if err := testutil.ReadBracketed(ctx, l, got, bs); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("round %d: data read differs from what was written", round)
		}
	}
	st := e.ini.Stats()
	held, sends := st.HeldPackets-before.HeldPackets, st.HeldSends-before.HeldSends
	t.Logf("%d commands: %d held, in %d sends", rounds*n, held, sends)
	// A post can find its QP with the transmit loop, or the receive loop running handlers:
	// those go unheld (here 112-128 of 160 were held, in 7-8 sends); at least a bracket's worth
	// must be, at most a send or two per bracket.
	if held < n || sends == 0 || sends > 2*rounds {
		t.Fatalf("%d commands in %d brackets: %d held in %d sends; want at least %d held, a send or two per bracket", rounds*n, rounds, held, sends, n)
	}
}
