package srp

// SRP_CMD layout (struct srp_cmd in torvalds/linux:include/scsi/srp.h):
//
//	0  opcode            1  sol_not        2-4 reserved
//	5  buf_fmt (data-out format << 4 | data-in format)
//	6  data_out_desc_cnt 7  data_in_desc_cnt
//	8  tag (8)           16 reserved (4)   20 LUN (8)
//	28 reserved          29 task_attr      30 reserved
//	31 add_cdb_len (bytes; low two bits reserved, ib_srpt masks them: & ~3)
//	32 CDB (16)
//	48 additional CDB (add_cdb_len & ~3 bytes), then the data-out
//	   descriptor, then the data-in descriptor
//	   (ib_srpt srpt_get_desc_buf; ib_srp srp_map_data).
//
// Descriptor sizes: direct 16 (struct srp_direct_buf); indirect 20 + 16 per
// descriptor carried in the IU (struct srp_indirect_buf: table descriptor,
// TOTAL LENGTH, partial list of data_*_desc_cnt descriptors); immediate 4
// (struct srp_imm_buf: length), with the data itself at the immediate-data
// offset negotiated at login.
const (
	cmdSolNot   = 1
	cmdBufFmt   = 5
	cmdOutCnt   = 6
	cmdInCnt    = 7
	cmdTag      = 8
	cmdLUN      = 20
	cmdTaskAttr = 29
	cmdAddCDB   = 31
	cmdCDB      = 32
)

// Cmd is a view of SRP_CMD.
type Cmd []byte

// DataBuf is the data-out or data-in buffer description of an SRP_CMD.
// Which fields are meaningful depends on Format.
type DataBuf struct {
	Format DescFormat
	// Direct is the data buffer (DescDirect).
	Direct DirectDesc
	// Table describes the complete descriptor table in initiator memory
	// (DescIndirect); Table.Len is 16 times the number of descriptors.
	Table DirectDesc
	// Total is TOTAL LENGTH, the sum of all descriptor lengths
	// (DescIndirect), or the length of the immediate data (DescImmediate).
	Total uint32
	// List is the partial (or complete) descriptor list carried in the IU
	// (DescIndirect). Decoded, it aliases the IU.
	List DescList
	// Imm is the immediate data (DescImmediate). Decoded by
	// Cmd.Fields, it aliases the IU. When encoding, a nil Imm writes only
	// the header up to the immediate-data offset, for callers that send
	// the data as further scatter/gather elements (as ib_srp does).
	Imm []byte
}

// External reports whether an indirect descriptor's table has descriptors
// that are not in the IU and must be fetched from initiator memory
// (RDMA READ of Table). ib_srpt does not support this and rejects such
// commands.
func (d DataBuf) External() bool {
	return d.Format == DescIndirect && d.List.Len() < d.TableCount()
}

// TableCount returns the number of descriptors in the complete indirect
// table (Table.Len / 16).
func (d DataBuf) TableCount() int { return int(d.Table.Len / DirectDescLen) }

// NumDescs returns the number of direct descriptors available in the IU: 1
// for a direct descriptor, the in-IU list length for an indirect one, 0
// otherwise.
func (d DataBuf) NumDescs() int {
	switch d.Format {
	case DescDirect:
		return 1
	case DescIndirect:
		return d.List.Len()
	}
	return 0
}

// Desc returns direct descriptor i of those counted by NumDescs.
func (d DataBuf) Desc(i int) DirectDesc {
	if d.Format == DescDirect {
		if i != 0 {
			panic("srp: DataBuf.Desc: index out of range")
		}
		return d.Direct
	}
	return d.List.At(i)
}

// DataLen returns the number of bytes the buffer describes.
func (d DataBuf) DataLen() uint64 {
	switch d.Format {
	case DescDirect:
		return uint64(d.Direct.Len)
	case DescIndirect, DescImmediate:
		return uint64(d.Total)
	}
	return 0
}

// CmdFields is the content of an SRP_CMD.
type CmdFields struct {
	SolNot   SolNot
	Tag      Tag
	LUN      LUN
	TaskAttr TaskAttr
	// CDB is the CDB including any additional CDB bytes. Decoded, it is
	// 16 + AddCDBLen bytes and aliases the IU. When encoding, up to
	// 16+MaxAddCDBLen bytes; it is zero-padded to 16 bytes and the
	// additional part to a multiple of 4.
	CDB     []byte
	DataOut DataBuf
	DataIn  DataBuf // DescImmediate is not allowed for data-in
	// ImmDataOffset is the immediate-data offset negotiated at login
	// (LoginReq.ImmDataOffset). It is used, and set by Fields, only when
	// DataOut.Format is DescImmediate.
	ImmDataOffset int
}

