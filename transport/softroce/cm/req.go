package cm

import "net/netip"

// REQ is a view over a 256-byte CM REQ MAD (IBA Table 106; field locations from
// torvalds/linux:include/rdma/ibta_vol1_c12.h CM_REQ_*, offsets here absolute = table + 24):
//
//	24 Local Comm ID          29-31 ECE vendor ID        32 Service ID (64)
//	40 Local CA GUID (64)     48 reserved (32)           52 Local Q_Key
//	56 Local QPN (24)         59 Responder Resources     60 Local EECN (24)
//	63 Initiator Depth        64 Remote EECN (24)
//	67 Remote CM Response Timeout (7-3) | Transport Service Type (2-1) | E2E Flow Control (0)
//	68 Starting PSN (24)      71 Local CM Response Timeout (7-3) | Retry Count (2-0)
//	72 P_Key                  74 Path MTU (7-4) | RDC Exists (3) | RNR Retry Count (2-0)
//	75 Max CM Retries (7-4) | SRQ (3) | Extended Transport Type (2-0)
//	76-119 primary path, 120-163 alternate path (see Path), 164-255 private data (92)
type REQ []byte

// Absolute offsets in a REQ.
const (
	reqLocalCommID   = 24
	reqVendorID      = 29
	reqServiceID     = 32
	reqLocalCAGUID   = 40
	reqLocalQKey     = 52
	reqLocalQPN      = 56
	reqRespRes       = 59
	reqLocalEECN     = 60
	reqInitDepth     = 63
	reqRemoteEECN    = 64
	reqByte67        = 67
	reqStartingPSN   = 68
	reqByte71        = 71
	reqPKey          = 72
	reqByte74        = 74
	reqByte75        = 75
	reqPrimaryPath   = 76
	reqAlternatePath = 120
	reqPrivateData   = 164
)

// ParseREQ checks that b is a CM REQ MAD and returns a view of it.
func ParseREQ(b []byte) (REQ, error) { m, err := parseAs(b, AttrREQ); return REQ(m), err }

func (r REQ) LocalCommID() uint32            { return be32(r[reqLocalCommID:]) }
func (r REQ) VendorID() uint32               { return get24(r[reqVendorID:]) }
func (r REQ) ServiceID() uint64              { return be64(r[reqServiceID:]) }
func (r REQ) LocalCAGUID() uint64            { return be64(r[reqLocalCAGUID:]) }
func (r REQ) LocalQKey() uint32              { return be32(r[reqLocalQKey:]) }
func (r REQ) LocalQPN() uint32               { return get24(r[reqLocalQPN:]) }
func (r REQ) ResponderResources() uint8      { return r[reqRespRes] }
func (r REQ) LocalEECN() uint32              { return get24(r[reqLocalEECN:]) }
func (r REQ) InitiatorDepth() uint8          { return r[reqInitDepth] }
func (r REQ) RemoteEECN() uint32             { return get24(r[reqRemoteEECN:]) }
func (r REQ) RemoteCMResponseTimeout() uint8 { return getBits(r[reqByte67], 7, 3) }

// TransportServiceType: 0 RC, 1 UC, 2 RD, 3 see ExtendedTransportType.
func (r REQ) TransportServiceType() uint8   { return getBits(r[reqByte67], 2, 1) }
func (r REQ) EndToEndFlowControl() bool     { return r[reqByte67]&1 != 0 }
func (r REQ) StartingPSN() uint32           { return get24(r[reqStartingPSN:]) }
func (r REQ) LocalCMResponseTimeout() uint8 { return getBits(r[reqByte71], 7, 3) }
func (r REQ) RetryCount() uint8             { return getBits(r[reqByte71], 2, 0) }
func (r REQ) PartitionKey() uint16          { return be16(r[reqPKey:]) }

// PathMTU is the IB MTU enum (1=256 .. 5=4096).
func (r REQ) PathMTU() uint8               { return getBits(r[reqByte74], 7, 4) }
func (r REQ) RDCExists() bool              { return r[reqByte74]&0x08 != 0 }
func (r REQ) RNRRetryCount() uint8         { return getBits(r[reqByte74], 2, 0) }
func (r REQ) MaxCMRetries() uint8          { return getBits(r[reqByte75], 7, 4) }
func (r REQ) SRQ() bool                    { return r[reqByte75]&0x08 != 0 }
func (r REQ) ExtendedTransportType() uint8 { return getBits(r[reqByte75], 2, 0) }

