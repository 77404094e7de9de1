package softroce

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/cm"
	"github.com/srpd/srpd/transport/softroce/link"
)

// GSO towards srpd peers, negotiated through CM ECE (cmapi.go eceVendorSRPD).

// eceRule is a case of a rule reading the peer's ECE: as the passive side (its REQ's) or the
// active one (its REP's).
type eceRule struct {
	name   string
	peer   cm.ECE
	active bool
	want   bool
}

func TestPeerSegmentableRule(t *testing.T) {
	offer := cm.ECE{VendorID: eceVendorSRPD, AttrMod: eceOffer}
	agree := cm.ECE{VendorID: eceVendorSRPD, AttrMod: eceAgree}
	for _, tc := range []eceRule{
		{"passive: srpd REQ offers", offer, false, true},
		{"passive: kernel ULP REQ (no ECE)", cm.ECE{}, false, false},
		{"passive: other vendor's bit 0", cm.ECE{VendorID: 0x02c9, AttrMod: eceOffer}, false, false},
		{"active: srpd REP agrees", agree, true, true},
		// cma_accept_ib copies the REQ's ECE into the REP: an echo is not agreement.
		{"active: kernel REP echoes our offer", offer, true, false},
		{"active: kernel REP without ECE", cm.ECE{}, true, false},
		{"active: other vendor's bit 1", cm.ECE{VendorID: 0x02c9, AttrMod: eceAgree}, true, false},
	} {
		if got := peerSegmentable(tc.peer, tc.active); got != tc.want {
			t.Errorf("%s: peerSegmentable(%+v, active %v) = %v, want %v", tc.name, tc.peer, tc.active, got, tc.want)
		}
	}
	for _, waiver := range []bool{false, true} {
		if got := acceptECE(offer, waiver); got != agree {
			t.Errorf("acceptECE(srpd offer, waiver %v) = %+v, want %+v", waiver, got, agree)
		}
		for _, req := range []cm.ECE{{}, {VendorID: 0x02c9, AttrMod: 1}, {VendorID: eceVendorSRPD},
			{VendorID: eceVendorSRPD, AttrMod: eceNoICRCOffer}} {
			if got := acceptECE(req, waiver); got != (cm.ECE{}) {
				t.Errorf("acceptECE(%+v, waiver %v) = %+v, want none", req, waiver, got)
			}
		}
	}
}

// The ICRC waiver is agreed only by a passive side whose link can waive it, and read only
// from an srpd's ECE: a kernel passive side's echo of our offer is no agreement.
func TestPeerWaivesICRCRule(t *testing.T) {
	offer := cm.ECE{VendorID: eceVendorSRPD, AttrMod: eceOffer | eceNoICRCOffer}
	agreeBoth := cm.ECE{VendorID: eceVendorSRPD, AttrMod: eceAgree | eceNoICRCAgree}
	if got := acceptECE(offer, true); got != agreeBoth {
		t.Errorf("acceptECE(offer with waiver, our link can) = %+v, want %+v", got, agreeBoth)
	}
	if got := acceptECE(offer, false); got.AttrMod != eceAgree {
		t.Errorf("acceptECE(offer with waiver, our link cannot) = %+v, want GSO agreement only", got)
	}
	for _, tc := range []eceRule{
		{"passive: srpd REQ offers", offer, false, true},
		{"passive: srpd REQ without the waiver (KeepICRC, or a MemLink)", cm.ECE{VendorID: eceVendorSRPD, AttrMod: eceOffer}, false, false},
		{"passive: kernel REQ (no ECE)", cm.ECE{}, false, false},
		{"active: srpd REP agrees", agreeBoth, true, true},
		{"active: srpd REP agrees to GSO only", cm.ECE{VendorID: eceVendorSRPD, AttrMod: eceAgree}, true, false},
		{"active: kernel REP echoes our offer", offer, true, false},
		{"active: other vendor's bit 3", cm.ECE{VendorID: 0x02c9, AttrMod: eceNoICRCAgree}, true, false},
	} {
		if got := peerWaivesICRC(tc.peer, tc.active); got != tc.want {
			t.Errorf("%s: peerWaivesICRC(%+v, active %v) = %v, want %v", tc.name, tc.peer, tc.active, got, tc.want)
		}
	}
}

func noICRC(n *node) bool {
	q := n.qp.(*qp)
	n.dev.mu.Lock()
	defer n.dev.mu.Unlock()
	return q.noICRC && n.dev.icrcWaived(q.qpn)
}

