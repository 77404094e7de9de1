package initiator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/srpd/srpd/initiator/nbd"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/transport/softroce/link"
)

// TestSCSIErrors: failures the target reports come back as *SCSIError with the status and the
// decoded sense, matching the category sentinels, and map to the NBD errno a client expects.
func TestSCSIErrors(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{})
	s := e.dial(e.config())
	l := s.LUNs()[0]
	ctx := ctxT(t, 30*time.Second)

	// An opcode the LUN does not know.
	_, err := l.Command(ctx, []byte{0xc7, 0, 0, 0, 0, 0}, nil, nil)
	var se *SCSIError
	if !errors.As(err, &se) || se.Status != scsi.StatusCheckCondition || se.Sense.Key != scsi.IllegalRequest ||
		!errors.Is(err, ErrNotSupported) || !errors.Is(err, ErrIllegalRequest) || errors.Is(err, ErrMediumError) {
		t.Errorf("invalid opcode: %v", err)
	}
	if NBDErrno(err, false) != nbd.EINVAL {
		t.Errorf("invalid opcode → %v", NBDErrno(err, false))
	}

	// A medium error on a read.
	e.tgt.mu.Lock()
	e.tgt.refuse = func(cdb []byte) *scsi.Sense {
		if cdb[0] == scsi.OpRead16 && binary.BigEndian.Uint64(cdb[2:]) <= 300 && binary.BigEndian.Uint64(cdb[2:])+uint64(binary.BigEndian.Uint32(cdb[10:])) > 300 {
			return &scsi.Sense{Key: scsi.MediumError, ASC: 0x11, ASCQ: 0x00, InfoValid: true, Info: 300}
		}
		return nil
	}
	e.tgt.mu.Unlock()
	err = l.ReadAt(ctx, make([]byte, 8192), 296*512)
	if !errors.As(err, &se) || !errors.Is(err, ErrMediumError) || se.LBA != 296 || se.Sense.Info != 300 || errors.Is(err, ErrReservationConflict) {
		t.Errorf("medium error: %v", err)
	}
	if NBDErrno(err, false) != nbd.EIO || nbd.ErrnoOf(NBDDevice(l).ReadAt(ctx, make([]byte, 512), 300*512)) != nbd.EIO {
		t.Errorf("medium error → %v", NBDErrno(err, false))
	}
	e.tgt.mu.Lock()
	e.tgt.refuse = nil
	e.tgt.mu.Unlock()

	// Unaligned and out-of-range requests never reach the target.
	if err := l.ReadAt(ctx, make([]byte, 100), 0); !errors.Is(err, ErrRange) || NBDErrno(err, false) != nbd.EINVAL {
		t.Errorf("unaligned: %v", err)
	}
	if err := l.WriteAt(ctx, make([]byte, 512), l.Size(), false); !errors.Is(err, ErrRange) || NBDErrno(err, true) != nbd.ENOSPC {
		t.Errorf("beyond the end: %v", err)
	}
}

// TestReservationConflict: a write from a second initiator while the first holds a WRITE
// EXCLUSIVE persistent reservation fails with RESERVATION CONFLICT; reads still work.
func TestReservationConflict(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{})
	a := e.dial(e.config())
	cfgB := e.config()
	cfgB.InitiatorExt = 0xb
	b := e.dial(cfgB)
	ctx := ctxT(t, 30*time.Second)
	la, lb := a.LUNs()[0], b.LUNs()[0]
	prOut := func(l *LUN, sa byte, typ byte, key, saKey uint64) error {
		param := make([]byte, 24)
		binary.BigEndian.PutUint64(param, key)
		binary.BigEndian.PutUint64(param[8:], saKey)
		cdb := []byte{scsi.OpPersistentResvOut, sa, typ, 0, 0, 0, 0, 0, 24, 0}
		_, err := l.Command(ctx, cdb, nil, param)
		return err
	}
	if err := prOut(la, 0x00, 0, 0, 0xaaaa); err != nil { // REGISTER
		t.Fatal(err)
	}
	if err := prOut(la, 0x01, 0x01, 0xaaaa, 0); err != nil { // RESERVE, WRITE EXCLUSIVE
		t.Fatal(err)
	}
	err := lb.WriteAt(ctx, make([]byte, 512), 0, false)
	var se *SCSIError
	if !errors.As(err, &se) || se.Status != scsi.StatusReservationConflict || !errors.Is(err, ErrReservationConflict) ||
		errors.Is(err, ErrMediumError) {
		t.Fatalf("write from B: %v", err)
	}
	if NBDErrno(err, true) != nbd.EIO {
		t.Errorf("conflict → %v", NBDErrno(err, true))
	}
	if err := lb.ReadAt(ctx, make([]byte, 512), 0); err != nil {
		t.Errorf("read from B: %v", err)
	}
	if err := la.WriteAt(ctx, make([]byte, 512), 0, false); err != nil {
		t.Errorf("write from the holder: %v", err)
	}
}

