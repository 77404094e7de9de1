package wire

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
)

// seedPackets adds the transport bytes of every capture packet (BTH..ICRC) to f's corpus.
func seedPackets(f *testing.F) []capPkt {
	var all []capPkt
	for _, name := range captures {
		all = append(all, loadCapture(f, name)...)
	}
	seen := map[string]bool{}
	for _, c := range all {
		// One seed per (opcode, length) keeps the corpus small.
		k := string(c.pkt[:1]) + string(rune(len(c.pkt)))
		if !seen[k] {
			seen[k] = true
			f.Add(c.pkt)
		}
	}
	return all
}

func FuzzParse(f *testing.F) {
	seedPackets(f)
	f.Add([]byte{})
	f.Add(make([]byte, 16))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Parse(b)
		if err != nil {
			var we Error
			if !errors.As(err, &we) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		// Invariants of a parsed packet.
		if p.Len() != len(b) || p.HeaderLen() != p.Opcode().HeaderLen() {
			t.Fatal("lengths")
		}
		if p.HeaderLen()+p.PayloadLen()+len(p.Pad())+ICRCLen != len(b) || p.PayloadLen() < 0 {
			t.Fatal("partition")
		}
		if (p.PayloadLen()+len(p.Pad()))%4 != 0 {
			t.Fatal("alignment")
		}
		op := p.Opcode()
		for _, v := range [][]byte{p.RDETH(), p.DETH(), p.RETH(), p.AtomicETH(), p.AETH(), p.AtomicAckETH(), p.ImmDt(), p.IETH(), p.FETH()} {
			if v != nil && len(v) == 0 {
				t.Fatal("empty view")
			}
		}
		if (p.RETH() != nil) != op.Is(HasRETH) || (p.AETH() != nil) != op.Is(HasAETH) || (p.DETH() != nil) != op.Is(HasDETH) {
			t.Fatal("view presence")
		}
		_ = p.BTH().Fields()
		if m := p.MAD(); m != nil {
			_ = m.Fields()
		}
		_ = p.ICRC()
		// Re-encoding the BTH from its fields gives the same bytes except reserved bits.
		f := p.BTH().Fields()
		c := make(BTH, BTHLen)
		c.Encode(&f)
		want := append([]byte(nil), b[:BTHLen]...)
		want[4] &= 0xC0
		want[8] &= 0x80
		if string(c) != string(want) {
			t.Fatalf("BTH re-encode %x != %x", []byte(c), want)
		}
	})
}

func FuzzBTH(f *testing.F) {
	f.Add([]byte("\x04\x00\xff\xff\x00\x00\x00\x11\x80\x00\x01\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < BTHLen {
			return
		}
		h := BTH(b[:BTHLen])
		fl := h.Fields()
		c := make(BTH, BTHLen)
		c.Encode(&fl)
		if c.Fields() != fl {
			t.Fatal("BTH round trip")
		}
		if fl.DestQP > qpnMask || !fl.PSN.Valid() || fl.PadCount > 3 || fl.TVer > 15 {
			t.Fatal("field range")
		}
	})
}

func FuzzRETH(f *testing.F) {
	f.Add(make([]byte, RETHLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < RETHLen {
			return
		}
		fl := RETH(b).Fields()
		c := make(RETH, RETHLen)
		c.Encode(&fl)
		if string(c) != string(b[:RETHLen]) {
			t.Fatal("RETH round trip")
		}
	})
}

func FuzzAETH(f *testing.F) {
	f.Add([]byte{0x1f, 0, 0, 1})
	f.Add([]byte{0x61, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < AETHLen {
			return
		}
		a := AETH(b)
		fl := a.Fields()
		c := make(AETH, AETHLen)
		c.Encode(&fl)
		if string(c) != string(b[:AETHLen]) {
			t.Fatal("AETH round trip")
		}
		s := a.Syndrome()
		_ = s.String()
		switch s.Type() {
		case SyndromeACK:
			if n, ok := s.Credits(); ok && (n < 0 || n > 30) {
				t.Fatal("credits")
			}
		case SyndromeRNRNAK:
			if s.RNRTimer() > 31 || s.RNRTimer().Duration() <= 0 {
				t.Fatal("rnr")
			}
		case SyndromeNAK:
			if s.NakCode().Syndrome() != s {
				t.Fatal("nak")
			}
		}
	})
}