// Two srpd devices on UDP links connected through the CM leave the ICRC out both ways: the
// data of an RDMA WRITE and READ arrives intact, each link accepted the other's packets
// unchecked, none was dropped. With KeepICRC on either side, or QPs brought up without the
// CM, every packet carries and is checked for its ICRC. A QP's waiver ends with the QP.
func TestECEWaivesICRC(t *testing.T) {
	for _, tc := range []struct {
		name         string
		keepA, keepB bool
		viaCM        bool
		want         bool
	}{
		{"cm", false, false, true, true},
		{"cm, dialler keeps the ICRC", true, false, true, false},
		{"cm, listener keeps the ICRC", false, true, true, false},
		{"no cm", false, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, la, lb := udpPair(t, tc.keepA, tc.keepB, tc.viaCM, nodeOpts{memSize: 4 << 20})
			defer a.close()
			defer b.close()
			if noICRC(a) != tc.want || noICRC(b) != tc.want {
				t.Fatalf("ICRC waived: dialler %v, listener %v; want %v", noICRC(a), noICRC(b), tc.want)
			}
			before := a.dev.Stats()
			writeReadMiB(t, a, b)
			sa, sb := la.Stats(), lb.Stats()
			// The WRITE's packets leave with their payload read from a's MR by the kernel
			// (linkref.go); the READ responses never do.
			refs := a.dev.Stats().TxRefPackets - before.TxRefPackets
			if tc.want && refs < 256 {
				t.Fatalf("RDMA WRITE of 256 packets: %d sent with the payload by reference", refs)
			}
			if st := b.dev.Stats(); st.TxRefPackets != 0 || (!tc.want && refs != 0) {
				t.Fatalf("payloads sent by reference: a %d, b %d (READ responses: never; ICRC kept: never)", refs, st.TxRefPackets)
			}
			t.Logf("waived: a %d of %d received, b %d of %d", sa.RxICRCWaived, sa.RxPackets, sb.RxICRCWaived, sb.RxPackets)
			if d := sa.RxICRCDrops + sb.RxICRCDrops + sa.RxMalformedDrops + sb.RxMalformedDrops; d != 0 {
				t.Fatalf("%d packets dropped as corrupt or malformed", d)
			}
			// The RDMA WRITE's 256 packets go to b, the READ's responses to a (MTU 4096).
			if tc.want && (sa.RxICRCWaived < 256 || sb.RxICRCWaived < 256) {
				t.Fatalf("packets accepted without ICRC: a %d, b %d; want ≥ 256 each", sa.RxICRCWaived, sb.RxICRCWaived)
			}
			if !tc.want && (sa.RxICRCWaived != 0 || sb.RxICRCWaived != 0) {
				t.Fatalf("not negotiated, yet packets accepted without ICRC: a %d, b %d", sa.RxICRCWaived, sb.RxICRCWaived)
			}
			if tc.want {
				qpn := b.qp.QPN()
				if err := b.qp.Close(); err != nil {
					t.Fatal(err)
				}
				if b.dev.icrcWaived(qpn) {
					t.Fatal("a closed QP's number is still waived")
				}
			}
		})
	}
}

