package initiator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/initiator/nbd"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
)

var _ nbd.Device = (*LUN)(nil) // the block API is the NBD server's Device interface

func TestTags(t *testing.T) {
	tag := makeTag(false, 0x7fffffff, 3, 4095)
	if tag&tagTM != 0 || tag>>16&0xffff != 3 || tag&0xffff != 4095 || (tag>>32)&tagGenMask != 0x7fffffff {
		t.Errorf("tag %#x", tag)
	}
	if makeTag(false, 1<<31|5, 0, 0)>>32 != 5 {
		t.Error("generation not masked to 31 bits")
	}
	if makeTag(true, 1, 2, 0xffff)&tagTM == 0 {
		t.Error("TM bit")
	}
	b := tagBytes(0x0102030405060708)
	if b != (srp.Tag{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Errorf("tag bytes %v", b)
	}
}

func TestSmallerIULen(t *testing.T) {
	var got []uint32
	for n := uint32(9000); n != 0; n = smallerIULen(n) {
		got = append(got, n)
	}
	if fmt.Sprint(got) != "[9000 8260 4164 2116 1092 580 324 196 132 100 84 64]" {
		t.Errorf("ladder %v", got)
	}
}

func TestPickDesignator(t *testing.T) {
	desc := func(assoc, typ byte, v string) []byte {
		return append([]byte{0x01, assoc<<4 | typ, 0, byte(len(v))}, v...)
	}
	var page []byte
	page = append(page, desc(0, 1, "VENDOR  PRODUCT 1")...) // T10 vendor ID
	page = append(page, desc(1, 3, "PORTNAA!")...)          // NAA of the target port: ignored
	page = append(page, desc(0, 2, "EUI64xxx")...)
	id, typ := pickDesignator(page)
	if typ != "eui64" || string(id) != "EUI64xxx" {
		t.Errorf("got %s %q", typ, id)
	}
	page = append(page, desc(0, 3, "NAA16bytesNAA16b")...)
	if id, typ = pickDesignator(page); typ != "naa" || string(id) != "NAA16bytesNAA16b" {
		t.Errorf("got %s %q", typ, id)
	}
	if info := (LUNInfo{ID: id, IDType: typ}); !strings.HasPrefix(info.IDString(), "naa.4e41") {
		t.Errorf("IDString %s", info.IDString())
	}
	if id, typ := pickDesignator([]byte{1, 2, 0, 9, 1}); id != nil || typ != "" {
		t.Errorf("truncated page: %s %q", typ, id)
	}
}

func TestErrorMapping(t *testing.T) {
	cc := func(k scsi.SenseKey, asc, ascq uint8) error {
		return &SCSIError{Op: "WRITE(16)", Status: scsi.StatusCheckCondition, Sense: scsi.Sense{Key: k, ASC: asc, ASCQ: ascq}}
	}
	for _, c := range []struct {
		err   error
		is    error
		write bool
		errno nbd.Errno
	}{
		{cc(scsi.MediumError, 0x11, 0), ErrMediumError, false, nbd.EIO},
		{cc(scsi.HardwareError, 0x44, 0), ErrHardware, true, nbd.EIO},
		{cc(scsi.DataProtect, 0x27, 0x00), ErrReadOnly, true, nbd.EPERM},
		{cc(scsi.DataProtect, 0x27, 0x07), ErrNoSpace, true, nbd.ENOSPC},
		{cc(scsi.IllegalRequest, 0x20, 0), ErrNotSupported, true, nbd.EINVAL},
		{cc(scsi.IllegalRequest, 0x21, 0), ErrRange, true, nbd.ENOSPC},
		{cc(scsi.IllegalRequest, 0x24, 0), ErrIllegalRequest, false, nbd.EINVAL},
		{cc(scsi.NotReady, 0x04, 0x02), ErrNotReady, false, nbd.EIO},
		{&SCSIError{Status: scsi.StatusReservationConflict}, ErrReservationConflict, true, nbd.EIO},
		{&SCSIError{Status: scsi.StatusTaskSetFull}, ErrBusy, false, nbd.EIO},
		{fmt.Errorf("x: %w", ErrFastFail), ErrFastFail, false, nbd.EIO},
		{ErrSessionLost, ErrSessionLost, false, nbd.ESHUTDOWN},
		{ErrClosed, ErrClosed, true, nbd.ESHUTDOWN},
		{&timeoutError{op: "READ(16)", cause: context.DeadlineExceeded}, context.DeadlineExceeded, false, nbd.EIO},
		{&timeoutError{op: "READ(16)", cause: context.Canceled}, ErrTimeout, false, nbd.ESHUTDOWN},
		{&TaskMgmtError{Func: srp.TMLUNReset, Response: srp.TMFailed}, ErrTaskMgmt, false, nbd.EIO},
		{&LoginRejectError{Reason: srp.RejITIULenTooLarge}, ErrLoginRejected, false, nbd.EIO},
	} {
		if !errors.Is(c.err, c.is) {
			t.Errorf("%v: not %v", c.err, c.is)
		}
		if got := NBDErrno(c.err, c.write); got != c.errno {
			t.Errorf("%v: errno %v, want %v", c.err, got, c.errno)
		}
		if got := nbd.ErrnoOf(mapErr(c.err, c.write)); got != c.errno {
			t.Errorf("%v: through the adapter %v, want %v", c.err, got, c.errno)
		}
	}
	if errors.Is(cc(scsi.MediumError, 0x11, 0), ErrReservationConflict) || errors.Is(&SCSIError{Status: scsi.StatusReservationConflict}, ErrMediumError) {
		t.Error("categories overlap")
	}
	if NBDErrno(nil, false) != 0 || mapErr(nil, true) != nil {
		t.Error("nil")
	}
}

func TestConfigDefaults(t *testing.T) {
	e := newMemEnv(t, pipeNone(), tgtConfig{})
	c, err := Config{Device: e.ini, Dialer: e.dialer}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.ReconnectDelay != DefaultReconnectDelay || c.FastIOFailTmo != DefaultFastIOFailTmo || c.DevLossTmo != DefaultDevLossTmo ||
		c.QueueDepth != 64 || c.ChCount != 1 || c.ConnParam.ResponderResources != 4 || c.ConnParam.RetryCount != 6 ||
		c.MaxReconnectDelay != 16*DefaultReconnectDelay || c.Logger == nil {
		t.Errorf("defaults %+v", c)
	}
	for _, bad := range []Config{
		{Device: e.ini},
		{Dialer: e.dialer},
		{Device: e.ini, Dialer: e.dialer, ChCount: 300},
		{Device: e.ini, Dialer: e.dialer, MaxIOSize: 1000},
		{Device: e.ini, Dialer: e.dialer, MaxITIULen: 10},
		{Device: e.ini, Dialer: e.dialer, FastIOFailTmo: Off, DevLossTmo: 700e9},
		{Device: e.ini, Dialer: e.dialer, MaxPagesPerMR: 1 << 20},
	} {
		if _, err := bad.withDefaults(); err == nil {
			t.Errorf("accepted %+v", bad)
		}
	}
}

// TestEarlyCompletion: a command the target answered is signaled to its caller at once, while
// its registration is still being invalidated; the slot goes back to the free list only once
// the caller is done with it and the registration is dead, in either order. A command ended
// without an answer is signaled only once its registrations are dead.
func TestEarlyCompletion(t *testing.T) {
	c := &channel{free: make(chan *request, 1)}
	r := &request{ch: c, done: make(chan struct{}, 1)}
	start := func(out outcome) {
		r.state, r.out, r.signaled, r.callerOff = reqInflight, outNone, false, false
		r.pending, r.ungiven = 1, 1
		c.inflight = 1
		c.mu.Lock()
		r.out = out
		c.finishLocked(r)
		c.mu.Unlock()
	}
	signaled := func() bool {
		select {
		case <-r.done:
			return true
		default:
			return false
		}
	}
	release := func() { // the channel goroutine: LOCAL_INV confirmed, handle given back
		c.mu.Lock()
		r.pending, r.ungiven = 0, 0
		c.finishLocked(r)
		c.mu.Unlock()
	}
	for _, callerFirst := range []bool{true, false} {
		start(outRsp)
		if !signaled() || c.inflight != 0 {
			t.Fatalf("answered command not signaled before its invalidation (inflight %d)", c.inflight)
		}
		if callerFirst {
			c.doneWith(r)
			if len(c.free) != 0 {
				t.Fatal("slot freed while its registration is live")
			}
			release()
		} else {
			release()
			if len(c.free) != 0 || signaled() {
				t.Fatal("slot freed (or signaled twice) before the caller is done")
			}
			c.doneWith(r)
		}
		if len(c.free) != 1 || r.state != reqIdle {
			t.Fatalf("slot not back (free %d, state %v)", len(c.free), r.state)
		}
		<-c.free
	}
	// No answer (aborted): signaled only once the registration is dead.
	start(outAborted)
	if signaled() {
		t.Fatal("aborted command signaled with a live registration")
	}
	release()
	if !signaled() {
		t.Fatal("aborted command not signaled")
	}
	c.doneWith(r)
	if len(c.free) != 1 {
		t.Fatal("slot not back")
	}
}

// TestWatchdogTick: the command-timeout watchdog's period is a sixteenth of the timeout,
// within [1 ms, 250 ms], so a command times out at most 1/16 late (250 ms for long timeouts).
func TestWatchdogTick(t *testing.T) {
	for _, tc := range []struct{ d, want time.Duration }{
		{time.Millisecond, time.Millisecond},
		{160 * time.Millisecond, 10 * time.Millisecond},
		{time.Second, 62500 * time.Microsecond},
		{30 * time.Second, 250 * time.Millisecond},
	} {
		if got := watchdogTick(tc.d); got != tc.want {
			t.Errorf("watchdogTick(%v) = %v, want %v", tc.d, got, tc.want)
		}
	}
}
