// Package transporttest is an engine-independent conformance suite for the transport API: any
// engine (transport/softroce, transport/verbs) runs the same checks through Run with a factory
// that opens two endpoints able to reach each other.
//
// The suite uses only the transport API and the subset of verbs behaviour every engine must
// share: RC SEND/RECV (with immediate data, multiple SGEs, inline), RDMA WRITE/READ across path
// MTUs, WRITE_WITH_IMM, unsignaled WRs retired by a later signaled one, the remote access error
// (NAK) with the QP going to ERR and the rest of the send queue flushed, a receive-length error,
// flushes on Modify(ERR) and posts in ERR, ERR→RESET→INIT, post-time validation, fast
// registration in its portable form (VA-contiguous pages, IOVA = the device address of the first
// byte; engines that cannot register say ErrNotSupported and the subtest skips loudly), and
// connection management (private data on REQ/REP, Reject with private data, a REQ to a port
// nobody listens on, Disconnect) when the device implements transport.ConnManager.
//
// Flushed completions are checked for ID and status only (their opcode is undefined in verbs).
package transporttest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
)

// Endpoint is one side of a conformance pair.
type Endpoint struct {
	// Dev is the device. Both endpoints may share one device (loopback on a kernel rxe device):
	// the suite creates its own PDs, CQs and QPs per endpoint and never closes Dev.
	Dev transport.Device
	// Addr is the IP address the peer puts in AddressVector.DstAddr and dials for CM; it must be
	// one of Dev's addresses (the AV's SrcAddr on this side).
	Addr netip.Addr
	// Port is the UDP port the peer puts in AddressVector.DstPort (0 means 4791).
	Port uint16
}

// Pair is what a Factory returns. The factory registers (t.Cleanup) whatever closes the devices.
type Pair struct {
	A, B Endpoint
	// Lossy marks a link that drops, duplicates or reorders packets: waits are longer.
	Lossy bool
}

// Factory opens two endpoints that can reach each other. It calls t.Skip when the engine has no
// device here (say why: the suite must skip loudly, never pass silently).
type Factory func(t *testing.T) Pair

// Config tunes Run; the zero value is the default.
type Config struct {
	// MTUs are the path MTUs of the data subtests (default: 1024 only; softroce runs all five).
	MTUs []transport.MTU
	// Wait bounds every wait for a completion or CM event (default 30 s).
	Wait time.Duration
	// LocalACKTimeout is the QP Timeout attribute (default 14: 67 ms).
	LocalACKTimeout uint8
	// BigXfer is the largest RDMA transfer (default 1 MiB).
	BigXfer int
	// CMPort is the RDMA CM port of the CM subtests (default 18515).
	CMPort uint16
}

func (c *Config) fill() {
	if len(c.MTUs) == 0 {
		c.MTUs = []transport.MTU{transport.MTU1024}
	}
	c.Wait = cmp.Or(c.Wait, 30*time.Second)
	c.LocalACKTimeout = cmp.Or(c.LocalACKTimeout, 14)
	c.BigXfer = cmp.Or(c.BigXfer, 1<<20)
	c.CMPort = cmp.Or(c.CMPort, 18515)
}

// Run runs the suite with the default configuration.
func Run(t *testing.T, f Factory) { RunConfig(t, f, Config{}) }

// RunConfig runs the suite.
func RunConfig(t *testing.T, f Factory, cfg Config) {
	cfg.fill()
	s := &suite{f: f, cfg: cfg}
	t.Run("DeviceAttr", s.testDeviceAttr)
	t.Run("MemoryAndMR", s.testMemoryAndMR)
	t.Run("PostValidation", s.testPostValidation)
	t.Run("SendRecv", s.testSendRecv)
	t.Run("SendInline", s.testSendInline)
	t.Run("WriteRead", s.testWriteRead)
	t.Run("WriteWithImm", s.testWriteWithImm)
	t.Run("Unsignaled", s.testUnsignaled)
	t.Run("RemoteAccessError", s.testRemoteAccessError)
	t.Run("RecvLengthError", s.testRecvLengthError)
	t.Run("FlushOnError", s.testFlushOnError)
	t.Run("FastReg", s.testFastReg)
	t.Run("CMConnect", s.testCMConnect)
	t.Run("CMReject", s.testCMReject)
	t.Run("CMNoListener", s.testCMNoListener)
}

