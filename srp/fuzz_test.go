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

func addSeeds(f *testing.F, seeds ...[]byte) {
	for _, s := range seeds {
		f.Add(s)
		if len(s) > 0 {
			f.Add(s[:len(s)-1])
		}
	}
}

func FuzzDecodeLoginReq(f *testing.F) {
	addSeeds(f, kLoginReq, kLoginReqMulti)
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzbound.Run(t, func() {
			r, err := DecodeLoginReq(data)
			if err != nil {
				checkParseErr(t, err)
				return
			}
			var b [LoginReqLen]byte
			r.Encode(b[:])
			if r2, err := DecodeLoginReq(b[:]); err != nil || r2 != r {
				t.Errorf("%+v %v", r2, err)
				return
			}
		})
	})
}

func FuzzDecodeLoginReqRDMA(f *testing.F) {
	addSeeds(f, capLoginReqRDMA)
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzbound.Run(t, func() {
			r, err := DecodeLoginReqRDMA(data)
			if err != nil {
				checkParseErr(t, err)
				return
			}
			var b [LoginReqRDMALen]byte
			r.EncodeRDMA(b[:])
			if r2, err := DecodeLoginReqRDMA(b[:]); err != nil || r2 != r {
				t.Errorf("%+v %v", r2, err)
				return
			}
		})
	})
}

func FuzzParseLoginRsp(f *testing.F) {
	addSeeds(f, capLoginRsp, kLoginRspMaint)
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzbound.Run(t, func() {
			fuzzFixed(t, data, LoginRspLen, ParseLoginRsp, LoginRsp.Fields, LoginRsp.Encode)
		})
	})
}

func FuzzParseLoginRej(f *testing.F) {
	addSeeds(f, capLoginRej)
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzbound.Run(t, func() {
			fuzzFixed(t, data, LoginRejLen, ParseLoginRej, LoginRej.Fields, LoginRej.Encode)
		})
	})
}

func FuzzParseILogout(f *testing.F) {
	addSeeds(f, kILogout)
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzbound.Run(t, func() {
			fuzzFixed(t, data, ILogoutLen, ParseILogout, ILogout.Fields, ILogout.Encode)
		})
	})
}

func FuzzParseTLogout(f *testing.F) {
	addSeeds(f, kTLogout)
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzbound.Run(t, func() {
			fuzzFixed(t, data, TLogoutLen, ParseTLogout, TLogout.Fields, TLogout.Encode)
		})
	})
}

func FuzzParseTskMgmt(f *testing.F) {
	addSeeds(f, kTskAbort, kTskLUNReset)
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzbound.Run(t, func() {
			fuzzFixed(t, data, TskMgmtLen, ParseTskMgmt, TskMgmt.Fields, TskMgmt.Encode)
		})
	})
}

func FuzzParseCredReq(f *testing.F) {
	addSeeds(f, kCredReq)
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzbound.Run(t, func() {
			fuzzFixed(t, data, CredReqLen, ParseCredReq, CredReq.Fields, CredReq.Encode)
		})
	})
}

func FuzzParseCredRsp(f *testing.F) {
	addSeeds(f, kCredRsp)
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzbound.Run(t, func() {
			fuzzFixed(t, data, CredRspLen, ParseCredRsp, CredRsp.Fields, CredRsp.Encode)
		})
	})
}

func FuzzParseAerRsp(f *testing.F) {
	addSeeds(f, kAerRsp)
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzbound.Run(t, func() {
			fuzzFixed(t, data, AerRspLen, ParseAerRsp, AerRsp.Fields, AerRsp.Encode)
		})
	})
}

func FuzzParseAerReq(f *testing.F) {
	addSeeds(f, kAerReq)
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzbound.Run(t, func() {
			a, err := ParseAerReq(data)
			if err != nil {
				checkParseErr(t, err)
				return
			}
			fl := a.Fields()
			buf := make([]byte, len(a))
			n, err := AerReq(buf).Encode(&fl)
			if err != nil || n != len(a) {
				t.Errorf("encode %d %v", n, err)
				return
			}
			a2, err := ParseAerReq(buf)
			if err != nil {
				t.Error(err)
				return
			}
			if f2 := a2.Fields(); !eqAer(&f2, &fl) {
				t.Errorf("re-decoded %+v", f2)
				return
			}
		})
	})
}

func FuzzParseRsp(f *testing.F) {
	addSeeds(f, capRspGood, capRspDIUnder, capRspSense, kRspTM, kRspDOOver, kRspBoth)
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzbound.Run(t, func() {
			r, err := ParseRsp(data)
			if err != nil {
				checkParseErr(t, err)
				return
			}
			fl := r.Fields()
			r.TMResponse()
			buf := make([]byte, len(r))
			n, err := Rsp(buf).Encode(&fl, len(r))
			if err != nil || n != len(r) {
				t.Errorf("encode %d %v", n, err)
				return
			}
			r2, err := ParseRsp(buf)
			if err != nil {
				t.Error(err)
				return
			}
			f2 := r2.Fields()
			if !eqRsp(&f2, &fl) {
				t.Errorf("re-decoded %+v\nwant       %+v", f2, fl)
				return
			}
			buf3 := make([]byte, n)
			if Rsp(buf3).Encode(&f2, 0); !bytes.Equal(buf3, buf) {
				t.Errorf("re-encode differs")
				return
			}
		})
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
			c, err := ParseCmd(data, off)
			if err != nil {
				checkParseErr(t, err)
				return
			}
			fl := c.Fields(off)
			for _, d := range []DataBuf{fl.DataOut, fl.DataIn} {
				for i := 0; i < d.NumDescs(); i++ {
					_ = d.Desc(i)
				}
				_ = d.External()
				_ = d.DataLen()
			}
			buf := make([]byte, len(c))
			n, err := Cmd(buf).Encode(&fl)
			if err != nil || n != len(c) {
				t.Errorf("encode %d/%d %v", n, len(c), err)
				return
			}
			c2, err := ParseCmd(buf, off)
			if err != nil {
				t.Error(err)
				return
			}
			f2 := c2.Fields(off)
			if !eqCmd(&f2, &fl) {
				t.Errorf("re-decoded %+v\nwant       %+v", f2, fl)
				return
			}
			buf3 := make([]byte, n)
			if Cmd(buf3).Encode(&f2); !bytes.Equal(buf3, buf) {
				t.Errorf("re-encode differs")
				return
			}
		})
	})
}

func FuzzParseDescList(f *testing.F) {
	f.Add(kCmdIndirectIn[68:])
	f.Add(kCmdIndirectIn[67:])
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzbound.Run(t, func() {
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
	})
}
