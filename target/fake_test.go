package target

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/srpd/srpd/frpool"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/scsi/backend"
	"github.com/srpd/srpd/transport"
)

// A fake transport with synchronous semantics: work requests complete when posted, RDMA READ
// fills the destination with a pattern, RDMA WRITE goes nowhere, SENDs are recorded. With it a
// test drives a channel's handlers directly on its own goroutine (as the channel's loop would)
// — for the fuzz target and the command-path benchmark.

type fakeDev struct {
	mu   sync.Mutex
	next uint64
	mems []*fakeMem
}

func (d *fakeDev) Name() string { return "fake" }
func (d *fakeDev) Attr() transport.DeviceAttr {
	return transport.DeviceAttr{PageSize: 4096, MaxQPWR: 16384, MaxSGE: 4, MaxMRSize: 1 << 40, MaxQPRdAtom: 16, MaxQPInitRdAtom: 16}
}
func (d *fakeDev) GIDs() []transport.GID           { return nil }
func (d *fakeDev) Addrs() []netip.AddrPort         { return nil }
func (d *fakeDev) Close(ctx context.Context) error { return nil }
func (d *fakeDev) AllocPD() (transport.PD, error)  { return &fakePD{d: d}, nil }

func (d *fakeDev) AllocMemory(n int) (transport.Memory, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.next == 0 {
		d.next = 1 << 32
	}
	m := &fakeMem{b: make([]byte, (n+4095)&^4095), addr: d.next}
	d.next += uint64(len(m.b)) + 1<<20
	d.mems = append(d.mems, m)
	return m, nil
}

func (d *fakeDev) CreateCQ(n int) (transport.CQ, error) {
	return &fakeCQ{notify: make(chan struct{}, 1), cap: n}, nil
}

// bytesAt resolves device memory.
func (d *fakeDev) bytesAt(addr uint64, n uint32) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, m := range d.mems {
		if m.b != nil && addr >= m.addr && addr+uint64(n) <= m.addr+uint64(len(m.b)) {
			o := addr - m.addr
			return m.b[o : o+uint64(n)]
		}
	}
	return nil
}

type fakeMem struct {
	b    []byte
	addr uint64
}

func (m *fakeMem) Bytes() []byte { return m.b }
func (m *fakeMem) Addr() uint64  { return m.addr }
func (m *fakeMem) Len() int      { return len(m.b) }
func (m *fakeMem) Free() error   { m.b = nil; return nil }

type fakePD struct{ d *fakeDev }

func (p *fakePD) RegMR(addr, n uint64, a transport.Access) (transport.MR, error) {
	return fakeMR{}, nil
}
func (p *fakePD) AllocFastRegMR(int) (transport.MR, error) { return fakeMR{fastReg: true}, nil }
func (p *fakePD) Close() error                             { return nil }
func (p *fakePD) CreateQP(a transport.QPInitAttr) (transport.QP, error) {
	return &fakeQP{d: p.d, cq: a.SendCQ.(*fakeCQ), cap: a.Cap}, nil
}

type fakeMR struct{ fastReg bool }

func (fakeMR) Index() uint32   { return 1 }
func (fakeMR) LKey() uint32    { return 0x100 }
func (fakeMR) RKey() uint32    { return 0x100 }
func (m fakeMR) FastReg() bool { return m.fastReg }
func (fakeMR) MaxPages() int   { return 1 }
func (fakeMR) Close() error    { return nil }
func (m fakeMR) Query() transport.MRInfo {
	if m.fastReg {
		return transport.MRInfo{State: transport.MRFree}
	}
	return transport.MRInfo{}
}

type fakeCQ struct {
	mu     sync.Mutex
	wcs    []transport.WC
	notify chan struct{}
	cap    int
}

