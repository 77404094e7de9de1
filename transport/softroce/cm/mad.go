package cm

import (
	"encoding/binary"

	"github.com/srpd/srpd/transport/softroce/wire"
)

// MADLen is the size of every CM MAD (IB_MGMT_MAD_SIZE); HeaderLen the common MAD header
// (struct ib_mad_hdr) that precedes the CM body. All offsets in this package are absolute
// within the 256-byte MAD: the offsets of torvalds/linux:include/rdma/ibta_vol1_c12.h plus 24
// (CM_FIELD*_LOC add sizeof(struct ib_mad_hdr)).
const (
	MADLen    = wire.MADLen       // 256
	HeaderLen = wire.MADHeaderLen // 24
)

// CM attribute IDs (torvalds/linux:drivers/infiniband/core/cm_msgs.h CM_*_ATTR_ID).
const (
	AttrREQ     = wire.CMAttrREQ     // 0x0010
	AttrMRA     = wire.CMAttrMRA     // 0x0011
	AttrREJ     = wire.CMAttrREJ     // 0x0012
	AttrREP     = wire.CMAttrREP     // 0x0013
	AttrRTU     = wire.CMAttrRTU     // 0x0014
	AttrDREQ    = wire.CMAttrDREQ    // 0x0015
	AttrDREP    = wire.CMAttrDREP    // 0x0016
	AttrSIDRREQ = wire.CMAttrSIDRREQ // 0x0017
	AttrSIDRREP = wire.CMAttrSIDRREP // 0x0018
	AttrLAP     = wire.CMAttrLAP     // 0x0019
	AttrAPR     = wire.CMAttrAPR     // 0x001A
)

// Private-data sizes (torvalds/linux:include/rdma/ib_cm.h IB_CM_*_PRIVATE_DATA_SIZE).
const (
	REQPrivateDataSize     = 92
	MRAPrivateDataSize     = 222
	REJPrivateDataSize     = 148
	REPPrivateDataSize     = 196
	RTUPrivateDataSize     = 224
	DREQPrivateDataSize    = 220
	DREPPrivateDataSize    = 224
	LAPPrivateDataSize     = 168
	APRPrivateDataSize     = 148
	SIDRREQPrivateDataSize = 216
	SIDRREPPrivateDataSize = 136
	REJARILength           = 72 // IB_CM_REJ_ARI_LENGTH
)

// Message kinds named in the "message rejected" (REJ) and "message MRAed" (MRA) fields
// (torvalds/linux:drivers/infiniband/core/cm_msgs.h enum cm_msg_response).
const (
	MsgResponseREQ   = 0
	MsgResponseREP   = 1
	MsgResponseOther = 2
)

// AttrName returns the CM message name of an attribute ID ("REQ", "REP", ...), or "" if it is
// not a CM message.
func AttrName(attr uint16) string {
	switch attr {
	case AttrREQ:
		return "REQ"
	case AttrMRA:
		return "MRA"
	case AttrREJ:
		return "REJ"
	case AttrREP:
		return "REP"
	case AttrRTU:
		return "RTU"
	case AttrDREQ:
		return "DREQ"
	case AttrDREP:
		return "DREP"
	case AttrSIDRREQ:
		return "SIDR_REQ"
	case AttrSIDRREP:
		return "SIDR_REP"
	case AttrLAP:
		return "LAP"
	case AttrAPR:
		return "APR"
	}
	return ""
}

// Check validates the common MAD header of a CM MAD (torvalds/linux:include/rdma/ib_mad.h
// struct ib_mad_hdr: base version 1, class 0x07, class version 2, method SEND, status 0, a CM
// attribute ID) and returns a view of exactly its 256 bytes. It never panics.
func Check(b []byte) (wire.MAD, error) {
	if len(b) < MADLen {
		return nil, ErrTooShort
	}
	m := wire.MAD(b[:MADLen:MADLen])
	switch {
	case m.BaseVersion() != wire.MADBaseVersion:
		return nil, ErrBaseVersion
	case m.MgmtClass() != wire.MgmtClassCM:
		return nil, ErrNotCM
	case m.ClassVersion() != wire.CMClassVersion:
		return nil, ErrClassVersion
	case m.Method() != wire.MADMethodSend:
		return nil, ErrMethod
	case m.Status() != 0:
		return nil, ErrStatus
	case AttrName(m.AttributeID()) == "":
		return nil, ErrUnknownAttribute
	}
	return m, nil
}

