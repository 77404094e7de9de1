package cm

// Views over the CM messages other than REQ. Field locations are those of
// torvalds/linux:include/rdma/ibta_vol1_c12.h (IBA Tables 107-120) plus the 24-byte MAD header.

// REP is a view over a CM REP (IBA Table 110):
//
//	24 Local Comm ID   28 Remote Comm ID   32 Local Q_Key   36 Local QPN (24) | 39 vendor ID hi
//	40 Local EECN (24) | 43 vendor ID mid   44 Starting PSN (24) | 47 vendor ID lo
//	48 Responder Resources   49 Initiator Depth
//	50 Target ACK Delay (7-3) | Failover Accepted (2-1) | E2E Flow Control (0)
//	51 RNR Retry Count (7-5) | SRQ (4)   52 Local CA GUID (64)   60-255 private data (196)
type REP []byte

const (
	repLocalCommID  = 24
	repRemoteCommID = 28
	repLocalQKey    = 32
	repLocalQPN     = 36
	repVendorHi     = 39
	repLocalEECN    = 40
	repVendorMid    = 43
	repStartingPSN  = 44
	repVendorLo     = 47
	repRespRes      = 48
	repInitDepth    = 49
	repByte50       = 50
	repByte51       = 51
	repLocalCAGUID  = 52
	repPrivateData  = 60
)

// ParseREP checks that b is a CM REP MAD and returns a view of it.
func ParseREP(b []byte) (REP, error) { m, err := parseAs(b, AttrREP); return REP(m), err }

func (r REP) LocalCommID() uint32       { return be32(r[repLocalCommID:]) }
func (r REP) RemoteCommID() uint32      { return be32(r[repRemoteCommID:]) }
func (r REP) LocalQKey() uint32         { return be32(r[repLocalQKey:]) }
func (r REP) LocalQPN() uint32          { return get24(r[repLocalQPN:]) }
func (r REP) LocalEECN() uint32         { return get24(r[repLocalEECN:]) }
func (r REP) StartingPSN() uint32       { return get24(r[repStartingPSN:]) }
func (r REP) ResponderResources() uint8 { return r[repRespRes] }
func (r REP) InitiatorDepth() uint8     { return r[repInitDepth] }
func (r REP) TargetACKDelay() uint8     { return getBits(r[repByte50], 7, 3) }
func (r REP) FailoverAccepted() uint8   { return getBits(r[repByte50], 2, 1) }
func (r REP) EndToEndFlowControl() bool { return r[repByte50]&1 != 0 }
func (r REP) RNRRetryCount() uint8      { return getBits(r[repByte51], 7, 5) }
func (r REP) SRQ() bool                 { return r[repByte51]&0x10 != 0 }
func (r REP) LocalCAGUID() uint64       { return be64(r[repLocalCAGUID:]) }
func (r REP) PrivateData() []byte       { return r[repPrivateData:MADLen] }

// VendorID is the 24-bit ECE vendor ID spread over bytes 39, 43 and 47.
func (r REP) VendorID() uint32 {
	return uint32(r[repVendorHi])<<16 | uint32(r[repVendorMid])<<8 | uint32(r[repVendorLo])
}

func (r REP) SetLocalCommID(v uint32)       { putBE32(r[repLocalCommID:], v) }
func (r REP) SetRemoteCommID(v uint32)      { putBE32(r[repRemoteCommID:], v) }
func (r REP) SetLocalQKey(v uint32)         { putBE32(r[repLocalQKey:], v) }
func (r REP) SetLocalQPN(v uint32)          { put24(r[repLocalQPN:], v) }
func (r REP) SetLocalEECN(v uint32)         { put24(r[repLocalEECN:], v) }
func (r REP) SetStartingPSN(v uint32)       { put24(r[repStartingPSN:], v) }
func (r REP) SetResponderResources(v uint8) { r[repRespRes] = v }
func (r REP) SetInitiatorDepth(v uint8)     { r[repInitDepth] = v }
func (r REP) SetTargetACKDelay(v uint8)     { setBits(&r[repByte50], 7, 3, v) }
func (r REP) SetFailoverAccepted(v uint8)   { setBits(&r[repByte50], 2, 1, v) }
func (r REP) SetEndToEndFlowControl(v bool) { setBits(&r[repByte50], 0, 0, b2u(v)) }
func (r REP) SetRNRRetryCount(v uint8)      { setBits(&r[repByte51], 7, 5, v) }
func (r REP) SetSRQ(v bool)                 { setBits(&r[repByte51], 4, 4, b2u(v)) }
func (r REP) SetLocalCAGUID(v uint64)       { putBE64(r[repLocalCAGUID:], v) }

