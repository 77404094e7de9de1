package link

import (
	"io"
	"net/netip"
	"sync"
	"time"

	"github.com/srpd/srpd/transport/softroce/internal/pcapfile"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// PcapTap wraps a Link and writes every packet it sends and receives to a classic pcap stream
// (link type Ethernet) with a synthesized Ethernet header and the IP/UDP headers the packet
// had on the wire: the inner link's encapsulation (Encapsulator) for sent packets, Src/Dst for
// received ones, and for IPv4 the Identification recovered from the ICRC, so that every ICRC in
// the file verifies against its header. Wireshark/tshark decode it as RoCEv2 (UDP 4791).
//
// Writes happen synchronously under a mutex inside Send and Recv; a write error is remembered
// (Err) and stops further writes but never fails Send or Recv. Use a buffered writer for
// performance and flush it after Close.
type PcapTap struct {
	Link
	mu  sync.Mutex
	w   *pcapfile.Writer
	err error
	hdr [14 + wire.IPv6HeaderLen + wire.UDPHeaderLen]byte
	now func() time.Time
}

// WithPcap returns l wrapped in a PcapTap writing to w; it writes the pcap file header first.
func WithPcap(l Link, w io.Writer) (*PcapTap, error) {
	pw, err := pcapfile.NewWriter(w, pcapfile.LinkTypeEthernet, 0)
	if err != nil {
		return nil, err
	}
	return &PcapTap{Link: l, w: pw, now: time.Now}, nil
}

// Err returns the first write error, if any.
func (t *PcapTap) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// Send implements Link.
func (t *PcapTap) Send(pkts []Packet) (int, error) {
	// The tap records whole packets: it takes no payload by reference (Packet.Payload).
	var refErr error
	for i := range pkts {
		if pkts[i].Payload != nil {
			pkts, refErr = pkts[:i], ErrPayloadRef
			break
		}
	}
	n, err := t.Link.Send(pkts)
	if err == nil {
		err = refErr
	}
	enc, _ := t.Link.(Encapsulator)
	for i := 0; i < n; i++ {
		p := &pkts[i]
		var e wire.Encap
		if enc != nil {
			e = enc.Encap(p)
		} else {
			e = wire.Encap{Src: p.Src, Dst: p.Dst, TrafficClass: p.TrafficClass}
			if !e.Src.Addr().IsValid() {
				e.Src = netip.AddrPortFrom(t.Link.LocalAddr(), UDPPort)
			}
		}
		t.write(&e, p.Buf)
	}
	return n, err
}

// Recv implements Link.
func (t *PcapTap) Recv(pkts []Packet) (int, error) {
	n, err := t.Link.Recv(pkts)
	for i := 0; i < n; i++ {
		p := &pkts[i]
		e := wire.Encap{Src: p.Src, Dst: p.Dst, TrafficClass: p.TrafficClass}
		t.write(&e, p.Buf)
	}
	return n, err
}

func macFor(a netip.Addr, b []byte) {
	x := a.As16()
	b[0], b[1] = 0x02, 0x00 // locally administered
	copy(b[2:6], x[12:16])
}

func (t *PcapTap) write(e *wire.Encap, buf []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil || !e.Valid() {
		return
	}
	if e.Is4() {
		if id, ok := e.RecoverIPv4ID(buf); ok {
			e.IPv4ID = id
		}
	}
	h := t.hdr[:]
	macFor(e.Dst.Addr(), h[0:6])
	macFor(e.Src.Addr(), h[6:12])
	h[12], h[13] = 0x86, 0xDD
	if e.Is4() {
		h[12], h[13] = 0x08, 0x00
	}
	n, err := e.PutHeaders(h[14:], buf)
	if err != nil {
		return
	}
	t.err = t.w.WriteRecord(t.now(), h[:14+n], buf)
}
