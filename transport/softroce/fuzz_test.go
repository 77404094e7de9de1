package softroce

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/fuzzbound"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// fuzzEnv is one device with a QP in RTS, a regular MR in the middle of a Memory surrounded by
// canary bytes, a VALID fast-reg MR, and a sentinel buffer on the Go heap.
type fuzzEnv struct {
	n        *node
	peer     *link.MemLink
	fr       transport.MR
	frKey    uint32
	sentinel []byte
}

const (
	fzMem    = 64 << 10
	fzMROff  = 8 << 10
	fzMRLen  = 16 << 10
	fzFROff  = 32 << 10 // fast-reg pages: [32K, 40K)
	fzCanary = 0xA5
)

var (
	fzOnce sync.Once
	fz     *fuzzEnv
)

func fuzzSetup(t *testing.T) *fuzzEnv {
	fzOnce.Do(func() {
		a, b := pipeAddrs()
		la, lb := link.NewPipe(a, b, link.PipeConfig{QueueLen: 64})
		dev, err := Open(Config{Link: la})
		if err != nil {
			t.Fatal(err)
		}
		n := &node{t: t, dev: dev, addr: dev.Addrs()[0]}
		n.pd, _ = dev.AllocPD()
		n.scq, _ = dev.CreateCQ(1 << 16)
		n.rcq, _ = dev.CreateCQ(1 << 16)
		n.mem, _ = dev.AllocMemory(fzMem)
		n.mr, err = n.pd.RegMR(n.mem.Addr()+fzMROff, fzMRLen, transport.AccessLocalWrite|transport.AccessRemote)
		if err != nil {
			t.Fatal(err)
		}
		n.qp, err = n.pd.CreateQP(transport.QPInitAttr{SendCQ: n.scq, RecvCQ: n.rcq,
			Cap: transport.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2}})
		if err != nil {
			t.Fatal(err)
		}
		fr, err := n.pd.AllocFastRegMR(4)
		if err != nil {
			t.Fatal(err)
		}
		fz = &fuzzEnv{n: n, peer: lb, fr: fr, frKey: fr.Index()<<8 | 0x5a, sentinel: bytes.Repeat([]byte{0x5C}, 1<<16)}
	})
	return fz
}

// reset brings the QP back to a fresh RTS (ERR → RESET → INIT → RTR → RTS), re-registers the
// fast-reg MR, posts receives and a few send WRs (so that responses have something to match),
// and refreshes the canaries.
func (e *fuzzEnv) reset(t tb, mtu transport.MTU) {
	n := e.n
	n.t = t
	_ = n.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState)
	_ = n.qp.Modify(&transport.QPAttr{State: transport.QPSReset}, transport.AttrState)
	drain := make([]transport.WC, 256)
	for n.scq.Poll(drain) > 0 || n.rcq.Poll(drain) > 0 {
	}
	mem := n.mem.Bytes()
	for i := range mem {
		if i < fzMROff || i >= fzMROff+fzMRLen {
			mem[i] = fzCanary
		}
	}
	n.psn = 0
	n.bringUp(e.peer.LocalAddrPort(), 0x77, 0, connOpts{mtu: mtu, timeout: 31, maxRd: 4,
		access: transport.AccessRemoteWrite | transport.AccessRemoteRead})
	base := n.mem.Addr()
	mrSGE := func(off, l int) transport.SGE {
		return transport.SGE{Addr: base + uint64(fzMROff+off), Length: uint32(l), LKey: n.mr.LKey()}
	}
	var recvs []transport.RecvWR
	for i := 0; i < 8; i++ {
		recvs = append(recvs, transport.RecvWR{ID: uint64(i), SGL: []transport.SGE{mrSGE(i*1024, 600), mrSGE(i*1024+600, 300)}})
	}
	if err := n.qp.PostRecv(recvs); err != nil {
		t.Fatal(err)
	}
	if inf := e.fr.Query(); inf.State == transport.MRValid {
		e.n.dev.mu.Lock()
		e.n.dev.invalidate(n.pd.(*pd), inf.Key)
		e.n.dev.mu.Unlock()
	}
	err := n.qp.PostSend([]transport.SendWR{
		{ID: 100, Opcode: transport.WRRegMR, Reg: transport.RegMRWR{MR: e.fr, Key: e.frKey, Access: transport.AccessLocalWrite | transport.AccessRemote,
			IOVA: 0x10000100, Length: 2*4096 - 0x100, PageSize: 4096, Pages: []uint64{base + fzFROff + 4096, base + fzFROff}}},
		{ID: 101, Opcode: transport.WRSend, SGL: []transport.SGE{mrSGE(0, 100)}},
		{ID: 102, Opcode: transport.WRRDMARead, SGL: []transport.SGE{mrSGE(9000, 3000)}, RemoteAddr: 0x1000, RKey: 0x1234},
		{ID: 103, Opcode: transport.WRRDMAWrite, SGL: []transport.SGE{mrSGE(0, 5000)}, RemoteAddr: 0x1000, RKey: 0x1234},
		{ID: 104, Opcode: transport.WRRDMARead, SGL: []transport.SGE{{Addr: 0x10000100, Length: 700, LKey: e.frKey}}, RemoteAddr: 0x2000, RKey: 0x1234},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Let the requester run so that the WRs are outstanding.
	deadline := time.Now().Add(time.Second)
	for {
		n.dev.mu.Lock()
		q := n.qp.(*qp)
		done := q.sqReq == q.sqTail || q.state != transport.QPSRTS
		n.dev.mu.Unlock()
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Microsecond)
	}
}

