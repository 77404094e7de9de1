package softroce

import (
	"flag"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// PSN arithmetic as the engine relies on it (24-bit, rxe's psn_compare).
func TestPropertyPSN(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := wire.PSN(rapid.Uint32Range(0, wire.PSNMask).Draw(t, "p"))
		n := rapid.Uint32Range(0, 1<<23-1).Draw(t, "n")
		q := p.Add(n)
		if !q.Valid() || q.Sub(p) != int32(n) || p.Sub(q) != -int32(n) {
			t.Fatalf("%#x + %d = %#x: Sub %d", p, n, q, q.Sub(p))
		}
		if n > 0 && (!p.Less(q) || q.Less(p) || !p.LessEq(q)) {
			t.Fatalf("order of %#x and %#x", p, q)
		}
		if npkts(n, 256) != max(1, (n+255)/256) {
			t.Fatalf("npkts(%d)", n)
		}
		// resp.psn - 1 as the duplicate ACK computes it.
		if p.Add(wire.PSNMask).Inc() != p {
			t.Fatalf("%#x - 1 + 1", p)
		}
	})
}

// Random work-request sequences under random faults: every signaled WR completes exactly once,
// successfully, in SQ order; every receive completes in order; and every byte arrives intact.
// The sequences include local operations on a fast-reg MR (REG_MR with the next key when the
// MR is free, LOCAL_INV of the key in force when it is valid): go-back-N retries must not
// execute them again (a second execution fails with LOC_QP_OP_ERR), and the MR ends in the
// state the sequence implies.
func TestPropertyRCDelivery(t *testing.T) {
	// Each check builds two devices and moves up to ~1 MiB under faults: fewer than rapid's
	// default 100 unless -rapid.checks asks for more.
	if f := flag.Lookup("rapid.checks"); f != nil && f.Value.String() == f.DefValue {
		n := "40"
		if testing.Short() {
			n = "10"
		}
		_ = f.Value.Set(n)
		defer func() { _ = f.Value.Set(f.DefValue) }()
	}
	rapid.Check(t, func(rt *rapid.T) {
		f := link.Faults{
			Drop:            rapid.SampledFrom([]float64{0, 0.01, 0.05}).Draw(rt, "drop"),
			Duplicate:       rapid.SampledFrom([]float64{0, 0.02, 0.1}).Draw(rt, "dup"),
			Reorder:         rapid.SampledFrom([]float64{0, 0.02, 0.1}).Draw(rt, "reorder"),
			ReorderDistance: rapid.IntRange(1, 5).Draw(rt, "dist"),
			Corrupt:         rapid.SampledFrom([]float64{0, 0.01}).Draw(rt, "corrupt"),
		}
		mtu := rapid.SampledFrom(allMTUs).Draw(rt, "mtu")
		seed := rapid.Uint64().Draw(rt, "seed")
		type op struct {
			code     transport.WROpcode
			size     int
			signaled bool
		}
		ops := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) op {
			return op{
				// WRRegMR stands for "a local operation": REG_MR or LOCAL_INV, whichever is
				// valid at that point of the sequence (decided below).
				code: rapid.SampledFrom([]transport.WROpcode{transport.WRSend, transport.WRSendWithImm, transport.WRRDMAWrite,
					transport.WRRDMAWriteWithImm, transport.WRRDMARead, transport.WRRegMR}).Draw(t, "op"),
				size:     rapid.IntRange(0, 3*mtu.Bytes()+17).Draw(t, "size"),
				signaled: rapid.Bool().Draw(t, "signaled"),
			}
		}), 1, 24).Draw(rt, "ops")
		ops[len(ops)-1].signaled = true
		// Local operations alternate on one fast-reg MR: REG_MR (key byte 1, 2, ...) when it is
		// free, LOCAL_INV of the key in force when it is valid.
		valid, regs := false, uint32(0)
		for i := range ops {
			if ops[i].code != transport.WRRegMR {
				continue
			}
			ops[i].size = 0
			if valid {
				ops[i].code = transport.WRLocalInv
			} else {
				regs++
			}
			valid = !valid
		}

		a, b := pipeAddrs()
		la, lb := link.NewPipe(a, b, link.PipeConfig{Seed: seed, AtoB: f, BtoA: f, QueueLen: 512})
		na := newNode(rt, la, nodeOpts{memSize: 1 << 20})
		nb := newNode(rt, lb, nodeOpts{memSize: 1 << 20})
		defer func() { na.close(); nb.close() }()
		connect(na, nb, connOpts{mtu: mtu, timeout: 9}) // ~2 ms
		fr, err := na.pd.AllocFastRegMR(2)
		if err != nil {
			rt.Fatal(err)
		}
		frKey := func(n uint32) uint32 { return fr.Index()<<8 | n&0xFF }
		nreg := uint32(0)

		const slot = 16 << 10 // per-WR region: a's source/destination, b's target
		var wrs []transport.SendWR
		var recvs []transport.RecvWR
		for i, o := range ops {
			off := i * slot
			fill(na.bytes(off, o.size), seed+uint64(i))
			fill(nb.bytes(512<<10+off, o.size), seed^uint64(i)) // READ source at b
			wr := transport.SendWR{ID: uint64(i), Opcode: o.code, SGL: []transport.SGE{na.sge(off, o.size)},
				Imm: uint32(i), RKey: nb.mr.RKey(), RemoteAddr: nb.mem.Addr() + uint64(off)}
			if o.signaled {
				wr.Flags = transport.SendSignaled
			}
			switch o.code {
			case transport.WRRegMR:
				nreg++
				wr.SGL = nil
				wr.Reg = transport.RegMRWR{MR: fr, Key: frKey(nreg), Access: transport.AccessLocalWrite | transport.AccessRemoteWrite,
					IOVA: 0x10000, Length: 8192, PageSize: 4096, Pages: []uint64{na.mem.Addr() + 4096, na.mem.Addr() + 3*4096}}
			case transport.WRLocalInv:
				wr.SGL = nil
				wr.InvalidateRKey = frKey(nreg)
			case transport.WRRDMARead:
				wr.SGL = []transport.SGE{na.sge(512<<10+off, o.size)}
				wr.RemoteAddr = nb.mem.Addr() + uint64(512<<10+off)
			case transport.WRSend, transport.WRSendWithImm:
				recvs = append(recvs, transport.RecvWR{ID: uint64(i), SGL: []transport.SGE{nb.sge(off, slot)}})
			case transport.WRRDMAWriteWithImm:
				recvs = append(recvs, transport.RecvWR{ID: uint64(i)})
			}
			wrs = append(wrs, wr)
		}
		if len(recvs) > 0 {
			if err := nb.qp.PostRecv(recvs); err != nil {
				rt.Fatal(err)
			}
		}
		if err := na.qp.PostSend(wrs); err != nil {
			rt.Fatal(err)
		}
		wait := 5 * time.Second
		defer func() {
			if rt.Failed() {
				rt.Logf("a: %s\nb: %s", na.dev.dump(), nb.dev.dump())
			}
		}()
		for i, o := range ops {
			if !o.signaled {
				continue
			}
			wc := waitWC(rt, na.scq, wait)
			if wc.ID != uint64(i) || wc.Status != transport.WCSuccess || wc.Opcode != o.code.CompletionOpcode() {
				rt.Fatalf("send completion %+v, want WR %d (%v) success", wc, i, o.code)
			}
		}
		for _, r := range recvs {
			wc := waitWC(rt, nb.rcq, wait)
			o := ops[r.ID]
			if wc.ID != r.ID || wc.Status != transport.WCSuccess || int(wc.ByteLen) != o.size ||
				wc.Flags&transport.WCWithImm != 0 != (o.code != transport.WRSend) {
				rt.Fatalf("receive completion %+v, want WR %d (%v, %d bytes)", wc, r.ID, o.code, o.size)
			}
		}
		expectNoWC(rt, na.scq, 5*time.Millisecond)
		expectNoWC(rt, nb.rcq, time.Millisecond)
		if inf := fr.Query(); valid && (inf.State != transport.MRValid || inf.Key != frKey(regs)) ||
			!valid && inf.State != transport.MRFree {
			rt.Fatalf("fast-reg MR %+v after %d REG_MRs (valid %v)", inf, regs, valid)
		}
		for i, o := range ops {
			if o.code == transport.WRRegMR || o.code == transport.WRLocalInv {
				continue
			}
			off := i * slot
			what := fmt.Sprintf("WR %d (%v, %d bytes)", i, o.code, o.size)
			if o.code == transport.WRRDMARead {
				equal(rt, what, na.bytes(512<<10+off, o.size), nb.bytes(512<<10+off, o.size))
			} else {
				equal(rt, what, nb.bytes(off, o.size), na.bytes(off, o.size))
			}
		}
	})
}
