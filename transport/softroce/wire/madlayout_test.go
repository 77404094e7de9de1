package wire

import (
	"bytes"
	"testing"
)

func TestLayoutMAD(t *testing.T) {
	mad := make([]byte, MADLen)
	for i := range mad {
		mad[i] = byte(i)
	}
	buf := make([]byte, PacketLen(UDSendOnly, MADLen))
	p, err := LayoutMAD(buf, 0x123456, mad)
	if err != nil {
		t.Fatal(err)
	}
	b, d := p.BTH(), p.DETH()
	if Opcode(p.Bytes()[0]) != UDSendOnly || b.PKey() != DefaultPKey || b.DestQP() != QPGSI || !b.AckReq() ||
		b.PSN() != 0x123456 || d.QKey() != GSIQKey || d.SrcQP() != QPGSI {
		t.Fatalf("headers: BTH %+v DETH %+v", b.Fields(), d.Fields())
	}
	if !bytes.Equal(p.Payload(), mad) || p.MAD() == nil {
		t.Fatalf("payload is not the MAD")
	}
	if _, err := LayoutMAD(buf[:10:10], 0, mad); err == nil {
		t.Fatal("a buffer too short for the packet was accepted")
	}
}
