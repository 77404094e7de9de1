package initiator

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/scsi/backend"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce"
	"github.com/srpd/srpd/transport/softroce/link"
)

// This file is a minimal SRP target for the tests ("responder"): logins decoded in either form
// with ib_srpt's checks, channels over softroce with RDMA READ/WRITE data movement, commands
// executed by the scsi package on RAM LUNs, task management, and the knobs the tests need:
// commands held back (never answered), task management failures, login rejects, small credits
// with a check that the initiator never exceeds them, CRED_REQ / AER_REQ / T_LOGOUT injection,
// SEND_WITH_INV, and kill (crash) / restart of the whole target.

var testTargetPort = srp.MakePortID(0x0002c90300001234, 0x0002c90300001234)

type tmMode int

const (
	tmAnswer tmMode = iota
	tmFail
	tmIgnore
)

type tgtConfig struct {
	credits     int
	maxITIULen  uint32
	maxTIIULen  uint32
	noImm       bool
	noIndirect  bool
	maxChannels int
	reject      srp.RejectReason
	sendInv     bool
	maxXfer     int
	lunSize     int64
	nLUNs       int
	blockSize   int
	qpTimeout   uint8
	readOnly    bool
	// LUN limits (0: the scsi package's defaults)
	maxUnmapLBAs uint32
	maxWriteSame uint64
}

func (c *tgtConfig) fill() {
	c.credits = cmp.Or(c.credits, 32)
	c.maxITIULen = cmp.Or(c.maxITIULen, 8276)
	c.maxTIIULen = cmp.Or(c.maxTIIULen, srp.RspHdrLen+4+scsi.MaxSenseLen)
	c.maxChannels = cmp.Or(c.maxChannels, 16)
	c.maxXfer = cmp.Or(c.maxXfer, 1<<20)
	c.lunSize = cmp.Or(c.lunSize, 64<<20)
	c.nLUNs = cmp.Or(c.nLUNs, 1)
	c.blockSize = cmp.Or(c.blockSize, 512)
	c.qpTimeout = cmp.Or(c.qpTimeout, 14)
}

type tgt struct {
	t      testing.TB
	cfg    tgtConfig
	dev    *softroce.Device
	addr   netip.AddrPort
	lunSet *scsi.LUNSet
	luns   []*scsi.LUN

	mu     sync.Mutex
	down   bool
	chans  map[*tchan]struct{}
	logins []srp.LoginReq
	hold   func(cdb []byte) bool
	refuse func(cdb []byte) *scsi.Sense // answer CHECK CONDITION with this sense
	tm     tmMode
	tmFor  func(srp.TaskMgmtFunc) tmMode
	nexus  map[srp.PortID]bool

	// observe sees every command the target executes (not held ones) with its data-out; both
	// slices are the target's buffers, valid only during the call.
	observe func(cdb, dataOut []byte)

	stingy      atomic.Bool  // responses return no credit; task management responses return them all
	violations  atomic.Int64 // commands beyond the credits granted
	cmds        atomic.Int64
	credRsps    atomic.Int64
	aerRsps     atomic.Int64
	aborts      atomic.Int64
	resets      atomic.Int64
	tms         atomic.Int64
	maxInflight atomic.Int64
	inflight    atomic.Int64
	immCmds     atomic.Int64
	indirect    atomic.Int64
	heldCount   atomic.Int64
}

func newTgt(t testing.TB, dev *softroce.Device, cfg tgtConfig) *tgt {
	cfg.fill()
	tg := &tgt{t: t, cfg: cfg, dev: dev, addr: dev.Addrs()[0], lunSet: scsi.NewLUNSet(),
		chans: map[*tchan]struct{}{}, nexus: map[srp.PortID]bool{}}
	for i := 0; i < cfg.nLUNs; i++ {
		ram, err := backend.NewRAM(cfg.lunSize, false)
		if err != nil {
			t.Fatal(err)
		}
		l, err := scsi.NewLUN(scsi.LUNConfig{BlockSize: cfg.blockSize, Serial: fmt.Sprintf("tgt-lun-%d", i), ReadOnly: cfg.readOnly,
			MaxTransferLength: uint32(cfg.maxXfer / cfg.blockSize), MaxUnmapLBACount: cfg.maxUnmapLBAs,
			MaxWriteSameLength: cfg.maxWriteSame}, ram)
		if err != nil {
			t.Fatal(err)
		}
		if err := tg.lunSet.Add(uint16(i), l); err != nil {
			t.Fatal(err)
		}
		tg.luns = append(tg.luns, l)
	}
	t.Cleanup(func() {
		tg.kill()
		for _, l := range tg.luns {
			l.Close()
		}
	})
	return tg
}

