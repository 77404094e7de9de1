package initiator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/srpd/srpd/internal/fuzzbound"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce"
	"github.com/srpd/srpd/transport/softroce/link"
)

// The IUs a hostile target sends, fed to a real channel: newChannel and activate on a softroce
// device (PD, CQ, memory, MRs, MR pool all real), but on a QP that talks to no peer (recQP):
// it takes every post and completes none. Commands are put in flight by startCmd, the target's
// IUs arrive as receive completions through handleWC (copied into the receive buffer, as the
// device would place them), and each batch ends with afterBatch, as serve does.

// recQP is a QP in RTS that accepts every post and records the send WRs; nothing completes.
type recQP struct {
	mu    sync.Mutex
	sends []transport.SendWR // SGLs copied
	recvs int
}

func (q *recQP) QPN() uint32              { return 0x11 }
func (q *recQP) State() transport.QPState { return transport.QPSRTS }
func (q *recQP) Modify(*transport.QPAttr, transport.QPAttrMask) error {
	return nil
}
func (q *recQP) Query() transport.QPAttr {
	return transport.QPAttr{State: transport.QPSRTS, Cap: transport.QPCap{MaxSendWR: 1 << 12, MaxRecvWR: 1 << 12, MaxSendSGE: 1, MaxRecvSGE: 1}}
}
func (q *recQP) PostSend(wrs []transport.SendWR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, wr := range wrs {
		wr.SGL = append([]transport.SGE(nil), wr.SGL...)
		q.sends = append(q.sends, wr)
	}
	return nil
}
func (q *recQP) PostRecv(wrs []transport.RecvWR) error {
	q.mu.Lock()
	q.recvs += len(wrs)
	q.mu.Unlock()
	return nil
}
func (q *recQP) SendQueueFree() int { return 1 << 12 }
func (q *recQP) RecvQueueFree() int { return 1 << 12 }
func (q *recQP) Close() error       { return nil }

// setupTM (FuzzChannelIUs setup bit 15): a task management function waits for its answer.
const setupTM = 1 << 15

const (
	iuHarnessQD   = 4
	iuHarnessRxIU = 1024
	iuHarnessImm  = 256
)

// iuHarness is one channel, live on a recQP.
type iuHarness struct {
	c       *channel
	qp      *recQP
	started []*request
	recvIdx int
	tmRes   chan error // the result of the task management function started by startTM
}

func newIUHarness(dev transport.Device, credits int32, log *zap.Logger) (*iuHarness, error) {
	if log == nil {
		log = zap.NewNop()
	}
	cfg, err := Config{Device: dev, Dialer: &testDialer{}, QueueDepth: iuHarnessQD, MaxIOSize: 16 << 10,
		MaxImmediateData: iuHarnessImm, TaskMgmtTimeout: 5 * time.Second, Logger: log}.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Session{cfg: cfg, log: cfg.Logger}
	c, err := newChannel(s, 1)
	if err != nil {
		return nil, err
	}
	h := &iuHarness{c: c, qp: &recQP{}}
	p := connParams{txIULen: 512, rxIULen: iuHarnessRxIU, maxDescs: 1, maxImm: iuHarnessImm, credits: credits}
	if err := c.activate(h.qp, nil, p); err != nil {
		c.release()
		return nil, err
	}
	return h, nil
}

// close tears the channel down as teardown does after a QP error (without its waits for
// flushed receives, which recQP never completes): the pool settles every registration, every
// handle goes back, and release frees every MR (nothing leaks from one input to the next).
func (h *iuHarness) close() {
	c := h.c
	c.mu.Lock()
	if c.tm.waiting { // as teardown ends a task management function waiting for its answer
		c.tm.waiting, c.tm.err = false, errChannelDown
		select {
		case c.tm.done <- struct{}{}:
		default:
		}
	}
	c.mu.Unlock()
	if h.tmRes != nil {
		<-h.tmRes
	}
	c.pool.HandleQPError(errors.New("fuzz input done"))
	c.giveBackRegs()
	c.release()
}

