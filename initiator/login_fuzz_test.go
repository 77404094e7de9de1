package initiator

import (
	"errors"
	"testing"

	"github.com/srpd/srpd/internal/fuzzbound"
	"github.com/srpd/srpd/srp"
)

// FuzzCheckLoginRsp decodes a hostile target's SRP_LOGIN_RSP (the REP private data) against
// the login request we sent. Invariants: no panic; an error is ErrLogin; accepted parameters
// are usable: an IU length for our commands within what we asked and at least minITIULen,
// receive buffers within [RspHdrLen+4, maxTIIULen], at least one descriptor and no more than
// the request's IU and our registrations hold, immediate data only when both sides agreed and
// within the IU, and credits that are not negative.
func FuzzCheckLoginRsp(f *testing.F) {
	enc := func(fl srp.LoginRspFields) []byte {
		b := make([]byte, 196) // REP private data
		if _, err := srp.LoginRsp(b).Encode(&fl); err != nil {
			panic(err)
		}
		return b
	}
	tag := srp.Tag{1}
	both := srp.BufFormatDirect | srp.BufFormatIndirect
	for _, fl := range []srp.LoginRspFields{
		{ReqLimDelta: 32, Tag: tag, MaxITIULen: 8276, MaxTIIULen: 292, BufFmt: both, Flags: srp.ImmedSupported},
		{ReqLimDelta: -5, Tag: tag, MaxITIULen: 64, MaxTIIULen: 40, BufFmt: both},
		{ReqLimDelta: 0x7fffffff, Tag: tag, MaxITIULen: 0xffffffff, MaxTIIULen: 0xffffffff, BufFmt: both, Flags: srp.ImmedSupported},
		{ReqLimDelta: 1, Tag: tag, MaxITIULen: 63, MaxTIIULen: 39, BufFmt: srp.BufFormatIndirect},
		{ReqLimDelta: 1, Tag: srp.Tag{2}, MaxITIULen: 8276, MaxTIIULen: 292, BufFmt: both},
	} {
		f.Add(enc(fl), uint32(8276), uint8(3))
	}
	f.Add([]byte{byte(srp.OpLoginRsp)}, uint32(64), uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, reqIULen uint32, flags uint8) {
		fuzzbound.Run(t, func() {
			s := &Session{cfg: Config{MaxPagesPerMR: DefaultMaxPagesPerMR, CmdSGEntries: DefaultCmdSGEntries,
				MaxIOSize: DefaultMaxIOSize, MaxImmediateData: DefaultMaxImmediateData, DisableIndirect: flags&4 != 0}}
			req := srp.LoginReq{ReqITIULen: max(reqIULen, minITIULen), BufFmt: srp.BufFormatDirect, Tag: tag}
			if flags&1 != 0 {
				req.BufFmt |= srp.BufFormatIndirect
			}
			if flags&2 != 0 {
				req.Flags |= srp.ImmedRequested
			}
			p, err := s.checkLoginRsp(b, &req)
			if err != nil {
				if !errors.Is(err, ErrLogin) {
					t.Errorf("error %v is not ErrLogin", err)
				}
				return
			}
			switch {
			case p.txIULen < minITIULen || uint64(p.txIULen) > uint64(req.ReqITIULen):
				t.Errorf("MAX IT IU LEN %d for a request of %d", p.txIULen, req.ReqITIULen)
			case p.rxIULen < srp.RspHdrLen+4 || p.rxIULen > maxTIIULen:
				t.Errorf("MAX TI IU LEN %d", p.rxIULen)
			case p.maxDescs < 1 || p.maxDescs > s.maxRegs() ||
				p.maxDescs > 1 && srp.CmdHdrLen+srp.IndirectHdrLen+p.maxDescs*srp.DirectDescLen > p.txIULen:
				t.Errorf("%d descriptors in IUs of %d", p.maxDescs, p.txIULen)
			case p.maxImm < 0 || p.maxImm > 0 && (req.Flags&srp.ImmedRequested == 0 || srp.DefaultImmDataOffset+p.maxImm > p.txIULen):
				t.Errorf("%d bytes of immediate data in IUs of %d", p.maxImm, p.txIULen)
			case p.credits < 0:
				t.Errorf("%d credits", p.credits)
			}
		})
	})
}
