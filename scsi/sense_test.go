package scsi

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestSenseEncoding(t *testing.T) {
	cases := []struct {
		s     Sense
		fixed []byte
		desc  []byte
	}{
		{
			s:     invalidCDB(10, 7),
			fixed: []byte{0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0xCF, 0, 10},
			desc:  []byte{0x72, 5, 0x24, 0, 0, 0, 0, 8, 2, 6, 0, 0, 0xCF, 0, 10, 0},
		},
		{
			s:     invalidParam(300, -1),
			fixed: []byte{0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x26, 0, 0, 0x80, 0x01, 0x2C},
			desc:  []byte{0x72, 5, 0x26, 0, 0, 0, 0, 8, 2, 6, 0, 0, 0x80, 0x01, 0x2C, 0},
		},
		{
			s:     miscompare(0x1234),
			fixed: []byte{0xF0, 0, 0x0E, 0, 0, 0x12, 0x34, 10, 0, 0, 0, 0, 0x1D, 0, 0, 0, 0, 0},
			desc:  []byte{0x72, 0x0E, 0x1D, 0, 0, 0, 0, 12, 0, 0x0A, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34},
		},
		{
			s:     readError(1 << 40), // does not fit fixed format: VALID clear
			fixed: []byte{0x70, 0, 3, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x11, 0, 0, 0, 0, 0},
			desc:  []byte{0x72, 3, 0x11, 0, 0, 0, 0, 12, 0, 0x0A, 0x80, 0, 0, 0, 1, 0, 0, 0, 0, 0},
		},
		{
			s:     uaModeChanged.sense(),
			fixed: []byte{0x70, 0, 6, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x2A, 1, 0, 0, 0, 0},
			desc:  []byte{0x72, 6, 0x2A, 1, 0, 0, 0, 0},
		},
	}
	for _, c := range cases {
		var b [MaxSenseLen]byte
		n := c.s.EncodeFixed(b[:])
		if !bytes.Equal(b[:n], c.fixed) {
			t.Errorf("%v fixed:\n% x\n% x", c.s, b[:n], c.fixed)
		}
		n = c.s.EncodeDescriptor(b[:])
		if !bytes.Equal(b[:n], c.desc) {
			t.Errorf("%v descriptor:\n% x\n% x", c.s, b[:n], c.desc)
		}
		for _, enc := range [][]byte{c.fixed, c.desc} {
			got, err := ParseSense(enc)
			if err != nil {
				t.Fatal(err)
			}
			want := c.s
			if enc[0] == 0x70 && want.Info > 0xFFFFFFFF {
				want.InfoValid, want.Info = false, 0
			}
			if got != want {
				t.Errorf("decode % x: %+v; want %+v", enc, got, want)
			}
		}
	}
	// truncation by a short buffer
	var b [10]byte
	if n := invalidCDB(1, 2).EncodeFixed(b[:]); n != 10 {
		t.Fatal(n)
	}
	if s, err := ParseSense(b[:]); err != nil || s.Key != IllegalRequest || s.ASC != 0 {
		t.Fatal(s, err)
	}
}

func TestParseSenseErrors(t *testing.T) {
	for _, b := range [][]byte{nil, {0x70, 0, 5}, {0x72, 5}} {
		if _, err := ParseSense(b); !errors.Is(err, ErrSenseTooShort) {
			t.Errorf("% x: %v", b, err)
		}
	}
	if _, err := ParseSense([]byte{0x7F, 0, 0, 0, 0, 0, 0, 0}); !errors.Is(err, ErrSenseCode) {
		t.Error(err)
	}
	if _, err := ParseSense([]byte{0x72, 5, 0x24, 0, 0, 0, 0, 3, 2, 6, 0}); !errors.Is(err, ErrSenseDescriptors) {
		t.Error(err)
	}
	if _, err := ParseSense([]byte{0x72, 5, 0x24, 0, 0, 0, 0, 1, 2}); !errors.Is(err, ErrSenseDescriptors) {
		t.Error(err)
	}
	// truncated by the transfer (shorter than the additional length): decoded as far as it goes
	if s, err := ParseSense([]byte{0x72, 5, 0x24, 0, 0, 0, 0, 8, 2, 6, 0}); err != nil || s.Key != IllegalRequest {
		t.Error(s, err)
	}
	if s, _ := ParseSense([]byte{0x71, 0, 3, 0, 0, 0, 0, 0}); !s.Deferred || s.Key != MediumError {
		t.Error(s)
	}
}

func TestSenseStrings(t *testing.T) {
	s := invalidCDB(2, 7).String()
	if !strings.Contains(s, "ILLEGAL REQUEST") || !strings.Contains(s, "INVALID FIELD IN CDB") || !strings.Contains(s, "CDB byte 2 bit 7") {
		t.Error(s)
	}
	if s := miscompare(5).Error(); !strings.Contains(s, "info 0x5") {
		t.Error(s)
	}
	for _, st := range []Status{StatusGood, StatusCheckCondition, StatusConditionMet, StatusBusy, StatusReservationConflict,
		StatusTaskSetFull, StatusACAActive, StatusTaskAborted, 0x77} {
		if st.String() == "" {
			t.Error(st)
		}
	}
	if SenseKey(0x10).String() == "" || TaskAttr(9).String() != "invalid" || DirOut.String() != "out" {
		t.Error("strings")
	}
}
