package softroce

import (
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
)

func TestSendRecvBasic(t *testing.T) {
	a, b, _, _ := newPipePair(t, link.PipeConfig{}, nodeOpts{})
	connect(a, b, connOpts{})
	fill(a.bytes(0, 3000), 1)
	if err := b.qp.PostRecv([]transport.RecvWR{{ID: 7, SGL: []transport.SGE{b.sge(0, 4096)}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.WRSend, Flags: transport.SendSignaled,
		SGL: []transport.SGE{a.sge(0, 3000)}}}); err != nil {
		t.Fatal(err)
	}
	wantWC(t, waitWC(t, a.scq, 5*time.Second), 1, transport.WCSuccess, transport.WCSend)
	wc := waitWC(t, b.rcq, 5*time.Second)
	wantWC(t, wc, 7, transport.WCSuccess, transport.WCRecv)
	if wc.ByteLen != 3000 {
		t.Fatalf("byte len %d", wc.ByteLen)
	}
	equal(t, "send", b.bytes(0, 3000), a.bytes(0, 3000))
	a.close()
	b.close()
	checkNoEngineGoroutines(t)
}