// start puts a command in flight with startCmd: kind 0 no data (TEST UNIT READY), 1 a 4 KiB
// READ (an MR), 2 a 128-byte WRITE (immediate data), 3 a 512-byte READ.
func (h *iuHarness) start(kind int) error {
	c := h.c
	c.mu.Lock()
	enough := c.reqLim > 1 // one less would start a credit probe (a goroutine waiting for TM)
	c.mu.Unlock()
	if !enough {
		return nil
	}
	var r *request
	select {
	case r = <-c.free:
	default:
		return nil
	}
	sp := cmdSpec{op: "fuzz", lun: 0, cdbLen: 16}
	switch kind {
	case 0:
	case 1, 3:
		sp.cdb[0], sp.dir, sp.n = scsi.OpRead16, dirIn, 4096
		if kind == 3 {
			sp.n = 512
		}
		sp.buf = make([]byte, sp.n)
	case 2:
		sp.cdb[0], sp.dir, sp.n = scsi.OpWrite16, dirOut, 128
		sp.buf = make([]byte, sp.n)
	}
	posted, err := c.startCmd(context.Background(), r, &sp, false)
	if !posted {
		c.free <- r
		return fmt.Errorf("start kind %d: %w", kind, err)
	}
	h.started = append(h.started, r)
	return nil
}

// startTM runs ABORT TASK (for a tag never used) on a goroutine, as the credit probe does, and
// returns once it waits for its answer.
func (h *iuHarness) startTM() error {
	c := h.c
	c.mu.Lock()
	enough := c.reqLim > 0
	c.mu.Unlock()
	if !enough {
		return nil
	}
	h.tmRes = make(chan error, 1)
	go func() { h.tmRes <- c.taskMgmt(srp.TMAbortTask, 0, srp.LUN{}, makeTag(false, 0, c.idx, 0xfffe)) }()
	for i := 0; i < 1000; i++ {
		c.mu.Lock()
		w := c.tm.waiting
		c.mu.Unlock()
		if w {
			return nil
		}
		select {
		case err := <-h.tmRes:
			h.tmRes = nil
			return fmt.Errorf("task management ended before its answer: %w", err)
		case <-time.After(time.Millisecond):
		}
	}
	return errors.New("task management never waited for its answer")
}

// deliver hands b to the channel as a receive completion and ends the batch.
func (h *iuHarness) deliver(b []byte) error {
	c := h.c
	i := h.recvIdx % c.nRecv
	h.recvIdx++
	n := copy(c.rxBuf(i, uint32(len(b))), b)
	wc := transport.WC{ID: uint64(i), Status: transport.WCSuccess, Opcode: transport.WCRecv, ByteLen: uint32(n), QPN: h.qp.QPN()}
	err := c.handleWC(&wc)
	c.afterBatch()
	return err
}

// reqSnap is what a response may change in a request slot.
type reqSnap struct {
	state             reqState
	tag               uint64
	gen               uint32
	out               outcome
	status            uint8
	flags             srp.RspFlags
	diResid, doResid  uint32
	senseLen          int
	sense             [scsi.MaxSenseLen]byte
	signaled, invQued bool
}

func (h *iuHarness) snapshot() []reqSnap {
	c := h.c
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]reqSnap, len(c.reqs))
	for i := range c.reqs {
		r := &c.reqs[i]
		out[i] = reqSnap{r.state, r.tag, r.gen, r.out, r.status, r.rspFlags, r.diResid, r.doResid, r.senseLen, r.sense, r.signaled, r.invQueued}
	}
	return out
}

// iuEntry is one IU of a FuzzChannelIUs script: a mode byte, a big-endian 16-bit length and
// the IU. Mode bits 0-2 rewrite the IU's tag (bytes 8-15) so that the fuzzer reaches the
// requests it cannot guess: 0 as is, 1 the tag of started command k (k = mode>>3), 2 the
// tag of an earlier use of k's slot (stale), 3 k's slot on another channel, 4 a task
// management tag nobody waits for, 5 the tag of the task management function waiting.
func iuEntry(mode byte, iu []byte) []byte {
	return append([]byte{mode, byte(len(iu) >> 8), byte(len(iu))}, iu...)
}

const (
	tagAsIs = iota
	tagLive
	tagStale
	tagOtherChannel
	tagTMUnwaited
	tagTMWaiting
)

