package srp

import (
	"bytes"
	"encoding/hex"
	"strings"
)

// h decodes hex, ignoring spaces, newlines, '|' and '_' (used to mark field
// boundaries in the vectors).
func h(s string) []byte {
	r := strings.NewReplacer(" ", "", "\n", "", "\t", "", "|", "", "_", "")
	b, err := hex.DecodeString(r.Replace(s))
	if err != nil {
		panic(err)
	}
	return b
}

func tagOf(s string) (t Tag) { copy(t[:], h(s)); return }

func lunOf(s string) (l LUN) { copy(l[:], h(s)); return }

func pid(s string) PortID {
	p, err := ParsePortID(s)
	if err != nil {
		panic(err)
	}
	return p
}

func eqDataBuf(a, b *DataBuf) bool {
	return a.Format == b.Format && a.Direct == b.Direct && a.Table == b.Table &&
		a.Total == b.Total && bytes.Equal(a.List, b.List) && bytes.Equal(a.Imm, b.Imm)
}

func eqCmd(a, b *CmdFields) bool {
	return a.SolNot == b.SolNot && a.Tag == b.Tag && a.LUN == b.LUN &&
		a.TaskAttr == b.TaskAttr && bytes.Equal(a.CDB, b.CDB) &&
		eqDataBuf(&a.DataOut, &b.DataOut) && eqDataBuf(&a.DataIn, &b.DataIn) &&
		a.ImmDataOffset == b.ImmDataOffset
}

func eqRsp(a, b *RspFields) bool {
	return a.SolNot == b.SolNot && a.ReqLimDelta == b.ReqLimDelta && a.Tag == b.Tag &&
		a.Flags == b.Flags && a.Status == b.Status && a.DataOutResid == b.DataOutResid &&
		a.DataInResid == b.DataInResid && bytes.Equal(a.RespData, b.RespData) &&
		bytes.Equal(a.Sense, b.Sense)
}

func eqAer(a, b *AerReqFields) bool {
	return a.SolNot == b.SolNot && a.ReqLimDelta == b.ReqLimDelta && a.Tag == b.Tag &&
		a.LUN == b.LUN && bytes.Equal(a.Sense, b.Sense)
}

// descs builds a DescList.
func descs(d ...DirectDesc) DescList {
	var b []byte
	for _, x := range d {
		b = x.Append(b)
	}
	return DescList(b)
}
