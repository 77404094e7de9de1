package softroce

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
)

// SGE.Host: a SEND's and an RDMA WRITE's bytes taken from process memory, mixed with registered
// SGEs, arrive intact on each path a packet can take: through a link with ICRCs (pipes), to a
// QP of the same device (loopback), and to an srpd peer without ICRC, where the payload goes to
// the kernel by reference.
func TestHostSGE(t *testing.T) {
	type pair struct {
		a, b  *node
		byRef bool // to the link by reference
		loop  bool // to the loopback queue by reference
	}
	opts := nodeOpts{memSize: 4 << 20, inline: 64}
	paths := map[string]func(t *testing.T) pair{
		"pipe": func(t *testing.T) pair {
			a, b, _, _ := newPipePair(t, pipeDefault(), opts)
			connect(a, b, connOpts{})
			return pair{a, b, false, false}
		},
		"loopback": func(t *testing.T) pair {
			a, other, _, _ := newPipePair(t, pipeDefault(), opts)
			other.close()
			b := newNodeOn(t, a.dev, opts)
			connect(a, b, connOpts{})
			return pair{a, b, false, true}
		},
		"udp-no-icrc": func(t *testing.T) pair {
			a, b, _, _ := udpPair(t, false, false, true, opts)
			return pair{a, b, true, false}
		},
	}
	for name, mk := range paths {
		t.Run(name, func(t *testing.T) {
			p := mk(t)
			a, b := p.a, p.b
			defer a.close()
			defer b.close()
			if !a.dev.Attr().HostSGE {
				t.Fatal("softroce does not announce DeviceAttr.HostSGE")
			}
			// 64 KiB of host memory in two pieces (4-byte multiples, as a RAM LUN's chunks),
			// and an odd registered piece between them.
			h1, h2 := make([]byte, 40<<10), make([]byte, 24<<10)
			fill(h1, 11)
			fill(h2, 12)
			fill(a.bytes(0, 1001), 13)
			want := append(append(append([]byte(nil), h1...), a.bytes(0, 1001)...), h2...)
			clear(b.bytes(0, len(want)))
			refs, loopRefs := a.dev.Stats().TxRefPackets, a.dev.Stats().LoopRefPackets
			mustPostSend(t, a.qp, []transport.SendWR{{ID: 1, Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled,
				SGL:        []transport.SGE{{Host: h1, Length: uint32(len(h1))}, a.sge(0, 1001), {Host: h2, Length: uint32(len(h2))}},
				RemoteAddr: b.mem.Addr(), RKey: b.mr.RKey()}})
			wantWC(t, waitWC(t, a.scq, 10*time.Second), 1, transport.WCSuccess, transport.WCRDMAWrite)
			if !bytes.Equal(b.bytes(0, len(want)), want) {
				t.Fatal("RDMA WRITE from host memory: data differs")
			}
			if got := a.dev.Stats().TxRefPackets - refs; p.byRef != (got > 0) {
				t.Fatalf("packets with their payload by reference: %d (want some: %v)", got, p.byRef)
			}
			// On the loopback path the 4 KiB packets inside h1 and h2 (15 of 17) keep their
			// payload in place; the one across the registered piece and the last (1001 bytes,
			// pad) are copied.
			if got := a.dev.Stats().LoopRefPackets - loopRefs; p.loop != (got >= 15) || (!p.loop && got != 0) {
				t.Fatalf("loopback packets by reference: %d (want ≥ 15: %v)", got, p.loop)
			}

			// A SEND (and an inline one) from host memory into a receive buffer.
			off := 1 << 20
			if err := b.qp.PostRecv([]transport.RecvWR{{ID: 2, SGL: []transport.SGE{b.sge(off, 8192)}},
				{ID: 3, SGL: []transport.SGE{b.sge(off+8192, 64)}}}); err != nil {
				t.Fatal(err)
			}
			small := []byte("host bytes, inline")
			mustPostSend(t, a.qp, []transport.SendWR{
				{ID: 2, Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: []transport.SGE{{Host: h2[:5000], Length: 5000}}},
				{ID: 3, Opcode: transport.WRSend, Flags: transport.SendSignaled | transport.SendInline, SGL: []transport.SGE{{Host: small, Length: uint32(len(small))}}},
			})
			for id := uint64(2); id <= 3; id++ {
				wantWC(t, waitWC(t, a.scq, 10*time.Second), id, transport.WCSuccess, transport.WCSend)
				wc := waitWC(t, b.rcq, 10*time.Second)
				if wc.ID != id || wc.Status != transport.WCSuccess {
					t.Fatalf("receive %+v, want ID %d", wc, id)
				}
			}
			if !bytes.Equal(b.bytes(off, 5000), h2[:5000]) || !bytes.Equal(b.bytes(off+8192, len(small)), small) {
				t.Fatal("SEND from host memory: data differs")
			}
		})
	}
}

// Host memory only as a source: the post fails, with nothing queued.
func TestHostSGERefused(t *testing.T) {
	a, b, _, _ := newPipePair(t, pipeDefault(), nodeOpts{})
	defer a.close()
	defer b.close()
	connect(a, b, connOpts{})
	h := make([]byte, 512)
	for _, tc := range []struct {
		name string
		post func() error
	}{
		{"rdma read into host memory", func() error {
			return a.qp.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.WRRDMARead,
				SGL: []transport.SGE{{Host: h, Length: 512}}, RemoteAddr: b.mem.Addr(), RKey: b.mr.RKey()}})
		}},
		{"receive into host memory", func() error {
			return a.qp.PostRecv([]transport.RecvWR{{ID: 2, SGL: []transport.SGE{{Host: h, Length: 512}}}})
		}},
		{"length differs from the slice", func() error {
			return a.qp.PostSend([]transport.SendWR{{ID: 3, Opcode: transport.WRSend,
				SGL: []transport.SGE{{Host: h, Length: 511}}}})
		}},
	} {
		if err := tc.post(); !errors.Is(err, transport.ErrInvalidWR) {
			t.Errorf("%s: %v, want ErrInvalidWR", tc.name, err)
		}
	}
	expectNoWC(t, a.scq, 50*time.Millisecond)
}
