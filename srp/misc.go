package srp

// This file holds the small fixed-size IUs (logout, credit and
// asynchronous-event IUs) and SRP_AER_REQ. Layouts: the structs of the same
// names in torvalds/linux:include/scsi/srp.h.

func getTag(b []byte) (t Tag) { copy(t[:], b[8:16]); return }

// ILogout is a view of SRP_I_LOGOUT (16 bytes): opcode, 7 reserved, tag.
type ILogout []byte

// ILogoutFields is the content of an SRP_I_LOGOUT.
type ILogoutFields struct {
	Tag Tag
}

// ParseILogout validates an SRP_I_LOGOUT.
func ParseILogout(b []byte) (ILogout, error) {
	if err := checkFixed(b, OpILogout, ILogoutLen); err != nil {
		return nil, err
	}
	return ILogout(b[:ILogoutLen]), nil
}

// Tag returns the tag.
func (l ILogout) Tag() Tag { return getTag(l) }

// Fields returns the decoded content.
func (l ILogout) Fields() ILogoutFields { return ILogoutFields{Tag: l.Tag()} }

// Encode writes f into l and returns ILogoutLen.
func (l ILogout) Encode(f *ILogoutFields) (int, error) {
	if err := prepare(l, OpILogout, ILogoutLen); err != nil {
		return 0, err
	}
	copy(l[8:], f.Tag[:])
	return ILogoutLen, nil
}

// TLogout is a view of SRP_T_LOGOUT (16 bytes): opcode, sol_not,
// 2 reserved, reason (4), tag.
type TLogout []byte

// TLogoutFields is the content of an SRP_T_LOGOUT.
type TLogoutFields struct {
	SolNot SolNot
	Reason TLogoutReason
	Tag    Tag
}

// ParseTLogout validates an SRP_T_LOGOUT.
func ParseTLogout(b []byte) (TLogout, error) {
	if err := checkFixed(b, OpTLogout, TLogoutLen); err != nil {
		return nil, err
	}
	return TLogout(b[:TLogoutLen]), nil
}

// SolNot returns the solicited-notification byte.
func (l TLogout) SolNot() SolNot { return SolNot(l[1]) }

// Reason returns the REASON field.
func (l TLogout) Reason() TLogoutReason { return TLogoutReason(be.Uint32(l[4:])) }

// Tag returns the tag.
func (l TLogout) Tag() Tag { return getTag(l) }

// Fields returns the decoded content.
func (l TLogout) Fields() TLogoutFields {
	return TLogoutFields{SolNot: l.SolNot(), Reason: l.Reason(), Tag: l.Tag()}
}

// Encode writes f into l and returns TLogoutLen.
func (l TLogout) Encode(f *TLogoutFields) (int, error) {
	if err := prepare(l, OpTLogout, TLogoutLen); err != nil {
		return 0, err
	}
	l[1] = byte(f.SolNot)
	be.PutUint32(l[4:], uint32(f.Reason))
	copy(l[8:], f.Tag[:])
	return TLogoutLen, nil
}

// CredReq is a view of SRP_CRED_REQ (16 bytes): opcode, sol_not,
// 2 reserved, REQUEST LIMIT DELTA (4), tag.
type CredReq []byte

// CredReqFields is the content of an SRP_CRED_REQ.
type CredReqFields struct {
	SolNot      SolNot
	ReqLimDelta int32
	Tag         Tag
}

// ParseCredReq validates an SRP_CRED_REQ.
func ParseCredReq(b []byte) (CredReq, error) {
	if err := checkFixed(b, OpCredReq, CredReqLen); err != nil {
		return nil, err
	}
	return CredReq(b[:CredReqLen]), nil
}

// SolNot returns the solicited-notification byte.
func (c CredReq) SolNot() SolNot { return SolNot(c[1]) }

// ReqLimDelta returns the REQUEST LIMIT DELTA (signed, as ib_srp reads it).
func (c CredReq) ReqLimDelta() int32 { return int32(be.Uint32(c[4:])) }

// Tag returns the tag.
func (c CredReq) Tag() Tag { return getTag(c) }

// Fields returns the decoded content.
func (c CredReq) Fields() CredReqFields {
	return CredReqFields{SolNot: c.SolNot(), ReqLimDelta: c.ReqLimDelta(), Tag: c.Tag()}
}

