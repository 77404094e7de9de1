package softroce_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
)

// TestCQSlotsReused: MaxCQ bounds the CQs open at once, not the CQs a device creates in its
// life. A closed CQ gave its slot back only on Device.Close, so a target with login churn
// failed every new channel after 65,536 (found by the initiator's FuzzChannelIUs).
func TestCQSlotsReused(t *testing.T) {
	la, lb := link.NewPipe(netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"), link.PipeConfig{})
	defer lb.Close()
	d := openDev(t, la, "cqs")
	max := d.Attr().MaxCQ
	open := make([]transport.CQ, 0, max)
	for len(open) < max {
		cq, err := d.CreateCQ(1)
		if err != nil {
			t.Fatalf("CQ %d of %d: %v", len(open)+1, max, err)
		}
		open = append(open, cq)
	}
	if _, err := d.CreateCQ(1); !errors.Is(err, transport.ErrNoResources) {
		t.Fatalf("CQ beyond MaxCQ: %v, want ErrNoResources", err)
	}
	for _, cq := range open {
		if err := cq.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := open[0].Close(); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("second close: %v", err) // and it must not free a slot twice
	}
	for i := 0; i < max+10; i++ {
		cq, err := d.CreateCQ(1)
		if err != nil {
			t.Fatalf("CQ %d after closing all: %v", i, err)
		}
		open[i%max] = cq
		if err := cq.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
