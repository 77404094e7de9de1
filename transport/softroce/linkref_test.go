package softroce

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/srpd/srpd/transport"
)

// mapping returns the permissions of the mapping holding host address addr ("" if none), from
// /proc/self/maps.
func mapping(t *testing.T, addr uintptr) string {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Skipf("SKIP: no /proc/self/maps: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var lo, hi uintptr
		var perms string
		if _, err := fmt.Sscanf(sc.Text(), "%x-%x %s", &lo, &hi, &perms); err == nil && lo <= addr && addr < hi {
			return perms
		}
	}
	return ""
}

func deadLen(d *Device) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ms.lock()
	defer d.ms.unlock()
	return len(d.ms.dead)
}

// Memory freed while packets that carry its bytes by reference wait to be sent (held by a post
// bracket) is not unmapped under them: its pages go at once (PROT_NONE, so nothing else can be
// mapped there and no byte of it is sent), the addresses once the packets went through the
// link; the peer gets none of its bytes, the WRITE fails when it is built again, and memory
// freed with nothing out is unmapped at once.
func TestLinkRefFreeWhileOut(t *testing.T) {
	a, b, _, _ := udpPair(t, false, false, true, nodeOpts{memSize: 4 << 20})
	defer a.close()
	defer b.close()
	if !noICRC(a) {
		t.Fatal("ICRC not waived between the two devices")
	}
	const n = 16 << 10
	alloc := func() (transport.Memory, transport.MR) {
		m, err := a.dev.AllocMemory(n)
		if err != nil {
			t.Fatal(err)
		}
		fill(m.Bytes(), 7)
		mr, err := a.pd.RegMR(m.Addr(), n, transport.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		return m, mr
	}

	// Nothing out: unmapped at once.
	m, mr := alloc()
	if err := mr.Close(); err != nil {
		t.Fatal(err)
	}
	host := uintptr(unsafe.Pointer(&m.Bytes()[0]))
	if err := m.Free(); err != nil {
		t.Fatal(err)
	}
	if k := deadLen(a.dev); k != 0 {
		t.Fatalf("freed with no packet out: %d regions kept", k)
	}
	if p := mapping(t, host); strings.HasPrefix(p, "rw") {
		t.Fatalf("freed with no packet out: still mapped %s", p)
	}

	// Four packets out, held by a bracket.
	m, mr = alloc()
	host = uintptr(unsafe.Pointer(&m.Bytes()[0]))
	clear(b.bytes(0, n))
	dropped := a.dev.Stats().Dropped
	a.dev.BeginPosts()
	mustPostSend(t, a.qp, []transport.SendWR{{ID: 9, Opcode: transport.WRRDMAWrite, Flags: transport.SendSignaled,
		SGL:        []transport.SGE{{Addr: m.Addr(), Length: n, LKey: mr.LKey()}},
		RemoteAddr: b.mem.Addr(), RKey: b.mr.RKey()}})
	if out := a.dev.ms.refOut.Load(); out != 4 {
		a.dev.EndPosts()
		t.Fatalf("16 KiB WRITE held in a bracket: %d packets out by reference, want 4", out)
	}
	if err := mr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Free(); err != nil {
		a.dev.EndPosts()
		t.Fatal(err)
	}
	k, p := deadLen(a.dev), mapping(t, host)
	a.dev.EndPosts()
	if k != 1 || p != "---p" {
		t.Fatalf("freed with 4 packets out: %d regions kept (want 1), mapping %q (want ---p: pages released, addresses reserved)", k, p)
	}
	deadline := time.Now().Add(5 * time.Second)
	for deadLen(a.dev) != 0 || a.dev.ms.refOut.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the bracket ended: %d regions kept, %d packets out", deadLen(a.dev), a.dev.ms.refOut.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if p := mapping(t, host); p == "---p" {
		t.Fatalf("after the packets went: the freed range is still reserved (%s)", p)
	}
	if d := a.dev.Stats().Dropped - dropped; d < 4 {
		t.Fatalf("packets over freed memory: %d dropped by the link's send, want 4", d)
	}
	// Go-back-N builds the WRITE again: its lkey names an MR that is gone.
	wc := waitWC(t, a.scq, 20*time.Second)
	if wc.ID != 9 || wc.Status != transport.WCLocProtErr {
		t.Fatalf("WRITE from freed memory completed %+v, want ID 9, %v", wc, transport.WCLocProtErr)
	}
	for i, c := range b.bytes(0, n) {
		if c != 0 {
			t.Fatalf("the peer's memory changed at %d: freed bytes were sent", i)
		}
	}
}