func (h *iuHarness) rewriteTag(mode byte, iu []byte) {
	if len(iu) < 16 || mode&7 == tagAsIs || mode&7 > tagTMWaiting {
		return
	}
	var tag uint64
	switch mode & 7 {
	case tagTMUnwaited:
		h.c.mu.Lock()
		tag = makeTag(true, h.c.tm.seq+1, h.c.idx, 0xffff)
		h.c.mu.Unlock()
	case tagTMWaiting:
		h.c.mu.Lock()
		tag = h.c.tm.tag
		h.c.mu.Unlock()
	default:
		if len(h.started) == 0 {
			return
		}
		r := h.started[int(mode>>3)%len(h.started)]
		switch mode & 7 {
		case tagLive:
			tag = r.tag
		case tagStale:
			tag = makeTag(false, r.gen-1, h.c.idx, r.idx)
		case tagOtherChannel:
			tag = makeTag(false, r.gen, h.c.idx+1, r.idx)
		}
	}
	binary.BigEndian.PutUint64(iu[8:], tag)
}

// channelIUSeeds: responses good and bad for live, stale and foreign tags, residuals beyond
// the transfer, sense and response data lengths beyond the IU, credit deltas at the limits
// of 32 bits, target requests (more than the answer buffers and queue hold), a logout and
// IUs the initiator never expects.
func channelIUSeeds() [][]byte {
	rsp := func(f srp.RspFields) []byte {
		b := make([]byte, iuHarnessRxIU)
		n, err := srp.Rsp(b).Encode(&f, len(b))
		if err != nil {
			panic(err)
		}
		return b[:n]
	}
	cred := func(d int32) []byte {
		b := make([]byte, srp.CredReqLen)
		n, _ := srp.CredReq(b).Encode(&srp.CredReqFields{ReqLimDelta: d, Tag: srp.Tag{7}})
		return b[:n]
	}
	aer := func(d int32, sense []byte) []byte {
		b := make([]byte, srp.AerReqHdrLen+len(sense))
		n, _ := srp.AerReq(b).Encode(&srp.AerReqFields{ReqLimDelta: d, Tag: srp.Tag{9}, Sense: sense})
		return b[:n]
	}
	tlogout := func() []byte {
		b := make([]byte, srp.TLogoutLen)
		n, _ := srp.TLogout(b).Encode(&srp.TLogoutFields{Reason: srp.TLogoutNoReason})
		return b[:n]
	}
	var sense [scsi.MaxSenseLen]byte
	sl := scsi.Sense{Key: scsi.UnitAttention, ASC: 0x29}.EncodeFixed(sense[:])
	good := rsp(srp.RspFields{ReqLimDelta: 1})
	check := rsp(srp.RspFields{ReqLimDelta: 1, Status: 2, Sense: sense[:sl]})
	under := rsp(srp.RspFields{ReqLimDelta: 1, Flags: srp.DIUnder, DataInResid: 0xffffffff})
	over := rsp(srp.RspFields{ReqLimDelta: 1, Flags: srp.DIOver | srp.DOUnder, DataInResid: 1 << 31, DataOutResid: 7})
	bigSense := rsp(srp.RspFields{ReqLimDelta: 1, Status: 2, Sense: make([]byte, 600)})
	senseBeyond := append([]byte(nil), check...)
	binary.BigEndian.PutUint32(senseBeyond[28:], 0xfffffff0)
	respBeyond := rsp(srp.RspFields{ReqLimDelta: 1, RespData: []byte{0, 0, 0, 0}})
	binary.BigEndian.PutUint32(respBeyond[32:], 1<<20)
	cat := func(es ...[]byte) (b []byte) {
		for _, e := range es {
			b = append(b, e...)
		}
		return b
	}
	var flood []byte
	for range maxCtrlQ + nCtrlBufs + 3 {
		flood = append(flood, iuEntry(0, cred(1))...)
	}
	return [][]byte{
		cat(iuEntry(tagLive, good), iuEntry(tagLive|1<<3, check), iuEntry(tagLive|2<<3, under), iuEntry(tagLive|3<<3, over)),
		cat(iuEntry(tagLive, good), iuEntry(tagLive, good)), // the same answer twice: the second is stale
		cat(iuEntry(tagStale, good), iuEntry(tagOtherChannel, good), iuEntry(tagTMUnwaited, good), iuEntry(tagAsIs, good)),
		cat(iuEntry(tagLive, bigSense), iuEntry(tagLive|1<<3, senseBeyond), iuEntry(tagLive|2<<3, respBeyond)),
		cat(iuEntry(0, cred(0x7fffffff)), iuEntry(0, cred(0x7fffffff)), iuEntry(tagLive, good)),
		cat(iuEntry(0, cred(-0x80000000)), iuEntry(tagLive, rsp(srp.RspFields{ReqLimDelta: -5}))),
		cat(iuEntry(0, aer(3, sense[:sl])), iuEntry(0, aer(0, []byte{0x72, 5})), iuEntry(0, aer(1, nil))),
		flood,
		cat(iuEntry(tagLive, good), iuEntry(0, tlogout()), iuEntry(tagLive|1<<3, good)),
		cat(iuEntry(0, nil), iuEntry(0, []byte{byte(srp.OpCmd)}), iuEntry(0, []byte{byte(srp.OpLoginReq), 0, 0, 0})),
		cat(iuEntry(0, good[:20])),
	}
}

