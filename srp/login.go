package srp

// LoginReq is SRP_LOGIN_REQ. It has two wire forms with the same content:
// the 64-byte struct srp_login_req (IB CM private data, and the form the
// spec defines) and Linux's 56-byte struct srp_login_req_rdma, which drops
// the reserved bytes so that it fits the 56 bytes of RDMA CM REQ private
// data left after the RDMA CM header (torvalds/linux:include/scsi/srp.h).
type LoginReq struct {
	Tag             Tag
	ReqITIULen      uint32     // REQUESTED MAX IT IU LEN
	BufFmt          BufFormats // REQUIRED BUFFER FORMATS
	Flags           LoginFlags
	ImmDataOffset   uint16 // SRP-2; meaningful when Flags has ImmedRequested
	InitiatorPortID PortID
	TargetPortID    PortID
	Ext             Ext // srpd's extensions (a reserved byte; zero from other initiators)
}

// MultiChannel returns the MULTI-CHANNEL ACTION (MultiChanSingle or
// MultiChanMulti; 2 and 3 are reserved).
func (r *LoginReq) MultiChannel() LoginFlags { return r.Flags & MultiChanMask }

// Offsets in struct srp_login_req (torvalds/linux:include/scsi/srp.h).
const (
	lrqTag       = 8
	lrqITIULen   = 16
	lrqBufFmt    = 24
	lrqFlags     = 26
	lrqExt       = 27 // reserved in SRP; srpd's Ext
	lrqImmOff    = 28
	lrqInitiator = 32
	lrqTarget    = 48
)

// Offsets in struct srp_login_req_rdma.
const (
	lrrTag       = 0
	lrrBufFmt    = 8
	lrrFlags     = 10
	lrrOpcode    = 11
	lrrITIULen   = 12
	lrrInitiator = 16
	lrrTarget    = 32
	lrrImmOff    = 48
	lrrExt       = 50 // the first reserved byte; srpd's Ext
)

// DecodeLoginReq decodes the 64-byte form. Longer buffers are accepted
// (the rest is ignored).
func DecodeLoginReq(b []byte) (LoginReq, error) {
	var r LoginReq
	if err := checkFixed(b, OpLoginReq, LoginReqLen); err != nil {
		return r, err
	}
	copy(r.Tag[:], b[lrqTag:])
	r.ReqITIULen = be.Uint32(b[lrqITIULen:])
	r.BufFmt = BufFormats(be.Uint16(b[lrqBufFmt:]))
	r.Flags = LoginFlags(b[lrqFlags])
	r.Ext = Ext(b[lrqExt])
	r.ImmDataOffset = be.Uint16(b[lrqImmOff:])
	copy(r.InitiatorPortID[:], b[lrqInitiator:])
	copy(r.TargetPortID[:], b[lrqTarget:])
	return r, nil
}

// DecodeLoginReqRDMA decodes the 56-byte RDMA CM form (struct
// srp_login_req_rdma). Longer buffers are accepted, as ib_srpt does
// (it requires private_data_len >= 56).
func DecodeLoginReqRDMA(b []byte) (LoginReq, error) {
	var r LoginReq
	if len(b) < LoginReqRDMALen {
		return r, perr(OpLoginReq, "length", len(b), ErrTruncated)
	}
	if Opcode(b[lrrOpcode]) != OpLoginReq {
		return r, perr(OpLoginReq, "opcode", lrrOpcode, ErrBadOpcode)
	}
	copy(r.Tag[:], b[lrrTag:])
	r.BufFmt = BufFormats(be.Uint16(b[lrrBufFmt:]))
	r.Flags = LoginFlags(b[lrrFlags])
	r.ReqITIULen = be.Uint32(b[lrrITIULen:])
	copy(r.InitiatorPortID[:], b[lrrInitiator:])
	copy(r.TargetPortID[:], b[lrrTarget:])
	r.ImmDataOffset = be.Uint16(b[lrrImmOff:])
	r.Ext = Ext(b[lrrExt])
	return r, nil
}

// Encode writes the 64-byte form into b and returns LoginReqLen.
func (r *LoginReq) Encode(b []byte) (int, error) {
	if err := prepare(b, OpLoginReq, LoginReqLen); err != nil {
		return 0, err
	}
	copy(b[lrqTag:], r.Tag[:])
	be.PutUint32(b[lrqITIULen:], r.ReqITIULen)
	be.PutUint16(b[lrqBufFmt:], uint16(r.BufFmt))
	b[lrqFlags] = byte(r.Flags)
	b[lrqExt] = byte(r.Ext)
	be.PutUint16(b[lrqImmOff:], r.ImmDataOffset)
	copy(b[lrqInitiator:], r.InitiatorPortID[:])
	copy(b[lrqTarget:], r.TargetPortID[:])
	return LoginReqLen, nil
}

// EncodeRDMA writes the 56-byte RDMA CM form into b and returns
// LoginReqRDMALen.
func (r *LoginReq) EncodeRDMA(b []byte) (int, error) {
	if len(b) < LoginReqRDMALen {
		return 0, eerr(OpLoginReq, "buffer", ErrShortBuffer)
	}
	clear(b[:LoginReqRDMALen])
	copy(b[lrrTag:], r.Tag[:])
	be.PutUint16(b[lrrBufFmt:], uint16(r.BufFmt))
	b[lrrFlags] = byte(r.Flags)
	b[lrrOpcode] = byte(OpLoginReq)
	be.PutUint32(b[lrrITIULen:], r.ReqITIULen)
	copy(b[lrrInitiator:], r.InitiatorPortID[:])
	copy(b[lrrTarget:], r.TargetPortID[:])
	be.PutUint16(b[lrrImmOff:], r.ImmDataOffset)
	b[lrrExt] = byte(r.Ext)
	return LoginReqRDMALen, nil
}

