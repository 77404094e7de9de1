// Package link moves RoCEv2 datagrams between the softroce engine and the network. The engine
// talks to the network only through the Link interface (modelled on wireguard-go's conn.Bind:
// batched I/O, no allocation and no goroutine per packet).
//
// Implementations:
//   - UDP (ListenUDP): a UDP socket with recvmmsg/sendmmsg, the default.
//   - MemLink (NewPipe): two connected in-memory endpoints with deterministic fault injection
//     (drop, duplicate, reorder, delay, corrupt), a per-packet filter hook and raw injection,
//     for tests.
//   - WithPcap: a tap writing every packet sent and received to a classic pcap file.
//
// Every link computes the ICRC on Send over the exact IP/UDP header the packet gets on the wire
// and verifies it on Recv (recovering the unseen IPv4 Identification, see
// wire.Encap.RecoverIPv4ID), so the engine never handles ICRCs.
package link

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"sync/atomic"

	"github.com/srpd/srpd/transport/softroce/wire"
)

// UDPPort is the RoCEv2 UDP destination port (IANA 4791).
const UDPPort = wire.UDPPort

// MaxPacket is the largest Buf (BTH through ICRC) a link sends or receives: a 4096-byte payload
// (the largest IB MTU) plus the longest transport headers (wire.MaxHeaderLen), 3 pad bytes and
// the ICRC, rounded up to a multiple of 64. Receive buffers must have at least this capacity.
const MaxPacket = 4160

// MinPacket is the smallest valid Buf: a BTH and an ICRC.
const MinPacket = wire.BTHLen + wire.ICRCLen

// Packet is one RoCEv2 datagram: UDP/IP addressing plus the bytes from the BTH through the ICRC.
type Packet struct {
	// Src is the sender. On Send, Src.Addr() selects the IP source address (it must be an
	// address of this host; required when a UDP link is bound to a wildcard address, otherwise
	// the link's own address is used when Src.Addr() is not valid) and Src.Port() is ignored:
	// packets leave from the link's port (rxe ignores the UDP source port). On Recv it is the
	// datagram's source address and port.
	Src netip.AddrPort
	// Dst is the receiver. On Send its port is normally UDPPort (4791). On Recv it is the
	// datagram's destination address (learned with IP_PKTINFO when bound to a wildcard) and the
	// link's port.
	Dst netip.AddrPort
	// TrafficClass is the IPv4 TOS / IPv6 traffic class (DSCP+ECN). On Recv it is 0 unless the
	// link reports it (UDP does, MemLink does).
	TrafficClass uint8
	// Buf holds BTH .. ICRC inclusive. Send: the link overwrites the last 4 bytes with the ICRC
	// for the exact IP header it puts on the wire; len(Buf) must be in [MinPacket, MaxPacket].
	// Recv: Buf is resliced (within its capacity, which must be >= MaxPacket) to the datagram,
	// the ICRC has been verified and the packet parses with wire.Parse; Src/Dst are filled.
	Buf []byte
	// Segmentable (Send): the receiver accepts any IPv4 Identification (an srpd peer: it
	// recovers the ID from the ICRC), so a link with UDP GSO may send the packet in a
	// super-packet whose segments the kernel numbers. Without it GSO is used only towards
	// loopback addresses. Ignored on Recv.
	Segmentable bool
	// NoICRC (Send): the receiver waives the ICRC for this packet's destination QP (an srpd
	// peer that negotiated it, ICRCWaiver), so the link leaves the field zero instead of
	// computing it. Only a link whose datagrams carry their own checksum may be asked (UDP: the
	// kernel's UDP checksum covers the same bytes end to end). Ignored on Recv.
	NoICRC bool
	// Payload (Send), when not nil, is the packet's payload carried by reference: the datagram
	// is Buf without its last 4 bytes (BTH through the last transport header), then Payload,
	// then Buf's last 4 bytes (the ICRC field). The link reads Payload while Send runs and not
	// after (UDP hands it to the kernel as an iovec of its own, which saves copying every byte
	// into a packet buffer first). Only for links implementing ICRCWaiver and with NoICRC: no
	// CRC is computed over pieces; its length must be a multiple of 4 (no pad bytes).
	// Otherwise Send returns ErrPayloadRef. Ignored on Recv.
	Payload []byte
}

// Len is the packet's length on the wire from the BTH through the ICRC: len(Buf) plus the
// payload carried by reference.
func (p *Packet) Len() int { return len(p.Buf) + len(p.Payload) }

