package scsi

import (
	"errors"
	"testing"

	"github.com/srpd/srpd/internal/fuzzbound"
)

// senseSeeds are sense data a target may send: well-formed fixed and descriptor format from
// this package's encoders, deferred codes, truncated ones, a huge additional length and
// descriptor lists that overrun the additional length.
func senseSeeds() [][]byte {
	var seeds [][]byte
	for _, s := range []Sense{invalidCDB(10, 7), invalidParam(300, -1), miscompare(0x1234), readError(1 << 40),
		uaModeChanged.sense(), senseNotReady} {
		var b [MaxSenseLen]byte
		seeds = append(seeds, append([]byte(nil), b[:s.EncodeFixed(b[:])]...))
		seeds = append(seeds, append([]byte(nil), b[:s.EncodeDescriptor(b[:])]...))
	}
	seeds = append(seeds,
		nil,
		[]byte{0x71, 0, 3, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x11},               // deferred fixed, truncated
		[]byte{0x73, 5, 0x24, 0, 0, 0, 0, 8, 2, 6, 0, 0, 0xCF},             // deferred descriptor, truncated
		[]byte{0x70, 0, 5, 0, 0, 0, 0, 0xFF, 0, 0, 0, 0, 0x24, 0, 0, 0xC0}, // additional length 255
		[]byte{0x72, 5, 0x24, 0, 0, 0, 0, 4, 2, 6, 0, 0, 0xCF, 0, 10, 0},   // descriptor beyond the additional length
		[]byte{0x72, 5, 0x24, 0, 0, 0, 0, 9, 0, 0x0A, 0x80},                // descriptor cut short
		[]byte{0x72, 5, 0x24, 0, 0, 0, 0, 3, 0},                            // one byte of a descriptor header
		[]byte{0x7F, 0, 0, 0, 0, 0, 0, 0},                                  // vendor specific code
	)
	return seeds
}

// normSense is s as an encoder would reproduce it: fields ParseSense decodes but flags as
// not meaningful are dropped.
func normSense(s Sense) Sense {
	s.Deferred = false
	if !s.InfoValid {
		s.Info = 0
	}
	if !s.Field.Valid {
		s.Field = FieldPointer{}
	}
	if !s.Field.BitValid {
		s.Field.Bit = 0
	}
	return s
}

// FuzzParseSense decodes arbitrary bytes as sense data. Invariants: no panic; only the
// package's sentinel errors; a key within 4 bits; what decodes survives a descriptor-format
// round trip unchanged; and truncation keeps ParseSense's promise: sense data cut anywhere
// after the 8-byte header decodes without error, to the same key, ASC and ASCQ as the whole
// where the cut keeps them.
func FuzzParseSense(f *testing.F) {
	for _, s := range senseSeeds() {
		f.Add(s)
	}
	fuzzbound.Fuzz(f, func(t *testing.T, b []byte) {
		s, err := ParseSense(b)
		if err != nil {
			if !errors.Is(err, ErrSenseTooShort) && !errors.Is(err, ErrSenseCode) && !errors.Is(err, ErrSenseDescriptors) {
				t.Errorf("untyped error %v", err)
			}
			return
		}
		if s.Key > 0x0F {
			t.Errorf("key %#x", uint8(s.Key))
		}
		if s.Field.Valid && s.Key != IllegalRequest {
			t.Errorf("field pointer with key %v", s.Key)
		}
		var enc [MaxSenseLen]byte
		n := s.EncodeDescriptor(enc[:])
		back, err := ParseSense(enc[:n])
		if err != nil {
			t.Errorf("re-encoded % x: %v", enc[:n], err)
			return
		}
		if normSense(back) != normSense(s) {
			t.Errorf("round trip %+v -> %+v", s, back)
		}
		for k := 8; k < len(b); k++ {
			p, err := ParseSense(b[:k])
			if err != nil {
				t.Errorf("prefix of %d bytes: %v (whole: %v)", k, err, s)
				return
			}
			// The key is in the header of both formats; ASC and ASCQ are bytes 12-13 of
			// fixed format, 2-3 of descriptor format.
			whole := b[0]&0x7F >= SenseDescriptorCurrent || k >= 14
			if p.Key != s.Key || whole && (p.ASC != s.ASC || p.ASCQ != s.ASCQ) {
				t.Errorf("prefix of %d bytes: %v, whole: %v", k, p, s)
				return
			}
		}
	})
}

// TestParseSenseTruncated: sense data cut by the transfer decodes as far as it goes wherever
// the cut falls (inside a descriptor's header as inside its body); a descriptor list that
// overruns the additional length of complete sense data is malformed.
func TestParseSenseTruncated(t *testing.T) {
	full := []byte{0x72, 5, 0x24, 0, 0, 0, 0, 8, 2, 6, 0, 0, 0xCF, 0, 10, 0}
	cases := []struct {
		name string
		b    []byte
		err  error
	}{
		{"whole", full, nil},
		{"cut in descriptor header", full[:9], nil},
		{"cut in descriptor body", full[:12], nil},
		{"header only", full[:8], nil},
		{"descriptor overruns additional length", []byte{0x72, 5, 0x24, 0, 0, 0, 0, 4, 2, 6, 0, 0, 0xCF, 0, 10, 0}, ErrSenseDescriptors},
		{"one byte left in additional length", []byte{0x72, 5, 0x24, 0, 0, 0, 0, 1, 0}, ErrSenseDescriptors},
		{"too short", full[:7], ErrSenseTooShort},
	}
	for _, c := range cases {
		s, err := ParseSense(c.b)
		if !errors.Is(err, c.err) || c.err == nil && err != nil {
			t.Errorf("%s: error %v, want %v", c.name, err, c.err)
			continue
		}
		if c.err != ErrSenseTooShort && !s.Match(IllegalRequest, 0x24, 0) {
			t.Errorf("%s: %v", c.name, s)
		}
	}
}
