package cm

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/srpd/srpd/transport"
)

// ECE in REQ and REP: where the bytes go (torvalds/linux:include/rdma/ibta_vol1_c12.h
// CM_REQ_VENDOR_ID at REQ body offset 5 (bytes 29-31 of the MAD), CM_REP_VENDOR_ID_{H,M,L}
// at 15, 19, 23 (39, 43, 47); attr_mod in the MAD header, cm.c cm_format_mad_ece_hdr) and
// what the other side reads back (RequestInfo.ECE, the RTR QPUpdate's PeerECE).
func TestECEOnTheWire(t *testing.T) {
	newM := func(guid uint64) *Manager {
		m, err := NewManager(Config{GUID: guid, Rand: rand.NewPCG(guid, 1)})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	a, b := newM(0xa), newM(0xb)
	aAddr, bAddr := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	if err := b.Listen(netip.Addr{}, 5555); err != nil {
		t.Fatal(err)
	}
	offer := ECE{VendorID: 0x0A5250, AttrMod: 0x80000001}
	agree := ECE{VendorID: 0x123456, AttrMod: 0x00000002}
	var ao, bo Outputs
	if _, err := a.Dial(0, &DialParams{LocalAddr: aAddr, RemoteAddr: bAddr, DstPort: 5555, QPN: 0x11,
		Param: transport.ConnParam{ResponderResources: 1, InitiatorDepth: 1}, ECE: offer}, &ao); err != nil {
		t.Fatal(err)
	}
	if len(ao.MADs) != 1 {
		t.Fatalf("dial sent %d MADs", len(ao.MADs))
	}
	req := ao.MADs[0].MAD[:]
	if got := [3]byte(req[29:32]); got != [3]byte{0x0A, 0x52, 0x50} {
		t.Fatalf("REQ vendor ID bytes 29-31 = % x", got)
	}
	if got := binary.BigEndian.Uint32(req[20:]); got != offer.AttrMod {
		t.Fatalf("REQ attribute modifier %#x, want %#x", got, offer.AttrMod)
	}
	if err := b.HandleMAD(0, aAddr, bAddr, req, &bo); err != nil {
		t.Fatal(err)
	}
	var reqEv *Event
	for i := range bo.Events {
		if bo.Events[i].Kind == EventRequest {
			reqEv = &bo.Events[i]
		}
	}
	if reqEv == nil || reqEv.Request.ECE != offer {
		t.Fatalf("request event %+v; want ECE %+v", reqEv, offer)
	}
	id := reqEv.Conn
	bo.Reset()
	if err := b.Accept(0, id, &AcceptParams{QPN: 0x22, ECE: agree}, &bo); err != nil {
		t.Fatal(err)
	}
	if rtr := rtrUpdate(bo.QP); rtr == nil || rtr.PeerECE != offer {
		t.Fatalf("passive RTR update %+v; want PeerECE %+v", rtr, offer)
	}
	var rep []byte
	for i := range bo.MADs {
		if be16(bo.MADs[i].MAD[16:]) == AttrREP {
			rep = bo.MADs[i].MAD[:]
		}
	}
	if rep == nil {
		t.Fatal("accept sent no REP")
	}
	if rep[39] != 0x12 || rep[43] != 0x34 || rep[47] != 0x56 || binary.BigEndian.Uint32(rep[20:]) != agree.AttrMod {
		t.Fatalf("REP vendor bytes %x %x %x, attribute modifier %#x", rep[39], rep[43], rep[47], binary.BigEndian.Uint32(rep[20:]))
	}
	ao.Reset()
	if err := a.HandleMAD(0, bAddr, aAddr, rep, &ao); err != nil {
		t.Fatal(err)
	}
	if rtr := rtrUpdate(ao.QP); rtr == nil || rtr.PeerECE != agree {
		t.Fatalf("active RTR update %+v; want PeerECE %+v", rtr, agree)
	}
}

func rtrUpdate(us []QPUpdate) *QPUpdate {
	for i := range us {
		if us[i].Mask&transport.AttrState != 0 && us[i].Attr.State == transport.QPSRTR {
			return &us[i]
		}
	}
	return nil
}
