package target

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce"
	"github.com/srpd/srpd/transport/softroce/link"
)

// faultDev wraps a real device: the failAt-th resource step of any kind (counting from 1)
// fails with transport.ErrNoResources, and every object created through it is counted live
// until closed, so that a test sees what a failed channel creation leaves behind.
type faultDev struct {
	transport.Device
	mu     sync.Mutex
	failAt int            // 0: never
	steps  []string       // the steps taken, in order
	live   map[string]int // objects created and not yet closed, by kind
}

func newFaultDev(d transport.Device, failAt int) *faultDev {
	return &faultDev{Device: d, failAt: failAt, live: map[string]int{}}
}

// step records a step and reports whether it must fail.
func (d *faultDev) step(name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.steps = append(d.steps, name)
	if len(d.steps) == d.failAt {
		return fmt.Errorf("injected failure at step %d (%s): %w", d.failAt, name, transport.ErrNoResources)
	}
	return nil
}

func (d *faultDev) add(kind string, n int) {
	d.mu.Lock()
	d.live[kind] += n
	d.mu.Unlock()
}

func (d *faultDev) leaks() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]int{}
	for k, n := range d.live {
		if n != 0 {
			out[k] = n
		}
	}
	return out
}

// create is one resource step: it fails if it is the failAt-th, else creates the object and
// counts it live (as kind) until the wrapper wrap returns is closed.
func create[T, W any](d *faultDev, step, kind string, mk func() (T, error), wrap func(T, *live) W) (W, error) {
	var zero W
	if err := d.step(step); err != nil {
		return zero, err
	}
	v, err := mk()
	if err != nil {
		return zero, err
	}
	d.add(kind, 1)
	return wrap(v, &live{d: d, kind: kind}), nil
}

// live is an object counted by faultDev until its first close.
type live struct {
	d    *faultDev
	kind string
	once sync.Once
}

func (l *live) closed() { l.once.Do(func() { l.d.add(l.kind, -1) }) }

func (d *faultDev) AllocPD() (transport.PD, error) {
	return create(d, "AllocPD", "PD", d.Device.AllocPD,
		func(v transport.PD, l *live) transport.PD { return &faultPD{PD: v, d: d, l: l} })
}

func (d *faultDev) CreateCQ(n int) (transport.CQ, error) {
	return create(d, "CreateCQ", "CQ", func() (transport.CQ, error) { return d.Device.CreateCQ(n) },
		func(v transport.CQ, l *live) transport.CQ { return &faultCQ{CQ: v, l: l} })
}

func (d *faultDev) AllocMemory(n int) (transport.Memory, error) {
	return create(d, "AllocMemory", "Memory", func() (transport.Memory, error) { return d.Device.AllocMemory(n) },
		func(v transport.Memory, l *live) transport.Memory { return &faultMem{Memory: v, l: l} })
}

type faultCQ struct {
	transport.CQ
	l *live
}

func (c *faultCQ) Close() error { c.l.closed(); return c.CQ.Close() }

type faultMem struct {
	transport.Memory
	l *live
}

func (m *faultMem) Free() error { m.l.closed(); return m.Memory.Free() }

type faultPD struct {
	transport.PD
	d *faultDev
	l *live
}

func (p *faultPD) Close() error { p.l.closed(); return p.PD.Close() }

func wrapMR(v transport.MR, l *live) transport.MR { return &faultMR{MR: v, l: l} }

func (p *faultPD) RegMR(addr, n uint64, a transport.Access) (transport.MR, error) {
	return create(p.d, "RegMR", "MR", func() (transport.MR, error) { return p.PD.RegMR(addr, n, a) }, wrapMR)
}

func (p *faultPD) AllocFastRegMR(pages int) (transport.MR, error) {
	return create(p.d, "AllocFastRegMR", "MR", func() (transport.MR, error) { return p.PD.AllocFastRegMR(pages) }, wrapMR)
}

func (p *faultPD) CreateQP(attr transport.QPInitAttr) (transport.QP, error) {
	// The engine wants its own CQs.
	if c, ok := attr.SendCQ.(*faultCQ); ok {
		attr.SendCQ = c.CQ
	}
	if c, ok := attr.RecvCQ.(*faultCQ); ok {
		attr.RecvCQ = c.CQ
	}
	return create(p.d, "CreateQP", "QP", func() (transport.QP, error) { return p.PD.CreateQP(attr) },
		func(v transport.QP, l *live) transport.QP { return &faultQP{QP: v, d: p.d, l: l} })
}

type faultMR struct {
	transport.MR
	l *live
}

func (m *faultMR) Close() error { m.l.closed(); return m.MR.Close() }

type faultQP struct {
	transport.QP
	d *faultDev
	l *live
}

func (q *faultQP) Close() error { q.l.closed(); return q.QP.Close() }

func (q *faultQP) Modify(attr *transport.QPAttr, mask transport.QPAttrMask) error {
	if err := q.d.step("Modify"); err != nil {
		return err
	}
	return q.QP.Modify(attr, mask)
}

func (q *faultQP) PostRecv(wrs []transport.RecvWR) error {
	if err := q.d.step("PostRecv"); err != nil {
		return err
	}
	return q.QP.PostRecv(wrs)
}

