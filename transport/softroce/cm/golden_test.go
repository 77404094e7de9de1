package cm

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
)

// Golden replays: our Manager plays each side of the captured kernel exchanges and must emit
// the kernel's MADs byte for byte, once the fields that are random by design (comm IDs,
// starting PSNs, and the TID derived from the comm ID) are replaced by the captured ones.

var (
	ipIni = netip.MustParseAddr("10.77.0.2")
	ipTgt = netip.MustParseAddr("10.77.0.1")
)

func newMgr(t *testing.T, guid uint64) *Manager {
	m, err := NewManager(Config{GUID: guid, HiTID: 2, Rand: rand.NewPCG(7, 8)})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// patch copies the given byte ranges of want into got.
func patch(got, want []byte, ranges ...[2]int) []byte {
	g := bytes.Clone(got)
	for _, r := range ranges {
		copy(g[r[0]:r[1]], want[r[0]:r[1]])
	}
	return g
}

var (
	rTID     = [2]int{8, 16}
	rLocalID = [2]int{24, 28}
)

func sameMAD(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%s: first difference at MAD byte %d: got %#02x want %#02x", what, i, got[i], want[i])
				break
			}
		}
		t.Errorf("%s differs from the kernel's\n got %x\nwant %x", what, got, want)
	}
}

func oneMAD(t *testing.T, o *Outputs, attr uint16) []byte {
	t.Helper()
	var r []byte
	for i := range o.MADs {
		if o.MADs[i].Attr() == attr {
			if r != nil {
				t.Fatalf("two %s", AttrName(attr))
			}
			r = bytes.Clone(o.MADs[i].MAD[:])
		}
	}
	if r == nil {
		t.Fatalf("no %s in %d MADs", AttrName(attr), len(o.MADs))
	}
	return r
}

func lastQP(t *testing.T, o *Outputs, st transport.QPState) transport.QPAttr {
	t.Helper()
	for i := len(o.QP) - 1; i >= 0; i-- {
		if o.QP[i].Attr.State == st {
			return o.QP[i].Attr
		}
	}
	t.Fatalf("no update to %v", st)
	return transport.QPAttr{}
}

// TestGoldenActive: we dial as ib_srp did (REQ), take the kernel target's REP (RTU) and
// disconnect (DREQ).
// field is one decoded value and what it should be.
type field struct {
	name      string
	got, want any
}

// checkFields reports every field whose value is not the one wanted.
func checkFields(t *testing.T, fields []field) {
	t.Helper()
	for _, f := range fields {
		if f.got != f.want {
			t.Errorf("%s: got %#v, want %#v", f.name, f.got, f.want)
		}
	}
}

