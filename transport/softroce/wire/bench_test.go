package wire

import (
	"net/netip"
	"testing"
)

func benchPkt(b *testing.B, n int) (Encap, []byte) {
	p, err := Layout(make([]byte, 4200), RCRDMAWriteMiddle, n)
	if err != nil {
		b.Fatal(err)
	}
	e := Encap{Src: netip.MustParseAddrPort("10.0.0.1:49152"), Dst: netip.MustParseAddrPort("10.0.0.2:4791"), IPv4ID: 0x1234}
	e.PutICRC(p.Bytes())
	return e, p.Bytes()
}

// BenchmarkICRC4096: compute the ICRC of an MTU-4096 packet (what Send does).
func BenchmarkICRC4096(b *testing.B) {
	e, pkt := benchPkt(b, 4096)
	b.SetBytes(int64(len(pkt)))
	b.ReportAllocs()
	for b.Loop() {
		e.PutICRC(pkt)
	}
}

// BenchmarkRecoverIPv4ID4096: what an IPv4 Recv does per packet (ICRC pass + recovery).
func BenchmarkRecoverIPv4ID4096(b *testing.B) {
	e, pkt := benchPkt(b, 4096)
	b.SetBytes(int64(len(pkt)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := e.RecoverIPv4ID(pkt); !ok {
			b.Fatal("no ID")
		}
	}
}

// BenchmarkRecoverIPv4IDAck: recovery on a 20-byte ACK (fixed cost dominates).
func BenchmarkRecoverIPv4IDAck(b *testing.B) {
	p, _ := Layout(make([]byte, 64), RCAcknowledge, 0)
	e := Encap{Src: netip.MustParseAddrPort("10.0.0.1:49152"), Dst: netip.MustParseAddrPort("10.0.0.2:4791"), IPv4ID: 7}
	e.PutICRC(p.Bytes())
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := e.RecoverIPv4ID(p.Bytes()); !ok {
			b.Fatal("no ID")
		}
	}
}

func BenchmarkParse(b *testing.B) {
	_, pkt := benchPkt(b, 4096)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(pkt); err != nil {
			b.Fatal(err)
		}
	}
}
