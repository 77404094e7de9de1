package softroce

import (
	"fmt"
	"math/bits"
	"net/netip"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
	"github.com/srpd/srpd/transport/softroce/wire"
)

// Send WQE states (rxe enum wqe_state).
const (
	wqePosted  uint8 = iota // not (or not completely) transmitted
	wqePending              // all packets sent, waiting for ACK / read responses
	wqeDone                 // finished (local op executed, or acknowledged); waiting to retire in order
	wqeError                // finished with an error status
)

// sendWQE is one SQ slot.
type sendWQE struct {
	wr       transport.SendWR // SGL points into sge
	sge      []transport.SGE  // preallocated, cap MaxSendSGE
	inline   []byte           // preallocated, cap MaxInlineData; inline payload
	state    uint8
	status   transport.WCStatus
	vendor   uint32 // VendorErr of a failed WQE: which check failed (diagnostics)
	signaled bool
	length   uint32 // message length
	// requester (rxe wqe->first_psn, last_psn, dma)
	firstPSN, lastPSN wire.PSN
	sent              uint32 // SEND/WRITE: payload bytes transmitted in this round
	tx                bool   // transmission of this WQE has started in this round
	// READ (rxe wqe->iova, dma.resid)
	rdRecv  uint32 // bytes received so far
	rdToken bool   // holds a max_rd_atomic credit
}

type recvWQE struct {
	id  uint64
	sge []transport.SGE // preallocated, cap MaxRecvSGE
	len uint32          // total SGL length
}

// readRes is a responder read resource (rxe struct resp_res).
type readRes struct {
	valid             bool
	firstPSN, lastPSN wire.PSN
	va                uint64 // original request
	length            uint32
	rkey              uint32
	// streaming cursor
	curPSN    wire.PSN
	curVA     uint64
	resid     uint32
	started   bool // FIRST/ONLY already sent in this round ("new" vs "replay")
	streaming bool
}

// streamEnt is a read resource queued for streaming, with the ACK/NAK that must precede it.
type streamEnt struct {
	res int
	pre ctlPkt
}

// ctlPkt is the pending ACK / NAK of the responder (at most one per QP; see setCtl).
type ctlPkt struct {
	pending bool
	syn     wire.Syndrome
	psn     wire.PSN
	fatal   bool
}

type qp struct {
	dev    *Device
	pd     *pd
	qpn    uint32
	scq    *cq
	rcq    *cq
	sigAll bool
	cap    transport.QPCap

	state transport.QPState
	attr  transport.QPAttr
	mtu   int
	av    transport.AddressVector
	src   netip.AddrPort
	dst   netip.AddrPort
	// segmentable: the peer is an srpd that accepts any IPv4 Identification (it recovers the
	// ID from the ICRC), so our packets to it may leave in UDP GSO super-packets, whose
	// segments the kernel numbers itself (link.Packet.Segmentable). Negotiated through CM ECE
	// (cmapi.go eceSRPD); set with the RTR transition, cleared by reset.
	segmentable bool
	// noICRC: the peer is an srpd that waives the ICRC (CM ECE, cmapi.go): our packets to it
	// leave without one (link.Packet.NoICRC) and its packets to us are accepted without one
	// (Device.waived). Set with the RTR transition, cleared by reset.
	noICRC bool

	sq                     []sendWQE
	sqMask                 uint32
	sqHead, sqReq, sqTail  uint32 // completer / requester / producer (free-running)
	rq                     []recvWQE
	rqMask                 uint32
	rqHead, rqTail         uint32
	maxRdAtomic, maxDestRd int

	req struct {
		psn        wire.PSN
		high       wire.PSN // first PSN never sent (retransmit accounting)
		noack      int
		needRetry  bool
		waitRNR    bool
		rdAtomic   int // free read credits
		waitWindow bool
	}
	comp struct {
		psn          wire.PSN
		opcode       int // -1, or the last READ response FIRST/MIDDLE opcode
		retryCnt     int
		rnrRetry     int
		startedRetry bool
	}
	resp struct {
		psn        wire.PSN
		msn        uint32
		opcode     int // -1, or the last SEND/WRITE FIRST/MIDDLE opcode
		sentPSNNak bool
		// current inbound message
		hasWQE  bool // rq[rqHead] is taken by the message in progress
		recvOff uint32
		imm     uint32
		hasImm  bool
		wrMR    *mr
		wrVA    uint64
		wrResid uint32
		wrLen   uint32
		// read resources and the ordered stream of read responses
		res     []readRes
		resNext int
		stream  []streamEnt // ring of read resources being streamed
		sHead   int
		nstream int
		ackReq  bool // an ACK is owed for ackPSN (coalesced within an rx batch)
		ackPSN  wire.PSN
	}
	ctl ctlPkt

	retransAt time.Time
	rnrAt     time.Time
	timeout   time.Duration

	inReady, inTouched bool
	wantTx             bool // scheduled during a receive batch (Device.rxFlush)
	closed             bool
}

