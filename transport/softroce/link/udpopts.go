package link

import "time"

// UDPOptions configures ListenUDP (Linux only; elsewhere ListenUDP returns
// errors.ErrUnsupported). The zero value is the default.
type UDPOptions struct {
	// BatchSize is the number of datagrams per recvmmsg/sendmmsg (default 32, max 1024).
	BatchSize int
	// TTL is the IPv4 TTL / IPv6 hop limit of sent packets (default 64, what rxe uses with the
	// default ip_default_ttl). It is masked out of the ICRC.
	TTL int
	// SocketBuffer is the SO_RCVBUF/SO_SNDBUF size in bytes (default 4 MiB; SO_*BUFFORCE is
	// tried first so that root is not limited by net.core.[rw]mem_max).
	SocketBuffer int
	// GRO enables UDP_GRO where the kernel has it (Linux >= 5.0): the kernel may hand over
	// several same-flow, same-size datagrams coalesced in one buffer, which Recv splits by the
	// gso_size it reports. Every segment is checked on its own: each carried its own IPv4
	// Identification, which the coalesced header no longer shows, and which ID recovery finds.
	// With GRO the link receives into its own 64 KiB buffers and copies each packet out (one
	// copy); without it, recvmmsg writes straight into the caller's buffers.
	GRO bool
	// GSO sends runs of consecutive packets to the same destination as one UDP GSO
	// super-packet (UDP_SEGMENT, Linux >= 4.18): one trip through the stack instead of one per
	// packet. Only for loopback destinations (127.0.0.0/8, ::1), whose receivers are processes
	// on this host, and for packets marked Packet.Segmentable (a peer that negotiated it: an
	// srpd). Each segment is an ordinary RoCEv2 packet with its own ICRC computed for IPv4
	// Identification 0; segmentation (in software, or by a NIC doing USO) numbers the segments'
	// IDs, which the ICRC covers, so a receiver must recover the ID as this link does; rxe does
	// not. On lo the super-packet reaches a UDP_GRO socket whole (Recv splits it). A capture on
	// lo shows the unsegmented super-packets, so leave GSO off where tshark is to read lo.
	GSO bool
	// BusyPoll is how long a receive that finds the socket empty keeps retrying before it
	// waits in the netpoller: a user-space version of the kernel's busy_read (SO_BUSY_POLL,
	// which spins on NIC queues and so does nothing for loopback or veth). A packet that
	// arrives during the spin costs no thread wake-up — on a small VM the wake-up of a parked
	// receive loop is tens of microseconds, most of a 4 KiB round trip — at the price of up to
	// BusyPoll of CPU per empty wait. 0: off.
	BusyPoll time.Duration
}
