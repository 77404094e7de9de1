package target

import (
	"fmt"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/srpd/srpd/frpool"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

func alignUp(n, a int) int { return (n + a - 1) / a * a }

const (
	// rwSmall is the work-request capacity of each request slot's own RW context.
	rwSmall = 16
	// rwBig is the number of large RW contexts per channel (for transfers with more remote
	// descriptors than rwSmall); a transfer that finds none free waits, in send-queue order.
	rwBig = 4
)

// newChannel creates a channel's resources on dev: a PD, one CQ for sends and receives, the QP
// (moved to INIT), the frpool pool that posts on the QP's send queue (with one RW context per
// request context), and one registered memory area holding the receive ring, the response
// buffers, the external descriptor table buffers and the data buffers (QueueDepth+1 request
// contexts, each with Limits.MaxTransfer bytes of data buffer). Nothing is allocated per I/O
// afterwards. The receive ring is posted before return, so that the initiator may send as soon
// as the QP is connected.
//
// A failure at any step undoes the steps before it, in reverse order. The results are unnamed
// on purpose: the cleanups close over the local ch, and a named result would be set to nil by
// `return nil, err` before they run (the login-flood panic at the QP limit).
func (t *Target) newChannel(dev transport.Device, s *session, id uint64, d *LoginDecision) (_ *channel, err error) {
	lim := t.limits()
	attr := dev.Attr()
	l, err := t.layout(attr, d, dev.Name())
	if err != nil {
		return nil, err
	}
	depth, nRecv, nCtx := l.depth, l.nRecv, l.nCtx
	maxDesc, maxWR, smallWR, nBig, sqCap := lim.MaxDescriptors, l.maxWR, l.smallWR, l.nBig, l.sqCap
	itLen, tiLen := l.itLen, l.tiLen

	ch := &channel{
		t:       t,
		sess:    s,
		id:      id,
		view:    s.view,
		nexus:   s.nexus,
		dev:     dev,
		depth:   depth,
		itLen:   itLen,
		tiLen:   tiLen,
		immOff:  d.ImmDataOffset,
		remInv:  d.Rsp.Ext&srp.ExtRemoteInvalidate != 0,
		hostSGE: attr.HostSGE,
		rwSGEs:  smallWR,
		maxDesc: maxDesc,
		maxXfer: lim.MaxTransfer,
		nRecv:   nRecv,
		tags:    make(map[srp.Tag]*ioCtx, nCtx),
		queues:  make(map[*scsi.LUN]*lunQueue),
		cr:      newCredits(depth),
		sqCap:   sqCap,
		sqFree:  sqCap - ctlSlots,
		events:  make(chan event, nCtx+1),
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		reaped:  make(chan struct{}),
		log:     s.log,
		memRes:  d.memory,
	}
	ch.publishCredits()

	ch.recvStride, ch.recvBase = l.recvStride, l.recvBase
	rspStride, extStride := l.rspStride, l.extStride
	dataBase, dataStride, rspBase, ctlBase, extBase, total := l.dataBase, l.dataStride, l.rspBase, l.ctlBase, l.extBase, l.total

	var cleanup []func()
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()
	if ch.pd, err = dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("target: PD: %w", err)
	}
	cleanup = append(cleanup, func() { _ = ch.pd.Close() })
	if ch.cq, err = dev.CreateCQ(sqCap + nRecv + 16); err != nil {
		return nil, fmt.Errorf("target: CQ: %w", err)
	}
	cleanup = append(cleanup, func() { _ = ch.cq.Close() })
	ch.initCompletions()
	ch.qp, err = ch.pd.CreateQP(transport.QPInitAttr{
		Type: transport.QPTypeRC, SendCQ: ch.cq, RecvCQ: ch.cq,
		Cap: transport.QPCap{MaxSendWR: sqCap, MaxRecvWR: nRecv, MaxSendSGE: 1, MaxRecvSGE: 1},
	})
	if err != nil {
		return nil, fmt.Errorf("target: QP: %w", err)
	}
	cleanup = append(cleanup, func() { _ = ch.qp.Close() })
	// The pool posts everything on the send queue; the target uses only its RW contexts (one
	// MR because the pool wants at least one; it is never registered). Its QP-error warnings
	// are the channel's own (fail), so it logs errors only.
	if ch.pool, err = frpool.New(frpool.Config{
		Attr: attr, PD: ch.pd, QP: ch.qp, MaxPages: 1, NumMRs: 1, SQDepth: sqCap,
		Logger: errorsOnly(s.log),
	}); err != nil {
		return nil, fmt.Errorf("target: MR pool: %w", err)
	}
	cleanup = append(cleanup, func() { ch.closePool() })
	if ch.mem, err = dev.AllocMemory(total); err != nil {
		return nil, fmt.Errorf("target: %d bytes of memory: %w", total, err)
	}
	cleanup = append(cleanup, func() { _ = ch.mem.Free() })
	if ch.mr, err = ch.pd.RegMR(ch.mem.Addr(), uint64(ch.mem.Len()), transport.AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("target: MR: %w", err)
	}
	cleanup = append(cleanup, func() { _ = ch.mr.Close() })
	ch.lkey = ch.mr.LKey()

	mem := ch.mem.Bytes()
	base := ch.mem.Addr()
	ch.ctxs = make([]*ioCtx, nCtx)
	ch.free = make([]*ioCtx, 0, nCtx)
	for i := range ch.ctxs {
		c := &ioCtx{ch: ch, idx: i, slot: -1}
		do := dataBase + i*dataStride
		c.data, c.dataAddr = mem[do:do+lim.MaxTransfer:do+lim.MaxTransfer], base+uint64(do)
		ro := rspBase + i*rspStride
		c.rsp, c.rspAddr = mem[ro:ro+tiLen:ro+tiLen], base+uint64(ro)
		eo := extBase + i*extStride
		c.ext, c.extAddr = mem[eo:eo+extStride:eo+extStride], base+uint64(eo)
		c.remote = make([]frpool.RemoteSeg, 0, maxDesc)
		c.own = ch.pool.NewRWCtx(smallWR, smallWR)
		c.rw = c.own
		c.sendWR[0].SGL = c.sendSGE[:]
		c.chain.WRs = c.sendWR[:]
		ch.ctxs[i] = c
		ch.free = append(ch.free, c)
	}
	for i := range ch.ctl {
		o := ctlBase + i*rspStride
		ch.ctl[i] = ctlBuf{buf: mem[o : o+tiLen : o+tiLen], addr: base + uint64(o)}
	}
	ch.bigRW = make([]*frpool.RWCtx, nBig)
	for i := range ch.bigRW {
		ch.bigRW[i] = ch.pool.NewRWCtx(maxWR, maxWR)
	}
	ch.ctlWR[0].SGL = ch.ctlSGE[:]
	ch.ctlChain.WRs = ch.ctlWR[:]

	if err = ch.qp.Modify(&transport.QPAttr{State: transport.QPSInit, Port: 1},
		transport.AttrState|transport.AttrPKeyIndex|transport.AttrPort|transport.AttrAccessFlags); err != nil {
		return nil, fmt.Errorf("target: QP to INIT: %w", err)
	}
	ch.log = s.log.With(zap.Uint64("channel", id), zap.Uint32("qpn", ch.qp.QPN()))
	for i := 0; i < nRecv; i++ {
		if err = ch.postRecv(i); err != nil {
			return nil, fmt.Errorf("target: posting the receive ring: %w", err)
		}
	}
	t.stats.mrs.Add(1)
	t.stats.memBytes.Add(int64(ch.mem.Len()))
	return ch, nil
}

