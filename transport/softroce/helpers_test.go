package softroce

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
)

// tb is what the helpers need of a *testing.T (or a *rapid.T).
type tb interface {
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
}

// recvLoop receives from l, n packets at most at a time, until Recv fails (the link is
// closed), and hands each batch received to got.
func recvLoop(l link.Link, n int, got func([]link.Packet)) {
	pk := make([]link.Packet, n)
	for i := range pk {
		pk[i].Buf = make([]byte, link.MaxPacket)
	}
	for {
		for i := range pk {
			pk[i].Buf = pk[i].Buf[:cap(pk[i].Buf)]
		}
		k, err := l.Recv(pk)
		if err != nil {
			return
		}
		got(pk[:k])
	}
}

func helper(t tb) {
	if h, ok := t.(interface{ Helper() }); ok {
		h.Helper()
	}
}

// node is one side of a test connection: a device with a PD, CQs, memory, a regular MR over
// all of it and one RC QP.
type node struct {
	t    tb
	dev  *Device
	pd   transport.PD
	scq  transport.CQ
	rcq  transport.CQ
	qp   transport.QP
	mem  transport.Memory
	mr   transport.MR
	addr netip.AddrPort
	psn  uint32
}

type nodeOpts struct {
	memSize  int
	sqDepth  int
	rqDepth  int
	cqDepth  int
	maxSGE   int
	inline   int
	sigAll   bool
	mrAccess transport.Access
}

func (o *nodeOpts) fill() {
	o.memSize = cmp.Or(o.memSize, 1<<20)
	o.sqDepth = cmp.Or(o.sqDepth, 256)
	o.rqDepth = cmp.Or(o.rqDepth, 256)
	o.cqDepth = cmp.Or(o.cqDepth, 4096)
	o.maxSGE = cmp.Or(o.maxSGE, 4)
	o.mrAccess = cmp.Or(o.mrAccess, transport.AccessLocalWrite|transport.AccessRemoteWrite|transport.AccessRemoteRead)
}

func newNode(t tb, lnk link.Link, o nodeOpts) *node {
	helper(t)
	dev, err := Open(Config{Link: lnk, Name: "t" + lnk.LocalAddr().String()})
	if err != nil {
		t.Fatal(err)
	}
	return newNodeOn(t, dev, o)
}

// newNodeOn is newNode on an existing device (two nodes on one device talk through its
// loopback path).
func newNodeOn(t tb, dev *Device, o nodeOpts) *node {
	helper(t)
	o.fill()
	var err error
	n := &node{t: t, dev: dev, addr: dev.Addrs()[0]}
	if n.pd, err = dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if n.scq, err = dev.CreateCQ(o.cqDepth); err != nil {
		t.Fatal(err)
	}
	if n.rcq, err = dev.CreateCQ(o.cqDepth); err != nil {
		t.Fatal(err)
	}
	if n.mem, err = dev.AllocMemory(o.memSize); err != nil {
		t.Fatal(err)
	}
	if n.mr, err = n.pd.RegMR(n.mem.Addr(), uint64(n.mem.Len()), o.mrAccess); err != nil {
		t.Fatal(err)
	}
	n.qp, err = n.pd.CreateQP(transport.QPInitAttr{
		SendCQ: n.scq, RecvCQ: n.rcq, SQSigAll: o.sigAll,
		Cap: transport.QPCap{MaxSendWR: o.sqDepth, MaxRecvWR: o.rqDepth, MaxSendSGE: o.maxSGE,
			MaxRecvSGE: o.maxSGE, MaxInlineData: o.inline},
	})
	if err != nil {
		t.Fatal(err)
	}
	n.psn = rand.Uint32N(1 << 24)
	return n
}

type connOpts struct {
	mtu         transport.MTU
	timeout     uint8
	retry       uint8
	rnrRetry    uint8
	minRNRTimer uint8
	maxRd       uint8
	access      transport.Access
	noTimeout   bool // local ACK timeout 0: no retransmission
}

func (o *connOpts) fill() {
	o.mtu = cmp.Or(o.mtu, transport.MTU1024)
	if o.timeout == 0 && !o.noTimeout {
		o.timeout = 12 // 16.8 ms
	}
	o.retry = cmp.Or(o.retry, 7)
	o.rnrRetry = cmp.Or(o.rnrRetry, 7)
	o.minRNRTimer = cmp.Or(o.minRNRTimer, 1) // 10 µs
	o.maxRd = cmp.Or(o.maxRd, 16)
	o.access = cmp.Or(o.access, transport.AccessRemoteWrite|transport.AccessRemoteRead)
}

// bringUp moves n's QP to RTS towards peer (address, QPN, PSN exchanged out of band, as
// ibv_rc_pingpong does).
func (n *node) bringUp(peerAddr netip.AddrPort, peerQPN, peerPSN uint32, o connOpts) {
	helper(n.t)
	o.fill()
	must := func(err error) {
		if err != nil {
			n.t.Fatal(err)
		}
	}
	must(n.qp.Modify(&transport.QPAttr{State: transport.QPSInit, Port: 1, AccessFlags: o.access},
		transport.AttrState|transport.AttrPKeyIndex|transport.AttrPort|transport.AttrAccessFlags))
	must(n.qp.Modify(&transport.QPAttr{
		State: transport.QPSRTR, PathMTU: o.mtu, DestQPN: peerQPN, RQPSN: peerPSN,
		MaxDestRdAtomic: o.maxRd, MinRNRTimer: o.minRNRTimer,
		AV: transport.AddressVector{SrcAddr: n.addr.Addr(), DstAddr: peerAddr.Addr(), DstPort: peerAddr.Port()},
	}, transport.AttrState|transport.AttrAV|transport.AttrPathMTU|transport.AttrDestQPN|transport.AttrRQPSN|
		transport.AttrMaxDestRdAtomic|transport.AttrMinRNRTimer))
	must(n.qp.Modify(&transport.QPAttr{
		State: transport.QPSRTS, Timeout: o.timeout, RetryCnt: o.retry, RNRRetry: o.rnrRetry,
		SQPSN: n.psn, MaxRdAtomic: o.maxRd,
	}, transport.AttrState|transport.AttrTimeout|transport.AttrRetryCnt|transport.AttrRNRRetry|
		transport.AttrSQPSN|transport.AttrMaxQPRdAtomic))
}