func roundPow2(n int) int {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len(uint(n-1))
}

// CreateQP implements transport.PD.
func (p *pd) CreateQP(ia transport.QPInitAttr) (transport.QP, error) {
	d := p.dev
	if ia.Type != 0 && ia.Type != transport.QPTypeRC {
		return nil, fmt.Errorf("create QP of type %d: %w", ia.Type, transport.ErrNotSupported)
	}
	scq, ok1 := ia.SendCQ.(*cq)
	rcq, ok2 := ia.RecvCQ.(*cq)
	if !ok1 || !ok2 || scq.dev != d || rcq.dev != d {
		return nil, fmt.Errorf("create QP: CQs: %w", transport.ErrWrongDevice)
	}
	c, err := d.attr.CheckQPCap(ia.Cap)
	if err != nil {
		return nil, fmt.Errorf("create QP: %w", err)
	}
	c.MaxSendWR = roundPow2(c.MaxSendWR)
	c.MaxRecvWR = roundPow2(c.MaxRecvWR)
	q := &qp{dev: d, pd: p, scq: scq, rcq: rcq, sigAll: ia.SQSigAll, cap: c}
	q.sq = make([]sendWQE, c.MaxSendWR)
	q.sqMask = uint32(c.MaxSendWR - 1)
	sges := make([]transport.SGE, c.MaxSendWR*c.MaxSendSGE)
	var inl []byte
	if c.MaxInlineData > 0 {
		inl = make([]byte, c.MaxSendWR*c.MaxInlineData)
	}
	for i := range q.sq {
		q.sq[i].sge = sges[i*c.MaxSendSGE : i*c.MaxSendSGE : (i+1)*c.MaxSendSGE]
		if inl != nil {
			q.sq[i].inline = inl[i*c.MaxInlineData : i*c.MaxInlineData : (i+1)*c.MaxInlineData]
		}
	}
	q.rq = make([]recvWQE, c.MaxRecvWR)
	q.rqMask = uint32(c.MaxRecvWR - 1)
	rsges := make([]transport.SGE, c.MaxRecvWR*c.MaxRecvSGE)
	for i := range q.rq {
		q.rq[i].sge = rsges[i*c.MaxRecvSGE : i*c.MaxRecvSGE : (i+1)*c.MaxRecvSGE]
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closing || p.closed {
		return nil, transport.ErrClosed
	}
	if len(d.qps) >= d.attr.MaxQP {
		return nil, transport.ErrNoResources
	}
	// A queue of a multi-queue device numbers its QPs in its residue class (link.QueueOf).
	for d.qps[d.nextQPN] != nil || d.nextQPN < 2 || (d.nq > 1 && link.QueueOf(d.nextQPN, d.nq) != d.qidx) {
		d.nextQPN = (d.nextQPN + 1) & 0xFFFFFF
	}
	q.qpn = d.nextQPN
	d.nextQPN = (d.nextQPN + 1) & 0xFFFFFF
	d.qps[q.qpn] = q
	p.nQP++
	scq.users++
	rcq.users++
	q.reset()
	return q, nil
}

// reset returns the QP to the RESET state's defaults (queues emptied without completions).
func (q *qp) reset() {
	q.state = transport.QPSReset
	q.segmentable = false
	q.setNoICRC(false)
	q.sqHead, q.sqReq, q.sqTail = 0, 0, 0
	q.rqHead, q.rqTail = 0, 0
	for i := range q.sq {
		q.sq[i].wr.Reg.Pages = nil
		q.sq[i].wr.Reg.MR = nil
	}
	q.req.high = 0
	q.req.psn, q.req.noack, q.req.needRetry, q.req.waitRNR, q.req.waitWindow = 0, 0, false, false, false
	q.comp.psn, q.comp.opcode, q.comp.startedRetry = 0, -1, false
	q.resp.psn, q.resp.msn, q.resp.opcode, q.resp.sentPSNNak = 0, 0, -1, false
	q.resp.hasWQE = false
	q.resp.wrMR = nil
	q.resp.ackReq = false
	q.resp.res = nil
	q.resp.stream = nil
	q.maxRdAtomic, q.req.rdAtomic, q.maxDestRd = 0, 0, 0
	q.resp.nstream, q.resp.sHead = 0, 0
	q.ctl = ctlPkt{}
	q.retransAt, q.rnrAt = time.Time{}, time.Time{}
	q.attr = transport.QPAttr{Port: 1}
}

func (q *qp) QPN() uint32 { return q.qpn }

func (q *qp) State() transport.QPState {
	q.dev.mu.Lock()
	defer q.dev.mu.Unlock()
	return q.state
}

func (q *qp) Query() transport.QPAttr {
	q.dev.mu.Lock()
	defer q.dev.mu.Unlock()
	a := q.attr
	a.State, a.CurState = q.state, q.state
	a.SQPSN = uint32(q.req.psn)
	a.RQPSN = uint32(q.resp.psn)
	a.Cap = q.cap
	a.SQSigAll = q.sigAll
	return a
}

func (q *qp) Modify(attr *transport.QPAttr, mask transport.QPAttrMask) error {
	q.dev.mu.Lock()
	defer q.dev.mu.Unlock()
	return q.modifyLocked(attr, mask)
}

// modifyLocked is Modify with dev.mu held (the connection manager applies its QP updates from
// the receive and timer loops, qp1.go).
func (q *qp) modifyLocked(attr *transport.QPAttr, mask transport.QPAttrMask) error {
	d := q.dev
	if q.closed {
		return &transport.ModifyError{From: q.state, To: attr.State, Err: transport.ErrClosed}
	}
	next, err := transport.ValidateModify(q.state, attr, mask, transport.ModifyLimits{
		MaxQPRdAtom: d.attr.MaxQPRdAtom, MaxQPInitRdAtom: d.attr.MaxQPInitRdAtom,
		MaxMTU: d.attr.MaxMTU, LocalAddr: d.isLocal,
	})
	if err != nil {
		return err
	}
	if d.closing && next != transport.QPSErr && next != transport.QPSReset {
		return &transport.ModifyError{From: q.state, To: next, Err: transport.ErrClosed}
	}
	if next == transport.QPSReset {
		q.reset()
		return nil
	}
	q.attr.Set(attr, mask)
	if mask&transport.AttrAV != 0 {
		q.av = attr.AV
		q.src = netip.AddrPortFrom(attr.AV.SrcAddr, q.dev.port)
		q.dst = attr.AV.Dst()
	}
	if mask&transport.AttrPathMTU != 0 {
		q.mtu = attr.PathMTU.Bytes()
	}
	if mask&transport.AttrRQPSN != 0 {
		q.resp.psn = wire.PSN(attr.RQPSN)
	}
	if mask&transport.AttrSQPSN != 0 {
		q.req.psn = wire.PSN(attr.SQPSN)
		q.req.high = q.req.psn
		q.comp.psn = wire.PSN(attr.SQPSN)
	}
	if mask&transport.AttrTimeout != 0 {
		q.timeout = ackTimeout(attr.Timeout)
	}
	if mask&transport.AttrRetryCnt != 0 {
		q.comp.retryCnt = int(attr.RetryCnt)
	}
	if mask&transport.AttrRNRRetry != 0 {
		q.comp.rnrRetry = int(attr.RNRRetry)
	}
	if mask&transport.AttrMaxQPRdAtomic != 0 {
		n := 0
		if attr.MaxRdAtomic > 0 {
			n = roundPow2(int(attr.MaxRdAtomic))
		}
		// Credits held by outstanding READs stay held.
		q.req.rdAtomic += n - q.maxRdAtomic
		q.maxRdAtomic = n
	}
	if mask&transport.AttrMaxDestRdAtomic != 0 {
		n := 0
		if attr.MaxDestRdAtomic > 0 {
			n = roundPow2(int(attr.MaxDestRdAtomic))
		}
		if n != len(q.resp.res) && q.resp.nstream == 0 {
			q.maxDestRd = n
			q.resp.res = make([]readRes, n)
			q.resp.stream = make([]streamEnt, n)
			q.resp.resNext = 0
		}
	}
	prev := q.state
	q.state = next
	switch {
	case next == transport.QPSErr && prev != transport.QPSErr:
		q.state = prev
		q.toError()
	case next == transport.QPSRTS && (prev == transport.QPSSQD || prev == transport.QPSRTR):
		d.schedule(q)
	}
	return nil
}

// ackTimeout is the local ACK timeout 4.096 µs × 2^t (0: disabled).
func ackTimeout(t uint8) time.Duration {
	if t == 0 {
		return 0
	}
	return time.Duration(4096<<t) * time.Nanosecond
}

// toError moves q to ERR (rxe_qp_error): timers stop, read streams stop, every outstanding send
// WQE and every posted receive completes with WR_FLUSH_ERR (a WQE that already failed keeps
// its own status). dev.mu held.
func (q *qp) toError() {
	if q.state == transport.QPSErr || q.state == transport.QPSReset {
		q.state = transport.QPSErr
		return
	}
	if q.dev.debug {
		q.dev.log.Debug("qp enters ERR", zap.Uint32("qpn", q.qpn), zap.Stringer("from", q.state))
	}
	q.state = transport.QPSErr
	q.retransAt, q.rnrAt = time.Time{}, time.Time{}
	for i := range q.resp.res {
		q.resp.res[i].streaming = false
	}
	q.resp.nstream = 0
	q.flushSQ()
	q.flushRQ()
}

func (q *qp) flushSQ() {
	for q.sqHead != q.sqTail {
		w := &q.sq[q.sqHead&q.sqMask]
		if w.rdToken {
			w.rdToken = false
			q.req.rdAtomic++
		}
		st, v := transport.WCWRFlushErr, uint32(0)
		if w.state == wqeError {
			st, v = w.status, w.vendor
		}
		w.vendor = v
		q.postSendWC(w, st, true)
		q.sqHead++
	}
	q.sqReq = q.sqHead
}

func (q *qp) flushRQ() {
	for q.rqHead != q.rqTail {
		r := &q.rq[q.rqHead&q.rqMask]
		wc := transport.WC{ID: r.id, Status: transport.WCWRFlushErr, Opcode: transport.WCRecv, QPN: q.qpn}
		q.pushWC(q.rcq, &wc)
		q.rqHead++
	}
	q.resp.hasWQE = false
}

// pushWC queues a completion; a full CQ is a fatal error for the QP (CQ overrun).
func (q *qp) pushWC(c *cq, wc *transport.WC) {
	if c.push(wc) {
		return
	}
	q.dev.stats.cqOverruns.Add(1)
	if q.state != transport.QPSErr {
		q.toError()
	}
}

// postSendWC produces the send completion of w if it is signaled or failed (force: flushes).
func (q *qp) postSendWC(w *sendWQE, st transport.WCStatus, force bool) {
	if !force && st == transport.WCSuccess && !w.signaled {
		w.wr.Reg.Pages, w.wr.Reg.MR = nil, nil
		return
	}
	wc := transport.WC{ID: w.wr.ID, Status: st, Opcode: w.wr.Opcode.CompletionOpcode(), QPN: q.qpn}
	if st != transport.WCSuccess {
		wc.VendorErr = w.vendor
	}
	if st == transport.WCSuccess && w.wr.Opcode == transport.WRRDMARead {
		wc.ByteLen = w.length
	}
	w.wr.Reg.Pages, w.wr.Reg.MR = nil, nil
	q.pushWC(q.scq, &wc)
}

func (q *qp) SendQueueFree() int {
	q.dev.mu.Lock()
	defer q.dev.mu.Unlock()
	return len(q.sq) - int(q.sqTail-q.sqHead)
}

func (q *qp) RecvQueueFree() int {
	q.dev.mu.Lock()
	defer q.dev.mu.Unlock()
	return len(q.rq) - int(q.rqTail-q.rqHead)
}

func (q *qp) Close() error {
	d := q.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	if q.closed {
		return transport.ErrClosed
	}
	q.closed = true
	q.reset()
	q.state = transport.QPSErr
	delete(d.qps, q.qpn)
	for i, x := range d.ready {
		if x == q {
			d.ready = append(d.ready[:i], d.ready[i+1:]...)
			break
		}
	}
	q.inReady = false
	q.pd.nQP--
	q.scq.users--
	q.rcq.users--
	return nil
}

func postErr(i int, wrid uint64, err error, detail string) error {
	if detail != "" {
		err = fmt.Errorf("%w: %s", err, detail)
	}
	return &transport.PostError{Index: i, WRID: wrid, Err: err}
}

// PostSend queues wrs and, when the transmit path is idle (the transmit loop does not have the
// QP and nobody is sending), builds and sends their first packets from the caller's goroutine
// instead of waking the transmit loop: one handoff less per message. Packets are built under
// dev.mu and sendMu is taken before dev.mu is released, as the loops do, so they reach the link
// in the order they were built (PSN order per QP).
func (q *qp) PostSend(wrs []transport.SendWR) error {
	d := q.dev
	d.mu.Lock()
	queued, err := q.postSend(wrs)
	if !queued {
		d.mu.Unlock()
		return err
	}
	if q.inReady {
		d.mu.Unlock() // the transmit loop has q (and has been woken)
		return nil
	}
	if d.rxSending {
		// The receive loop is running completion handlers (maybe this caller) and sends its
		// batch after them: join it, or leave q to the transmit loop when it is full.
		if len(d.rxSpare) == 0 {
			d.schedule(q)
		} else {
			n := len(d.rxPend)
			var more bool
			d.rxPend, more = q.work(d.rxPend, d.rxSpare, time.Now())
			d.rxSpare = d.rxSpare[len(d.rxPend)-n:]
			if more {
				d.schedule(q)
			}
		}
		d.mu.Unlock()
		return nil
	}
	if d.hold(q) {
		d.mu.Unlock() // inside a post bracket: sent with the others (postbatch.go)
		return nil
	}
	if !d.sendMu.TryLock() {
		if d.txHolds.Load() {
			// The transmit loop is sending a batch and goes on with the ready list after it.
			d.schedule(q)
			d.mu.Unlock()
			return nil
		}
		// The receive loop or another poster is sending a few packets: wait for them (the
		// packets built next must follow them on the wire anyway).
		d.sendMu.Lock()
	}
	held := d.held.take() // built before these: they go first
	pkts, more := q.work(d.postPkts[:0], d.postBufs, time.Now())
	if more {
		d.schedule(q) // the rest of a long message: the transmit loop sends it after these
	}
	d.mu.Unlock()
	d.sendTaken(held, pkts, nil)
	clear(pkts) // drop references to buffers' views
	d.sendMu.Unlock()
	return nil
}

// postSend validates and queues wrs; queued reports whether the QP has new work to transmit.
// dev.mu held.
func (q *qp) postSend(wrs []transport.SendWR) (queued bool, err error) {
	d := q.dev
	if q.closed || d.closing {
		return false, postErr(0, firstID(wrs), transport.ErrClosed, "")
	}
	switch q.state {
	case transport.QPSRTS, transport.QPSSQD, transport.QPSErr:
	default:
		return false, postErr(0, firstID(wrs), transport.ErrQPState, q.state.String())
	}
	for i := range wrs {
		if err := q.validateSend(i, &wrs[i]); err != nil {
			return false, err
		}
	}
	if free := len(q.sq) - int(q.sqTail-q.sqHead); len(wrs) > free {
		return false, postErr(free, wrs[free].ID, transport.ErrSQFull, fmt.Sprintf("%d WRs, %d free", len(wrs), free))
	}
	for i := range wrs {
		wr := &wrs[i]
		w := &q.sq[q.sqTail&q.sqMask]
		w.wr = *wr
		w.wr.SGL = w.sge[:len(wr.SGL)]
		copy(w.wr.SGL, wr.SGL)
		w.state, w.status, w.vendor = wqePosted, transport.WCSuccess, 0
		w.signaled = q.sigAll || wr.Flags&transport.SendSignaled != 0
		w.sent, w.rdRecv, w.rdToken, w.tx = 0, 0, false, false
		var n uint64
		for _, s := range wr.SGL {
			n += uint64(s.Length)
		}
		w.length = uint32(n)
		if wr.Flags&transport.SendInline != 0 {
			w.inline = w.inline[:0]
			for _, s := range wr.SGL {
				b := s.Host
				if b == nil {
					b = d.ms.slice(s.Addr, uint64(s.Length))
				}
				w.inline = append(w.inline, b...)
			}
		}
		q.sqTail++
	}
	if q.state == transport.QPSErr {
		q.flushSQ()
		return false, nil
	}
	return len(wrs) > 0, nil
}

func firstID(wrs []transport.SendWR) uint64 {
	if len(wrs) > 0 {
		return wrs[0].ID
	}
	return 0
}

// validateSend checks one WR at post time. dev.mu held.
func (q *qp) validateSend(i int, wr *transport.SendWR) error {
	switch wr.Opcode {
	case transport.WRSend, transport.WRSendWithImm, transport.WRSendWithInv,
		transport.WRRDMAWrite, transport.WRRDMAWriteWithImm, transport.WRRDMARead:
		if len(wr.SGL) > q.cap.MaxSendSGE {
			return postErr(i, wr.ID, transport.ErrTooManySGE, fmt.Sprintf("%d > %d", len(wr.SGL), q.cap.MaxSendSGE))
		}
		var n uint64
		for _, s := range wr.SGL {
			n += uint64(s.Length)
			if s.Host == nil {
				continue
			}
			if wr.Opcode == transport.WRRDMARead {
				return postErr(i, wr.ID, transport.ErrInvalidWR, "SGE.Host as an RDMA READ destination")
			}
			if uint64(len(s.Host)) != uint64(s.Length) {
				return postErr(i, wr.ID, transport.ErrInvalidWR, fmt.Sprintf("SGE.Host of %d bytes, Length %d", len(s.Host), s.Length))
			}
		}
		if n > q.dev.attr.MaxMsgSize {
			return postErr(i, wr.ID, transport.ErrInvalidWR, "message longer than 2^31 bytes")
		}
		if wr.Flags&transport.SendInline != 0 {
			if wr.Opcode == transport.WRRDMARead {
				return postErr(i, wr.ID, transport.ErrInvalidWR, "inline RDMA READ")
			}
			if n > uint64(q.cap.MaxInlineData) {
				return postErr(i, wr.ID, transport.ErrInlineTooLong, fmt.Sprintf("%d > %d", n, q.cap.MaxInlineData))
			}
			for _, s := range wr.SGL {
				if s.Host == nil && !q.dev.ms.holds(s.Addr, uint64(s.Length)) {
					return postErr(i, wr.ID, transport.ErrBadAddress, "inline SGE")
				}
			}
		}
	case transport.WRRegMR:
		m, ok := wr.Reg.MR.(*mr)
		if !ok || m.dev != q.dev || !m.fast {
			return postErr(i, wr.ID, transport.ErrInvalidWR, "REG_MR needs a fast-reg MR of this device")
		}
		if len(wr.Reg.Pages) > m.maxPages {
			return postErr(i, wr.ID, transport.ErrInvalidWR, fmt.Sprintf("%d pages > MR max %d", len(wr.Reg.Pages), m.maxPages))
		}
		if wr.Flags&transport.SendInline != 0 {
			return postErr(i, wr.ID, transport.ErrInvalidWR, "inline REG_MR")
		}
	case transport.WRLocalInv:
		if wr.Flags&transport.SendInline != 0 {
			return postErr(i, wr.ID, transport.ErrInvalidWR, "inline LOCAL_INV")
		}
	default:
		return postErr(i, wr.ID, transport.ErrInvalidOpcode, wr.Opcode.String())
	}
	return nil
}

func (q *qp) PostRecv(wrs []transport.RecvWR) error {
	d := q.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	id0 := uint64(0)
	if len(wrs) > 0 {
		id0 = wrs[0].ID
	}
	if q.closed || d.closing {
		return postErr(0, id0, transport.ErrClosed, "")
	}
	if q.state == transport.QPSReset {
		return postErr(0, id0, transport.ErrQPState, q.state.String())
	}
	for i := range wrs {
		if len(wrs[i].SGL) > q.cap.MaxRecvSGE {
			return postErr(i, wrs[i].ID, transport.ErrTooManySGE, fmt.Sprintf("%d > %d", len(wrs[i].SGL), q.cap.MaxRecvSGE))
		}
		for _, s := range wrs[i].SGL {
			if s.Host != nil {
				return postErr(i, wrs[i].ID, transport.ErrInvalidWR, "SGE.Host in a receive")
			}
		}
	}
	if free := len(q.rq) - int(q.rqTail-q.rqHead); len(wrs) > free {
		return postErr(free, wrs[free].ID, transport.ErrRQFull, fmt.Sprintf("%d WRs, %d free", len(wrs), free))
	}
	for i := range wrs {
		r := &q.rq[q.rqTail&q.rqMask]
		r.id = wrs[i].ID
		r.sge = r.sge[:len(wrs[i].SGL)]
		copy(r.sge, wrs[i].SGL)
		var n uint64
		for _, s := range r.sge {
			n += uint64(s.Length)
		}
		if n > 1<<31 {
			n = 1 << 31
		}
		r.len = uint32(n)
		q.rqTail++
	}
	if q.state == transport.QPSErr {
		q.flushRQ()
	}
	return nil
}

// newPacket lays out a packet for q's peer in buf. dev.mu held.
func (q *qp) newPacket(buf []byte, op wire.Opcode, n int, psn wire.PSN, ackReq bool) wire.Packet {
	p, err := wire.Layout(buf, op, n)
	if err != nil {
		panic("softroce: layout: " + err.Error()) // buffers are sized for the largest packet
	}
	b := p.BTH()
	b.SetDestQP(q.attr.DestQPN)
	b.SetPSN(psn)
	b.SetAckReq(ackReq)
	return p
}

func (q *qp) linkPacket(p wire.Packet) link.Packet {
	return link.Packet{Src: q.src, Dst: q.dst, TrafficClass: q.av.TrafficClass, Buf: p.Bytes(), Segmentable: q.segmentable, NoICRC: q.noICRC}
}

// work is the transmit loop's service of q: pending control packet (behind read responses),
// read responses, then the requester. It returns whether q has more to send. dev.mu held.
// The packets are appended to pkts, built into bufs[0], bufs[1], ... (at most len(bufs)).
func (q *qp) work(pkts []link.Packet, bufs [][]byte, now time.Time) ([]link.Packet, bool) {
	if q.closed {
		return pkts, false
	}
	base := len(pkts)
	for k := 0; k < len(bufs); k = len(pkts) - base {
		if q.resp.nstream > 0 && q.state != transport.QPSErr {
			pkts = q.readResponse(pkts, bufs[k])
			continue
		}
		if q.ctl.pending {
			pkts = append(pkts, q.buildCtl(bufs[k]))
			continue
		}
		var ok bool
		pkts, ok = q.requester(pkts, bufs[k], now)
		if !ok {
			return pkts, false
		}
	}
	return pkts, true
}

// checkTimers fires q's expired retransmit / RNR timers. dev.mu held.
func (q *qp) checkTimers(now time.Time) {
	if !q.rnrAt.IsZero() && !now.Before(q.rnrAt) {
		q.rnrAt = time.Time{}
		q.rnrTimerExpired()
	}
	if !q.retransAt.IsZero() && !now.Before(q.retransAt) {
		q.retransAt = time.Time{}
		q.retransTimerExpired(now)
	}
}

// setNoICRC records whether q's packets travel without ICRC both ways (dev.mu held).
func (q *qp) setNoICRC(on bool) {
	if on == q.noICRC {
		return
	}
	q.noICRC = on
	if on {
		q.dev.waived.Store(q.qpn, struct{}{})
	} else {
		q.dev.waived.Delete(q.qpn)
	}
}
