//go:build hostile

package hostile

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
)

// The daemon under attack: srpd built once per test run (without -race: the race detector's
// memory overhead would swamp the RSS budget and its CPU cost the floods), started per test with
// a configuration in a temporary directory, and killed by PID at the end.

var bins = testutil.Builder{Prefix: "srpd-hostile-"}

func TestMain(m *testing.M) {
	code := m.Run()
	bins.Remove()
	os.Exit(code)
}

// srpdBinary returns the path of srpd built from this module.
func srpdBinary(t *testing.T) string {
	t.Helper()
	return filepath.Join(bins.Build(t, "github.com/srpd/srpd/cmd/srpd"), "srpd")
}

// Identifiers of the target under attack and of the daemon's own session to it.
const (
	targetPortIDHex = "0x00000000000000aa00000000000000aa"
	targetCMPort    = 5555
	// lunSize is the size of both RAM LUNs: LUN 0 is the established NBD export, LUN 1 is
	// written by the flood's sessions (one 4 KiB block each).
	lunSize = 64 << 20
)

// daemonConfig is srpd's configuration for these tests: one softroce transport on 127.0.0.1
// with its own UDP port, one target open to any initiator (as the demo configuration) with
// two RAM LUNs, and one session of the daemon to its own target that exports LUN 0 over NBD.
// No limits: the defaults are what is under test.
func daemonConfig(dir string, udpPort, metricsPort int, targetExtra string) string {
	return testutil.LoopbackConfig(udpPort) + fmt.Sprintf(`targets:
  - name: t
    port_id: %s
    cm_port: %d
    luns:
      - id: 0
        backend: ram
        size: %d
      - id: 1
        backend: ram
        size: %d
    acls:
      - initiator: "*"
%ssessions:
  - name: keep
    address: 127.0.0.1
    port: %d
    target_port_id: %s
    initiator_ext: 0x1
    reconnect_delay: 1s
    nbd:
      - lun: 0
        socket: %s
control:
  socket: %s
logging:
  level: info
metrics:
  listen: 127.0.0.1:%d
`, targetPortIDHex, targetCMPort, lunSize, lunSize, targetExtra, targetCMPort, targetPortIDHex,
		filepath.Join(dir, "keep.nbd"), filepath.Join(dir, "ctl.sock"), metricsPort)
}

type daemon struct {
	*testutil.Proc
	dir         string
	pid         int
	out         *testutil.SyncBuffer
	udpPort     int
	metricsPort int
	ctl         *ctlapi.Client
	nbdSocket   string
	budget      int64 // RSS budget in bytes
}

// startDaemon writes the configuration, starts srpd and waits (bounded) until its control
// socket answers and its session "keep" runs with the NBD export in place.
func startDaemon(t *testing.T) *daemon {
	t.Helper()
	return startDaemonWith(t, "")
}

