package softroce

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
)

// testSeed is the fault-injection seed: SOFTROCE_SEED if set, else 42 (deterministic runs).
func testSeed() uint64 {
	if v, err := strconv.ParseUint(os.Getenv("SOFTROCE_SEED"), 0, 64); err == nil {
		return v
	}
	return 42
}

var allMTUs = []transport.MTU{transport.MTU256, transport.MTU512, transport.MTU1024, transport.MTU2048, transport.MTU4096}

// pairMaker builds two connected-ready nodes (not yet connected) and returns a cleanup that
// closes them and checks for leaked goroutines.
type pairMaker func(t *testing.T, o nodeOpts) (a, b *node)

func pipeMaker(faults link.Faults) pairMaker {
	return func(t *testing.T, o nodeOpts) (*node, *node) {
		a, b, _, _ := newPipePair(t, link.PipeConfig{Seed: testSeed(), AtoB: faults, BtoA: faults, QueueLen: 1024}, o)
		t.Cleanup(func() { a.close(); b.close(); checkNoEngineGoroutines(t) })
		return a, b
	}
}

func udpMaker(addr string) pairMaker {
	return func(t *testing.T, o nodeOpts) (*node, *node) {
		ip := netip.MustParseAddr(addr)
		la, lb := ListenUDPPair(t, ip, ip, link.UDPOptions{})
		a, b := newNode(t, la, o), newNode(t, lb, o)
		t.Cleanup(func() { a.close(); b.close(); checkNoEngineGoroutines(t) })
		return a, b
	}
}

// lossy is the fault mix of the "again with loss" runs: 2% drop, 2% duplicate, 2% reorder.
var lossy = link.Faults{Drop: 0.02, Duplicate: 0.02, Reorder: 0.02, ReorderDistance: 3}

func TestConformancePipe(t *testing.T)      { conformance(t, pipeMaker(link.Faults{}), false) }
func TestConformancePipeLossy(t *testing.T) { conformance(t, pipeMaker(lossy), true) }
func TestConformanceUDP4(t *testing.T)      { conformance(t, udpMaker("127.0.0.1"), false) }
func TestConformanceUDP6(t *testing.T)      { conformance(t, udpMaker("::1"), false) }

const maxXfer = 4 << 20

func xferSizes(mtu int) []int {
	return []int{1, 3, mtu - 1, mtu, mtu + 1, 3*mtu + 7, 65536 + 13, 1 << 20, maxXfer}
}