// tmSeeds are answers to a task management function (FuzzChannelIUs with setupTM).
func tmSeeds() [][]byte {
	rsp := func(resp []byte) []byte {
		b := make([]byte, 64)
		n, err := srp.Rsp(b).Encode(&srp.RspFields{ReqLimDelta: 1, RespData: resp}, len(b))
		if err != nil {
			panic(err)
		}
		return b[:n]
	}
	return [][]byte{
		iuEntry(tagTMWaiting, rsp([]byte{0, 0, 0, 0})),
		iuEntry(tagTMWaiting, rsp([]byte{0, 0, 0, 5})),
		iuEntry(tagTMWaiting, rsp(nil)),
		append(iuEntry(tagTMUnwaited, rsp([]byte{0, 0, 0, 0})), iuEntry(tagTMWaiting, rsp([]byte{0, 0, 0, 4}))...),
	}
}

// FuzzChannelIUs feeds a hostile target's IUs to a live channel with commands in flight. Per
// IU: no panic; the error, if any, is a protocol error or the target's logout (and the
// channel handles nothing more, as serve tears it down); credits are exactly the clamped sum
// of the deltas of every IU that carries one, within [0, maxReqLim]; an SRP_RSP changes
// only the request its tag names while that request waits for its answer (otherwise nothing
// but the stale-response count); an answered request keeps the status, residuals and sense
// (up to MaxSenseLen) of the response, and its data-in length stays within its buffer; the
// in-flight count matches the table; a CRED_REQ or AER_REQ is answered with its tag, queued,
// or dropped only when the queue is full.
func FuzzChannelIUs(f *testing.F) {
	devs := &harnessDevs{tb: f}
	f.Cleanup(devs.close)
	for _, s := range channelIUSeeds() {
		f.Add(int32(32), uint16(4|1<<3|2<<5|3<<7), s)
	}
	for _, s := range tmSeeds() {
		f.Add(int32(8), uint16(setupTM|2|1<<3), s)
	}
	f.Add(int32(0x7fffffff), uint16(3), channelIUSeeds()[4])
	f.Add(int32(-1), uint16(4), channelIUSeeds()[0])
	f.Fuzz(func(t *testing.T, login int32, setup uint16, script []byte) {
		fuzzbound.Run(t, func() {
			dev, err := devs.get()
			if err != nil {
				t.Error(err)
				return
			}
			if err := channelIUsOne(dev, login, setup, script); err != nil {
				t.Error(err)
			}
		})
	})
}

// harnessDevs hands out a softroce device for one input's channel, a fresh one every
// devChannels channels: softroce counts every CQ ever created against MaxCQ (65536) and never
// gives the count back on Close (transport/softroce/device.go CreateCQ), so one device runs
// out of CQs after that many channels.
type harnessDevs struct {
	tb  testing.TB
	dev *softroce.Device
	n   int
}

const devChannels = 1 << 14

func (d *harnessDevs) get() (*softroce.Device, error) {
	if d.dev != nil && d.n < devChannels {
		d.n++
		return d.dev, nil
	}
	d.close()
	a, _ := link.NewPipe(netip.MustParseAddr("10.0.9.1"), netip.MustParseAddr("10.0.9.2"), link.PipeConfig{})
	dev, err := softroce.Open(softroce.Config{Link: a, Name: "fuzz-ini"})
	if err != nil {
		return nil, err
	}
	d.dev, d.n = dev, 1
	return dev, nil
}