// LoginRsp is a view of SRP_LOGIN_RSP (struct srp_login_rsp, 52 bytes,
// carried in CM REP private data).
type LoginRsp []byte

// LoginRspFields is the content of an SRP_LOGIN_RSP.
type LoginRspFields struct {
	ReqLimDelta int32 // REQUEST LIMIT DELTA: the initial credits
	Tag         Tag   // the LOGIN_REQ's tag
	MaxITIULen  uint32
	MaxTIIULen  uint32
	BufFmt      BufFormats // SUPPORTED BUFFER FORMATS
	Flags       LoginRspFlags
	Ext         Ext // srpd's extensions granted (a reserved byte; zero from other targets)
}

// ParseLoginRsp validates an SRP_LOGIN_RSP. Longer buffers (REP private
// data is 196 bytes) are accepted and the view is cut to 52 bytes.
func ParseLoginRsp(b []byte) (LoginRsp, error) {
	if err := checkFixed(b, OpLoginRsp, LoginRspLen); err != nil {
		return nil, err
	}
	return LoginRsp(b[:LoginRspLen]), nil
}

// ReqLimDelta returns the REQUEST LIMIT DELTA (initial credits).
func (r LoginRsp) ReqLimDelta() int32 { return int32(be.Uint32(r[4:])) }

// Tag returns the tag.
func (r LoginRsp) Tag() (t Tag) { copy(t[:], r[8:]); return }

// MaxITIULen returns MAX IT IU LEN: the largest IU the target accepts.
func (r LoginRsp) MaxITIULen() uint32 { return be.Uint32(r[16:]) }

// MaxTIIULen returns MAX TI IU LEN: the largest IU the target will send.
func (r LoginRsp) MaxTIIULen() uint32 { return be.Uint32(r[20:]) }

// BufFmt returns SUPPORTED BUFFER FORMATS.
func (r LoginRsp) BufFmt() BufFormats { return BufFormats(be.Uint16(r[24:])) }

// Flags returns RSP_FLAGS.
func (r LoginRsp) Flags() LoginRspFlags { return LoginRspFlags(r[26]) }

// Ext returns srpd's extensions the target granted (byte 27, reserved in SRP).
func (r LoginRsp) Ext() Ext { return Ext(r[lrsExt]) }

// lrsExt is the offset of Ext in SRP_LOGIN_RSP: the first of its reserved bytes 27-51.
const lrsExt = 27

// Fields returns the decoded content.
func (r LoginRsp) Fields() LoginRspFields {
	return LoginRspFields{
		ReqLimDelta: r.ReqLimDelta(),
		Tag:         r.Tag(),
		MaxITIULen:  r.MaxITIULen(),
		MaxTIIULen:  r.MaxTIIULen(),
		BufFmt:      r.BufFmt(),
		Flags:       r.Flags(),
		Ext:         r.Ext(),
	}
}

// Encode writes f into r and returns LoginRspLen.
func (r LoginRsp) Encode(f *LoginRspFields) (int, error) {
	if err := prepare(r, OpLoginRsp, LoginRspLen); err != nil {
		return 0, err
	}
	be.PutUint32(r[4:], uint32(f.ReqLimDelta))
	copy(r[8:], f.Tag[:])
	be.PutUint32(r[16:], f.MaxITIULen)
	be.PutUint32(r[20:], f.MaxTIIULen)
	be.PutUint16(r[24:], uint16(f.BufFmt))
	r[26] = byte(f.Flags)
	r[lrsExt] = byte(f.Ext)
	return LoginRspLen, nil
}

// LoginRej is a view of SRP_LOGIN_REJ (struct srp_login_rej, 32 bytes,
// carried in CM REJ private data with the consumer-defined reject reason).
type LoginRej []byte

// LoginRejFields is the content of an SRP_LOGIN_REJ.
type LoginRejFields struct {
	Reason RejectReason
	Tag    Tag
	BufFmt BufFormats // SUPPORTED BUFFER FORMATS
}

// ParseLoginRej validates an SRP_LOGIN_REJ; longer buffers are accepted.
func ParseLoginRej(b []byte) (LoginRej, error) {
	if err := checkFixed(b, OpLoginRej, LoginRejLen); err != nil {
		return nil, err
	}
	return LoginRej(b[:LoginRejLen]), nil
}

// Reason returns the REASON field.
func (r LoginRej) Reason() RejectReason { return RejectReason(be.Uint32(r[4:])) }

// Tag returns the tag.
func (r LoginRej) Tag() (t Tag) { copy(t[:], r[8:]); return }

// BufFmt returns SUPPORTED BUFFER FORMATS.
func (r LoginRej) BufFmt() BufFormats { return BufFormats(be.Uint16(r[24:])) }

// Fields returns the decoded content.
func (r LoginRej) Fields() LoginRejFields {
	return LoginRejFields{Reason: r.Reason(), Tag: r.Tag(), BufFmt: r.BufFmt()}
}

// Encode writes f into r and returns LoginRejLen.
func (r LoginRej) Encode(f *LoginRejFields) (int, error) {
	if err := prepare(r, OpLoginRej, LoginRejLen); err != nil {
		return 0, err
	}
	be.PutUint32(r[4:], uint32(f.Reason))
	copy(r[8:], f.Tag[:])
	be.PutUint16(r[24:], uint16(f.BufFmt))
	return LoginRejLen, nil
}
