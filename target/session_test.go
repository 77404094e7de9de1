package target

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
)

// TestLoginLogout logs in with both login forms, runs I/O, logs out with SRP_I_LOGOUT and
// checks that everything of the channel is released.
func TestLoginLogout(t *testing.T) {
	for _, form := range []string{"rdma-cm-56", "ib-cm-64"} {
		t.Run(form, func(t *testing.T) {
			e := newEnv(t, envOpts{verbose: true})
			req := defaultLogin()
			var b []byte
			if form == "rdma-cm-56" {
				b = make([]byte, srp.LoginReqRDMALen)
				req.EncodeRDMA(b)
			} else {
				b = make([]byte, 92) // IB CM REQ private data
				req.Encode(b)
			}
			dec, err := ParseLoginReq(b)
			if err != nil || dec != req {
				t.Fatalf("decode: %+v %v", dec, err)
			}
			in := e.mustLogin(dec)
			if in.rsp.ReqLimDelta != 16 || in.rsp.MaxITIULen != 8260 || in.rsp.Flags != srp.ImmedSupported ||
				in.rsp.BufFmt != srp.BufFormatDirect|srp.BufFormatIndirect || in.rsp.Tag != req.Tag {
				t.Fatalf("login response %+v", in.rsp)
			}
			if s := e.tgt.Stats(); s.Sessions != 1 || s.Channels != 1 || s.MRs != 1 || s.MemoryBytes == 0 {
				t.Fatalf("stats %+v", s)
			}
			in.clearUA(0)
			rng := rand.New(rand.NewPCG(1, 2))
			w := &xfer{lun: 0, write: true, lba: 8, blocks: 16}
			in.issue(w, 1, rng)
			in.complete(w)
			r := &xfer{lun: 0, lba: 8, blocks: 16}
			in.issue(r, 1, rng)
			in.complete(r)

			ss := e.tgt.Sessions()
			if len(ss) != 1 || len(ss[0].Channels) != 1 || ss[0].Initiator != iPort || ss[0].Channels[0].BytesIn != 8192 ||
				ss[0].Channels[0].BytesOut != 8192 || ss[0].Channels[0].ReqLim != 16 {
				t.Fatalf("sessions %+v", ss)
			}
			var lo [srp.ILogoutLen]byte
			srp.ILogout(lo[:]).Encode(&srp.ILogoutFields{Tag: in.newTag()})
			in.sendIU(lo[:])
			waitDone(t, in.ch)
			if s := e.tgt.Stats(); s.Sessions != 0 || s.Channels != 0 || s.MRs != 0 || s.MemoryBytes != 0 {
				t.Fatalf("after logout: %+v", s)
			}
			if s := e.tgt.Stats(); s.Commands < 3 || s.BytesIn != 8192 || s.BytesOut != 8192 {
				t.Fatalf("totals after logout: %+v", s)
			}
		})
	}
}

// TestNexusLossAfterLogout: a new session of the same initiator sees I_T NEXUS LOSS OCCURRED.
func TestNexusLossAfterLogout(t *testing.T) {
	e := newEnv(t, envOpts{})
	in := e.mustLogin(defaultLogin())
	in.clearUA(0)
	var lo [srp.ILogoutLen]byte
	srp.ILogout(lo[:]).Encode(&srp.ILogoutFields{})
	in.sendIU(lo[:])
	waitDone(t, in.ch)
	in2 := e.mustLogin(defaultLogin())
	r, _ := in2.simple(0, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, 0)
	wantCheck(t, r, scsi.UnitAttention, 0x29, 0x07)
}

func reportLUNs(in *tini, lun uint16) []uint16 {
	in.t.Helper()
	cdb := make([]byte, 12)
	cdb[0] = scsi.OpReportLUNs
	binary.BigEndian.PutUint32(cdb[6:], 1024)
	r, data := in.simple(lun, cdb, 1024)
	if r.Status() != 0 {
		in.t.Fatalf("REPORT LUNS: status %#x sense %x", r.Status(), r.Sense())
	}
	n := binary.BigEndian.Uint32(data) / 8
	var out []uint16
	for i := 0; i < int(n); i++ {
		var a scsi.LUNAddress
		copy(a[:], data[8+8*i:])
		num, _ := a.Number()
		out = append(out, num)
	}
	return out
}

