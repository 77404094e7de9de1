package srp

import (
	"bytes"
	"errors"
	"testing"

	"github.com/srpd/srpd/internal/fuzzbound"
)

// Fuzz invariant for every decoder: no panic; a rejection is a *ParseError;
// anything that decodes re-encodes to bytes that decode to the same value,
// and re-encoding that value gives the same bytes again. Each input runs under fuzzbound.Run,
// on another goroutine, so the checks report with t.Errorf and return (never t.Fatal).

func checkParseErr(t *testing.T, err error) {
	t.Helper()
	var pe *ParseError
	if !errors.As(err, &pe) || errors.Unwrap(err) == nil {
		t.Errorf("error %v (%T) is not a *ParseError with a reason", err, err)
		return
	}
}

// fuzzFixed checks a fixed-size IU view: it is the first size bytes, and its fields encode
// (enc) to bytes that parse to the same fields.
func fuzzFixed[F comparable, V ~[]byte](t *testing.T, data []byte, size int,
	parse func([]byte) (V, error), fields func(V) F, enc func(V, *F) (int, error)) {
	v, err := parse(data)
	if err != nil {
		checkParseErr(t, err)
		return
	}
	if len(v) != size || !bytes.Equal(v, data[:size]) {
		t.Errorf("view %x", []byte(v))
		return
	}
	f := fields(v)
	buf := make([]byte, size)
	if n, err := enc(V(buf), &f); err != nil || n != size {
		t.Errorf("encode: %d %v", n, err)
		return
	}
	v2, err := parse(buf)
	if err != nil {
		t.Errorf("re-parse: %v", err)
		return
	}
	if f2 := fields(v2); f2 != f {
		t.Errorf("re-decoded %+v\nwant       %+v", f2, f)
		return
	}
}

// fuzzIU checks a variable-length IU view: its fields encode (enc, into a buffer of the view's
// length) to bytes that parse to fields eq to them, and encoding those fields again gives the
// same bytes.
func fuzzIU[F any, V ~[]byte](t *testing.T, data []byte,
	parse func([]byte) (V, error), fields func(V) F, enc func(V, *F) (int, error), eq func(a, b *F) bool) {
	v, err := parse(data)
	if err != nil {
		checkParseErr(t, err)
		return
	}
	fl := fields(v)
	buf := make([]byte, len(v))
	n, err := enc(V(buf), &fl)
	if err != nil || n != len(v) {
		t.Errorf("encode %d/%d %v", n, len(v), err)
		return
	}
	v2, err := parse(buf)
	if err != nil {
		t.Error(err)
		return
	}
	f2 := fields(v2)
	if !eq(&f2, &fl) {
		t.Errorf("re-decoded %+v\nwant       %+v", f2, fl)
		return
	}
	buf3 := make([]byte, n)
	if enc(V(buf3), &f2); !bytes.Equal(buf3, buf) {
		t.Errorf("re-encode differs")
		return
	}
}

// fuzzLogin checks a SRP_LOGIN_REQ decoder: what decodes encodes (enc, into size bytes) to
// bytes that decode to the same request.
func fuzzLogin(t *testing.T, data []byte, size int, decode func([]byte) (LoginReq, error), enc func(*LoginReq, []byte) (int, error)) {
	r, err := decode(data)
	if err != nil {
		checkParseErr(t, err)
		return
	}
	b := make([]byte, size)
	enc(&r, b)
	if r2, err := decode(b); err != nil || r2 != r {
		t.Errorf("%+v %v", r2, err)
		return
	}
}

// fuzzView is a fuzz target for a fixed-size view (fuzzFixed), seeded with seeds and each
// seed less its last byte.
func fuzzView[F comparable, V ~[]byte](f *testing.F, size int, parse func([]byte) (V, error), fields func(V) F,
	enc func(V, *F) (int, error), seeds ...[]byte) {
	addSeeds(f, seeds...)
	fuzzbound.Fuzz(f, func(t *testing.T, data []byte) { fuzzFixed(t, data, size, parse, fields, enc) })
}

// withByte returns a copy of b with byte i set to v (a seed carrying srpd's extension byte).
func withByte(b []byte, i int, v byte) []byte {
	c := append([]byte(nil), b...)
	c[i] = v
	return c
}

func addSeeds(f *testing.F, seeds ...[]byte) {
	for _, s := range seeds {
		f.Add(s)
		if len(s) > 0 {
			f.Add(s[:len(s)-1])
		}
	}
}

func FuzzDecodeLoginReq(f *testing.F) {
	addSeeds(f, kLoginReq, kLoginReqMulti, withByte(kLoginReq, lrqExt, byte(ExtRemoteInvalidate)))
	fuzzbound.Fuzz(f, func(t *testing.T, data []byte) {
		fuzzLogin(t, data, LoginReqLen, DecodeLoginReq, (*LoginReq).Encode)
	})
}

