package target

import (
	"net/netip"

	"github.com/srpd/srpd/srp"
)

// ConnInfo describes the connection a login arrives on.
type ConnInfo struct {
	// Local and Remote are the CM endpoints (informational, for logs).
	Local, Remote netip.AddrPort
	// InitiatorDepth is the number of RDMA READs the peer lets us keep outstanding (the CM
	// request's responder resources, as transport.ConnRequestInfo.InitiatorDepth reports it).
	// The target needs at least one: it fetches data-out with RDMA READ.
	InitiatorDepth uint8
	// DepthKnown tells whether InitiatorDepth comes from a CM request. Channels attached
	// without a CM (Target.Login with a QP connected out of band) leave it false.
	DepthKnown bool
}

// RejectCause is why a login was rejected, finer than the SRP reason (several causes share
// one reason code).
type RejectCause uint8

//go:generate go tool stringer -type=RejectCause -linecomment -output=rejectcause_string.go

// Reject causes. Their String (rejectcause_string.go) is each constant's line comment, which
// the daemon's metrics also use as label values (spaces as underscores): keep them stable.
const (
	CauseNone RejectCause = iota // none
	// the login request could not be decoded
	CauseMalformed // malformed login request
	// the target is closing
	CauseShuttingDown // target shutting down
	// REQUESTED MAX IT IU LEN < 64
	CauseITIUTooSmall // requested IT IU length below 64
	// REQUESTED MAX IT IU LEN > Limits.MaxITIULen
	CauseITIUTooLarge // requested IT IU length too large
	// TARGET PORT IDENTIFIER is not ours
	CauseTargetPortID // wrong target port identifier
	// REQUIRED BUFFER FORMATS has a format we do not offer
	CauseBufFormat // unsupported buffer format required
	// no ACL for the initiator port
	CauseNoACL // no ACL for initiator
	// MULTI to a nexus that has a channel, one channel allowed
	CauseMultiChannel // multiple channels not supported
	// the nexus has its maximum number of channels
	CauseChannelLimit // channel limit reached
	// the peer does not accept RDMA READs (responder resources 0)
	CauseNoRDMARead // peer accepts no RDMA READ
	// creating the channel failed
	CauseResources // insufficient channel resources
	// the target's or the budget's session bound is reached
	CauseSessionLimit // session limit reached
	// the channel's registered memory does not fit the budget
	CauseMemoryBudget // registered memory budget exhausted
	// the source's login rate or pending logins are over the bound
	CauseLoginRate // login rate limit of the source
)

// NumRejectCauses is the number of RejectCause values (CauseNone included).
const NumRejectCauses = int(CauseLoginRate) + 1

// LoginDecision is the outcome of a login request.
type LoginDecision struct {
	// Accepted tells whether the login is granted; Rsp or Rej holds the IU fields to send.
	Accepted bool
	Rsp      srp.LoginRspFields
	Rej      srp.LoginRejFields
	// Cause is the reason of a rejection (CauseNone when accepted).
	Cause RejectCause
	// memory is the registered memory reserved for the channel by admission; memNeed what it
	// asked for (also when the budget refused it).
	memory, memNeed int64
	// ACL is the name of the ACL (view) that admitted the initiator.
	ACL string
	// Terminate is the number of existing channels of the nexus a SINGLE login terminates.
	Terminate int
	// ImmDataOffset is the negotiated immediate-data offset, 0 when immediate data is not
	// granted.
	ImmDataOffset int
	// QueueDepth is the channel's credit and receive ring size.
	QueueDepth int

	view *view
}

// MaxITIULen and MaxTIIULen are the negotiated IU lengths.
func (d *LoginDecision) MaxITIULen() int { return int(d.Rsp.MaxITIULen) }
func (d *LoginDecision) MaxTIIULen() int { return int(d.Rsp.MaxTIIULen) }

// loginPolicy is what decideLogin needs from the target: a snapshot, no locks.
type loginPolicy struct {
	portID      srp.PortID
	lim         Limits
	acls        map[srp.PortID]*view
	defaultView *view
	closing     bool
}

