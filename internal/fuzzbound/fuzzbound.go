// Package fuzzbound bounds the time one fuzz input may take, so that an input on which the
// code under test hangs fails the fuzz target (with every goroutine's stack) instead of
// leaving a worker that makes no progress. go test -fuzz has no per-input time limit of its
// own (only -timeout for the whole run), and a hang under the fuzzer looks the same as a busy
// worker on a loaded machine.
//
// It is for tests only (fuzz targets and their corpus runs); nothing else imports it.
package fuzzbound

import (
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// Default is the per-input bound unless SRPD_FUZZ_INPUT_TIMEOUT (a Go duration) says
// otherwise. It is generous: under -race on a busy 2-core machine a slow input can take a
// second, and a real hang takes forever.
const Default = 10 * time.Second

// Bound returns the per-input bound in effect.
func Bound() time.Duration {
	if s := os.Getenv("SRPD_FUZZ_INPUT_TIMEOUT"); s != "" {
		if d, err := time.ParseDuration(s); err == nil && d > 0 {
			return d
		}
	}
	return Default
}

// Run runs fn and fails t if it has not returned within Bound(). fn runs on another goroutine:
// prefer t.Error in it; a t.Fatal (runtime.Goexit) there ends fn and then the test, through
// t.FailNow on the caller's goroutine. A panic in fn is re-raised on the caller's goroutine so
// that the fuzzer records the input.
func Run(t testing.TB, fn func()) {
	t.Helper()
	RunWithin(t, Bound(), fn)
}

// RunWithin is Run with an explicit bound.
func RunWithin(t testing.TB, d time.Duration, fn func()) {
	t.Helper()
	type outcome struct {
		p      any
		goexit bool
	}
	done := make(chan outcome, 1)
	go func() {
		var o outcome
		returned := false
		defer func() { done <- o }()
		defer func() {
			o.p = recover()
			o.goexit = o.p == nil && !returned
		}()
		fn()
		returned = true
	}()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case o := <-done:
		if o.p != nil {
			panic(o.p)
		}
		if o.goexit {
			t.FailNow()
		}
	case <-timer.C:
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Fatalf("fuzz input did not finish within %v (a hang counts as a failure; SRPD_FUZZ_INPUT_TIMEOUT=%s to change the bound); goroutines:\n%s",
			d, strconv.Quote(d.String()), buf[:n])
	}
}

// Fuzz is the body of a fuzz target over one []byte: check runs on every input under Run, so
// that an input that hangs fails the target. check runs on another goroutine: it reports with
// t.Error and returns.
func Fuzz(f *testing.F, check func(t *testing.T, b []byte)) {
	f.Helper()
	f.Fuzz(func(t *testing.T, b []byte) {
		Run(t, func() { check(t, b) })
	})
}