func FuzzDecodeLoginReqRDMA(f *testing.F) {
	addSeeds(f, capLoginReqRDMA, withByte(capLoginReqRDMA, lrrExt, byte(ExtRemoteInvalidate)))
	fuzzbound.Fuzz(f, func(t *testing.T, data []byte) {
		fuzzLogin(t, data, LoginReqRDMALen, DecodeLoginReqRDMA, (*LoginReq).EncodeRDMA)
	})
}

func FuzzParseLoginRsp(f *testing.F) {
	fuzzView(f, LoginRspLen, ParseLoginRsp, LoginRsp.Fields, LoginRsp.Encode, capLoginRsp, kLoginRspMaint,
		withByte(capLoginRsp, lrsExt, byte(ExtRemoteInvalidate)))
}

func FuzzParseLoginRej(f *testing.F) {
	fuzzView(f, LoginRejLen, ParseLoginRej, LoginRej.Fields, LoginRej.Encode, capLoginRej)
}

func FuzzParseILogout(f *testing.F) {
	fuzzView(f, ILogoutLen, ParseILogout, ILogout.Fields, ILogout.Encode, kILogout)
}

func FuzzParseTLogout(f *testing.F) {
	fuzzView(f, TLogoutLen, ParseTLogout, TLogout.Fields, TLogout.Encode, kTLogout)
}

func FuzzParseTskMgmt(f *testing.F) {
	fuzzView(f, TskMgmtLen, ParseTskMgmt, TskMgmt.Fields, TskMgmt.Encode, kTskAbort, kTskLUNReset)
}

func FuzzParseCredReq(f *testing.F) {
	fuzzView(f, CredReqLen, ParseCredReq, CredReq.Fields, CredReq.Encode, kCredReq)
}

func FuzzParseCredRsp(f *testing.F) {
	fuzzView(f, CredRspLen, ParseCredRsp, CredRsp.Fields, CredRsp.Encode, kCredRsp)
}

func FuzzParseAerRsp(f *testing.F) {
	fuzzView(f, AerRspLen, ParseAerRsp, AerRsp.Fields, AerRsp.Encode, kAerRsp)
}

func FuzzParseAerReq(f *testing.F) {
	addSeeds(f, kAerReq)
	fuzzbound.Fuzz(f, func(t *testing.T, data []byte) {
		fuzzIU(t, data, ParseAerReq, AerReq.Fields, AerReq.Encode, eqAer)
	})
}

func FuzzParseRsp(f *testing.F) {
	addSeeds(f, capRspGood, capRspDIUnder, capRspSense, kRspTM, kRspDOOver, kRspBoth)
	fuzzbound.Fuzz(f, func(t *testing.T, data []byte) {
		if r, err := ParseRsp(data); err == nil {
			r.TMResponse()
		}
		// The re-encode (of the fields parsed back) passed 0, no limit, as maxIULen, which is
		// the same as the buffer's length: the fields were parsed from that many bytes.
		fuzzIU(t, data, ParseRsp, Rsp.Fields, func(r Rsp, f *RspFields) (int, error) { return r.Encode(f, len(r)) }, eqRsp)
	})
}

func FuzzParseCmd(f *testing.F) {
	for _, s := range [][]byte{capCmdInquiry, capCmdTUR, capCmdReadCap16, capCmdRead10, capCmdWrite10,
		kCmdIndirectIn, kCmdIndirectExt, kCmdAddCDB, kCmdBidi} {
		f.Add(s, uint16(0))
		f.Add(s[:len(s)-1], uint16(0))
	}
	f.Add(kCmdImm, uint16(DefaultImmDataOffset))
	f.Add(kCmdImm, uint16(52))
	f.Add(kCmdImm[:75], uint16(DefaultImmDataOffset))
	f.Fuzz(func(t *testing.T, data []byte, immOff uint16) {
		fuzzbound.Run(t, func() {
			off := int(immOff)
			if c, err := ParseCmd(data, off); err == nil {
				fl := c.Fields(off)
				for _, d := range []DataBuf{fl.DataOut, fl.DataIn} {
					for i := 0; i < d.NumDescs(); i++ {
						_ = d.Desc(i)
					}
					_ = d.External()
					_ = d.DataLen()
				}
			}
			fuzzIU(t, data, func(b []byte) (Cmd, error) { return ParseCmd(b, off) },
				func(c Cmd) CmdFields { return c.Fields(off) }, Cmd.Encode, eqCmd)
		})
	})
}

func FuzzParseDescList(f *testing.F) {
	f.Add(kCmdIndirectIn[68:])
	f.Add(kCmdIndirectIn[67:])
	fuzzbound.Fuzz(f, func(t *testing.T, data []byte) {
		l, err := ParseDescList(data)
		if err != nil {
			checkParseErr(t, err)
			return
		}
		var b []byte
		for i := 0; i < l.Len(); i++ {
			b = l.At(i).Append(b)
		}
		if !bytes.Equal(b, data) {
			t.Error("descriptor list does not round trip")
			return
		}
	})
}
