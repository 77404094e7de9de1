package fuzzbound

import (
	"runtime"
	"testing"
	"time"
)

// fakeTB records a Fatalf without stopping the test goroutine.
type fakeTB struct {
	testing.TB
	fatal     string
	failedNow bool
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = format
}
func (f *fakeTB) FailNow() { f.failedNow = true }

func TestRunReturns(t *testing.T) {
	ran := false
	RunWithin(t, time.Second, func() { ran = true })
	if !ran {
		t.Fatal("fn did not run")
	}
}

func TestRunHangFails(t *testing.T) {
	f := &fakeTB{TB: t}
	block := make(chan struct{})
	defer close(block)
	RunWithin(f, 50*time.Millisecond, func() { <-block })
	if f.fatal == "" {
		t.Fatal("a hanging input did not fail")
	}
}

func TestRunPanicPropagates(t *testing.T) {
	defer func() {
		if r := recover(); r != "boom" {
			t.Fatalf("recovered %v, want boom", r)
		}
	}()
	RunWithin(t, time.Second, func() { panic("boom") })
	t.Fatal("no panic")
}

func TestBoundEnv(t *testing.T) {
	t.Setenv("SRPD_FUZZ_INPUT_TIMEOUT", "3s")
	if Bound() != 3*time.Second {
		t.Fatalf("Bound() = %v", Bound())
	}
	t.Setenv("SRPD_FUZZ_INPUT_TIMEOUT", "junk")
	if Bound() != Default {
		t.Fatalf("Bound() = %v with a bad value", Bound())
	}
}

func TestRunGoexitFailsNow(t *testing.T) {
	f := &fakeTB{TB: t}
	RunWithin(f, time.Second, func() { runtime.Goexit() })
	if !f.failedNow {
		t.Fatal("a Goexit in fn (t.Fatal on its goroutine) did not end the test")
	}
}
