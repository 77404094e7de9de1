package softroce

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
)

// Payload by reference on the loopback path (loopref.go).

// loopRefPair is two nodes on one device (their packets take the loopback path) with 16 SGEs
// and 4 MiB of memory each, connected at mtu with local ACK timeout exponent timeout (0: none;
// tests that count packets use none, or one long enough not to retransmit meanwhile).
func loopRefPair(t *testing.T, mtu transport.MTU, timeout uint8) (a, b *node) {
	t.Helper()
	la, _ := link.NewPipe(netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2"), link.PipeConfig{})
	o := nodeOpts{memSize: 4 << 20, maxSGE: 16}
	a = newNode(t, la, o)
	b = newNodeOn(t, a.dev, o)
	t.Cleanup(a.close)
	connect(a, b, connOpts{mtu: mtu, timeout: timeout, noTimeout: timeout == 0})
	return a, b
}

// fastMR is a fast-reg MR of n registered over npages pages of n's memory from byte offset
// base on, in a scrambled order, at an IOVA that is not page aligned.
type fastMR struct {
	n     *node
	mr    transport.MR
	key   uint32
	iova  uint64
	off   uint64   // IOVA's offset in its page
	pages []uint64 // device addresses, in IOVA order
}

func newFastMR(t *testing.T, n *node, base, npages int, acc transport.Access) *fastMR {
	t.Helper()
	m, err := n.pd.AllocFastRegMR(npages)
	if err != nil {
		t.Fatal(err)
	}
	f := &fastMR{n: n, mr: m, key: m.Index()<<8 | 0x5A, iova: 0x7000_0000 + 0x123, off: 0x123}
	for i := 0; i < npages; i++ {
		// Page i of the IOVA range is page (i*5+3) mod npages of the area (5 and npages
		// coprime): neighbours in IOVA are not neighbours in memory.
		f.pages = append(f.pages, n.mem.Addr()+uint64(base)+uint64((i*5+3)%npages)*4096)
	}
	if err := n.qp.PostSend([]transport.SendWR{{ID: 0xF00, Opcode: transport.WRRegMR, Flags: transport.SendSignaled,
		Reg: transport.RegMRWR{MR: m, Key: f.key, Access: acc, IOVA: f.iova,
			Length: uint64(npages)*4096 - f.off, PageSize: 4096, Pages: f.pages}}}); err != nil {
		t.Fatal(err)
	}
	wantWC(t, waitWC(t, n.scq, 5*time.Second), 0xF00, transport.WCSuccess, transport.WCRegMR)
	return f
}

// host returns n's memory bytes behind the MR's [iova+x, iova+x+length), in order (a copy).
func (f *fastMR) host(x, length int) []byte {
	var out []byte
	for length > 0 {
		po := uint64(x) + f.off
		in := int(po % 4096)
		k := min(length, 4096-in)
		off := int(f.pages[po/4096]-f.n.mem.Addr()) + in
		out = append(out, f.n.mem.Bytes()[off:off+k]...)
		x += k
		length -= k
	}
	return out
}

func (f *fastMR) sge(x, length int) transport.SGE {
	return transport.SGE{Addr: f.iova + uint64(x), Length: uint32(length), LKey: f.key}
}

// gatherHost is the bytes an SGL of n's regular MR or of f names, in order.
func gatherHost(n *node, f *fastMR, sgl []transport.SGE) []byte {
	var out []byte
	for _, s := range sgl {
		if f != nil && s.LKey == f.key {
			out = append(out, f.host(int(s.Addr-f.iova), int(s.Length))...)
			continue
		}
		off := int(s.Addr - n.mem.Addr())
		out = append(out, n.mem.Bytes()[off:off+int(s.Length)]...)
	}
	return out
}

func post(t *testing.T, n *node, wr transport.SendWR) transport.WC {
	t.Helper()
	wr.Flags |= transport.SendSignaled
	if err := n.qp.PostSend([]transport.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	return waitWC(t, n.scq, 10*time.Second)
}

// TestLoopbackRefWriteRead: RDMA WRITEs and READs between two QPs of one device, of several
// MTUs long, at unaligned addresses, over multi-SGE SGLs and fast-reg MRs whose pages are
// scrambled (so a packet's bytes lie in several ranges), arrive byte for byte, and their
// packets are carried by reference; an SGL too fragmented for a reference (more than
// maxRefSegs ranges per packet) falls back to the copy.
func TestLoopbackRefWriteRead(t *testing.T) {
	for _, mtu := range []transport.MTU{transport.MTU1024, transport.MTU4096} {
		t.Run(mtu.String(), func(t *testing.T) {
			a, b := loopRefPair(t, mtu, 14)
			acc := transport.AccessLocalWrite | transport.AccessRemoteWrite | transport.AccessRemoteRead
			fa := newFastMR(t, a, 2<<20, 16, acc) // a's local SGEs
			fb := newFastMR(t, b, 2<<20, 16, acc) // b's remote buffer
			fill(a.mem.Bytes(), 1)
			fill(b.mem.Bytes(), 2)
			before := a.dev.Stats()

			// WRITE: a's regular and fast-reg SGEs → b's regular MR, unaligned.
			sgl := []transport.SGE{a.sge(5, 3001), a.sge(20000+3, 7777), fa.sge(17, 9000), a.sge(70001, 1)}
			want := gatherHost(a, fa, sgl)
			const boff = 4096*40 + 11
			wc := post(t, a, transport.SendWR{ID: 1, Opcode: transport.WRRDMAWrite, SGL: sgl,
				RemoteAddr: b.mem.Addr() + boff, RKey: b.mr.RKey()})
			wantWC(t, wc, 1, transport.WCSuccess, transport.WCRDMAWrite)
			equal(t, "WRITE to a regular MR", b.bytes(boff, len(want)), want)

			// WRITE: a's regular SGEs → b's fast-reg MR (scrambled pages), unaligned.
			sgl = []transport.SGE{a.sge(100003, 12345), a.sge(300000, 4096), a.sge(400007, 999)}
			want = gatherHost(a, nil, sgl)
			wc = post(t, a, transport.SendWR{ID: 2, Opcode: transport.WRRDMAWrite, SGL: sgl,
				RemoteAddr: fb.iova + 7, RKey: fb.key})
			wantWC(t, wc, 2, transport.WCSuccess, transport.WCRDMAWrite)
			equal(t, "WRITE to a fast-reg MR", fb.host(7, len(want)), want)

			// READ: b's fast-reg MR (several ranges per response) → a's multi-SGE SGL.
			fill(b.mem.Bytes(), 3)
			sgl = []transport.SGE{a.sge(500001, 2999), fa.sge(4000, 13000), a.sge(600003, 5)}
			n := 2999 + 13000 + 5
			wc = post(t, a, transport.SendWR{ID: 3, Opcode: transport.WRRDMARead, SGL: sgl,
				RemoteAddr: fb.iova + 4093, RKey: fb.key})
			wantWC(t, wc, 3, transport.WCSuccess, transport.WCRDMARead)
			equal(t, "READ from a fast-reg MR", gatherHost(a, fa, sgl), fb.host(4093, n))

			// READ: b's regular MR, unaligned → a's SGL.
			fill(b.mem.Bytes(), 4)
			sgl = []transport.SGE{fa.sge(1, 8191), a.sge(700005, 10000)}
			wc = post(t, a, transport.SendWR{ID: 4, Opcode: transport.WRRDMARead, SGL: sgl,
				RemoteAddr: b.mem.Addr() + 12345, RKey: b.mr.RKey()})
			wantWC(t, wc, 4, transport.WCSuccess, transport.WCRDMARead)
			equal(t, "READ from a regular MR", gatherHost(a, fa, sgl), b.bytes(12345, 18191))

			mid := a.dev.Stats()
			if mid.LoopRefPackets == before.LoopRefPackets {
				t.Fatalf("no packet carried by reference (%d looped back)", mid.LoopPackets-before.LoopPackets)
			}
			if mid.TxPackets != 0 || mid.LoopRefDrops != 0 {
				t.Fatalf("%d packets through the link, %d dropped references", mid.TxPackets, mid.LoopRefDrops)
			}

			// 16 SGEs of 200 bytes with gaps: every full packet spans more than maxRefSegs
			// ranges and the last one is below refMinPayload: all copied.
			sgl = sgl[:0]
			for i := 0; i < 16; i++ {
				sgl = append(sgl, a.sge(800000+i*201, 200))
			}
			fill(a.mem.Bytes(), 5)
			want = gatherHost(a, nil, sgl)
			wc = post(t, a, transport.SendWR{ID: 5, Opcode: transport.WRRDMAWrite, SGL: sgl,
				RemoteAddr: b.mem.Addr() + 3, RKey: b.mr.RKey()})
			wantWC(t, wc, 5, transport.WCSuccess, transport.WCRDMAWrite)
			equal(t, "fragmented WRITE", b.bytes(3, len(want)), want)
			if s := a.dev.Stats(); s.LoopRefPackets != mid.LoopRefPackets {
				t.Fatalf("fragmented WRITE: %d packets carried by reference, want 0", s.LoopRefPackets-mid.LoopRefPackets)
			}
		})
	}
}

// TestLoopbackRefCounters: at MTU 4096 a 64 KiB WRITE and a 64 KiB READ from regular MRs are
// 16 packets each, all carried by reference (LoopRefBytes: every payload byte copied once,
// from MR to MR); a SEND of 3000 bytes too; a small SEND and the ACKs are copied.
func TestLoopbackRefCounters(t *testing.T) {
	a, b := loopRefPair(t, transport.MTU4096, 0)
	fill(a.mem.Bytes(), 6)
	fill(b.mem.Bytes(), 7)
	const n = 64 << 10
	step := func(what string, wantPkts, wantBytes uint64, f func()) {
		t.Helper()
		s0 := a.dev.Stats()
		f()
		s1 := a.dev.Stats()
		if p, by := s1.LoopRefPackets-s0.LoopRefPackets, s1.LoopRefBytes-s0.LoopRefBytes; p != wantPkts || by != wantBytes {
			t.Errorf("%s: %d packets, %d bytes carried by reference; want %d, %d", what, p, by, wantPkts, wantBytes)
		}
	}
	step("64 KiB WRITE", 16, n, func() {
		wantWC(t, post(t, a, transport.SendWR{ID: 1, Opcode: transport.WRRDMAWrite, SGL: []transport.SGE{a.sge(0, n)},
			RemoteAddr: b.mem.Addr() + n, RKey: b.mr.RKey()}), 1, transport.WCSuccess, transport.WCRDMAWrite)
		equal(t, "WRITE", b.bytes(n, n), a.bytes(0, n))
	})
	step("64 KiB READ", 16, n, func() {
		wantWC(t, post(t, a, transport.SendWR{ID: 2, Opcode: transport.WRRDMARead, SGL: []transport.SGE{a.sge(2*n, n)},
			RemoteAddr: b.mem.Addr() + 3*n, RKey: b.mr.RKey()}), 2, transport.WCSuccess, transport.WCRDMARead)
		equal(t, "READ", a.bytes(2*n, n), b.bytes(3*n, n))
	})
	sendRecv := func(id uint64, size int) {
		if err := b.qp.PostRecv([]transport.RecvWR{{ID: id, SGL: []transport.SGE{b.sge(5*n, 4096)}}}); err != nil {
			t.Fatal(err)
		}
		wantWC(t, post(t, a, transport.SendWR{ID: id, Opcode: transport.WRSend, SGL: []transport.SGE{a.sge(4*n+1, size)}}),
			id, transport.WCSuccess, transport.WCSend)
		wc := waitWC(t, b.rcq, 5*time.Second)
		wantWC(t, wc, id, transport.WCSuccess, transport.WCRecv)
		if wc.ByteLen != uint32(size) {
			t.Fatalf("SEND of %d bytes received as %d", size, wc.ByteLen)
		}
		equal(t, "SEND", b.bytes(5*n, size), a.bytes(4*n+1, size))
	}
	step("3000-byte SEND", 1, 3000, func() { sendRecv(3, 3000) })
	step("100-byte SEND", 0, 0, func() { sendRecv(4, 100) })
}

// stallLoop makes the test the loopback queue's drainer (loop.go: active), once the queue is
// idle: what is sent to the device itself stays queued until the test processes it.
func stallLoop(t *testing.T, d *Device) {
	t.Helper()
	l := &d.loop
	for deadline := time.Now().Add(5 * time.Second); ; {
		l.mu.Lock()
		if !l.active {
			l.active = true
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the loopback queue never went idle")
		}
		time.Sleep(time.Millisecond)
	}
}

// waitQueued waits until the loopback queue holds n packets and, unless payload is nil, checks
// that each carries its payload (a part of payload) by reference, not in its buffer.
func waitQueued(t *testing.T, d *Device, n int, payload []byte) {
	t.Helper()
	l := &d.loop
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		l.mu.Lock()
		k := len(l.q) - l.head
		if k >= n {
			for _, e := range l.q[l.head:] {
				if payload == nil {
					break
				}
				if e.ref.n == 0 {
					l.mu.Unlock()
					t.Fatalf("a queued packet of %d bytes carries its payload", len(e.pk.Buf))
				}
				if bytes.Contains(payload, e.pk.Buf[40:len(e.pk.Buf)-8]) {
					l.mu.Unlock()
					t.Fatal("a queued packet carried by reference holds the payload too")
				}
			}
			l.mu.Unlock()
			if k > n {
				t.Fatalf("%d packets queued, want %d", k, n)
			}
			return
		}
		l.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("%d packets queued after 5 s, want %d", k, n)
		}
	}
}

