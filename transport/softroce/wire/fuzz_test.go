package wire

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/srpd/srpd/internal/fuzzbound"
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

// encodeFields encodes src's fields into dst, a header of the same kind, and returns dst.
func encodeFields[F any, H ~[]byte](dst, src H, fields func(H) F, encode func(H, *F)) []byte {
	f := fields(src)
	encode(dst, &f)
	return []byte(dst)
}

func FuzzParse(f *testing.F) {
	seedPackets(f)
	f.Add([]byte{})
	f.Add(make([]byte, 16))
	fuzzbound.Fuzz(f, func(t *testing.T, b []byte) {
		p, err := Parse(b)
		if err != nil {
			var we Error
			if !errors.As(err, &we) {
				t.Errorf("untyped error %v", err)
				return
			}
			return
		}
		// Invariants of a parsed packet.
		if p.Len() != len(b) || p.HeaderLen() != p.Opcode().HeaderLen() {
			t.Error("lengths")
			return
		}
		if p.HeaderLen()+p.PayloadLen()+len(p.Pad())+ICRCLen != len(b) || p.PayloadLen() < 0 {
			t.Error("partition")
			return
		}
		if (p.PayloadLen()+len(p.Pad()))%4 != 0 {
			t.Error("alignment")
			return
		}
		op := p.Opcode()
		for _, v := range [][]byte{p.RDETH(), p.DETH(), p.RETH(), p.AtomicETH(), p.AETH(), p.AtomicAckETH(), p.ImmDt(), p.IETH(), p.FETH()} {
			if v != nil && len(v) == 0 {
				t.Error("empty view")
				return
			}
		}
		if (p.RETH() != nil) != op.Is(HasRETH) || (p.AETH() != nil) != op.Is(HasAETH) || (p.DETH() != nil) != op.Is(HasDETH) {
			t.Error("view presence")
			return
		}
		_ = p.BTH().Fields()
		if m := p.MAD(); m != nil {
			_ = m.Fields()
		}
		_ = p.ICRC()
		// Re-encoding the BTH from its fields gives the same bytes except reserved bits.
		c := encodeFields(make(BTH, BTHLen), p.BTH(), BTH.Fields, BTH.Encode)
		want := append([]byte(nil), b[:BTHLen]...)
		want[4] &= 0xC0
		want[8] &= 0x80
		if string(c) != string(want) {
			t.Errorf("BTH re-encode %x != %x", c, want)
			return
		}
	})
}

func FuzzBTH(f *testing.F) {
	f.Add([]byte("\x04\x00\xff\xff\x00\x00\x00\x11\x80\x00\x01\x00"))
	fuzzbound.Fuzz(f, func(t *testing.T, b []byte) {
		if len(b) < BTHLen {
			return
		}
		h := BTH(b[:BTHLen])
		fl := h.Fields()
		c := make(BTH, BTHLen)
		c.Encode(&fl)
		if c.Fields() != fl {
			t.Error("BTH round trip")
			return
		}
		if fl.DestQP > qpnMask || !fl.PSN.Valid() || fl.PadCount > 3 || fl.TVer > 15 {
			t.Error("field range")
			return
		}
	})
}

func FuzzRETH(f *testing.F) {
	f.Add(make([]byte, RETHLen))
	fuzzbound.Fuzz(f, func(t *testing.T, b []byte) {
		if len(b) < RETHLen {
			return
		}
		if c := encodeFields(make(RETH, RETHLen), RETH(b), RETH.Fields, RETH.Encode); string(c) != string(b[:RETHLen]) {
			t.Error("RETH round trip")
			return
		}
	})
}

func FuzzAETH(f *testing.F) {
	f.Add([]byte{0x1f, 0, 0, 1})
	f.Add([]byte{0x61, 0, 0, 1})
	fuzzbound.Fuzz(f, func(t *testing.T, b []byte) {
		if len(b) < AETHLen {
			return
		}
		a := AETH(b)
		if c := encodeFields(make(AETH, AETHLen), a, AETH.Fields, AETH.Encode); string(c) != string(b[:AETHLen]) {
			t.Error("AETH round trip")
			return
		}
		s := a.Syndrome()
		_ = s.String()
		switch s.Type() {
		case SyndromeACK:
			if n, ok := s.Credits(); ok && (n < 0 || n > 30) {
				t.Error("credits")
				return
			}
		case SyndromeRNRNAK:
			if s.RNRTimer() > 31 || s.RNRTimer().Duration() <= 0 {
				t.Error("rnr")
				return
			}
		case SyndromeNAK:
			if s.NakCode().Syndrome() != s {
				t.Error("nak")
				return
			}
		}
	})
}