// Encode writes f into c and returns CredReqLen.
func (c CredReq) Encode(f *CredReqFields) (int, error) {
	if err := prepare(c, OpCredReq, CredReqLen); err != nil {
		return 0, err
	}
	c[1] = byte(f.SolNot)
	be.PutUint32(c[4:], uint32(f.ReqLimDelta))
	copy(c[8:], f.Tag[:])
	return CredReqLen, nil
}

// CredRsp is a view of SRP_CRED_RSP (16 bytes): opcode, 7 reserved, tag
// (a copy of the SRP_CRED_REQ's tag).
type CredRsp []byte

// CredRspFields is the content of an SRP_CRED_RSP.
type CredRspFields struct {
	Tag Tag
}

// ParseCredRsp validates an SRP_CRED_RSP.
func ParseCredRsp(b []byte) (CredRsp, error) {
	if err := checkFixed(b, OpCredRsp, CredRspLen); err != nil {
		return nil, err
	}
	return CredRsp(b[:CredRspLen]), nil
}

// Tag returns the tag.
func (c CredRsp) Tag() Tag { return getTag(c) }

// Fields returns the decoded content.
func (c CredRsp) Fields() CredRspFields { return CredRspFields{Tag: c.Tag()} }

// Encode writes f into c and returns CredRspLen.
func (c CredRsp) Encode(f *CredRspFields) (int, error) {
	if err := prepare(c, OpCredRsp, CredRspLen); err != nil {
		return 0, err
	}
	copy(c[8:], f.Tag[:])
	return CredRspLen, nil
}

// AerRsp is a view of SRP_AER_RSP (16 bytes): opcode, 7 reserved, tag (a
// copy of the SRP_AER_REQ's tag).
type AerRsp []byte

// AerRspFields is the content of an SRP_AER_RSP.
type AerRspFields struct {
	Tag Tag
}

// ParseAerRsp validates an SRP_AER_RSP.
func ParseAerRsp(b []byte) (AerRsp, error) {
	if err := checkFixed(b, OpAerRsp, AerRspLen); err != nil {
		return nil, err
	}
	return AerRsp(b[:AerRspLen]), nil
}

// Tag returns the tag.
func (a AerRsp) Tag() Tag { return getTag(a) }

// Fields returns the decoded content.
func (a AerRsp) Fields() AerRspFields { return AerRspFields{Tag: a.Tag()} }

// Encode writes f into a and returns AerRspLen.
func (a AerRsp) Encode(f *AerRspFields) (int, error) {
	if err := prepare(a, OpAerRsp, AerRspLen); err != nil {
		return 0, err
	}
	copy(a[8:], f.Tag[:])
	return AerRspLen, nil
}

// AerReq is a view of SRP_AER_REQ: a 36-byte header (opcode, sol_not,
// 2 reserved, REQUEST LIMIT DELTA @4, tag @8, 4 reserved, LUN @20,
// SENSE DATA LIST LENGTH @28, 4 reserved) followed by the sense data.
type AerReq []byte

// AerReqFields is the content of an SRP_AER_REQ.
type AerReqFields struct {
	SolNot      SolNot
	ReqLimDelta int32
	Tag         Tag
	LUN         LUN
	Sense       []byte // aliases the IU when decoded
}

const aerSenseLen = 28

// ParseAerReq validates an SRP_AER_REQ; the view is cut to 36 bytes plus
// the sense data.
func ParseAerReq(b []byte) (AerReq, error) {
	if err := checkFixed(b, OpAerReq, AerReqHdrLen); err != nil {
		return nil, err
	}
	sl := uint64(be.Uint32(b[aerSenseLen:]))
	if sl > uint64(len(b)-AerReqHdrLen) {
		return nil, perr(OpAerReq, "sense_data_len", aerSenseLen, ErrTruncated)
	}
	return AerReq(b[:AerReqHdrLen+int(sl)]), nil
}

// SolNot returns the solicited-notification byte.
func (a AerReq) SolNot() SolNot { return SolNot(a[1]) }

// ReqLimDelta returns the REQUEST LIMIT DELTA.
func (a AerReq) ReqLimDelta() int32 { return int32(be.Uint32(a[4:])) }

