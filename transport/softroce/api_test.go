package softroce

import (
	"errors"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
)

func postErrIndex(t *testing.T, err error, sentinel error, idx int) {
	t.Helper()
	var pe *transport.PostError
	if !errors.Is(err, sentinel) || !errors.As(err, &pe) || pe.Index != idx {
		t.Fatalf("error %v; want %v at WR %d", err, sentinel, idx)
	}
}

func TestPostValidationAllOrNothing(t *testing.T) {
	a, b := pipeAddrs()
	la, lb := link.NewPipe(a, b, link.PipeConfig{})
	n := newNode(t, la, nodeOpts{sqDepth: 4, rqDepth: 2, maxSGE: 2, inline: 16})
	defer func() { n.close(); lb.Close(); checkNoEngineGoroutines(t) }()
	send := transport.SendWR{ID: 1, Opcode: transport.WRSend, SGL: []transport.SGE{n.sge(0, 8)}}

	// RESET / INIT / RTR: no sends.
	postErrIndex(t, n.qp.PostSend([]transport.SendWR{send}), transport.ErrQPState, 0)
	postErrIndex(t, n.qp.PostRecv([]transport.RecvWR{{ID: 1}}), transport.ErrQPState, 0)
	// The peer (lb) never answers: everything posted stays outstanding.
	n.bringUp(lb.LocalAddrPort(), 0x99, 1, connOpts{timeout: 20})

	if got := n.qp.SendQueueFree(); got != 4 {
		t.Fatalf("free %d", got)
	}
	if err := n.qp.PostSend([]transport.SendWR{send, send, send}); err != nil {
		t.Fatal(err)
	}
	if got := n.qp.SendQueueFree(); got != 1 {
		t.Fatalf("free %d", got)
	}
	postErrIndex(t, n.qp.PostSend([]transport.SendWR{send, send}), transport.ErrSQFull, 1)
	if got := n.qp.SendQueueFree(); got != 1 {
		t.Fatalf("a refused chain changed the SQ: free %d", got)
	}
	bad := []struct {
		wr   transport.SendWR
		want error
	}{
		{transport.SendWR{Opcode: transport.WRAtomicCmpSwp}, transport.ErrInvalidOpcode},
		{transport.SendWR{Opcode: 99}, transport.ErrInvalidOpcode},
		{transport.SendWR{Opcode: transport.WRSend, SGL: []transport.SGE{n.sge(0, 1), n.sge(1, 1), n.sge(2, 1)}}, transport.ErrTooManySGE},
		{transport.SendWR{Opcode: transport.WRSend, Flags: transport.SendInline, SGL: []transport.SGE{n.sge(0, 17)}}, transport.ErrInlineTooLong},
		{transport.SendWR{Opcode: transport.WRSend, Flags: transport.SendInline, SGL: []transport.SGE{{Addr: 8, Length: 4}}}, transport.ErrBadAddress},
		{transport.SendWR{Opcode: transport.WRRDMARead, Flags: transport.SendInline}, transport.ErrInvalidWR},
		{transport.SendWR{Opcode: transport.WRRegMR}, transport.ErrInvalidWR},
		{transport.SendWR{Opcode: transport.WRRegMR, Reg: transport.RegMRWR{MR: n.mr}}, transport.ErrInvalidWR},
	}
	for _, tc := range bad {
		postErrIndex(t, n.qp.PostSend([]transport.SendWR{{Opcode: transport.WRSend}, tc.wr}), tc.want, 1)
		if got := n.qp.SendQueueFree(); got != 1 {
			t.Fatalf("%v: a refused chain changed the SQ: free %d", tc.want, got)
		}
	}
	// Receive queue.
	if err := n.qp.PostRecv([]transport.RecvWR{{ID: 1}, {ID: 2}}); err != nil {
		t.Fatal(err)
	}
	postErrIndex(t, n.qp.PostRecv([]transport.RecvWR{{ID: 3}}), transport.ErrRQFull, 0)
	postErrIndex(t, n.qp.PostRecv([]transport.RecvWR{{ID: 4, SGL: make([]transport.SGE, 3)}}), transport.ErrTooManySGE, 0)

	// Modify errors are typed and leave the QP alone.
	var me *transport.ModifyError
	err := n.qp.Modify(&transport.QPAttr{State: transport.QPSInit}, transport.AttrState)
	if !errors.Is(err, transport.ErrInvalidTransition) || !errors.As(err, &me) || me.From != transport.QPSRTS {
		t.Fatalf("RTS->INIT: %v", err)
	}
	if s := n.qp.State(); s != transport.QPSRTS {
		t.Fatalf("state %v", s)
	}
	// To ERR: the three outstanding SENDs and the two receives are flushed.
	if err := n.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		wantWC(t, waitWC(t, n.scq, time.Second), 1, transport.WCWRFlushErr, transport.WCSend)
	}
	wantWC(t, waitWC(t, n.rcq, time.Second), 1, transport.WCWRFlushErr, transport.WCRecv)
	wantWC(t, waitWC(t, n.rcq, time.Second), 2, transport.WCWRFlushErr, transport.WCRecv)
	if got := n.qp.SendQueueFree(); got != 4 {
		t.Fatalf("free after flush %d", got)
	}
	// ERR -> RESET -> INIT works again.
	if err := n.qp.Modify(&transport.QPAttr{State: transport.QPSReset}, transport.AttrState); err != nil {
		t.Fatal(err)
	}
	if err := n.qp.Modify(&transport.QPAttr{State: transport.QPSInit, Port: 1}, transport.AttrState|transport.AttrPort|transport.AttrPKeyIndex|transport.AttrAccessFlags); err != nil {
		t.Fatal(err)
	}
}

func TestResourceLifecycle(t *testing.T) {
	a, b := pipeAddrs()
	la, lb := link.NewPipe(a, b, link.PipeConfig{})
	defer lb.Close()
	n := newNode(t, la, nodeOpts{})
	if err := n.pd.Close(); !errors.Is(err, transport.ErrBusy) {
		t.Fatalf("close busy PD: %v", err)
	}
	if err := n.scq.Close(); !errors.Is(err, transport.ErrBusy) {
		t.Fatalf("close busy CQ: %v", err)
	}
	if _, err := n.pd.RegMR(n.mem.Addr()+uint64(n.mem.Len())-8, 16, transport.AccessLocalWrite); !errors.Is(err, transport.ErrBadAddress) {
		t.Fatalf("MR past the end of memory: %v", err)
	}
	if _, err := n.pd.RegMR(n.mem.Addr(), 16, transport.AccessRemoteWrite); !errors.Is(err, transport.ErrInvalidAccess) {
		t.Fatalf("remote write without local write: %v", err)
	}
	if _, err := n.pd.AllocFastRegMR(n.dev.Attr().MaxMRPages + 1); !errors.Is(err, transport.ErrInvalidArgument) {
		t.Fatalf("oversized fast-reg MR: %v", err)
	}
	if err := n.qp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.mr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.mem.Free(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []transport.CQ{n.scq, n.rcq} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.pd.Close(); err != nil {
		t.Fatal(err)
	}
	n.close()
	checkNoEngineGoroutines(t)
}