func FuzzDETH(f *testing.F) {
	f.Add([]byte{0x80, 1, 0, 0, 0, 0, 0, 1})
	fuzzbound.Fuzz(f, func(t *testing.T, b []byte) {
		if len(b) < DETHLen {
			return
		}
		c := encodeFields(make(DETH, DETHLen), DETH(b), DETH.Fields, DETH.Encode)
		want := append([]byte(nil), b[:DETHLen]...)
		want[4] = 0
		if string(c) != string(want) {
			t.Error("DETH round trip")
			return
		}
	})
}

func FuzzSmallHeaders(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28})
	fuzzbound.Fuzz(f, func(t *testing.T, b []byte) {
		if len(b) >= 4 {
			i, m := IETH(b), ImmDt(b)
			c := make(IETH, 4)
			c.SetRKey(i.RKey())
			d := make(ImmDt, 4)
			d.SetImm(m.Imm())
			if string(c) != string(b[:4]) || string(d) != string(b[:4]) {
				t.Error("IETH/ImmDt")
				return
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
				t.Error("AtomicETH")
				return
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
	fuzzbound.Fuzz(f, func(t *testing.T, b []byte) {
		m, err := ParseMAD(b)
		if err != nil {
			if len(b) >= MADHeaderLen {
				t.Error("rejected a full header")
				return
			}
			return
		}
		c := encodeFields(make(MAD, MADHeaderLen), m, MAD.Fields, MAD.Encode)
		want := append([]byte(nil), b[:MADHeaderLen]...)
		want[18], want[19] = 0, 0
		if string(c) != string(want) {
			t.Error("MAD round trip")
			return
		}
	})
}

func FuzzParseEncap(f *testing.F) {
	for _, v := range icrcVectors {
		f.Add(unhex(f, v.ip))
	}
	fuzzbound.Fuzz(f, func(t *testing.T, b []byte) {
		e, hl, plen, err := ParseEncap(b)
		if err != nil {
			var we Error
			if !errors.As(err, &we) {
				t.Errorf("untyped error %v", err)
			}
			return
		}
		if hl != e.HeaderLen() || plen < 0 || !e.Valid() || e.Is4() != (b[0]>>4 == 4) {
			t.Errorf("ParseEncap invariants: hl %d (Encap says %d), plen %d, valid %v, Is4 %v for IP version %d",
				hl, e.HeaderLen(), plen, e.Valid(), e.Is4(), b[0]>>4)
			return
		}
		// The Encap describes the header it came from: PutHeaders gives the same bytes but
		// for the checksums (recomputed / written as 0) and a hop limit of 0 (means 64).
		hdr := make([]byte, hl)
		if _, err := e.PutHeaders(hdr, make([]byte, plen)); err != nil {
			if !errors.Is(err, ErrPayloadTooLarge) {
				t.Errorf("PutHeaders of a parsed Encap: %v", err)
			}
			return
		}
		want := append([]byte(nil), b[:hl]...)
		want[hl-2], want[hl-1] = 0, 0
		if e.Is4() {
			copy(want[10:12], hdr[10:12])
			if want[8] == 0 {
				want[8] = 64
			}
		} else if want[7] == 0 {
			want[7] = 64
		}
		if string(hdr) != string(want) {
			t.Errorf("PutHeaders(ParseEncap(h)) = %x, want %x", hdr, want)
			return
		}
		if len(b) >= hl+plen && plen >= BTHLen+ICRCLen {
			pkt := b[hl : hl+plen]
			got, err := ICRCFromHeaders(b[:hl-UDPHeaderLen], b[hl-UDPHeaderLen:hl], pkt)
			if err != nil || got != e.ICRC(pkt) {
				t.Errorf("ICRCFromHeaders %#x (%v) != Encap.ICRC %#x", got, err, e.ICRC(pkt))
				return
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
		fuzzbound.Run(t, func() {
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
				t.Errorf("recovered %#x,%v want %#x", got, ok, id)
				return
			}
			e.IPv4ID = got
			if !e.VerifyICRC(pkt) {
				t.Error("recovered ID does not verify")
				return
			}
		})
	})
}