// InitMAD writes the common header of a CM message into b[0:24] the way cm.c
// cm_format_mad_hdr does (base version 1, class CM, class version 2, method SEND, status 0,
// the given attribute ID and transaction ID, attribute modifier 0) and zeroes the CM body
// b[24:256]. b must hold at least 256 bytes; it returns b[:256].
func InitMAD(b []byte, attr uint16, tid uint64) []byte {
	b = b[:MADLen]
	clear(b)
	wire.MAD(b).Encode(&wire.MADFields{
		BaseVersion:   wire.MADBaseVersion,
		MgmtClass:     wire.MgmtClassCM,
		ClassVersion:  wire.CMClassVersion,
		Method:        wire.MADMethodSend,
		TransactionID: tid,
		AttributeID:   attr,
	})
	return b
}

func parseAs(b []byte, attr uint16) ([]byte, error) {
	m, err := Check(b)
	if err != nil {
		return nil, err
	}
	if m.AttributeID() != attr {
		return nil, ErrWrongAttribute
	}
	return m, nil
}

// Bit-field helpers. Bits are numbered as in the IBA tables: 7 is the MSB of a byte.

func get24(b []byte) uint32    { return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }
func put24(b []byte, v uint32) { b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v) }

// bits returns bits hi..lo of v (hi ≥ lo, 7 = MSB).
func getBits(v byte, hi, lo uint) uint8 { return (v >> lo) & (1<<(hi-lo+1) - 1) }

// setBits replaces bits hi..lo of *p with x (masked to the field width).
func setBits(p *byte, hi, lo uint, x uint8) {
	mask := byte(1<<(hi-lo+1)-1) << lo
	*p = *p&^mask | (x<<lo)&mask
}

func b2u(v bool) uint8 {
	if v {
		return 1
	}
	return 0
}

func be16(b []byte) uint16       { return binary.BigEndian.Uint16(b) }
func be32(b []byte) uint32       { return binary.BigEndian.Uint32(b) }
func be64(b []byte) uint64       { return binary.BigEndian.Uint64(b) }
func putBE16(b []byte, v uint16) { binary.BigEndian.PutUint16(b, v) }
func putBE32(b []byte, v uint32) { binary.BigEndian.PutUint32(b, v) }
func putBE64(b []byte, v uint64) { binary.BigEndian.PutUint64(b, v) }

// Steer returns what decides which queue of a multi-queue device handles mad (the payload of a
// UD SEND to QP1): for a REQ, the sender's QP number (byQPN), so that when both ends are
// multi-queue devices with as many queues, a connection's two QPs have the same queue index
// and its packets the same path through both; for a message of an existing connection (REP,
// RTU, REJ, MRA, DREQ, DREP, LAP, APR), its Remote Comm ID, which is one of our comm IDs and
// so in the residue class of the queue that made it (Config.CommIDMod). ok is false for
// anything else (SIDR, other classes, a malformed MAD), which queue 0 handles. Offsets:
// torvalds/linux:drivers/infiniband/core/cm_msgs.h (REQ local QPN at body offset 32, the
// remote comm ID at 4 in every connection message), plus the 24-byte MAD header.
func Steer(mad []byte) (key uint32, byQPN, ok bool) {
	b, err := Check(mad)
	if err != nil {
		return 0, false, false
	}
	switch b.AttributeID() {
	case AttrREQ:
		return REQ(b).LocalQPN(), true, true
	case AttrREP, AttrRTU, AttrREJ, AttrMRA, AttrDREQ, AttrDREP, AttrLAP, AttrAPR:
		return commIDs(b).RemoteCommID(), false, true
	}
	return 0, false, false
}