func (tg *tgt) setHold(f func(cdb []byte) bool) {
	tg.mu.Lock()
	tg.hold = f
	tg.mu.Unlock()
}

func (tg *tgt) setTM(m tmMode) {
	tg.mu.Lock()
	tg.tm = m
	tg.mu.Unlock()
}

func (tg *tgt) channels() []*tchan {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	var out []*tchan
	for c := range tg.chans {
		out = append(out, c)
	}
	return out
}

// kill crashes the target: every channel's QP vanishes without telling the initiator, and logins
// are refused (unreachable) until restart.
func (tg *tgt) kill() {
	tg.mu.Lock()
	tg.down = true
	chans := tg.chans
	tg.chans = map[*tchan]struct{}{}
	tg.mu.Unlock()
	for c := range chans {
		c.shutdown(false)
	}
}

// restart brings a killed target back; every nexus it knew sees I_T NEXUS LOSS.
func (tg *tgt) restart() {
	tg.mu.Lock()
	tg.down = false
	for p := range tg.nexus {
		tg.lunSet.NexusLost(scsi.Nexus{InitiatorPortID: p, TargetPortID: testTargetPort})
	}
	tg.mu.Unlock()
}

// disconnectAll disconnects every channel gracefully (a CM DREQ).
func (tg *tgt) disconnectAll() {
	for _, c := range tg.channels() {
		c.shutdown(true)
	}
}

// ---- login ----

type acceptReq struct {
	addr        netip.AddrPort
	qpn, psn    uint32
	priv        []byte
	rdRes       uint8 // the initiator's responder resources
	conn        *fakeConn
	initiatorQP transport.QP
}

type acceptRep struct {
	addr     netip.AddrPort
	qpn, psn uint32
	priv     []byte
	ch       *tchan
}

func rejectErr(reason srp.RejectReason, bufFmt srp.BufFormats, tag srp.Tag) error {
	b := make([]byte, transport.MaxRejectPrivateData)
	_, _ = srp.LoginRej(b).Encode(&srp.LoginRejFields{Reason: reason, Tag: tag, BufFmt: bufFmt})
	return &transport.RejectError{Reason: transport.RejectConsumerDefined, PrivateData: b}
}

func (tg *tgt) accept(req acceptReq) (acceptRep, error) {
	var rep acceptRep
	var lr srp.LoginReq
	var err error
	if len(req.priv) == srp.LoginReqRDMALen {
		lr, err = srp.DecodeLoginReqRDMA(req.priv)
	} else {
		lr, err = srp.DecodeLoginReq(req.priv)
	}
	if err != nil {
		return rep, rejectErr(srp.RejUnableEstablishChannel, 6, srp.Tag{})
	}
	cfg := &tg.cfg
	fmts := srp.BufFormatDirect
	if !cfg.noIndirect {
		fmts |= srp.BufFormatIndirect
	}
	tg.mu.Lock()
	defer tg.mu.Unlock()
	if tg.down {
		return rep, transport.ErrConnUnreachable
	}
	tg.logins = append(tg.logins, lr)
	switch {
	case cfg.reject != 0:
		return rep, rejectErr(cfg.reject, fmts, lr.Tag)
	case lr.ReqITIULen > cfg.maxITIULen || lr.ReqITIULen < 64:
		return rep, rejectErr(srp.RejITIULenTooLarge, fmts, lr.Tag)
	case lr.TargetPortID != testTargetPort:
		return rep, rejectErr(srp.RejUnableAssociateChannel, fmts, lr.Tag)
	case lr.BufFmt&^fmts != 0:
		return rep, rejectErr(srp.RejUnsupportedDescFormat, fmts, lr.Tag)
	}
	var others []*tchan
	for c := range tg.chans {
		if c.iport == lr.InitiatorPortID {
			others = append(others, c)
		}
	}
	var flags srp.LoginRspFlags
	if lr.MultiChannel() == srp.MultiChanSingle {
		for _, c := range others {
			delete(tg.chans, c)
			go c.shutdown(true)
		}
		if len(others) > 0 {
			flags |= srp.MultiChanTerminated
		}
	} else {
		if cfg.maxChannels == 1 && len(others) > 0 {
			return rep, rejectErr(srp.RejMultiChannelUnsupported, fmts, lr.Tag)
		}
		if len(others) >= cfg.maxChannels {
			return rep, rejectErr(srp.RejChannelLimitReached, fmts, lr.Tag)
		}
		flags |= srp.MultiChanMaintained
	}
	immOff := 0
	if lr.Flags&srp.ImmedRequested != 0 && !cfg.noImm && lr.ImmDataOffset >= srp.CmdHdrLen {
		immOff = int(lr.ImmDataOffset)
		flags |= srp.ImmedSupported
	}
	c, err := tg.newChan(lr, immOff, req)
	if err != nil {
		tg.t.Errorf("target: creating channel: %v", err)
		return rep, rejectErr(srp.RejInsufficientResources, fmts, lr.Tag)
	}
	tg.chans[c] = struct{}{}
	tg.nexus[lr.InitiatorPortID] = true
	rsp := make([]byte, srp.LoginRspLen)
	_, _ = srp.LoginRsp(rsp).Encode(&srp.LoginRspFields{ReqLimDelta: int32(cfg.credits), Tag: lr.Tag,
		MaxITIULen: cfg.maxITIULen, MaxTIIULen: cfg.maxTIIULen, BufFmt: fmts, Flags: flags})
	rep = acceptRep{addr: tg.addr, qpn: c.qp.QPN(), psn: c.psn, priv: rsp, ch: c}
	return rep, nil
}

