package target

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
)

// simpleOut sends a command with a data-out buffer (a parameter list) and waits for its
// response.
func (in *tini) simpleOut(lun uint16, cdb, data []byte) srp.Rsp {
	in.t.Helper()
	f := srp.CmdFields{Tag: in.newTag(), LUN: srp.LUN(scsi.LUNAddressOf(lun)), CDB: cdb}
	r := in.alloc(len(data), 8)
	copy(in.bytes(r), data)
	f.DataOut = srp.DataBuf{Format: srp.DescDirect, Direct: in.desc(r)}
	in.reqLim--
	in.sendIU(in.cmdIU(&f))
	return in.await(f.Tag)
}

// prOut sends PERSISTENT RESERVE OUT (service action sa, type typ) with the reservation key and
// service action reservation key, and returns its SCSI status.
func (in *tini) prOut(sa, typ uint8, key, saKey uint64) uint8 {
	in.t.Helper()
	cdb := []byte{scsi.OpPersistentResvOut, sa, typ, 0, 0, 0, 0, 0, 24, 0}
	p := make([]byte, 24)
	binary.BigEndian.PutUint64(p[0:], key)
	binary.BigEndian.PutUint64(p[8:], saKey)
	return in.simpleOut(0, cdb, p).Status()
}

// TestPreemptAndAbort: PERSISTENT RESERVE OUT PREEMPT AND ABORT from one nexus aborts the
// commands of the nexus it preempts (SPC-4 5.9.11.5): B's WRITE, executing in the backend when
// A preempts B's key, gets no response (the task was aborted), B's credit comes back with
// SRP_CRED_REQ, and B's next command reports REGISTRATIONS PREEMPTED.
func TestPreemptAndAbort(t *testing.T) {
	req2 := defaultLogin()
	req2.InitiatorPortID = iPort2
	e := newEnv(t, envOpts{acls: func(l []*scsi.LUN) []ACL {
		return []ACL{{Initiator: iPort, LUNs: []LUNMapping{{Number: 0, LUN: l[0]}}},
			{Initiator: iPort2, LUNs: []LUNMapping{{Number: 0, LUN: l[0]}}}}
	}, limits: Limits{LUNWorkers: 2}})
	a := e.mustLogin(defaultLogin())
	b := e.mustLogin(req2)
	a.clearUA(0)
	b.clearUA(0)
	const (
		register        = 0x00
		preemptAndAbort = 0x05
		writeExclusive  = 0x01
	)
	if st := a.prOut(register, 0, 0, 0xA); st != 0 {
		t.Fatalf("REGISTER through A: status %#x", st)
	}
	if st := b.prOut(register, 0, 0, 0xB); st != 0 {
		t.Fatalf("REGISTER through B: status %#x", st)
	}
	rng := rand.New(rand.NewPCG(41, 42))
	e.gates[0].hold()
	x := &xfer{lba: 64, blocks: 8, write: true}
	b.issue(x, 1, rng)
	e.gates[0].waitInside(t, 1)
	if st := a.prOut(preemptAndAbort, writeExclusive, 0xA, 0xB); st != 0 {
		t.Fatalf("PREEMPT AND ABORT through A: status %#x", st)
	}
	e.gates[0].release()
	cr, err := srp.ParseCredReq(b.awaitOther(srp.OpCredReq, waitLong))
	if err != nil || cr.ReqLimDelta() != 1 {
		t.Fatalf("SRP_CRED_REQ to B: %v %v; want the aborted WRITE's credit", cr, err)
	}
	b.expectQuiet(100 * time.Millisecond)
	if _, answered := b.pending[x.tag]; answered {
		t.Fatal("B's WRITE was answered: it should have been aborted")
	}
	if st := b.ch.Stats(); st.Aborted != 1 {
		t.Fatalf("B's channel: %d requests aborted, want 1", st.Aborted)
	}
	r, _ := b.simple(0, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, 0)
	wantCheck(t, r, scsi.UnitAttention, 0x2A, 0x05) // REGISTRATIONS PREEMPTED
	// A's own commands go on.
	r, _ = a.simple(0, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, 0)
	if r.Status() != 0 {
		t.Fatalf("A's TEST UNIT READY: status %#x", r.Status())
	}
}