func (d *harnessDevs) close() {
	if d.dev == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = d.dev.Close(ctx)
	d.dev = nil
}

func channelIUsOne(dev transport.Device, login int32, setup uint16, script []byte) error {
	h, err := newIUHarness(dev, login, nil)
	if err != nil {
		return err
	}
	defer h.close()
	c := h.c
	maxLim := int64(iuHarnessQD) + 1 // a credit per slot and one for task management
	sat := func(v int64) int32 { return int32(min(max(v, 0), maxLim)) }
	want := sat(int64(login))
	if c.reqLim != want {
		return fmt.Errorf("login credits %d: %d, want %d", login, c.reqLim, want)
	}
	for i := 0; i < int(setup&7); i++ {
		if err := h.start(int(setup>>(3+2*i)) & 3); err != nil {
			return err
		}
	}
	if setup&setupTM != 0 {
		if err := h.startTM(); err != nil {
			return err
		}
	}
	c.mu.Lock()
	want = c.reqLim
	c.mu.Unlock()
	for len(script) >= 3 {
		mode, l := script[0], int(binary.BigEndian.Uint16(script[1:]))
		script = script[3:]
		iu := append([]byte(nil), script[:min(l, len(script), iuHarnessRxIU)]...)
		script = script[min(l, len(script)):]
		h.rewriteTag(mode, iu)

		c.mu.Lock()
		tmWaiting, tmTag := c.tm.waiting, c.tm.tag
		c.mu.Unlock()
		before := h.snapshot()
		stale := c.s.stats.staleRsps.Load()
		h.qp.mu.Lock()
		nSends := len(h.qp.sends)
		h.qp.mu.Unlock()
		ctrlQLen := len(c.ctrlQ)

		err := h.deliver(iu)
		if err != nil && !errors.Is(err, errProtocol) && !errors.Is(err, errTargetLogout) {
			return fmt.Errorf("IU % x: error %v", iu, err)
		}
		after := h.snapshot()

		// What the IU is, as the channel must have understood it.
		var delta int32
		var rsp srp.Rsp
		var ctrlTag *srp.Tag
		var ctrlOp srp.Opcode
		if op, perr := srp.PeekOpcode(iu); perr == nil {
			switch op {
			case srp.OpRsp:
				if r, perr := srp.ParseRsp(iu); perr == nil {
					rsp, delta = r, r.ReqLimDelta()
				}
			case srp.OpCredReq:
				if r, perr := srp.ParseCredReq(iu); perr == nil {
					tag := r.Tag()
					delta, ctrlTag, ctrlOp = r.ReqLimDelta(), &tag, srp.OpCredRsp
				}
			case srp.OpAerReq:
				if r, perr := srp.ParseAerReq(iu); perr == nil {
					tag := r.Tag()
					delta, ctrlTag, ctrlOp = r.ReqLimDelta(), &tag, srp.OpAerRsp
				}
			}
		}
		want = sat(int64(want) + int64(delta))
		c.mu.Lock()
		lim, inflight := c.reqLim, c.inflight
		c.mu.Unlock()
		if lim != want {
			return fmt.Errorf("IU % x: credits %d, want %d (max %d)", iu, lim, want, maxLim)
		}
		n := 0
		for _, s := range after {
			if s.state == reqInflight && !s.signaled {
				n++
			}
		}
		if n != inflight {
			return fmt.Errorf("IU % x: %d requests in flight, the channel counts %d", iu, n, inflight)
		}

		answered := -1
		if rsp != nil {
			t := rsp.Tag()
			tag := binary.BigEndian.Uint64(t[:])
			for i, s := range before {
				if s.state == reqInflight && s.tag == tag && s.out == outNone && tag&tagTM == 0 {
					answered = i
				}
			}
			if answered < 0 && tag&tagTM == 0 && c.s.stats.staleRsps.Load() != stale+1 {
				return fmt.Errorf("IU % x: response for tag %#x not counted as stale", iu, tag)
			}
		}
		for i := range before {
			if i != answered {
				if after[i] != before[i] {
					return fmt.Errorf("IU % x: request %d changed: %+v -> %+v", iu, i, before[i], after[i])
				}
				continue
			}
			s, r := after[i], &c.reqs[i]
			sense := rsp.Sense()
			if s.out != outRsp || s.status != rsp.Status() || s.flags != rsp.Flags() || s.diResid != rsp.DataInResid() ||
				s.doResid != rsp.DataOutResid() || s.senseLen != min(len(sense), scsi.MaxSenseLen) ||
				string(s.sense[:s.senseLen]) != string(sense[:s.senseLen]) {
				return fmt.Errorf("IU % x: request %d answered as %+v", iu, i, s)
			}
			if r.spec.dir == dirIn {
				if got := dataInLen(r.spec.n, s.flags, s.diResid); got < 0 || got > r.spec.n {
					return fmt.Errorf("IU % x: data-in length %d of %d", iu, got, r.spec.n)
				}
			}
		}

		if err := h.checkTM(tmWaiting, tmTag, rsp); err != nil {
			return fmt.Errorf("IU % x: %w", iu, err)
		}
		if ctrlTag != nil && err == nil {
			if err := h.checkAnswered(nSends, ctrlQLen, ctrlOp, *ctrlTag); err != nil {
				return fmt.Errorf("IU % x: %w", iu, err)
			}
		}
		if len(c.ctrlQ) > maxCtrlQ {
			return fmt.Errorf("%d queued answers", len(c.ctrlQ))
		}
		if err != nil {
			return nil // serve tears the channel down: nothing more reaches it
		}
	}
	return nil
}