func conformance(t *testing.T, mk pairMaker, lossyRun bool) {
	wait := 60 * time.Second
	co := connOpts{timeout: 10} // 4.2 ms local ACK timeout
	big := nodeOpts{memSize: 2*maxXfer + 1<<20}

	t.Run("SendRecv", func(t *testing.T) {
		for _, mtu := range allMTUs {
			t.Run(mtu.String(), func(t *testing.T) {
				a, b := mk(t, nodeOpts{memSize: 1 << 20})
				o := co
				o.mtu = mtu
				connect(a, b, o)
				m := mtu.Bytes()
				for i, n := range []int{0, 1, m - 1, m, m + 1, 5*m + 3, 65536 + 5} {
					for _, imm := range []bool{false, true} {
						fill(a.bytes(0, n), uint64(i))
						clear(b.bytes(0, 128<<10))
						id := uint64(i*2 + 1)
						if err := b.qp.PostRecv([]transport.RecvWR{{ID: id, SGL: []transport.SGE{b.sge(0, 40000), b.sge(40000, 80000)}}}); err != nil {
							t.Fatal(err)
						}
						wr := transport.SendWR{ID: id, Opcode: transport.WRSend, Flags: transport.SendSignaled, SGL: []transport.SGE{a.sge(0, n)}}
						if imm {
							wr.Opcode, wr.Imm = transport.WRSendWithImm, 0xdeadbeef^uint32(i)
						}
						if err := a.qp.PostSend([]transport.SendWR{wr}); err != nil {
							t.Fatal(err)
						}
						wantWC(t, waitWC(t, a.scq, wait), id, transport.WCSuccess, transport.WCSend)
						wc := waitWC(t, b.rcq, wait)
						wantWC(t, wc, id, transport.WCSuccess, transport.WCRecv)
						if int(wc.ByteLen) != n || wc.QPN != b.qp.QPN() {
							t.Fatalf("recv WC %+v, want %d bytes", wc, n)
						}
						if imm != (wc.Flags&transport.WCWithImm != 0) || (imm && wc.Imm != wr.Imm) {
							t.Fatalf("recv WC %+v: immediate data", wc)
						}
						equal(t, fmt.Sprintf("SEND %d", n), b.bytes(0, n), a.bytes(0, n))
					}
				}
			})
		}
	})

	t.Run("WriteRead", func(t *testing.T) {
		for _, mtu := range allMTUs {
			t.Run(mtu.String(), func(t *testing.T) {
				a, b := mk(t, big)
				o := co
				o.mtu = mtu
				connect(a, b, o)
				for i, n := range xferSizes(mtu.Bytes()) {
					t.Run(fmtSize(n), func(t *testing.T) {
						src, dst := a.bytes(0, n), a.bytes(maxXfer, n)
						fill(src, uint64(n)*31+uint64(i))
						clear(dst)
						off := 4096 + 5 // unaligned remote offset
						// WRITE a → b, then READ b → a.
						err := a.qp.PostSend([]transport.SendWR{
							{ID: 1, Opcode: transport.WRRDMAWrite, SGL: []transport.SGE{a.sge(0, n)},
								RemoteAddr: b.mem.Addr() + uint64(off), RKey: b.mr.RKey()},
							{ID: 2, Opcode: transport.WRRDMARead, Flags: transport.SendSignaled,
								SGL: []transport.SGE{a.sge(maxXfer, n)}, RemoteAddr: b.mem.Addr() + uint64(off), RKey: b.mr.RKey()},
						})
						if err != nil {
							t.Fatal(err)
						}
						wc := waitWC(t, a.scq, wait)
						wantWC(t, wc, 2, transport.WCSuccess, transport.WCRDMARead)
						if int(wc.ByteLen) != n {
							t.Fatalf("READ byte len %d, want %d", wc.ByteLen, n)
						}
						equal(t, "remote after WRITE", b.bytes(off, n), src)
						equal(t, "local after READ", dst, src)
					})
				}
			})
		}
	})

	t.Run("WriteWithImm", func(t *testing.T) {
		a, b := mk(t, nodeOpts{})
		connect(a, b, co)
		for i, n := range []int{0, 1, 5000} {
			fill(a.bytes(0, n), uint64(i+100))
			if err := b.qp.PostRecv([]transport.RecvWR{{ID: 50 + uint64(i)}}); err != nil {
				t.Fatal(err)
			}
			if err := a.qp.PostSend([]transport.SendWR{{ID: 9, Opcode: transport.WRRDMAWriteWithImm, Imm: 0x01020304,
				Flags: transport.SendSignaled, SGL: []transport.SGE{a.sge(0, n)}, RemoteAddr: b.mem.Addr() + 8192, RKey: b.mr.RKey()}}); err != nil {
				t.Fatal(err)
			}
			wantWC(t, waitWC(t, a.scq, wait), 9, transport.WCSuccess, transport.WCRDMAWrite)
			wc := waitWC(t, b.rcq, wait)
			wantWC(t, wc, 50+uint64(i), transport.WCSuccess, transport.WCRecvRDMAWithImm)
			if wc.Flags&transport.WCWithImm == 0 || wc.Imm != 0x01020304 || int(wc.ByteLen) != n {
				t.Fatalf("WC %+v", wc)
			}
			equal(t, "WRITE_WITH_IMM", b.bytes(8192, n), a.bytes(0, n))
		}
	})

	t.Run("FastRegSendWithInvLocalInv", func(t *testing.T) {
		a, b := mk(t, nodeOpts{})
		connect(a, b, co)
		// b registers 3 pages (an unaligned IOVA inside them) with a fresh key, as an SRP
		// initiator does for a data buffer.
		fr, err := b.pd.AllocFastRegMR(8)
		if err != nil {
			t.Fatal(err)
		}
		if inf := fr.Query(); inf.State != transport.MRFree {
			t.Fatalf("new fast-reg MR state %v", inf.State)
		}
		base := b.mem.Addr()
		pages := []uint64{base + 5*4096, base + 9*4096, base + 2*4096}
		key1 := fr.Index()<<8 | (fr.RKey()+1)&0xFF
		iova := uint64(0x7000_0000_0100)
		length := uint64(3*4096 - 0x100 - 17)
		reg := transport.SendWR{ID: 100, Opcode: transport.WRRegMR, Flags: transport.SendSignaled, Reg: transport.RegMRWR{
			MR: fr, Key: key1, Access: transport.AccessLocalWrite | transport.AccessRemoteWrite | transport.AccessRemoteRead,
			IOVA: iova, Length: length, PageSize: 4096, Pages: pages}}
		if err := b.qp.PostSend([]transport.SendWR{reg}); err != nil {
			t.Fatal(err)
		}
		wantWC(t, waitWC(t, b.scq, wait), 100, transport.WCSuccess, transport.WCRegMR)
		if inf := fr.Query(); inf.State != transport.MRValid || inf.Key != key1 || inf.IOVA != iova || inf.Length != length {
			t.Fatalf("after REG_MR: %+v", inf)
		}
		// a writes the whole registered range through the new key; the bytes land page by page.
		n := int(length)
		fill(a.bytes(0, n), 77)
		if err := a.qp.PostSend([]transport.SendWR{{ID: 1, Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled,
			SGL: []transport.SGE{a.sge(0, n)}, RemoteAddr: iova, RKey: key1}}); err != nil {
			t.Fatal(err)
		}
		wantWC(t, waitWC(t, a.scq, wait), 1, transport.WCSuccess, transport.WCRDMAWrite)
		got := append(append(append([]byte{}, b.bytes(5*4096+0x100, 4096-0x100)...), b.bytes(9*4096, 4096)...), b.bytes(2*4096, 4096-17)...)
		equal(t, "fast-reg WRITE", got, a.bytes(0, n))
		// READ it back through the same key.
		if err := a.qp.PostSend([]transport.SendWR{{ID: 2, Opcode: transport.WRRDMARead, Flags: transport.SendSignaled,
			SGL: []transport.SGE{a.sge(1<<19, n)}, RemoteAddr: iova, RKey: key1}}); err != nil {
			t.Fatal(err)
		}
		wantWC(t, waitWC(t, a.scq, wait), 2, transport.WCSuccess, transport.WCRDMARead)
		equal(t, "fast-reg READ", a.bytes(1<<19, n), a.bytes(0, n))

		// a answers with SEND_WITH_INV of key1: b's receive reports it and the MR is FREE.
		if err := b.qp.PostRecv([]transport.RecvWR{{ID: 200, SGL: []transport.SGE{b.sge(1<<19, 64)}}}); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend([]transport.SendWR{{ID: 3, Opcode: transport.WRSendWithInv, Flags: transport.SendSignaled,
			SGL: []transport.SGE{a.sge(0, 36)}, InvalidateRKey: key1}}); err != nil {
			t.Fatal(err)
		}
		wantWC(t, waitWC(t, a.scq, wait), 3, transport.WCSuccess, transport.WCSend)
		wc := waitWC(t, b.rcq, wait)
		wantWC(t, wc, 200, transport.WCSuccess, transport.WCRecv)
		if wc.Flags&transport.WCWithInvalidate == 0 || wc.InvalidatedRKey != key1 || wc.ByteLen != 36 {
			t.Fatalf("recv WC %+v: want invalidate of %#x", wc, key1)
		}
		if inf := fr.Query(); inf.State != transport.MRFree {
			t.Fatalf("after remote invalidate: %+v", inf)
		}

		// Re-register with the next key, then LOCAL_INV it, chained with the REG_MR: SQ order.
		key2 := fr.Index()<<8 | (key1+1)&0xFF
		reg.ID, reg.Reg.Key = 101, key2
		if err := b.qp.PostSend([]transport.SendWR{reg, {ID: 102, Opcode: transport.WRLocalInv, Flags: transport.SendSignaled, InvalidateRKey: key2}}); err != nil {
			t.Fatal(err)
		}
		wantWC(t, waitWC(t, b.scq, wait), 101, transport.WCSuccess, transport.WCRegMR)
		wantWC(t, waitWC(t, b.scq, wait), 102, transport.WCSuccess, transport.WCLocalInv)
		if inf := fr.Query(); inf.State != transport.MRFree || inf.Key != key2 {
			t.Fatalf("after LOCAL_INV: %+v", inf)
		}

		// A stale access with key2: NAK remote access error, a's QP goes to ERR and flushes.
		if err := a.qp.PostSend([]transport.SendWR{
			{ID: 4, Opcode: transport.WRRDMAWrite, SGL: []transport.SGE{a.sge(0, 100)}, RemoteAddr: iova, RKey: key2},
			{ID: 5, Opcode: transport.WRSend, SGL: []transport.SGE{a.sge(0, 10)}},
		}); err != nil {
			t.Fatal(err)
		}
		wantWC(t, waitWC(t, a.scq, wait), 4, transport.WCRemAccessErr, transport.WCRDMAWrite)
		wantWC(t, waitWC(t, a.scq, wait), 5, transport.WCWRFlushErr, transport.WCSend)
		if s := a.qp.State(); s != transport.QPSErr {
			t.Fatalf("requester QP state %v", s)
		}
		// The responder QP is in ERR too (class C), with its receives flushed.
		deadline := time.Now().Add(wait)
		for b.qp.State() != transport.QPSErr && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if s := b.qp.State(); s != transport.QPSErr {
			t.Fatalf("responder QP state %v", s)
		}
		if err := b.qp.PostRecv([]transport.RecvWR{{ID: 300}}); err != nil {
			t.Fatal(err)
		}
		wantWC(t, waitWC(t, b.rcq, wait), 300, transport.WCWRFlushErr, transport.WCRecv)
		// Posting to a QP in ERR completes with flush errors.
		if err := a.qp.PostSend([]transport.SendWR{{ID: 6, Opcode: transport.WRSend}}); err != nil {
			t.Fatal(err)
		}
		wantWC(t, waitWC(t, a.scq, wait), 6, transport.WCWRFlushErr, transport.WCSend)
		if err := fr.Close(); err != nil {
			t.Fatal(err)
		}
		if err := b.mem.Free(); !errors.Is(err, transport.ErrBusy) {
			t.Fatalf("free memory under a regular MR: %v", err)
		}
	})
}
