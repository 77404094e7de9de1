package wire

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/transport/softroce/internal/pcapfile"
)

// tsharkPacket is a packet built with this package's encoders and the fields tshark must decode.
type tsharkPacket struct {
	name string
	pkt  Packet
	want map[string]uint64
}

func buildTsharkPackets(t *testing.T) []tsharkPacket {
	var out []tsharkPacket
	mk := func(name string, op Opcode, n int, fill func(p Packet), want map[string]uint64) {
		p, err := Layout(make([]byte, 4200), op, n)
		if err != nil {
			t.Fatal(err)
		}
		for i := range p.Payload() {
			p.Payload()[i] = byte(i)
		}
		fill(p)
		want["infiniband.bth.opcode"] = uint64(op)
		want["infiniband.bth.p_key"] = DefaultPKey
		want["infiniband.bth.padcnt"] = uint64(PadCount(n))
		out = append(out, tsharkPacket{name, p, want})
	}
	mk("write first", RCRDMAWriteFirst, 1024, func(p Packet) {
		p.BTH().SetDestQP(0x123456)
		p.BTH().SetPSN(0xABCDEF)
		p.RETH().Encode(&RETHFields{VA: 0xFFFF888012345000, RKey: 0x00ABCD07, DMALen: 65536})
	}, map[string]uint64{"infiniband.bth.destqp": 0x123456, "infiniband.bth.psn": 0xABCDEF,
		"infiniband.reth.va": 0xFFFF888012345000, "infiniband.reth.r_key": 0x00ABCD07, "infiniband.reth.dmalen": 65536,
		"infiniband.bth.a": 0})
	mk("nak", RCAcknowledge, 0, func(p Packet) {
		p.BTH().SetDestQP(0x11)
		p.BTH().SetPSN(77)
		p.AETH().Encode(&AETHFields{Syndrome: NakRemoteAccessError.Syndrome(), MSN: 0x654321})
	}, map[string]uint64{"infiniband.bth.destqp": 0x11, "infiniband.bth.psn": 77,
		"infiniband.aeth.syndrome": 0x62, "infiniband.aeth.msn": 0x654321})
	mk("send imm", RCSendOnlyWithImmediate, 5, func(p Packet) {
		p.BTH().SetDestQP(0x22)
		p.BTH().SetPSN(PSNMask)
		p.BTH().SetAckReq(true)
		p.BTH().SetSolicitedEvent(true)
		p.ImmDt().SetImm(0xCAFEF00D)
	}, map[string]uint64{"infiniband.bth.destqp": 0x22, "infiniband.bth.psn": PSNMask, "infiniband.bth.a": 1,
		"infiniband.bth.se": 1})
	mk("read request", RCRDMAReadRequest, 0, func(p Packet) {
		p.BTH().SetDestQP(0x33)
		p.BTH().SetPSN(1)
		p.BTH().SetAckReq(true)
		p.RETH().Encode(&RETHFields{VA: 0x1000, RKey: 0x1234, DMALen: 8192})
	}, map[string]uint64{"infiniband.bth.destqp": 0x33, "infiniband.reth.r_key": 0x1234, "infiniband.reth.dmalen": 8192})
	mk("cm req", UDSendOnly, MADLen, func(p Packet) {
		p.BTH().SetDestQP(QPGSI)
		p.DETH().Encode(&DETHFields{QKey: GSIQKey, SrcQP: QPGSI})
		clear(p.Payload())
		p.MAD().Encode(&MADFields{BaseVersion: 1, MgmtClass: MgmtClassCM, ClassVersion: CMClassVersion,
			Method: MADMethodSend, TransactionID: 0x1122334455667788, AttributeID: CMAttrREQ})
	}, map[string]uint64{"infiniband.bth.destqp": 1, "infiniband.deth.q_key": GSIQKey, "infiniband.deth.srcqp": 1,
		"infiniband.mad.mgmtclass": MgmtClassCM, "infiniband.mad.attributeid": CMAttrREQ,
		"infiniband.mad.transactionid": 0x1122334455667788})
	return out
}

// TestTshark writes packets built with the encoders (with real IPv4 and IPv6 + UDP headers)
// into a pcap and checks tshark's independent decode of every field, including the ICRC.
func TestTshark(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("SKIPPING tshark cross-check: tshark is not installed (CI installs it: apt-get install tshark)")
	}
	pkts := buildTsharkPackets(t)
	encaps := []Encap{
		{Src: netip.MustParseAddrPort("10.77.0.1:49153"), Dst: netip.MustParseAddrPort("10.77.0.2:4791"), IPv4ID: 0x4242},
		{Src: netip.MustParseAddrPort("[fd00::1]:49153"), Dst: netip.MustParseAddrPort("[fd00::2]:4791"), FlowLabel: 0x12345},
	}
	path := filepath.Join(t.TempDir(), "enc.pcap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := pcapfile.NewWriter(f, pcapfile.LinkTypeEthernet, 0)
	if err != nil {
		t.Fatal(err)
	}
	var want []tsharkPacket
	for _, e := range encaps {
		for _, tp := range pkts {
			b := append([]byte(nil), tp.pkt.Bytes()...)
			e.PutICRC(b)
			eth := make([]byte, 14)
			eth[0], eth[6] = 0x02, 0x02
			eth[12], eth[13] = 0x08, 0x00
			if !e.Is4() {
				eth[12], eth[13] = 0x86, 0xDD
			}
			hdr := make([]byte, e.HeaderLen())
			if _, err := e.PutHeaders(hdr, b); err != nil {
				t.Fatal(err)
			}
			if err := w.WriteRecord(time.Unix(1700000000, 0), eth, hdr, b); err != nil {
				t.Fatal(err)
			}
			// tshark shows the ICRC bytes as a big-endian number (the wire order), our
			// value is their little-endian reading.
			m := map[string]uint64{"infiniband.invariant.crc": uint64(binary.BigEndian.Uint32(b[len(b)-4:]))}
			for k, v := range tp.want {
				m[k] = v
			}
			if got := binary.LittleEndian.Uint32(b[len(b)-4:]); got != e.ICRC(b) {
				t.Fatal("ICRC not stored little-endian")
			}
			want = append(want, tsharkPacket{tp.name, tp.pkt, m})
		}
	}
	f.Close()
	all := map[string]bool{}
	for _, tp := range want {
		for k := range tp.want {
			all[k] = true
		}
	}
	var fields []string
	for k := range all {
		fields = append(fields, k)
	}
	args := []string{"-r", path, "-T", "fields", "-E", "separator=|"}
	for _, k := range fields {
		args = append(args, "-e", k)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(tshark, args...)
	cmd.Stderr = &stderr
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(want) {
		t.Fatalf("tshark printed %d lines for %d packets:\n%s", len(lines), len(want), out)
	}
	checked := 0
	for i, line := range lines {
		vals := strings.Split(line, "|")
		for j, k := range fields {
			w, ok := want[i].want[k]
			if !ok {
				continue
			}
			got, err := parseTsharkUint(vals[j])
			if err != nil || got != w {
				t.Errorf("%s (packet %d): %s = %q, want %#x", want[i].name, i+1, k, vals[j], w)
			}
			checked++
		}
	}
	t.Logf("tshark agreed on %d fields of %d packets (IPv4 and IPv6)", checked, len(lines))
}

func parseTsharkUint(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	if s == "True" {
		return 1, nil
	}
	if s == "False" {
		return 0, nil
	}
	if strings.Contains(s, ",") { // repeated field: take the first
		s = s[:strings.IndexByte(s, ',')]
	}
	return strconv.ParseUint(s, 0, 64)
}