// PrimaryPath and AlternatePath are views of the two 44-byte path blocks.
func (r REQ) PrimaryPath() Path   { return Path(r[reqPrimaryPath:reqAlternatePath]) }
func (r REQ) AlternatePath() Path { return Path(r[reqAlternatePath:reqPrivateData]) }

// HasAlternatePath is cm.c cm_req_has_alt_path for IB/RoCE: alternate local LID ≠ 0.
func (r REQ) HasAlternatePath() bool { return r.AlternatePath().LocalLID() != 0 }

// PrivateData is the 92-byte private data (RDMA CM header + 56 bytes of ULP data).
func (r REQ) PrivateData() []byte { return r[reqPrivateData:MADLen] }

func (r REQ) SetLocalCommID(v uint32)            { putBE32(r[reqLocalCommID:], v) }
func (r REQ) SetVendorID(v uint32)               { put24(r[reqVendorID:], v) }
func (r REQ) SetServiceID(v uint64)              { putBE64(r[reqServiceID:], v) }
func (r REQ) SetLocalCAGUID(v uint64)            { putBE64(r[reqLocalCAGUID:], v) }
func (r REQ) SetLocalQKey(v uint32)              { putBE32(r[reqLocalQKey:], v) }
func (r REQ) SetLocalQPN(v uint32)               { put24(r[reqLocalQPN:], v) }
func (r REQ) SetResponderResources(v uint8)      { r[reqRespRes] = v }
func (r REQ) SetLocalEECN(v uint32)              { put24(r[reqLocalEECN:], v) }
func (r REQ) SetInitiatorDepth(v uint8)          { r[reqInitDepth] = v }
func (r REQ) SetRemoteEECN(v uint32)             { put24(r[reqRemoteEECN:], v) }
func (r REQ) SetRemoteCMResponseTimeout(v uint8) { setBits(&r[reqByte67], 7, 3, v) }
func (r REQ) SetTransportServiceType(v uint8)    { setBits(&r[reqByte67], 2, 1, v) }
func (r REQ) SetEndToEndFlowControl(v bool)      { setBits(&r[reqByte67], 0, 0, b2u(v)) }
func (r REQ) SetStartingPSN(v uint32)            { put24(r[reqStartingPSN:], v) }
func (r REQ) SetLocalCMResponseTimeout(v uint8)  { setBits(&r[reqByte71], 7, 3, v) }
func (r REQ) SetRetryCount(v uint8)              { setBits(&r[reqByte71], 2, 0, v) }
func (r REQ) SetPartitionKey(v uint16)           { putBE16(r[reqPKey:], v) }
func (r REQ) SetPathMTU(v uint8)                 { setBits(&r[reqByte74], 7, 4, v) }
func (r REQ) SetRDCExists(v bool)                { setBits(&r[reqByte74], 3, 3, b2u(v)) }
func (r REQ) SetRNRRetryCount(v uint8)           { setBits(&r[reqByte74], 2, 0, v) }
func (r REQ) SetMaxCMRetries(v uint8)            { setBits(&r[reqByte75], 7, 4, v) }
func (r REQ) SetSRQ(v bool)                      { setBits(&r[reqByte75], 3, 3, b2u(v)) }
func (r REQ) SetExtendedTransportType(v uint8)   { setBits(&r[reqByte75], 2, 0, v) }

// REQFields holds every field of a REQ body.
type REQFields struct {
	LocalCommID             uint32
	VendorID                uint32 // ECE vendor ID (24 bits)
	ServiceID               uint64
	LocalCAGUID             uint64
	LocalQKey               uint32
	LocalQPN                uint32
	ResponderResources      uint8
	LocalEECN               uint32
	InitiatorDepth          uint8
	RemoteEECN              uint32
	RemoteCMResponseTimeout uint8
	TransportServiceType    uint8
	EndToEndFlowControl     bool
	StartingPSN             uint32
	LocalCMResponseTimeout  uint8
	RetryCount              uint8
	PartitionKey            uint16
	PathMTU                 uint8
	RDCExists               bool
	RNRRetryCount           uint8
	MaxCMRetries            uint8
	SRQ                     bool
	ExtendedTransportType   uint8
	Primary, Alternate      PathFields
	PrivateData             [REQPrivateDataSize]byte
}