// Tag returns the tag.
func (a AerReq) Tag() Tag { return getTag(a) }

// LUN returns the logical unit the event concerns.
func (a AerReq) LUN() (l LUN) { copy(l[:], a[20:]); return }

// Sense returns the sense data.
func (a AerReq) Sense() []byte {
	n := int(be.Uint32(a[aerSenseLen:]))
	return a[AerReqHdrLen : AerReqHdrLen+n : AerReqHdrLen+n]
}

// Fields returns the decoded content; Sense aliases a.
func (a AerReq) Fields() AerReqFields {
	return AerReqFields{
		SolNot:      a.SolNot(),
		ReqLimDelta: a.ReqLimDelta(),
		Tag:         a.Tag(),
		LUN:         a.LUN(),
		Sense:       a.Sense(),
	}
}

// Encode writes f into a and returns the IU length (36 + len(f.Sense)).
func (a AerReq) Encode(f *AerReqFields) (int, error) {
	if uint64(len(f.Sense)) > maxU32-AerReqHdrLen {
		return 0, eerr(OpAerReq, "sense_data_len", ErrLengthOverflow)
	}
	n := AerReqHdrLen + len(f.Sense)
	if err := prepare(a, OpAerReq, n); err != nil {
		return 0, err
	}
	a[1] = byte(f.SolNot)
	be.PutUint32(a[4:], uint32(f.ReqLimDelta))
	copy(a[8:], f.Tag[:])
	copy(a[20:], f.LUN[:])
	be.PutUint32(a[aerSenseLen:], uint32(len(f.Sense)))
	copy(a[AerReqHdrLen:], f.Sense)
	return n, nil
}

const maxU32 = 1<<32 - 1

// TskMgmt is a view of SRP_TSK_MGMT (48 bytes): opcode, sol_not,
// 6 reserved, tag @8, 4 reserved, LUN @20, 2 reserved, function @30,
// 1 reserved, tag of the task to manage @32, 8 reserved.
type TskMgmt []byte

// TskMgmtFields is the content of an SRP_TSK_MGMT.
type TskMgmtFields struct {
	SolNot  SolNot
	Tag     Tag // of this request
	LUN     LUN
	Func    TaskMgmtFunc
	TaskTag Tag // TAG OF TASK TO BE MANAGED (ABORT TASK)
}

// ParseTskMgmt validates an SRP_TSK_MGMT.
func ParseTskMgmt(b []byte) (TskMgmt, error) {
	if err := checkFixed(b, OpTskMgmt, TskMgmtLen); err != nil {
		return nil, err
	}
	return TskMgmt(b[:TskMgmtLen]), nil
}

// SolNot returns the solicited-notification byte (SCSOLNT, UCSOLNT).
func (t TskMgmt) SolNot() SolNot { return SolNot(t[1]) }

// Tag returns the tag of the task management request.
func (t TskMgmt) Tag() Tag { return getTag(t) }

// LUN returns the LUN.
func (t TskMgmt) LUN() (l LUN) { copy(l[:], t[20:]); return }

// Func returns the TASK MANAGEMENT FUNCTION.
func (t TskMgmt) Func() TaskMgmtFunc { return TaskMgmtFunc(t[30]) }

// TaskTag returns the tag of the task to be managed.
func (t TskMgmt) TaskTag() (g Tag) { copy(g[:], t[32:]); return }

// Fields returns the decoded content.
func (t TskMgmt) Fields() TskMgmtFields {
	return TskMgmtFields{SolNot: t.SolNot(), Tag: t.Tag(), LUN: t.LUN(), Func: t.Func(), TaskTag: t.TaskTag()}
}

// Encode writes f into t and returns TskMgmtLen.
func (t TskMgmt) Encode(f *TskMgmtFields) (int, error) {
	if err := prepare(t, OpTskMgmt, TskMgmtLen); err != nil {
		return 0, err
	}
	t[1] = byte(f.SolNot)
	copy(t[8:], f.Tag[:])
	copy(t[20:], f.LUN[:])
	t[30] = byte(f.Func)
	copy(t[32:], f.TaskTag[:])
	return TskMgmtLen, nil
}
