package cm

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/srpd/srpd/transport/softroce/internal/pcapfile"
	"github.com/srpd/srpd/transport/softroce/wire"
)

const (
	pcapLogin  = "../testdata/srp-rdma-cm-login-io.pcap"
	pcapReject = "../testdata/srp-login-rejected-no-acl.pcap"
)

// capMAD is a CM MAD found in a capture.
type capMAD struct {
	frame    int
	src, dst netip.Addr
	mad      []byte
}

// loadMADs returns every UD SEND to QP1 in an Ethernet/IPv4 capture (MAD at frame offset 62:
// Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + DETH 8).
func loadMADs(t testing.TB, path string) []capMAD {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapfile.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var out []capMAD
	buf := make([]byte, 65536)
	for n := 1; ; n++ {
		data, _, _, err := r.Next(buf)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(data) < 62+MADLen || data[12] != 0x08 || data[13] != 0x00 {
			continue
		}
		bth := wire.BTH(data[42:])
		if bth.Opcode() != wire.UDSendOnly || bth.DestQP() != wire.QPGSI {
			continue
		}
		deth := wire.DETH(data[54:])
		if deth.QKey() != wire.GSIQKey || deth.SrcQP() != wire.QPGSI {
			t.Fatalf("frame %d: DETH %+v", n, deth.Fields())
		}
		out = append(out, capMAD{
			frame: n,
			src:   netip.AddrFrom4([4]byte(data[26:30])),
			dst:   netip.AddrFrom4([4]byte(data[30:34])),
			mad:   bytes.Clone(data[62 : 62+MADLen]),
		})
	}
	if len(out) == 0 {
		t.Fatalf("%s: no MADs", path)
	}
	return out
}

func madsOf(t testing.TB, path string, attr uint16) []capMAD {
	var r []capMAD
	for _, m := range loadMADs(t, path) {
		if be16(m.mad[16:]) == attr {
			r = append(r, m)
		}
	}
	return r
}

