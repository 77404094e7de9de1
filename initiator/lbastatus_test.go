package initiator

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/srpd/srpd/initiator/nbd"
	"github.com/srpd/srpd/target"
	"github.com/srpd/srpd/transport/softroce/link"
)

// TestProvisioning: GET LBA STATUS through a real target's RAM LUN (allocated in 64 KiB
// chunks as written): written stretches are mapped, the rest deallocated and reading as zero.
func TestProvisioning(t *testing.T) {
	e := newRealEnv(t, false, link.PipeConfig{}, target.Limits{}, 1, 16<<20)
	s := e.dial(e.config())
	l := s.LUNs()[0]
	if !l.Info().Provisioning {
		t.Fatal("the RAM LUN does not report logical block provisioning (LBPME)")
	}
	ctx := ctxT(t, 10*time.Second)
	data := make([]byte, 128<<10)
	for i := range data {
		data[i] = byte(i) | 1
	}
	for _, off := range []int64{1 << 20, 4 << 20} {
		if err := l.WriteAt(ctx, data, off, false); err != nil {
			t.Fatal(err)
		}
	}
	runs, err := l.Provisioning(ctx, 0, l.Size())
	if err != nil {
		t.Fatal(err)
	}
	want := []Run{
		{Off: 0, Len: 1 << 20, Deallocated: true, Zero: true},
		{Off: 1 << 20, Len: 128 << 10},
		{Off: 1<<20 + 128<<10, Len: 3<<20 - 128<<10, Deallocated: true, Zero: true},
		{Off: 4 << 20, Len: 128 << 10},
		{Off: 4<<20 + 128<<10, Len: 12<<20 - 128<<10, Deallocated: true, Zero: true},
	}
	if fmt.Sprint(runs) != fmt.Sprint(want) {
		t.Fatalf("runs\n %+v\nwant\n %+v", runs, want)
	}
	// A window inside: cut to the request, starting at its offset.
	runs, err = l.Provisioning(ctx, 1<<20+64<<10, 128<<10)
	if err != nil {
		t.Fatal(err)
	}
	if want := []Run{{Off: 1<<20 + 64<<10, Len: 64 << 10}, {Off: 1<<20 + 128<<10, Len: 64 << 10, Deallocated: true, Zero: true}}; fmt.Sprint(runs) != fmt.Sprint(want) {
		t.Fatalf("window: %+v, want %+v", runs, want)
	}
	if _, err := l.Provisioning(ctx, 1, 512); err == nil {
		t.Fatal("an unaligned offset was accepted")
	}
}

// TestNBDMapShowsHoles: nbdinfo --map over the NBD export of a LUN shows what GET LBA STATUS
// says: data where it was written, holes elsewhere.
func TestNBDMapShowsHoles(t *testing.T) {
	needTool(t, "nbdinfo")
	e := newRealEnv(t, false, link.PipeConfig{}, target.Limits{}, 1, 16<<20)
	s := e.dial(e.config())
	l := s.LUNs()[0]
	if err := l.WriteAt(ctxT(t, 10*time.Second), make([]byte, 64<<10), 2<<20, false); err != nil {
		t.Fatal(err)
	}
	srv, err := nbd.NewServer(nbd.Config{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddExport("lun0", NBDDevice(l), nbd.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	sock := serveUnix(t, srv)
	out := runTool(t, "nbdinfo", "--map", "--json", fmt.Sprintf("nbd+unix:///lun0?socket=%s", sock))
	var m []struct {
		Offset, Length int64
		Type           int
		Description    string
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("nbdinfo --map --json: %v\n%s", err, out)
	}
	// Written zeroes are data (allocated) even though they read as zero.
	type ext struct {
		off, n int64
		hole   bool
	}
	var got []ext
	for _, x := range m {
		got = append(got, ext{x.Offset, x.Length, x.Type&1 != 0})
	}
	want := []ext{{0, 2 << 20, true}, {2 << 20, 64 << 10, false}, {2<<20 + 64<<10, 14<<20 - 64<<10, true}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("nbdinfo --map: %+v, want %+v\n%s", got, want, out)
	}
}