func (e *fuzzEnv) check(t tb) {
	mem := e.n.mem.Bytes()
	for i, c := range mem {
		inFR := i >= fzFROff+0x100 && i < fzFROff+2*4096 // the fast-reg MR's bytes (pages swapped, offset 0x100)
		if (i < fzMROff || i >= fzMROff+fzMRLen) && !inFR && c != fzCanary {
			t.Fatalf("byte %#x outside every registered region changed to %#x", i, c)
		}
	}
	for _, c := range e.sentinel {
		if c != 0x5C {
			t.Fatal("Go heap sentinel changed")
		}
	}
}

// abortTB is the tb the engine's fuzz targets give the shared helpers (node.bringUp, reset,
// check) for the work of one input: that work runs under fuzzbound.Run on another goroutine,
// where t.FailNow must not be called, so Fatal reports with Errorf and unwinds to the
// stopOnAbort deferred at the top of the input's closure.
type abortTB struct {
	t interface {
		Helper()
		Error(args ...any)
		Errorf(format string, args ...any)
	}
}

// fuzzAbort is the panic value abortTB unwinds with.
type fuzzAbort struct{}

func (a abortTB) Helper() { a.t.Helper() }
func (a abortTB) Fatal(args ...any) {
	a.t.Helper()
	a.t.Error(args...)
	panic(fuzzAbort{})
}
func (a abortTB) Fatalf(format string, args ...any) {
	a.t.Helper()
	a.t.Errorf(format, args...)
	panic(fuzzAbort{})
}
func (a abortTB) Errorf(format string, args ...any) {
	a.t.Helper()
	a.t.Errorf(format, args...)
}

// stopOnAbort ends an input's closure quietly after an abortTB failure (already reported) and
// passes any other panic on.
func stopOnAbort() {
	if r := recover(); r != nil {
		if _, ok := r.(fuzzAbort); !ok {
			panic(r)
		}
	}
}

