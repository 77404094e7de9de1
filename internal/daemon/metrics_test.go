package daemon

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/srpd/srpd/initiator"
	"github.com/srpd/srpd/target"
)

// scrape gets the daemon's metrics through its GET /metrics handler, in the text format.
func scrape(t testing.TB, d *Daemon) string {
	t.Helper()
	rec := httptest.NewRecorder()
	d.metricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("Content-Type %q", ct)
	}
	return rec.Body.String()
}

// sampleValue returns the value of the sample whose line starts with series (name and
// labels, exactly as exposed), or fails.
func sampleValue(t testing.TB, body, series string) float64 {
	t.Helper()
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return f
		}
	}
	t.Fatalf("no sample %s", series)
	return 0
}

// sessionLUN waits for connection name's session and returns its LUN n.
func sessionLUN(t *testing.T, d *Daemon, name string, n uint64) *initiator.LUN {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		d.mu.RLock()
		c := d.conns[name]
		d.mu.RUnlock()
		if c != nil {
			if _, sess := c.stats(); sess != nil {
				if l := sess.LUN(n); l != nil {
					return l
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("connection %s: no LUN %d", name, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMetricsDuringIO scrapes the daemon while its initiator session writes to and reads from
// its target's LUN: the scrape passes client_golang's lint (promlint, the checks of promtool
// check metrics), has the Go and process collectors' series, and the per-LUN counters, latency
// histograms, errors and per-channel credits count what the I/O did; the login's unit attention
// is counted apart, not as an error.
func TestMetricsDuringIO(t *testing.T) {
	h := startHarness(t)
	h.waitSessions("a", 1)
	lun := sessionLUN(t, h.d, "s", 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const block = 64 << 10
	var wg sync.WaitGroup
	var ioErr error
	var ios int
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, block)
		for i := 0; ctx.Err() == nil; i++ {
			off := int64(i%32) * block
			err := lun.WriteAt(ctx, buf, off, false)
			if err == nil {
				err = lun.ReadAt(ctx, buf, off)
			}
			if err != nil {
				if ctx.Err() == nil {
					ioErr = err
				}
				return
			}
			ios++
		}
	}()
	// Scrape while the I/O runs, once some of it is done.
	var during string
	deadline := time.Now().Add(30 * time.Second)
	for {
		during = scrape(t, h.d)
		if regexp.MustCompile(`(?m)^srpd_target_lun_commands_total\{lun="0",op="read",target="a"\} [1-9]`).MatchString(during) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reads counted after 30 s:\n%s", during)
		}
		time.Sleep(20 * time.Millisecond)
	}
	problems, err := promlint.New(strings.NewReader(during)).Lint()
	if err != nil {
		t.Fatalf("promlint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	t.Run("promtool", func(t *testing.T) { promtoolCheck(t, during) })
	for _, re := range []string{
		`(?m)^go_goroutines [1-9][0-9]*$`,
		`(?m)^# TYPE process_resident_memory_bytes gauge$`,
		`(?m)^# TYPE srpd_target_lun_command_duration_seconds histogram$`,
		`(?m)^srpd_target_lun_command_duration_seconds_bucket\{lun="0",op="write",target="a",le="\+Inf"\} [1-9]`,
		`(?m)^srpd_target_channel_credits_granted\{channel="[0-9]+",session="a\.[0-9]+",target="a"\} [1-9]`,
		`(?m)^srpd_target_channel_credits_available\{channel="[0-9]+",session="a\.[0-9]+",target="a"\} [0-9]`,
		`(?m)^srpd_target_lun_errors_total\{lun="0",sense_key="medium_error",status="check_condition",target="a"\} 0$`,
		`(?m)^srpd_target_lun_errors_total\{lun="0",sense_key="none",status="busy",target="a"\} 0$`,
		`(?m)^srpd_target_backend_io_duration_seconds_count\{lun="0",op="write",target="a"\} [1-9]`,
	} {
		if !regexp.MustCompile(re).MatchString(during) {
			t.Errorf("the scrape during I/O lacks %s", re)
		}
	}
	cancel()
	wg.Wait()
	if ioErr != nil {
		t.Fatalf("I/O: %v", ioErr)
	}

	// After the I/O: the counters add up.
	after := scrape(t, h.d)
	lunSeries := func(name, op string) string {
		if op == "" {
			return name + `{lun="0",target="a"}`
		}
		return name + `{lun="0",op="` + op + `",target="a"}`
	}
	writes := sampleValue(t, after, lunSeries("srpd_target_lun_commands_total", "write"))
	reads := sampleValue(t, after, lunSeries("srpd_target_lun_commands_total", "read"))
	if writes < float64(ios) || reads < float64(ios) {
		t.Errorf("%v writes and %v reads counted for %d of each", writes, reads, ios)
	}
	if wb := sampleValue(t, after, lunSeries("srpd_target_lun_write_bytes_total", "")); wb != writes*block {
		t.Errorf("%v bytes written by %v writes of %d", wb, writes, block)
	}
	if rb := sampleValue(t, after, lunSeries("srpd_target_lun_read_bytes_total", "")); rb < reads*block {
		t.Errorf("%v bytes read by %v reads of %d", rb, reads, block)
	}
	if n := sampleValue(t, after, lunSeries("srpd_target_lun_command_duration_seconds_count", "write")); n != writes {
		t.Errorf("write latency count %v, %v writes", n, writes)
	}
	if s := sampleValue(t, after, lunSeries("srpd_target_lun_command_duration_seconds_sum", "read")); s <= 0 {
		t.Errorf("read latency sum %v", s)
	}
	// The session's login got the POWER ON/RESET unit attention on LUN 0: counted, but not as
	// an error, at the LUN or the target.
	if ua := sampleValue(t, after, lunSeries("srpd_target_lun_reset_unit_attentions_total", "")); ua != 1 {
		t.Errorf("reset unit attentions %v, want 1", ua)
	}
	for _, l := range strings.Split(after, "\n") {
		if strings.HasPrefix(l, "srpd_target_lun_errors_total{") && !strings.HasSuffix(l, " 0") {
			t.Errorf("an error counted: %s", l)
		}
	}
	if e := sampleValue(t, after, `srpd_target_errors_total{target="a"}`); e != 0 {
		t.Errorf("srpd_target_errors_total %v after a login and good I/O", e)
	}
}

// promtoolCheck runs `promtool check metrics` (Debian's prometheus package; .ci/run installs
// it) on a scrape; it skips, saying so, where promtool is not installed.
func promtoolCheck(t *testing.T, scrape string) {
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("SKIPPED: promtool not found (apt-get install prometheus); promlint above checked the scrape")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "check", "metrics")
	cmd.Stdin = strings.NewReader(scrape)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// TestLUNStatsCarriedOverRestart: a target restart that keeps its LUN open (here: a new
// cm_port) keeps the LUN's counters monotonic: the new target's continue from the old one's.
func TestLUNStatsCarriedOverRestart(t *testing.T) {
	h := startHarness(t)
	h.waitSessions("a", 1)
	lun := sessionLUN(t, h.d, "s", 0)
	buf := make([]byte, 4096)
	for range 3 {
		if err := lun.WriteAt(h.ctx(), buf, 0, false); err != nil {
			t.Fatal(err)
		}
	}
	h.d.mu.RLock()
	old := h.d.targets["a"]
	lr := old.luns[0]
	h.d.mu.RUnlock()
	before := old.lunStats(lr)
	if before.Commands[target.LUNOpWrite] != 3 || before.WriteBytes != 3*4096 {
		t.Fatalf("stats before: %+v", before)
	}
	src, err := os.ReadFile(h.path)
	if err != nil {
		t.Fatal(err)
	}
	src = bytes.Replace(src, []byte("  - name: a\n"), []byte("  - name: a\n    cm_port: 5557\n"), 1)
	if err := os.WriteFile(h.path, src, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.Reload(h.ctx()); err != nil {
		t.Fatal(err)
	}
	h.d.mu.RLock()
	nt := h.d.targets["a"]
	h.d.mu.RUnlock()
	if nt == old || nt.luns[0] != lr {
		t.Fatalf("the reload did not restart target a keeping its LUN (new target %v, same LUN %v)", nt != old, nt.luns[0] == lr)
	}
	after := nt.lunStats(lr)
	if after.Commands[target.LUNOpWrite] != 3 || after.WriteBytes != before.WriteBytes || after.ResetUAs != before.ResetUAs {
		t.Errorf("after the restart: %+v; want the counters before it: %+v", after, before)
	}
	if got := sampleValue(t, scrape(t, h.d), `srpd_target_lun_commands_total{lun="0",op="write",target="a"}`); got != 3 {
		t.Errorf("srpd_target_lun_commands_total{op=write} %v after the restart, want 3", got)
	}
}

// TestHistogramExposition: the daemon's lock-free histogram places durations in the target's
// latency buckets, and the emitter exposes them cumulatively with the sum in seconds.
func TestHistogramExposition(t *testing.T) {
	var h histogram
	h.observe(5 * time.Microsecond)   // first bucket (10 µs)
	h.observe(300 * time.Microsecond) // 500 µs
	h.observe(20 * time.Second)       // +Inf only
	h.observe(-time.Millisecond)      // a clock step: the first bucket, 0 in the sum
	s := h.snapshot()
	if s.Buckets[0] != 2 || s.Buckets[5] != 1 || s.Buckets[target.NumLatencyBuckets-1] != 1 || s.Count() != 4 ||
		s.SumNS != uint64(20*time.Second+305*time.Microsecond) {
		t.Fatalf("snapshot %+v", s)
	}
	out := make(chan prometheus.Metric, 1)
	e := &emitter{c: &srpdCollector{descs: map[string]*prometheus.Desc{}}, out: out}
	e.histogram("lat_seconds", "Latency.", s, "op", "read")
	var m dto.Metric
	if err := (<-out).Write(&m); err != nil {
		t.Fatal(err)
	}
	hg := m.GetHistogram()
	if hg.GetSampleCount() != 4 || hg.GetSampleSum() != 20.000305 || len(hg.GetBucket()) != target.NumLatencyBuckets-1 {
		t.Fatalf("histogram %v", hg)
	}
	for _, b := range hg.GetBucket() {
		want := uint64(3) // from le=0.0005 on; the 20 s observation is only in +Inf
		if b.GetUpperBound() < 500e-6 {
			want = 2
		}
		if b.GetCumulativeCount() != want {
			t.Errorf("bucket le=%g: %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
		}
	}
	if l := m.GetLabel(); len(l) != 1 || l[0].GetName() != "op" || l[0].GetValue() != "read" {
		t.Errorf("labels %v", l)
	}
}