// startDaemonWith is startDaemon with extra YAML lines in the target's section (indented by
// four spaces, e.g. "    limits:\n      queue_depth: 16\n").
func startDaemonWith(t *testing.T, targetExtra string) *daemon {
	t.Helper()
	bin := srpdBinary(t)
	dir, err := os.MkdirTemp("", "srpd-hostile-") // short: unix socket paths are limited to 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := &daemon{dir: dir, out: &testutil.SyncBuffer{},
		udpPort: testutil.FreeUDPPort(t), metricsPort: testutil.FreeTCPPort(t), nbdSocket: filepath.Join(dir, "keep.nbd")}
	d.budget = rssBudget(t)
	cfg := filepath.Join(dir, "srpd.yaml")
	if err := os.WriteFile(cfg, []byte(daemonConfig(dir, d.udpPort, d.metricsPort, targetExtra)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", cfg, "--log-format", "json")
	cmd.Stdout, cmd.Stderr = d.out, d.out
	d.Proc = testutil.StartProc(t, cmd, func() string { return tailLines(d.out.String(), 80) })
	d.pid = cmd.Process.Pid
	d.ctl = ctlapi.NewClient(filepath.Join(dir, "ctl.sock"))
	t.Cleanup(d.ctl.Close)
	deadline := time.Now().Add(60 * time.Second)
	for {
		if d.exited() {
			t.Fatalf("srpd exited during start-up: %v\n%s", d.Err, tailLines(d.out.String(), 40))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := d.ctl.GetConnection(ctx, "keep")
		cancel()
		if err == nil && c.State == ctlapi.StateRunning {
			if _, err := os.Stat(d.nbdSocket); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("srpd not ready within 60 s (session keep: %+v, %v)", c, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("srpd pid %d: softroce 127.0.0.1:%d, CM port %d, metrics 127.0.0.1:%d, RSS %s at start, budget %s",
		d.pid, d.udpPort, targetCMPort, d.metricsPort, mib(d.rss()), mib(d.budget))
	return d
}

func (d *daemon) exited() bool {
	select {
	case <-d.Done:
		return true
	default:
		return false
	}
}

// crashReport describes how srpd ended: exit status and the panic, if any, from its output.
func (d *daemon) crashReport() string {
	out := d.out.String()
	if i := strings.Index(out, "panic:"); i >= 0 {
		end := min(len(out), i+3000)
		return fmt.Sprintf("srpd (pid %d) exited: %v\n%s", d.pid, d.Err, out[i:end])
	}
	return fmt.Sprintf("srpd (pid %d) exited: %v\n%s", d.pid, d.Err, tailLines(out, 40))
}

// alive fails the test unless srpd still runs and its control API answers (bounded).
func (d *daemon) alive(t *testing.T, phase string) *ctlapi.Status {
	t.Helper()
	if d.exited() {
		t.Fatalf("%s: %s", phase, d.crashReport())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := d.ctl.Status(ctx)
	if err != nil {
		if d.exited() {
			t.Fatalf("%s: %s", phase, d.crashReport())
		}
		t.Fatalf("%s: srpd (pid %d) runs but its control API does not answer within 10 s: %v", phase, d.pid, err)
	}
	if st.PID != d.pid {
		t.Fatalf("%s: control API reports pid %d, srpd is %d", phase, st.PID, d.pid)
	}
	return st
}

// rss is srpd's resident set (VmRSS), 0 if it cannot be read (the process is gone).
func (d *daemon) rss() int64 { return procStatusBytes(d.pid, "VmRSS") }

// peakRSS is srpd's high-water mark (VmHWM): it catches a peak between two samples.
func (d *daemon) peakRSS() int64 { return procStatusBytes(d.pid, "VmHWM") }

func procStatusBytes(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			f := strings.Fields(v)
			if len(f) >= 1 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n << 10 // kB
			}
		}
	}
	return 0
}

// withinBudget fails the test when srpd's peak RSS so far exceeds the budget.
func (d *daemon) withinBudget(t *testing.T, phase string) {
	t.Helper()
	if p := d.peakRSS(); p > d.budget {
		t.Errorf("%s: srpd peak RSS %s exceeds the budget %s", phase, mib(p), mib(d.budget))
	}
}

// rssBudget is the resident-memory budget of srpd under attack: 4 GiB, or half of MemTotal
// when that is less. The daemon's LUNs are 2 × 64 MiB of RAM; everything above is what the
// attacks made it hold.
func rssBudget(t *testing.T) int64 {
	t.Helper()
	budget := int64(4 << 30)
	if mt := memTotal(); mt > 0 && mt/2 < budget {
		budget = mt / 2
	}
	return budget
}

func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n << 10
		}
	}
	return 0
}

// metrics scrapes srpd's Prometheus endpoint (bounded) and returns sample name{labels} → value.
func (d *daemon) metrics(t *testing.T) map[string]float64 {
	t.Helper()
	m, err := d.scrape()
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	return m
}

var sampleRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$`)

func (d *daemon) scrape() (map[string]float64, error) {
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", d.metricsPort))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, l := range strings.Split(string(body), "\n") {
		if m := sampleRE.FindStringSubmatch(l); m != nil {
			v, err := strconv.ParseFloat(m[2], 64)
			if err == nil {
				out[m[1]] = v
			}
		}
	}
	return out, nil
}

// sum adds the samples of a metric family whose labels contain all of the given substrings.
func sum(m map[string]float64, name string, labelParts ...string) float64 {
	var s float64
	for k, v := range m {
		if k != name && !strings.HasPrefix(k, name+"{") {
			continue
		}
		ok := true
		for _, p := range labelParts {
			if !strings.Contains(k, p) {
				ok = false
			}
		}
		if ok {
			s += v
		}
	}
	return s
}

// rssSampler samples srpd's RSS every interval until stopped.
type rssSampler struct {
	mu      sync.Mutex
	samples []int64
	stop    chan struct{}
	done    chan struct{}
}

func (d *daemon) sampleRSS(every time.Duration) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			if r := d.rss(); r > 0 {
				s.mu.Lock()
				s.samples = append(s.samples, r)
				s.mu.Unlock()
			}
			select {
			case <-s.stop:
				return
			case <-tk.C:
			}
		}
	}()
	return s
}

// end stops the sampler and returns its maximum.
func (s *rssSampler) end() int64 {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.samples) == 0 {
		return 0
	}
	return slices.Max(s.samples)
}

func tailLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// selfRSS is this test process's resident set (the attackers' own cost).
func selfRSS() int64 { return procStatusBytes(os.Getpid(), "VmRSS") }

// attack runs one class of attack as a subtest while p keeps doing verified I/O, then checks
// that srpd is alive and answers its control API, that its peak RSS is within the budget and
// that the established export served verified I/O throughout, without error or stall.
func (d *daemon) attack(t *testing.T, p *prober, name string, run func(t *testing.T)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		m := p.mark()
		start := time.Now()
		run(t)
		// Give the daemon a moment to digest what was sent before judging it.
		time.Sleep(500 * time.Millisecond)
		d.alive(t, name)
		d.withinBudget(t, name)
		t.Logf("%s: %v; srpd RSS %s, peak %s (budget %s)", name, time.Since(start).Round(time.Millisecond),
			mib(d.rss()), mib(d.peakRSS()), mib(d.budget))
		p.since(m).check(t, name)
	})
}
