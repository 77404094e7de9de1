package target

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
)

// aluaLUN gives LUN 0 of an env two target port groups: group 1 holds this target's port
// (relative port 1), group 2 another gateway's (relative port 2).
func aluaLUN(i int, c *scsi.LUNConfig) {
	if i != 0 {
		return
	}
	c.ALUA = &scsi.ALUAConfig{
		Groups: []scsi.PortGroup{
			{ID: 1, State: scsi.ALUAActiveOptimized, RelativePorts: []uint16{1}},
			{ID: 2, State: scsi.ALUAActiveNonOptimized, RelativePorts: []uint16{2}},
		},
		Ports: []scsi.TargetPort{{ID: tPort, RelativeID: 1}},
	}
}

// TestALUAThroughTarget drives an implicit ALUA transition of the target's port group while an
// initiator is logged in: its next command gets ASYMMETRIC ACCESS STATE CHANGED, media access
// through the port is refused with NOT READY, TARGET PORT IN STANDBY STATE (a write's data
// does not land), INQUIRY and REPORT TARGET PORT GROUPS still answer; back to
// active/optimized the same happens the other way round.
func TestALUAThroughTarget(t *testing.T) {
	e := newEnv(t, envOpts{nLUNs: 2, plainRAM: true, lunConfig: aluaLUN})
	in := e.mustLogin(defaultLogin())
	in.clearUA(0, 1)
	rng := rand.New(rand.NewPCG(1, 2))
	tur := []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}
	rtpg := []byte{scsi.OpMaintenanceIn, scsi.SAReportTargetPortGrps, 0, 0, 0, 0, 0, 0, 0, 255, 0, 0}

	if err := e.luns[0].SetALUAState(1, scsi.ALUAStandby); err != nil {
		t.Fatal(err)
	}
	r, _ := in.simple(0, tur, 0)
	wantCheck(t, r, scsi.UnitAttention, 0x2A, 0x06)
	r, _ = in.simple(0, tur, 0)
	wantCheck(t, r, scsi.NotReady, 0x04, 0x0B)
	// LUN 1 has no ALUA: untouched.
	if r, _ := in.simple(1, tur, 0); r.Status() != uint8(scsi.StatusGood) {
		t.Fatalf("LUN 1: status %#x", r.Status())
	}

	w := &xfer{lun: 0, write: true, lba: 8, blocks: 4, mode: modeDirect}
	in.issue(w, 2, rng)
	r = in.await(w.tag)
	wantCheck(t, r, scsi.NotReady, 0x04, 0x0B)
	rd := &xfer{lun: 0, lba: 8, blocks: 4, mode: modeDirect}
	in.issue(rd, 1, rng)
	wantCheck(t, in.await(rd.tag), scsi.NotReady, 0x04, 0x0B)

	r, d := in.simple(0, []byte{scsi.OpInquiry, 0, 0, 0, 96, 0}, 96)
	if r.Status() != uint8(scsi.StatusGood) || d[5]&0x30 != 0x10 {
		t.Fatalf("INQUIRY in standby: status %#x, TPGS byte %#x", r.Status(), d[5])
	}
	r, d = in.simple(0, rtpg, 255)
	want := []byte{0, 0, 0, 24,
		0x02, 0x8F, 0, 1, 0, 0x02, 0, 1, 0, 0, 0, 1,
		0x01, 0x8F, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2}
	if r.Status() != uint8(scsi.StatusGood) || !bytes.Equal(d[:len(want)], want) {
		t.Fatalf("RTPG in standby: status %#x\n got % x\nwant % x", r.Status(), d[:len(want)], want)
	}

	if err := e.luns[0].SetALUAState(1, scsi.ALUAActiveOptimized); err != nil {
		t.Fatal(err)
	}
	r, _ = in.simple(0, tur, 0)
	wantCheck(t, r, scsi.UnitAttention, 0x2A, 0x06)
	// The refused write left nothing: the LUN still reads as zeroes there.
	rd = &xfer{lun: 0, lba: 8, blocks: 4, mode: modeDirect}
	in.issue(rd, 1, rng)
	in.complete(rd)
	w = &xfer{lun: 0, write: true, lba: 8, blocks: 4, mode: modeDirect}
	in.issue(w, 2, rng)
	in.complete(w)
	rd = &xfer{lun: 0, lba: 8, blocks: 4, mode: modeDirect}
	in.issue(rd, 1, rng)
	in.complete(rd)
}

// TestALUAUnitAttentionEveryNexus checks that a transition reaches every I_T nexus through the
// group's port — two initiators here — and each only once.
func TestALUAUnitAttentionEveryNexus(t *testing.T) {
	e := newEnv(t, envOpts{plainRAM: true, lunConfig: aluaLUN,
		defACL: func(luns []*scsi.LUN) *ACL { return &ACL{LUNs: []LUNMapping{{Number: 0, LUN: luns[0]}}} }})
	a := e.mustLogin(defaultLogin())
	other := defaultLogin()
	other.InitiatorPortID = srp.MakePortID(0x1234, 0x5678)
	b := e.mustLogin(other)
	a.clearUA(0)
	b.clearUA(0)
	tur := []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}

	if err := e.luns[0].SetALUAState(1, scsi.ALUAUnavailable); err != nil {
		t.Fatal(err)
	}
	for _, in := range []*tini{a, b} {
		r, _ := in.simple(0, tur, 0)
		wantCheck(t, r, scsi.UnitAttention, 0x2A, 0x06)
		r, _ = in.simple(0, tur, 0)
		wantCheck(t, r, scsi.NotReady, 0x04, 0x0C)
	}
	// The other gateway's group changing is news for no nexus here.
	if err := e.luns[0].SetALUAState(2, scsi.ALUAStandby); err != nil {
		t.Fatal(err)
	}
	r, _ := a.simple(0, tur, 0)
	wantCheck(t, r, scsi.NotReady, 0x04, 0x0C)
}