// checkSend checks a packet to send: its length and, with a payload by reference, that the
// link can send one (refs) and the packet meets Payload's conditions.
func (p *Packet) checkSend(refs bool) error {
	if n := p.Len(); n < MinPacket || n > MaxPacket || len(p.Buf) < MinPacket {
		return ErrPacketSize
	}
	if p.Payload != nil && (!refs || !p.NoICRC || len(p.Payload)%4 != 0) {
		return ErrPayloadRef
	}
	return nil
}

// ICRCWaiver is implemented by links that can accept packets without an ICRC: those whose
// datagrams are covered by a checksum of their own (UDP; not MemLink, whose fault injection
// corrupts bytes that only the ICRC then catches). Once WaiveICRC(f) is called, a received
// packet whose ICRC field is zero is accepted unchecked when f(its BTH destination QP) is true
// — the receiving QP negotiated it with its srpd peer; every other packet is checked as
// before (a zero field that is no waiver is an ICRC like any other). f is called from Recv
// and must be safe for concurrent use; nil removes it.
type ICRCWaiver interface {
	WaiveICRC(f func(destQPN uint32) bool)
}

// Link is a RoCEv2 datagram endpoint. All methods are safe for concurrent use; Send and Recv
// are typically called from one goroutine each.
type Link interface {
	// Send transmits pkts in order, writing each packet's ICRC into its Buf first. It returns
	// the number of packets handed to the network and the first error; it stops at the first
	// packet it cannot send (pkts[n] caused the error, pkts[n+1:] were not attempted). Packets
	// handed to the network may still be lost, as on any network. After Close it returns
	// net.ErrClosed.
	Send(pkts []Packet) (int, error)
	// Recv blocks until at least one packet is available, fills up to len(pkts) entries
	// (reusing each pkts[i].Buf's capacity, which must be >= MaxPacket) and returns how many.
	// Packets failing ICRC or framing are dropped and counted, never returned. After Close it
	// returns net.ErrClosed (also to a Recv blocked at the time).
	Recv(pkts []Packet) (int, error)
	// BatchSize is the ideal number of packets per Send/Recv call.
	BatchSize() int
	// LocalAddr is the address the link is bound to (possibly unspecified for a wildcard UDP
	// link), with the link's UDP port available through LocalAddrPort on the implementations.
	LocalAddr() netip.Addr
	// Stats returns a snapshot of the link's counters.
	Stats() Stats
	// Close releases the link. It is idempotent.
	Close() error
}

// ViewReceiver is implemented by links that can hand received packets out of their own
// receive memory instead of copying each into the caller's buffer (UDP with GRO: the datagrams
// of a coalesced message are split into views of it). RecvViews is Recv, except that it may
// point pkts[i].Buf at such a view: valid until the next Recv or RecvViews call, of exactly the
// packet's length and capacity. A caller that lends its own buffers in pkts puts them back
// before each call (Recv needs their capacity).
type ViewReceiver interface {
	RecvViews(pkts []Packet) (int, error)
}

// Encapsulator is implemented by links that can tell the exact IP/UDP encapsulation they give
// a sent packet (used by the pcap tap). p must have been passed to Send already (so its Src is
// resolved the same way).
type Encapsulator interface {
	Encap(p *Packet) wire.Encap
}

// Stats is a snapshot of a link's counters. Bytes count packet lengths (BTH through ICRC).
type Stats struct {
	TxPackets, TxBytes uint64 // handed to the network
	RxPackets, RxBytes uint64 // returned by Recv
	RxICRCDrops        uint64 // dropped: ICRC mismatch (or no IPv4 ID makes it match)
	RxMalformedDrops   uint64 // dropped: too short/long, truncated, unparseable, bad addresses
	RxQueueDrops       uint64 // dropped: receive queue full (MemLink) / socket overflow (UDP, SO_RXQ_OVFL)
	TxErrors           uint64 // Send calls that failed (one per error returned)
	TxGSOMessages      uint64 // UDP GSO super-packets sent (UDPOptions.GSO); their packets count in TxPackets
	RxGROMessages      uint64 // coalesced datagrams received (UDPOptions.GRO) that held more than one packet
	RxBusyPolls        uint64 // receives that found the socket empty and spun (UDPOptions.BusyPoll)
	RxBusyPollHits     uint64 // of those, the ones that found data before the spin ended
	RxBusyPollSkips    uint64 // empty receives that did not spin: they followed a run of packets (a pipelining peer)
	RxICRCWaived       uint64 // accepted without an ICRC check: the receiving QP waived it (ICRCWaiver)
}