type suite struct {
	f   Factory
	cfg Config
}

// side is one endpoint's resources: a PD, send and receive CQs, memory with a regular MR over
// all of it and one RC QP.
type side struct {
	t   *testing.T
	ep  Endpoint
	pd  transport.PD
	scq transport.CQ
	rcq transport.CQ
	mem transport.Memory
	mr  transport.MR
	qp  transport.QP
	psn uint32
}

type sideOpts struct {
	memSize  int
	depth    int
	maxSGE   int
	inline   int
	mrAccess transport.Access
}

func (o *sideOpts) fill() {
	o.memSize = cmp.Or(o.memSize, 1<<20)
	o.depth = cmp.Or(o.depth, 64)
	o.maxSGE = cmp.Or(o.maxSGE, 2)
	o.mrAccess = cmp.Or(o.mrAccess, transport.AccessLocalWrite|transport.AccessRemoteWrite|transport.AccessRemoteRead)
}

func newSide(t *testing.T, ep Endpoint, o sideOpts) *side {
	t.Helper()
	o.fill()
	s := &side{t: t, ep: ep, psn: rand.Uint32N(1 << 24)}
	var err error
	if s.pd, err = ep.Dev.AllocPD(); err != nil {
		t.Fatalf("AllocPD: %v", err)
	}
	t.Cleanup(func() { closeLogged(t, "PD", s.pd.Close) })
	if s.scq, err = ep.Dev.CreateCQ(4 * o.depth); err != nil {
		t.Fatalf("CreateCQ: %v", err)
	}
	t.Cleanup(func() { closeLogged(t, "send CQ", s.scq.Close) })
	if s.rcq, err = ep.Dev.CreateCQ(4 * o.depth); err != nil {
		t.Fatalf("CreateCQ: %v", err)
	}
	t.Cleanup(func() { closeLogged(t, "recv CQ", s.rcq.Close) })
	if s.mem, err = ep.Dev.AllocMemory(o.memSize); err != nil {
		t.Fatalf("AllocMemory(%d): %v", o.memSize, err)
	}
	t.Cleanup(func() { closeLogged(t, "memory", s.mem.Free) })
	if s.mr, err = s.pd.RegMR(s.mem.Addr(), uint64(s.mem.Len()), o.mrAccess); err != nil {
		t.Fatalf("RegMR: %v", err)
	}
	t.Cleanup(func() { closeLogged(t, "MR", s.mr.Close) })
	s.qp = s.newQP(t, o)
	return s
}

func (s *side) newQP(t *testing.T, o sideOpts) transport.QP {
	t.Helper()
	o.fill()
	qp, err := s.pd.CreateQP(transport.QPInitAttr{
		Type: transport.QPTypeRC, SendCQ: s.scq, RecvCQ: s.rcq,
		Cap: transport.QPCap{MaxSendWR: o.depth, MaxRecvWR: o.depth, MaxSendSGE: o.maxSGE,
			MaxRecvSGE: o.maxSGE, MaxInlineData: o.inline},
	})
	if err != nil {
		t.Fatalf("CreateQP: %v", err)
	}
	t.Cleanup(func() { closeLogged(t, "QP", qp.Close) })
	return qp
}

// closeLogged runs a cleanup close and reports errors other than ErrClosed (the device may have
// been closed first by an engine-specific test).
func closeLogged(t *testing.T, what string, f func() error) {
	if err := f(); err != nil && !errors.Is(err, transport.ErrClosed) {
		t.Errorf("close %s: %v", what, err)
	}
}

func (s *side) sge(off, n int) transport.SGE {
	return transport.SGE{Addr: s.mem.Addr() + uint64(off), Length: uint32(n), LKey: s.mr.LKey()}
}

func (s *side) bytes(off, n int) []byte { return s.mem.Bytes()[off : off+n] }

type connOpts struct {
	mtu     transport.MTU
	timeout uint8
	access  transport.Access
}