// ParseCmd validates an SRP_CMD. immDataOffset is the immediate-data offset
// negotiated at login, or 0 if immediate data was not negotiated (an
// immediate-data command is then rejected with ErrUnsupportedFormat). The
// view is cut to the end of the descriptors, or of the immediate data.
//
// Checks: header and additional CDB present; formats known and immediate
// only for data-out; each descriptor, and each indirect descriptor's in-IU
// list, inside the IU; an indirect table length that is a multiple of 16
// and holds at least the in-IU count; when the table is complete in the
// IU, TOTAL LENGTH equal to the sum of the descriptor lengths; immediate
// data that starts at or after the end of the descriptors, ends inside the
// IU and does not overflow 32 bits.
func ParseCmd(b []byte, immDataOffset int) (Cmd, error) {
	if err := checkFixed(b, OpCmd, CmdHdrLen); err != nil {
		return nil, err
	}
	off := CmdHdrLen + int(b[cmdAddCDB]&^3)
	if off > len(b) {
		return nil, perr(OpCmd, "add_cdb_len", cmdAddCDB, ErrTruncated)
	}
	out, in := DescFormat(b[cmdBufFmt]>>4), DescFormat(b[cmdBufFmt]&0xf)
	if out > DescImmediate {
		return nil, perr(OpCmd, "buf_fmt", cmdBufFmt, ErrUnsupportedFormat)
	}
	if in > DescIndirect {
		return nil, perr(OpCmd, "buf_fmt", cmdBufFmt, ErrUnsupportedFormat)
	}
	end, err := checkDesc(b, off, out, cmdOutCnt, "data_out_desc")
	if err != nil {
		return nil, err
	}
	end, err = checkDesc(b, end, in, cmdInCnt, "data_in_desc")
	if err != nil {
		return nil, err
	}
	if out == DescImmediate {
		if immDataOffset <= 0 {
			return nil, perr(OpCmd, "buf_fmt", cmdBufFmt, ErrUnsupportedFormat)
		}
		if immDataOffset < end || immDataOffset > len(b) {
			return nil, perr(OpCmd, "imm_data_offset", off, ErrImmOffset)
		}
		n := uint64(be.Uint32(b[off:]))
		if uint64(immDataOffset)+n > maxU32 {
			return nil, perr(OpCmd, "imm_buf.len", off, ErrLengthOverflow)
		}
		if n > uint64(len(b)-immDataOffset) {
			return nil, perr(OpCmd, "imm_buf.len", off, ErrTruncated)
		}
		end = immDataOffset + int(n)
	}
	return Cmd(b[:end]), nil
}

// checkDesc validates the descriptor of format f at off and returns the
// offset just past it. cntOff is the offset of its count byte.
func checkDesc(b []byte, off int, f DescFormat, cntOff int, field string) (int, error) {
	switch f {
	case DescDirect:
		if len(b)-off < DirectDescLen {
			return 0, perr(OpCmd, field, off, ErrDescriptorOverrun)
		}
		return off + DirectDescLen, nil
	case DescImmediate:
		if len(b)-off < ImmBufLen {
			return 0, perr(OpCmd, field, off, ErrDescriptorOverrun)
		}
		return off + ImmBufLen, nil
	case DescIndirect:
		if len(b)-off < IndirectHdrLen {
			return 0, perr(OpCmd, field, off, ErrDescriptorOverrun)
		}
		tlen := be.Uint32(b[off+12:])
		if tlen%DirectDescLen != 0 {
			return 0, perr(OpCmd, field+".table_desc.len", off+12, ErrTableLenMismatch)
		}
		cnt := int(b[cntOff])
		if uint32(cnt) > tlen/DirectDescLen {
			return 0, perr(OpCmd, field+"_cnt", cntOff, ErrTableLenMismatch)
		}
		list := off + IndirectHdrLen
		if cnt > (len(b)-list)/DirectDescLen {
			return 0, perr(OpCmd, field+"_cnt", cntOff, ErrDescriptorOverrun)
		}
		end := list + cnt*DirectDescLen
		if uint32(cnt) == tlen/DirectDescLen &&
			DescList(b[list:end]).TotalLen() != uint64(be.Uint32(b[off+16:])) {
			return 0, perr(OpCmd, field+".len", off+16, ErrTotalLenMismatch)
		}
		return end, nil
	}
	return off, nil
}

