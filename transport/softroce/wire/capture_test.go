package wire

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/srpd/srpd/transport/softroce/internal/pcapfile"
)

// capPkt is one RoCEv2 frame from a testdata capture.
type capPkt struct {
	file  string
	index int    // 1-based frame number
	ip    []byte // IP header
	udp   []byte
	pkt   []byte // BTH .. ICRC (UDP payload)
	encap Encap
}

var captures = []string{"srp-rdma-cm-login-io.pcap", "srp-login-rejected-no-acl.pcap"}

func loadCapture(t testing.TB, name string) []capPkt {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapfile.NewReader(bufio.NewReader(f))
	if err != nil {
		t.Fatal(err)
	}
	if r.LinkType != pcapfile.LinkTypeEthernet {
		t.Fatalf("%s: link type %d", name, r.LinkType)
	}
	var out []capPkt
	for i := 1; ; i++ {
		d, _, _, err := r.Next(nil)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s #%d: %v", name, i, err)
		}
		off := 14
		et := binary.BigEndian.Uint16(d[12:])
		for et == 0x8100 || et == 0x88A8 { // VLAN tags
			et = binary.BigEndian.Uint16(d[off+2:])
			off += 4
		}
		e, hl, plen, err := ParseEncap(d[off:])
		if err != nil {
			t.Fatalf("%s #%d: %v", name, i, err)
		}
		if e.Dst.Port() != UDPPort {
			continue
		}
		ipl := hl - UDPHeaderLen
		if off+hl+plen > len(d) {
			t.Fatalf("%s #%d: truncated frame", name, i)
		}
		out = append(out, capPkt{file: name, index: i, ip: d[off : off+ipl], udp: d[off+ipl : off+hl],
			pkt: d[off+hl : off+hl+plen], encap: e})
	}
	return out
}

func TestCaptures(t *testing.T) {
	for _, name := range captures {
		t.Run(name, func(t *testing.T) {
			pkts := loadCapture(t, name)
			var parsed, icrcOK, idOK, reenc int
			hist := map[string]int{}
			for _, c := range pkts {
				where := fmt.Sprintf("%s #%d", c.file, c.index)
				p, err := Parse(c.pkt)
				if err != nil {
					t.Errorf("%s: Parse: %v", where, err)
					continue
				}
				parsed++
				hist[fmt.Sprintf("%s %d", c.encap.Src.Addr(), p.Opcode())]++

				// ICRC with the literal headers, and with the decoded encapsulation.
				got, err := ICRCFromHeaders(c.ip, c.udp, c.pkt)
				if err != nil || got != p.ICRC() {
					t.Errorf("%s: ICRC %#x want %#x (%v)", where, got, p.ICRC(), err)
					continue
				}
				if !c.encap.VerifyICRC(c.pkt) {
					t.Errorf("%s: Encap.VerifyICRC", where)
					continue
				}
				icrcOK++

				// IPv4 ID recovery: the real ID comes back from an encapsulation with ID 0.
				if c.encap.Is4() {
					e := c.encap
					e.IPv4ID = 0
					id, ok := e.RecoverIPv4ID(c.pkt)
					if !ok || id != c.encap.IPv4ID {
						t.Errorf("%s: RecoverIPv4ID = %#x,%v want %#x", where, id, ok, c.encap.IPv4ID)
						continue
					}
					e.IPv4ID = id
					if !e.VerifyICRC(c.pkt) {
						t.Errorf("%s: recovered ID does not verify", where)
						continue
					}
					idOK++
				}

				// Re-encode every header from its decoded fields.
				if err := reencode(p); err != nil {
					t.Errorf("%s: %v", where, err)
					continue
				}
				reenc++
			}
			t.Logf("%s: %d RoCE packets, %d parsed, %d ICRCs verified, %d IPv4 IDs recovered, %d re-encoded identically",
				name, len(pkts), parsed, icrcOK, idOK, reenc)
			if parsed != len(pkts) || icrcOK != len(pkts) || reenc != len(pkts) {
				t.Fatal("not every packet passed")
			}
			if name == "srp-rdma-cm-login-io.pcap" {
				if len(pkts) != 827 {
					t.Fatalf("%d packets, want 827", len(pkts))
				}
				checkHistogram(t, hist)
			}
		})
	}
}

// reencode rebuilds p's headers from their Fields into a copy of p and compares bytes.
func reencode(p Packet) error {
	cp := append([]byte(nil), p.Bytes()...)
	q, err := Parse(cp)
	if err != nil {
		return err
	}
	clear(cp[:q.HeaderLen()])
	if mad := p.MAD(); mad != nil {
		clear(q.Payload()[:MADHeaderLen])
	}
	bf := p.BTH().Fields()
	q.b[0] = byte(bf.Opcode) // the views locate headers by opcode
	q.BTH().Encode(&bf)
	if h := p.RETH(); h != nil {
		encodeFields(q.RETH(), h, RETH.Fields, RETH.Encode)
	}
	if h := p.AETH(); h != nil {
		encodeFields(q.AETH(), h, AETH.Fields, AETH.Encode)
	}
	if h := p.DETH(); h != nil {
		encodeFields(q.DETH(), h, DETH.Fields, DETH.Encode)
	}
	if h := p.ImmDt(); h != nil {
		q.ImmDt().SetImm(h.Imm())
	}
	if h := p.IETH(); h != nil {
		q.IETH().SetRKey(h.RKey())
	}
	if h := p.AtomicETH(); h != nil {
		copy(q.AtomicETH(), h)
	}
	if h := p.AtomicAckETH(); h != nil {
		copy(q.AtomicAckETH(), h)
	}
	if m := p.MAD(); m != nil {
		encodeFields(q.MAD(), m, MAD.Fields, MAD.Encode)
	}
	if string(cp) != string(p.Bytes()) {
		return fmt.Errorf("re-encoded headers differ:\n got %x\nwant %x", cp[:p.HeaderLen()+MADHeaderLen], p.Bytes()[:p.HeaderLen()+MADHeaderLen])
	}
	return nil
}

// checkHistogram compares the (sender, opcode) counts with the tshark decode kept beside the
// capture.
func checkHistogram(t *testing.T, hist map[string]int) {
	b, err := os.ReadFile(filepath.Join("..", "testdata", "srp-rdma-cm-login-io.decode.txt"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "== packets per (sender, BTH opcode)") {
			in = true
			continue
		}
		f := strings.Fields(line)
		if !in || len(f) != 3 {
			continue
		}
		n, err1 := strconv.Atoi(f[0])
		op, err2 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil {
			continue
		}
		want[f[1]+" "+strconv.Itoa(op)] = n
	}
	if len(want) == 0 {
		t.Fatal("no histogram in decode.txt")
	}
	for k, n := range want {
		if hist[k] != n {
			t.Errorf("histogram %s: got %d want %d", k, hist[k], n)
		}
	}
	for k, n := range hist {
		if _, ok := want[k]; !ok {
			t.Errorf("histogram %s: got %d, not in decode.txt", k, n)
		}
	}
	t.Logf("opcode histogram matches decode.txt (%d (sender, opcode) pairs)", len(want))
}