// udpPair connects two devices on UDP links at 127.0.0.1 and 127.0.0.2 (GSO and GRO on),
// through the CM or by hand, with Config.KeepICRC as given.
func udpPair(t *testing.T, keepA, keepB, viaCM bool, o nodeOpts) (a, b *node, la, lb *link.UDP) {
	t.Helper()
	ctx := context.Background()
	la, err := link.ListenUDP(ctx, netip.MustParseAddrPort("127.0.0.1:0"), link.UDPOptions{GSO: true, GRO: true})
	if err != nil {
		t.Fatal(err)
	}
	lb, err = link.ListenUDP(ctx, netip.MustParseAddrPort("127.0.0.2:0"), link.UDPOptions{GSO: true, GRO: true})
	if err != nil {
		la.Close()
		t.Skipf("127.0.0.2: %v", err)
	}
	open := func(l *link.UDP, keep bool) *Device {
		d, err := Open(Config{Link: l, Name: "t" + l.LocalAddr().String(), KeepICRC: keep})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a, b = newNodeOn(t, open(la, keepA), o), newNodeOn(t, open(lb, keepB), o)
	if viaCM {
		p := &cmPair{a: a, b: b}
		p.configure(t, fastCM)
		a.dev.SetPeerUDPPort(b.addr.Addr(), b.addr.Port())
		connectCM(t, p, []byte("req"), []byte("rep"))
	} else {
		connect(a, b, connOpts{})
	}
	return a, b, la, lb
}

func segmentable(n *node) bool {
	q := n.qp.(*qp)
	n.dev.mu.Lock()
	defer n.dev.mu.Unlock()
	return q.segmentable
}

// Two softroce devices connected through the CM mark each other segmentable; QPs brought up
// by hand (no CM, as with a peer that did not negotiate) are not.
func TestECENegotiatedSegmentable(t *testing.T) {
	p := newCMPipe(t, pipeDefault(), nodeOpts{})
	connectCM(t, p, []byte("req"), []byte("rep"))
	if !segmentable(p.a) || !segmentable(p.b) {
		t.Fatalf("after CM: dialler segmentable %v, listener %v; want both", segmentable(p.a), segmentable(p.b))
	}
	// A MemLink cannot waive the ICRC (its faults corrupt what only the ICRC catches).
	if noICRC(p.a) || noICRC(p.b) {
		t.Fatalf("after CM over pipes: ICRC waived by dialler %v, listener %v; want neither", noICRC(p.a), noICRC(p.b))
	}
	a, b, _, _ := newPipePair(t, pipeDefault(), nodeOpts{})
	defer a.close()
	defer b.close()
	connect(a, b, connOpts{})
	if segmentable(a) || segmentable(b) {
		t.Fatalf("QPs without CM: segmentable %v %v; want neither", segmentable(a), segmentable(b))
	}
}

// vethPair makes two network namespaces joined by a veth pair of the given MTU, with addresses
// 10.251.0.1/24 and 10.251.0.2/24, and returns a UDP link (GSO and GRO on) in each. Everything
// is removed when t ends. It skips without root or netlink.
func vethPair(t *testing.T, mtu int) (la, lb *link.UDP) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root for network namespaces and a veth pair")
	}
	type res struct {
		la, lb *link.UDP
		err    error
	}
	names := [2]string{fmt.Sprintf("srpd-ece-a-%d", os.Getpid()), fmt.Sprintf("srpd-ece-b-%d", os.Getpid())}
	addrs := [2]netip.Addr{netip.MustParseAddr("10.251.0.1"), netip.MustParseAddr("10.251.0.2")}
	t.Cleanup(func() {
		for _, n := range names {
			_ = netns.DeleteNamed(n) // the veth pair goes with its namespaces
		}
	})
	ch := make(chan res, 1)
	go func() {
		// This thread changes namespace; it stays locked so that it ends with the goroutine.
		runtime.LockOSThread()
		var r res
		r.err = func() error {
			orig, err := netns.Get()
			if err != nil {
				return err
			}
			defer orig.Close()
			var hs [2]netns.NsHandle
			for i, n := range names {
				if hs[i], err = netns.NewNamed(n); err != nil {
					return fmt.Errorf("netns %s: %w", n, err)
				}
				defer hs[i].Close()
			}
			if err := netns.Set(orig); err != nil {
				return err
			}
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "srpdece0", MTU: mtu, Namespace: netlink.NsFd(hs[0])},
				PeerName: "srpdece1", PeerNamespace: netlink.NsFd(hs[1])}
			if err := netlink.LinkAdd(v); err != nil {
				return fmt.Errorf("veth: %w", err)
			}
			links := [2]*link.UDP{}
			for i, h := range hs {
				nh, err := netlink.NewHandleAt(h)
				if err != nil {
					return err
				}
				l, err := nh.LinkByName(fmt.Sprintf("srpdece%d", i))
				if err == nil {
					err = nh.LinkSetMTU(l, mtu)
				}
				if err == nil {
					err = nh.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: addrs[i].AsSlice(), Mask: net.CIDRMask(24, 32)}})
				}
				if err == nil {
					err = nh.LinkSetUp(l)
				}
				nh.Close()
				if err != nil {
					return fmt.Errorf("namespace %s: %w", names[i], err)
				}
				if err := netns.Set(h); err != nil {
					return err
				}
				links[i], err = link.ListenUDP(context.Background(), netip.AddrPortFrom(addrs[i], 0), link.UDPOptions{GSO: true, GRO: true})
				if err != nil {
					return fmt.Errorf("listen in %s: %w", names[i], err)
				}
			}
			r.la, r.lb = links[0], links[1]
			return netns.Set(orig)
		}()
		ch <- r
	}()
	r := <-ch
	if r.err != nil {
		if r.la != nil {
			r.la.Close()
		}
		t.Skipf("SKIP: network namespaces: %v", r.err)
	}
	if !r.la.GSO() {
		r.la.Close()
		r.lb.Close()
		t.Skip("SKIP: the kernel has no UDP GSO")
	}
	return r.la, r.lb
}