// Encode writes every body field (bytes 24..255; reserved bits zero). The header is not
// touched (see InitMAD).
func (r REQ) Encode(f *REQFields) {
	clear(r[HeaderLen:MADLen])
	r.SetLocalCommID(f.LocalCommID)
	r.SetVendorID(f.VendorID)
	r.SetServiceID(f.ServiceID)
	r.SetLocalCAGUID(f.LocalCAGUID)
	r.SetLocalQKey(f.LocalQKey)
	r.SetLocalQPN(f.LocalQPN)
	r.SetResponderResources(f.ResponderResources)
	r.SetLocalEECN(f.LocalEECN)
	r.SetInitiatorDepth(f.InitiatorDepth)
	r.SetRemoteEECN(f.RemoteEECN)
	r.SetRemoteCMResponseTimeout(f.RemoteCMResponseTimeout)
	r.SetTransportServiceType(f.TransportServiceType)
	r.SetEndToEndFlowControl(f.EndToEndFlowControl)
	r.SetStartingPSN(f.StartingPSN)
	r.SetLocalCMResponseTimeout(f.LocalCMResponseTimeout)
	r.SetRetryCount(f.RetryCount)
	r.SetPartitionKey(f.PartitionKey)
	r.SetPathMTU(f.PathMTU)
	r.SetRDCExists(f.RDCExists)
	r.SetRNRRetryCount(f.RNRRetryCount)
	r.SetMaxCMRetries(f.MaxCMRetries)
	r.SetSRQ(f.SRQ)
	r.SetExtendedTransportType(f.ExtendedTransportType)
	r.PrimaryPath().Encode(&f.Primary)
	r.AlternatePath().Encode(&f.Alternate)
	copy(r.PrivateData(), f.PrivateData[:])
}

// Fields decodes every body field.
func (r REQ) Fields() REQFields {
	f := REQFields{
		LocalCommID: r.LocalCommID(), VendorID: r.VendorID(), ServiceID: r.ServiceID(),
		LocalCAGUID: r.LocalCAGUID(), LocalQKey: r.LocalQKey(), LocalQPN: r.LocalQPN(),
		ResponderResources: r.ResponderResources(), LocalEECN: r.LocalEECN(),
		InitiatorDepth: r.InitiatorDepth(), RemoteEECN: r.RemoteEECN(),
		RemoteCMResponseTimeout: r.RemoteCMResponseTimeout(),
		TransportServiceType:    r.TransportServiceType(),
		EndToEndFlowControl:     r.EndToEndFlowControl(), StartingPSN: r.StartingPSN(),
		LocalCMResponseTimeout: r.LocalCMResponseTimeout(), RetryCount: r.RetryCount(),
		PartitionKey: r.PartitionKey(), PathMTU: r.PathMTU(), RDCExists: r.RDCExists(),
		RNRRetryCount: r.RNRRetryCount(), MaxCMRetries: r.MaxCMRetries(), SRQ: r.SRQ(),
		ExtendedTransportType: r.ExtendedTransportType(),
		Primary:               r.PrimaryPath().Fields(), Alternate: r.AlternatePath().Fields(),
	}
	copy(f.PrivateData[:], r.PrivateData())
	return f
}

// Path is a view over one 44-byte REQ path block (primary at MAD offset 76, alternate at 120):
//
//	0 Local Port LID   2 Remote Port LID   4 Local Port GID (16)   20 Remote Port GID (16)
//	36 Flow Label (bits 31-12 of the 32-bit word; 11-6 reserved)   39 Packet Rate (5-0)
//	40 Traffic Class   41 Hop Limit   42 SL (7-4) | Subnet Local (3)
//	43 Local ACK Timeout (7-3) | SAP Supported (2, alternate path only)
//
// (CM_REQ_PRIMARY_* / CM_REQ_ALTERNATE_* in torvalds/linux:include/rdma/ibta_vol1_c12.h.)
type Path []byte

const (
	pathLocalLID  = 0
	pathRemoteLID = 2
	pathLocalGID  = 4
	pathRemoteGID = 20
	pathFlowLabel = 36
	pathRate      = 39
	pathTC        = 40
	pathHopLimit  = 41
	pathByte42    = 42
	pathByte43    = 43
	pathLen       = 44
	flowLabelMask = 0xFFFFF
)

func (p Path) LocalLID() uint16  { return be16(p[pathLocalLID:]) }
func (p Path) RemoteLID() uint16 { return be16(p[pathRemoteLID:]) }

// LocalGID and RemoteGID return the 16-byte GIDs (RoCEv2: IPv6 or ::ffff:a.b.c.d).
func (p Path) LocalGID() (g [16]byte)  { copy(g[:], p[pathLocalGID:]); return g }
func (p Path) RemoteGID() (g [16]byte) { copy(g[:], p[pathRemoteGID:]); return g }

