package srp

// SRP_RSP layout (struct srp_rsp in torvalds/linux:include/scsi/srp.h):
//
//	0  opcode  1 sol_not  2-3 reserved  4 req_lim_delta  8 tag
//	16-17 reserved  18 flags  19 status
//	20 data_out_res_cnt  24 data_in_res_cnt
//	28 sense_data_len    32 resp_data_len
//	36 response data (resp_data_len bytes), then sense data
//	   (ib_srp srp_process_rsp reads sense at data + resp_data_len).
const (
	rspSolNot   = 1
	rspReqLim   = 4
	rspTag      = 8
	rspFlags    = 18
	rspStatus   = 19
	rspDOResid  = 20
	rspDIResid  = 24
	rspSenseLen = 28
	rspRespLen  = 32
)

// Rsp is a view of SRP_RSP.
type Rsp []byte

// RspFields is the content of an SRP_RSP.
type RspFields struct {
	SolNot      SolNot
	ReqLimDelta int32 // credits returned (signed, as ib_srp adds it)
	Tag         Tag
	// Flags: on encode only the residual bits (ResidFlags) are taken;
	// RspValid and SnsValid are set from RespData and Sense. Fields
	// reports the residual bits, plus RspValid/SnsValid when the
	// corresponding data is non-empty.
	Flags        RspFlags
	Status       uint8 // SCSI status
	DataOutResid uint32
	DataInResid  uint32
	RespData     []byte // response data (task management: 4 bytes, code in byte 3)
	Sense        []byte // sense data
}

// ParseRsp validates an SRP_RSP and returns the view cut to 36 bytes plus
// the response and sense data.
//
// Rejected: a response or sense length whose valid bit is clear
// (ErrConflictingFlags), both overflow and underflow set for one direction
// (ErrConflictingFlags), lengths summing past 2^32-1 (ErrLengthOverflow),
// data past the end of b (ErrTruncated).
func ParseRsp(b []byte) (Rsp, error) {
	if err := checkFixed(b, OpRsp, RspHdrLen); err != nil {
		return nil, err
	}
	fl := RspFlags(b[rspFlags])
	if fl&(DOOver|DOUnder) == DOOver|DOUnder || fl&(DIOver|DIUnder) == DIOver|DIUnder {
		return nil, perr(OpRsp, "flags", rspFlags, ErrConflictingFlags)
	}
	rl := uint64(be.Uint32(b[rspRespLen:]))
	sl := uint64(be.Uint32(b[rspSenseLen:]))
	if rl != 0 && fl&RspValid == 0 {
		return nil, perr(OpRsp, "resp_data_len", rspRespLen, ErrConflictingFlags)
	}
	if sl != 0 && fl&SnsValid == 0 {
		return nil, perr(OpRsp, "sense_data_len", rspSenseLen, ErrConflictingFlags)
	}
	if RspHdrLen+rl+sl > maxU32 {
		return nil, perr(OpRsp, "sense_data_len", rspSenseLen, ErrLengthOverflow)
	}
	avail := uint64(len(b) - RspHdrLen)
	if rl > avail {
		return nil, perr(OpRsp, "resp_data_len", rspRespLen, ErrTruncated)
	}
	if rl+sl > avail {
		return nil, perr(OpRsp, "sense_data_len", rspSenseLen, ErrTruncated)
	}
	return Rsp(b[:RspHdrLen+int(rl+sl)]), nil
}

// SolNot returns the solicited-notification byte.
func (r Rsp) SolNot() SolNot { return SolNot(r[rspSolNot]) }

// ReqLimDelta returns the REQUEST LIMIT DELTA.
func (r Rsp) ReqLimDelta() int32 { return int32(be.Uint32(r[rspReqLim:])) }

// Tag returns the tag of the request being answered.
func (r Rsp) Tag() Tag { return getTag(r) }

// Flags returns the flags byte as received.
func (r Rsp) Flags() RspFlags { return RspFlags(r[rspFlags]) }

// Status returns the SCSI status.
func (r Rsp) Status() uint8 { return r[rspStatus] }

