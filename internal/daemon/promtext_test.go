package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestExposition(t *testing.T) {
	e := newExpo()
	e.counter("x_total", "Things.", 3, "a", "1")
	e.gauge("y", "A gauge\nwith a newline.", 0.5)
	e.counter("x_total", "Things.", 12345678901, "a", `q"uo\te`+"\n")
	var h histogram
	h.observe(5 * time.Microsecond)   // first bucket (10µs)
	h.observe(300 * time.Microsecond) // 500µs
	h.observe(20 * time.Second)       // +Inf only
	e.histogram("lat_seconds", "Latency.", &h, "op", "read")
	var b bytes.Buffer
	if _, err := e.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"# HELP x_total Things.\n# TYPE x_total counter\nx_total{a=\"1\"} 3\nx_total{a=\"q\\\"uo\\\\te\\n\"} 12345678901\n",
		"# HELP y A gauge\\nwith a newline.\n# TYPE y gauge\ny 0.5\n",
		"# TYPE lat_seconds histogram\n",
		`lat_seconds_bucket{op="read",le="1e-05"} 1` + "\n",
		`lat_seconds_bucket{op="read",le="0.00025"} 1` + "\n",
		`lat_seconds_bucket{op="read",le="0.0005"} 2` + "\n",
		`lat_seconds_bucket{op="read",le="10"} 2` + "\n",
		`lat_seconds_bucket{op="read",le="+Inf"} 3` + "\n",
		`lat_seconds_count{op="read"} 3` + "\n",
		`lat_seconds_sum{op="read"} 20.000305` + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("exposition lacks %q:\n%s", want, out)
		}
	}
	// A family's samples stay together even when added apart.
	if strings.Count(out, "# TYPE x_total") != 1 || strings.Index(out, "# TYPE y") < strings.LastIndex(out, "x_total{") {
		t.Errorf("samples of x_total are not grouped:\n%s", out)
	}
}

func TestProcessGauges(t *testing.T) {
	e := newExpo()
	e.processGauges()
	var b bytes.Buffer
	if _, err := e.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"# TYPE go_goroutines gauge\ngo_goroutines ",
		"# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("exposition lacks %q:\n%s", want, out)
		}
	}
	rss, ok := residentBytes()
	if !ok || rss < 1<<20 {
		t.Errorf("residentBytes = %d, %v; want at least 1 MiB for a running Go test", rss, ok)
	}
	var n int
	for _, l := range strings.Split(out, "\n") {
		if v, found := strings.CutPrefix(l, "go_goroutines "); found {
			if _, err := fmt.Sscan(v, &n); err != nil || n < 1 {
				t.Errorf("go_goroutines %q: want a positive count", v)
			}
		}
	}
	if n == 0 {
		t.Errorf("no go_goroutines sample:\n%s", out)
	}
}

// TestExpositionWriteToCount: WriteTo reports the bytes written (io.WriterTo), all of them on
// success, and those the writer accepted before it failed.
func TestExpositionWriteToCount(t *testing.T) {
	e := newExpo()
	for i := range 500 { // more than bufio's 4 KiB buffer, so that it writes several times
		e.counter("c_total", "A counter.", uint64(i), "i", fmt.Sprint(i))
	}
	var b bytes.Buffer
	n, err := e.WriteTo(&b)
	if err != nil || n != int64(b.Len()) || n <= 4096 {
		t.Fatalf("WriteTo = %d, %v; wrote %d bytes", n, err, b.Len())
	}
	w := &failAfter{left: 5000}
	n, err = e.WriteTo(w)
	if !errors.Is(err, errWriterFull) || n != w.took || w.took == 0 || w.took > 5000 {
		t.Fatalf("WriteTo into a writer that fails = %d, %v; it took %d bytes", n, err, w.took)
	}
}

var errWriterFull = errors.New("writer full")

// failAfter accepts left bytes, then fails.
type failAfter struct{ left, took int64 }

func (f *failAfter) Write(p []byte) (int, error) {
	n := int(min(int64(len(p)), f.left))
	f.left -= int64(n)
	f.took += int64(n)
	if n < len(p) {
		return n, errWriterFull
	}
	return n, nil
}
