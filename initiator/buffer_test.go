package initiator

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce/link"
)

// liveDirect counts the direct commands whose registrations are not all released yet.
func liveDirect(s *Session) int {
	n := 0
	for _, c := range s.chans {
		c.mu.Lock()
		for i := range c.reqs {
			r := &c.reqs[i]
			if r.state == reqInflight && r.direct && r.pending > 0 {
				n++
			}
		}
		c.mu.Unlock()
	}
	return n
}

// TestDirectBuffer: ReadAtAsync and WriteAtAsync on a Buffer map it directly (Stats.Direct
// counts them; an unaligned slice of it, heap memory and immediate-data writes are copied as
// before), every byte read back matches, and done runs only once the command's registrations
// are dead, so that the target can no longer reach the buffer when it is back with its owner.
// With the completion handler off, the LOCAL_INV's completion is handled by a later poll of the
// channel goroutine than the response: a command completed at its response would be seen here
// with registrations live.
func TestDirectBuffer(t *testing.T) {
	for _, noHandler := range []bool{false, true} {
		name := map[bool]string{false: "handler", true: "no-handler"}[noHandler]
		t.Run(name, func(t *testing.T) {
			e := newMemEnv(t, link.PipeConfig{}, tgtConfig{lunSize: 16 << 20})
			cfg := e.config()
			cfg.ChCount = 2
			cfg.MaxPagesPerMR = 16 // 64 KiB per MR: 256 KiB takes 4 descriptors
			cfg.NoCompletionHandler = noHandler
			s := e.dial(cfg)
			l := s.LUNs()[0]
			buf, err := s.AllocBuffer(1 << 20)
			if err != nil {
				t.Fatal(err)
			}
			mem := buf.Bytes()
			rng := rand.New(rand.NewPCG(7, 8))
			want := make([]byte, 4<<20) // what the LUN's first 4 MiB hold
			if err := l.WriteAt(ctxT(t, 10*time.Second), want, 0, false); err != nil {
				t.Fatal(err)
			}
			ctx := ctxT(t, time.Minute)
			var expDirect uint64
			sizes := []int{512, 4096, 8192, 64 << 10, 100 << 10, 256 << 10}
			for i := 0; i < 120; i++ {
				n := sizes[rng.IntN(len(sizes))]
				off := int64(rng.IntN(len(want)/n)) * int64(n) / 512 * 512
				// Mostly page-aligned slices of the Buffer (direct); some at an unaligned start
				// or on the heap (copied).
				var p []byte
				aligned := true
				switch rng.IntN(6) {
				case 0:
					p = make([]byte, n)
					aligned = false
				case 1:
					p = mem[512 : 512+n]
					aligned = false
				default:
					pg := rng.IntN((len(mem)-n)/4096 + 1)
					p = mem[pg*4096 : pg*4096+n]
				}
				write := rng.IntN(2) == 0
				var err error
				if write {
					for j := range p {
						p[j] = byte(rng.Uint32())
					}
					copy(want[off:], p)
					err = asyncWait(t, 10*time.Second, func(done func(error)) {
						l.WriteAtAsync(ctx, p, off, false, func(err error) {
							if k := liveDirect(s); k != 0 {
								t.Errorf("write done with %d direct commands' registrations live", k)
							}
							done(err)
						})
					})
				} else {
					clear(p)
					err = asyncWait(t, 10*time.Second, func(done func(error)) {
						l.ReadAtAsync(ctx, p, off, func(err error) {
							if k := liveDirect(s); k != 0 {
								t.Errorf("read done with %d direct commands' registrations live", k)
							}
							done(err)
						})
					})
					if err == nil && !bytes.Equal(p, want[off:off+int64(n)]) {
						t.Fatalf("read %d at %d (aligned %v): data differs", n, off, aligned)
					}
				}
				if err != nil {
					t.Fatalf("I/O %d (%d bytes, write %v): %v", i, n, write, err)
				}
				// Immediate data (writes up to the negotiated size) never registers anything.
				if aligned && !(write && n <= s.chans[0].params.maxImm) {
					expDirect++
				}
			}
			// Everything reads back the same through the copying path.
			got := make([]byte, len(want))
			if err := l.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("read back: %v (equal %v)", err, bytes.Equal(got, want))
			}
			if st := s.Stats(); st.Direct != expDirect {
				t.Fatalf("Stats.Direct %d, want %d (commands %d)", st.Direct, expDirect, st.Commands)
			}
			if err := buf.Free(); err != nil {
				t.Fatal(err)
			}
			if err := buf.Free(); !errors.Is(err, transport.ErrClosed) {
				t.Fatalf("second Free: %v, want ErrClosed", err)
			}
		})
	}
}

// TestBufferLookup: only a page-aligned slice lying entirely in a live Buffer has a device
// address.
func TestBufferLookup(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{lunSize: 1 << 20})
	s := e.dial(e.config())
	a, err := s.AllocBuffer(3 * 4096)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.AllocBuffer(1000)
	if err != nil {
		t.Fatal(err)
	}
	am, bm := a.Bytes(), b.Bytes()
	if len(bm) != 4096 {
		t.Fatalf("a 1000-byte Buffer has %d bytes, want a whole page", len(bm))
	}
	base := a.mem.Addr()
	for _, tc := range []struct {
		name string
		p    []byte
		want uint64
	}{
		{"whole", am, base},
		{"second page", am[4096:8192], base + 4096},
		{"to the end", am[8192:], base + 8192},
		{"unaligned", am[512:4096], 0},
		{"empty", am[:0], 0},
		{"heap", make([]byte, 4096), 0},
		{"other buffer", bm, b.mem.Addr()},
	} {
		if got := s.bufs.deviceAddr(tc.p, pageSize); got != tc.want {
			t.Errorf("%s: address %#x, want %#x", tc.name, got, tc.want)
		}
	}
	if err := a.Free(); err != nil {
		t.Fatal(err)
	}
	if got := s.bufs.deviceAddr(bm, pageSize); got != b.mem.Addr() {
		t.Errorf("after freeing another Buffer: %#x, want %#x", got, b.mem.Addr())
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if p := s.bufs.cur.Load(); p == nil || len(*p) != 0 {
		t.Errorf("freed Buffers still listed: %v", p)
	}
}