// bringUp moves qp to RTS towards peer's qp (address, QPN and PSN exchanged out of band).
func (s *side) bringUp(t *testing.T, qp transport.QP, myPSN uint32, peer Endpoint, peerQPN, peerPSN uint32, o connOpts) {
	t.Helper()
	o.access = cmp.Or(o.access, transport.AccessRemoteWrite|transport.AccessRemoteRead)
	if err := qp.Modify(&transport.QPAttr{State: transport.QPSInit, Port: 1, AccessFlags: o.access},
		transport.AttrState|transport.AttrPKeyIndex|transport.AttrPort|transport.AttrAccessFlags); err != nil {
		t.Fatalf("RESET->INIT: %v", err)
	}
	if err := qp.Modify(&transport.QPAttr{
		State: transport.QPSRTR, PathMTU: o.mtu, DestQPN: peerQPN, RQPSN: peerPSN,
		MaxDestRdAtomic: 4, MinRNRTimer: 1,
		AV: transport.AddressVector{SrcAddr: s.ep.Addr, DstAddr: peer.Addr, DstPort: peer.Port},
	}, transport.AttrState|transport.AttrAV|transport.AttrPathMTU|transport.AttrDestQPN|transport.AttrRQPSN|
		transport.AttrMaxDestRdAtomic|transport.AttrMinRNRTimer); err != nil {
		t.Fatalf("INIT->RTR: %v", err)
	}
	if err := qp.Modify(&transport.QPAttr{
		State: transport.QPSRTS, Timeout: o.timeout, RetryCnt: 7, RNRRetry: 7, SQPSN: myPSN, MaxRdAtomic: 4,
	}, transport.AttrState|transport.AttrTimeout|transport.AttrRetryCnt|transport.AttrRNRRetry|
		transport.AttrSQPSN|transport.AttrMaxQPRdAtomic); err != nil {
		t.Fatalf("RTR->RTS: %v", err)
	}
}

// pair opens two endpoints and their resources and connects their QPs (without the CM).
func (s *suite) pair(t *testing.T, o sideOpts, mtu transport.MTU) (a, b *side, p Pair) {
	t.Helper()
	p = s.f(t)
	a, b = newSide(t, p.A, o), newSide(t, p.B, o)
	mtu = cmp.Or(mtu, transport.MTU1024)
	if m := a.ep.Dev.Attr().ActiveMTU; m != 0 && mtu > m {
		t.Skipf("path MTU %v above the device's active MTU %v", mtu, m)
	}
	co := connOpts{mtu: mtu, timeout: s.cfg.LocalACKTimeout}
	a.bringUp(t, a.qp, a.psn, b.ep, b.qp.QPN(), b.psn, co)
	b.bringUp(t, b.qp, b.psn, a.ep, a.qp.QPN(), a.psn, co)
	return a, b, p
}

func (s *suite) wait(p Pair) time.Duration {
	if p.Lossy {
		return 2 * s.cfg.Wait
	}
	return s.cfg.Wait
}

// waitWC waits (bounded) for one completion on cq.
func waitWC(t *testing.T, cq transport.CQ, d time.Duration) transport.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wc [1]transport.WC
	for {
		if cq.Poll(wc[:]) == 1 {
			return wc[0]
		}
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("waiting %v for a completion: %v", d, err)
		}
	}
}

// expectNoWC asserts that cq stays empty for d.
func expectNoWC(t *testing.T, cq transport.CQ, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := cq.Wait(ctx); err == nil {
		var wc [1]transport.WC
		if cq.Poll(wc[:]) == 1 {
			t.Fatalf("unexpected completion %+v", wc[0])
		}
	}
}

func wantWC(t *testing.T, wc transport.WC, id uint64, st transport.WCStatus, op transport.WCOpcode) {
	t.Helper()
	if wc.ID != id || wc.Status != st || (st != transport.WCWRFlushErr && wc.Opcode != op) {
		t.Fatalf("completion %+v (status %v, opcode %v); want id %#x status %v opcode %v", wc, wc.Status, wc.Opcode, id, st, op)
	}
}

func waitState(t *testing.T, qp transport.QP, want transport.QPState, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for qp.State() != want && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if s := qp.State(); s != want {
		t.Fatalf("QP %#x state %v, want %v", qp.QPN(), s, want)
	}
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

func equal(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: data differs at byte %d of %d", what, i, len(want))
	}
}

func postErrIndex(t *testing.T, err error, sentinel error, idx int) {
	t.Helper()
	var pe *transport.PostError
	if !errors.Is(err, sentinel) || !errors.As(err, &pe) || pe.Index != idx {
		t.Fatalf("error %v; want %v at WR %d", err, sentinel, idx)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
