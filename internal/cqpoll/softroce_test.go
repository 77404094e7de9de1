package cqpoll_test

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/cqpoll"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce"
	"github.com/srpd/srpd/transport/softroce/link"
)

// end is one QP of the softroce test, with one CQ for both queues as the channels have.
type end struct {
	qp  transport.QP
	cq  transport.CQ
	mem transport.Memory
	mr  transport.MR
	psn uint32
}

// counter is a Handler that counts the successful receive completions it handles.
type counter struct{ recvs int }

func (c *counter) Ready() bool { return true }
func (c *counter) HandleCompletion(wc *transport.WC) error {
	if wc.Opcode == transport.WCRecv {
		c.recvs++
	}
	return nil
}
func (c *counter) EndBatch() bool        { return false }
func (c *counter) EndRun(took bool) bool { return took }

// loopEnds opens a softroce device on an in-memory link and connects two QPs of it: their
// packets take the device's loopback path.
func loopEnds(t *testing.T) (dev *softroce.Device, a, b *end) {
	t.Helper()
	la, _ := link.NewPipe(netip.MustParseAddr("10.9.1.1"), netip.MustParseAddr("10.9.1.2"), link.PipeConfig{})
	dev, err := softroce.Open(softroce.Config{Link: la, Name: "cqpoll"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = dev.Close(ctx)
	})
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	mk := func(psn uint32) *end {
		e := &end{psn: psn}
		var err error
		if e.cq, err = dev.CreateCQ(64); err != nil {
			t.Fatal(err)
		}
		if e.mem, err = dev.AllocMemory(4096); err != nil {
			t.Fatal(err)
		}
		if e.mr, err = pd.RegMR(e.mem.Addr(), uint64(e.mem.Len()), transport.AccessLocalWrite); err != nil {
			t.Fatal(err)
		}
		e.qp, err = pd.CreateQP(transport.QPInitAttr{SendCQ: e.cq, RecvCQ: e.cq,
			Cap: transport.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	a, b = mk(100), mk(200)
	addr := dev.Addrs()[0]
	up := func(e, peer *end) {
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		must(e.qp.Modify(&transport.QPAttr{State: transport.QPSInit, Port: 1},
			transport.AttrState|transport.AttrPKeyIndex|transport.AttrPort|transport.AttrAccessFlags))
		must(e.qp.Modify(&transport.QPAttr{
			State: transport.QPSRTR, PathMTU: transport.MTU1024, DestQPN: peer.qp.QPN(), RQPSN: peer.psn,
			MaxDestRdAtomic: 1, MinRNRTimer: 1,
			AV: transport.AddressVector{SrcAddr: addr.Addr(), DstAddr: addr.Addr(), DstPort: addr.Port()},
		}, transport.AttrState|transport.AttrAV|transport.AttrPathMTU|transport.AttrDestQPN|transport.AttrRQPSN|
			transport.AttrMaxDestRdAtomic|transport.AttrMinRNRTimer))
		// No local ACK timeout: a SEND held back by Hold must not be retransmitted meanwhile.
		must(e.qp.Modify(&transport.QPAttr{State: transport.QPSRTS, RetryCnt: 7, RNRRetry: 7, SQPSN: e.psn, MaxRdAtomic: 1},
			transport.AttrState|transport.AttrTimeout|transport.AttrRetryCnt|transport.AttrRNRRetry|
				transport.AttrSQPSN|transport.AttrMaxQPRdAtomic))
	}
	up(a, b)
	up(b, a)
	return dev, a, b
}

func (e *end) recv(t *testing.T, id uint64) {
	t.Helper()
	sge := []transport.SGE{{Addr: e.mem.Addr(), Length: 4096, LKey: e.mr.LKey()}}
	if err := e.qp.PostRecv([]transport.RecvWR{{ID: id, SGL: sge}}); err != nil {
		t.Fatal(err)
	}
}

func (e *end) send(t *testing.T, id uint64) {
	t.Helper()
	sge := []transport.SGE{{Addr: e.mem.Addr(), Length: 100, LKey: e.mr.LKey()}}
	if err := e.qp.PostSend([]transport.SendWR{{ID: id, Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: sge}}); err != nil {
		t.Fatal(err)
	}
}

// TestSoftroce runs a Poller on softroce: while the owner waits, the device's goroutine hands
// the receive to the Handler (no token); with a Hold/Progress bracket around the post it does
// so on the posting goroutine, before Progress returns; while the owner is busy, the token
// wakes it and it polls the completion itself.
func TestSoftroce(t *testing.T) {
	dev, a, b := loopEnds(t)
	h := &counter{}
	var runs atomic.Uint64
	p := cqpoll.New(cqpoll.Config{CQ: b.cq, Handler: h, Device: dev, Runs: &runs})
	p.Attach()
	defer p.Detach()
	pa := cqpoll.New(cqpoll.Config{CQ: a.cq, Handler: &counter{}, Device: dev})

	// The owner waits: the loopback loop runs the handler.
	p.Begin(b.qp.QPN())
	p.Unlock()
	b.recv(t, 1)
	a.send(t, 11)
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.Lock()
		got := h.recvs
		p.Unlock()
		if got == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the handler took %d receives, want 1", got)
		}
		time.Sleep(time.Millisecond)
	}
	if runs.Load() == 0 {
		t.Fatal("no run counted")
	}
	select {
	case <-p.Notify():
		t.Fatal("the owner got a token for a completion the handler took")
	default:
	}

	// Hold … Progress: the whole exchange, up to the handler's run, on this goroutine.
	b.recv(t, 2)
	if !pa.Hold() {
		t.Fatal("softroce is a Progresser; Hold returned false")
	}
	a.send(t, 12)
	pa.Progress()
	p.Lock()
	got := h.recvs
	p.Unlock()
	if got != 2 {
		t.Fatalf("after Progress the handler has taken %d receives, want 2", got)
	}

	// The owner busy: the run declines, the token wakes the owner, which polls itself.
	p.Lock()
	b.recv(t, 3)
	a.send(t, 13)
	select {
	case <-p.Notify():
	case <-time.After(10 * time.Second):
		t.Fatal("no token while the owner was busy")
	}
	wcs := make([]transport.WC, 4)
	if n := p.Poll(wcs); n != 1 || wcs[0].ID != 3 || wcs[0].Status != transport.WCSuccess {
		t.Fatalf("owner polled %+v, want the receive 3", wcs[:n])
	}
	if h.recvs != 2 {
		t.Fatalf("the handler took %d receives, want still 2", h.recvs)
	}
	p.End()
}
