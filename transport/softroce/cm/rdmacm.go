package cm

import "net/netip"

// RDMA CM conventions on top of the IB CM (torvalds/linux:drivers/infiniband/core/cma.c).

// PortSpace is an RDMA CM port space (include/rdma/rdma_cm.h enum rdma_ucm_port_space).
type PortSpace uint16

// Port spaces.
const (
	PortSpaceIPoIB PortSpace = 0x0002 // RDMA_PS_IPOIB
	PortSpaceTCP   PortSpace = 0x0106 // RDMA_PS_TCP: what ib_srp and most RC ULPs use
	PortSpaceUDP   PortSpace = 0x0111 // RDMA_PS_UDP
	PortSpaceIB    PortSpace = 0x013F // RDMA_PS_IB
)

// ServiceID returns the IB service ID of an RDMA CM port (cma.c cma_get_service_id:
// (ps << 16) + port), e.g. 0x00000000010615B3 for TCP port 5555. The 0x0000000001 prefix is
// IBTA Annex A11's "RDMA IP CM service".
func ServiceID(ps PortSpace, port uint16) uint64 { return uint64(ps)<<16 | uint64(port) }

// ParseServiceID splits an RDMA IP CM service ID into port space and port (cma.c
// rdma_ps_from_service_id and cma_port_from_service_id). ok is false when sid does not carry
// the 0x0000000001 prefix (RDMA_IB_IP_PS_MASK).
func ParseServiceID(sid uint64) (ps PortSpace, port uint16, ok bool) {
	if sid>>24 != 0x01 {
		return 0, 0, false
	}
	return PortSpace(sid >> 16), uint16(sid), true
}

// RDMA CM private-data header (cma.c struct cma_hdr), at the start of REQ (and SIDR_REQ)
// private data; the other messages carry raw ULP data.
const (
	CMAHeaderLen = 36
	CMAVersion   = 0x00 // CMA_VERSION; the passive side rejects any other value

	// ULPREQPrivateDataSize is what a ULP may put in a REQ after the header (92 - 36).
	ULPREQPrivateDataSize = REQPrivateDataSize - CMAHeaderLen
)

// CMAHeader is a view over the 36-byte RDMA CM header:
//
//	0 cma_version (0)   1 IP version (7-4: 4 or 6)   2 source port (the active side's RDMA CM
//	port)   4 source IP (16)   20 destination IP (16)
//
// An IPv4 address is stored as 12 zero bytes followed by the 4 address bytes (union
// cma_ip_addr .ip4 with pad[3]) — not as an IPv4-mapped IPv6 address.
type CMAHeader []byte

// ParseCMAHeader checks the header at the start of REQ private data pd (cma.c
// cma_save_ip_info / cma_get_ip_ver checks: version 0, IP version 4 or 6).
func ParseCMAHeader(pd []byte) (CMAHeader, error) {
	if len(pd) < CMAHeaderLen {
		return nil, ErrCMAHeader
	}
	h := CMAHeader(pd[:CMAHeaderLen:CMAHeaderLen])
	if h.Version() != CMAVersion || (h.IPVersion() != 4 && h.IPVersion() != 6) {
		return nil, ErrCMAHeader
	}
	return h, nil
}

func (h CMAHeader) Version() uint8   { return h[0] }
func (h CMAHeader) IPVersion() uint8 { return h[1] >> 4 }
func (h CMAHeader) SrcPort() uint16  { return be16(h[2:]) }

// SrcAddr and DstAddr decode the addresses per IPVersion (invalid Addr for another version).
func (h CMAHeader) SrcAddr() netip.Addr { return h.addr(h[4:20]) }
func (h CMAHeader) DstAddr() netip.Addr { return h.addr(h[20:36]) }

func (h CMAHeader) addr(b []byte) netip.Addr {
	switch h.IPVersion() {
	case 4:
		return netip.AddrFrom4([4]byte(b[12:16]))
	case 6:
		return netip.AddrFrom16([16]byte(b))
	}
	return netip.Addr{}
}

// Encode writes a header for src:srcPort → dst (both of one family; an IPv4-mapped IPv6
// address counts as IPv4, as the kernel works on sockaddr_in).
func (h CMAHeader) Encode(src netip.Addr, srcPort uint16, dst netip.Addr) {
	clear(h[:CMAHeaderLen])
	h[0] = CMAVersion
	src, dst = src.Unmap(), dst.Unmap()
	putBE16(h[2:], srcPort)
	if src.Is4() {
		h[1] = 4 << 4
		s, d := src.As4(), dst.As4()
		copy(h[16:20], s[:])
		copy(h[32:36], d[:])
		return
	}
	h[1] = 6 << 4
	s, d := src.As16(), dst.As16()
	copy(h[4:20], s[:])
	copy(h[20:36], d[:])
}

// FlowLabel is the flow label the kernel puts in a RoCEv2 REQ when the source address carries
// none (cma.c cma_get_roce_udp_flow_label): (sport*31 + dport) & 0xFFFFF over the RDMA CM
// ports.
func FlowLabel(srcPort, dstPort uint16) uint32 {
	return (uint32(srcPort)*31 + uint32(dstPort)) & flowLabelMask
}
