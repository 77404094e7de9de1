package cm

import (
	"net/netip"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
)

// TestSteer: between two Managers whose comm IDs are in residue classes 1 and 2 mod 4, every
// MAD of a connection's life (REQ, REP, RTU, DREQ, DREP, and the REJ of a refused request)
// is steered to the receiver's class: a REQ by the sender's QPN, the rest by the Remote Comm
// ID, which is the receiver's own.
func TestSteer(t *testing.T) {
	const mod = 4
	s := newNet(t)
	a := s.addNode("A", "10.77.0.2", guidA, 1, func(c *Config) { c.CommIDMod, c.CommIDRem = mod, 1 })
	b := s.addNode("B", "10.77.0.1", guidB, 2, func(c *Config) { c.CommIDMod, c.CommIDRem = mod, 2 })
	if err := b.m.Listen(netip.Addr{}, port); err != nil {
		t.Fatal(err)
	}
	rem := map[*node]uint32{a: 1, b: 2}
	seen := map[uint16]int{}
	s.tap = func(p *packet, to *node) {
		attr := be16(p.mad[16:])
		seen[attr]++
		key, byQPN, ok := Steer(p.mad[:])
		switch {
		case !ok:
			t.Errorf("%s to %s: not steerable", AttrName(attr), to.name)
		case attr == AttrREQ:
			if want := REQ(p.mad[:]).LocalQPN(); !byQPN || key != want {
				t.Errorf("REQ steered by %#x (QPN %v), want the sender's QPN %#x", key, byQPN, want)
			}
		case byQPN || key%mod != rem[to]:
			t.Errorf("%s to %s steered by %#x (QPN %v): class %d, want %d", AttrName(attr), to.name, key, byQPN, key%mod, rem[to])
		}
	}
	b.ulp = acceptAll(0x12, nil, transport.ConnParam{ResponderResources: 4})
	var ids []ConnID
	for i := range 8 {
		ids = append(ids, a.dial(b, port, 0x11+uint32(i), login(56), srpParam))
	}
	s.runFor(time.Second)
	for _, id := range ids {
		if uint32(id)%mod != 1 {
			t.Fatalf("comm ID %#x not in class 1", id)
		}
		if err := a.m.Disconnect(s.now, id, nil, &a.out); err != nil {
			t.Fatal(err)
		}
		a.flush()
	}
	s.runFor(time.Hour)
	for _, e := range b.events {
		if e.Kind == EventRequest && uint32(e.Conn)%mod != 2 {
			t.Fatalf("B's comm ID %#x not in class 2", e.Conn)
		}
	}
	// A request nobody listens for: REJ back to the dialler.
	a.dial(b, port+1, 0x40, nil, srpParam)
	s.runFor(time.Second)
	for _, attr := range []uint16{AttrREQ, AttrREP, AttrRTU, AttrDREQ, AttrDREP, AttrREJ} {
		if seen[attr] == 0 {
			t.Errorf("no %s seen", AttrName(attr))
		}
	}
	// Not steerable: anything but a connection MAD.
	var junk [MADLen]byte
	if _, _, ok := Steer(junk[:]); ok {
		t.Error("zero MAD steered")
	}
	if _, _, ok := Steer(junk[:10]); ok {
		t.Error("short MAD steered")
	}
	if _, err := NewManager(Config{GUID: 1, CommIDMod: 4, CommIDRem: 4}); err == nil {
		t.Error("residue ≥ modulus accepted")
	}
}