func (c *fakeCQ) push(wc transport.WC) {
	c.mu.Lock()
	c.wcs = append(c.wcs, wc)
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *fakeCQ) Poll(wcs []transport.WC) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := copy(wcs, c.wcs)
	c.wcs = c.wcs[:copy(c.wcs, c.wcs[n:])]
	return n
}
func (c *fakeCQ) Notify() <-chan struct{} { return c.notify }
func (c *fakeCQ) Wait(ctx context.Context) error {
	select {
	case <-c.notify:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (c *fakeCQ) Cap() int     { return c.cap }
func (c *fakeCQ) Close() error { return nil }

type fakeRecv struct {
	id   uint64
	addr uint64
	n    uint32
}

type fakeQP struct {
	d       *fakeDev
	cq      *fakeCQ
	cap     transport.QPCap
	state   transport.QPState
	recvs   []fakeRecv
	sent    [][]byte // SEND payloads
	discard bool     // do not record SENDs
	nSend   int      // send WRs posted
	reads   int
	writes  int
	foreign int // send WRs posted without frpool.WRIDTag (not through the pool)
	// peer is initiator memory by address: an RDMA READ of exactly such an address copies it
	// (other READs fill the destination with a pattern of the remote address).
	peer         map[uint64][]byte
	maxRdAtomic  uint8 // what Query reports (0: 16)
	maxReadBatch int   // most RDMA READs in one PostSend
}

func (q *fakeQP) QPN() uint32              { return 0x42 }
func (q *fakeQP) State() transport.QPState { return q.state }
func (q *fakeQP) Query() transport.QPAttr {
	rd := q.maxRdAtomic
	if rd == 0 {
		rd = 16
	}
	return transport.QPAttr{State: q.state, MaxRdAtomic: rd, Cap: q.cap}
}
func (q *fakeQP) SendQueueFree() int { return q.cap.MaxSendWR }
func (q *fakeQP) RecvQueueFree() int { return q.cap.MaxRecvWR - len(q.recvs) }
func (q *fakeQP) Close() error       { return nil }
func (q *fakeQP) Modify(a *transport.QPAttr, m transport.QPAttrMask) error {
	if m&transport.AttrState == 0 {
		return nil
	}
	q.state = a.State
	if q.state == transport.QPSErr {
		for _, r := range q.recvs {
			q.cq.push(transport.WC{ID: r.id, Status: transport.WCWRFlushErr, Opcode: transport.WCRecv})
		}
		q.recvs = nil
	}
	return nil
}

func (q *fakeQP) PostRecv(wrs []transport.RecvWR) error {
	if q.state == transport.QPSErr {
		for _, w := range wrs {
			q.cq.push(transport.WC{ID: w.ID, Status: transport.WCWRFlushErr, Opcode: transport.WCRecv})
		}
		return nil
	}
	if len(q.recvs)+len(wrs) > q.cap.MaxRecvWR {
		return transport.ErrRQFull
	}
	for _, w := range wrs {
		q.recvs = append(q.recvs, fakeRecv{id: w.ID, addr: w.SGL[0].Addr, n: w.SGL[0].Length})
	}
	return nil
}

func (q *fakeQP) PostSend(wrs []transport.SendWR) error {
	if q.state != transport.QPSRTS && q.state != transport.QPSErr {
		return transport.ErrQPState
	}
	batch := 0
	for _, w := range wrs {
		q.nSend++
		if w.ID&frpool.WRIDTag == 0 {
			q.foreign++
		}
		if q.state == transport.QPSErr {
			q.cq.push(transport.WC{ID: w.ID, Status: transport.WCWRFlushErr})
			continue
		}
		switch w.Opcode {
		case transport.WRRDMARead:
			q.reads++
			batch++
			q.maxReadBatch = max(q.maxReadBatch, batch)
			src := q.peer[w.RemoteAddr]
			for _, s := range w.SGL {
				b := q.d.bytesAt(s.Addr, s.Length)
				if src != nil {
					src = src[copy(b, src):]
					continue
				}
				for i := range b {
					b[i] = byte(w.RemoteAddr) + byte(i)
				}
			}
		case transport.WRRDMAWrite:
			q.writes++
		case transport.WRSend:
			if q.discard {
				break
			}
			var p []byte
			for _, s := range w.SGL {
				p = append(p, q.d.bytesAt(s.Addr, s.Length)...)
			}
			q.sent = append(q.sent, p)
		}
		if w.Flags&transport.SendSignaled != 0 {
			q.cq.push(transport.WC{ID: w.ID, Status: transport.WCSuccess, Opcode: w.Opcode.CompletionOpcode()})
		}
	}
	return nil
}

// deliver places iu in the next posted receive buffer and completes it; false if none is
// posted (the sender would get an RNR NAK).
func (q *fakeQP) deliver(iu []byte) bool {
	if len(q.recvs) == 0 || q.state == transport.QPSErr {
		return false
	}
	r := q.recvs[0]
	q.recvs = q.recvs[1:]
	n := min(uint32(len(iu)), r.n)
	copy(q.d.bytesAt(r.addr, n), iu)
	q.cq.push(transport.WC{ID: r.id, Status: transport.WCSuccess, Opcode: transport.WCRecv, ByteLen: n})
	return true
}

// fakeChan is a channel on the fake transport, driven synchronously.
type fakeChan struct {
	t     *Target
	ch    *channel
	qp    *fakeQP
	cq    *fakeCQ
	wcs   []transport.WC
	lun   *scsi.LUN
	timer *time.Timer
}

func newFakeChan(tb testing.TB, lim Limits, imm bool) *fakeChan {
	tb.Helper()
	ram, err := backend.NewRAM(8<<20, false)
	if err != nil {
		tb.Fatal(err)
	}
	lun, err := scsi.NewLUN(scsi.LUNConfig{Serial: "fake"}, ram)
	if err != nil {
		tb.Fatal(err)
	}
	tgt, err := New(Config{PortID: tPort, Limits: lim,
		ACLs: []ACL{{Initiator: iPort, LUNs: []LUNMapping{{Number: 0, LUN: lun}}}}})
	if err != nil {
		tb.Fatal(err)
	}
	req := defaultLogin()
	if lim.MaxITIULen != 0 {
		req.ReqITIULen = lim.MaxITIULen
	}
	if !imm {
		req.Flags = 0
	}
	dev := &fakeDev{}
	pc, d, err := tgt.Login(dev, req, ConnInfo{})
	if err != nil || !d.Accepted {
		tb.Fatalf("login: %v %+v", err, d)
	}
	f := &fakeChan{t: tgt, ch: pc.ch, qp: pc.ch.qp.(*fakeQP), cq: pc.ch.cq.(*fakeCQ), wcs: make([]transport.WC, 64), lun: lun,
		timer: time.NewTimer(time.Hour)}
	f.qp.state = transport.QPSRTS
	// Establish without the loop goroutine: the test drives the channel.
	tgt.mu.Lock()
	delete(tgt.pending, pc)
	pc.used.Store(true)
	f.ch.sess.reserved--
	f.ch.sess.channels = append(f.ch.sess.channels, f.ch)
	tgt.mu.Unlock()
	tgt.stats.channels.Add(1)
	return f
}

// drive runs the channel's handlers until it is idle: no completion queued, no context busy
// (waiting, bounded, for LUN workers).
func (f *fakeChan) drive(tb testing.TB) {
	ch := f.ch
	deadline := time.Now().Add(waitLong)
	for {
		progress := false
		if n := f.cq.Poll(f.wcs); n > 0 {
			ch.onWCs(f.wcs[:n])
			progress = true
		}
		if ch.afterWCs() {
			progress = true
		}
		if ch.st() == chLoggingOut && !ch.ctl[0].busy {
			ch.disconnect()
			progress = true
		}
		if progress {
			continue
		}
		if len(ch.free) == len(ch.ctxs) && len(ch.parked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("channel not idle: %d of %d contexts free", len(ch.free), len(ch.ctxs))
		}
		f.timer.Reset(10 * time.Millisecond)
		select {
		case ev := <-ch.events:
			ch.onEvent(ev)
		case <-f.cq.notify:
		case <-f.timer.C:
		}
		f.timer.Stop()
	}
}

// close tears the channel down (as the loop would) and releases everything.
func (f *fakeChan) close(tb testing.TB) {
	ch := f.ch
	if ch.st() == chLive {
		ch.startClose(nil, "test done")
	}
	f.drive(tb)
	if ch.st() == chLoggingOut {
		ch.disconnect()
	}
	f.drive(tb)
	ch.destroy()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if err := f.t.Close(ctx); err != nil {
		tb.Fatal(err)
	}
	f.lun.Close()
}