// DataOutResid returns the DATA-OUT RESIDUAL COUNT (valid with DOOver or
// DOUnder).
func (r Rsp) DataOutResid() uint32 { return be.Uint32(r[rspDOResid:]) }

// DataInResid returns the DATA-IN RESIDUAL COUNT (valid with DIOver or
// DIUnder).
func (r Rsp) DataInResid() uint32 { return be.Uint32(r[rspDIResid:]) }

// RespData returns the response data.
func (r Rsp) RespData() []byte {
	e := RspHdrLen + int(be.Uint32(r[rspRespLen:]))
	return r[RspHdrLen:e:e]
}

// Sense returns the sense data.
func (r Rsp) Sense() []byte {
	s := RspHdrLen + int(be.Uint32(r[rspRespLen:]))
	e := s + int(be.Uint32(r[rspSenseLen:]))
	return r[s:e:e]
}

// TMResponse returns the task management response code (byte 3 of the
// response data), if the response carries at least 4 bytes of it.
func (r Rsp) TMResponse() (TMResponse, bool) {
	d := r.RespData()
	if len(d) < 4 {
		return 0, false
	}
	return TMResponse(d[3]), true
}

// Fields returns the decoded content; RespData and Sense alias r.
func (r Rsp) Fields() RspFields {
	f := RspFields{
		SolNot:       r.SolNot(),
		ReqLimDelta:  r.ReqLimDelta(),
		Tag:          r.Tag(),
		Flags:        r.Flags() & ResidFlags,
		Status:       r.Status(),
		DataOutResid: r.DataOutResid(),
		DataInResid:  r.DataInResid(),
		RespData:     r.RespData(),
		Sense:        r.Sense(),
	}
	if len(f.RespData) > 0 {
		f.Flags |= RspValid
	}
	if len(f.Sense) > 0 {
		f.Flags |= SnsValid
	}
	return f
}

// Encode writes f into r and returns the IU length. maxIULen is the
// peer's maximum target-to-initiator IU length (LOGIN_RSP MAX TI IU LEN);
// sense data that would not fit is truncated, as ib_srpt truncates it to
// max_ti_iu_len - 36. maxIULen <= 0 means no limit. Response data is never
// truncated: if it does not fit, Encode fails with ErrShortBuffer.
func (r Rsp) Encode(f *RspFields, maxIULen int) (int, error) {
	fl := f.Flags & ResidFlags
	if fl&(DOOver|DOUnder) == DOOver|DOUnder || fl&(DIOver|DIUnder) == DIOver|DIUnder {
		return 0, eerr(OpRsp, "flags", ErrConflictingFlags)
	}
	limit := uint64(maxU32)
	if maxIULen > 0 && uint64(maxIULen) < limit {
		limit = uint64(maxIULen)
	}
	rl, sl := uint64(len(f.RespData)), uint64(len(f.Sense))
	if RspHdrLen+rl > limit {
		return 0, eerr(OpRsp, "resp_data", ErrShortBuffer)
	}
	if RspHdrLen+rl+sl > limit {
		sl = limit - RspHdrLen - rl
	}
	n := RspHdrLen + int(rl) + int(sl)
	if err := prepare(r, OpRsp, n); err != nil {
		return 0, err
	}
	if rl > 0 {
		fl |= RspValid
	}
	if sl > 0 {
		fl |= SnsValid
	}
	r[rspSolNot] = byte(f.SolNot)
	be.PutUint32(r[rspReqLim:], uint32(f.ReqLimDelta))
	copy(r[rspTag:], f.Tag[:])
	r[rspFlags] = byte(fl)
	r[rspStatus] = f.Status
	be.PutUint32(r[rspDOResid:], f.DataOutResid)
	be.PutUint32(r[rspDIResid:], f.DataInResid)
	be.PutUint32(r[rspSenseLen:], uint32(sl))
	be.PutUint32(r[rspRespLen:], uint32(rl))
	copy(r[RspHdrLen:], f.RespData)
	copy(r[RspHdrLen+int(rl):], f.Sense[:sl])
	return n, nil
}
