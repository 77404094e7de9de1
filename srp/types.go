package srp

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strings"
)

var be = binary.BigEndian

// Tag is the opaque 8-byte tag of an IU. Targets echo it byte for byte; it
// is never interpreted or byte-swapped (Linux ib_srp stores a host-order
// u64 in it).
type Tag [8]byte

// String returns the tag's bytes in hexadecimal, in wire order.
func (t Tag) String() string { return hex.EncodeToString(t[:]) }

// LUN is an 8-byte SAM logical unit number as carried on the wire.
type LUN [8]byte

// String returns the LUN's bytes in hexadecimal, in wire order.
func (l LUN) String() string { return hex.EncodeToString(l[:]) }

// PortID is a 16-byte SRP initiator or target port identifier. In the
// rev16a layout used by Linux, bytes 0-7 are the identifier extension
// (ib_srp's id_ext / initiator_ext) and bytes 8-15 the GUID (ioc_guid, or
// the port's interface ID).
type PortID [16]byte

// MakePortID builds a port identifier from its identifier extension and
// GUID halves.
func MakePortID(idExt, guid uint64) PortID {
	var p PortID
	be.PutUint64(p[:8], idExt)
	be.PutUint64(p[8:], guid)
	return p
}

// IDExt returns bytes 0-7 as a big-endian integer.
func (p PortID) IDExt() uint64 { return be.Uint64(p[:8]) }

// GUID returns bytes 8-15 as a big-endian integer.
func (p PortID) GUID() uint64 { return be.Uint64(p[8:]) }

// String formats the identifier as ib_srpt names initiator ports:
// "0x" followed by 32 hexadecimal digits (id_ext then GUID).
func (p PortID) String() string { return "0x" + hex.EncodeToString(p[:]) }

var errPortID = errors.New("srp: port identifier must be 32 hexadecimal digits")

// ParsePortID parses 32 hexadecimal digits with an optional "0x" prefix.
// Colons are ignored, so the %pI6-like form ib_srpt logs
// ("5054:00ff:fe77:0002:...") and GID-style notations are accepted too.
func ParsePortID(s string) (PortID, error) {
	var p PortID
	s = strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X")
	s = strings.ReplaceAll(s, ":", "")
	if len(s) != 2*len(p) {
		return p, errPortID
	}
	if _, err := hex.Decode(p[:], []byte(s)); err != nil {
		return p, errPortID
	}
	return p, nil
}

// DirectDesc is a direct data buffer descriptor, struct srp_direct_buf in
// torvalds/linux:include/scsi/srp.h: virtual address (8), memory key (4),
// length (4), all big-endian.
type DirectDesc struct {
	VA  uint64
	Key uint32
	Len uint32
}

func getDirect(b []byte) DirectDesc {
	_ = b[15]
	return DirectDesc{VA: be.Uint64(b), Key: be.Uint32(b[8:]), Len: be.Uint32(b[12:])}
}

// Put writes the 16-byte wire form into b, which must be at least 16 bytes.
func (d DirectDesc) Put(b []byte) {
	_ = b[15]
	be.PutUint64(b, d.VA)
	be.PutUint32(b[8:], d.Key)
	be.PutUint32(b[12:], d.Len)
}

// Append appends the 16-byte wire form to b.
func (d DirectDesc) Append(b []byte) []byte {
	b = be.AppendUint64(b, d.VA)
	b = be.AppendUint32(b, d.Key)
	return be.AppendUint32(b, d.Len)
}

// DescList is a view over a list of direct descriptors in wire form: the
// partial list inside an SRP_CMD, or an external indirect table fetched
// from the initiator. Its length is a multiple of 16.
type DescList []byte

// ParseDescList validates an external descriptor table (for instance one
// read from initiator memory with RDMA READ).
func ParseDescList(b []byte) (DescList, error) {
	if len(b)%DirectDescLen != 0 {
		return nil, perr(OpCmd, "desc_list", len(b)-len(b)%DirectDescLen, ErrTableLenMismatch)
	}
	return DescList(b), nil
}

// Len returns the number of descriptors.
func (l DescList) Len() int { return len(l) / DirectDescLen }

// At returns descriptor i.
func (l DescList) At(i int) DirectDesc { return getDirect(l[i*DirectDescLen:]) }

// Set writes descriptor i.
func (l DescList) Set(i int, d DirectDesc) { d.Put(l[i*DirectDescLen:]) }

// Prefix returns the first n descriptors.
func (l DescList) Prefix(n int) DescList { return l[:n*DirectDescLen] }

// TotalLen returns the sum of the descriptors' lengths.
func (l DescList) TotalLen() uint64 {
	var s uint64
	for i := 0; i+DirectDescLen <= len(l); i += DirectDescLen {
		s += uint64(be.Uint32(l[i+12:]))
	}
	return s
}
