//go:build hostile

package hostile

import (
	"context"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/cm"
	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// forger sends crafted RoCEv2 packets to srpd from one 127.0.0.x address: through a softroce
// link (which computes a valid ICRC over the exact IP/UDP header, so the packet reaches the
// engine) or through a plain UDP socket (bytes as they are: random data, bad ICRCs). CM MADs are
// built with the softroce CM state machine itself (cm.Manager.Dial formats a REQ as the kernel's
// RDMA CM does), so only the fields the test means to corrupt are wrong.
type forger struct {
	t    *testing.T
	src  netip.Addr
	dst  netip.AddrPort
	lnk  *link.UDP
	raw  *net.UDPConn
	mgr  *cm.Manager
	rng  *rand.Rand
	psn  uint32
	sent int
}

func newForger(t *testing.T, d *daemon, src string, seed uint64) *forger {
	t.Helper()
	a := netip.MustParseAddr(src)
	lnk, err := link.ListenUDP(context.Background(), netip.AddrPortFrom(a, 0), link.UDPOptions{})
	if err != nil {
		t.Fatalf("forger link on %s: %v", src, err)
	}
	t.Cleanup(func() { lnk.Close() })
	raw, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 0)))
	if err != nil {
		t.Fatalf("forger socket on %s: %v", src, err)
	}
	t.Cleanup(func() { raw.Close() })
	rng := rand.New(rand.NewPCG(seed, 0x686f7374696c65))
	mgr, err := cm.NewManager(cm.Config{GUID: rng.Uint64() | 1, Rand: rand.NewPCG(seed, 1)})
	if err != nil {
		t.Fatal(err)
	}
	return &forger{t: t, src: a, dst: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(d.udpPort)),
		lnk: lnk, raw: raw, mgr: mgr, rng: rng}
}

// pace keeps the attack within what a loopback socket buffer takes: the point is what srpd
// does with each packet, not whether the kernel drops them before it sees them.
func (f *forger) pace() {
	if f.sent%128 == 0 {
		time.Sleep(2 * time.Millisecond)
	}
}

// sendValid sends buf (BTH through ICRC) with a correct ICRC.
func (f *forger) sendValid(buf []byte) {
	f.t.Helper()
	pk := []link.Packet{{Src: netip.AddrPortFrom(f.src, 0), Dst: f.dst, Buf: buf}}
	if _, err := f.lnk.Send(pk); err != nil {
		f.t.Fatalf("forger: send %d bytes: %v", len(buf), err)
	}
	f.sent++
	f.pace()
}

// sendRaw sends b as the UDP payload, unchanged.
func (f *forger) sendRaw(b []byte) {
	f.t.Helper()
	if _, err := f.raw.WriteToUDPAddrPort(b, f.dst); err != nil {
		f.t.Fatalf("forger: raw send %d bytes: %v", len(b), err)
	}
	f.sent++
	f.pace()
}

// packet lays out a packet of opcode op with n payload bytes (random) to QP dqp; the ICRC
// field is left zero (the link fills it).
func (f *forger) packet(op wire.Opcode, dqp uint32, n int) []byte {
	f.t.Helper()
	buf := make([]byte, wire.PacketLen(op, n), link.MaxPacket)
	p, err := wire.Layout(buf, op, n)
	if err != nil {
		f.t.Fatalf("layout %v with %d bytes: %v", op, n, err)
	}
	b := p.BTH()
	b.SetPKey(wire.DefaultPKey)
	b.SetDestQP(dqp)
	b.SetAckReq(true)
	b.SetPSN(wire.PSN(f.rng.Uint32()))
	for i := wire.BTHLen; i < p.Len()-wire.ICRCLen; i++ { // extended headers and payload: random
		buf[i] = byte(f.rng.Uint32())
	}
	if op == wire.UDSendOnly || op == wire.UDSendOnlyWithImmediate {
		dt := p.DETH()
		dt.SetQKey(wire.GSIQKey)
		dt.SetSrcQP(wire.QPGSI)
	}
	return p.Bytes()
}

// madPacket wraps a MAD in a UD SEND_ONLY to QP1, as softroce's QP1 sends one.
func (f *forger) madPacket(mad []byte) []byte {
	f.t.Helper()
	buf := make([]byte, wire.PacketLen(wire.UDSendOnly, wire.MADLen), link.MaxPacket)
	p, err := wire.LayoutMAD(buf, wire.PSN(f.psn), mad)
	if err != nil {
		f.t.Fatal(err)
	}
	f.psn = (f.psn + 1) & wire.PSNMask
	return p.Bytes()
}

// req returns a CM REQ MAD for srpd's target carrying private data pd (≤ 56 bytes, after the
// RDMA CM header), as a fresh connection of the forger's own CM would send it.
func (f *forger) req(pd []byte) []byte {
	f.t.Helper()
	var out cm.Outputs
	_, err := f.mgr.Dial(0, &cm.DialParams{
		LocalAddr: f.src, RemoteAddr: f.dst.Addr(), DstPort: targetCMPort,
		QPN:         0x100 + f.rng.Uint32N(0xFFFE00),
		PrivateData: pd,
		Param:       transport.ConnParam{ResponderResources: 4, InitiatorDepth: 4, RetryCount: 6, RNRRetryCount: 7, FlowControl: true},
		PathMTU:     transport.MTU1024,
	}, &out)
	if err != nil {
		f.t.Fatalf("cm.Dial: %v", err)
	}
	for i := range out.MADs {
		if out.MADs[i].Attr() == cm.AttrREQ {
			return append([]byte(nil), out.MADs[i].MAD[:]...)
		}
	}
	f.t.Fatal("cm.Dial produced no REQ")
	return nil
}

// loginPD is a well-formed SRP_LOGIN_REQ (RDMA CM form) for srpd's target from initiator port
// ID (ext, guid).
func loginPD(ext, guid uint64) []byte {
	req := srp.LoginReq{
		ReqITIULen:      8260,
		BufFmt:          srp.BufFormatDirect | srp.BufFormatIndirect,
		Flags:           srp.MultiChanSingle,
		InitiatorPortID: srp.MakePortID(ext, guid),
		TargetPortID:    targetPortID(),
	}
	req.Tag[7] = 1
	b := make([]byte, srp.LoginReqRDMALen)
	if _, err := req.EncodeRDMA(b); err != nil {
		panic(err) // a fixed-size buffer of the right length: cannot fail
	}
	return b
}
