//go:build hostile

package hostile

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/srpd/srpd/initiator"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/transport/softroce"
)

const (
	soakSessions        = 64
	soakChannels        = 4
	soakWorkers         = 4 // per session; the initiator spreads requests over its channels round-robin
	soakWarmup          = 15 * time.Second
	defaultSoakDuration = 60 * time.Second // SRPD_SOAK_DURATION overrides it (a Go duration, ≥ 30s)
	soakWindow          = 10 * time.Second
	// Flatness: the last window's median may exceed the first's by this factor plus this slack.
	soakRSSFactor       = 1.10
	soakRSSSlack        = 8 << 20
	soakGoroutineFactor = 1.05
	soakGoroutineSlack  = 10
	soakScrapeEvery     = 5 // seconds between metrics scrapes (RSS is read every second)
)

// TestSoak holds soakSessions sessions × soakChannels channels against one target and runs
// verified I/O on all of them for 60 s (after soakWarmup), with the established NBD
// export probed too. It requires 0 errors, every session's I/O progressing, and srpd's RSS and
// goroutine count flat: the median of the last soakWindow at most soakRSSFactor × the first
// window's median + soakRSSSlack (goroutines: soakGoroutineFactor, soakGoroutineSlack). Run by
// `make soak` (SRPD_SOAK=1); about 90 s.
func TestSoak(t *testing.T) {
	if os.Getenv("SRPD_SOAK") != "1" {
		t.Skip("SKIPPED: the soak runs only with SRPD_SOAK=1 (make soak); it takes about 90 s")
	}
	soakDuration := defaultSoakDuration
	if v := os.Getenv("SRPD_SOAK_DURATION"); v != "" {
		dur, err := time.ParseDuration(v)
		if err != nil || dur < 3*soakWindow {
			t.Fatalf("SRPD_SOAK_DURATION=%q: want a duration of at least %v", v, 3*soakWindow)
		}
		soakDuration = dur
	}
	// 256 channels at the default queue depth (128 × 1 MiB each) would be 33 GiB of registered
	// memory, over the default budget (half of MemTotal): a smaller queue depth, as an
	// operator serving this many initiators would configure.
	d := startDaemonWith(t, "    limits:\n      queue_depth: 16\n")
	p := startProber(t, d.nbdSocket, lunSize/2)
	devs := make([]*softroce.Device, 4)
	for i := range devs {
		devs[i] = clientDevice(t, d, fmt.Sprintf("127.0.0.%d", 30+i), 0)
	}
	sessions := make([]held, 0, soakSessions)
	defer func() { closeAll(d, sessions) }()
	for i := range soakSessions {
		cfg := sessionConfig(devs[i%len(devs)], uint64(0x50000+i), soakChannels)
		cfg.QueueDepth = 8
		cfg.MaxIOSize = 64 << 10
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := initiator.Dial(ctx, cfg)
		cancel()
		if err != nil {
			t.Fatalf("soak: session %d: %v", i, err)
		}
		sessions = append(sessions, held{i, s})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	list, err := d.ctl.ListSessions(ctx, ctlapi.SessionFilter{Target: "t"})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	chans := 0
	for _, s := range list {
		chans += s.Channels
	}
	t.Logf("soak: %d sessions logged in; the target reports %d sessions with %d channels in all", len(sessions), len(list), chans)
	if want := soakSessions*soakChannels + 1; chans < want {
		t.Fatalf("soak: the target has %d channels, want %d (%d × %d and the established session's)", chans, want, soakSessions, soakChannels)
	}

	// Verified I/O: every worker owns a region of LUN 1.
	region := int64(lunSize) / (soakSessions * soakWorkers) / 4096 * 4096
	stop := make(chan struct{})
	var wg sync.WaitGroup
	ios := make([]atomic.Int64, soakSessions)
	var errCount atomic.Int64
	var warming atomic.Bool
	warming.Store(true)
	var firstErr atomic.Value
	for si, h := range sessions {
		l := h.sess.LUN(1)
		if l == nil {
			t.Fatalf("soak: session %d sees no LUN 1", si)
		}
		for w := range soakWorkers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				base := int64(si*soakWorkers+w) * region
				rng := rand.New(rand.NewPCG(uint64(si), uint64(w)))
				buf, got := make([]byte, 64<<10), make([]byte, 64<<10)
				for {
					select {
					case <-stop:
						return
					default:
					}
					n := (1 + rng.IntN(16)) * 4096
					if warming.Load() {
						// Largest I/Os while warming up: the target's buffers are touched to the
						// extent the workload will ever touch them before the measurement starts,
						// so that the first window is not mere page faulting.
						n = 64 << 10
					}
					off := base + rng.Int64N((region-int64(n))/4096+1)*4096
					for i := range buf[:n] {
						buf[i] = byte(rng.Uint32())
					}
					ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
					err := l.WriteAt(ctx, buf[:n], off, false)
					if err == nil {
						err = l.ReadAt(ctx, got[:n], off)
					}
					cancel()
					if err == nil && !bytes.Equal(buf[:n], got[:n]) {
						err = fmt.Errorf("session %d worker %d: %d bytes at %d read back differ", si, w, n, off)
					}
					if err != nil {
						if errCount.Add(1) == 1 {
							firstErr.Store(fmt.Sprintf("session %d worker %d: %v", si, w, err))
						}
						continue
					}
					ios[si].Add(1)
				}
			}()
		}
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	time.Sleep(soakWarmup)
	warming.Store(false)
	m := p.mark()
	type sample struct {
		at         time.Duration
		rss        int64
		goroutines float64
	}
	var samples []sample
	start := time.Now()
	var iosAtStart int64
	for i := range ios {
		iosAtStart += ios[i].Load()
	}
	perSessionStart := make([]int64, soakSessions)
	for i := range ios {
		perSessionStart[i] = ios[i].Load()
	}
	// RSS every second from /proc; the goroutine gauge every soakScrapeEvery seconds only: a
	// scrape of the exposition allocates about 400 KB in srpd (the I/O path allocates
	// nothing in steady state), which at one scrape a second would grow the heap by ~25 MB a
	// minute until the first GC and make a flat daemon look like it grows.
	var g float64
	for i, tk := 0, time.NewTicker(time.Second); time.Since(start) < soakDuration; i, _ = i+1, <-tk.C {
		if d.exited() {
			t.Fatalf("soak: %s", d.crashReport())
		}
		if i%soakScrapeEvery == 0 {
			mt, err := d.scrape()
			if err != nil {
				t.Fatalf("soak: metrics: %v", err)
			}
			var ok bool
			if g, ok = mt["go_goroutines"]; !ok {
				t.Fatal("soak: srpd exports no go_goroutines gauge")
			}
		}
		samples = append(samples, sample{time.Since(start), d.rss(), g})
	}
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)
	var iosTotal int64
	idle := 0
	for i := range ios {
		iosTotal += ios[i].Load()
		if ios[i].Load() == perSessionStart[i] {
			idle++
		}
	}
	iosTotal -= iosAtStart
	d.alive(t, "soak")

	var firstRSS, lastRSS []int64
	var firstG, lastG []float64
	for _, s := range samples {
		switch {
		case s.at < soakWindow:
			firstRSS, firstG = append(firstRSS, s.rss), append(firstG, s.goroutines)
		case s.at >= soakDuration-soakWindow:
			lastRSS, lastG = append(lastRSS, s.rss), append(lastG, s.goroutines)
		}
	}
	if len(firstRSS) < 5 || len(lastRSS) < 5 {
		t.Fatalf("soak: %d and %d samples in the first and last %v; want at least 5 each", len(firstRSS), len(lastRSS), soakWindow)
	}
	r0, r1 := median(firstRSS), median(lastRSS)
	g0, g1 := median(firstG), median(lastG)
	t.Logf("soak: %d sessions × %d channels, %d workers each, %v: %d verified I/Os (write+read pairs of 4-64 KiB, %.0f/s), %d errors, %d sessions without progress",
		soakSessions, soakChannels, soakWorkers, elapsed.Round(time.Millisecond), iosTotal, float64(iosTotal)/elapsed.Seconds(), errCount.Load(), idle)
	t.Logf("soak: srpd RSS median first %v %s, last %v %s (bound %s); goroutines median first %.0f, last %.0f (bound %.0f); peak RSS %s",
		soakWindow, mib(r0), soakWindow, mib(r1), mib(int64(float64(r0)*soakRSSFactor)+soakRSSSlack), g0, g1, g0*soakGoroutineFactor+soakGoroutineSlack, mib(d.peakRSS()))
	var trend []string
	for w := time.Duration(0); w < soakDuration; w += soakWindow {
		var r []int64
		var g []float64
		for _, s := range samples {
			if s.at >= w && s.at < w+soakWindow {
				r, g = append(r, s.rss), append(g, s.goroutines)
			}
		}
		if len(r) > 0 {
			trend = append(trend, fmt.Sprintf("+%v: %s/%.0f", w, mib(median(r)), median(g)))
		}
	}
	t.Logf("soak: RSS/goroutine medians per %v: %s", soakWindow, strings.Join(trend, ", "))
	p.since(m).check(t, "soak")
	if n := errCount.Load(); n > 0 {
		t.Errorf("soak: %d verified I/Os failed; first: %v", n, firstErr.Load())
	}
	if idle > 0 {
		t.Errorf("soak: %d sessions made no progress during the soak", idle)
	}
	if float64(r1) > float64(r0)*soakRSSFactor+soakRSSSlack {
		t.Errorf("soak: srpd RSS grew from a median %s in the first %v to %s in the last (bound ×%.2f + %s)", mib(r0), soakWindow, mib(r1), soakRSSFactor, mib(soakRSSSlack))
	}
	if g1 > g0*soakGoroutineFactor+soakGoroutineSlack {
		t.Errorf("soak: srpd goroutines grew from a median %.0f in the first %v to %.0f in the last (bound ×%.2f + %d)", g0, soakWindow, g1, soakGoroutineFactor, soakGoroutineSlack)
	}
}

func median[T int64 | float64](v []T) T {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