// LocalAddr and RemoteAddr return the GIDs as IP addresses (IPv4-mapped GIDs unmapped).
func (p Path) LocalAddr() netip.Addr  { return netip.AddrFrom16(p.LocalGID()).Unmap() }
func (p Path) RemoteAddr() netip.Addr { return netip.AddrFrom16(p.RemoteGID()).Unmap() }

func (p Path) FlowLabel() uint32      { return be32(p[pathFlowLabel:]) >> 12 }
func (p Path) PacketRate() uint8      { return getBits(p[pathRate], 5, 0) }
func (p Path) TrafficClass() uint8    { return p[pathTC] }
func (p Path) HopLimit() uint8        { return p[pathHopLimit] }
func (p Path) SL() uint8              { return getBits(p[pathByte42], 7, 4) }
func (p Path) SubnetLocal() bool      { return p[pathByte42]&0x08 != 0 }
func (p Path) LocalACKTimeout() uint8 { return getBits(p[pathByte43], 7, 3) }
func (p Path) SAPSupported() bool     { return p[pathByte43]&0x04 != 0 }

func (p Path) SetLocalLID(v uint16)       { putBE16(p[pathLocalLID:], v) }
func (p Path) SetRemoteLID(v uint16)      { putBE16(p[pathRemoteLID:], v) }
func (p Path) SetLocalGID(g [16]byte)     { copy(p[pathLocalGID:], g[:]) }
func (p Path) SetRemoteGID(g [16]byte)    { copy(p[pathRemoteGID:], g[:]) }
func (p Path) SetPacketRate(v uint8)      { setBits(&p[pathRate], 5, 0, v) }
func (p Path) SetTrafficClass(v uint8)    { p[pathTC] = v }
func (p Path) SetHopLimit(v uint8)        { p[pathHopLimit] = v }
func (p Path) SetSL(v uint8)              { setBits(&p[pathByte42], 7, 4, v) }
func (p Path) SetSubnetLocal(v bool)      { setBits(&p[pathByte42], 3, 3, b2u(v)) }
func (p Path) SetLocalACKTimeout(v uint8) { setBits(&p[pathByte43], 7, 3, v) }
func (p Path) SetSAPSupported(v bool)     { setBits(&p[pathByte43], 2, 2, b2u(v)) }

// SetFlowLabel writes the 20-bit flow label into bits 31-12 of the word at offset 36, leaving
// bits 11-0 (reserved and the high bits of the packet-rate byte's neighbour) alone.
func (p Path) SetFlowLabel(v uint32) {
	w := be32(p[pathFlowLabel:])
	putBE32(p[pathFlowLabel:], w&0xFFF|(v&flowLabelMask)<<12)
}

// PathFields holds every field of a REQ path block.
type PathFields struct {
	LocalLID, RemoteLID uint16
	LocalGID, RemoteGID [16]byte
	FlowLabel           uint32
	PacketRate          uint8
	TrafficClass        uint8
	HopLimit            uint8
	SL                  uint8
	SubnetLocal         bool
	LocalACKTimeout     uint8
	SAPSupported        bool // alternate path only
}

// Encode writes the block (reserved bits zero).
func (p Path) Encode(f *PathFields) {
	clear(p[:pathLen])
	p.SetLocalLID(f.LocalLID)
	p.SetRemoteLID(f.RemoteLID)
	p.SetLocalGID(f.LocalGID)
	p.SetRemoteGID(f.RemoteGID)
	p.SetFlowLabel(f.FlowLabel)
	p.SetPacketRate(f.PacketRate)
	p.SetTrafficClass(f.TrafficClass)
	p.SetHopLimit(f.HopLimit)
	p.SetSL(f.SL)
	p.SetSubnetLocal(f.SubnetLocal)
	p.SetLocalACKTimeout(f.LocalACKTimeout)
	p.SetSAPSupported(f.SAPSupported)
}

// Fields decodes the block.
func (p Path) Fields() PathFields {
	return PathFields{
		LocalLID: p.LocalLID(), RemoteLID: p.RemoteLID(), LocalGID: p.LocalGID(),
		RemoteGID: p.RemoteGID(), FlowLabel: p.FlowLabel(), PacketRate: p.PacketRate(),
		TrafficClass: p.TrafficClass(), HopLimit: p.HopLimit(), SL: p.SL(),
		SubnetLocal: p.SubnetLocal(), LocalACKTimeout: p.LocalACKTimeout(),
		SAPSupported: p.SAPSupported(),
	}
}