// SetVendorID writes the 24-bit ECE vendor ID into bytes 39, 43 and 47.
func (r REP) SetVendorID(v uint32) {
	r[repVendorHi], r[repVendorMid], r[repVendorLo] = byte(v>>16), byte(v>>8), byte(v)
}

// REPFields holds every field of a REP body.
type REPFields struct {
	LocalCommID, RemoteCommID uint32
	LocalQKey                 uint32
	LocalQPN                  uint32
	VendorID                  uint32
	LocalEECN                 uint32
	StartingPSN               uint32
	ResponderResources        uint8
	InitiatorDepth            uint8
	TargetACKDelay            uint8
	FailoverAccepted          uint8
	EndToEndFlowControl       bool
	RNRRetryCount             uint8
	SRQ                       bool
	LocalCAGUID               uint64
	PrivateData               [REPPrivateDataSize]byte
}

// Encode writes every body field (reserved bits zero); the header is not touched.
func (r REP) Encode(f *REPFields) {
	clear(r[HeaderLen:MADLen])
	r.SetLocalCommID(f.LocalCommID)
	r.SetRemoteCommID(f.RemoteCommID)
	r.SetLocalQKey(f.LocalQKey)
	r.SetLocalQPN(f.LocalQPN)
	r.SetLocalEECN(f.LocalEECN)
	r.SetStartingPSN(f.StartingPSN)
	r.SetVendorID(f.VendorID)
	r.SetResponderResources(f.ResponderResources)
	r.SetInitiatorDepth(f.InitiatorDepth)
	r.SetTargetACKDelay(f.TargetACKDelay)
	r.SetFailoverAccepted(f.FailoverAccepted)
	r.SetEndToEndFlowControl(f.EndToEndFlowControl)
	r.SetRNRRetryCount(f.RNRRetryCount)
	r.SetSRQ(f.SRQ)
	r.SetLocalCAGUID(f.LocalCAGUID)
	copy(r.PrivateData(), f.PrivateData[:])
}

// Fields decodes every body field.
func (r REP) Fields() REPFields {
	f := REPFields{
		LocalCommID: r.LocalCommID(), RemoteCommID: r.RemoteCommID(), LocalQKey: r.LocalQKey(),
		LocalQPN: r.LocalQPN(), VendorID: r.VendorID(), LocalEECN: r.LocalEECN(),
		StartingPSN: r.StartingPSN(), ResponderResources: r.ResponderResources(),
		InitiatorDepth: r.InitiatorDepth(), TargetACKDelay: r.TargetACKDelay(),
		FailoverAccepted: r.FailoverAccepted(), EndToEndFlowControl: r.EndToEndFlowControl(),
		RNRRetryCount: r.RNRRetryCount(), SRQ: r.SRQ(), LocalCAGUID: r.LocalCAGUID(),
	}
	copy(f.PrivateData[:], r.PrivateData())
	return f
}

// commIDs is the common prefix of RTU, DREQ, DREP, REJ, MRA, LAP and APR: the sender's comm ID
// at 24 and the receiver's at 28.
type commIDs []byte

func (c commIDs) LocalCommID() uint32      { return be32(c[24:]) }
func (c commIDs) RemoteCommID() uint32     { return be32(c[28:]) }
func (c commIDs) SetLocalCommID(v uint32)  { putBE32(c[24:], v) }
func (c commIDs) SetRemoteCommID(v uint32) { putBE32(c[28:], v) }