// chLayout is a channel's sizes: its queues and the one memory area of its buffers.
type chLayout struct {
	depth, nRecv, nCtx int
	maxWR, smallWR     int
	nBig, sqCap        int
	itLen, tiLen       int
	recvStride         int
	rspStride          int
	extStride          int
	dataStride         int
	dataBase, recvBase int
	rspBase, ctlBase   int
	extBase, total     int
}

// layout computes the resources a channel for decision d takes on a device with attr. Login
// uses it to check the memory budget before anything is allocated.
func (t *Target) layout(attr transport.DeviceAttr, d *LoginDecision, devName string) (chLayout, error) {
	lim := t.limits()
	var l chLayout
	depth := d.QueueDepth
	l.depth = depth
	l.nRecv = depth + 1 // +1: responses to target requests (SRP_CRED_RSP) consume no credit
	l.nCtx = depth + 1  // +1: an overrunning request gets answered without waiting
	maxDesc := lim.MaxDescriptors
	// RDMA work requests of one transfer: one per remote descriptor, plus the splits of
	// descriptors longer than the device's largest message.
	maxMsg := uint64(1) << 31
	if attr.MaxMsgSize > 0 && attr.MaxMsgSize < maxMsg {
		maxMsg = attr.MaxMsgSize
	}
	l.maxWR = maxDesc + int((uint64(lim.MaxTransfer)+maxMsg-1)/maxMsg)
	// Each request slot has an RW context for rwSmall work requests; transfers needing more
	// (up to maxWR) borrow one of nBig large ones. Sizing every slot for maxWR would cost
	// (QueueDepth+1) × maxWR work requests per channel (5 MiB at depth 128 and 256
	// descriptors), for transfers that are rare (ib_srp sends at most cmd_sg_entries = 12
	// descriptors in the IU, our initiator one per MB of data).
	l.smallWR = min(l.maxWR, rwSmall)
	if l.maxWR > l.smallWR {
		l.nBig = min(rwBig, l.nCtx)
	}
	// Send queue: room for two posts per context and one maximal transfer, +ctlSlots: the
	// control buffers (T_LOGOUT, CRED_REQ), the keep-alive probe and frpool's sentinel slot.
	l.sqCap = 2*l.nCtx + l.maxWR + ctlSlots
	if attr.MaxQPWR > 0 && l.sqCap > attr.MaxQPWR {
		l.sqCap = attr.MaxQPWR
	}
	if l.sqCap < l.maxWR+1+ctlSlots || (attr.MaxQPWR > 0 && l.nRecv > attr.MaxQPWR) {
		return l, fmt.Errorf("target: device %s: max_qp_wr %d too small for %d descriptors and queue depth %d: %w",
			devName, attr.MaxQPWR, maxDesc, depth, transport.ErrNoResources)
	}
	l.itLen, l.tiLen = d.MaxITIULen(), d.MaxTIIULen()
	l.recvStride = alignUp(l.itLen, 64)
	l.rspStride = alignUp(l.tiLen, 64)
	l.extStride = alignUp(2*maxDesc*srp.DirectDescLen, 64)
	l.dataStride = alignUp(lim.MaxTransfer, 4096)
	off := 0
	l.dataBase = off
	off += l.nCtx * l.dataStride
	l.recvBase = off
	off += l.nRecv * l.recvStride
	l.rspBase = off
	off += l.nCtx * l.rspStride
	l.ctlBase = off
	off += 2 * l.rspStride
	l.extBase = off
	off += l.nCtx * l.extStride
	l.total = alignUp(off, 4096)
	return l, nil
}

// ctlSlots are the send-queue slots kept out of the commands' share: T_LOGOUT, CRED_REQ, the
// keep-alive probe, and frpool's sentinel.
const ctlSlots = 4

// errorsOnly is log without its levels below Error.
func errorsOnly(log *zap.Logger) *zap.Logger {
	if !log.Core().Enabled(zapcore.ErrorLevel) {
		return log // IncreaseLevel would complain
	}
	return log.WithOptions(zap.IncreaseLevel(zapcore.ErrorLevel))
}