func FuzzDETH(f *testing.F) {
	f.Add([]byte{0x80, 1, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < DETHLen {
			return
		}
		d := DETH(b)
		fl := d.Fields()
		c := make(DETH, DETHLen)
		c.Encode(&fl)
		want := append([]byte(nil), b[:DETHLen]...)
		want[4] = 0
		if string(c) != string(want) {
			t.Fatal("DETH round trip")
		}
	})
}

func FuzzSmallHeaders(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) >= 4 {
			i, m := IETH(b), ImmDt(b)
			c := make(IETH, 4)
			c.SetRKey(i.RKey())
			d := make(ImmDt, 4)
			d.SetImm(m.Imm())
			if string(c) != string(b[:4]) || string(d) != string(b[:4]) {
				t.Fatal("IETH/ImmDt")
			}
			_ = RDETH(b).EEContext()
			_ = FETH(b).PlacementType()
		}
		if len(b) >= AtomicAckETHLen {
			_ = AtomicAckETH(b).OrigData()
		}
		if len(b) >= AtomicETHLen {
			a := AtomicETH(b)
			if a.VA() != binary.BigEndian.Uint64(b) || a.Compare() != binary.BigEndian.Uint64(b[20:]) {
				t.Fatal("AtomicETH")
			}
		}
	})
}

func FuzzMAD(f *testing.F) {
	for _, c := range loadCapture(f, captures[0]) {
		if p, err := Parse(c.pkt); err == nil && p.MAD() != nil {
			f.Add([]byte(p.MAD()))
			break
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseMAD(b)
		if err != nil {
			if len(b) >= MADHeaderLen {
				t.Fatal("rejected a full header")
			}
			return
		}
		fl := m.Fields()
		c := make(MAD, MADHeaderLen)
		c.Encode(&fl)
		want := append([]byte(nil), b[:MADHeaderLen]...)
		want[18], want[19] = 0, 0
		if string(c) != string(want) {
			t.Fatal("MAD round trip")
		}
	})
}

func FuzzParseEncap(f *testing.F) {
	for _, v := range icrcVectors {
		f.Add(unhex(f, v.ip))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, hl, plen, err := ParseEncap(b)
		if err != nil {
			return
		}
		if hl != e.HeaderLen() || plen < 0 || !e.Valid() {
			t.Fatal("ParseEncap invariants")
		}
		if len(b) >= hl+plen && plen >= BTHLen+ICRCLen {
			pkt := b[hl : hl+plen]
			got, err := ICRCFromHeaders(b[:hl-UDPHeaderLen], b[hl-UDPHeaderLen:hl], pkt)
			if err != nil || got != e.ICRC(pkt) {
				t.Fatalf("ICRCFromHeaders %#x (%v) != Encap.ICRC %#x", got, err, e.ICRC(pkt))
			}
		}
	})
}

// FuzzICRCRecover: no panic on any input, and for a packet whose ICRC was computed with some
// ID, recovery from ID 0 always returns that ID.
func FuzzICRCRecover(f *testing.F) {
	for i, c := range loadCapture(f, captures[0]) {
		if i%40 == 0 && c.encap.Is4() {
			a, b := c.encap.Src.Addr().As4(), c.encap.Dst.Addr().As4()
			f.Add(c.pkt, c.encap.IPv4ID, binary.BigEndian.Uint32(a[:]), binary.BigEndian.Uint32(b[:]), c.encap.Src.Port())
		}
	}
	f.Add([]byte{}, uint16(0), uint32(0x0a000001), uint32(0x0a000002), uint16(0xC000))
	f.Fuzz(func(t *testing.T, pkt []byte, id uint16, src, dst uint32, sport uint16) {
		var s, d [4]byte
		binary.BigEndian.PutUint32(s[:], src)
		binary.BigEndian.PutUint32(d[:], dst)
		e := Encap{Src: netip.AddrPortFrom(netip.AddrFrom4(s), sport), Dst: netip.AddrPortFrom(netip.AddrFrom4(d), UDPPort)}
		// Arbitrary bytes: must not panic.
		e.RecoverIPv4ID(pkt)
		if len(pkt) < BTHLen+ICRCLen || len(pkt) > 9000 {
			return
		}
		e.IPv4ID = id
		e.PutICRC(pkt)
		e.IPv4ID = 0
		got, ok := e.RecoverIPv4ID(pkt)
		if !ok || got != id {
			t.Fatalf("recovered %#x,%v want %#x", got, ok, id)
		}
		e.IPv4ID = got
		if !e.VerifyICRC(pkt) {
			t.Fatal("recovered ID does not verify")
		}
	})
}
