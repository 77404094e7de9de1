package scsi

import (
	"bytes"
	"context"
	"testing"

	"github.com/srpd/srpd/scsi/backend"
)

// A READ offered room for views (Command.DataInViews) answers from a RAM backend with views of
// its memory holding exactly the data ReadAt gives, DataIn untouched; with too little room,
// from a backend that lends nothing, or on an error, it answers as before (no views).
func TestReadDataInViews(t *testing.T) {
	ram, err := backend.NewRAM(512*testBlocks, false)
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLUN(testConfig(), ram)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	clearUA(t, l, nexA)
	data := make([]byte, 256*512)
	for i := range data {
		data[i] = byte(i*5 + 3)
	}
	if r, _ := do(l, nexA, cdbWrite16(100, 256), data, 0); r.Status != StatusGood {
		t.Fatalf("write: %v %v", r.Status, r.Sense)
	}
	read := func(l *LUN, lba uint64, blocks uint32, room int) (Result, *Command) {
		cmd := &Command{CDB: cdbRead16(lba, blocks), Nexus: nexA, Sense: make([]byte, MaxSenseLen),
			DataIn: make([]byte, 256*512), DataInViews: make([][]byte, 0, room)}
		return l.Execute(context.Background(), cmd), cmd
	}
	// 128 KiB from LBA 90: 10 never-written blocks, then written ones, across 64 KiB chunks.
	r, cmd := read(l, 90, 256, 8)
	wantGood(t, r)
	if r.DataInViews == nil || r.DataInLen != 256*512 {
		t.Fatalf("views %d, DataInLen %d; want views of 131072 bytes", len(r.DataInViews), r.DataInLen)
	}
	var got []byte
	for _, v := range r.DataInViews {
		got = append(got, v...)
	}
	want := append(make([]byte, 10*512), data[:246*512]...)
	if !bytes.Equal(got, want) {
		t.Fatal("the views differ from the medium")
	}
	if !bytes.Equal(cmd.DataIn, make([]byte, len(cmd.DataIn))) {
		t.Fatal("DataIn written although the data went as views")
	}

	// No room for the 3 pieces: copied.
	r, cmd = read(l, 90, 256, 2)
	wantGood(t, r)
	if r.DataInViews != nil || !bytes.Equal(cmd.DataIn[:r.DataInLen], want) {
		t.Fatalf("with room for 2 views: views %d, data equal %v", len(r.DataInViews), bytes.Equal(cmd.DataIn[:r.DataInLen], want))
	}
	// Out of range: CHECK CONDITION, no views.
	r, _ = read(l, testBlocks-1, 2, 8)
	wantSense(t, r, IllegalRequest, 0x21, 0x00)
	if r.DataInViews != nil {
		t.Fatal("views with CHECK CONDITION")
	}
	// A backend that lends nothing.
	lm, _ := newTestLUN(t, testConfig())
	r, cmd = read(lm, 0, 8, 8)
	wantGood(t, r)
	if r.DataInViews != nil || r.DataInLen != 4096 {
		t.Fatalf("memBackend: views %d, DataInLen %d", len(r.DataInViews), r.DataInLen)
	}
}