// loginAs is linuxLogin from another initiator port.
func loginAs(n uint64) srp.LoginReq {
	r := linuxLogin()
	r.InitiatorPortID = srp.MakePortID(n, 0x5054_00ff_fe77_0002)
	return r
}

// TestNewChannelFailsAtEveryStep makes each resource step of a channel's creation fail in
// turn: the login is rejected with "insufficient resources" (cause resources), nothing
// panics, nothing created before the failing step is left open, and the target's counters and
// session table are back to empty. Then a login on the healthy device succeeds, so a failure
// leaves the target usable.
func TestNewChannelFailsAtEveryStep(t *testing.T) {
	e := newEnv(t, envOpts{limits: Limits{QueueDepth: 4, MaxTransfer: 64 << 10}, defACL: anyACL})
	// A dry run counts the steps of one successful creation.
	probe := newFaultDev(e.tdev, 0)
	pc, d, err := e.tgt.Login(probe, loginAs(1), ConnInfo{})
	if err != nil || !d.Accepted {
		t.Fatalf("probe login: %v %v", err, d.Rej.Reason)
	}
	pc.Abort()
	if l := probe.leaks(); len(l) != 0 {
		t.Fatalf("an aborted pending channel leaves %v", l)
	}
	nSteps := len(probe.steps)
	if nSteps < 8 {
		t.Fatalf("only %d steps in a channel creation: %v", nSteps, probe.steps)
	}
	seen := map[string]bool{}
	for i := 1; i <= nSteps; i++ {
		fd := newFaultDev(e.tdev, i)
		pc, d, err := e.tgt.Login(fd, loginAs(uint64(100+i)), ConnInfo{})
		name := fd.steps[len(fd.steps)-1]
		seen[name] = true
		if pc != nil || d.Accepted {
			t.Fatalf("step %d (%s) failing: login accepted", i, name)
		}
		if !errors.Is(err, transport.ErrNoResources) {
			t.Errorf("step %d (%s): error %v, want ErrNoResources", i, name, err)
		}
		if d.Rej.Reason != srp.RejInsufficientResources || d.Cause != CauseResources {
			t.Errorf("step %d (%s): rejected with %v / %v", i, name, d.Rej.Reason, d.Cause)
		}
		if l := fd.leaks(); len(l) != 0 {
			t.Errorf("step %d (%s) failing leaves %v open", i, name, l)
		}
		s := e.tgt.Stats()
		if s.Sessions != 0 || s.MRs != 0 || s.MemoryBytes != 0 {
			t.Errorf("step %d (%s): %d sessions, %d MRs, %d bytes left", i, name, s.Sessions, s.MRs, s.MemoryBytes)
		}
	}
	for _, want := range []string{"AllocPD", "CreateCQ", "CreateQP", "AllocFastRegMR", "AllocMemory", "RegMR", "Modify", "PostRecv"} {
		if !seen[want] {
			t.Errorf("step %s never failed (steps: %v)", want, probe.steps)
		}
	}
	in := e.mustLogin(defaultLogin())
	in.clearUA(0)
	if r, _ := in.simple(0, []byte{scsi.OpTestUnitReady, 0, 0, 0, 0, 0}, 0); r.Status() != 0 {
		t.Fatalf("TEST UNIT READY after the failures: status %#x", r.Status())
	}
}

// anyACL admits every initiator to every LUN.
func anyACL(luns []*scsi.LUN) *ACL {
	a := &ACL{}
	for i, l := range luns {
		a.LUNs = append(a.LUNs, LUNMapping{Number: uint16(i), LUN: l})
	}
	return a
}

// TestLoginAtQPLimit: a device with room for two QPs takes two logins; the third is rejected
// with "insufficient resources" instead of crashing the target (main at 7251021 panicked with
// a nil channel in newChannel's cleanup).
func TestLoginAtQPLimit(t *testing.T) {
	e := newEnv(t, envOpts{limits: Limits{QueueDepth: 4, MaxTransfer: 64 << 10}, defACL: anyACL})
	a, b := netip.MustParseAddr("127.0.0.3"), netip.MustParseAddr("127.0.0.4")
	la, lb := link.NewPipe(a, b, link.PipeConfig{QueueLen: 16})
	defer lb.Close()
	dev, err := softroce.Open(softroce.Config{Link: la, Name: "small", MaxQP: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close(e.ctx)
	var pcs []*PendingChannel
	for i := 1; i <= 3; i++ {
		pc, d, err := e.tgt.Login(dev, loginAs(uint64(i)), ConnInfo{})
		if i <= 2 {
			if !d.Accepted || err != nil {
				t.Fatalf("login %d: %v %v", i, d.Rej.Reason, err)
			}
			pcs = append(pcs, pc)
			continue
		}
		if d.Accepted || pc != nil {
			t.Fatal("third login accepted on a device with 2 QPs")
		}
		if d.Rej.Reason != srp.RejInsufficientResources || d.Cause != CauseResources || !errors.Is(err, transport.ErrNoResources) {
			t.Fatalf("third login: %v / %v / %v", d.Rej.Reason, d.Cause, err)
		}
	}
	for _, pc := range pcs {
		pc.Abort()
	}
	if s := e.tgt.Stats(); s.Sessions != 0 || s.MRs != 0 || s.MemoryBytes != 0 {
		t.Fatalf("after aborts: %+v", s)
	}
}