// decideLogin is the login decision: a pure function of the target's policy, the request, the
// connection and the number of channels the I_T nexus has now.
//
// The checks follow ib_srpt's srpt_cm_req_recv order (IU length, then target port identifier,
// then ACL, then the multichannel action), with the buffer-format and RDMA READ checks that
// ib_srpt lacks:
//
//   - REQUESTED MAX IT IU LEN < 64 or > Limits.MaxITIULen: 0x00010002, as ib_srpt. A smaller
//     request is granted as asked (MAX IT IU LEN = min(requested, ours) = requested) and the
//     receive buffers are sized to it.
//   - TARGET PORT IDENTIFIER not ours: 0x00010003 ("unable to associate the channel with the
//     I_T nexus"), as ib_srpt.
//   - REQUIRED BUFFER FORMATS naming a format we do not offer: 0x00010004.
//   - No ACL for the initiator port: 0x00010006 "channel limit reached". The spec has no
//     "access denied" code; 0x00010000 ("no reason given") would be as defensible, but
//     torvalds/linux:drivers/infiniband/ulp/srpt/ib_srpt.c srpt_cm_req_recv answers a login
//     without a node ACL with SRP_LOGIN_REJ_CHANNEL_LIMIT_REACHED (or INSUFFICIENT_RESOURCES on
//     -ENOMEM) in every version since 2010, and our reference capture of a kernel target
//     (srp-login-rejected-no-acl.pcap) carries exactly 0x00010006. Tools and operators who know
//     ib_srpt read that code as "not allowed"; reading it as "zero channels allowed for this
//     initiator" is also literally true. Logs and LoginDecision.Cause tell it apart from a real
//     channel limit.
//   - MULTI to a nexus at its channel limit: 0x00010006; when the limit is 1, 0x00010005
//     ("multiple channels unsupported"). SINGLE terminates the existing channels and never hits
//     the limit.
//   - A CM request offering no responder resources: 0x00010001 (we need RDMA READ for
//     data-out).
func decideLogin(p *loginPolicy, req *srp.LoginReq, info ConnInfo, existing int) LoginDecision {
	d := LoginDecision{}
	rej := func(r srp.RejectReason, c RejectCause) LoginDecision {
		return LoginDecision{
			Rej:   srp.LoginRejFields{Reason: r, Tag: req.Tag, BufFmt: p.lim.BufFormats},
			Cause: c,
		}
	}
	if p.closing {
		return rej(srp.RejInsufficientResources, CauseShuttingDown)
	}
	if req.ReqITIULen < minITIULen {
		return rej(srp.RejITIULenTooLarge, CauseITIUTooSmall)
	}
	if req.ReqITIULen > p.lim.MaxITIULen {
		return rej(srp.RejITIULenTooLarge, CauseITIUTooLarge)
	}
	if req.TargetPortID != p.portID {
		return rej(srp.RejUnableAssociateChannel, CauseTargetPortID)
	}
	if req.BufFmt&^p.lim.BufFormats != 0 {
		return rej(srp.RejUnsupportedDescFormat, CauseBufFormat)
	}
	v := p.acls[req.InitiatorPortID]
	if v == nil {
		v = p.defaultView
	}
	if v == nil {
		return rej(srp.RejChannelLimitReached, CauseNoACL)
	}
	maxCh := p.lim.MaxChannels
	if v.maxChannels > 0 {
		maxCh = v.maxChannels
	}
	single := req.MultiChannel() == srp.MultiChanSingle
	if !single && existing >= maxCh {
		if maxCh == 1 {
			return rej(srp.RejMultiChannelUnsupported, CauseMultiChannel)
		}
		return rej(srp.RejChannelLimitReached, CauseChannelLimit)
	}
	if info.DepthKnown && info.InitiatorDepth == 0 {
		return rej(srp.RejInsufficientResources, CauseNoRDMARead)
	}

	d.Accepted = true
	d.view = v
	d.ACL = v.name
	d.QueueDepth = p.lim.QueueDepth
	d.Rsp = srp.LoginRspFields{
		ReqLimDelta: int32(p.lim.QueueDepth),
		Tag:         req.Tag,
		MaxITIULen:  min(req.ReqITIULen, p.lim.MaxITIULen),
		MaxTIIULen:  p.lim.MaxTIIULen,
		BufFmt:      p.lim.BufFormats,
	}
	switch {
	case existing == 0:
		d.Rsp.Flags = srp.MultiChanNoChan
	case single:
		d.Rsp.Flags = srp.MultiChanTerminated
		d.Terminate = existing
	default:
		d.Rsp.Flags = srp.MultiChanMaintained
	}
	if off, ok := grantImmediate(&p.lim, req); ok {
		d.Rsp.Flags |= srp.ImmedSupported
		d.ImmDataOffset = off
	}
	if !p.lim.DisableRemoteInvalidate {
		d.Rsp.Ext = req.Ext & srp.ExtRemoteInvalidate // only what the initiator offered
	}
	return d
}

// grantImmediate decides SRP-2 immediate data. It is granted when the initiator asks for it,
// the target allows it, the offset leaves room for the command header (ib_srpt: ≥ 48) and lies
// inside the IU, and the immediate data the initiator may then send (IU length − offset) is
// within Limits.MaxImmediateData. Otherwise the flag is simply not returned: the initiator
// then describes its data with descriptors (the flag is a hint, never a reason to reject).
func grantImmediate(l *Limits, req *srp.LoginReq) (int, bool) {
	if l.DisableImmediateData || req.Flags&srp.ImmedRequested == 0 {
		return 0, false
	}
	off := int(req.ImmDataOffset)
	itLen := int(req.ReqITIULen)
	if off < srp.CmdHdrLen || off >= itLen {
		return 0, false
	}
	if l.MaxImmediateData > 0 && itLen-off > l.MaxImmediateData {
		return 0, false
	}
	return off, true
}

// ParseLoginReq decodes the private data of a connection request: the 56-byte RDMA CM form
// (struct srp_login_req_rdma) or the 64-byte IB CM form (struct srp_login_req). RDMA CM REQ
// private data holds 56 bytes, so a shorter buffer can only be the RDMA CM form. A buffer of 64
// bytes or more is taken as the IB CM form when it looks like one (opcode 0 in byte 0 and the
// reserved bytes 1-7, 20-23 and 30-31 zero), else as the RDMA CM form.
func ParseLoginReq(b []byte) (srp.LoginReq, error) {
	if len(b) >= srp.LoginReqLen && isIBForm(b) {
		return srp.DecodeLoginReq(b)
	}
	return srp.DecodeLoginReqRDMA(b)
}

func isIBForm(b []byte) bool {
	if b[0] != byte(srp.OpLoginReq) {
		return false
	}
	for _, i := range [...]int{1, 2, 3, 4, 5, 6, 7, 20, 21, 22, 23, 30, 31} {
		if b[i] != 0 {
			return false
		}
	}
	return true
}