// RTU is a view over a CM RTU (IBA Table 111): 24 Local Comm ID, 28 Remote Comm ID,
// 32-255 private data (224).
type RTU []byte

// ParseRTU checks that b is a CM RTU MAD and returns a view of it.
func ParseRTU(b []byte) (RTU, error) { m, err := parseAs(b, AttrRTU); return RTU(m), err }

func (r RTU) LocalCommID() uint32      { return commIDs(r).LocalCommID() }
func (r RTU) RemoteCommID() uint32     { return commIDs(r).RemoteCommID() }
func (r RTU) SetLocalCommID(v uint32)  { commIDs(r).SetLocalCommID(v) }
func (r RTU) SetRemoteCommID(v uint32) { commIDs(r).SetRemoteCommID(v) }
func (r RTU) PrivateData() []byte      { return r[32:MADLen] }

// DREP is a view over a CM DREP (IBA Table 113): 24 Local Comm ID, 28 Remote Comm ID,
// 32-255 private data (224).
type DREP []byte

// ParseDREP checks that b is a CM DREP MAD and returns a view of it.
func ParseDREP(b []byte) (DREP, error) { m, err := parseAs(b, AttrDREP); return DREP(m), err }

func (r DREP) LocalCommID() uint32      { return commIDs(r).LocalCommID() }
func (r DREP) RemoteCommID() uint32     { return commIDs(r).RemoteCommID() }
func (r DREP) SetLocalCommID(v uint32)  { commIDs(r).SetLocalCommID(v) }
func (r DREP) SetRemoteCommID(v uint32) { commIDs(r).SetRemoteCommID(v) }
func (r DREP) PrivateData() []byte      { return r[32:MADLen] }

// DREQ is a view over a CM DREQ (IBA Table 112): 24 Local Comm ID, 28 Remote Comm ID,
// 32 Remote QPN/EECN (24), 35 reserved, 36-255 private data (220).
type DREQ []byte

// ParseDREQ checks that b is a CM DREQ MAD and returns a view of it.
func ParseDREQ(b []byte) (DREQ, error) { m, err := parseAs(b, AttrDREQ); return DREQ(m), err }

func (r DREQ) LocalCommID() uint32      { return commIDs(r).LocalCommID() }
func (r DREQ) RemoteCommID() uint32     { return commIDs(r).RemoteCommID() }
func (r DREQ) RemoteQPN() uint32        { return get24(r[32:]) }
func (r DREQ) SetLocalCommID(v uint32)  { commIDs(r).SetLocalCommID(v) }
func (r DREQ) SetRemoteCommID(v uint32) { commIDs(r).SetRemoteCommID(v) }
func (r DREQ) SetRemoteQPN(v uint32)    { put24(r[32:], v) }
func (r DREQ) PrivateData() []byte      { return r[36:MADLen] }

// REJ is a view over a CM REJ (IBA Table 108): 24 Local Comm ID, 28 Remote Comm ID,
// 32 Message REJected (7-6), 33 Reject Info Length (7-1), 34 Reason (16), 36-107 ARI (72),
// 108-255 private data (148).
type REJ []byte

// ParseREJ checks that b is a CM REJ MAD and returns a view of it.
func ParseREJ(b []byte) (REJ, error) { m, err := parseAs(b, AttrREJ); return REJ(m), err }

func (r REJ) LocalCommID() uint32         { return commIDs(r).LocalCommID() }
func (r REJ) RemoteCommID() uint32        { return commIDs(r).RemoteCommID() }
func (r REJ) MessageRejected() uint8      { return getBits(r[32], 7, 6) }
func (r REJ) RejectInfoLength() uint8     { return getBits(r[33], 7, 1) }
func (r REJ) Reason() uint16              { return be16(r[34:]) }
func (r REJ) ARIField() []byte            { return r[36:108] }
func (r REJ) PrivateData() []byte         { return r[108:MADLen] }
func (r REJ) SetLocalCommID(v uint32)     { commIDs(r).SetLocalCommID(v) }
func (r REJ) SetRemoteCommID(v uint32)    { commIDs(r).SetRemoteCommID(v) }
func (r REJ) SetMessageRejected(v uint8)  { setBits(&r[32], 7, 6, v) }
func (r REJ) SetRejectInfoLength(v uint8) { setBits(&r[33], 7, 1, v) }
func (r REJ) SetReason(v uint16)          { putBE16(r[34:], v) }