// Between two srpd devices on different hosts (network namespaces, veth MTU 1500, RoCE MTU
// 1024) the data goes in GSO super-packets both ways once the CM has negotiated it, and
// arrives intact; QPs connected without the negotiation send every packet alone.
func TestSegmentableGSOOverVeth(t *testing.T) {
	for _, viaCM := range []bool{true, false} {
		t.Run(fmt.Sprintf("cm=%v", viaCM), func(t *testing.T) {
			la, lb := vethPair(t, 1500)
			o := nodeOpts{memSize: 4 << 20}
			a, b := newNode(t, la, o), newNode(t, lb, o)
			defer a.close()
			defer b.close()
			if viaCM {
				p := &cmPair{a: a, b: b, mtu: transport.MTU1024}
				p.configure(t, fastCM)
				a.dev.SetPeerUDPPort(b.addr.Addr(), b.addr.Port())
				connectCM(t, p, []byte("req"), []byte("rep"))
			} else {
				connect(a, b, connOpts{mtu: transport.MTU1024})
			}
			if segmentable(a) != viaCM || segmentable(b) != viaCM {
				t.Fatalf("segmentable: a %v, b %v; want %v", segmentable(a), segmentable(b), viaCM)
			}
			if got := a.qp.Query().PathMTU; got != transport.MTU1024 {
				t.Fatalf("path MTU %v over a 1500-byte veth, want 1024", got)
			}
			before := a.dev.Stats()
			writeReadMiB(t, a, b)
			sa, sb := la.Stats(), lb.Stats()
			// The WRITE's packets leave with their payload read from a's MR by the kernel
			// (linkref.go); the READ responses never do.
			refs := a.dev.Stats().TxRefPackets - before.TxRefPackets
			if viaCM && refs < 1024 {
				t.Fatalf("RDMA WRITE of 1024 packets: %d sent with the payload by reference", refs)
			}
			if st := b.dev.Stats(); st.TxRefPackets != 0 || (!viaCM && refs != 0) {
				t.Fatalf("payloads sent by reference: a %d, b %d (READ responses: never; without the CM: never)", refs, st.TxRefPackets)
			}
			t.Logf("a: %d packets in %d GSO messages sent; b: %d packets in %d GSO messages, %d GRO messages received by a",
				sa.TxPackets, sa.TxGSOMessages, sb.TxPackets, sb.TxGSOMessages, sa.RxGROMessages)
			if viaCM && (sa.TxGSOMessages == 0 || sb.TxGSOMessages == 0) {
				t.Fatalf("negotiated, yet GSO messages sent: a %d, b %d", sa.TxGSOMessages, sb.TxGSOMessages)
			}
			if !viaCM && (sa.TxGSOMessages != 0 || sb.TxGSOMessages != 0) {
				t.Fatalf("not negotiated, yet GSO messages sent: a %d, b %d", sa.TxGSOMessages, sb.TxGSOMessages)
			}
			if d := sa.RxICRCDrops + sb.RxICRCDrops + sa.RxMalformedDrops + sb.RxMalformedDrops; d != 0 {
				t.Fatalf("%d packets dropped as corrupt or malformed", d)
			}
		})
	}
}

// writeReadMiB has a write its first MiB into b's second and read b's first MiB into its
// second (4 MiB nodes), and checks both copies.
func writeReadMiB(t *testing.T, a, b *node) {
	t.Helper()
	const n = 1 << 20
	fill(a.bytes(0, n), 1)
	fill(b.bytes(0, n), 2)
	if err := a.qp.PostSend([]transport.SendWR{
		{ID: 1, Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled, SGL: []transport.SGE{a.sge(0, n)},
			RemoteAddr: b.mem.Addr() + n, RKey: b.mr.RKey()},
		{ID: 2, Opcode: transport.WRRDMARead, Flags: transport.SendSignaled, SGL: []transport.SGE{a.sge(n, n)},
			RemoteAddr: b.mem.Addr(), RKey: b.mr.RKey()},
	}); err != nil {
		t.Fatal(err)
	}
	wantWC(t, waitWC(t, a.scq, 20*time.Second), 1, transport.WCSuccess, transport.WCRDMAWrite)
	wantWC(t, waitWC(t, a.scq, 20*time.Second), 2, transport.WCSuccess, transport.WCRDMARead)
	if !bytes.Equal(b.bytes(n, n), a.bytes(0, n)) || !bytes.Equal(a.bytes(n, n), b.bytes(0, n)) {
		t.Fatal("data differs after RDMA WRITE/READ")
	}
}
