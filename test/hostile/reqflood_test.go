//go:build hostile

package hostile

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/srpd/srpd/initiator"
)

const (
	// reqFloodRound is the number of forged REQs sent every reqFloodPeriod: just over the 64
	// logins srpd handled at a time on main at 7251021, at about 2.5 packets/s (issue 23).
	reqFloodRound  = 70
	reqFloodPeriod = 25 * time.Second
	reqFloodRounds = 2
	// reqFloodBurst is the burst sent after the rounds.
	reqFloodBurst = 400
	// legitLoginBound is how long a legitimate login may take during the flood (issue 23: "all
	// of them, within 2 s each").
	legitLoginBound = 2 * time.Second
	// legitLoginEvery is the pace of the legitimate logins.
	legitLoginEvery = 5 * time.Second
)

// TestREQFlood sends forged CM REQs (well-formed SRP logins from 127.0.0.20-23 that are never
// completed: no RTU ever follows the target's REP) — reqFloodRound every reqFloodPeriod, then a
// burst of reqFloodBurst — while a legitimate initiator on 127.0.0.9 logs in every
// legitLoginEvery and the established export does verified I/O. Every legitimate login must
// succeed within legitLoginBound and do verified I/O; srpd must stay alive and within budget.
func TestREQFlood(t *testing.T) {
	d := startDaemon(t)
	p := startProber(t, d.nbdSocket, lunSize/2)
	forgers := make([]*forger, 4)
	for i := range forgers {
		forgers[i] = newForger(t, d, fmt.Sprintf("127.0.0.%d", 20+i), uint64(100+i))
	}
	dev := clientDevice(t, d, "127.0.0.9", 0)
	forged := 0
	forge := func(n int) {
		for range n {
			f := forgers[forged%len(forgers)]
			f.sendValid(f.madPacket(f.req(loginPD(0x666f726765640000+uint64(forged), 0x0F0F0F0F))))
			forged++
		}
	}

	type result struct {
		at  time.Duration
		lat time.Duration
		err error
	}
	var results []result
	legit := 0
	login := func(start time.Time) {
		legit++
		cfg := sessionConfig(dev, 0x900000+uint64(legit), 1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		t0 := time.Now()
		s, err := initiator.Dial(ctx, cfg)
		r := result{at: t0.Sub(start), lat: time.Since(t0), err: err}
		if err == nil {
			if verr := verifiedIO(s, 3000+legit); verr != nil {
				r.err = fmt.Errorf("logged in, but verified I/O failed: %w", verr)
			}
			closeSession(s)
		}
		results = append(results, r)
	}

	rss := d.sampleRSS(100 * time.Millisecond)
	m := p.mark()
	start := time.Now()
	m0 := d.metrics(t)
	// The rounds, with legitimate logins in between.
	for round := range reqFloodRounds {
		roundStart := start.Add(time.Duration(round) * reqFloodPeriod)
		time.Sleep(time.Until(roundStart))
		forge(reqFloodRound)
		for next := roundStart.Add(time.Second); next.Before(roundStart.Add(reqFloodPeriod - time.Second)); next = next.Add(legitLoginEvery) {
			time.Sleep(time.Until(next))
			if d.exited() {
				t.Fatalf("REQ flood: %s", d.crashReport())
			}
			login(start)
		}
	}
	// The burst, and logins after it.
	burstStart := time.Now()
	forge(reqFloodBurst)
	time.Sleep(500 * time.Millisecond)
	if mt, err := d.scrape(); err == nil {
		// Pending (never completed) logins hold their channel's memory until they time out.
		t.Logf("REQ flood: half a second after the burst the target has %.1f GiB of registered (mapped) memory, %.0f live channels",
			sum(mt, "srpd_target_registered_memory_bytes")/(1<<30), sum(mt, "srpd_target_channels"))
	}
	for i := range 3 {
		time.Sleep(time.Until(burstStart.Add(time.Second + time.Duration(i)*legitLoginEvery)))
		login(start)
	}
	peak := rss.end()
	d.alive(t, "REQ flood")
	m1 := d.metrics(t)
	ok := 0
	for i, r := range results {
		status := "ok"
		if r.err != nil {
			status = r.err.Error()
		} else if r.lat > legitLoginBound {
			status = fmt.Sprintf("too slow (bound %v)", legitLoginBound)
		} else {
			ok++
		}
		t.Logf("REQ flood: legitimate login %d at +%v took %v: %s", i+1, r.at.Round(time.Millisecond), r.lat.Round(time.Millisecond), status)
	}
	t.Logf("REQ flood: %d forged REQs (%d × %d every %v, then a burst of %d) from %d sources in %v; srpd counted %.0f CM MADs received, %.0f sent; %d of %d legitimate logins succeeded within %v",
		forged, reqFloodRounds, reqFloodRound, reqFloodPeriod, reqFloodBurst, len(forgers), time.Since(start).Round(time.Millisecond),
		sum(m1, "srpd_softroce_cm_mads_received_total")-sum(m0, "srpd_softroce_cm_mads_received_total"),
		sum(m1, "srpd_softroce_cm_mads_sent_total")-sum(m0, "srpd_softroce_cm_mads_sent_total"), ok, len(results), legitLoginBound)
	t.Logf("REQ flood: srpd peak RSS %s (budget %s), target channels now %.0f", mib(max(peak, d.peakRSS())), mib(d.budget), sum(m1, "srpd_target_channels"))
	if ok != len(results) {
		t.Errorf("REQ flood: %d of %d legitimate logins failed or took longer than %v while forged REQs held login slots", len(results)-ok, len(results), legitLoginBound)
	}
	// The flood is visible to operators: forged logins end as evicted, timed out, rate limited,
	// rejected or unfinished (REP sent, no RTU), and none is left pending once the login
	// timeout has passed.
	seen := 0.0
	for _, name := range []string{"srpd_admission_pending_logins_evicted_total", "srpd_admission_pending_logins_timed_out_total",
		"srpd_admission_rate_limited_total", "srpd_target_login_rejects_total", "srpd_target_logins_unfinished_total"} {
		v := sum(m1, name) - sum(m0, name)
		t.Logf("REQ flood: %s +%.0f", name, v)
		seen += v
	}
	if seen == 0 {
		t.Errorf("REQ flood: %d forged REQs left no trace in the admission and login metrics", forged)
	}
	pendingGone := false
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if mt, err := d.scrape(); err == nil && sum(mt, "srpd_admission_pending_logins") == 0 {
			pendingGone = true
			break
		}
	}
	if !pendingGone {
		t.Errorf("REQ flood: pending logins still held 15 s after the last forged REQ")
	}
	d.withinBudget(t, "REQ flood")
	p.since(m).check(t, "REQ flood")
}