// TestACLMasking: ACL denial, LUN masking (REPORT LUNS and 25/00), read-only LUNs per ACL, and
// a default ACL for unknown initiators.
func TestACLMasking(t *testing.T) {
	other := srp.MakePortID(7, 0x5054_00ff_fe77_0009)
	e := newEnv(t, envOpts{nLUNs: 3,
		acls: func(l []*scsi.LUN) []ACL {
			return []ACL{
				{Name: "a", Initiator: iPort, LUNs: []LUNMapping{{Number: 0, LUN: l[0]}, {Number: 5, LUN: l[2], ReadOnly: true}}},
				{Name: "b", Initiator: iPort2, LUNs: []LUNMapping{{Number: 0, LUN: l[1]}, {Number: 1, LUN: l[2]}}},
			}
		},
	})
	// Unknown initiator without a default ACL: 0x00010006.
	req := defaultLogin()
	req.InitiatorPortID = other
	if _, d := e.loginDirect(req); d.Accepted || d.Rej.Reason != srp.RejChannelLimitReached || d.Cause != CauseNoACL {
		t.Fatalf("unknown initiator: %+v", d)
	}
	if s := e.tgt.Stats(); s.LoginsRejected != 1 || s.Rejects[CauseNoACL] != 1 || s.Sessions != 0 || s.MRs != 0 {
		t.Fatalf("stats %+v", s)
	}

	a := e.mustLogin(defaultLogin())
	a.lunModel = map[uint16]int{5: 2}
	if got := reportLUNs(a, 0); len(got) != 2 || got[0] != 0 || got[1] != 5 {
		t.Fatalf("REPORT LUNS for a: %v", got)
	}
	// REPORT LUNS addressed to a masked LUN still works (SPC: any LUN).
	if got := reportLUNs(a, 1); len(got) != 2 {
		t.Fatalf("REPORT LUNS via LUN 1: %v", got)
	}
	a.clearUA(0, 5)
	// LUN 1 is masked for a (it is LUN 0 of b): LOGICAL UNIT NOT SUPPORTED.
	r, _ := a.simple(1, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, 0)
	wantCheck(t, r, scsi.IllegalRequest, 0x25, 0x00)
	rng := rand.New(rand.NewPCG(3, 4))
	// Read-only for a: writes fail with WRITE PROTECTED, reads work, MODE SENSE shows WP.
	w := &xfer{lun: 5, write: true, lba: 0, blocks: 8}
	a.issue(w, 1, rng)
	wantCheck(t, a.await(w.tag), scsi.DataProtect, 0x27, 0x00)
	rd := &xfer{lun: 5, lba: 0, blocks: 8}
	a.issue(rd, 1, rng)
	a.complete(rd)
	ms := []byte{scsi.OpModeSense6, 0, 0x3F, 0, 255, 0}
	r, data := a.simple(5, ms, 255)
	if r.Status() != 0 || data[2]&0x80 == 0 {
		t.Fatalf("MODE SENSE on a read-only mapping: status %#x, WP %#x", r.Status(), data[2])
	}

	// b sees LUN 2 writable as its LUN 1, and its data shows through a's read-only view.
	b := e.mustLogin(func() srp.LoginReq { r := defaultLogin(); r.InitiatorPortID = iPort2; return r }())
	if got := reportLUNs(b, 0); len(got) != 2 || got[0] != 0 || got[1] != 1 {
		t.Fatalf("REPORT LUNS for b: %v", got)
	}
	b.clearUA(0, 1)
	r, data = b.simple(1, ms, 255)
	if r.Status() != 0 || data[2]&0x80 != 0 {
		t.Fatalf("MODE SENSE on a writable mapping: status %#x, WP %#x", r.Status(), data[2])
	}
	b.lunModel = map[uint16]int{0: 1, 1: 2}
	w = &xfer{lun: 1, write: true, lba: 100, blocks: 4}
	b.issue(w, 1, rng)
	b.complete(w)
	rd = &xfer{lun: 5, lba: 100, blocks: 4}
	a.issue(rd, 1, rng)
	a.complete(rd)

	// A default ACL admits unknown initiators with its own view.
	e2 := newEnv(t, envOpts{nLUNs: 2,
		acls: func(l []*scsi.LUN) []ACL { return nil },
		defACL: func(l []*scsi.LUN) *ACL {
			return &ACL{LUNs: []LUNMapping{{Number: 3, LUN: l[1]}}}
		},
	})
	req = defaultLogin()
	req.InitiatorPortID = other
	c := e2.mustLogin(req)
	if got := reportLUNs(c, 0); len(got) != 1 || got[0] != 3 {
		t.Fatalf("REPORT LUNS for the default ACL: %v", got)
	}
	if ss := e2.tgt.Sessions(); len(ss) != 1 || ss[0].ACL != "default" {
		t.Fatalf("sessions %+v", ss)
	}
}
