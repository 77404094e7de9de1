package cm

import (
	"math/bits"
	"time"
)

// TimeoutDuration converts an IBA time exponent (4.096 µs × 2^t) to the duration the kernel CM
// uses: cm.c cm_convert_to_ms, 2^max(t-8, 0) ms. TimeoutDuration(20) = 4.096 s.
func TimeoutDuration(t uint8) time.Duration {
	if t > 31 {
		t = 31
	}
	s := int(t) - 8
	if s < 0 {
		s = 0
	}
	return time.Millisecond << s
}

// AckTimeout is cm.c cm_ack_timeout: the local ACK timeout exponent for a path with the given
// packet life time towards a CA with the given ACK delay (4.096 µs × 2^ack = 4.096 µs × 2^delay
// + 2 × 4.096 µs × 2^life, rounded as the kernel does), at most 31.
func AckTimeout(caAckDelay, packetLifeTime uint8) uint8 {
	t := int(packetLifeTime) + 1
	d := int(caAckDelay)
	if t >= d {
		if d >= t-1 {
			t++
		}
	} else {
		if t >= d-1 {
			t = d + 1
		} else {
			t = d
		}
	}
	if t > 31 {
		t = 31
	}
	return uint8(t)
}

// TID forms a transaction ID the way cm.c cm_form_tid does on a little-endian host (x86, where
// the captures come from): (MAD agent hi_tid << 32) | low, where low is the __be32 local comm
// ID reinterpreted as a host-order u32, i.e. byte-swapped. Comm ID 0x29dd3287 with hi_tid 2
// gives 0x000000028732dd29, as in testdata/srp-rdma-cm-login-io.pcap.
func TID(hiTID, localCommID uint32) uint64 {
	return uint64(hiTID)<<32 | uint64(bits.ReverseBytes32(localCommID))
}