func TestGoldenActive(t *testing.T) {
	kREQ := madsOf(t, pcapLogin, AttrREQ)[0].mad
	kREP := madsOf(t, pcapLogin, AttrREP)[0].mad
	kRTU := madsOf(t, pcapLogin, AttrRTU)[0].mad
	kDREQ := madsOf(t, pcapLogin, AttrDREQ)[0].mad
	m := newMgr(t, 0x505400fffe770002)
	var o Outputs
	id, err := m.Dial(0, &DialParams{
		LocalAddr: ipIni, RemoteAddr: ipTgt, SrcPort: 0xd010, DstPort: 5555, QPN: 0x11,
		PrivateData: REQ(kREQ).PrivateData()[CMAHeaderLen:], Param: srpParam,
		PathMTU: transport.MTU1024,
	}, &o)
	if err != nil {
		t.Fatal(err)
	}
	req := oneMAD(t, &o, AttrREQ)
	if o.MADs[0].Dst != ipTgt || o.MADs[0].Src != ipIni {
		t.Errorf("REQ addressed %v -> %v", o.MADs[0].Src, o.MADs[0].Dst)
	}
	if be64(req[8:]) != TID(2, uint32(id)) || REQ(req).LocalCommID() != uint32(id) || id == 0 {
		t.Fatalf("TID %#x for comm ID %#x", be64(req[8:]), uint32(id))
	}
	ourPSN := REQ(req).StartingPSN()
	sameMAD(t, "REQ", patch(req, kREQ, rTID, rLocalID, [2]int{68, 71}), kREQ)
	if u := o.QP[0]; u.Attr.State != transport.QPSInit || u.Attr.AccessFlags != transport.AccessRemoteWrite|transport.AccessRemoteRead|transport.AccessRemoteAtomic {
		t.Errorf("INIT update %+v", u)
	}

	// The target's REP, addressed to our comm ID.
	o.Reset()
	rep := bytes.Clone(kREP)
	REP(rep).SetRemoteCommID(uint32(id))
	if err := m.HandleMAD(100, ipTgt, ipIni, rep, &o); err != nil {
		t.Fatal(err)
	}
	rtu := oneMAD(t, &o, AttrRTU)
	sameMAD(t, "RTU", patch(rtu, kRTU, rTID, rLocalID), kRTU)
	if len(o.Events) != 1 || o.Events[0].Kind != EventEstablished || !bytes.Equal(o.Events[0].PrivateData, REP(kREP).PrivateData()) {
		t.Errorf("events %+v", o.Events)
	}
	rtr, rts := lastQP(t, &o, transport.QPSRTR), lastQP(t, &o, transport.QPSRTS)
	checkFields(t, []field{
		{"RTR rq_psn = our REQ PSN", rtr.RQPSN, ourPSN},
		{"RTS sq_psn = REP PSN", rts.SQPSN, uint32(0x589d24)},
		{"dest QPN", rtr.DestQPN, uint32(0x11)},
		{"path MTU", rtr.PathMTU, transport.MTU1024},
		{"max_dest_rd_atomic = REP initiator depth", rtr.MaxDestRdAtomic, uint8(4)},
		{"max_rd_atomic = REP responder resources", rts.MaxRdAtomic, uint8(4)},
		{"min_rnr_timer", rtr.MinRNRTimer, uint8(0)},
		{"retry_cnt", rts.RetryCnt, uint8(7)},
		{"rnr_retry = REP RNR retry", rts.RNRRetry, uint8(7)},
		{"timeout = cm_ack_timeout(15, 18)", rts.Timeout, uint8(19)},
		{"AV", rtr.AV, transport.AddressVector{SrcAddr: ipIni, DstAddr: ipTgt, FlowLabel: 0x947a3, HopLimit: 64}},
	})

	// Disconnect: QP to ERR, then the DREQ.
	o.Reset()
	if err := m.Disconnect(200, id, nil, &o); err != nil {
		t.Fatal(err)
	}
	dreq := oneMAD(t, &o, AttrDREQ)
	sameMAD(t, "DREQ", patch(dreq, kDREQ, rTID, rLocalID), kDREQ)
	if len(o.QP) != 1 || o.QP[0].Attr.State != transport.QPSErr {
		t.Errorf("QP updates %+v", o.QP)
	}
}

