package cm

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/srpd/srpd/transport"
)

// TestRapidLossyNetwork drives two Managers against each other through a network that loses
// and duplicates MADs, with a ULP that accepts, rejects, delays (MRA) or ignores requests, then
// disconnects every connection from one side, the other, both at once, or destroys it.
// Properties: every QP Modify is legal; per connection at most one ESTABLISHED and one
// DISCONNECTED, nothing after the final event; every dial ends (established, rejected or
// unreachable); established pairs agree on QPNs and PSNs; and once timers run out both
// Managers hold nothing.
func TestRapidLossyNetwork(t *testing.T) {
	stats := map[EventKind]int{}
	defer func() { t.Logf("dial outcomes over all runs: %v", stats) }()
	rapid.Check(t, func(rt *rapid.T) {
		s := newNet(rt)
		seedA := rapid.Uint64().Draw(rt, "seedA")
		seedB := rapid.Uint64().Draw(rt, "seedB")
		a := s.addNode("A", "10.77.0.2", guidA, seedA, nil)
		b := s.addNode("B", "10.77.0.1", guidB, seedB, nil)
		if err := b.m.Listen(netip.Addr{}, port); err != nil {
			rt.Fatal(err)
		}
		loss := rapid.SampledFrom([]float64{0, 0.05, 0.2, 0.4}).Draw(rt, "loss")
		dupP := rapid.SampledFrom([]float64{0, 0.1, 0.3}).Draw(rt, "dup")
		netRNG := rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "netseed"), 1))
		s.drop = func(*packet) bool { return netRNG.Float64() < loss }
		s.dup = func(*packet) int {
			if netRNG.Float64() < dupP {
				return 1
			}
			return 0
		}
		s.delay = time.Duration(rapid.IntRange(1, 2000).Draw(rt, "delay_us")) * time.Microsecond

		k := rapid.IntRange(1, 6).Draw(rt, "conns")
		// ULP decisions per request, in arrival order.
		decisions := rapid.SliceOfN(rapid.SampledFrom([]string{"accept", "reject", "mra", "defer", "ignore"}), k, k).Draw(rt, "decisions")
		type pendingReq struct {
			id ConnID
			at time.Duration
		}
		var deferred []pendingReq
		nextQPN := uint32(0x1000)
		reqIdx := 0
		b.ulp = func(n *node, e Event) {
			if e.Kind != EventRequest {
				return
			}
			d := decisions[reqIdx%len(decisions)]
			reqIdx++
			switch d {
			case "accept":
				if err := n.m.Accept(s.now, e.Conn, &AcceptParams{QPN: nextQPN, Param: transport.ConnParam{ResponderResources: 2}}, &n.out); err != nil {
					rt.Fatalf("Accept: %v", err)
				}
				nextQPN++
			case "reject":
				if err := n.m.Reject(s.now, e.Conn, 0, []byte{1, 2, 3}, &n.out); err != nil {
					rt.Fatalf("Reject: %v", err)
				}
			case "mra":
				if err := n.m.MRA(s.now, e.Conn, 20, nil, &n.out); err != nil {
					rt.Fatalf("MRA: %v", err)
				}
				deferred = append(deferred, pendingReq{e.Conn, s.now + 10*time.Second})
			case "defer":
				deferred = append(deferred, pendingReq{e.Conn, s.now + 8*time.Second})
			case "ignore":
			}
			n.flush()
		}

		dials := map[ConnID]uint32{}
		for i := 0; i < k; i++ {
			qpn := uint32(0x100 + i)
			dials[a.dial(b, port, qpn, []byte{byte(i)}, srpParam)] = qpn
		}
		// Phase 1: handshakes (deferred decisions are taken when due).
		for end := s.now + 30*time.Minute; ; { // 1 + 15 REQs, each up to 67.6 s after an MRA
			if len(deferred) > 0 && deferred[0].at <= s.now {
				p := deferred[0]
				deferred = deferred[1:]
				if _, ok := b.m.Conn(p.id); ok {
					st, _ := b.m.Conn(p.id)
					if st.State == StateReqRcvd || st.State == StateMRAReqSent {
						if err := b.m.Accept(s.now, p.id, &AcceptParams{QPN: nextQPN}, &b.out); err != nil {
							rt.Fatalf("deferred Accept: %v", err)
						}
						nextQPN++
						b.flush()
					}
				}
				continue
			}
			limit := end
			if len(deferred) > 0 && deferred[0].at < limit {
				limit = deferred[0].at
			}
			if !s.step(limit) {
				if len(deferred) == 0 || s.now >= end {
					break
				}
				s.now = deferred[0].at
			}
		}
		// Every dial has its outcome on A.
		outcome := map[ConnID]EventKind{}
		for _, e := range a.events {
			if e.Kind == EventEstablished || e.Kind == EventRejected || e.Kind == EventUnreachable {
				if _, dup := outcome[e.Conn]; dup {
					rt.Fatalf("conn %#x: two outcomes", e.Conn)
				}
				outcome[e.Conn] = e.Kind
				stats[e.Kind]++
			}
		}
		for id := range dials {
			if _, ok := outcome[id]; !ok {
				st, _ := a.m.Conn(id)
				rt.Fatalf("dial %#x has no outcome after 30 min (state %v)", id, st.State)
			}
		}
		// Established pairs agree.
		for ida, qpn := range dials {
			if outcome[ida] != EventEstablished {
				continue
			}
			ai, _ := a.m.Conn(ida)
			bi, ok := b.m.Conn(ConnID(ai.RemoteCommID))
			if !ok || bi.RemoteCommID != uint32(ida) {
				continue // B gave up (REP retries exhausted): A learns it on disconnect
			}
			qa, qb := a.qps[qpn], b.qps[bi.LocalQPN]
			if qa.attr.RQPSN != qb.attr.SQPSN || qa.attr.SQPSN != qb.attr.RQPSN ||
				qa.attr.DestQPN != bi.LocalQPN || qb.attr.DestQPN != qpn {
				rt.Fatalf("pair %#x/%#x disagrees: A %+v B %+v", ida, bi.ID, qa.attr, qb.attr)
			}
		}
		// Phase 2: tear down.
		how := rapid.SliceOfN(rapid.SampledFrom([]string{"A", "B", "both", "destroyA", "destroyB"}), k, k).Draw(rt, "teardown")
		i := 0
		for ida := range sortedIDs(dials) {
			h := how[i%len(how)]
			i++
			ai, ok := a.m.Conn(ida)
			if !ok {
				continue
			}
			idb := ConnID(ai.RemoteCommID)
			bi, bok := b.m.Conn(idb)
			bok = bok && bi.RemoteCommID == uint32(ida)
			switch {
			case h == "destroyA" || (h != "destroyB" && !bok):
				_ = a.m.Destroy(s.now, ida, &a.out)
			case h == "destroyB":
				_ = b.m.Destroy(s.now, idb, &b.out)
			case h == "A" || ai.State != StateEstablished:
				_ = a.m.Disconnect(s.now, ida, nil, &a.out)
			case h == "B" && bi.State == StateEstablished:
				_ = b.m.Disconnect(s.now, idb, nil, &b.out)
			default:
				_ = a.m.Disconnect(s.now, ida, nil, &a.out)
				if bi.State == StateEstablished {
					_ = b.m.Disconnect(s.now, idb, nil, &b.out)
				}
			}
			a.flush()
			b.flush()
		}
		// B connections A does not know about (A destroyed or never heard): destroy.
		for id := range b.m.conns {
			_ = b.m.Destroy(s.now, id, &b.out)
		}
		b.flush()
		for id := range a.m.conns {
			if st, _ := a.m.Conn(id); st.State == StateEstablished {
				_ = a.m.Destroy(s.now, id, &a.out)
			}
		}
		a.flush()
		s.run(s.now + 10*time.Hour)
		for _, n := range []*node{a, b} {
			checkEventInvariants(rt, n)
			if n.m.NumConns() != 0 {
				for _, c := range n.m.conns {
					rt.Logf("%s left: %#x %v", n.name, c.id, c.state)
				}
				rt.Fatalf("%s holds %d connections after all timers ran out", n.name, n.m.NumConns())
			}
			if _, ok := n.m.NextDeadline(); ok {
				rt.Fatalf("%s has a timer left", n.name)
			}
		}
	})
}

// sortedIDs iterates map keys in ascending order (determinism for rapid).
func sortedIDs(m map[ConnID]uint32) func(func(ConnID) bool) {
	return func(yield func(ConnID) bool) {
		ids := make([]ConnID, 0, len(m))
		for id := range m {
			ids = append(ids, id)
		}
		for i := 1; i < len(ids); i++ {
			for j := i; j > 0 && ids[j] < ids[j-1]; j-- {
				ids[j], ids[j-1] = ids[j-1], ids[j]
			}
		}
		for _, id := range ids {
			if !yield(id) {
				return
			}
		}
	}
}
