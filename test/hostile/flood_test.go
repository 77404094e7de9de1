//go:build hostile

package hostile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/srpd/srpd/initiator"
	"github.com/srpd/srpd/transport/softroce"
)

const (
	// defaultFloodSessions is how many SRP sessions the flood opens, one after another, each
	// with its own initiator port ID (initiator_ext = 0x1000 + index), holding every one it
	// gets. SRPD_FLOOD_SESSIONS overrides it (to try the test's later checks on a daemon that
	// cannot survive the full flood).
	defaultFloodSessions = 2000
	// floodSources is how many source addresses (127.0.0.10 on) the flood spreads its sessions
	// over round-robin: softroce gives a device 1,024 QPs by default, and per-source limits are
	// not what this test is about.
	floodSources = 8
	// floodBudget bounds the whole flood (a rejected login costs a round trip, an accepted one a
	// login and LUN discovery).
	floodBudget = 150 * time.Second
	// floodVerify is how many of the earliest (and of the latest) accepted sessions must do
	// verified I/O after the flood.
	floodVerify = 8
)

// TestSessionFlood opens floodSessions SRP sessions against srpd with the default limits
// while the established NBD export does verified I/O, and checks that srpd survives (alive,
// control API answering, RSS within budget at every step), that the export never stalls,
// that logins over a limit are refused cleanly (SRP_LOGIN_REJ, not a timeout), that the
// earliest sessions still do verified I/O after the flood, and that closing them all gives
// every channel back.
func TestSessionFlood(t *testing.T) {
	floodSessions := defaultFloodSessions
	if v := os.Getenv("SRPD_FLOOD_SESSIONS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SRPD_FLOOD_SESSIONS=%q: want a positive number", v)
		}
		floodSessions = n
		t.Logf("session flood: %d sessions (SRPD_FLOOD_SESSIONS), not %d", n, defaultFloodSessions)
	}
	d := startDaemon(t)
	p := startProber(t, d.nbdSocket, lunSize/2)
	m0 := d.metrics(t)
	ch0 := sum(m0, "srpd_target_channels")
	g0, hasG := m0["go_goroutines"]
	devs := make([]*softroce.Device, floodSources)
	for i := range devs {
		devs[i] = clientDevice(t, d, fmt.Sprintf("127.0.0.%d", 10+i), floodSessions/floodSources+64)
	}

	var (
		sessions  []held
		rejected  = map[string]int{}
		otherErrs = map[string]int{}
		loginLat  []time.Duration
		attempts  int
	)
	defer func() { closeAll(d, sessions) }()

	rss := d.sampleRSS(100 * time.Millisecond)
	m := p.mark()
	start := time.Now()
	deadline := start.Add(floodBudget)
	for i := range floodSessions {
		if d.exited() {
			rss.end()
			t.Fatalf("session flood: srpd died after %d login attempts (%d sessions accepted): %s", attempts, len(sessions), d.crashReport())
		}
		if time.Now().After(deadline) {
			break
		}
		attempts++
		cfg := sessionConfig(devs[i%floodSources], uint64(0x1000+i), 1)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		t0 := time.Now()
		s, err := initiator.Dial(ctx, cfg)
		cancel()
		var rej *initiator.LoginRejectError
		switch {
		case err == nil:
			loginLat = append(loginLat, time.Since(t0))
			sessions = append(sessions, held{i, s})
		case errors.As(err, &rej):
			rejected[rej.Error()]++
		default:
			msg := err.Error()
			if len(msg) > 160 {
				msg = msg[:160]
			}
			otherErrs[msg]++
		}
		if (i+1)%250 == 0 {
			st := d.alive(t, fmt.Sprintf("session flood, after %d attempts", i+1))
			t.Logf("session flood: %d attempts, %d accepted, %d rejected, %d failed otherwise; srpd reports %d sessions; RSS %s; %v",
				i+1, len(sessions), total(rejected), total(otherErrs), st.Sessions, mib(d.rss()), time.Since(start).Round(time.Millisecond))
			d.withinBudget(t, "session flood")
		}
	}
	elapsed := time.Since(start)
	peak := max(rss.end(), d.peakRSS())
	st := d.alive(t, "after the session flood")
	w := p.since(m)
	slices.Sort(loginLat)
	t.Logf("session flood: %d login attempts in %v from %d sources: %d sessions accepted and held, %d rejected, %d failed otherwise",
		attempts, elapsed.Round(time.Millisecond), floodSources, len(sessions), total(rejected), total(otherErrs))
	if len(loginLat) > 0 {
		t.Logf("session flood: accepted logins took p50 %v, p99 %v, max %v", loginLat[len(loginLat)/2].Round(time.Microsecond),
			loginLat[len(loginLat)*99/100].Round(time.Microsecond), loginLat[len(loginLat)-1].Round(time.Microsecond))
	}
	for _, k := range sortedByCount(rejected) {
		t.Logf("session flood: rejected %d×: %s", rejected[k], k)
	}
	for _, k := range sortedByCount(otherErrs) {
		t.Logf("session flood: failed %d×: %s", otherErrs[k], k)
	}
	if mt, err := d.scrape(); err != nil {
		t.Errorf("session flood: metrics: %v", err)
	} else {
		t.Logf("session flood: the target has %.0f channels and %.1f GiB of registered (mapped) memory",
			sum(mt, "srpd_target_channels"), sum(mt, "srpd_target_registered_memory_bytes")/(1<<30))
		// Every rejection the clients saw is counted where operators look for it.
		if got, want := sum(mt, "srpd_target_login_rejects_total"), float64(total(rejected)); got < want {
			t.Errorf("session flood: srpd_target_login_rejects_total %.0f, the clients saw %.0f rejections", got, want)
		}
		if got, lim := sum(mt, "srpd_admission_registered_memory_bytes"), sum(mt, "srpd_admission_registered_memory_limit_bytes"); lim <= 0 || got > lim {
			t.Errorf("session flood: srpd_admission_registered_memory_bytes %.0f against limit %.0f", got, lim)
		}
	}
	t.Logf("session flood: srpd reports %d target sessions; srpd peak RSS %s (VmHWM %s; budget %s = min(4 GiB, MemTotal/2)); this client's RSS %s",
		st.Sessions, mib(peak), mib(d.peakRSS()), mib(d.budget), mib(selfRSS()))
	w.check(t, "session flood")
	if peak > d.budget {
		t.Errorf("session flood: srpd peak RSS %s exceeds the budget %s", mib(peak), mib(d.budget))
	}
	if attempts < floodSessions {
		t.Errorf("session flood: only %d of %d login attempts within %v", attempts, floodSessions, floodBudget)
	}
	if len(sessions) == 0 {
		t.Fatal("session flood: no session was accepted at all")
	}
	// A login over a limit must be refused (a REJ), never left to time out: timeouts mean the
	// target stopped answering.
	if n := total(otherErrs); n > attempts/100 {
		t.Errorf("session flood: %d logins failed without a reject (timeouts, connection errors); want at most 1%%", n)
	}
	if st.Sessions < len(sessions) {
		t.Errorf("session flood: srpd reports %d sessions, %d are held", st.Sessions, len(sessions))
	}

	// The earliest and the latest accepted sessions still do verified I/O, each on its own
	// 4 KiB block of LUN 1.
	verify := append(slices.Clone(sessions[:min(floodVerify, len(sessions))]), sessions[max(0, len(sessions)-floodVerify):]...)
	var verified int
	for _, h := range verify {
		if err := verifiedIO(h.sess, h.idx); err != nil {
			t.Errorf("session flood: session %d (initiator_ext %#x), accepted before the flood went on, fails verified I/O after it: %v", h.idx, 0x1000+h.idx, err)
			continue
		}
		verified++
	}
	t.Logf("session flood: %d of %d sessions (the first and last %d accepted) did verified I/O after the flood", verified, len(verify), floodVerify)

	// Closing them all gives every channel back.
	closeAll(d, sessions)
	sessions = nil
	// Nothing is left behind: the channels, and the goroutines that served them (a few may
	// come and go: the bound allows floodGoroutineSlack).
	const floodGoroutineSlack = 20
	var ch, g float64
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		mt := d.metrics(t)
		ch, g = sum(mt, "srpd_target_channels"), mt["go_goroutines"]
		if ch <= ch0 && (!hasG || g <= g0+floodGoroutineSlack) {
			break
		}
	}
	t.Logf("session flood: after closing every flood session, srpd has %.0f target channels (%.0f before the flood), %.0f goroutines (%.0f before), RSS %s",
		ch, ch0, g, g0, mib(d.rss()))
	if ch > ch0 {
		t.Errorf("session flood: %.0f target channels remain 30 s after every flood session closed; %.0f before", ch, ch0)
	}
	if hasG && g > g0+floodGoroutineSlack {
		t.Errorf("session flood: srpd has %.0f goroutines 30 s after every flood session closed; %.0f before the flood (leak)", g, g0)
	}
	d.alive(t, "after closing the flood's sessions")
}

type held struct {
	idx  int
	sess *initiator.Session
}

// closeAll closes sessions, 32 at a time, each within 10 s (1 s when srpd is gone: nobody
// will answer the logout).
func closeAll(d *daemon, sessions []held) {
	timeout := 10 * time.Second
	if d.exited() {
		timeout = time.Second
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for _, h := range sessions {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			_ = h.sess.Close(ctx)
		}()
	}
	wg.Wait()
}

// verifiedIO writes a pattern to session idx's own block of LUN 1, reads it back and compares.
func verifiedIO(s *initiator.Session, idx int) error {
	l := s.LUN(1)
	if l == nil {
		return errors.New("no LUN 1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	buf := bytes.Repeat([]byte(fmt.Sprintf("session %06d ", idx)), 4096/15+1)[:4096]
	off := int64(idx) * 4096 % l.Size()
	if err := l.WriteAt(ctx, buf, off, false); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	got := make([]byte, len(buf))
	if err := l.ReadAt(ctx, got, off); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if !bytes.Equal(got, buf) {
		return fmt.Errorf("read back differs from what was written at %d", off)
	}
	return nil
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func sortedByCount(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return strings.Compare(keys[i], keys[j]) < 0
	})
	return keys
}
