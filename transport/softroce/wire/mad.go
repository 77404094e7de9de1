package wire

import "encoding/binary"

// MAD is a view over a Management Datagram. On RoCEv2 a MAD travels as the 256-byte payload of a
// UD SEND_ONLY to QP1 (DETH Q_Key GSIQKey). This view covers the 24-byte common header
// (IBA 13.4.2; torvalds/linux:include/rdma/ib_mad.h struct ib_mad_hdr):
//
//	0 BaseVersion  1 MgmtClass  2 ClassVersion  3 Method(R bit 7)  4-5 Status
//	6-7 ClassSpecific  8-15 TransactionID  16-17 AttributeID  18-19 reserved
//	20-23 AttributeModifier
//
// The class-specific body (CM REQ/REP/...) follows at offset MADHeaderLen.
type MAD []byte

// MAD sizes.
const (
	MADHeaderLen = 24
	MADLen       = 256
)

// Management classes and methods used by the CM (torvalds/linux:include/rdma/ib_mad.h).
const (
	MgmtClassCM        = 0x07 // IB_MGMT_CLASS_CM
	MADBaseVersion     = 1    // IB_MGMT_BASE_VERSION
	CMClassVersion     = 2    // IB_CM_CLASS_VERSION
	MADMethodGet       = 0x01
	MADMethodSet       = 0x02
	MADMethodSend      = 0x03 // the only method the CM uses
	MADMethodGetResp   = 0x81
	MADMethodResponseR = 0x80 // response bit of Method
)

// CM attribute IDs (torvalds/linux:drivers/infiniband/core/cm_msgs.h / ib_cm.h CM_*_ATTR_ID).
const (
	CMAttrClassPortInfo = 0x0001
	CMAttrREQ           = 0x0010
	CMAttrMRA           = 0x0011
	CMAttrREJ           = 0x0012
	CMAttrREP           = 0x0013
	CMAttrRTU           = 0x0014
	CMAttrDREQ          = 0x0015
	CMAttrDREP          = 0x0016
	CMAttrSIDRREQ       = 0x0017
	CMAttrSIDRREP       = 0x0018
	CMAttrLAP           = 0x0019
	CMAttrAPR           = 0x001A
)

// MADFields holds the fields of the common MAD header.
type MADFields struct {
	BaseVersion       uint8
	MgmtClass         uint8
	ClassVersion      uint8
	Method            uint8
	Status            uint16
	ClassSpecific     uint16
	TransactionID     uint64
	AttributeID       uint16
	AttributeModifier uint32
}

// BaseVersion returns the MAD base version (1).
func (m MAD) BaseVersion() uint8 { return m[0] }

// MgmtClass returns the management class.
func (m MAD) MgmtClass() uint8 { return m[1] }

// ClassVersion returns the class version.
func (m MAD) ClassVersion() uint8 { return m[2] }

// Method returns the method byte (bit 7 is the response bit).
func (m MAD) Method() uint8 { return m[3] }

// Status returns the status field.
func (m MAD) Status() uint16 { return binary.BigEndian.Uint16(m[4:]) }

// ClassSpecific returns the class-specific field.
func (m MAD) ClassSpecific() uint16 { return binary.BigEndian.Uint16(m[6:]) }

// TransactionID returns the 64-bit transaction ID.
func (m MAD) TransactionID() uint64 { return binary.BigEndian.Uint64(m[8:]) }

// AttributeID returns the attribute ID.
func (m MAD) AttributeID() uint16 { return binary.BigEndian.Uint16(m[16:]) }

// AttributeModifier returns the attribute modifier.
func (m MAD) AttributeModifier() uint32 { return binary.BigEndian.Uint32(m[20:]) }

// Data returns the class-specific body after the common header.
func (m MAD) Data() []byte { return m[MADHeaderLen:] }

// SetTransactionID sets the transaction ID.
func (m MAD) SetTransactionID(t uint64) { binary.BigEndian.PutUint64(m[8:], t) }

// SetAttributeID sets the attribute ID.
func (m MAD) SetAttributeID(a uint16) { binary.BigEndian.PutUint16(m[16:], a) }

// SetAttributeModifier sets the attribute modifier.
func (m MAD) SetAttributeModifier(a uint32) { binary.BigEndian.PutUint32(m[20:], a) }

// SetStatus sets the status.
func (m MAD) SetStatus(s uint16) { binary.BigEndian.PutUint16(m[4:], s) }

// Encode writes the common header; the reserved bytes 18-19 are written as zero.
func (m MAD) Encode(f *MADFields) {
	_ = m[MADHeaderLen-1]
	m[0], m[1], m[2], m[3] = f.BaseVersion, f.MgmtClass, f.ClassVersion, f.Method
	binary.BigEndian.PutUint16(m[4:], f.Status)
	binary.BigEndian.PutUint16(m[6:], f.ClassSpecific)
	binary.BigEndian.PutUint64(m[8:], f.TransactionID)
	binary.BigEndian.PutUint16(m[16:], f.AttributeID)
	m[18], m[19] = 0, 0
	binary.BigEndian.PutUint32(m[20:], f.AttributeModifier)
}

// Fields decodes the common header.
func (m MAD) Fields() MADFields {
	return MADFields{
		BaseVersion: m.BaseVersion(), MgmtClass: m.MgmtClass(), ClassVersion: m.ClassVersion(),
		Method: m.Method(), Status: m.Status(), ClassSpecific: m.ClassSpecific(),
		TransactionID: m.TransactionID(), AttributeID: m.AttributeID(),
		AttributeModifier: m.AttributeModifier(),
	}
}

// ParseMAD returns a MAD view of b after checking that b holds at least the common header.
func ParseMAD(b []byte) (MAD, error) {
	if len(b) < MADHeaderLen {
		return nil, ErrMADTooShort
	}
	return MAD(b), nil
}

// LayoutMAD lays out in buf (capacity at least PacketLen(UDSendOnly, MADLen)) the packet that
// carries mad from one port's QP1 to another's, as rxe's QP1 sends it: a UD SEND_ONLY with the
// default P_Key, ACK requested, PSN psn, the GSI Q_Key and source QP1, and mad (MADLen bytes)
// as its payload. The caller sets nothing else; the ICRC is the link's.
func LayoutMAD(buf []byte, psn PSN, mad []byte) (Packet, error) {
	p, err := Layout(buf, UDSendOnly, MADLen)
	if err != nil {
		return p, err
	}
	b := p.BTH() // Layout wrote the opcode and P_Key
	b.SetDestQP(QPGSI)
	b.SetAckReq(true)
	b.SetPSN(psn)
	p.DETH().Encode(&DETHFields{QKey: GSIQKey, SrcQP: QPGSI})
	copy(p.Payload(), mad)
	return p, nil
}
