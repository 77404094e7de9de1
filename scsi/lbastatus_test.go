package scsi

import (
	"errors"
	"slices"
	"testing"
)

func TestParseLBAStatus(t *testing.T) {
	three := lbaStatus(lbaDesc(0, 10, 0), lbaDesc(10, 90, 1), lbaDesc(100, 4, 2|0xF0))
	for _, tc := range []struct {
		name string
		in   []byte
		want []LBAStatus
		err  bool
	}{
		{"three runs", three, []LBAStatus{{0, 10, LBAMapped}, {10, 90, LBADeallocated}, {100, 4, LBAAnchored}}, false},
		{"cut by the allocation length", three[:8+2*16+5], []LBAStatus{{0, 10, LBAMapped}, {10, 90, LBADeallocated}}, false},
		{"header only", lbaStatus(), nil, false},
		{"shorter than the header", three[:7], nil, true},
		{"length not 4 + 16n", func() []byte { b := slices.Clone(three); b[3] = 5; return b }(), nil, true},
		{"length below 4", func() []byte { b := slices.Clone(three); b[3] = 3; return b }(), nil, true},
		{"descending", lbaStatus(lbaDesc(100, 4, 0), lbaDesc(0, 10, 0)), nil, true},
		{"overlapping", lbaStatus(lbaDesc(0, 10, 0), lbaDesc(9, 10, 1)), nil, true},
	} {
		got, err := ParseLBAStatus(nil, tc.in)
		if (err != nil) != tc.err || (err != nil && !errors.Is(err, ErrLBAStatusData)) {
			t.Errorf("%s: error %v, want error %v (ErrLBAStatusData)", tc.name, err, tc.err)
			continue
		}
		if !tc.err && !slices.Equal(got, tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// FuzzParseLBAStatus: any parameter data decodes without panicking into at most as many
// descriptors as it holds, in ascending, non-overlapping order, or fails with ErrLBAStatusData.
func FuzzParseLBAStatus(f *testing.F) {
	f.Add(lbaStatus(lbaDesc(0, 10, 0), lbaDesc(10, 90, 1)))
	f.Add(lbaStatus())
	f.Add([]byte{0, 0, 0, 0x14, 0, 0, 0})
	f.Add(lbaStatus(lbaDesc(1<<63, 0xFFFFFFFF, 1), lbaDesc(1<<63+0xFFFFFFFF, 1, 0)))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ParseLBAStatus(nil, b)
		if err != nil {
			if !errors.Is(err, ErrLBAStatusData) {
				t.Fatalf("error %v is not ErrLBAStatusData", err)
			}
			return
		}
		if max := (len(b) - 8) / 16; len(got) > max {
			t.Fatalf("%d descriptors from %d bytes", len(got), len(b))
		}
		for i := 1; i < len(got); i++ {
			if got[i].LBA < got[i-1].LBA+uint64(got[i-1].Blocks) {
				t.Fatalf("descriptor %d overlaps: %+v", i, got)
			}
		}
	})
}
