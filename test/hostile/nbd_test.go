//go:build hostile

package hostile

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/testutil"
)

// A minimal NBD client (fixed newstyle, NBD_OPT_EXPORT_NAME, simple replies; the protocol of
// NetworkBlockDevice/nbd:doc/proto.md), every operation under a deadline, and a prober that
// runs verified I/O through it for as long as an attack lasts.

// nbdOpTimeout bounds each NBD request and its reply.
const nbdOpTimeout = 10 * time.Second

// nbdHandshake dials socket and negotiates the default export.
func nbdHandshake(socket string) (*testutil.NBDClient, error) {
	c, err := testutil.DialNBDClient(socket, "", nbdOpTimeout)
	if err != nil {
		return nil, err
	}
	c.OpTimeout = nbdOpTimeout
	return c, nil
}

// prober runs verified I/O on an NBD export in a loop: a random pattern written at a random
// offset of its region, read back and compared. It records each pair's latency and every
// failure with its time.
type prober struct {
	c           *testutil.NBDClient
	socket      string
	region      int64 // bytes [0, region) of the export
	stop, done  chan struct{}
	mu          sync.Mutex
	lat         []time.Duration // per verified write+read pair
	at          []time.Time     // completion times
	errs        []string
	bytesVerify int64
}

func startProber(t *testing.T, socket string, region int64) *prober {
	t.Helper()
	c, err := nbdHandshake(socket)
	if err != nil {
		t.Fatalf("prober: NBD handshake on %s: %v", socket, err)
	}
	if c.Size < region {
		t.Fatalf("prober: export is %d bytes, want at least %d", c.Size, region)
	}
	p := &prober{c: c, socket: socket, region: region, stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	t.Cleanup(func() { p.end() })
	// Back from the handshake, the server may not have started the connection's transmission
	// (its workers) yet: wait for a verified I/O, so that what a test measures from here on
	// (srpd's goroutines, RSS) includes the prober's connection as it stays.
	for end := time.Now().Add(10 * time.Second); p.mark().ios == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("prober: no verified I/O within 10 s of the handshake")
		}
	}
	return p
}

func (p *prober) run() {
	defer close(p.done)
	defer p.c.Close()
	rng := rand.New(rand.NewPCG(17, 23))
	const maxLen = 64 << 10
	buf, got := make([]byte, maxLen), make([]byte, maxLen)
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		n := int(1+rng.IntN(maxLen/4096)) * 4096
		off := rng.Int64N((p.region-int64(n))/4096+1) * 4096
		for i := range buf[:n] {
			buf[i] = byte(rng.Uint32())
		}
		start := time.Now()
		err := p.c.WriteAt(buf[:n], off)
		if err == nil {
			err = p.c.ReadAt(got[:n], off)
			if err == nil && !bytes.Equal(buf[:n], got[:n]) {
				err = fmt.Errorf("read back %d bytes at %d differ from what was written", n, off)
			}
		}
		now := time.Now()
		p.mu.Lock()
		if err != nil {
			p.errs = append(p.errs, fmt.Sprintf("%s: %v", now.Format("15:04:05.000"), err))
		} else {
			p.lat = append(p.lat, now.Sub(start))
			p.at = append(p.at, now)
			p.bytesVerify += int64(n)
		}
		p.mu.Unlock()
		if err != nil {
			// The connection may be unusable now: reconnect (bounded by the handshake's
			// timeouts) so that one failure does not hide whether I/O recovers.
			p.c.Close()
			c, herr := nbdHandshake(p.socket)
			if herr != nil {
				p.mu.Lock()
				p.errs = append(p.errs, "reconnect: "+herr.Error())
				p.mu.Unlock()
				select {
				case <-p.stop:
					return
				case <-time.After(time.Second):
				}
				continue
			}
			p.c = c
		}
	}
}

func (p *prober) end() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// mark is a position in the prober's record.
type mark struct {
	ios, errs int
	at        time.Time
}

func (p *prober) mark() mark {
	p.mu.Lock()
	defer p.mu.Unlock()
	return mark{len(p.lat), len(p.errs), time.Now()}
}

// window summarises the verified I/O since m.
type window struct {
	ios           int
	errs          []string
	p50, p99, max time.Duration
	maxGap        time.Duration // longest time without a verified I/O completing
}

func (p *prober) since(m mark) window {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := window{ios: len(p.lat) - m.ios, errs: slices.Clone(p.errs[m.errs:])}
	lat := slices.Clone(p.lat[m.ios:])
	slices.Sort(lat)
	if len(lat) > 0 {
		w.p50, w.p99, w.max = lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
	}
	prev := m.at
	for _, at := range p.at[m.ios:] {
		w.maxGap = max(w.maxGap, at.Sub(prev))
		prev = at
	}
	w.maxGap = max(w.maxGap, time.Since(prev))
	return w
}

func (w window) String() string {
	return fmt.Sprintf("%d verified I/Os (write+read pairs of 4-64 KiB), latency p50 %v p99 %v max %v, longest gap %v, %d errors",
		w.ios, w.p50.Round(time.Microsecond), w.p99.Round(time.Microsecond), w.max.Round(time.Microsecond),
		w.maxGap.Round(time.Millisecond), len(w.errs))
}

// maxIOGap bounds the time the established export may go without a verified I/O during an
// attack: an attack may slow it, never stall it.
const maxIOGap = 5 * time.Second

// check fails the test unless the window has verified I/O, no error and no stall.
func (w window) check(t *testing.T, phase string) {
	t.Helper()
	t.Logf("%s: established NBD export: %v", phase, w)
	if len(w.errs) > 0 {
		t.Errorf("%s: verified I/O on the established export failed %d times; first: %s", phase, len(w.errs), w.errs[0])
	}
	if w.ios == 0 {
		t.Errorf("%s: no verified I/O completed on the established export", phase)
	}
	if w.maxGap > maxIOGap {
		t.Errorf("%s: the established export went %v without a verified I/O (bound %v)", phase, w.maxGap, maxIOGap)
	}
}
