package transport

import (
	"errors"
	"testing"
)

func TestCheckQPCap(t *testing.T) {
	a := &DeviceAttr{MaxQPWR: 64, MaxSGE: 4, MaxInlineData: 128, MaxMRPages: 8}
	c, err := a.CheckQPCap(QPCap{MaxSendWR: 64, MaxRecvWR: 1, MaxInlineData: 128})
	if err != nil || c.MaxSendSGE != 1 || c.MaxRecvSGE != 1 || c.MaxSendWR != 64 || c.MaxInlineData != 128 {
		t.Fatalf("in limits: %+v %v (SGE counts of 0 become 1)", c, err)
	}
	for _, bad := range []QPCap{
		{MaxSendWR: 0, MaxRecvWR: 1}, {MaxSendWR: 1, MaxRecvWR: 0}, {MaxSendWR: 65, MaxRecvWR: 1},
		{MaxSendWR: 1, MaxRecvWR: 65}, {MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 5},
		{MaxSendWR: 1, MaxRecvWR: 1, MaxRecvSGE: 5}, {MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: -1},
		{MaxSendWR: 1, MaxRecvWR: 1, MaxRecvSGE: -1}, {MaxSendWR: 1, MaxRecvWR: 1, MaxInlineData: 129},
		{MaxSendWR: 1, MaxRecvWR: 1, MaxInlineData: -1},
	} {
		if _, err := a.CheckQPCap(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%+v: %v, want ErrInvalidArgument", bad, err)
		}
	}
	for n, ok := range map[int]bool{-1: false, 0: false, 1: true, 8: true, 9: false} {
		if err := a.CheckFastRegPages(n); (err == nil) != ok || (err != nil && !errors.Is(err, ErrInvalidArgument)) {
			t.Errorf("fast-reg MR of %d pages: %v", n, err)
		}
	}
}