// checkTM: a task management function waiting for its answer ends when (and only when) a
// response carries its tag, with success exactly when the response data says FUNCTION
// COMPLETE.
func (h *iuHarness) checkTM(waiting bool, tag uint64, rsp srp.Rsp) error {
	if !waiting || h.tmRes == nil {
		return nil
	}
	var answered bool
	if rsp != nil {
		t := rsp.Tag()
		answered = binary.BigEndian.Uint64(t[:]) == tag
	}
	if !answered {
		select {
		case err := <-h.tmRes:
			h.tmRes = nil
			return fmt.Errorf("task management ended (%v) without its answer", err)
		default:
			return nil
		}
	}
	var err error
	select {
	case err = <-h.tmRes:
		h.tmRes = nil
	case <-time.After(2 * time.Second):
		return errors.New("task management not ended by its answer")
	}
	code, ok := rsp.TMResponse()
	var tme *TaskMgmtError
	switch {
	case ok && code == srp.TMSuccess:
		if err != nil {
			return fmt.Errorf("FUNCTION COMPLETE gave %v", err)
		}
	case err == nil || !errors.As(err, &tme) || tme.Timeout || ok && tme.Response != code:
		return fmt.Errorf("response code %v (present %v) gave %v", code, ok, err)
	}
	return nil
}

// checkAnswered: the target request just handled was answered (a new send carrying op and
// tag), queued for a free answer buffer, or dropped because the queue was full.
func (h *iuHarness) checkAnswered(nSends, ctrlQLen int, op srp.Opcode, tag srp.Tag) error {
	c := h.c
	h.qp.mu.Lock()
	sends := h.qp.sends[nSends:]
	h.qp.mu.Unlock()
	for _, wr := range sends {
		// The pool posts under IDs of its own: an answer is found by its buffer.
		if wr.Opcode != transport.WRSend || len(wr.SGL) != 1 {
			continue
		}
		off := int(wr.SGL[0].Addr - c.iuMem.Addr())
		isCtrl := false
		for _, o := range c.ctrlBuf {
			isCtrl = isCtrl || o == off
		}
		if !isCtrl {
			continue
		}
		b := c.iuMem.Bytes()[off : off+int(wr.SGL[0].Length)]
		if len(b) == srp.CredRspLen && srp.Opcode(b[0]) == op && string(b[8:16]) == string(tag[:]) {
			return nil
		}
	}
	if len(c.ctrlQ) == ctrlQLen+1 && c.ctrlQ[ctrlQLen] == (ctrlMsg{op, tag}) {
		return nil
	}
	if ctrlQLen == maxCtrlQ && len(c.ctrlQ) == maxCtrlQ {
		return nil // dropped: the queue is full
	}
	return fmt.Errorf("%v for tag %v neither sent nor queued (%d queued)", op, tag, len(c.ctrlQ))
}