// ---- channels ----

const (
	tkRecv  = 0
	tkRead  = 1
	tkSend  = 2
	tkWrite = 3
)

type tctx struct {
	busy    bool
	tag     srp.Tag
	lun     scsi.LUNAddress
	cdb     [16]byte
	cdbLen  int
	dir     dataDir
	descs   []srp.DirectDesc
	total   int
	data    []byte
	dAddr   uint64
	reads   int
	sendInv uint32
}

type tchan struct {
	tg     *tgt
	iport  srp.PortID
	pd     transport.PD
	cq     transport.CQ
	qp     transport.QP
	mem    transport.Memory
	mr     transport.MR
	psn    uint32
	itLen  int
	tiLen  int
	immOff int
	nRecv  int
	nRsp   int

	recvOff, rspOff, dataOff int
	ctxs                     []tctx
	rspFree                  []int

	// Guarded by the channel goroutine (and mu for the counters read by tests).
	mu      sync.Mutex
	credits int32 // what the initiator may still send
	pending int32 // credits of aborted commands, returned with the next response
	held    map[srp.Tag]scsi.LUNAddress

	conn     *fakeConn
	inject   chan func()
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
	graceful atomic.Bool
}

func (tg *tgt) newChan(lr srp.LoginReq, immOff int, req acceptReq) (*tchan, error) {
	cfg := &tg.cfg
	c := &tchan{tg: tg, iport: lr.InitiatorPortID, itLen: int(cfg.maxITIULen), tiLen: int(cfg.maxTIIULen),
		immOff: immOff, psn: rand.Uint32N(1 << 24), held: map[srp.Tag]scsi.LUNAddress{},
		inject: make(chan func(), 16), stop: make(chan struct{}), done: make(chan struct{}), conn: req.conn}
	c.credits = int32(cfg.credits)
	// A context is free again only when the response's SEND is acknowledged, which can come
	// after the initiator has reused the credit (a lost ACK): keep plenty.
	nctx := 4*cfg.credits + 8
	c.nRecv = cfg.credits + 8
	c.nRsp = nctx + 8
	var err error
	if c.pd, err = tg.dev.AllocPD(); err != nil {
		return nil, err
	}
	if c.cq, err = tg.dev.CreateCQ(8192); err != nil {
		return nil, err
	}
	rstride := roundUp(c.itLen, 64)
	c.rspOff = c.nRecv * rstride
	c.dataOff = roundUp(c.rspOff+c.nRsp*512, 4096)
	size := c.dataOff + nctx*cfg.maxXfer
	if c.mem, err = tg.dev.AllocMemory(size); err != nil {
		return nil, err
	}
	if c.mr, err = c.pd.RegMR(c.mem.Addr(), uint64(c.mem.Len()), transport.AccessLocalWrite); err != nil {
		return nil, err
	}
	c.qp, err = c.pd.CreateQP(transport.QPInitAttr{SendCQ: c.cq, RecvCQ: c.cq,
		Cap: transport.QPCap{MaxSendWR: 4096, MaxRecvWR: c.nRecv, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, err
	}
	c.ctxs = make([]tctx, nctx)
	for i := range c.ctxs {
		x := &c.ctxs[i]
		off := c.dataOff + i*cfg.maxXfer
		x.data = c.mem.Bytes()[off : off+cfg.maxXfer]
		x.dAddr = c.mem.Addr() + uint64(off)
	}
	for i := 0; i < c.nRsp; i++ {
		c.rspFree = append(c.rspFree, i)
	}
	// Connect towards the initiator's QP.
	rd := req.rdRes
	if rd == 0 {
		rd = 1
	}
	if err := bringUp(c.qp, tg.addr.Addr(), req.addr, req.qpn, req.psn, c.psn, 16, rd, cfg.qpTimeout, 6); err != nil {
		return nil, err
	}
	for i := 0; i < c.nRecv; i++ {
		if err := c.postRecv(i); err != nil {
			return nil, err
		}
	}
	go c.run()
	return c, nil
}

// bringUp moves qp to RTS towards the peer QP (address, QPN, PSN exchanged out of band).
func bringUp(qp transport.QP, local netip.Addr, peer netip.AddrPort, peerQPN, peerPSN, psn uint32, maxDestRd, maxRd uint8, timeout, retry uint8) error {
	if err := qp.Modify(&transport.QPAttr{State: transport.QPSInit, Port: 1,
		AccessFlags: transport.AccessRemoteRead | transport.AccessRemoteWrite},
		transport.AttrState|transport.AttrPKeyIndex|transport.AttrPort|transport.AttrAccessFlags); err != nil {
		return err
	}
	if err := qp.Modify(&transport.QPAttr{State: transport.QPSRTR, PathMTU: transport.MTU4096, DestQPN: peerQPN,
		RQPSN: peerPSN, MaxDestRdAtomic: maxDestRd, MinRNRTimer: 1,
		AV: transport.AddressVector{SrcAddr: local, DstAddr: peer.Addr(), DstPort: peer.Port()}},
		transport.AttrState|transport.AttrAV|transport.AttrPathMTU|transport.AttrDestQPN|transport.AttrRQPSN|
			transport.AttrMaxDestRdAtomic|transport.AttrMinRNRTimer); err != nil {
		return err
	}
	return qp.Modify(&transport.QPAttr{State: transport.QPSRTS, Timeout: timeout, RetryCnt: retry, RNRRetry: 7,
		SQPSN: psn, MaxRdAtomic: maxRd},
		transport.AttrState|transport.AttrTimeout|transport.AttrRetryCnt|transport.AttrRNRRetry|
			transport.AttrSQPSN|transport.AttrMaxQPRdAtomic)
}

func (c *tchan) postRecv(i int) error {
	off := i * roundUp(c.itLen, 64)
	return c.qp.PostRecv([]transport.RecvWR{{ID: uint64(i), SGL: []transport.SGE{{Addr: c.mem.Addr() + uint64(off),
		Length: uint32(c.itLen), LKey: c.mr.LKey()}}}})
}

// shutdown stops the channel: graceful tells the initiator (CM disconnect), otherwise the QP just
// vanishes (a crash).
func (c *tchan) shutdown(graceful bool) {
	c.once.Do(func() {
		c.graceful.Store(graceful)
		close(c.stop)
	})
	<-c.done
}

func (c *tchan) run() {
	defer func() {
		if c.graceful.Load() && c.conn != nil {
			c.conn.peerDisconnect()
		}
		_ = c.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState)
		_ = c.qp.Close()
		_ = c.mr.Close()
		_ = c.cq.Close()
		_ = c.mem.Free()
		_ = c.pd.Close()
		c.tg.mu.Lock()
		delete(c.tg.chans, c)
		c.tg.mu.Unlock()
		close(c.done)
	}()
	wcs := make([]transport.WC, 64)
	for {
		n := c.cq.Poll(wcs)
		for i := 0; i < n; i++ {
			wc := &wcs[i]
			if wc.Status != transport.WCSuccess {
				if wc.Status != transport.WCWRFlushErr {
					// A transport error: like ib_srpt, close the channel with a DREQ.
					c.tg.t.Logf("target: qp %#x: completion %#x %v: %v", c.qp.QPN(), wc.ID, wc.Opcode, wc.Status)
					c.graceful.Store(true)
				}
				return // the initiator went away (or we did)
			}
			if !c.handle(wc) {
				c.graceful.Store(true) // a protocol problem: log the initiator out
				return
			}
		}
		if n > 0 {
			continue
		}
		select {
		case <-c.cq.Notify():
		case f := <-c.inject:
			f()
		case <-c.stop:
			return
		}
	}
}

func (c *tchan) handle(wc *transport.WC) bool {
	kind, idx := int(wc.ID>>32), int(wc.ID&0xffffffff)
	switch kind {
	case tkRecv:
		off := idx * roundUp(c.itLen, 64)
		b := c.mem.Bytes()[off : off+int(wc.ByteLen)]
		ok := c.handleIU(b)
		if err := c.postRecv(idx); err != nil {
			return false
		}
		return ok
	case tkRead:
		x := &c.ctxs[idx]
		c.execute(idx, x)
	case tkSend:
		c.rspFree = append(c.rspFree, idx&0xffff)
		if ci := idx >> 16; ci > 0 {
			c.ctxs[ci-1].busy = false
			c.tg.inflight.Add(-1)
		}
	}
	return true
}

func (c *tchan) consumeCredit() {
	c.mu.Lock()
	c.credits--
	if c.credits < 0 {
		c.tg.violations.Add(1)
	}
	c.mu.Unlock()
}

func (c *tchan) handleIU(b []byte) bool {
	tg := c.tg
	switch srp.Opcode(b[0]) {
	case srp.OpCmd:
		c.consumeCredit()
		tg.cmds.Add(1)
		cmd, err := srp.ParseCmd(b, c.immOff)
		if err != nil {
			tg.t.Errorf("target: bad SRP_CMD: %v", err)
			return false
		}
		ci := -1
		for i := range c.ctxs {
			if !c.ctxs[i].busy {
				ci = i
				break
			}
		}
		if ci < 0 {
			tg.t.Errorf("target: no command context free (credits exceeded)")
			return false
		}
		x := &c.ctxs[ci]
		*x = tctx{data: x.data, dAddr: x.dAddr, descs: x.descs[:0], busy: true}
		if v := tg.inflight.Add(1); v > tg.maxInflight.Load() {
			tg.maxInflight.Store(v)
		}
		x.tag = cmd.Tag()
		x.lun = scsi.LUNAddress(cmd.LUN())
		x.cdbLen = copy(x.cdb[:], cmd.CDB())
		tg.mu.Lock()
		hold := tg.hold
		tg.mu.Unlock()
		if hold != nil && hold(x.cdb[:x.cdbLen]) {
			c.mu.Lock()
			c.held[x.tag] = x.lun
			c.mu.Unlock()
			tg.heldCount.Add(1)
			x.busy = false
			tg.inflight.Add(-1)
			return true
		}
		out, in := cmd.DataOut(), cmd.DataIn()
		switch {
		case out.Format == srp.DescImmediate:
			tg.immCmds.Add(1)
			x.dir = dirOut
			x.total = copy(x.data, cmd.ImmData(c.immOff))
			c.execute(ci, x)
		case out.Format != srp.DescNone:
			x.dir = dirOut
			c.collect(x, out)
			if !c.readData(ci, x) {
				return false
			}
		case in.Format != srp.DescNone:
			x.dir = dirIn
			c.collect(x, in)
			c.execute(ci, x)
		default:
			c.execute(ci, x)
		}
	case srp.OpTskMgmt:
		c.consumeCredit()
		tg.tms.Add(1)
		tm, err := srp.ParseTskMgmt(b)
		if err != nil {
			tg.t.Errorf("target: bad SRP_TSK_MGMT: %v", err)
			return false
		}
		c.taskMgmt(tm)
	case srp.OpCredRsp:
		tg.credRsps.Add(1)
	case srp.OpAerRsp:
		tg.aerRsps.Add(1)
	default:
		tg.t.Errorf("target: unexpected IU %v", srp.Opcode(b[0]))
		return false
	}
	return true
}

func (c *tchan) collect(x *tctx, d srp.DataBuf) {
	if d.Format == srp.DescIndirect {
		c.tg.indirect.Add(1)
	}
	for i := 0; i < d.NumDescs(); i++ {
		dd := d.Desc(i)
		x.descs = append(x.descs, dd)
		x.total += int(dd.Len)
	}
	if d.Format == srp.DescDirect && c.tg.cfg.sendInv {
		x.sendInv = d.Direct.Key
	}
}

// readData fetches data-out with RDMA READs (one per descriptor, the last signaled).
func (c *tchan) readData(ci int, x *tctx) bool {
	if x.total > len(x.data) {
		c.tg.t.Errorf("target: data-out of %d bytes exceeds the buffer", x.total)
		return false
	}
	wrs := make([]transport.SendWR, len(x.descs))
	off := 0
	for i, d := range x.descs {
		wrs[i] = transport.SendWR{ID: tkRead<<32 | uint64(ci), Opcode: transport.WRRDMARead,
			SGL:        []transport.SGE{{Addr: x.dAddr + uint64(off), Length: d.Len, LKey: c.mr.LKey()}},
			RemoteAddr: d.VA, RKey: d.Key}
		off += int(d.Len)
	}
	wrs[len(wrs)-1].Flags = transport.SendSignaled
	return c.qp.PostSend(wrs) == nil
}

func (c *tchan) execute(ci int, x *tctx) {
	tg := c.tg
	var sense [scsi.MaxSenseLen]byte
	cmd := scsi.Command{CDB: x.cdb[:x.cdbLen], LUN: x.lun, Sense: sense[:],
		Nexus: scsi.Nexus{InitiatorPortID: c.iport, TargetPortID: testTargetPort}}
	switch x.dir {
	case dirOut:
		cmd.DataOut = x.data[:x.total]
	case dirIn:
		cmd.DataIn = x.data[:min(x.total, len(x.data))]
	}
	tg.mu.Lock()
	refuse, observe := tg.refuse, tg.observe
	tg.mu.Unlock()
	if observe != nil {
		observe(cmd.CDB, cmd.DataOut)
	}
	var res scsi.Result
	if sn := (*scsi.Sense)(nil); refuse != nil {
		sn = refuse(x.cdb[:x.cdbLen])
		if sn != nil {
			res = scsi.Result{Status: scsi.StatusCheckCondition, SenseLen: sn.EncodeFixed(sense[:])}
		}
	}
	if res.Status == scsi.StatusGood && res.SenseLen == 0 {
		res = tg.lunSet.Execute(context.Background(), &cmd)
	}
	f := srp.RspFields{Tag: x.tag, Status: uint8(res.Status), Sense: sense[:res.SenseLen]}
	var wrs []transport.SendWR
	if x.dir == dirIn {
		if res.DataInLen < x.total {
			f.Flags |= srp.DIUnder
			f.DataInResid = uint32(x.total - res.DataInLen)
		}
		off := 0
		for _, d := range x.descs {
			if off >= res.DataInLen {
				break
			}
			n := min(int(d.Len), res.DataInLen-off)
			wrs = append(wrs, transport.SendWR{ID: tkWrite << 32, Opcode: transport.WRRDMAWrite,
				SGL:        []transport.SGE{{Addr: x.dAddr + uint64(off), Length: uint32(n), LKey: c.mr.LKey()}},
				RemoteAddr: d.VA, RKey: d.Key})
			off += n
		}
	}
	c.respond(&f, ci+1, x.sendInv, wrs)
}

// respond sends an SRP_RSP (after wrs), giving back one credit plus those of aborted commands.
func (c *tchan) respond(f *srp.RspFields, ctx1 int, inv uint32, wrs []transport.SendWR) {
	c.mu.Lock()
	if c.tg.stingy.Load() && len(f.RespData) == 0 {
		// Keep the command's credit back until a task management response (ib_srpt returns
		// the credits of aborted commands only with later responses).
		f.ReqLimDelta = 0
		c.pending++
	} else {
		f.ReqLimDelta = 1 + c.pending
		c.pending = 0
	}
	c.credits += f.ReqLimDelta
	c.mu.Unlock()
	c.sendIU(func(b []byte) int {
		n, err := srp.Rsp(b).Encode(f, c.tiLen)
		if err != nil {
			c.tg.t.Errorf("target: encoding SRP_RSP: %v", err)
		}
		return n
	}, ctx1, inv, wrs)
}

func (c *tchan) sendIU(enc func([]byte) int, ctx1 int, inv uint32, wrs []transport.SendWR) {
	if len(c.rspFree) == 0 {
		c.tg.t.Errorf("target: out of response buffers")
		return
	}
	bi := c.rspFree[len(c.rspFree)-1]
	c.rspFree = c.rspFree[:len(c.rspFree)-1]
	off := c.rspOff + bi*512
	n := enc(c.mem.Bytes()[off : off+512])
	wr := transport.SendWR{ID: tkSend<<32 | uint64(ctx1)<<16 | uint64(bi), Opcode: transport.WRSend,
		Flags: transport.SendSignaled, SGL: []transport.SGE{{Addr: c.mem.Addr() + uint64(off), Length: uint32(n), LKey: c.mr.LKey()}}}
	if inv != 0 {
		wr.Opcode = transport.WRSendWithInv
		wr.InvalidateRKey = inv
	}
	_ = c.qp.PostSend(append(wrs, wr))
}

func (c *tchan) taskMgmt(tm srp.TskMgmt) {
	tg := c.tg
	tg.mu.Lock()
	mode := tg.tm
	if tg.tmFor != nil {
		mode = tg.tmFor(tm.Func())
	}
	tg.mu.Unlock()
	code := srp.TMSuccess
	switch mode {
	case tmIgnore:
		c.mu.Lock()
		c.pending++
		c.mu.Unlock()
		return
	case tmFail:
		code = srp.TMFailed
	default:
		switch tm.Func() {
		case srp.TMAbortTask:
			c.mu.Lock()
			if _, ok := c.held[tm.TaskTag()]; ok {
				delete(c.held, tm.TaskTag())
				c.pending++
			}
			c.mu.Unlock()
			tg.aborts.Add(1)
		case srp.TMLUNReset:
			lun := scsi.LUNAddress(tm.LUN())
			tg.mu.Lock()
			for ch := range tg.chans {
				ch.dropHeld(lun)
			}
			tg.mu.Unlock()
			if l := tg.lunSet.Lookup(lun); l != nil {
				_ = l.Reset()
			}
			tg.resets.Add(1)
		default:
			code = srp.TMFuncNotSupported
		}
	}
	c.respond(&srp.RspFields{Tag: tm.Tag(), RespData: []byte{0, 0, 0, byte(code)}}, 0, 0, nil)
}

// dropHeld forgets the held commands of lun (a LUN reset aborted them); their credits come back
// with later responses, as ib_srpt does.
func (c *tchan) dropHeld(lun scsi.LUNAddress) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for tag, l := range c.held {
		if l == lun {
			delete(c.held, tag)
			c.pending++
		}
	}
}

