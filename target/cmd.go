package target

import (
	"encoding/binary"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/frpool"
	"github.com/srpd/srpd/internal/cqpoll"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

var be = binary.BigEndian

// handleIU processes one received IU. It returns false if the IU needs a request context and
// none is free: the caller parks it (its receive buffer stays unposted) until one is.
//
// Bad IUs: an IU too short for its opcode is answered with SRP_T_LOGOUT "invalid IU length"
// (8); an opcode that is not an initiator-to-target IU with "invalid IU type" (2); an
// SRP_CRED_RSP or SRP_AER_RSP that answers nothing we sent with "unexpected response" (3). An
// SRP_CMD whose fixed part is there but whose descriptors are unusable is answered with CHECK
// CONDITION (INVALID FIELD IN COMMAND INFORMATION UNIT), like any failed command.
func (ch *channel) handleIU(slot int, b []byte) bool {
	op, err := srp.PeekOpcode(b)
	if err != nil {
		ch.protocolError(srp.TLogoutInvalidIULength, "empty IU")
		return true
	}
	switch op {
	case srp.OpCmd:
		return ch.handleCmd(slot, b)
	case srp.OpTskMgmt:
		return ch.handleTM(slot, b)
	case srp.OpILogout:
		if _, err := srp.ParseILogout(b); err != nil {
			ch.protocolError(srp.TLogoutInvalidIULength, err.Error())
			return true
		}
		ch.stats.ilogouts.Add(1)
		ch.startClose(nil, "initiator logout (SRP_I_LOGOUT)")
	case srp.OpCredRsp:
		r, err := srp.ParseCredRsp(b)
		if err != nil {
			ch.protocolError(srp.TLogoutInvalidIULength, err.Error())
			return true
		}
		if !ch.credReqOut || r.Tag() != ch.credTag {
			ch.protocolError(srp.TLogoutUnexpectedResponse, "SRP_CRED_RSP without SRP_CRED_REQ")
			return true
		}
		ch.credReqOut = false
		ch.repost(slot)
	case srp.OpAerRsp:
		ch.protocolError(srp.TLogoutUnexpectedResponse, "SRP_AER_RSP without SRP_AER_REQ")
	default:
		ch.protocolError(srp.TLogoutInvalidIUType, op.String())
	}
	return true
}

// handleCmd starts an SRP_CMD: credit, parse, checks, admission to the LUN's task set, then the
// descriptor tables and data-out.
func (ch *channel) handleCmd(slot int, b []byte) bool {
	if len(b) < srp.CmdHdrLen {
		ch.protocolError(srp.TLogoutInvalidIULength, "SRP_CMD shorter than 48 bytes")
		return true
	}
	if len(ch.free) == 0 {
		return false
	}
	// The fixed header is there (checked above), so its accessors are safe before ParseCmd
	// checks the descriptors: a command refused as unusable still gets its tag answered.
	hdr := srp.Cmd(b)
	c := ch.alloc(kCmd, slot)
	c.tag = hdr.Tag()
	c.solNot = hdr.SolNot()
	c.credit = true
	c.start = time.Now()
	ch.owed++
	ch.stats.commands.Add(1)
	if !ch.cr.consume() {
		// Overrun: answer at once, hold nothing.
		ch.stats.overruns.Add(1)
		ch.repost(c.slot)
		c.slot = -1
		ch.respondPre(c, scsi.StatusBusy, nil)
		return true
	}
	cmd, err := srp.ParseCmd(b, ch.immOff)
	if err != nil {
		ch.stats.badCmds.Add(1)
		ch.log.Debug("unusable SRP_CMD", zap.Stringer("tag", c.tag), zap.Error(err))
		ch.respondPre(c, scsi.StatusCheckCondition, &senseInvalidIUField)
		return true
	}
	if ch.tags[c.tag] != nil {
		ch.respondPre(c, scsi.StatusCheckCondition, &senseOverlapped)
		return true
	}
	ch.tags[c.tag] = c
	c.inTags = true
	c.lunAddr = scsi.LUNAddress(cmd.LUN())

	if s := ch.setupDesc(c, cmd.DataOut(), &c.out, &c.extOut, &c.outTotal); s != nil {
		ch.respondPre(c, scsi.StatusCheckCondition, s)
		return true
	}
	if s := ch.setupDesc(c, cmd.DataIn(), &c.in, &c.extIn, &c.inTotal); s != nil {
		ch.respondPre(c, scsi.StatusCheckCondition, s)
		return true
	}
	if cmd.DataOutFormat() == srp.DescImmediate {
		c.imm = cmd.ImmData(ch.immOff)
		ch.stats.immCmds.Add(1)
	}
	// The buffer lengths as the IU states them (residuals of a command refused before its
	// descriptors are resolved); afterTables recomputes them from the resolved lists.
	c.dOut, c.dIn = cmd.DataOut().DataLen(), cmd.DataIn().DataLen()

	c.cmd.CDB = cmd.CDB()
	c.cmd.LUN = c.lunAddr
	c.cmd.Nexus = ch.nexus
	c.cmd.Attr = scsi.TaskAttr(cmd.TaskAttr())
	c.cmd.Sense = c.sense[:]
	set := ch.view.set
	c.lun = set.Lookup(c.lunAddr)
	c.cmd.WriteProtected = ch.view.isReadOnly(c.lun)
	info, perr := set.Parse(&c.cmd) // Execute reuses this parse
	c.info, c.cdbErr = info, perr != nil
	if perr != nil {
		// refused escapes (errors.As takes its address): declared here, it costs an allocation
		// only for a CDB the parse refused, not for every command.
		var refused scsi.Sense
		if errors.As(perr, &refused) && refused.Key == scsi.DataProtect {
			// A write to a LUN this initiator's ACL maps read-only: answered at once, before
			// any data moves or the command enters the task set.
			ch.respondPre(c, scsi.StatusCheckCondition, &refused)
			return true
		}
	}
	if !c.cdbErr && uint64(info.Length) > uint64(ch.maxXfer) {
		ch.respondPre(c, scsi.StatusCheckCondition, &senseTooLong)
		return true
	}
	ch.queueFor(c.lun).admit(c, set)
	if c.extOut || c.extIn {
		ch.fetchTables(c)
		return true
	}
	ch.afterTables(c)
	return true
}

// setupDesc resolves the in-IU part of one data buffer description. It returns the sense data
// to fail the command with, or nil.
func (ch *channel) setupDesc(c *ioCtx, d srp.DataBuf, s *descSet, ext *bool, total *uint32) *scsi.Sense {
	switch d.Format {
	case srp.DescDirect:
		s.isDirect, s.direct = true, d.Direct
	case srp.DescIndirect:
		*total = d.Total
		if d.External() {
			if d.TableCount() > ch.maxDesc {
				return &senseNoResources
			}
			*ext = true
			return nil
		}
		if d.List.Len() > ch.maxDesc {
			return &senseNoResources
		}
		s.list = d.List
	}
	return nil
}

// fetchTables reads the external indirect descriptor tables from the initiator (RDMA READ into
// the context's table buffer through its RW context: data-out table first, then data-in).
func (ch *channel) fetchTables(c *ioCtx) {
	ch.stats.extTables.Add(1)
	off := 0
	c.remote = c.remote[:0]
	for _, d := range [2]struct {
		ext bool
		b   srp.DataBuf
	}{{c.extOut, c.dataBuf(true)}, {c.extIn, c.dataBuf(false)}} {
		if !d.ext {
			continue
		}
		c.remote = append(c.remote, frpool.RemoteSeg{Addr: d.b.Table.VA, RKey: d.b.Table.Key, Len: d.b.Table.Len})
		off += int(d.b.Table.Len)
	}
	ch.postRead(c, c.extAddr, uint32(off), csTables)
}

// postRead prepares the RDMA READ of c.remote into n bytes of local memory at addr and posts it
// (or queues it for send-queue room).
func (ch *channel) postRead(c *ioCtx, addr uint64, n uint32, next cstate) {
	c.local[0], c.nlocal = transport.SGE{Addr: addr, Length: n, LKey: ch.lkey}, 1
	c.withRW = false
	if !ch.prepareRW(c, frpool.RWRead, 0) { // cannot happen: sized for MaxDescriptors, MaxTransfer
		ch.failAdmitted(c, &senseNoResources)
		return
	}
	ch.postChain(c, next)
}

// dataBuf re-reads a data buffer description from the command IU still in the receive buffer.
func (c *ioCtx) dataBuf(out bool) srp.DataBuf {
	cmd := srp.Cmd(c.ch.recvBuf(c.slot))
	if out {
		return cmd.DataOut()
	}
	return cmd.DataIn()
}

// afterTables continues a command once all its descriptors are known: fetch data-out, or go
// straight to execution.
func (ch *channel) afterTables(c *ioCtx) {
	off := 0
	if c.extOut {
		n := int(c.dataBuf(true).Table.Len)
		c.out.list = srp.DescList(c.ext[off : off+n])
		off += n
		if c.out.list.TotalLen() != uint64(c.outTotal) {
			ch.failAdmitted(c, &senseInvalidIUField)
			return
		}
	}
	if c.extIn {
		n := int(c.dataBuf(false).Table.Len)
		c.in.list = srp.DescList(c.ext[off : off+n])
		if c.in.list.TotalLen() != uint64(c.inTotal) {
			ch.failAdmitted(c, &senseInvalidIUField)
			return
		}
	}
	if c.imm != nil {
		c.dOut = uint64(len(c.imm))
	} else {
		c.dOut = c.out.length()
	}
	c.dIn = c.in.length()
	if c.cdbErr || c.info.Dir != scsi.DirOut {
		ch.ready(c)
		return
	}
	c.xferOut = uint32(min(uint64(c.info.Length), c.dOut))
	if c.imm != nil {
		c.cmd.DataOut = c.imm[:c.xferOut]
		ch.stats.bytesOut.Add(uint64(c.xferOut))
		ch.ready(c)
		return
	}
	c.cmd.DataOut = c.data[:c.xferOut]
	if c.xferOut == 0 {
		ch.ready(c)
		return
	}
	c.remote = c.out.segments(c.remote[:0], c.xferOut)
	ch.postRead(c, c.dataAddr, c.xferOut, csFetch)
}

// failAdmitted answers an admitted command with CHECK CONDITION without executing it.
func (ch *channel) failAdmitted(c *ioCtx, s *scsi.Sense) {
	c.lq.withdraw(c)
	if c.aborted.Load() {
		ch.drop(c)
		return
	}
	ch.respondPre(c, scsi.StatusCheckCondition, s)
}

// ready hands a command whose data is present to its LUN queue, which queues it for a worker
// or has it executed here and now (fast LUNs, see lunQueue). Data-in goes straight into the
// request slot's data buffer, in the registered memory the RDMA WRITEs send from.
func (ch *channel) ready(c *ioCtx) {
	c.cmd.DataInViews = nil
	if !c.cdbErr && c.info.Dir == scsi.DirIn {
		c.cmd.DataIn = c.data[:c.info.Length]
		if ch.hostSGE {
			c.cmd.DataInViews = c.views[:0]
		}
	}
	c.state = csExec
	switch c.lq.ready(c) {
	case readyAborted:
		ch.drop(c)
	case readyInline:
		c.lq.execInline(c)
	}
}

// respondPre answers a command the target refuses itself (no execution, no data transfer).
func (ch *channel) respondPre(c *ioCtx, st scsi.Status, s *scsi.Sense) {
	c.hasPre, c.pre = true, st
	if s != nil {
		c.preSns = *s
	} else {
		c.preSns = scsi.Sense{}
	}
	if c.lq != nil { // admitted: not any more
		c.lq.withdraw(c)
	}
	ch.respondCmd(c)
}

// respondCmd sends the SRP_RSP of a command, after the RDMA WRITEs of its data-in (the
// context's RW context, PostRW with the SEND chained), as one all-or-nothing chain of which
// only the SEND is signaled (as ib_srpt posts it). The receive buffer goes back to the receive
// queue first, so that the credit the response returns always finds a buffer.
func (ch *channel) respondCmd(c *ioCtx) {
	var st scsi.Status
	var sense []byte
	dir, produced := c.info.Dir, 0
	if c.hasPre {
		st = c.pre
		if c.preSns.Key != scsi.NoSense {
			n := c.preSns.EncodeFixed(c.sense[:])
			sense = c.sense[:n]
		}
		dir = scsi.DirNone
	} else {
		st = c.res.Status
		sense = c.sense[:c.res.SenseLen]
		produced = c.res.DataInLen
		if c.cdbErr {
			dir = scsi.DirNone
		}
	}
	r := computeResiduals(dir, c.info.Length, produced, c.dOut, c.dIn)
	if dir == scsi.DirOut {
		r.xferOut = c.xferOut // what was fetched (equal unless the fetch was trimmed)
	}
	// The remote side of the data-in, before the receive buffer (which may hold the
	// descriptor list) goes back to the receive queue.
	c.withRW, c.nwr = r.xferIn > 0, 1
	if c.withRW {
		c.remote = c.in.segments(c.remote[:0], r.xferIn)
		ch.dataInSource(c, r.xferIn)
	}
	inv, invOK := uint32(0), false
	if ch.remInv {
		inv, invOK = c.invalidateKey()
	}
	if c.slot >= 0 {
		ch.repost(c.slot)
		c.slot = -1
	}
	if c.inTags {
		delete(ch.tags, c.tag)
		c.inTags = false
	}
	var delta int32
	if c.credit {
		delta = ch.returnCredit(c)
	}
	sol := solicited(st == scsi.StatusGood, c.solNot)
	n, err := srp.Rsp(c.rsp).Encode(&srp.RspFields{
		SolNot: sol, ReqLimDelta: delta, Tag: c.tag, Flags: r.flags, Status: uint8(st),
		DataOutResid: r.doResid, DataInResid: r.diResid, Sense: sense,
	}, ch.tiLen)
	if err != nil { // cannot happen: tiLen ≥ 64 and no response data
		ch.log.Error("encoding SRP_RSP", zap.Error(err))
		ch.release(c)
		return
	}
	if c.withRW {
		if !ch.prepareRW(c, frpool.RWWrite, 1) { // cannot happen: sized for MaxDescriptors, MaxTransfer
			ch.release(c)
			return
		}
		ch.stats.bytesIn.Add(uint64(r.xferIn))
	}
	ch.prepareSend(c, n, sol != 0)
	if invOK {
		c.sendWR[0].Opcode, c.sendWR[0].InvalidateRKey = transport.WRSendWithInv, inv
		ch.stats.remoteInv.Add(1)
	}
	if st != scsi.StatusGood {
		ch.stats.cmdErrors.Add(1)
	}
	ch.account(c, st, r.xferIn, r.xferOut)
	ch.postChain(c, csSend)
}

// dataInSource sets c.local to the n bytes of data-in: the backend's memory as it lies when
// the LUN lent it (Result.DataInViews) and the transfer stays within the request slot's own RW
// context (every piece an SGE of its own: views + remote descriptors - 1 at most; and as many
// work requests as without views), else the
// request slot's data buffer, into which lent views are then copied.
func (ch *channel) dataInSource(c *ioCtx, n uint32) {
	views := c.res.DataInViews
	c.res.DataInViews = nil
	if views != nil && !c.hasPre && len(views)+len(c.remote) <= ch.rwSGEs {
		k := 0
		for _, v := range views {
			if n == 0 {
				break
			}
			v = v[:min(uint32(len(v)), n)]
			c.local[k] = transport.SGE{Host: v, Length: uint32(len(v))}
			n -= uint32(len(v))
			k++
		}
		c.nlocal = k
		ch.stats.lentReads.Add(1)
		return
	}
	if views != nil && !c.hasPre {
		off := 0
		for _, v := range views {
			off += copy(c.data[off:], v)
		}
	}
	c.local[0], c.nlocal = transport.SGE{Addr: c.dataAddr, Length: n, LKey: ch.lkey}, 1
}

// invalidateKey returns the key the response may invalidate at the initiator (remote
// invalidation, SEND_WITH_INV): that of the command's one registration, when its data travels
// through a single direct descriptor of non-zero length and there is no other descriptor. The
// descriptor is the one the initiator named in this command, so the key is live there until the
// response (an initiator invalidates it only after the response, or after a reset or abort that
// this command then never answers).
func (c *ioCtx) invalidateKey() (uint32, bool) {
	in, out := c.in.count(), c.out.count()
	switch {
	case in == 1 && out == 0 && c.in.isDirect && c.in.direct.Len > 0:
		return c.in.direct.Key, true
	case out == 1 && in == 0 && c.out.isDirect && c.out.direct.Len > 0:
		return c.out.direct.Key, true
	}
	return 0, false
}

// prepareSend prepares the SEND of n bytes of c's response buffer, signaled: its completion
// ends the request (onRspWC).
func (ch *channel) prepareSend(c *ioCtx, n int, solicited bool) {
	c.sendSGE[0] = transport.SGE{Addr: c.rspAddr, Length: uint32(n), LKey: ch.lkey}
	fl := transport.SendSignaled
	if solicited {
		fl |= transport.SendSolicited
	}
	c.sendWR[0] = transport.SendWR{ID: cqpoll.WRID(kindRsp, uint32(c.idx)), Opcode: transport.WRSend, Flags: fl, SGL: c.sendSGE[:]}
}

// ---- task management ----

// handleTM runs an SRP_TSK_MGMT. Semantics (SAM-5 7, as ib_srpt/LIO implement them):
//
//   - ABORT TASK: the command with that tag on this channel and LUN is aborted. Not found
//     (already answered, or never seen): FUNCTION COMPLETE, as SAM requires.
//   - ABORT TASK SET: every command of this I_T nexus (all its channels) to the LUN.
//   - CLEAR TASK SET: every command to the LUN, from every nexus.
//   - LOGICAL UNIT RESET: like CLEAR TASK SET, then scsi LUN.Reset (unit attention for all).
//   - CLEAR ACA and unknown functions: FUNCTION NOT SUPPORTED (0x04).
//   - A LUN the view does not map: FUNCTION FAILED (0x05), as ib_srpt (LIO's
//     TMR_LUN_DOES_NOT_EXIST maps to it).
//
// Aborted commands get no SRP_RSP (SAM: an aborted task ends without status; ib_srpt does the
// same, LIO's TAS bit being 0); their credits go back with the next SRP_RSP of their channel,
// or with SRP_CRED_REQ if the channel would otherwise stay silent. The task management response
// is sent only once every aborted command has ended (its data transfers completed and its
// execution returned), so FUNCTION COMPLETE means the tasks are gone.
func (ch *channel) handleTM(slot int, b []byte) bool {
	tm, err := srp.ParseTskMgmt(b)
	if err != nil {
		ch.protocolError(srp.TLogoutInvalidIULength, err.Error())
		return true
	}
	if len(ch.free) == 0 {
		return false
	}
	c := ch.alloc(kTM, slot)
	c.tag = tm.Tag()
	c.solNot = tm.SolNot()
	c.tmFunc = tm.Func()
	c.lunAddr = scsi.LUNAddress(tm.LUN())
	taskTag := tm.TaskTag()
	c.credit = true
	ch.owed++
	ch.stats.taskMgmt.Add(1)
	ch.repost(c.slot)
	c.slot = -1
	if !ch.cr.consume() {
		ch.stats.overruns.Add(1)
		ch.respondTM(c, srp.TMFailed)
		return true
	}
	lun := ch.view.set.Lookup(c.lunAddr)
	c.lun = lun
	ch.log.Debug("task management", zap.Stringer("function", c.tmFunc), zap.Stringer("lun", c.lunAddr),
		zap.Stringer("task", taskTag))
	c.state = csTM
	c.tmWait.Store(1)
	c.tmCode = srp.TMSuccess
	n := 0
	switch c.tmFunc {
	case srp.TMAbortTask:
		if t := ch.tags[taskTag]; t != nil && t.kind == kCmd && t.lunAddr == c.lunAddr && t.lq != nil {
			n = t.lq.abort(func(x *ioCtx) bool { return x == t }, c)
		}
	case srp.TMAbortTaskSet, srp.TMClearTaskSet, srp.TMLUNReset:
		if lun == nil {
			c.tmCode = srp.TMFailed
			break
		}
		q := ch.queueFor(lun)
		if c.tmFunc == srp.TMAbortTaskSet {
			sess := ch.sess
			n = q.abort(func(x *ioCtx) bool { return x.ch.sess == sess }, c)
		} else {
			n = q.abort(func(*ioCtx) bool { return true }, c)
		}
	default:
		c.tmCode = srp.TMFuncNotSupported
	}
	ch.stats.tmAborted.Add(uint64(n))
	c.tmRelease() // the guard; the response goes out when the last aborted command has ended
	return true
}

// finishTM completes a task management request whose aborted commands have all ended.
func (ch *channel) finishTM(c *ioCtx) {
	if c.tmFunc == srp.TMLUNReset && c.tmCode == srp.TMSuccess && c.lun != nil {
		if err := c.lun.Reset(); err != nil {
			ch.log.Warn("LUN reset", zap.Error(err))
			c.tmCode = srp.TMFailed
		}
		ch.stats.lunResets.Add(1)
	}
	if ch.st() != chLive {
		ch.drop(c)
		return
	}
	ch.respondTM(c, c.tmCode)
}

// returnCredit gives the credit c holds back with its response: the request limit delta that
// the response carries.
func (ch *channel) returnCredit(c *ioCtx) int32 {
	delta := ch.cr.respond()
	c.credit = false
	ch.owed--
	ch.publishCredits()
	return delta
}

// solicited is the SOLNT bit of a response: set when the request asked for a solicited
// notification of this outcome (SCSOLNT for success, UCSOLNT otherwise).
func solicited(success bool, asked srp.SolNot) srp.SolNot {
	if (success && asked&srp.SCSOLNT != 0) || (!success && asked&srp.UCSOLNT != 0) {
		return srp.SOLNT
	}
	return 0
}

// respondTM sends the SRP_RSP of a task management request: RSPVALID with 4 bytes of response
// data, the code in byte 3 (always sent, success included).
func (ch *channel) respondTM(c *ioCtx, code srp.TMResponse) {
	delta := ch.returnCredit(c)
	sol := solicited(code == srp.TMSuccess, c.solNot)
	resp := [4]byte{3: byte(code)}
	n, _ := srp.Rsp(c.rsp).Encode(&srp.RspFields{SolNot: sol, ReqLimDelta: delta, Tag: c.tag, RespData: resp[:]}, ch.tiLen)
	if code != srp.TMSuccess {
		ch.stats.tmFailed.Add(1)
	}
	c.withRW, c.nwr = false, 1
	ch.prepareSend(c, n, sol != 0)
	ch.postChain(c, csSend)
}