// FuzzReceivePath feeds arbitrary packets to a QP in RTS: the engine must not panic, and
// nothing outside registered memory may change. The input is a sequence of packets, each
// preceded by a 2-byte length and a control byte (bit 0: aim the BTH at our QP; bit 1: set the
// PSN to the expected one; bit 2: set the RETH R_Key to a valid key; bits 4-6: path MTU).
func FuzzReceivePath(f *testing.F) {
	seed := func(op wire.Opcode, n int, ctl byte, fix func(wire.Packet)) []byte {
		buf := make([]byte, link.MaxPacket)
		p, err := wire.Layout(buf, op, n)
		if err != nil {
			f.Fatal(err)
		}
		p.BTH().SetAckReq(true)
		if fix != nil {
			fix(p)
		}
		out := binary.BigEndian.AppendUint16(nil, uint16(p.Len()))
		return append(append(out, ctl), p.Bytes()...)
	}
	f.Add(seed(wire.RCSendOnly, 100, 3, nil))
	f.Add(append(seed(wire.RCSendFirst, 256, 3|0x00, nil), seed(wire.RCSendLast, 10, 1, func(p wire.Packet) { p.BTH().SetPSN(1) })...))
	f.Add(seed(wire.RCRDMAWriteOnly, 64, 7, func(p wire.Packet) { p.RETH().SetVA(0x10000100); p.RETH().SetDMALen(64) }))
	f.Add(seed(wire.RCRDMAReadRequest, 0, 7, func(p wire.Packet) { p.RETH().SetVA(0x10000100); p.RETH().SetDMALen(5000) }))
	f.Add(seed(wire.RCSendOnlyWithInvalidate, 4, 3, nil))
	f.Add(seed(wire.RCRDMAReadResponseOnly, 700, 1, nil))
	f.Add(seed(wire.RCRDMAReadResponseFirst, 1024, 1|0x30, func(p wire.Packet) { p.BTH().SetPSN(1) }))
	f.Add(seed(wire.RCAcknowledge, 0, 1, func(p wire.Packet) { p.AETH().SetSyndrome(0x60); p.BTH().SetPSN(1) }))
	f.Add(seed(wire.RCCompareSwap, 0, 3, nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		e := fuzzSetup(t)
		fuzzbound.Run(t, func() {
			defer stopOnAbort()
			at := abortTB{t}
			mtu := transport.MTU256
			if len(data) > 2 {
				mtu = transport.MTU(1 + int(data[2]>>4&7)%5)
			}
			e.reset(at, mtu)
			d := e.n.dev
			q := e.n.qp.(*qp)
			src := e.peer.LocalAddrPort()
			var bufs [][]byte
			for len(data) >= 3 {
				l := int(binary.BigEndian.Uint16(data))
				ctl := data[2]
				data = data[3:]
				l = min(l, len(data), link.MaxPacket)
				b := make([]byte, l, link.MaxPacket)
				copy(b, data[:l])
				data = data[l:]
				bufs = append(bufs, b)
				if len(b) >= wire.BTHLen {
					if ctl&1 != 0 {
						wire.BTH(b).SetDestQP(q.qpn)
					}
					if ctl&2 != 0 {
						d.mu.Lock()
						psn := q.resp.psn
						if wire.Opcode(b[0]).Is(wire.Response) {
							psn = q.comp.psn
						}
						d.mu.Unlock()
						wire.BTH(b).SetPSN(psn)
					}
					if ctl&4 != 0 {
						if p, err := wire.Parse(b); err == nil && p.RETH() != nil {
							if ctl&8 != 0 {
								p.RETH().SetRKey(e.frKey)
							} else {
								p.RETH().SetRKey(e.n.mr.RKey())
							}
						}
					}
				}
			}
			pkts := make([]link.Packet, 1)
			out := make([][]byte, 16)
			for i := range out {
				out[i] = make([]byte, bufSize)
			}
			for _, b := range bufs {
				pkts[0] = link.Packet{Src: src, Dst: e.n.addr, Buf: b}
				d.mu.Lock()
				d.input(&pkts[0], nil, time.Now())
				// Run the transmit side now too (read responses, ACKs) and drop the packets.
				for k := 0; k < 64 && len(d.ready) > 0; k++ {
					d.transmit(nil, out, time.Now())
				}
				clear(d.touched)
				d.touched = d.touched[:0]
				d.mu.Unlock()
			}
			e.check(at)
		})
	})
}

// recTB records what abortTB reports.
type recTB struct{ msgs []string }

func (r *recTB) Helper()           {}
func (r *recTB) Error(args ...any) { r.msgs = append(r.msgs, fmt.Sprint(args...)) }
func (r *recTB) Errorf(format string, args ...any) {
	r.msgs = append(r.msgs, fmt.Sprintf(format, args...))
}

// TestAbortTB: a Fatal through abortTB is reported as an error and ends the closure at
// stopOnAbort; any other panic goes on.
func TestAbortTB(t *testing.T) {
	rec := &recTB{}
	after := false
	func() {
		defer stopOnAbort()
		abortTB{rec}.Fatalf("input %d", 7)
		after = true
	}()
	if after || len(rec.msgs) != 1 || rec.msgs[0] != "input 7" {
		t.Fatalf("after Fatalf: ran on %v, reported %q", after, rec.msgs)
	}
	defer func() {
		if r := recover(); r != "boom" {
			t.Fatalf("recovered %v, want the original panic", r)
		}
	}()
	func() {
		defer stopOnAbort()
		panic("boom")
	}()
	t.Fatal("panic swallowed")
}

func TestFuzzSeedsHold(t *testing.T) {
	// The fuzz target's environment itself: nothing outside registered memory changes when a
	// full-size valid WRITE and READ exercise both MRs.
	e := fuzzSetup(t)
	e.reset(t, transport.MTU4096)
	e.check(t)
}