func fromHex(t testing.TB, s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCaptureReencode decodes every CM MAD of both captures into its Fields struct and encodes
// it again: the same 256 bytes must come out.
func TestCaptureReencode(t *testing.T) {
	seen := map[string]int{}
	for _, path := range []string{pcapLogin, pcapReject} {
		for _, c := range loadMADs(t, path) {
			m, err := Check(c.mad)
			if err != nil {
				t.Fatalf("%s frame %d: %v", path, c.frame, err)
			}
			out := make([]byte, MADLen)
			h := m.Fields()
			wire.MAD(out).Encode(&h)
			switch m.AttributeID() {
			case AttrREQ:
				f := REQ(m).Fields()
				REQ(out).Encode(&f)
			case AttrREP:
				f := REP(m).Fields()
				REP(out).Encode(&f)
			case AttrRTU:
				f := RTU(m).Fields()
				RTU(out).Encode(&f)
			case AttrREJ:
				f := REJ(m).Fields()
				REJ(out).Encode(&f)
			case AttrDREQ:
				f := DREQ(m).Fields()
				DREQ(out).Encode(&f)
			case AttrDREP:
				f := DREP(m).Fields()
				DREP(out).Encode(&f)
			default:
				t.Fatalf("%s frame %d: unexpected %s", path, c.frame, AttrName(m.AttributeID()))
			}
			if !bytes.Equal(out, c.mad) {
				t.Errorf("%s frame %d %s: re-encoded MAD differs\n got %x\nwant %x",
					path, c.frame, AttrName(m.AttributeID()), out, c.mad)
			}
			seen[AttrName(m.AttributeID())]++
		}
	}
	for _, a := range []string{"REQ", "REP", "RTU", "REJ", "DREQ", "DREP"} {
		if seen[a] == 0 {
			t.Errorf("no %s in the captures", a)
		}
	}
	t.Logf("re-encoded byte-exact: %v", seen)
}

// TestCaptureValues pins the concrete values of the kernel exchanges (ib_srp → ib_srpt over
// rxe, 10.77.0.2 → 10.77.0.1, RDMA CM port 5555).
func TestCaptureValues(t *testing.T) {
	ini, tgt := netip.MustParseAddr("10.77.0.2"), netip.MustParseAddr("10.77.0.1")
	reqs := madsOf(t, pcapLogin, AttrREQ)
	if len(reqs) != 1 {
		t.Fatalf("%d REQs", len(reqs))
	}
	req, err := ParseREQ(reqs[0].mad)
	if err != nil {
		t.Fatal(err)
	}
	pp := req.PrimaryPath()
	hdr, err := ParseCMAHeader(req.PrivateData())
	if err != nil {
		t.Fatal(err)
	}
	rep, _ := ParseREP(madsOf(t, pcapLogin, AttrREP)[0].mad)
	rtu, _ := ParseRTU(madsOf(t, pcapLogin, AttrRTU)[0].mad)
	dreq, _ := ParseDREQ(madsOf(t, pcapLogin, AttrDREQ)[0].mad)
	drep, _ := ParseDREP(madsOf(t, pcapLogin, AttrDREP)[0].mad)
	rejs := madsOf(t, pcapReject, AttrREJ)
	rejReqs := madsOf(t, pcapReject, AttrREQ)
	rej, _ := ParseREJ(rejs[0].mad)
	rejReq, _ := ParseREQ(rejReqs[0].mad)
	login := req.PrivateData()[CMAHeaderLen:]

	rows := []field{
		// Common header / TIDs: cm_form_tid = hi_tid 2 << 32 | byte-swapped comm ID.
		{"REQ TID", wire.MAD(req).TransactionID(), uint64(0x000000028732dd29)},
		{"REQ TID = TID(2, comm ID)", wire.MAD(req).TransactionID(), TID(2, req.LocalCommID())},
		{"REP echoes REQ TID", wire.MAD(rep).TransactionID(), wire.MAD(req).TransactionID()},
		{"RTU echoes REQ TID", wire.MAD(rtu).TransactionID(), wire.MAD(req).TransactionID()},
		{"DREQ TID = cm_form_tid", wire.MAD(dreq).TransactionID(), TID(2, dreq.LocalCommID())},
		{"DREP echoes DREQ TID", wire.MAD(drep).TransactionID(), wire.MAD(dreq).TransactionID()},
		{"REJ echoes REQ TID", wire.MAD(rej).TransactionID(), wire.MAD(rejReq).TransactionID()},
		{"attr mod", wire.MAD(req).AttributeModifier(), uint32(0)},
		// REQ.
		{"REQ local comm ID", req.LocalCommID(), uint32(0x29dd3287)},
		{"REQ vendor ID", req.VendorID(), uint32(0)},
		{"REQ service ID", req.ServiceID(), uint64(0x00000000010615B3)},
		{"REQ service ID = ServiceID(TCP, 5555)", req.ServiceID(), ServiceID(PortSpaceTCP, 5555)},
		{"REQ local CA GUID", req.LocalCAGUID(), uint64(0x505400fffe770002)},
		{"REQ Q_Key", req.LocalQKey(), uint32(0)},
		{"REQ local QPN", req.LocalQPN(), uint32(0x11)},
		{"REQ responder resources", req.ResponderResources(), uint8(4)},
		{"REQ initiator depth", req.InitiatorDepth(), uint8(0)},
		{"REQ remote CM response timeout", req.RemoteCMResponseTimeout(), uint8(20)},
		{"REQ transport RC", req.TransportServiceType(), uint8(0)},
		{"REQ flow control", req.EndToEndFlowControl(), true},
		{"REQ starting PSN", req.StartingPSN(), uint32(0x05b979)},
		{"REQ local CM response timeout", req.LocalCMResponseTimeout(), uint8(20)},
		{"REQ retry count", req.RetryCount(), uint8(7)},
		{"REQ P_Key", req.PartitionKey(), uint16(0xFFFF)},
		{"REQ MTU (1024)", req.PathMTU(), uint8(3)},
		{"REQ RDC exists", req.RDCExists(), false},
		{"REQ RNR retry", req.RNRRetryCount(), uint8(7)},
		{"REQ max CM retries", req.MaxCMRetries(), uint8(15)},
		{"REQ SRQ", req.SRQ(), false},
		{"REQ ext transport", req.ExtendedTransportType(), uint8(0)},
		{"REQ local LID", pp.LocalLID(), uint16(0xFFFF)},
		{"REQ remote LID", pp.RemoteLID(), uint16(0xFFFF)},
		{"REQ local GID", pp.LocalGID(), [16]byte(netip.MustParseAddr("::ffff:10.77.0.2").As16())},
		{"REQ remote GID", pp.RemoteGID(), [16]byte(netip.MustParseAddr("::ffff:10.77.0.1").As16())},
		{"REQ local GID addr", pp.LocalAddr(), ini},
		{"REQ remote GID addr", pp.RemoteAddr(), tgt},
		{"REQ flow label", pp.FlowLabel(), uint32(0x947a3)},
		{"REQ flow label = (sport*31+dport)&0xFFFFF", pp.FlowLabel(), FlowLabel(0xd010, 5555)},
		{"REQ packet rate", pp.PacketRate(), uint8(0)},
		{"REQ traffic class", pp.TrafficClass(), uint8(0)},
		{"REQ hop limit", pp.HopLimit(), uint8(64)},
		{"REQ SL", pp.SL(), uint8(0)},
		{"REQ subnet local", pp.SubnetLocal(), false},
		{"REQ local ACK timeout", pp.LocalACKTimeout(), uint8(19)},
		{"REQ local ACK timeout = cm_ack_timeout(15, 18)", pp.LocalACKTimeout(), AckTimeout(15, 18)},
		{"REQ no alternate path", req.HasAlternatePath(), false},
		{"REQ alternate path zero", bytes.Count(req.AlternatePath(), []byte{0}), 44},
		// RDMA CM header.
		{"CMA version", hdr.Version(), uint8(0)},
		{"CMA IP version", hdr.IPVersion(), uint8(4)},
		{"CMA source port", hdr.SrcPort(), uint16(0xd010)},
		{"CMA source IP", hdr.SrcAddr(), ini},
		{"CMA destination IP", hdr.DstAddr(), tgt},
		{"CMA IPv4 encoding (12 zero bytes)", bytes.Count(req.PrivateData()[4:16], []byte{0}), 12},
		// SRP_LOGIN_REQ (include/scsi/srp.h srp_login_req_rdma) at private-data offset 36.
		{"SRP login len", len(login), 56},
		{"SRP tag", be64(login[0:]), uint64(0)},
		{"SRP req_buf_fmt", be16(login[8:]), uint16(0x0006)},
		{"SRP req_flags (IMMED)", login[10], uint8(0x80)},
		{"SRP opcode LOGIN_REQ", login[11], uint8(0x00)},
		{"SRP req_it_iu_len", be32(login[12:]), uint32(8260)},
		{"SRP initiator port ID", hex.EncodeToString(login[16:32]), "0000000000000000505400fffe770002"},
		{"SRP target port ID", hex.EncodeToString(login[32:48]), "505400fffe770001505400fffe770001"},
		{"SRP imm_data_offset", be16(login[48:]), uint16(68)},
		// REP (ib_srpt over rxe).
		{"REP local comm ID", rep.LocalCommID(), uint32(0xa013c9f9)},
		{"REP remote comm ID", rep.RemoteCommID(), req.LocalCommID()},
		{"REP Q_Key", rep.LocalQKey(), uint32(0)},
		{"REP local QPN", rep.LocalQPN(), uint32(0x11)},
		{"REP EECN", rep.LocalEECN(), uint32(0)},
		{"REP starting PSN", rep.StartingPSN(), uint32(0x589d24)},
		{"REP responder resources", rep.ResponderResources(), uint8(4)},
		{"REP initiator depth", rep.InitiatorDepth(), uint8(4)},
		{"REP target ACK delay (rxe 15)", rep.TargetACKDelay(), uint8(15)},
		{"REP failover", rep.FailoverAccepted(), uint8(0)},
		{"REP flow control", rep.EndToEndFlowControl(), true},
		{"REP RNR retry", rep.RNRRetryCount(), uint8(7)},
		{"REP SRQ", rep.SRQ(), false},
		{"REP local CA GUID", rep.LocalCAGUID(), uint64(0x505400fffe770001)},
		{"REP private data = SRP_LOGIN_RSP", rep.PrivateData()[0], uint8(0xc0)},
		// RTU / DREQ / DREP.
		{"RTU local", rtu.LocalCommID(), req.LocalCommID()},
		{"RTU remote", rtu.RemoteCommID(), rep.LocalCommID()},
		{"DREQ local", dreq.LocalCommID(), req.LocalCommID()},
		{"DREQ remote", dreq.RemoteCommID(), rep.LocalCommID()},
		{"DREQ remote QPN = REP QPN", dreq.RemoteQPN(), rep.LocalQPN()},
		{"DREP local", drep.LocalCommID(), rep.LocalCommID()},
		{"DREP remote", drep.RemoteCommID(), req.LocalCommID()},
		// REJ with an SRP_LOGIN_REJ (reject pcap).
		{"REJ count (10 logins, 10 rejects)", [2]int{len(rejReqs), len(rejs)}, [2]int{10, 10}},
		{"REJ local comm ID (REQ_RCVD)", rej.LocalCommID(), uint32(0)},
		{"REJ remote comm ID", rej.RemoteCommID(), rejReq.LocalCommID()},
		{"REJ message rejected REQ", rej.MessageRejected(), uint8(MsgResponseREQ)},
		{"REJ info length", rej.RejectInfoLength(), uint8(0)},
		{"REJ reason consumer defined", rej.Reason(), uint16(28)},
		{"REJ SRP_LOGIN_REJ opcode", rej.PrivateData()[0], uint8(0xc2)},
		{"REJ SRP reason", be32(rej.PrivateData()[4:]), uint32(0x00010006)},
		{"reject pcap REQ comm ID", rejReq.LocalCommID(), uint32(0xe709bab2)},
		{"reject pcap REQ TID", wire.MAD(rejReq).TransactionID(), TID(2, 0xe709bab2)},
	}
	checkFields(t, rows)
	// Timers of the captured REQ as the kernel computes them.
	if d := 2*TimeoutDuration(18) + TimeoutDuration(req.RemoteCMResponseTimeout()); d.Milliseconds() != 6144 {
		t.Errorf("REQ timeout %v", d)
	}
	if d := TimeoutDuration(pp.LocalACKTimeout()); d.Milliseconds() != 2048 {
		t.Errorf("passive timewait %v", d)
	}
}

func TestCaptureFilesPresent(t *testing.T) {
	for _, p := range []string{pcapLogin, pcapReject} {
		if _, err := os.Stat(filepath.Clean(p)); err != nil {
			t.Fatal(err)
		}
	}
}
