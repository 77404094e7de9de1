package link

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/transport/softroce/internal/pcapfile"
	"github.com/srpd/srpd/transport/softroce/wire"
)

func TestPcapTap(t *testing.T) {
	for _, rxeIDs := range []bool{false, true} {
		a, b := NewPipe(addrA, addrB, PipeConfig{RxeIPv4IDs: rxeIDs})
		var file bytes.Buffer
		tap, err := WithPcap(a, &file)
		if err != nil {
			t.Fatal(err)
		}
		var l Link = tap // a PcapTap is a Link
		var sent []Packet
		for i := range 5 {
			sent = append(sent, mkSend(t, b.LocalAddrPort(), uint32(i), i*100))
		}
		if n, err := l.Send(sent); n != 5 || err != nil {
			t.Fatal(n, err)
		}
		// b echoes an ACK per packet.
		got := recvAll(t, b, 5, 5*time.Second)
		for _, psn := range got {
			p, _ := wire.Layout(make([]byte, MaxPacket), wire.RCAcknowledge, 0)
			p.BTH().SetPSN(wire.PSN(psn))
			p.AETH().SetSyndrome(wire.SyndromeACKUnlimited)
			b.Send([]Packet{{Dst: a.LocalAddrPort(), Buf: p.Bytes()}})
		}
		bufs := recvBufs(8)
		for total := 0; total < 5; {
			n, err := l.Recv(bufs)
			if err != nil {
				t.Fatal(err)
			}
			total += n
		}
		l.Close()
		b.Close()
		if tap.Err() != nil {
			t.Fatal(tap.Err())
		}
		// Read it back: 10 frames, every ICRC verifies against the written headers.
		r, err := pcapfile.NewReader(bytes.NewReader(file.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		frames := 0
		for {
			d, _, _, err := r.Next(nil)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			e, hl, plen, err := wire.ParseEncap(d[14:])
			if err != nil {
				t.Fatal(err)
			}
			pkt := d[14+hl : 14+hl+plen]
			icrc, err := wire.ICRCFromHeaders(d[14:14+hl-8], d[14+hl-8:14+hl], pkt)
			if err != nil || icrc != binary.LittleEndian.Uint32(pkt[len(pkt)-4:]) {
				t.Fatalf("frame %d: ICRC does not match its header", frames+1)
			}
			if frames < 5 && (e.Src != a.LocalAddrPort() || e.Dst != b.LocalAddrPort()) {
				t.Fatalf("frame %d: %v -> %v", frames+1, e.Src, e.Dst)
			}
			if rxeIDs != (e.IPv4ID != 0) {
				t.Fatalf("frame %d: IPv4 ID %d (rxe IDs %v)", frames+1, e.IPv4ID, rxeIDs)
			}
			frames++
		}
		if frames != 10 {
			t.Fatalf("%d frames", frames)
		}
		if !rxeIDs {
			tsharkCheck(t, file.Bytes())
		}
	}
}

// tsharkCheck decodes the tap's file with tshark: 5 SEND_ONLY (opcode 4) then 5 ACKs (17).
func tsharkCheck(t *testing.T, pcap []byte) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Log("SKIPPING tshark decode of the pcap tap: tshark is not installed (CI installs it)")
		return
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "tap.pcap")
	if err := os.WriteFile(path, pcap, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tshark, "-r", path, "-T", "fields", "-E", "separator=|",
		"-e", "infiniband.bth.opcode", "-e", "infiniband.bth.psn", "-e", "ip.src", "-e", "ip.dst", "-e", "udp.dstport")
	cmd.Env = append(os.Environ(), "HOME="+dir)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	i := 0
	for sc.Scan() {
		f := strings.Split(sc.Text(), "|")
		op, _ := strconv.Atoi(f[0])
		wantOp := 4
		if i >= 5 {
			wantOp = 17
		}
		if op != wantOp || f[4] != "4791" {
			t.Errorf("tshark line %d: %q", i+1, sc.Text())
		}
		i++
	}
	if i != 10 {
		t.Fatalf("tshark decoded %d packets:\n%s", i, out)
	}
	t.Logf("tshark decoded the tap's %d packets as RoCEv2", i)
}