// ARI returns the Additional Reject Information, RejectInfoLength bytes of it (at most 72).
func (r REJ) ARI() []byte {
	n := int(r.RejectInfoLength())
	if n > REJARILength {
		n = REJARILength
	}
	return r[36 : 36+n]
}

// MRA is a view over a CM MRA (IBA Table 107): 24 Local Comm ID, 28 Remote Comm ID,
// 32 Message MRAed (7-6), 33 Service Timeout (7-3), 34-255 private data (222).
type MRA []byte

// ParseMRA checks that b is a CM MRA MAD and returns a view of it.
func ParseMRA(b []byte) (MRA, error) { m, err := parseAs(b, AttrMRA); return MRA(m), err }

func (r MRA) LocalCommID() uint32       { return commIDs(r).LocalCommID() }
func (r MRA) RemoteCommID() uint32      { return commIDs(r).RemoteCommID() }
func (r MRA) MessageMRAed() uint8       { return getBits(r[32], 7, 6) }
func (r MRA) ServiceTimeout() uint8     { return getBits(r[33], 7, 3) }
func (r MRA) PrivateData() []byte       { return r[34:MADLen] }
func (r MRA) SetLocalCommID(v uint32)   { commIDs(r).SetLocalCommID(v) }
func (r MRA) SetRemoteCommID(v uint32)  { commIDs(r).SetRemoteCommID(v) }
func (r MRA) SetMessageMRAed(v uint8)   { setBits(&r[32], 7, 6, v) }
func (r MRA) SetServiceTimeout(v uint8) { setBits(&r[33], 7, 3, v) }

// LAP is a view over a CM LAP (IBA Table 115), parsed only far enough to answer it: 24 Local
// Comm ID, 28 Remote Comm ID, 36 Remote QPN/EECN (24), 39 Remote CM Response Timeout (7-3),
// 88-255 private data (168). Alternate path migration is not supported over RoCE (cm.c
// cm_lap_handler returns early for RoCE ports).
type LAP []byte

// ParseLAP checks that b is a CM LAP MAD and returns a view of it.
func ParseLAP(b []byte) (LAP, error) { m, err := parseAs(b, AttrLAP); return LAP(m), err }

func (r LAP) LocalCommID() uint32            { return commIDs(r).LocalCommID() }
func (r LAP) RemoteCommID() uint32           { return commIDs(r).RemoteCommID() }
func (r LAP) RemoteQPN() uint32              { return get24(r[36:]) }
func (r LAP) RemoteCMResponseTimeout() uint8 { return getBits(r[39], 7, 3) }
func (r LAP) PrivateData() []byte            { return r[88:MADLen] }

// APR is a view over a CM APR (IBA Table 116): 24 Local Comm ID, 28 Remote Comm ID,
// 32 Additional Info Length, 33 AP Status, 36-107 additional info, 108-255 private data.
type APR []byte

// APR status values (torvalds/linux:include/rdma/ib_cm.h enum ib_cm_apr_status).
const (
	APRSuccess       = 0
	APRInvalidCommID = 1
	APRUnsupported   = 2
)

// ParseAPR checks that b is a CM APR MAD and returns a view of it.
func ParseAPR(b []byte) (APR, error) { m, err := parseAs(b, AttrAPR); return APR(m), err }

