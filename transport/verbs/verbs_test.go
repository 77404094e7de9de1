//go:build verbs && linux && cgo

package verbs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/transporttest"
)

// The tests need an RDMA device with a RoCEv2 GID (kernel rxe in the interop guest: make
// test-verbs). SRPD_VERBS_DEVICE picks the device (default: the first one libibverbs lists),
// SRPD_VERBS_ADDR the address (default: its first IPv4 RoCEv2 GID). Without a device every test
// skips, loudly: the skip is also printed on stderr.

var skipOnce sync.Once

func skipNoDevice(t *testing.T, why string) {
	t.Helper()
	msg := "SKIPPED: no usable RDMA device for transport/verbs: " + why
	skipOnce.Do(func() { fmt.Fprintln(os.Stderr, "transport/verbs: "+msg) })
	t.Skip(msg)
}

// testDevice opens the test device and its address.
func testDevice(t *testing.T) (*Device, netip.Addr) {
	t.Helper()
	name := os.Getenv("SRPD_VERBS_DEVICE")
	if name == "" {
		names, err := DeviceNames()
		if err != nil || len(names) == 0 {
			skipNoDevice(t, fmt.Sprintf("ibv_get_device_list: %v (devices %v)", err, names))
		}
		name = names[0]
	}
	d, err := Open(name, Config{})
	if err != nil {
		skipNoDevice(t, err.Error())
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Close(ctx); err != nil && !errors.Is(err, transport.ErrClosed) {
			t.Errorf("close %s: %v", name, err)
		}
	})
	var addr netip.Addr
	if s := os.Getenv("SRPD_VERBS_ADDR"); s != "" {
		addr = netip.MustParseAddr(s)
	} else {
		for _, a := range d.Addrs() {
			if a.Addr().Is4() {
				addr = a.Addr()
				break
			}
		}
	}
	if !addr.IsValid() {
		skipNoDevice(t, fmt.Sprintf("%s has no IPv4 RoCEv2 GID (addrs %v)", name, d.Addrs()))
	}
	return d, addr
}

// loopback: both endpoints on one device (rxe loops packets to its own address back).
func loopback(t *testing.T) transporttest.Pair {
	d, addr := testDevice(t)
	ep := transporttest.Endpoint{Dev: d, Addr: addr}
	return transporttest.Pair{A: ep, B: ep}
}

func TestConformance(t *testing.T) {
	transporttest.RunConfig(t, loopback, transporttest.Config{
		MTUs: []transport.MTU{transport.MTU256, transport.MTU1024},
	})
}

func TestDeviceNamesAndAttr(t *testing.T) {
	d, addr := testDevice(t)
	names, err := DeviceNames()
	if err != nil || len(names) == 0 {
		t.Fatalf("DeviceNames: %v, %v", names, err)
	}
	a := d.Attr()
	t.Logf("%s (%v): %d QPs, %d WRs, %d SGEs, inline %d, MTU %v/%v, fast-reg pages %d, page size cap %#x",
		d.Name(), addr, a.MaxQP, a.MaxQPWR, a.MaxSGE, a.MaxInlineData, a.ActiveMTU, a.MaxMTU, a.MaxMRPages, a.PageSizeCap)
	t.Logf("GIDs %v", d.GIDs())
}

func TestModifyAVRefusesOtherUDPPort(t *testing.T) {
	d, addr := testDevice(t)
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	cq, err := d.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Close()
	qp, err := pd.CreateQP(transport.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: transport.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	if err := qp.Modify(&transport.QPAttr{State: transport.QPSInit, Port: 1}, transport.AttrState|transport.AttrPKeyIndex|transport.AttrPort|transport.AttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	err = qp.Modify(&transport.QPAttr{State: transport.QPSRTR, PathMTU: transport.MTU1024, DestQPN: 5, MaxDestRdAtomic: 1,
		AV: transport.AddressVector{SrcAddr: addr, DstAddr: addr, DstPort: 5000}},
		transport.AttrState|transport.AttrAV|transport.AttrPathMTU|transport.AttrDestQPN|transport.AttrRQPSN|transport.AttrMaxDestRdAtomic|transport.AttrMinRNRTimer)
	var me *transport.ModifyError
	if !errors.As(err, &me) || !errors.Is(err, transport.ErrInvalidAttr) || me.Attrs != transport.AttrAV {
		t.Fatalf("AV with UDP port 5000: %v", err)
	}
}

// A REG_MR the memory-window route cannot carry (scattered pages) is refused at post time with
// ErrNotSupported, and nothing is posted.
func TestFastRegScatteredPagesRefused(t *testing.T) {
	d, _ := testDevice(t)
	if d.Attr().MaxMRPages == 0 {
		t.Skip("SKIPPED: no type-2 memory windows")
	}
	pd, _ := d.AllocPD()
	defer pd.Close()
	cq, _ := d.CreateCQ(16)
	defer cq.Close()
	mem, _ := d.AllocMemory(1 << 16)
	defer mem.Free()
	fr, err := pd.AllocFastRegMR(4)
	if err != nil {
		t.Fatal(err)
	}
	defer fr.Close()
	q, _ := pd.CreateQP(transport.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: transport.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	defer q.Close()
	qq := q.(*qp)
	qq.mu.Lock()
	qq.state = transport.QPSRTS // validation only: nothing reaches the device
	qq.mu.Unlock()
	base := mem.Addr()
	err = q.PostSend([]transport.SendWR{{Opcode: transport.WRRegMR, Reg: transport.RegMRWR{MR: fr, Key: fr.RKey()&^0xFF | (fr.RKey()+1)&0xFF,
		Access: transport.AccessRemoteRead, IOVA: base, Length: 8192, PageSize: 4096, Pages: []uint64{base, base + 3*4096}}}})
	if !errors.Is(err, transport.ErrNotSupported) {
		t.Fatalf("scattered page list: %v", err)
	}
	if q.SendQueueFree() != 4 {
		t.Fatalf("free %d", q.SendQueueFree())
	}
	qq.mu.Lock()
	qq.state = transport.QPSReset
	qq.mu.Unlock()
}