// TestChannelCreditBounds: the credits a target grants (login, SRP_RSP, CRED_REQ, AER_REQ)
// stay within [0, queue depth + 1] whatever the deltas. Two CRED_REQs of 2^31-1 used to wrap
// the count negative (the channel then starved for good: no command, no task management
// probe); a delta of -2^31 did the same from the other side.
func TestChannelCreditBounds(t *testing.T) {
	a, _ := link.NewPipe(netip.MustParseAddr("10.0.9.1"), netip.MustParseAddr("10.0.9.2"), link.PipeConfig{})
	dev := openDev(t, a, "credits")
	cred := func(d int32) []byte {
		b := make([]byte, srp.CredReqLen)
		n, _ := srp.CredReq(b).Encode(&srp.CredReqFields{ReqLimDelta: d})
		return b[:n]
	}
	max := int32(iuHarnessQD + 1)
	cases := []struct {
		name   string
		login  int32
		deltas []int32
		want   int32
	}{
		{"plain", 2, []int32{1, 1}, 4},
		{"login beyond the queue depth", 1 << 20, nil, max},
		{"negative login", -3, nil, 0},
		{"2^31-1 twice", 2, []int32{0x7fffffff, 0x7fffffff}, max},
		{"-2^31", 2, []int32{-0x80000000}, 0},
		{"-2^31 then back", 2, []int32{-0x80000000, 3}, 3},
		{"beyond and back down", 2, []int32{100, -1}, max - 1},
	}
	for _, c := range cases {
		h, err := newIUHarness(dev, c.login, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range c.deltas {
			if err := h.deliver(cred(d)); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
		}
		h.c.mu.Lock()
		got := h.c.reqLim
		h.c.mu.Unlock()
		if got != c.want {
			t.Errorf("%s: %d credits, want %d", c.name, got, c.want)
		}
		if got > 1 {
			if err := h.start(0); err != nil || len(h.started) != 1 {
				t.Errorf("%s: no command with %d credits: %v", c.name, got, err)
			}
		}
		h.close()
	}
}

// TestHostileIULogRate: IUs a target can send as fast as it likes (responses for tags that are
// not ours, SRP_AER_REQs, target requests beyond the answer queue) are each logged at most
// once a second, with the count held back, but all of them are still handled and counted.
func TestHostileIULogRate(t *testing.T) {
	a, _ := link.NewPipe(netip.MustParseAddr("10.0.9.1"), netip.MustParseAddr("10.0.9.2"), link.PipeConfig{})
	dev := openDev(t, a, "lograte")
	core, logs := observer.New(zap.DebugLevel)
	h, err := newIUHarness(dev, 8, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	defer h.close()
	foreign := make([]byte, 64)
	n, _ := srp.Rsp(foreign).Encode(&srp.RspFields{Tag: tagBytes(makeTag(false, 1, 7, 3))}, len(foreign))
	foreign = foreign[:n]
	aer := make([]byte, srp.AerReqHdrLen)
	srp.AerReq(aer).Encode(&srp.AerReqFields{})
	cred := make([]byte, srp.CredReqLen)
	srp.CredReq(cred).Encode(&srp.CredReqFields{})
	const each = 300
	start := time.Now()
	for range each {
		for _, iu := range [][]byte{foreign, aer, cred} {
			if err := h.deliver(iu); err != nil {
				t.Fatal(err)
			}
		}
	}
	limit := 2 + int(time.Since(start)/logInterval)
	for _, msg := range []string{"response with a tag that is not ours", "asynchronous event from the target",
		"too many unanswered target requests; dropping one"} {
		if got := logs.FilterMessage(msg).Len(); got < 1 || got > limit {
			t.Errorf("%q logged %d times for %d IUs (want 1..%d)", msg, got, each, limit)
		}
	}
	st := &h.c.s.stats
	if st.staleRsps.Load() != each || st.aerReqs.Load() != each || st.credReqs.Load() != each {
		t.Errorf("counted %d stale responses, %d AER_REQs, %d CRED_REQs; want %d each",
			st.staleRsps.Load(), st.aerReqs.Load(), st.credReqs.Load(), each)
	}
}
