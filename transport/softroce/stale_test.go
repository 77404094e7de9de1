package softroce

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
)

// TestStaleDREQDisconnectsPeer: the identity a device reports for an established connection is
// enough for another device on the same address (a restarted daemon) to disconnect the peer's
// side at once with SendStaleDREQ; the peer sees RDMA_CM's DISCONNECTED and its QP errors.
func TestStaleDREQDisconnectsPeer(t *testing.T) {
	p := newCMUDP(t, nodeOpts{})
	ca, _ := connectCM(t, p, []byte("login request"), []byte("login response"))
	ids := p.b.dev.EstablishedConns()
	if len(ids) != 1 {
		t.Fatalf("passive side reports %d established connections, want 1", len(ids))
	}
	id := ids[0]
	if id.Local != p.b.addr.Addr() || id.Remote != p.a.addr || id.RemoteQPN != p.a.qp.QPN() {
		t.Fatalf("identity %+v: want local %v, remote %v, remote QPN %#x", id, p.b.addr.Addr(), p.a.addr, p.a.qp.QPN())
	}
	if ai := p.a.dev.EstablishedConns(); len(ai) != 1 || ai[0].RemoteCommID != id.LocalCommID || ai[0].LocalCommID != id.RemoteCommID {
		t.Fatalf("active side %+v does not mirror %+v", ai, id)
	}

	// The restarted daemon: a new device on b's address (another port; the CM matches by
	// communication IDs and QPN, not by the source port).
	lc, err := link.ListenUDP(context.Background(), netip.AddrPortFrom(p.b.addr.Addr(), 0), link.UDPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := newNode(t, lc, nodeOpts{})
	t.Cleanup(c.close)
	wrong := id
	wrong.RemoteQPN ^= 1
	c.dev.SendStaleDREQ(wrong) // ignored by the peer: another QP
	time.Sleep(100 * time.Millisecond)
	if st := ca.QP().State(); st != transport.QPSRTS {
		t.Fatalf("a DREQ naming another QPN moved the peer's QP to %v", st)
	}
	c.dev.SendStaleDREQ(id)
	nextEvent(t, ca, transport.CMEventDisconnected)
	if st := ca.QP().State(); st != transport.QPSErr {
		t.Fatalf("peer QP %v after the stale DREQ", st)
	}
	if n := len(c.dev.EstablishedConns()); n != 0 {
		t.Fatalf("the restarted device reports %d connections", n)
	}
}
