package cm

import (
	"slices"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
)

// TestStaleDREQ: a restarted node (a fresh Manager at the same address, no record of the
// connection) sends a DREQ built from the identity its earlier instance recorded; the peer
// disconnects at once. With the wrong QPN or communication IDs the peer ignores it, as
// cm_dreq_handler does (and answers an unknown ID with a DREP, which the fresh node drops).
func TestStaleDREQ(t *testing.T) {
	for _, tc := range []struct {
		name       string
		mut        func(*StaleConn)
		disconnect bool
	}{
		{"recorded identity", func(*StaleConn) {}, true},
		{"wrong QPN", func(s *StaleConn) { s.RemoteQPN ^= 1 }, false},
		{"wrong remote comm ID", func(s *StaleConn) { s.RemoteCommID ^= 1 }, false},
		{"wrong local comm ID", func(s *StaleConn) { s.LocalCommID ^= 1 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, a, b, ida, idb := connected(t)
			bi, ok := b.m.Conn(idb)
			if !ok {
				t.Fatal("no passive connection")
			}
			sc := StaleConn{Local: b.addr, Remote: a.addr, LocalCommID: uint32(idb), RemoteCommID: bi.RemoteCommID, RemoteQPN: bi.RemoteQPN}
			tc.mut(&sc)
			// b is killed and restarted: a fresh Manager on the same address.
			fresh := s.addNode("b2", b.addr.String(), 0xB2, 99, nil)
			fresh.m.StaleDREQ(sc, &fresh.out)
			fresh.flush()
			if fresh.sent[AttrDREQ] != 1 {
				t.Fatalf("DREQs sent: %d", fresh.sent[AttrDREQ])
			}
			start := s.now
			s.run(start + time.Second)
			evs := a.eventsOf(ida)
			gotDisc := slices.Contains(kinds(evs), EventDisconnected)
			if gotDisc != tc.disconnect {
				t.Fatalf("peer events %v, want disconnected=%v", kinds(evs), tc.disconnect)
			}
			if tc.disconnect {
				if a.qps[0x11].state != transport.QPSErr {
					t.Fatalf("peer QP %v, want error", a.qps[0x11].state)
				}
				if a.sent[AttrDREP] != 1 {
					t.Fatalf("peer DREPs %d", a.sent[AttrDREP])
				}
			} else if ai, ok := a.m.Conn(ida); !ok || ai.State != StateEstablished {
				t.Fatalf("peer connection %+v (ok %v), want it established", ai, ok)
			}
			if len(fresh.events) != 0 || fresh.m.NumConns() != 0 {
				t.Fatalf("the restarted node got events %v / %d conns from the answer", kinds(fresh.events), fresh.m.NumConns())
			}
			checkEventInvariants(t, a)
		})
	}
}