// sendTargetIU injects a target-initiated IU (CRED_REQ, AER_REQ, T_LOGOUT) from the channel
// goroutine.
func (c *tchan) sendTargetIU(op srp.Opcode, delta int32, reason srp.TLogoutReason) {
	done := make(chan struct{})
	c.inject <- func() {
		defer close(done)
		if delta != 0 {
			c.mu.Lock()
			c.credits += delta
			c.mu.Unlock()
		}
		tag := srp.Tag{0xee, byte(op)}
		c.sendIU(func(b []byte) int {
			switch op {
			case srp.OpCredReq:
				n, _ := srp.CredReq(b).Encode(&srp.CredReqFields{ReqLimDelta: delta, Tag: tag, SolNot: srp.SOLNT})
				return n
			case srp.OpAerReq:
				s := scsi.Sense{Key: scsi.UnitAttention, ASC: 0x3f, ASCQ: 0x0e}
				var sb [18]byte
				k := s.EncodeFixed(sb[:])
				n, _ := srp.AerReq(b).Encode(&srp.AerReqFields{ReqLimDelta: delta, Tag: tag, Sense: sb[:k]})
				return n
			default:
				n, _ := srp.TLogout(b).Encode(&srp.TLogoutFields{Reason: reason, Tag: tag})
				return n
			}
		}, 0, 0, nil)
	}
	<-done
}