// descSize returns the in-IU size of a descriptor; b must be validated.
func descSize(f DescFormat, cnt byte) int {
	switch f {
	case DescDirect:
		return DirectDescLen
	case DescIndirect:
		return IndirectHdrLen + int(cnt)*DirectDescLen
	case DescImmediate:
		return ImmBufLen
	}
	return 0
}

// SolNot returns the solicited-notification byte (SCSOLNT, UCSOLNT).
func (c Cmd) SolNot() SolNot { return SolNot(c[cmdSolNot]) }

// DataOutFormat returns the data-out descriptor format (high nibble of
// buf_fmt).
func (c Cmd) DataOutFormat() DescFormat { return DescFormat(c[cmdBufFmt] >> 4) }

// DataInFormat returns the data-in descriptor format (low nibble).
func (c Cmd) DataInFormat() DescFormat { return DescFormat(c[cmdBufFmt] & 0xf) }

// Tag returns the tag.
func (c Cmd) Tag() Tag { return getTag(c) }

// LUN returns the LUN.
func (c Cmd) LUN() (l LUN) { copy(l[:], c[cmdLUN:]); return }

// TaskAttr returns the task attribute byte.
func (c Cmd) TaskAttr() TaskAttr { return TaskAttr(c[cmdTaskAttr]) }

// AddCDBLen returns the additional CDB length in bytes.
func (c Cmd) AddCDBLen() int { return int(c[cmdAddCDB] &^ 3) }

// CDB returns the CDB including the additional CDB bytes.
func (c Cmd) CDB() []byte {
	e := CmdHdrLen + c.AddCDBLen()
	return c[cmdCDB:e:e]
}

func (c Cmd) descOff() int { return CmdHdrLen + c.AddCDBLen() }

// DataOut returns the data-out buffer description. For DescImmediate, Imm
// is left nil; use ImmData.
func (c Cmd) DataOut() DataBuf {
	return c.dataBuf(c.descOff(), c.DataOutFormat(), c[cmdOutCnt])
}

// DataIn returns the data-in buffer description.
func (c Cmd) DataIn() DataBuf {
	off := c.descOff() + descSize(c.DataOutFormat(), c[cmdOutCnt])
	return c.dataBuf(off, c.DataInFormat(), c[cmdInCnt])
}

func (c Cmd) dataBuf(off int, f DescFormat, cnt byte) DataBuf {
	d := DataBuf{Format: f}
	switch f {
	case DescDirect:
		d.Direct = getDirect(c[off:])
	case DescIndirect:
		d.Table = getDirect(c[off:])
		d.Total = be.Uint32(c[off+16:])
		s := off + IndirectHdrLen
		e := s + int(cnt)*DirectDescLen
		d.List = DescList(c[s:e:e])
	case DescImmediate:
		d.Total = be.Uint32(c[off:])
	}
	return d
}

// ImmData returns the immediate data of a command whose data-out format is
// DescImmediate, given the offset negotiated at login (the one passed to
// ParseCmd); nil otherwise.
func (c Cmd) ImmData(immDataOffset int) []byte {
	if c.DataOutFormat() != DescImmediate {
		return nil
	}
	n := int(be.Uint32(c[c.descOff():]))
	e := immDataOffset + n
	return c[immDataOffset:e:e]
}

// Fields returns the decoded content; CDB, descriptor lists and immediate
// data alias c. immDataOffset must be the value passed to ParseCmd.
func (c Cmd) Fields(immDataOffset int) CmdFields {
	f := CmdFields{
		SolNot:   c.SolNot(),
		Tag:      c.Tag(),
		LUN:      c.LUN(),
		TaskAttr: c.TaskAttr(),
		CDB:      c.CDB(),
		DataOut:  c.DataOut(),
		DataIn:   c.DataIn(),
	}
	if f.DataOut.Format == DescImmediate {
		f.ImmDataOffset = immDataOffset
		f.DataOut.Imm = c.ImmData(immDataOffset)
	}
	return f
}

