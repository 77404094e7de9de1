package nbd

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

// plugRAM is an asyncRAM that is also a PostBatcher: it records the order of BeginPosts (B),
// posts (P, p outside any bracket) and EndPosts (E).
type plugRAM struct {
	*asyncRAM
	mu    sync.Mutex
	open  int
	trace strings.Builder
}

func (d *plugRAM) note(c byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch c {
	case 'B':
		d.open++
	case 'E':
		d.open--
	case 'P':
		if d.open == 0 {
			c = 'p'
		}
	}
	d.trace.WriteByte(c)
}

func (d *plugRAM) BeginPosts() { d.note('B') }
func (d *plugRAM) EndPosts()   { d.note('E') }

func (d *plugRAM) ReadAtAsync(ctx context.Context, p []byte, off int64, done func(error)) {
	d.note('P')
	d.asyncRAM.ReadAtAsync(ctx, p, off, done)
}

func (d *plugRAM) WriteAtAsync(ctx context.Context, p []byte, off int64, fua bool, done func(error)) {
	d.note('P')
	d.asyncRAM.WriteAtAsync(ctx, p, off, fua, done)
}

func (d *plugRAM) reset() {
	d.mu.Lock()
	d.trace.Reset()
	d.mu.Unlock()
}

func (d *plugRAM) state() (string, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.trace.String(), d.open
}

// TestPostBatchBrackets: the requests of one read are posted inside one BeginPosts/EndPosts
// bracket that ends after the last of them; a lone request is posted without one; and the
// reader never waits for the client with a bracket open (a WRITE whose payload is still on its
// way).
func TestPostBatchBrackets(t *testing.T) {
	const n, size = 16, 4096
	disk := newRAM(testSize, testBS)
	disk.fill(0, pattern(5, testSize))
	dev := &plugRAM{asyncRAM: newAsyncRAM(t, disk)}
	ts := startServer(t, Config{}, map[string]Device{"disk": dev})
	c := dialUnix(t, ts.sock)
	c.connect("disk", false)
	c.nc.SetDeadline(time.Now().Add(10 * time.Second))

	c.write(readBurst(c, n, size, 5))
	for i := 0; i < n; i++ {
		r := c.mustReply()
		if r.errno != 0 || !bytes.Equal(r.data, disk.snapshot(int64(r.handle*size*5%testSize), size)) {
			t.Fatalf("reply %d: errno %v or wrong data", r.handle, r.errno)
		}
	}
	if tr, open := dev.state(); tr != "B"+strings.Repeat("P", n)+"E" || open != 0 {
		t.Fatalf("one read of %d requests: posts %q (%d brackets open), want them all in one bracket", n, tr, open)
	}

	// One request alone: no bracket.
	dev.reset()
	c.mu.Lock()
	c.pending[100] = size
	c.mu.Unlock()
	c.write(encodeRequest(cmdRead, 0, 100, 0, size, nil))
	if r := c.mustReply(); r.errno != 0 {
		t.Fatal(r.errno)
	}
	if tr, _ := dev.state(); tr != "p" {
		t.Fatalf("a lone request: posts %q, want one outside any bracket", tr)
	}

	// A READ followed by a WRITE whose payload has not all arrived: the READ is posted in a
	// bracket (the WRITE's header is buffered) and the bracket ends before the reader waits
	// for the rest of the payload.
	dev.reset()
	payload := pattern(9, size)
	c.mu.Lock()
	c.pending[101] = size
	c.pending[102] = 0
	c.mu.Unlock()
	wr := encodeRequest(cmdWrite, 0, 102, 8*size, size, payload)
	c.write(append(encodeRequest(cmdRead, 0, 101, 0, size, nil), wr[:len(wr)-size/2]...))
	waitFor(t, "the READ posted and its bracket ended", func() bool {
		tr, open := dev.state()
		return tr == "BPE" && open == 0
	})
	c.write(wr[len(wr)-size/2:])
	for i := 0; i < 2; i++ {
		if r := c.mustReply(); r.errno != 0 {
			t.Fatal(r.errno)
		}
	}
	if tr, open := dev.state(); tr != "BPEp" || open != 0 {
		t.Fatalf("posts %q (%d open), want BPEp", tr, open)
	}
	if !bytes.Equal(disk.snapshot(8*size, size), payload) {
		t.Fatal("the WRITE's data is not on the disk")
	}
}
