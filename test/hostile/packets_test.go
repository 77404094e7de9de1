//go:build hostile

package hostile

import (
	"testing"

	"github.com/srpd/srpd/transport/softroce/cm"
	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// rcOpcodes are the RC request and response opcodes the crafted packets use: every extended
// header (RETH, AETH, AtomicETH, ImmDt, IETH) appears in at least one.
var rcOpcodes = []wire.Opcode{
	wire.RCSendFirst, wire.RCSendMiddle, wire.RCSendLast, wire.RCSendOnly, wire.RCSendOnlyWithImmediate,
	wire.RCSendOnlyWithInvalidate, wire.RCRDMAWriteFirst, wire.RCRDMAWriteOnly, wire.RCRDMAWriteOnlyWithImmediate,
	wire.RCRDMAReadRequest, wire.RCRDMAReadResponseOnly, wire.RCRDMAReadResponseFirst, wire.RCAcknowledge,
	wire.RCAtomicAcknowledge, wire.RCCompareSwap, wire.RCFetchAdd,
}

// payloadFor is a payload length valid for op: none for the header-only opcodes.
func payloadFor(op wire.Opcode, n int) int {
	switch op {
	case wire.RCRDMAReadRequest, wire.RCAcknowledge, wire.RCAtomicAcknowledge, wire.RCCompareSwap, wire.RCFetchAdd:
		return 0
	}
	return n
}

// engineDrops is what srpd's transport counted as dropped: by the link (malformed, overflow),
// for a bad ICRC and by the engine (no such QP, wrong state, bad header).
func engineDrops(m map[string]float64) float64 {
	return sum(m, "srpd_softroce_link_drops_total") + sum(m, "srpd_softroce_icrc_drops_total") +
		sum(m, "srpd_softroce_engine_drops_total")
}

// TestHostilePackets sends srpd's RoCEv2 port random datagrams, truncated packets, packets
// with a bad ICRC, packets to QPs that do not exist and CM MADs with garbage, from 127.0.0.2-6,
// while an established NBD export does verified I/O. After each class srpd must be alive,
// within its RSS budget, have counted the packets as dropped or rejected (so they reached it),
// and the export must have kept working.
func TestHostilePackets(t *testing.T) {
	d := startDaemon(t)
	p := startProber(t, d.nbdSocket, lunSize/2)
	total := 0
	dropped := func(t *testing.T, class string, before map[string]float64, sent int, min float64) {
		t.Helper()
		after := d.metrics(t)
		got := engineDrops(after) - engineDrops(before)
		t.Logf("%s: %d packets sent, srpd counted %.0f dropped (link %.0f, ICRC %.0f, engine %.0f in total so far)", class, sent, got,
			sum(after, "srpd_softroce_link_drops_total"), sum(after, "srpd_softroce_icrc_drops_total"), sum(after, "srpd_softroce_engine_drops_total"))
		if got < min*float64(sent) {
			t.Errorf("%s: srpd counted %.0f of %d hostile packets as dropped; want at least %.0f%% (did they reach it?)", class, got, sent, 100*min)
		}
		total += sent
	}

	d.attack(t, p, "RandomBytes", func(t *testing.T) {
		f := newForger(t, d, "127.0.0.2", 1)
		before := d.metrics(t)
		buf := make([]byte, 9000)
		const n = 20000
		for i := range n {
			var l int
			switch i % 100 {
			case 0:
				l = 0
			case 1:
				l = 4000 + f.rng.IntN(5000) // beyond link.MaxPacket
			default:
				l = f.rng.IntN(1500)
			}
			for j := range buf[:l] {
				buf[j] = byte(f.rng.Uint32())
			}
			f.sendRaw(buf[:l])
		}
		// Empty datagrams carry nothing to count; random bytes essentially never have a valid
		// ICRC, so all of the rest must be counted.
		dropped(t, "random bytes", before, n, 0.9)
	})

	d.attack(t, p, "Truncated", func(t *testing.T) {
		f := newForger(t, d, "127.0.0.3", 2)
		before := d.metrics(t)
		sent := 0
		for round := range 40 {
			for _, op := range append(rcOpcodes, wire.UDSendOnly) {
				full := f.packet(op, 0x800000+f.rng.Uint32N(0x7FFFFF), payloadFor(op, 64+round))
				if op == wire.UDSendOnly {
					full = f.madPacket(f.req(loginPD(uint64(round), 0x7472756e63)))
				}
				// Every length from a bare BTH + ICRC up to one byte short of the packet, with a
				// valid ICRC over the truncated bytes: the headers themselves are cut.
				for l := link.MinPacket; l < len(full); l += 1 + f.rng.IntN(7) {
					b := append([]byte(nil), full[:l]...)
					f.sendValid(b)
					sent++
				}
				// And shorter than the smallest packet, as raw bytes.
				f.sendRaw(full[:f.rng.IntN(link.MinPacket)])
				sent++
			}
		}
		dropped(t, "truncated", before, sent, 0.8)
	})

	d.attack(t, p, "BadICRC", func(t *testing.T) {
		f := newForger(t, d, "127.0.0.4", 3)
		before := d.metrics(t)
		sent := 0
		for round := range 300 {
			for _, op := range rcOpcodes {
				// Low QPNs include the daemon's live ones (softroce numbers QPs from 0x11): a bad
				// ICRC must keep even a well-aimed packet out.
				qpn := uint32(0x11 + round%32)
				b := f.packet(op, qpn, payloadFor(op, 256))
				copy(b[len(b)-4:], []byte{byte(f.rng.Uint32()), byte(round), 0xde, 0xad})
				f.sendRaw(b)
				sent++
			}
			b := f.madPacket(f.req(loginPD(uint64(round), 0x69637263)))
			copy(b[len(b)-4:], []byte{0xba, 0xad, byte(round), 0})
			f.sendRaw(b)
			sent++
		}
		dropped(t, "bad ICRC", before, sent, 0.9)
		if after := d.metrics(t); sum(after, "srpd_softroce_icrc_drops_total")-sum(before, "srpd_softroce_icrc_drops_total") < 0.9*float64(sent) {
			t.Errorf("bad ICRC: srpd's ICRC drop counter rose by %.0f for %d packets", sum(after, "srpd_softroce_icrc_drops_total")-sum(before, "srpd_softroce_icrc_drops_total"), sent)
		}
	})

	d.attack(t, p, "UnknownQPN", func(t *testing.T) {
		f := newForger(t, d, "127.0.0.5", 4)
		before := d.metrics(t)
		sent := 0
		for round := range 400 {
			for _, op := range rcOpcodes {
				var qpn uint32
				switch round % 10 {
				case 0:
					qpn = 0 // the SMI QP: no RC there
				case 1:
					qpn = wire.QPGSI // QP1 takes UD SEND_ONLY MADs only
				case 2:
					qpn = 0xFFFFFF // the multicast QPN
				default:
					qpn = 0x800000 + f.rng.Uint32N(0x7FFFFF) // far above any QP softroce numbered
				}
				f.sendValid(f.packet(op, qpn, payloadFor(op, 32+f.rng.IntN(1024))))
				sent++
			}
		}
		dropped(t, "unknown QPN", before, sent, 0.9)
	})

	d.attack(t, p, "CMGarbage", func(t *testing.T) {
		f := newForger(t, d, "127.0.0.6", 5)
		before := d.metrics(t)
		sent := 0
		pd := make([]byte, 56)
		for round := range 300 {
			// A REQ whose private data is garbage (no SRP_LOGIN_REQ), of random length.
			for i := range pd {
				pd[i] = byte(f.rng.Uint32())
			}
			if round%3 == 0 {
				pd[11] = 0 // SRP_LOGIN_REQ opcode byte of the RDMA CM form: a "login" with garbage fields
			}
			f.sendValid(f.madPacket(f.req(pd[:f.rng.IntN(57)])))
			// A REQ whose CM fields (after the MAD header) are random.
			mad := f.req(loginPD(uint64(round), 0x6761726261676521))
			for i := cm.HeaderLen; i < len(mad); i++ {
				if f.rng.IntN(4) == 0 {
					mad[i] = byte(f.rng.Uint32())
				}
			}
			f.sendValid(f.madPacket(mad))
			// A CM MAD of a random attribute with a random body.
			attrs := []uint16{cm.AttrREQ, cm.AttrMRA, cm.AttrREJ, cm.AttrREP, cm.AttrRTU, cm.AttrDREQ, cm.AttrDREP, cm.AttrLAP, cm.AttrAPR, 0x0019, 0xFFFF}
			m := make([]byte, cm.MADLen)
			for i := range m {
				m[i] = byte(f.rng.Uint32())
			}
			cm.InitMAD(m, attrs[f.rng.IntN(len(attrs))], f.rng.Uint64())
			f.sendValid(f.madPacket(m))
			// Random bytes as a MAD (random class, version, method).
			for i := range m {
				m[i] = byte(f.rng.Uint32())
			}
			f.sendValid(f.madPacket(m))
			sent += 4
		}
		// The REQs (half of what was sent) reach the CM whole: each is counted as a received MAD
		// (the CM then rejects it) or as a drop; at least 90% of them must be accounted for. The
		// other MADs may land in the CM's malformed counter instead, which srpd does not export.
		after := d.metrics(t)
		mads := sum(after, "srpd_softroce_cm_mads_received_total") - sum(before, "srpd_softroce_cm_mads_received_total")
		drops := engineDrops(after) - engineDrops(before)
		rej := sum(after, "srpd_target_logins_total", `result="rejected"`) - sum(before, "srpd_target_logins_total", `result="rejected"`)
		t.Logf("CM garbage: %d MADs sent; srpd counted %.0f CM MADs received, %.0f packets dropped, %.0f logins rejected", sent, mads, drops, rej)
		if reqs := sent / 2; mads+drops < 0.9*float64(reqs) {
			t.Errorf("CM garbage: srpd accounted for %.0f MADs; %d REQs were sent", mads+drops, reqs)
		}
		if rej < 100 {
			t.Errorf("CM garbage: %0.f logins rejected; the 300 REQs with garbage private data should mostly reach the target and be refused", rej)
		}
		if s := sum(after, "srpd_target_sessions"); s != 1 {
			t.Errorf("CM garbage: the target has %.0f sessions; want 1 (the established one): garbage must never log in", s)
		}
		total += sent
	})
	t.Logf("hostile packets: %d sent in all; srpd peak RSS %s (budget %s)", total, mib(d.peakRSS()), mib(d.budget))
}