func (c *tchan) creditsNow() int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.credits
}

// ---- the out-of-band connection manager ----

// fakeConn is one end of a connection made by testDialer: it plays the part of the RDMA CM
// (disconnect events, Disconnect moving the QP to ERR and telling the other end).
type fakeConn struct {
	qp     transport.QP
	priv   []byte
	events chan transport.CMEvent
	tch    atomic.Pointer[tchan] // the test target's channel (initiator end only)
	peer   *fakeConn             // the other end, for a real target
	once   sync.Once
	gone   sync.Once
	local  netip.AddrPort
	remote netip.AddrPort
}

func (f *fakeConn) QP() transport.QP                 { return f.qp }
func (f *fakeConn) LocalAddr() netip.AddrPort        { return f.local }
func (f *fakeConn) RemoteAddr() netip.AddrPort       { return f.remote }
func (f *fakeConn) PrivateData() []byte              { return f.priv }
func (f *fakeConn) Events() <-chan transport.CMEvent { return f.events }
func (f *fakeConn) Disconnect(priv []byte) error {
	f.once.Do(func() {
		_ = f.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState)
		if p := f.tch.Load(); p != nil {
			go p.shutdown(false)
		}
		if f.peer != nil {
			f.peer.peerDisconnect()
		}
	})
	return nil
}