// Errors returned by Send.
var (
	// ErrPacketSize: the packet's length (Len) or len(Buf) is outside [MinPacket, MaxPacket].
	ErrPacketSize = errors.New("link: packet length out of range")
	// ErrAddress: the destination (or chosen source) address is invalid, of the wrong family
	// for the link, or no source address could be chosen for a wildcard-bound link.
	ErrAddress = errors.New("link: bad address")
	// ErrBufferTooSmall: a Recv buffer has capacity < MaxPacket.
	ErrBufferTooSmall = errors.New("link: receive buffer capacity below MaxPacket")
	// ErrPayloadRef: a packet's Payload is set where it cannot be: on a link that does not
	// send payloads by reference, without NoICRC, or of a length that is no multiple of 4.
	ErrPayloadRef = errors.New("link: payload by reference not possible")
)

// counters are updated with sync/atomic and read by Stats.
type counters struct {
	txPackets, txBytes, rxPackets, rxBytes atomic.Uint64
	rxICRC, rxMalformed, rxQueue, txErrors atomic.Uint64
	txGSO, rxGRO                           atomic.Uint64
	rxSpins, rxSpinHits, rxSpinSkips       atomic.Uint64
	rxWaived                               atomic.Uint64
	// waive is ICRCWaiver's predicate (nil: none).
	waive atomic.Pointer[func(destQPN uint32) bool]
}

func (c *counters) snapshot() Stats {
	return Stats{
		TxPackets: c.txPackets.Load(), TxBytes: c.txBytes.Load(),
		RxPackets: c.rxPackets.Load(), RxBytes: c.rxBytes.Load(),
		RxICRCDrops: c.rxICRC.Load(), RxMalformedDrops: c.rxMalformed.Load(),
		RxQueueDrops: c.rxQueue.Load(), TxErrors: c.txErrors.Load(),
		TxGSOMessages: c.txGSO.Load(), RxGROMessages: c.rxGRO.Load(),
		RxBusyPolls: c.rxSpins.Load(), RxBusyPollHits: c.rxSpinHits.Load(), RxBusyPollSkips: c.rxSpinSkips.Load(),
		RxICRCWaived: c.rxWaived.Load(),
	}
}

// checkRx verifies a received datagram: length, ICRC, then wire.Parse (so that any corruption
// counts as an ICRC drop, as in rxe where the ICRC is checked last but never passes corruption). For IPv4 the
// sender's Identification is unknown and recovered from the ICRC (DF, offset 0 assumed); for
// IPv6 the ICRC is verified directly. It returns false after counting the drop.
func (c *counters) checkRx(e *wire.Encap, buf []byte) bool {
	if len(buf) < MinPacket || len(buf) > MaxPacket {
		c.rxMalformed.Add(1)
		return false
	}
	if !e.Valid() {
		c.rxMalformed.Add(1)
		return false
	}
	if c.waived(buf) {
		e.IPv4ID = 0
	} else if e.Is4() {
		id, ok := e.RecoverIPv4ID(buf)
		if !ok {
			c.rxICRC.Add(1)
			return false
		}
		e.IPv4ID = id
	} else if !e.VerifyICRC(buf) {
		c.rxICRC.Add(1)
		return false
	}
	if _, err := wire.Parse(buf); err != nil {
		c.rxMalformed.Add(1)
		return false
	}
	return true
}

// waived reports whether buf (at least MinPacket bytes) comes without an ICRC to a QP that
// waived it (ICRCWaiver), counting it.
func (c *counters) waived(buf []byte) bool {
	f := c.waive.Load()
	if f == nil || binary.BigEndian.Uint32(buf[len(buf)-4:]) != 0 {
		return false
	}
	if !(*f)(wire.BTH(buf).DestQP()) {
		return false
	}
	c.rxWaived.Add(1)
	return true
}

func (c *counters) setWaiver(f func(destQPN uint32) bool) {
	if f == nil {
		c.waive.Store(nil)
		return
	}
	c.waive.Store(&f)
}

// recvInto checks the buffers of a Recv against the contract both links keep: every one can
// hold MaxPacket bytes (else ErrBufferTooSmall). It reports whether there is any to fill.
func recvInto(pkts []Packet) (bool, error) {
	for i := range pkts {
		if cap(pkts[i].Buf) < MaxPacket {
			return false, ErrBufferTooSmall
		}
	}
	return len(pkts) > 0, nil
}
