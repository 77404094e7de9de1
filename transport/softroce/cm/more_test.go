package cm

import (
	"bytes"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
)

func TestCheckErrors(t *testing.T) {
	good := func() []byte {
		b := make([]byte, MADLen)
		InitMAD(b, AttrREQ, 1)
		return b
	}
	cases := []struct {
		name string
		mut  func([]byte) []byte
		want error
	}{
		{"ok", func(b []byte) []byte { return b }, nil},
		{"longer is fine", func(b []byte) []byte { return append(b, 1, 2, 3) }, nil},
		{"short", func(b []byte) []byte { return b[:255] }, ErrTooShort},
		{"nil", func([]byte) []byte { return nil }, ErrTooShort},
		{"base version", func(b []byte) []byte { b[0] = 2; return b }, ErrBaseVersion},
		{"class", func(b []byte) []byte { b[1] = 0x03; return b }, ErrNotCM},
		{"class version", func(b []byte) []byte { b[2] = 1; return b }, ErrClassVersion},
		{"method GetResp", func(b []byte) []byte { b[3] = 0x81; return b }, ErrMethod},
		{"status", func(b []byte) []byte { b[5] = 1; return b }, ErrStatus},
		{"ClassPortInfo", func(b []byte) []byte { b[17] = 0x01; return b }, ErrUnknownAttribute},
		{"attr 0x1B", func(b []byte) []byte { b[17] = 0x1B; return b }, ErrUnknownAttribute},
	}
	for _, c := range cases {
		_, err := Check(c.mut(good()))
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := ParseREP(good()); err != ErrWrongAttribute {
		t.Errorf("ParseREP(REQ): %v", err)
	}
	// HandleMAD returns parse errors and does nothing else.
	m, _ := NewManager(Config{GUID: 1})
	var o Outputs
	b := good()
	b[1] = 0x04
	if err := m.HandleMAD(0, ipIni, ipTgt, b, &o); err != ErrNotCM || !o.Empty() {
		t.Errorf("%v %+v", err, o)
	}
	if err := m.HandleMAD(0, ipIni, netip.MustParseAddr("::1"), good(), &o); err != ErrInvalidArgument {
		t.Errorf("mixed families: %v", err)
	}
	var e Error = ErrCMAHeader
	if !errors.Is(error(e), ErrCMAHeader) || e.Error() != "cm: invalid RDMA CM private-data header" {
		t.Error(e)
	}
}

// TestTiming pins cm_convert_to_ms and cm_ack_timeout.
func TestTiming(t *testing.T) {
	for _, c := range []struct {
		t    uint8
		want time.Duration
	}{{0, time.Millisecond}, {8, time.Millisecond}, {9, 2 * time.Millisecond}, {16, 256 * time.Millisecond},
		{18, 1024 * time.Millisecond}, {19, 2048 * time.Millisecond}, {20, 4096 * time.Millisecond},
		{24, 65536 * time.Millisecond}, {31, (1 << 23) * time.Millisecond}, {40, (1 << 23) * time.Millisecond}} {
		if got := TimeoutDuration(c.t); got != c.want {
			t.Errorf("TimeoutDuration(%d) = %v, want %v", c.t, got, c.want)
		}
	}
	// Reference implementation: the kernel's expression, literally.
	ref := func(delay, life int) int {
		ack := life + 1
		if ack >= delay {
			if delay >= ack-1 {
				ack++
			}
		} else {
			if ack >= delay-1 {
				ack = delay + 1
			} else {
				ack = delay
			}
		}
		return min(31, ack)
	}
	for d := 0; d < 32; d++ {
		for l := 0; l < 32; l++ {
			if got := AckTimeout(uint8(d), uint8(l)); int(got) != ref(d, l) {
				t.Fatalf("AckTimeout(%d, %d) = %d, want %d", d, l, got, ref(d, l))
			}
		}
	}
	for _, c := range [][3]uint8{{15, 16, 17}, {15, 18, 19}, {15, 14, 16}, {0, 0, 2}, {20, 10, 20}} {
		if got := AckTimeout(c[0], c[1]); got != c[2] {
			t.Errorf("AckTimeout(%d, %d) = %d, want %d", c[0], c[1], got, c[2])
		}
	}
	if TID(2, 0x29dd3287) != 0x000000028732dd29 {
		t.Error("TID")
	}
}

func TestServiceIDAndHeader(t *testing.T) {
	if ServiceID(PortSpaceTCP, 5555) != 0x00000000010615B3 {
		t.Error("service ID")
	}
	for _, c := range []struct {
		sid  uint64
		ps   PortSpace
		port uint16
		ok   bool
	}{
		{0x00000000010615B3, PortSpaceTCP, 5555, true},
		{0x000000000111000A, PortSpaceUDP, 10, true},
		{0x00000000013F0001, PortSpaceIB, 1, true},
		{0x0002c90300000001, 0, 0, false},
		{0x00000001010615B3, 0, 0, false},
	} {
		ps, p, ok := ParseServiceID(c.sid)
		if ps != c.ps || p != c.port || ok != c.ok {
			t.Errorf("%#x: %v %v %v", c.sid, ps, p, ok)
		}
	}
	for _, pair := range [][2]string{{"10.0.0.1", "10.0.0.2"}, {"fd00::1", "fd00::2"}, {"::ffff:10.1.1.1", "10.1.1.2"}} {
		src, dst := netip.MustParseAddr(pair[0]), netip.MustParseAddr(pair[1])
		h := CMAHeader(make([]byte, CMAHeaderLen))
		h.Encode(src, 4242, dst)
		p, err := ParseCMAHeader(h)
		if err != nil || p.SrcAddr() != src.Unmap() || p.DstAddr() != dst.Unmap() || p.SrcPort() != 4242 {
			t.Errorf("%v: %v %v %v %v", pair, err, p.SrcAddr(), p.DstAddr(), p.SrcPort())
		}
		if src.Unmap().Is4() && (p.IPVersion() != 4 || !bytes.Equal(h[4:16], make([]byte, 12))) {
			t.Errorf("IPv4 encoding %x", []byte(h))
		}
	}
	bad := make([]byte, CMAHeaderLen)
	bad[1] = 0x50
	if _, err := ParseCMAHeader(bad); err != ErrCMAHeader {
		t.Error("IP version 5 accepted")
	}
	bad[1], bad[0] = 0x40, 1
	if _, err := ParseCMAHeader(bad); err != ErrCMAHeader {
		t.Error("cma_version 1 accepted")
	}
	if _, err := ParseCMAHeader(bad[:35]); err != ErrCMAHeader {
		t.Error("short header accepted")
	}
	if FlowLabel(0xd010, 5555) != 0x947a3 {
		t.Error("flow label")
	}
}

func TestStrings(t *testing.T) {
	for s := StateIdle; s <= StateTimewait+1; s++ {
		if s.String() == "" {
			t.Error(s)
		}
	}
	for k := EventRequest; k <= EventTimewaitExit+1; k++ {
		if k.String() == "" {
			t.Error(k)
		}
	}
	for _, a := range []uint16{AttrREQ, AttrMRA, AttrREJ, AttrREP, AttrRTU, AttrDREQ, AttrDREP, AttrSIDRREQ, AttrSIDRREP, AttrLAP, AttrAPR} {
		if AttrName(a) == "" {
			t.Errorf("%#x", a)
		}
	}
	if transport.RejectStaleConn.String() != "stale conn" || transport.RejectReason(99).String() != "reject reason 99" {
		t.Error("reject reason names")
	}
	var err error = &transport.RejectError{Reason: 28}
	if !errors.Is(err, transport.ErrConnRejected) || err.Error() == "" {
		t.Error("RejectError")
	}
}

// TestIPv6 connects over IPv6: GIDs, RDMA CM header and AVs carry the IPv6 addresses.
func TestIPv6(t *testing.T) {
	s := newNet(t)
	a := s.addNode("A", "fd00::2", guidA, 1, nil)
	b := s.addNode("B", "fd00::1", guidB, 2, nil)
	if err := b.m.Listen(netip.MustParseAddr("fd00::1"), port); err != nil {
		t.Fatal(err)
	}
	b.ulp = acceptAll(0x30, nil, transport.ConnParam{})
	a.dial(b, port, 0x20, []byte("v6"), srpParam)
	s.runFor(time.Second)
	if findEvent(a, EventEstablished) < 0 || findEvent(b, EventEstablished) < 0 {
		t.Fatalf("A %v B %v", kinds(a.events), kinds(b.events))
	}
	ri := b.events[0].Request
	if ri.RemoteAddr.Addr() != a.addr || ri.LocalAddr.Addr() != b.addr || ri.Listener.Addr() != b.addr {
		t.Errorf("request %+v", ri)
	}
	if a.qps[0x20].attr.AV.DstAddr != b.addr || b.qps[0x30].attr.AV.DstAddr != a.addr {
		t.Error("AVs")
	}
}

func TestMRAForREP(t *testing.T) {
	s, a, b := pair(t)
	b.ulp = acceptAll(0x11, nil, transport.ConnParam{})
	// Hold every RTU: B keeps retransmitting its REP; an MRA(REP) from A stretches that.
	s.drop = func(p *packet) bool { return be16(p.mad[16:]) == AttrRTU }
	ida := a.dial(b, port, 0x11, nil, srpParam)
	s.runFor(10 * time.Millisecond)
	idb := b.events[0].Conn
	var mra [MADLen]byte
	InitMAD(mra[:], AttrMRA, 9)
	m := MRA(mra[:])
	m.SetLocalCommID(uint32(ida))
	m.SetRemoteCommID(uint32(idb))
	m.SetMessageMRAed(MsgResponseREP)
	m.SetServiceTimeout(22) // ms(22) + ms(19) = 16.384 + 2.048 s
	if err := b.m.HandleMAD(s.now, a.addr, b.addr, mra[:], &b.out); err != nil {
		t.Fatal(err)
	}
	b.flush()
	if st, _ := b.m.Conn(idb); st.State != StateMRARepRcvd {
		t.Fatalf("state %v", st.State)
	}
	if d, _ := b.m.NextDeadline(); d != s.now+TimeoutDuration(22)+TimeoutDuration(19) {
		t.Errorf("REP deadline %v (now %v)", d, s.now)
	}
	// A second MRA does not extend again (cm_mra_handler: duplicate).
	if err := b.m.HandleMAD(s.now+time.Second, a.addr, b.addr, mra[:], &b.out); err != nil || !b.out.Empty() {
		t.Fatalf("%v %+v", err, b.out)
	}
	// MRA naming the wrong message is ignored.
	m.SetMessageMRAed(MsgResponseREQ)
	_ = b.m.HandleMAD(s.now, a.addr, b.addr, mra[:], &b.out)
	if !b.out.Empty() {
		t.Fatal("MRA(REQ) for a REP_SENT connection acted on")
	}
	s.drop = nil
	s.runFor(time.Minute)
	if st, _ := b.m.Conn(idb); st.State != StateEstablished {
		t.Fatalf("state %v", st.State)
	}
}

func TestRejectAfterAcceptAndDestroy(t *testing.T) {
	// Reject in REP_SENT: REJ (message rejected "other"), timewait, no further events.
	s, a, b := pair(t)
	s.drop = func(p *packet) bool { return be16(p.mad[16:]) == AttrRTU }
	b.ulp = acceptAll(0x11, nil, transport.ConnParam{})
	a.dial(b, port, 0x11, nil, srpParam)
	s.runFor(10 * time.Millisecond)
	idb := b.events[0].Conn
	if err := b.m.Reject(s.now, idb, 0, []byte("no"), &b.out); err != nil {
		t.Fatal(err)
	}
	b.flush()
	if st, _ := b.m.Conn(idb); st.State != StateTimewait {
		t.Fatalf("state %v", st.State)
	}
	s.run(s.now + time.Hour)
	// A was established; the REJ makes it disconnect (timewait), with the reason.
	ka := kinds(a.events)
	if !slices.Equal(ka, []EventKind{EventEstablished, EventDisconnected, EventTimewaitExit}) || a.events[1].Reason != 28 {
		t.Fatalf("A events %v %+v", ka, a.events)
	}
	if kb := kinds(b.events); !slices.Equal(kb, []EventKind{EventRequest}) {
		t.Fatalf("B events %v", kb)
	}
	if a.m.NumConns() != 0 || b.m.NumConns() != 0 {
		t.Fatal("connections left")
	}

	// Destroy an established connection: one DREQ, timewait silently; the peer disconnects.
	s, a, b, ida, _ := connected(t)
	if err := a.m.Destroy(s.now, ida, &a.out); err != nil {
		t.Fatal(err)
	}
	a.flush()
	if err := a.m.Disconnect(s.now, ida, nil, &a.out); !errors.Is(err, ErrUnknownConn) {
		t.Errorf("Disconnect after Destroy: %v", err)
	}
	s.run(s.now + time.Hour)
	if a.sent[AttrDREQ] != 1 || len(a.events) != 1 || a.m.NumConns() != 0 {
		t.Fatalf("A sent %v events %v", a.sent, kinds(a.events))
	}
	if kb := kinds(b.events); !slices.Equal(kb[len(kb)-2:], []EventKind{EventDisconnected, EventTimewaitExit}) {
		t.Fatalf("B events %v", kb)
	}
	if err := a.m.Destroy(s.now, ida, &a.out); !errors.Is(err, ErrUnknownConn) {
		t.Error(err)
	}
}

// TestStaleREP: a REP whose (CA GUID, QPN) belongs to a connection we still hold is
// answered with REJ 10 (REP rejected) and the old connection gets a DREQ.
func TestStaleREP(t *testing.T) {
	s, a, b, ida, _ := connected(t)
	ai, _ := a.m.Conn(ida)
	id2, err := a.m.Dial(s.now, &DialParams{LocalAddr: a.addr, RemoteAddr: b.addr, DstPort: port, QPN: 0x99}, &a.out)
	if err != nil {
		t.Fatal(err)
	}
	a.out.Reset()
	var rep [MADLen]byte
	InitMAD(rep[:], AttrREP, TID(1, uint32(id2)))
	r := REP(rep[:])
	r.SetLocalCommID(0xfeed)
	r.SetRemoteCommID(uint32(id2))
	r.SetLocalQPN(ai.RemoteQPN) // reused QPN
	r.SetLocalCAGUID(guidB)
	if err := a.m.HandleMAD(s.now, b.addr, a.addr, rep[:], &a.out); err != nil {
		t.Fatal(err)
	}
	var got []uint16
	for i := range a.out.MADs {
		got = append(got, a.out.MADs[i].Attr())
	}
	if !slices.Equal(got, []uint16{AttrREJ, AttrDREQ}) {
		t.Fatalf("answers %v", got)
	}
	j := REJ(a.out.MADs[0].MAD[:])
	if j.Reason() != 10 || j.MessageRejected() != MsgResponseREP || j.RemoteCommID() != 0xfeed || j.LocalCommID() != uint32(id2) {
		t.Fatalf("REJ %x", j[24:40])
	}
	if st, _ := a.m.Conn(ida); st.State != StateDreqSent {
		t.Errorf("old connection %v", st.State)
	}
	if st, _ := a.m.Conn(id2); st.State != StateReqSent {
		t.Errorf("new connection %v", st.State)
	}
}

func TestClampAndDefaults(t *testing.T) {
	s := newNet(t)
	a := s.addNode("A", "10.0.0.2", guidA, 1, func(c *Config) { c.MaxRdAtomic, c.MaxDestRdAtomic = 1, 2 })
	b := s.addNode("B", "10.0.0.1", guidB, 2, nil)
	if err := b.m.Listen(netip.Addr{}, port); err != nil {
		t.Fatal(err)
	}
	b.ulp = acceptAll(0x40, nil, transport.ConnParam{ResponderResources: 8, InitiatorDepth: 9})
	a.dial(b, port, 0x41, nil, transport.ConnParam{ResponderResources: 8, InitiatorDepth: 8})
	s.runFor(time.Second)
	qa, qb := a.qps[0x41].attr, b.qps[0x40].attr
	// A offered 2 (clamped) responder resources: B's initiator depth is capped at 2 even
	// though its ULP asked for 9.
	if qa.MaxDestRdAtomic != 2 || qb.MaxRdAtomic != 2 {
		t.Errorf("A max_dest %d, B max_rd %d", qa.MaxDestRdAtomic, qb.MaxRdAtomic)
	}
	// B's REP says 8 responder resources; A clamps its max_rd_atomic to its device limit 1.
	if qa.MaxRdAtomic != 1 || qb.MaxDestRdAtomic != 8 {
		t.Errorf("A max_rd %d, B max_dest %d", qa.MaxRdAtomic, qb.MaxDestRdAtomic)
	}
	// A responder with no resources: access without REMOTE_READ on B, as cm.c.
	s2, c, d := pair(t)
	d.ulp = acceptAll(0x50, nil, transport.ConnParam{ResponderResources: 0})
	c.dial(d, port, 0x51, nil, transport.ConnParam{ResponderResources: 0, InitiatorDepth: 1})
	s2.runFor(time.Second)
	if acc := d.qps[0x50].attr.AccessFlags; acc != transport.AccessRemoteWrite {
		t.Errorf("access %v", acc)
	}
	if acc := c.qps[0x51].attr.AccessFlags; acc != transport.AccessRemoteWrite {
		t.Errorf("access %v", acc)
	}
	cfg := c.m.Config()
	if cfg.AckDelay != 15 || cfg.PacketLifeTime != 18 || cfg.CMResponseTimeout != 20 || cfg.MaxCMRetries != 15 ||
		cfg.MRAServiceTimeout != 24 || cfg.HopLimit != 64 || cfg.HiTID != 1 {
		t.Errorf("defaults %+v", cfg)
	}
}

// TestDREQBeforeRTU: the RTU is lost and the dialler disconnects; the DREQ reaches the acceptor
// in REP_SENT.
func TestDREQBeforeRTU(t *testing.T) {
	s, a, b := pair(t)
	s.drop = func(p *packet) bool { return be16(p.mad[16:]) == AttrRTU }
	b.ulp = acceptAll(0x11, nil, transport.ConnParam{})
	ida := a.dial(b, port, 0x11, nil, srpParam)
	s.runFor(10 * time.Millisecond)
	if err := a.m.Disconnect(s.now, ida, nil, &a.out); err != nil {
		t.Fatal(err)
	}
	a.flush()
	s.run(s.now + time.Hour)
	// B never saw the RTU: DISCONNECTED without ESTABLISHED (as RDMA CM reports it).
	if kb := kinds(b.events); !slices.Equal(kb, []EventKind{EventRequest, EventDisconnected, EventTimewaitExit}) {
		t.Fatalf("B events %v", kb)
	}
	if b.sent[AttrDREP] != 1 || a.m.NumConns() != 0 || b.m.NumConns() != 0 {
		t.Fatalf("B sent %v", b.sent)
	}
}