// peerDisconnect is the other end's DREQ arriving.
func (f *fakeConn) peerDisconnect() {
	f.gone.Do(func() {
		f.events <- transport.CMEvent{Type: transport.CMEventDisconnected}
		_ = f.qp.Modify(&transport.QPAttr{State: transport.QPSErr}, transport.AttrState)
	})
}

// testDialer connects the initiator's QPs to a tgt (or any acceptor) out of band.
type testDialer struct {
	local   netip.AddrPort
	accept  func(acceptReq) (acceptRep, error)
	timeout uint8
	dials   atomic.Int64
}

func (d *testDialer) Dial(ctx context.Context, qp transport.QP, priv []byte, param transport.ConnParam) (transport.CMConn, error) {
	d.dials.Add(1)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	psn := rand.Uint32N(1 << 24)
	conn := &fakeConn{qp: qp, events: make(chan transport.CMEvent, 4), local: d.local}
	rep, err := d.accept(acceptReq{addr: d.local, qpn: qp.QPN(), psn: psn, priv: append([]byte(nil), priv...),
		rdRes: param.ResponderResources, conn: conn, initiatorQP: qp})
	if err != nil {
		return nil, err
	}
	if rep.ch != nil {
		conn.tch.Store(rep.ch)
	}
	conn.priv, conn.remote = rep.priv, rep.addr
	if err := bringUp(qp, d.local.Addr(), rep.addr, rep.qpn, rep.psn, psn, param.ResponderResources,
		param.InitiatorDepth, d.timeout, param.RetryCount); err != nil {
		return nil, err
	}
	return conn, nil
}