// TestGoldenPassive: we answer ib_srp's REQ as ib_srpt did (REP), take its RTU and DREQ
// (DREP); and reject a login as ib_srpt did (REJ with SRP_LOGIN_REJ).
func TestGoldenPassive(t *testing.T) {
	kREQ := madsOf(t, pcapLogin, AttrREQ)[0].mad
	kREP := madsOf(t, pcapLogin, AttrREP)[0].mad
	kRTU := madsOf(t, pcapLogin, AttrRTU)[0].mad
	kDREQ := madsOf(t, pcapLogin, AttrDREQ)[0].mad
	kDREP := madsOf(t, pcapLogin, AttrDREP)[0].mad
	m := newMgr(t, 0x505400fffe770001)
	if err := m.Listen(ipTgt, 5555); err != nil {
		t.Fatal(err)
	}
	var o Outputs
	if err := m.HandleMAD(0, ipIni, ipTgt, kREQ, &o); err != nil {
		t.Fatal(err)
	}
	if len(o.Events) != 1 || o.Events[0].Kind != EventRequest || len(o.MADs) != 0 {
		t.Fatalf("outputs %+v", o)
	}
	e := o.Events[0]
	if !bytes.Equal(e.PrivateData, REQ(kREQ).PrivateData()[CMAHeaderLen:]) ||
		e.Request.RemoteAddr != netip.AddrPortFrom(ipIni, 0xd010) ||
		e.Request.LocalAddr != netip.AddrPortFrom(ipTgt, 5555) ||
		e.Request.Listener != netip.AddrPortFrom(ipTgt, 5555) {
		t.Errorf("request %+v", e)
	}
	id := e.Conn
	o.Reset()
	if err := m.Accept(10, id, &AcceptParams{QPN: 0x11, PrivateData: REP(kREP).PrivateData(),
		Param: transport.ConnParam{ResponderResources: 4, InitiatorDepth: 4, FlowControl: true, RNRRetryCount: 7}}, &o); err != nil {
		t.Fatal(err)
	}
	rep := oneMAD(t, &o, AttrREP)
	ourPSN := REP(rep).StartingPSN()
	sameMAD(t, "REP", patch(rep, kREP, rLocalID, [2]int{44, 47}), kREP)
	if o.MADs[0].Dst != ipIni {
		t.Errorf("REP to %v", o.MADs[0].Dst)
	}
	// QP updates in INIT, RTR, RTS order with the kernel's derivation.
	if len(o.QP) != 3 || o.QP[0].Attr.State != transport.QPSInit || o.QP[1].Attr.State != transport.QPSRTR || o.QP[2].Attr.State != transport.QPSRTS {
		t.Fatalf("QP updates %+v", o.QP)
	}
	rtr, rts := o.QP[1].Attr, o.QP[2].Attr
	checkFields(t, []field{
		{"access", o.QP[0].Attr.AccessFlags, transport.AccessRemoteWrite | transport.AccessRemoteRead | transport.AccessRemoteAtomic},
		{"RTR rq_psn = our REP PSN", rtr.RQPSN, ourPSN},
		{"RTS sq_psn = REQ PSN", rts.SQPSN, uint32(0x05b979)},
		{"dest QPN", rtr.DestQPN, uint32(0x11)},
		{"path MTU from REQ", rtr.PathMTU, transport.MTU1024},
		{"max_dest_rd_atomic", rtr.MaxDestRdAtomic, uint8(4)},
		{"max_rd_atomic", rts.MaxRdAtomic, uint8(4)},
		{"retry_cnt from REQ", rts.RetryCnt, uint8(7)},
		{"rnr_retry from REQ", rts.RNRRetry, uint8(7)},
		{"timeout = REQ local ACK timeout", rts.Timeout, uint8(19)},
		{"AV", rtr.AV, transport.AddressVector{SrcAddr: ipTgt, DstAddr: ipIni, FlowLabel: 0x947a3, HopLimit: 64}},
	})

	// RTU → established.
	o.Reset()
	rtu := bytes.Clone(kRTU)
	RTU(rtu).SetRemoteCommID(uint32(id))
	if err := m.HandleMAD(20, ipIni, ipTgt, rtu, &o); err != nil {
		t.Fatal(err)
	}
	if len(o.Events) != 1 || o.Events[0].Kind != EventEstablished {
		t.Fatalf("events %+v", o.Events)
	}
	// DREQ → QP to ERR, DREP, DISCONNECTED.
	o.Reset()
	dreq := bytes.Clone(kDREQ)
	DREQ(dreq).SetRemoteCommID(uint32(id))
	if err := m.HandleMAD(30, ipIni, ipTgt, dreq, &o); err != nil {
		t.Fatal(err)
	}
	drep := oneMAD(t, &o, AttrDREP)
	sameMAD(t, "DREP", patch(drep, kDREP, rLocalID), kDREP)
	if len(o.Events) != 1 || o.Events[0].Kind != EventDisconnected || len(o.QP) != 1 || o.QP[0].Attr.State != transport.QPSErr {
		t.Errorf("outputs %+v", o)
	}
	// Timewait lasts ms(19) = 2.048 s.
	if d, ok := m.NextDeadline(); !ok || d != 30+TimeoutDuration(19) {
		t.Errorf("timewait deadline %v %v", d, ok)
	}

	// Until timewait ends, a REQ from the same (CA GUID, QPN) is stale; afterwards it is new.
	o.Reset()
	if err := m.HandleMAD(31, ipIni, ipTgt, madsOf(t, pcapReject, AttrREQ)[0].mad, &o); err != nil {
		t.Fatal(err)
	}
	if r := REJ(oneMAD(t, &o, AttrREJ)); r.Reason() != uint16(transport.RejectStaleConn) || len(o.Events) != 0 {
		t.Fatalf("REQ reusing QPN 0x11 during timewait: reason %d, events %+v", r.Reason(), o.Events)
	}
	o.Reset()
	m.Expire(time.Minute, &o)
	if len(o.Events) != 1 || o.Events[0].Kind != EventTimewaitExit || m.NumConns() != 0 {
		t.Fatalf("timewait exit: %+v", o.Events)
	}

	// The rejected logins: REJ (reason 28, SRP_LOGIN_REJ) identical to ib_srpt's, for each.
	rejREQs, rejREJs := madsOf(t, pcapReject, AttrREQ), madsOf(t, pcapReject, AttrREJ)
	for i := range rejREQs {
		o.Reset()
		if err := m.HandleMAD(40, ipIni, ipTgt, rejREQs[i].mad, &o); err != nil {
			t.Fatal(err)
		}
		if len(o.Events) != 1 || o.Events[0].Kind != EventRequest {
			t.Fatalf("REQ %d: %+v", i, o.Events)
		}
		rid := o.Events[0].Conn
		o.Reset()
		if err := m.Reject(41, rid, transport.RejectConsumerDefined, REJ(rejREJs[i].mad).PrivateData(), &o); err != nil {
			t.Fatal(err)
		}
		sameMAD(t, "REJ", oneMAD(t, &o, AttrREJ), rejREJs[i].mad) // nothing random in it
		if _, ok := m.Conn(rid); ok {
			t.Error("rejected connection kept")
		}
	}
}