// encDescSize validates d for encoding and returns its in-IU size.
func encDescSize(d *DataBuf, field string) (int, error) {
	switch d.Format {
	case DescNone:
		return 0, nil
	case DescDirect:
		return DirectDescLen, nil
	case DescImmediate:
		if d.Imm != nil && uint64(len(d.Imm)) != uint64(d.Total) {
			return 0, eerr(OpCmd, field+".imm", ErrInvalidField)
		}
		return ImmBufLen, nil
	case DescIndirect:
		if len(d.List)%DirectDescLen != 0 || d.List.Len() > 255 {
			return 0, eerr(OpCmd, field+".list", ErrInvalidField)
		}
		if d.Table.Len%DirectDescLen != 0 || uint32(d.List.Len()) > d.Table.Len/DirectDescLen {
			return 0, eerr(OpCmd, field+".table", ErrTableLenMismatch)
		}
		if !d.External() && d.List.TotalLen() != uint64(d.Total) {
			return 0, eerr(OpCmd, field+".total", ErrTotalLenMismatch)
		}
		return IndirectHdrLen + len(d.List), nil
	}
	return 0, eerr(OpCmd, field+".format", ErrUnsupportedFormat)
}

// Encode writes f into c and returns the IU length. With immediate data the
// length runs to the end of the data, or, if DataOut.Imm is nil, to
// ImmDataOffset (the caller then sends DataOut.Total bytes of data after
// it). The bytes between the descriptors and the immediate-data offset are
// zeroed.
func (c Cmd) Encode(f *CmdFields) (int, error) {
	if len(f.CDB) > 16+MaxAddCDBLen {
		return 0, eerr(OpCmd, "cdb", ErrInvalidField)
	}
	add := 0
	if len(f.CDB) > 16 {
		add = (len(f.CDB) - 16 + 3) &^ 3
	}
	if f.DataIn.Format == DescImmediate {
		return 0, eerr(OpCmd, "data_in.format", ErrUnsupportedFormat)
	}
	outSize, err := encDescSize(&f.DataOut, "data_out")
	if err != nil {
		return 0, err
	}
	inSize, err := encDescSize(&f.DataIn, "data_in")
	if err != nil {
		return 0, err
	}
	off := CmdHdrLen + add
	end := off + outSize + inSize
	n := end
	if f.DataOut.Format == DescImmediate {
		if f.ImmDataOffset < end {
			return 0, eerr(OpCmd, "imm_data_offset", ErrImmOffset)
		}
		if uint64(f.ImmDataOffset)+uint64(f.DataOut.Total) > maxU32 {
			return 0, eerr(OpCmd, "data_out.total", ErrLengthOverflow)
		}
		n = f.ImmDataOffset
		if f.DataOut.Imm != nil {
			n += len(f.DataOut.Imm)
		}
	}
	if err := prepare(c, OpCmd, n); err != nil {
		return 0, err
	}
	c[cmdSolNot] = byte(f.SolNot)
	c[cmdBufFmt] = byte(f.DataOut.Format)<<4 | byte(f.DataIn.Format)
	if f.DataOut.Format == DescIndirect {
		c[cmdOutCnt] = byte(f.DataOut.List.Len())
	}
	if f.DataIn.Format == DescIndirect {
		c[cmdInCnt] = byte(f.DataIn.List.Len())
	}
	copy(c[cmdTag:], f.Tag[:])
	copy(c[cmdLUN:], f.LUN[:])
	c[cmdTaskAttr] = byte(f.TaskAttr)
	c[cmdAddCDB] = byte(add)
	copy(c[cmdCDB:], f.CDB)
	off = putDesc(c, off, &f.DataOut)
	putDesc(c, off, &f.DataIn)
	if f.DataOut.Format == DescImmediate && f.DataOut.Imm != nil {
		copy(c[f.ImmDataOffset:], f.DataOut.Imm)
	}
	return n, nil
}

func putDesc(c []byte, off int, d *DataBuf) int {
	switch d.Format {
	case DescDirect:
		d.Direct.Put(c[off:])
		return off + DirectDescLen
	case DescIndirect:
		d.Table.Put(c[off:])
		be.PutUint32(c[off+16:], d.Total)
		copy(c[off+IndirectHdrLen:], d.List)
		return off + IndirectHdrLen + len(d.List)
	case DescImmediate:
		be.PutUint32(c[off:], d.Total)
		return off + ImmBufLen
	}
	return off
}
