package srp

import (
	"bytes"
	"encoding/binary"
	"os"
	"testing"
)

// The kernel captures used by the transport tests (rxe ib_srp <-> ib_srpt, Debian 6.1; see
// transport/softroce/testdata). Every SRP IU carried in an RC SEND ONLY must decode and
// re-encode to the same bytes. The frames are decoded here with fixed offsets (Ethernet 14,
// IPv4 without options 20, UDP 8, BTH 12) because package srp knows nothing of the wire; the
// RoCE headers themselves are checked by transport/softroce/wire's capture test.
var captureFiles = []string{
	"../transport/softroce/testdata/srp-rdma-cm-login-io.pcap",
	"../transport/softroce/testdata/srp-login-rejected-no-acl.pcap",
}

// pcapFrames returns the frames of a classic little-endian pcap file.
func pcapFrames(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 24 || binary.LittleEndian.Uint32(b) != 0xa1b2c3d4 {
		t.Fatalf("%s: not a little-endian classic pcap", path)
	}
	var frames [][]byte
	for off := 24; off < len(b); {
		if off+16 > len(b) {
			t.Fatalf("%s: truncated record header at %d", path, off)
		}
		n := int(binary.LittleEndian.Uint32(b[off+8:]))
		if off+16+n > len(b) {
			t.Fatalf("%s: truncated record at %d", path, off)
		}
		frames = append(frames, b[off+16:off+16+n])
		off += 16 + n
	}
	return frames
}

func TestCaptureIUsRoundTrip(t *testing.T) {
	const hdr = 14 + 20 + 8 + 12 // up to the end of the BTH
	counts := map[Opcode]int{}
	for _, path := range captureFiles {
		for i, f := range pcapFrames(t, path) {
			if len(f) < hdr+4 || f[12] != 0x08 || f[13] != 0x00 || f[14] != 0x45 || f[23] != 17 ||
				binary.BigEndian.Uint16(f[36:]) != 4791 || f[42] != 0x04 /* RC SEND ONLY */ {
				continue
			}
			udpLen := int(binary.BigEndian.Uint16(f[38:]))
			pad := int(f[43]>>4) & 3
			iu := f[hdr : 34+udpLen-4-pad]
			op, err := PeekOpcode(iu)
			if err != nil {
				t.Fatalf("%s frame %d: %v", path, i+1, err)
			}
			counts[op]++
			out := bytes.Repeat([]byte{0xa5}, len(iu)) // stale bytes must be overwritten
			var n int
			switch op {
			case OpCmd:
				c, err := ParseCmd(iu, DefaultImmDataOffset)
				if err != nil {
					t.Fatalf("%s frame %d: SRP_CMD: %v", path, i+1, err)
				}
				f := c.Fields(DefaultImmDataOffset)
				n, err = Cmd(out).Encode(&f)
				if err != nil {
					t.Fatalf("%s frame %d: SRP_CMD encode: %v", path, i+1, err)
				}
			case OpRsp:
				r, err := ParseRsp(iu)
				if err != nil {
					t.Fatalf("%s frame %d: SRP_RSP: %v", path, i+1, err)
				}
				f := r.Fields()
				n, err = Rsp(out).Encode(&f, len(out))
				if err != nil {
					t.Fatalf("%s frame %d: SRP_RSP encode: %v", path, i+1, err)
				}
			case OpTskMgmt:
				m, err := ParseTskMgmt(iu)
				if err != nil {
					t.Fatalf("%s frame %d: SRP_TSK_MGMT: %v", path, i+1, err)
				}
				f := m.Fields()
				n, err = TskMgmt(out).Encode(&f)
				if err != nil {
					t.Fatalf("%s frame %d: SRP_TSK_MGMT encode: %v", path, i+1, err)
				}
			default:
				t.Fatalf("%s frame %d: unexpected IU opcode %v in a SEND", path, i+1, op)
			}
			// A SEND carries exactly one IU: the re-encoded IU must be the whole payload.
			if n != len(iu) || !bytes.Equal(out[:n], iu) {
				t.Fatalf("%s frame %d: %v re-encodes to\n%x\nwant\n%x", path, i+1, op, out[:n], iu)
			}
		}
	}
	// srp-rdma-cm-login-io.decode.txt: 53 SENDs each way (SRP_CMD from the initiator, SRP_RSP
	// from the target).
	if counts[OpCmd] != 53 || counts[OpRsp] != 53 {
		t.Fatalf("IUs seen: %v; want 53 SRP_CMD and 53 SRP_RSP", counts)
	}
}