// ---- environments ----

type env struct {
	t       testing.TB
	ini, tg *softroce.Device
	iniLink *link.MemLink
	tgLink  *link.MemLink
	tgt     *tgt
	dialer  *testDialer
	log     *zap.Logger
}

func openDev(t testing.TB, l link.Link, name string) *softroce.Device {
	d, err := softroce.Open(softroce.Config{Link: l, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = d.Close(ctx)
	})
	return d
}

// newMemEnv is an initiator and a test target on the in-memory link (with pc's faults).
func newMemEnv(t testing.TB, pc link.PipeConfig, tc tgtConfig) *env {
	a, b := link.NewPipe(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), pc)
	e := newEnv(t, a, b, tc)
	e.iniLink, e.tgLink = a, b
	return e
}

// newUDPEnv is the same over UDP on loopback.
func newUDPEnv(t testing.TB, tc tgtConfig) *env {
	ctx := context.Background()
	la, err := link.ListenUDP(ctx, netip.MustParseAddrPort("127.0.0.1:0"), link.UDPOptions{})
	if err != nil {
		t.Skipf("UDP loopback unavailable: %v", err)
	}
	lb, err := link.ListenUDP(ctx, netip.MustParseAddrPort("127.0.0.1:0"), link.UDPOptions{})
	if err != nil {
		t.Skipf("UDP loopback unavailable: %v", err)
	}
	return newEnv(t, la, lb, tc)
}