func (r APR) LocalCommID() uint32         { return commIDs(r).LocalCommID() }
func (r APR) RemoteCommID() uint32        { return commIDs(r).RemoteCommID() }
func (r APR) AdditionalInfoLength() uint8 { return r[32] }
func (r APR) APStatus() uint8             { return r[33] }
func (r APR) PrivateData() []byte         { return r[108:MADLen] }
func (r APR) SetLocalCommID(v uint32)     { commIDs(r).SetLocalCommID(v) }
func (r APR) SetRemoteCommID(v uint32)    { commIDs(r).SetRemoteCommID(v) }
func (r APR) SetAPStatus(v uint8)         { r[33] = v }

// SIDRREQ is a view over a CM SIDR_REQ (IBA Table 119): 24 Request ID, 28 P_Key,
// 32 Service ID (64), 40-255 private data (216).
type SIDRREQ []byte

// ParseSIDRREQ checks that b is a CM SIDR_REQ MAD and returns a view of it.
func ParseSIDRREQ(b []byte) (SIDRREQ, error) {
	m, err := parseAs(b, AttrSIDRREQ)
	return SIDRREQ(m), err
}

func (r SIDRREQ) RequestID() uint32        { return be32(r[24:]) }
func (r SIDRREQ) PartitionKey() uint16     { return be16(r[28:]) }
func (r SIDRREQ) ServiceID() uint64        { return be64(r[32:]) }
func (r SIDRREQ) PrivateData() []byte      { return r[40:MADLen] }
func (r SIDRREQ) SetRequestID(v uint32)    { putBE32(r[24:], v) }
func (r SIDRREQ) SetPartitionKey(v uint16) { putBE16(r[28:], v) }
func (r SIDRREQ) SetServiceID(v uint64)    { putBE64(r[32:], v) }

// SIDRREP is a view over a CM SIDR_REP (IBA Table 120): 24 Request ID, 28 Status,
// 29 Additional Info Length, 32 QPN (24), 36 Service ID (64), 44 Q_Key, 48-119 additional info,
// 120-255 private data (136).
type SIDRREP []byte

// SIDR_REP status values (torvalds/linux:include/rdma/ib_cm.h enum ib_cm_sidr_status).
const (
	SIDRSuccess     = 0
	SIDRUnsupported = 1 // service ID not supported
	SIDRReject      = 2
	SIDRNoQP        = 3
)

// ParseSIDRREP checks that b is a CM SIDR_REP MAD and returns a view of it.
func ParseSIDRREP(b []byte) (SIDRREP, error) {
	m, err := parseAs(b, AttrSIDRREP)
	return SIDRREP(m), err
}

func (r SIDRREP) RequestID() uint32     { return be32(r[24:]) }
func (r SIDRREP) Status() uint8         { return r[28] }
func (r SIDRREP) QPN() uint32           { return get24(r[32:]) }
func (r SIDRREP) ServiceID() uint64     { return be64(r[36:]) }
func (r SIDRREP) QKey() uint32          { return be32(r[44:]) }
func (r SIDRREP) PrivateData() []byte   { return r[120:MADLen] }
func (r SIDRREP) SetRequestID(v uint32) { putBE32(r[24:], v) }
func (r SIDRREP) SetStatus(v uint8)     { r[28] = v }
func (r SIDRREP) SetQPN(v uint32)       { put24(r[32:], v) }
func (r SIDRREP) SetServiceID(v uint64) { putBE64(r[36:], v) }
func (r SIDRREP) SetQKey(v uint32)      { putBE32(r[44:], v) }

// RTUFields, DREPFields, DREQFields, REJFields and MRAFields hold every field of the
// corresponding message body.
type (
	RTUFields struct {
		LocalCommID, RemoteCommID uint32
		PrivateData               [RTUPrivateDataSize]byte
	}
	DREPFields struct {
		LocalCommID, RemoteCommID uint32
		PrivateData               [DREPPrivateDataSize]byte
	}
	DREQFields struct {
		LocalCommID, RemoteCommID uint32
		RemoteQPN                 uint32
		PrivateData               [DREQPrivateDataSize]byte
	}
	REJFields struct {
		LocalCommID, RemoteCommID uint32
		MessageRejected           uint8
		RejectInfoLength          uint8
		Reason                    uint16
		ARI                       [REJARILength]byte
		PrivateData               [REJPrivateDataSize]byte
	}
	MRAFields struct {
		LocalCommID, RemoteCommID uint32
		MessageMRAed              uint8
		ServiceTimeout            uint8
		PrivateData               [MRAPrivateDataSize]byte
	}
)