func connect(a, b *node, o connOpts) {
	a.bringUp(b.addr, b.qp.QPN(), b.psn, o)
	b.bringUp(a.addr, a.qp.QPN(), a.psn, o)
}

func (n *node) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.dev.Close(ctx); err != nil && !errors.Is(err, transport.ErrClosed) {
		n.t.Errorf("close %s: %v", n.dev.Name(), err)
	}
}

// closeNoDrain closes n without waiting for outstanding work (a test whose peer never answers).
func (n *node) closeNoDrain() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := n.dev.Close(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		n.t.Errorf("close %s: %v", n.dev.Name(), err)
	}
}

// sge returns an SGE over n's memory [off, off+length).
func (n *node) sge(off, length int) transport.SGE {
	return transport.SGE{Addr: n.mem.Addr() + uint64(off), Length: uint32(length), LKey: n.mr.LKey()}
}

func (n *node) bytes(off, length int) []byte { return n.mem.Bytes()[off : off+length] }

// waitWC waits for one completion on cq.
func waitWC(t tb, cq transport.CQ, d time.Duration) transport.WC {
	helper(t)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wc [1]transport.WC
	for {
		if cq.Poll(wc[:]) == 1 {
			return wc[0]
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("waiting for a completion: %v", err)
		}
	}
}

// expectNoWC asserts that cq stays empty for d.
func expectNoWC(t tb, cq transport.CQ, d time.Duration) {
	helper(t)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := cq.Wait(ctx); err == nil {
		var wc [1]transport.WC
		cq.Poll(wc[:])
		t.Fatalf("unexpected completion %+v", wc[0])
	}
}

func wantWC(t tb, wc transport.WC, id uint64, st transport.WCStatus, op transport.WCOpcode) {
	helper(t)
	if wc.ID != id || wc.Status != st || wc.Opcode != op {
		t.Fatalf("completion %+v (status %v, opcode %v); want id %#x status %v opcode %v", wc, wc.Status, wc.Opcode, id, st, op)
	}
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}

func equal(t tb, what string, got, want []byte) {
	helper(t)
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: data differs at byte %d of %d", what, i, len(want))
	}
}

// checkNoEngineGoroutines fails if any device goroutine is still running (the fuzz target's
// long-lived device excepted).
func checkNoEngineGoroutines(t tb) {
	helper(t)
	var leaked []string
	for i := 0; i < 200; i++ {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		leaked = leaked[:0]
		for _, g := range strings.Split(string(buf), "\n\n") {
			if !strings.Contains(g, "softroce.(*Device).rxLoop") && !strings.Contains(g, "softroce.(*Device).txLoop") {
				continue
			}
			if fz != nil && strings.Contains(g, fmt.Sprintf("Loop(%p", fz.n.dev)) {
				continue
			}
			leaked = append(leaked, g)
		}
		if len(leaked) == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("engine goroutines still running after Close:\n%s", strings.Join(leaked, "\n\n"))
}

func pipeAddrs() (netip.Addr, netip.Addr) {
	return netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
}

func newPipePair(t tb, cfg link.PipeConfig, o nodeOpts) (*node, *node, *link.MemLink, *link.MemLink) {
	a, b := pipeAddrs()
	la, lb := link.NewPipe(a, b, cfg)
	na := newNode(t, la, o)
	nb := newNode(t, lb, o)
	return na, nb, la, lb
}

func fmtSize(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

func pipeDefault() link.PipeConfig { return link.PipeConfig{} }

// loopback4 is the address the UDP tests and benchmarks listen on when one will do.
var loopback4 = netip.MustParseAddr("127.0.0.1")

// ListenUDPPair opens UDP links on ephemeral ports of a and b (a == b is fine: two ports); it skips t
// where the host cannot listen there. The caller closes them (a device closes its link). Exported for the external
// tests (transporttest_test.go).
func ListenUDPPair(t testing.TB, a, b netip.Addr, lo link.UDPOptions) (*link.UDP, *link.UDP) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	la, err := link.ListenUDP(ctx, netip.AddrPortFrom(a, 0), lo)
	if err != nil {
		t.Skipf("SKIPPED: no UDP link on %v: %v", a, err)
	}
	lb, err := link.ListenUDP(ctx, netip.AddrPortFrom(b, 0), lo)
	if err != nil {
		la.Close()
		t.Skipf("SKIPPED: no UDP link on %v: %v", b, err)
	}
	return la, lb
}

// mustPostSend posts wrs on q and stops t on an error.
func mustPostSend(t tb, q transport.QP, wrs []transport.SendWR) {
	if err := q.PostSend(wrs); err != nil {
		helper(t)
		t.Fatal(err)
	}
}
