package daemon

import (
	"bufio"
	"bytes"
	"io"
	"math"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// A small implementation of the Prometheus text exposition format (version 0.0.4): metric
// families with HELP and TYPE, counters, gauges and histograms. The daemon computes its samples
// from the engine's counters at scrape time, so all it needs is a writer and a lock-free
// histogram; no client library.

// latencyBuckets are the histogram upper bounds in seconds: 10 µs to 10 s.
var latencyBuckets = []float64{
	10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
	1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3,
	1, 2.5, 5, 10,
}

// histogram counts durations in latencyBuckets. Observe is lock-free and allocation-free.
type histogram struct {
	counts [20]atomic.Uint64 // len(latencyBuckets) + the +Inf bucket
	sumNS  atomic.Uint64
}

func (h *histogram) observe(d time.Duration) {
	s := d.Seconds()
	i := sort.SearchFloat64s(latencyBuckets, s) // first bound >= s
	h.counts[i].Add(1)
	h.sumNS.Add(uint64(max(d, 0)))
}

// histSnap is a histogram snapshot with cumulative bucket counts.
type histSnap struct {
	cum   [20]uint64
	count uint64
	sum   float64
}

func (h *histogram) snapshot() histSnap {
	var s histSnap
	var c uint64
	for i := range h.counts {
		c += h.counts[i].Load()
		s.cum[i] = c
	}
	s.count = c
	s.sum = float64(h.sumNS.Load()) / 1e9
	return s
}

const (
	typeCounter   = "counter"
	typeGauge     = "gauge"
	typeHistogram = "histogram"
)

type sample struct {
	labels string // rendered {a="b",...} or ""
	value  float64
	hist   *histSnap
}

type family struct {
	name, typ, help string
	samples         []sample
}

// expo collects metric families in registration order.
type expo struct {
	fams []*family
	idx  map[string]*family
}

// processGauges adds the standard process gauges of Prometheus client libraries (the names of
// prometheus/client_golang's Go and process collectors): go_goroutines and, where /proc is
// there, process_resident_memory_bytes. A goroutine or memory leak shows in them.
func (e *expo) processGauges() {
	e.gauge("go_goroutines", "Number of goroutines that currently exist.", float64(runtime.NumGoroutine()))
	if rss, ok := residentBytes(); ok {
		e.gauge("process_resident_memory_bytes", "Resident memory size in bytes.", float64(rss))
	}
}

// residentBytes reads the resident set size from /proc/self/statm (its second field, in pages;
// torvalds/linux:fs/proc/array.c proc_pid_statm).
func residentBytes() (int64, bool) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, false
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0, false
	}
	pages, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil {
		return 0, false
	}
	return pages * int64(os.Getpagesize()), true
}

func newExpo() *expo { return &expo{idx: map[string]*family{}} }

func (e *expo) family(name, typ, help string) *family {
	f := e.idx[name]
	if f == nil {
		f = &family{name: name, typ: typ, help: help}
		e.idx[name] = f
		e.fams = append(e.fams, f)
	}
	return f
}

// labels renders label pairs (name, value, name, value, ...).
func labels(kv ...string) string {
	if len(kv) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; i+1 < len(kv); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(kv[i])
		b.WriteString(`="`)
		b.WriteString(escapeLabel(kv[i+1]))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

func escapeLabel(s string) string {
	if !strings.ContainsAny(s, "\\\"\n") {
		return s
	}
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

func (e *expo) counter(name, help string, v uint64, kv ...string) {
	f := e.family(name, typeCounter, help)
	f.samples = append(f.samples, sample{labels: labels(kv...), value: float64(v)})
}

func (e *expo) gauge(name, help string, v float64, kv ...string) {
	f := e.family(name, typeGauge, help)
	f.samples = append(f.samples, sample{labels: labels(kv...), value: v})
}

func (e *expo) histogram(name, help string, h *histogram, kv ...string) {
	f := e.family(name, typeHistogram, help)
	s := h.snapshot()
	f.samples = append(f.samples, sample{labels: labels(kv...), hist: &s})
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, +1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return strconv.FormatFloat(v, 'f', -1, 64) // counters as plain integers
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// withLabel adds one more label to a rendered label set.
func withLabel(ls, k, v string) string {
	l := k + `="` + escapeLabel(v) + `"`
	if ls == "" {
		return "{" + l + "}"
	}
	return ls[:len(ls)-1] + "," + l + "}"
}

// WriteTo writes the exposition (io.WriterTo): n counts the bytes w accepted, also when it
// fails part of the way.
func (e *expo) WriteTo(w io.Writer) (n int64, err error) {
	cw := &countingWriter{w: w}
	bw := bufio.NewWriter(cw)
	for _, f := range e.fams {
		bw.WriteString("# HELP " + f.name + " " + strings.ReplaceAll(strings.ReplaceAll(f.help, `\`, `\\`), "\n", `\n`) + "\n")
		bw.WriteString("# TYPE " + f.name + " " + f.typ + "\n")
		for _, s := range f.samples {
			if s.hist == nil {
				bw.WriteString(f.name + s.labels + " " + formatFloat(s.value) + "\n")
				continue
			}
			for i, ub := range latencyBuckets {
				bw.WriteString(f.name + "_bucket" + withLabel(s.labels, "le", formatFloat(ub)) + " " +
					strconv.FormatUint(s.hist.cum[i], 10) + "\n")
			}
			bw.WriteString(f.name + "_bucket" + withLabel(s.labels, "le", "+Inf") + " " + strconv.FormatUint(s.hist.count, 10) + "\n")
			bw.WriteString(f.name + "_sum" + s.labels + " " + formatFloat(s.hist.sum) + "\n")
			bw.WriteString(f.name + "_count" + s.labels + " " + strconv.FormatUint(s.hist.count, 10) + "\n")
		}
	}
	err = bw.Flush() // bufio keeps the first write error and returns it here
	return cw.n, err
}

// countingWriter counts the bytes its writer accepted.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
