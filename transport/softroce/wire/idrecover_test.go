package wire

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

func mulX(v uint32) uint32 {
	if v&1 != 0 {
		return v>>1 ^ crcPolyReflected
	}
	return v >> 1
}

func TestGF(t *testing.T) {
	one := uint32(1) << 31
	for _, v := range []uint32{one, 0x12345678, 0xFFFFFFFF, 1} {
		if mulX(mulInvX(v)) != v || mulInvX(mulX(v)) != v {
			t.Fatalf("x * x^-1 != 1 for %#x", v)
		}
		if gfMul(v, one) != v || gfMul(one, v) != v {
			t.Fatal("1 is not the identity")
		}
	}
	// x^-(8k) tables against repeated inverse shifts.
	v := one
	for k := 0; k < 600; k++ {
		if xInvBytes(k) != v {
			t.Fatalf("xInvBytes(%d)", k)
		}
		for range 8 {
			v = mulInvX(v)
		}
	}
}

// TestRecoverDetectionClasses proves the strength claims in idrecover.go for every packet length
// up to 4160 bytes (link.MaxPacket: every IB MTU).
//
// In codeword coordinates (message followed by the 32 ICRC bits) a bit with K bits after it
// contributes x^K to the syndrome; the ID's lowest bit sits at K0 = 8*N+32 (N = len(pkt)+18
// bytes after the ID). Recovery computes y = syndrome * x^-K0 and accepts iff the coefficients of
// x^16..x^31 of y (the low 16 bits in the reflected representation) are zero. A burst e(x)
// (deg < b) at K = K0+d contributes e(x)*x^d; some non-zero pattern goes undetected iff the
// 16 x b matrix with columns high16(x^(d+i)), i < b, has rank < b. Positions depend only on d,
// so checking the d range of the longest packet covers all shorter ones.
func TestRecoverDetectionClasses(t *testing.T) {
	const maxLen = 4160
	dMin := -(8*(maxLen+18) + 32) // last ICRC bit of the longest packet
	const dMax = 8*12 + 15        // first bit of the 8x0xFF prefix, 12 bytes before the ID
	v := uint32(1) << 31
	for range -dMin {
		v = mulInvX(v)
	}
	pow := make([]uint32, 0, dMax-dMin+17) // pow[d-dMin] = x^d
	for d := dMin; d <= dMax+16; d++ {
		pow = append(pow, v)
		v = mulX(v)
	}
	high := func(d int) uint16 { return uint16(pow[d-dMin]) }
	// The ID field itself is exactly the invisible subspace.
	for i := range 16 {
		if high(i) != 0 {
			t.Fatal("ID bit visible")
		}
	}
	// Bursts of 1..3 bits not wholly inside the ID field: always detected. (A burst overlapping
	// the ID field differs from an ID change by bits outside it, within a 32-bit window, which
	// CRC-32 always detects; the loop checks those positions too.)
	for b := 1; b <= 3; b++ {
		for d := dMin; d <= dMax; d++ {
			if d >= 0 && d+b <= 16 {
				continue // wholly inside the ID
			}
			var m [16]uint16
			for i := 0; i < b; i++ {
				if d+i >= 0 && d+i < 16 {
					continue // this bit is inside the ID: only the outside bits must be visible
				}
				m[i] = high(d + i)
			}
			want := 0
			for i := 0; i < b; i++ {
				if d+i < 0 || d+i >= 16 {
					want++
				}
			}
			if rank16(m) != want {
				t.Fatalf("a %d-bit burst at d=%d can pass as an ID change", b, d)
			}
		}
	}
	// Double-bit errors at any distance: undetected iff both bits have the same high16 value.
	cnt := map[uint16]int{}
	n := 0
	for d := dMin; d <= dMax; d++ {
		if d >= 0 && d < 16 {
			continue
		}
		cnt[high(d)]++
		n++
	}
	pairs := 0
	for _, c := range cnt {
		pairs += c * (c - 1) / 2
	}
	frac := float64(pairs) / (float64(n) * float64(n-1) / 2)
	if frac > 4.0/65536 {
		t.Fatalf("double-bit miss rate %.2e, more than 4 * 2^-16", frac)
	}
	t.Logf("%d bit positions: all errors within 3 consecutive bits detected; %d of %d double-bit error position pairs undetected (%.2e, 2^-16 = %.2e)",
		n, pairs, n*(n-1)/2, frac, 1.0/65536)
}

func rank16(m [16]uint16) int {
	r := 0
	for bit := 15; bit >= 0; bit-- {
		p := -1
		for i := r; i < 16; i++ {
			if m[i]>>bit&1 != 0 {
				p = i
				break
			}
		}
		if p < 0 {
			continue
		}
		m[r], m[p] = m[p], m[r]
		for i := range 16 {
			if i != r && m[i]>>bit&1 != 0 {
				m[i] ^= m[r]
			}
		}
		r++
	}
	return r
}

// TestRecoverFalseAcceptRate: random corruptions pass ID recovery with probability ~2^-16.
func TestRecoverFalseAcceptRate(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	e := Encap{Src: netip.MustParseAddrPort("10.0.0.1:49152"), Dst: netip.MustParseAddrPort("10.0.0.2:4791")}
	p, _ := Layout(make([]byte, 64), RCSendOnly, 32)
	e.PutICRC(p.Bytes())
	rng := rand.New(rand.NewPCG(1, 2))
	const trials = 1 << 18
	pass := 0
	buf := make([]byte, p.Len())
	for range trials {
		copy(buf, p.Bytes())
		// Random multi-byte corruption (3 random bytes XORed with random non-zero values),
		// avoiding BTH byte 4, which the ICRC masks.
		for range 3 {
			k := rng.IntN(len(buf) - 1)
			if k >= 4 {
				k++
			}
			buf[k] ^= byte(rng.IntN(255) + 1)
		}
		if _, ok := e.RecoverIPv4ID(buf); ok {
			pass++
		}
	}
	// Expected trials/65536 = 4; allow a wide margin (P[X > 20] is negligible).
	if pass > 20 {
		t.Fatalf("%d of %d corrupted packets accepted", pass, trials)
	}
	t.Logf("%d of %d random corruptions accepted (expected about %d = trials/2^16)", pass, trials, trials>>16)
	// Single-bit errors anywhere (but BTH byte 4) are always detected.
	for i := 0; i < len(buf)*8; i++ {
		if i/8 == 4 {
			continue
		}
		copy(buf, p.Bytes())
		buf[i/8] ^= 1 << (i % 8)
		if _, ok := e.RecoverIPv4ID(buf); ok {
			t.Fatalf("single-bit error at %d accepted", i)
		}
	}
}
