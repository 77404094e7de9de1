package wire

// PSN is a 24-bit InfiniBand packet sequence number. All arithmetic wraps modulo 2^24.
// Comparison follows rxe's psn_compare (torvalds/linux:drivers/infiniband/sw/rxe/rxe_hdr.h
// and rxe.h): a is before b iff ((a-b) << 8), taken as a signed 32-bit integer, is negative,
// i.e. PSNs within 2^23 of each other compare by their modular distance.
type PSN uint32

// PSNMask masks a value to 24 bits.
const PSNMask = 1<<24 - 1

// Add returns p+n modulo 2^24.
func (p PSN) Add(n uint32) PSN { return (p + PSN(n)) & PSNMask }

// Inc returns p+1 modulo 2^24.
func (p PSN) Inc() PSN { return (p + 1) & PSNMask }

// Sub returns the signed distance p-q in [-2^23, 2^23): positive if p is after q.
func (p PSN) Sub(q PSN) int32 { return int32(uint32(p-q)<<8) >> 8 }

// Compare returns -1 if p is before q, 0 if equal (modulo 2^24), +1 if p is after q.
func (p PSN) Compare(q PSN) int {
	d := int32(uint32(p-q) << 8)
	switch {
	case d < 0:
		return -1
	case d > 0:
		return 1
	}
	return 0
}

// Less reports whether p is before q.
func (p PSN) Less(q PSN) bool { return int32(uint32(p-q)<<8) < 0 }

// LessEq reports whether p is before or equal to q.
func (p PSN) LessEq(q PSN) bool { return int32(uint32(p-q)<<8) <= 0 }

// Valid reports whether p fits in 24 bits.
func (p PSN) Valid() bool { return p <= PSNMask }
