// Package wire holds the RoCEv2 wire formats used by softroce: typed, zero-allocation views over
// the InfiniBand transport headers (BTH and the extended transport headers), the opcode table,
// 24-bit PSN arithmetic, the common MAD header, the invariant CRC (ICRC) exactly as the Linux
// rdma_rxe driver computes it, and the recovery of an unseen IPv4 Identification from the ICRC.
//
// Style follows gVisor's pkg/tcpip/header: every header is a named []byte with accessors, setters
// and an Encode method taking a Fields struct. Views never copy and never allocate. Accessors do
// not bounds-check beyond what Go does: a view must be at least its header length, which Parse
// and Layout guarantee for the views they hand out.
//
// Byte order is big-endian everywhere except the ICRC, which is stored little-endian
// (torvalds/linux:drivers/infiniband/sw/rxe/rxe_icrc.c).
//
// Layout of a RoCEv2 datagram (UDP payload): BTH (12) | extended headers (0..40, per opcode) |
// payload | pad (0..3 zero bytes, count in BTH.PadCnt) | ICRC (4).
package wire

// UDPPort is the IANA UDP destination port of RoCEv2 (0x12B7).
const UDPPort = 4791

// DefaultPKey is the only partition key rxe supports (full member of the default partition).
const DefaultPKey = 0xFFFF

// QPGSI is the queue pair number of the General Services Interface (QP1), the UD QP that
// carries CM MADs; GSIQKey is the Q_Key every QP1 MAD carries in its DETH
// (torvalds/linux:include/rdma/ib_verbs.h IB_QP1_QKEY).
const (
	QPGSI   = 1
	GSIQKey = 0x80010000
)

// QPMulticast is the destination QP number of multicast packets.
const QPMulticast = 0xFFFFFF