// Encode writes the body (reserved bits zero); the header is not touched.
func (r RTU) Encode(f *RTUFields) {
	clear(r[HeaderLen:MADLen])
	r.SetLocalCommID(f.LocalCommID)
	r.SetRemoteCommID(f.RemoteCommID)
	copy(r.PrivateData(), f.PrivateData[:])
}

// Fields decodes the body.
func (r RTU) Fields() (f RTUFields) {
	f.LocalCommID, f.RemoteCommID = r.LocalCommID(), r.RemoteCommID()
	copy(f.PrivateData[:], r.PrivateData())
	return f
}

// Encode writes the body (reserved bits zero); the header is not touched.
func (r DREP) Encode(f *DREPFields) {
	clear(r[HeaderLen:MADLen])
	r.SetLocalCommID(f.LocalCommID)
	r.SetRemoteCommID(f.RemoteCommID)
	copy(r.PrivateData(), f.PrivateData[:])
}

// Fields decodes the body.
func (r DREP) Fields() (f DREPFields) {
	f.LocalCommID, f.RemoteCommID = r.LocalCommID(), r.RemoteCommID()
	copy(f.PrivateData[:], r.PrivateData())
	return f
}

// Encode writes the body (reserved bits zero); the header is not touched.
func (r DREQ) Encode(f *DREQFields) {
	clear(r[HeaderLen:MADLen])
	r.SetLocalCommID(f.LocalCommID)
	r.SetRemoteCommID(f.RemoteCommID)
	r.SetRemoteQPN(f.RemoteQPN)
	copy(r.PrivateData(), f.PrivateData[:])
}

// Fields decodes the body.
func (r DREQ) Fields() (f DREQFields) {
	f.LocalCommID, f.RemoteCommID, f.RemoteQPN = r.LocalCommID(), r.RemoteCommID(), r.RemoteQPN()
	copy(f.PrivateData[:], r.PrivateData())
	return f
}

// Encode writes the body (reserved bits zero); the header is not touched.
func (r REJ) Encode(f *REJFields) {
	clear(r[HeaderLen:MADLen])
	r.SetLocalCommID(f.LocalCommID)
	r.SetRemoteCommID(f.RemoteCommID)
	r.SetMessageRejected(f.MessageRejected)
	r.SetRejectInfoLength(f.RejectInfoLength)
	r.SetReason(f.Reason)
	copy(r.ARIField(), f.ARI[:])
	copy(r.PrivateData(), f.PrivateData[:])
}

// Fields decodes the body (ARI: the whole 72-byte field).
func (r REJ) Fields() (f REJFields) {
	f.LocalCommID, f.RemoteCommID = r.LocalCommID(), r.RemoteCommID()
	f.MessageRejected, f.RejectInfoLength, f.Reason = r.MessageRejected(), r.RejectInfoLength(), r.Reason()
	copy(f.ARI[:], r.ARIField())
	copy(f.PrivateData[:], r.PrivateData())
	return f
}

// Encode writes the body (reserved bits zero); the header is not touched.
func (r MRA) Encode(f *MRAFields) {
	clear(r[HeaderLen:MADLen])
	r.SetLocalCommID(f.LocalCommID)
	r.SetRemoteCommID(f.RemoteCommID)
	r.SetMessageMRAed(f.MessageMRAed)
	r.SetServiceTimeout(f.ServiceTimeout)
	copy(r.PrivateData(), f.PrivateData[:])
}

// Fields decodes the body.
func (r MRA) Fields() (f MRAFields) {
	f.LocalCommID, f.RemoteCommID = r.LocalCommID(), r.RemoteCommID()
	f.MessageMRAed, f.ServiceTimeout = r.MessageMRAed(), r.ServiceTimeout()
	copy(f.PrivateData[:], r.PrivateData())
	return f
}
