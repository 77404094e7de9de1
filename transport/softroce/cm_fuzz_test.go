package softroce

import (
	"context"
	"encoding/binary"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/fuzzbound"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/cm"
	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// FuzzQP1 injects arbitrary MADs into QP1 of a device that listens, accepts, rejects and
// disconnects meanwhile: the engine must never panic or wedge. An input is a control byte
// followed by a MAD (zero-padded to 256 bytes). When the control byte has bit 7 set, the MAD's
// Remote Comm ID (bytes 28-31) and a DREQ's Remote QPN are pointed at one of the device's live
// connections (chosen by the low bits), so that the states after the REQ are reached too.
func FuzzQP1(f *testing.F) {
	for _, s := range cmFuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e := cmFuzzSetup(t)
		fuzzbound.Run(t, func() {
			defer stopOnAbort()
			fuzzOne(abortTB{t}, e, data)
		})
	})
}

// fuzzOne injects one input and waits (bounded) until the receive loop has handled it.
func fuzzOne(t tb, e *cmFuzzEnv, data []byte) {
	var ctl byte
	if len(data) > 0 {
		ctl, data = data[0], data[1:]
	}
	mad := make([]byte, wire.MADLen)
	copy(mad, data)
	d := e.dev.dev
	if ctl&0x80 != 0 {
		d.mu.Lock()
		ids := make([]cm.ConnID, 0, len(d.cm.conns))
		for id := range d.cm.conns {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		if len(ids) > 0 {
			rec := d.cm.conns[ids[int(ctl&0x7F)%len(ids)]]
			binary.BigEndian.PutUint32(mad[28:], uint32(rec.id))
			if binary.BigEndian.Uint16(mad[16:]) == cm.AttrDREQ && rec.qp != nil {
				mad[32], mad[33], mad[34] = byte(rec.qp.qpn>>16), byte(rec.qp.qpn>>8), byte(rec.qp.qpn)
			}
		}
		d.mu.Unlock()
	}
	buf := make([]byte, link.MaxPacket)
	pk, err := wire.Layout(buf, wire.UDSendOnly, wire.MADLen)
	if err != nil {
		t.Fatal(err)
	}
	pk.BTH().SetDestQP(wire.QPGSI)
	pk.DETH().SetQKey(wire.GSIQKey)
	pk.DETH().SetSrcQP(wire.QPGSI)
	copy(pk.Payload(), mad)
	before := d.CMStats()
	if _, err := e.dev.dev.lnk.(*link.MemLink).Peer().Send([]link.Packet{{Buf: pk.Bytes(),
		Dst: netip.AddrPortFrom(e.dev.addr.Addr(), link.UDPPort)}}); err != nil {
		t.Fatal(err)
	}
	// Wait until the receive loop has handled it (it always reaches the CM).
	for i := 0; ; i++ {
		st := d.CMStats()
		if st.RxMADs+st.RxMalformed > before.RxMADs+before.RxMalformed {
			break
		}
		if i > 20000 {
			t.Fatalf("MAD not handled: %+v", st)
		}
		time.Sleep(500 * time.Microsecond)
	}
}

type cmFuzzEnv struct {
	dev *node
}

var (
	cmFzOnce sync.Once
	cmFz     *cmFuzzEnv
)

// cmFuzzSetup opens the device once per process: a wildcard listener on cmPort and a goroutine
// that answers requests in turn with Reject, Accept (then Disconnect) and silence.
func cmFuzzSetup(t *testing.T) *cmFuzzEnv {
	cmFzOnce.Do(func() {
		a, b := pipeAddrs()
		la, lb := link.NewPipe(a, b, link.PipeConfig{QueueLen: 256})
		n := newNode(t, lb, nodeOpts{memSize: 64 << 10, cqDepth: 1 << 16})
		cfg := fastCM
		cfg.DecisionTimeout = 20 * time.Millisecond
		if err := n.dev.ConfigureCM(cfg); err != nil {
			t.Fatal(err)
		}
		l, err := n.dev.Listen(netip.Addr{}, cmPort)
		if err != nil {
			t.Fatal(err)
		}
		// Drain what the device sends (nobody reads la otherwise).
		go recvLoop(la, 32, func([]link.Packet) {})
		go func() {
			var prev transport.CMConn
			var prevQP transport.QP
			for i := 0; ; i++ {
				req, err := l.Accept(context.Background())
				if err != nil {
					return
				}
				switch i % 3 {
				case 0:
					_ = req.Reject([]byte("no"), transport.RejectConsumerDefined)
				case 1:
					if prev != nil {
						_ = prev.Disconnect(nil)
						_ = prevQP.Close()
						prev, prevQP = nil, nil
					}
					q, err := n.pd.CreateQP(transport.QPInitAttr{SendCQ: n.scq, RecvCQ: n.rcq,
						Cap: transport.QPCap{MaxSendWR: 2, MaxRecvWR: 2}})
					if err != nil {
						_ = req.Reject(nil, transport.RejectNoResources)
						continue
					}
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
					c, err := req.Accept(ctx, q, []byte("yes"), transport.ConnParam{})
					cancel()
					if err != nil {
						_ = q.Close()
						continue
					}
					prev, prevQP = c, q
				}
			}
		}()
		drain := make([]transport.WC, 256)
		go func() {
			for {
				n.scq.Poll(drain)
				n.rcq.Poll(drain)
				time.Sleep(10 * time.Millisecond)
			}
		}()
		cmFz = &cmFuzzEnv{dev: n}
	})
	return cmFz
}

// cmFuzzSeeds are well-formed CM messages: REQs (to the listener, to another port, with a bad
// RDMA CM header), every other message type both as is and aimed at a live connection, and
// junk.
func cmFuzzSeeds() [][]byte {
	var seeds [][]byte
	peer, us := pipeAddrs()
	mgr, err := cm.NewManager(cm.Config{GUID: 0x0200_00ff_fe00_0001})
	if err != nil {
		panic(err)
	}
	var out cm.Outputs
	for i, port := range []uint16{cmPort, cmPort, 4242} {
		out.Reset()
		if _, err := mgr.Dial(0, &cm.DialParams{LocalAddr: peer, RemoteAddr: us, DstPort: port,
			QPN: uint32(0x100 + i), PrivateData: []byte("seed")}, &out); err != nil {
			panic(err)
		}
		for _, m := range out.MADs {
			seeds = append(seeds, append([]byte{0}, m.MAD[:]...))
		}
	}
	bad := slices.Clone(seeds[0])
	bad[1+164] = 1 // RDMA CM header version
	seeds = append(seeds, bad)
	for _, attr := range []uint16{cm.AttrREP, cm.AttrRTU, cm.AttrREJ, cm.AttrMRA, cm.AttrDREQ, cm.AttrDREP,
		cm.AttrSIDRREQ, cm.AttrSIDRREP, cm.AttrLAP, cm.AttrAPR} {
		m := make([]byte, wire.MADLen)
		cm.InitMAD(m, attr, 0x1234)
		binary.BigEndian.PutUint32(m[24:], 0xABCD0001)
		seeds = append(seeds, append([]byte{0}, m...), append([]byte{0x80}, m...))
	}
	rej := make([]byte, wire.MADLen)
	cm.InitMAD(rej, cm.AttrREJ, 1)
	binary.BigEndian.PutUint16(rej[34:], uint16(transport.RejectTimeout))
	seeds = append(seeds, append([]byte{0x81}, rej...), []byte{}, []byte{0, 1, 7, 2, 3})
	return seeds
}