// TestReadOnlyLUN: a write-protected LUN reports ReadOnly; writes fail without being sent.
func TestReadOnlyLUN(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{readOnly: true})
	s := e.dial(e.config())
	l := s.LUNs()[0]
	ctx := ctxT(t, 10*time.Second)
	if !l.ReadOnly() || l.CanDiscard() {
		t.Fatalf("read only %v, can discard %v", l.ReadOnly(), l.CanDiscard())
	}
	before := e.tgt.cmds.Load()
	for _, err := range []error{
		l.WriteAt(ctx, make([]byte, 512), 0, false),
		l.Discard(ctx, 0, 512),
		l.WriteZeroes(ctx, 0, 512, false),
	} {
		if !errors.Is(err, ErrReadOnly) || NBDErrno(err, true) != nbd.EPERM {
			t.Errorf("got %v", err)
		}
	}
	if e.tgt.cmds.Load() != before {
		t.Errorf("commands were sent")
	}
	if err := NBDDevice(l).WriteAt(ctx, make([]byte, 512), 0, false); nbd.ErrnoOf(err) != nbd.EPERM {
		t.Errorf("NBD write: %v", err)
	}
}

// TestBlockOps: WriteZeroes (WRITE SAME with and without UNMAP, and the WRITE fallback for a
// LUN that refuses WRITE SAME), Discard, Flush, a transfer split into many commands, and a unit
// attention (I_T nexus loss) retried transparently; all through the NBD adapter as well.
func TestBlockOps(t *testing.T) {
	e := newMemEnv(t, link.PipeConfig{}, tgtConfig{})
	s := e.dial(e.config())
	l := s.LUNs()[0]
	dev := NBDDevice(l)
	ctx := ctxT(t, 60*time.Second)
	if dev.Size() != l.Size() || dev.BlockSize() != 512 || !dev.CanDiscard() || dev.ReadOnly() {
		t.Fatalf("NBD device %d %d %v %v", dev.Size(), dev.BlockSize(), dev.CanDiscard(), dev.ReadOnly())
	}
	ones := bytes.Repeat([]byte{0xff}, 1<<20)
	zero := make([]byte, 1<<20)
	got := make([]byte, 1<<20)
	for _, noUnmap := range []bool{false, true} {
		if err := dev.WriteAt(ctx, ones, 0, false); err != nil {
			t.Fatal(err)
		}
		if err := dev.WriteZeroes(ctx, 4096, 512<<10, noUnmap); err != nil {
			t.Fatal(err)
		}
		if err := dev.ReadAt(ctx, got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[:4096], ones[:4096]) || !bytes.Equal(got[4096:4096+512<<10], zero[:512<<10]) ||
			!bytes.Equal(got[4096+512<<10:], ones[4096+512<<10:]) {
			t.Fatalf("write zeroes (noUnmap %v): wrong data", noUnmap)
		}
	}
	// A LUN refusing WRITE SAME: zeroes are written with WRITE(16).
	e.tgt.mu.Lock()
	e.tgt.refuse = func(cdb []byte) *scsi.Sense {
		if cdb[0] == scsi.OpWriteSame16 {
			return &scsi.Sense{Key: scsi.IllegalRequest, ASC: 0x20}
		}
		return nil
	}
	e.tgt.mu.Unlock()
	if err := dev.WriteAt(ctx, ones, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := dev.WriteZeroes(ctx, 512, 700<<10, false); err != nil {
		t.Fatal(err)
	}
	if !l.noWSame.Load() {
		t.Error("no fallback recorded")
	}
	if err := dev.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[512:512+700<<10], zero[:700<<10]) || !bytes.Equal(got[:512], ones[:512]) {
		t.Fatal("fallback zeroes: wrong data")
	}
	// Discard (LBPRZ: zeroes afterwards) and Flush.
	if err := dev.Discard(ctx, 0, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := dev.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := dev.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, zero) {
		t.Fatalf("after discard: %v", err)
	}
	// 4 MiB with 256 KiB commands: 16 commands each way.
	big := bytes.Repeat([]byte("0123456789abcdef"), 4<<20/16)
	before := e.tgt.cmds.Load()
	if err := l.WriteAt(ctx, big, 8<<20, true); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(big))
	if err := l.ReadAt(ctx, back, 8<<20); err != nil || !bytes.Equal(back, big) {
		t.Fatalf("big read: %v", err)
	}
	if n := e.tgt.cmds.Load() - before; n != 32 {
		t.Errorf("%d commands for 4 MiB each way, want 32", n)
	}
	// Unit attention after an I_T nexus loss: retried transparently.
	ua := s.Stats().UnitAttentions
	e.tgt.lunSet.NexusLost(scsi.Nexus{InitiatorPortID: s.InitiatorPortID(), TargetPortID: testTargetPort})
	if err := l.ReadAt(ctx, got[:512], 0); err != nil {
		t.Fatal(err)
	}
	if s.Stats().UnitAttentions != ua+1 {
		t.Errorf("unit attentions %d → %d", ua, s.Stats().UnitAttentions)
	}
}