// newEnv is an initiator on ini and a test target on tg.
func newEnv(t testing.TB, ini, tg link.Link, tc tgtConfig) *env {
	e := &env{t: t}
	e.tg = openDev(t, tg, "tgt")
	e.ini = openDev(t, ini, "ini")
	e.tgt = newTgt(t, e.tg, tc)
	e.dialer = &testDialer{local: e.ini.Addrs()[0], accept: e.tgt.accept, timeout: 14}
	e.log = testLogger(t)
	return e
}

func testLogger(t testing.TB) *zap.Logger {
	if testing.Verbose() {
		return zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	}
	return zap.NewNop()
}

func (e *env) config() Config { return testConfig(e.t, e.ini, e.dialer, 0x1, e.log) }

func (e *env) dial(cfg Config) *Session { e.t.Helper(); return dialSession(e.t, cfg) }

// testConfig is the session configuration the tests start from: 32 requests per channel,
// 256 KiB I/O, a quick reconnect and timeouts that a loaded machine meets.
func testConfig(t testing.TB, dev transport.Device, dialer Dialer, ext uint64, log *zap.Logger) Config {
	return Config{
		Name:            t.Name(),
		Device:          dev,
		Dialer:          dialer,
		TargetPortID:    testTargetPort,
		InitiatorExt:    ext,
		QueueDepth:      32,
		MaxIOSize:       256 << 10,
		ReconnectDelay:  20 * time.Millisecond,
		FastIOFailTmo:   30 * time.Second,
		DevLossTmo:      60 * time.Second,
		CommandTimeout:  10 * time.Second,
		TaskMgmtTimeout: 2 * time.Second,
		Logger:          log,
	}
}

// dialSession dials cfg (within 20 s) and closes the session when the test ends.
func dialSession(t testing.TB, cfg Config) *Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

func waitFor(t testing.TB, what string, d time.Duration, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var _ = errors.New
var _ = binary.BigEndian

func pipeNone() link.PipeConfig { return link.PipeConfig{} }