// TestLoopbackRefFreedSource: the source memory of packets carried by reference is
// deregistered and freed (munmapped) while they wait in the loopback queue. Processing them
// must not touch the unmapped memory (a SIGSEGV, if the references were resolved earlier or
// the memory not looked up again): they are dropped (LoopRefDrops), the WQE fails as any use
// of freed memory does, and the device goes on working. Memory deregistered but not freed is
// still read (stale bytes, by design).
func TestLoopbackRefFreedSource(t *testing.T) {
	const n = 64 << 10 // 16 packets at MTU 4096
	// About 270 ms: no retransmission while the test holds the packets queued, one soon after.
	const slowTimeout = 16
	later := func(t *testing.T, d *Device) {
		t.Helper()
		// Later traffic on new QPs of the same device works, by reference.
		o := nodeOpts{memSize: 1 << 20}
		c, e := newNodeOn(t, d, o), newNodeOn(t, d, o)
		connect(c, e, connOpts{mtu: transport.MTU4096, noTimeout: true})
		fill(c.mem.Bytes(), 9)
		s0 := d.Stats()
		wantWC(t, post(t, c, transport.SendWR{ID: 1, Opcode: transport.WRRDMAWrite, SGL: []transport.SGE{c.sge(0, n)},
			RemoteAddr: e.mem.Addr() + 7, RKey: e.mr.RKey()}), 1, transport.WCSuccess, transport.WCRDMAWrite)
		equal(t, "later WRITE", e.bytes(7, n), c.bytes(0, n))
		wantWC(t, post(t, c, transport.SendWR{ID: 2, Opcode: transport.WRRDMARead, SGL: []transport.SGE{c.sge(n, n)},
			RemoteAddr: e.mem.Addr() + 3, RKey: e.mr.RKey()}), 2, transport.WCSuccess, transport.WCRDMARead)
		equal(t, "later READ", c.bytes(n, n), e.bytes(3, n))
		if s := d.Stats(); s.LoopRefPackets-s0.LoopRefPackets != 32 || s.LoopRefDrops != s0.LoopRefDrops {
			t.Fatalf("later traffic: %d packets by reference (want 32), %d more dropped",
				s.LoopRefPackets-s0.LoopRefPackets, s.LoopRefDrops-s0.LoopRefDrops)
		}
	}
	alloc := func(t *testing.T, nd *node, acc transport.Access) (transport.Memory, transport.MR) {
		t.Helper()
		mem, err := nd.dev.AllocMemory(n)
		if err != nil {
			t.Fatal(err)
		}
		mr, err := nd.pd.RegMR(mem.Addr(), n, acc)
		if err != nil {
			t.Fatal(err)
		}
		fill(mem.Bytes(), 8)
		return mem, mr
	}
	// queueWrite posts a WRITE of a fresh buffer of a to b's buffer and returns once its 16
	// packets wait in the stalled loopback queue, with the bytes they should carry.
	queueWrite := func(t *testing.T, a, b *node) (transport.Memory, transport.MR, []byte) {
		t.Helper()
		mem, mr := alloc(t, a, transport.AccessLocalWrite)
		payload := append([]byte(nil), mem.Bytes()...)
		stallLoop(t, a.dev)
		if err := a.qp.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled,
			SGL: []transport.SGE{{Addr: mem.Addr(), Length: n, LKey: mr.LKey()}}, RemoteAddr: b.mem.Addr(), RKey: b.mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
		waitQueued(t, a.dev, 16, payload)
		return mem, mr, payload
	}
	release := func(t *testing.T, mem transport.Memory, mr transport.MR) {
		t.Helper()
		if err := mr.Close(); err != nil {
			t.Fatal(err)
		}
		if err := mem.Free(); err != nil {
			t.Fatal(err)
		}
	}

	// freeQueued frees the source of the 16 queued packets, drains the queue (as its drainer:
	// processed, then idle again) and checks that all 16 were dropped, that a's WQE fails with
	// st once retransmitted, and that later traffic works.
	freeQueued := func(t *testing.T, a *node, mem transport.Memory, mr transport.MR, st transport.WCStatus, op transport.WCOpcode) {
		t.Helper()
		d := a.dev
		release(t, mem, mr)
		d.loopDrain(-1)
		if s := d.Stats(); s.LoopRefDrops != 16 {
			t.Fatalf("%d packets dropped for freed memory, want 16", s.LoopRefDrops)
		}
		wantWC(t, waitWC(t, a.scq, 10*time.Second), 1, st, op)
		later(t, d)
	}

	t.Run("WRITE", func(t *testing.T) {
		a, b := loopRefPair(t, transport.MTU4096, slowTimeout)
		mem, mr, _ := queueWrite(t, a, b)
		// The retransmission checks the lkey again: the MR is gone.
		freeQueued(t, a, mem, mr, transport.WCLocProtErr, transport.WCRDMAWrite)
	})

	t.Run("READ", func(t *testing.T) {
		a, b := loopRefPair(t, transport.MTU4096, slowTimeout)
		d := a.dev
		mem, mr := alloc(t, b, transport.AccessRemoteRead)
		payload := append([]byte(nil), mem.Bytes()...)
		stallLoop(t, d)
		if err := a.qp.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.WRRDMARead, Flags: transport.SendSignaled,
			SGL: []transport.SGE{a.sge(0, n)}, RemoteAddr: mem.Addr(), RKey: mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
		// Process the READ request alone: its 16 responses join the queue.
		waitQueued(t, d, 1, nil)
		bufs := newRxBufs(loopBatch, rxInline, true)
		d.loop.mu.Lock()
		d.loop.take(bufs, 1)
		d.loop.mu.Unlock()
		d.rxBatch(bufs, 1)
		waitQueued(t, d, 16, payload)
		// The READ is requested again; the responder finds no MR.
		freeQueued(t, a, mem, mr, transport.WCRemAccessErr, transport.WCRDMARead)
	})

	t.Run("deregistered", func(t *testing.T) {
		a, b := loopRefPair(t, transport.MTU4096, slowTimeout)
		d := a.dev
		mem, mr, payload := queueWrite(t, a, b)
		if err := mr.Close(); err != nil {
			t.Fatal(err)
		}
		d.loopDrain(-1)
		// Still mapped: read as it is, and the WRITE completes.
		wantWC(t, waitWC(t, a.scq, 10*time.Second), 1, transport.WCSuccess, transport.WCRDMAWrite)
		equal(t, "WRITE from deregistered memory", b.bytes(0, n), payload)
		if err := mem.Free(); err != nil {
			t.Fatal(err)
		}
		later(t, d)
	})
}
