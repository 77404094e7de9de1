package target

import (
	"testing"

	"github.com/srpd/srpd/frpool"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
)

func TestComputeResiduals(t *testing.T) {
	cases := []struct {
		name      string
		dir       scsi.Direction
		cdb       uint32
		produced  int
		dOut, dIn uint64
		want      residuals
	}{
		{"read exact", scsi.DirIn, 4096, 4096, 0, 4096, residuals{xferIn: 4096}},
		{"write exact", scsi.DirOut, 4096, 0, 4096, 0, residuals{xferOut: 4096}},
		{"no data", scsi.DirNone, 0, 0, 0, 0, residuals{}},
		{"read: buffer too small", scsi.DirIn, 8192, 8192, 0, 4096,
			residuals{xferIn: 4096, flags: srp.DIOver, diResid: 4096}},
		{"read: buffer too large", scsi.DirIn, 4096, 4096, 0, 8192,
			residuals{xferIn: 4096, flags: srp.DIUnder, diResid: 4096}},
		{"short inquiry", scsi.DirIn, 255, 36, 0, 255,
			residuals{xferIn: 36, flags: srp.DIUnder, diResid: 219}},
		{"write: buffer too small", scsi.DirOut, 8192, 0, 4096, 0,
			residuals{xferOut: 4096, flags: srp.DOOver, doResid: 4096}},
		{"write: buffer too large", scsi.DirOut, 4096, 0, 6144, 0,
			residuals{xferOut: 4096, flags: srp.DOUnder, doResid: 2048}},
		{"read with a data-out buffer only", scsi.DirIn, 512, 512, 512, 0,
			residuals{flags: srp.DOUnder | srp.DIOver, doResid: 512, diResid: 512}},
		{"no-data command with buffers", scsi.DirNone, 0, 0, 100, 200,
			residuals{flags: srp.DOUnder | srp.DIUnder, doResid: 100, diResid: 200}},
		{"write, no descriptor", scsi.DirOut, 512, 0, 0, 0,
			residuals{flags: srp.DOOver, doResid: 512}},
		{"huge descriptor saturates", scsi.DirNone, 0, 0, 1 << 40, 0,
			residuals{flags: srp.DOUnder, doResid: 1<<32 - 1}},
		{"failed read produced nothing", scsi.DirIn, 4096, 0, 0, 4096,
			residuals{flags: srp.DIUnder, diResid: 4096}},
	}
	for _, tc := range cases {
		got := computeResiduals(tc.dir, tc.cdb, tc.produced, tc.dOut, tc.dIn)
		if got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
		// Whatever the case, the flags are encodable (never over and under at once).
		var b [64]byte
		if _, err := srp.Rsp(b[:]).Encode(&srp.RspFields{Flags: got.flags}, 0); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func TestSegments(t *testing.T) {
	list := make(srp.DescList, 4*srp.DirectDescLen)
	list.Set(0, srp.DirectDesc{VA: 0x1000, Key: 1, Len: 100})
	list.Set(1, srp.DirectDesc{VA: 0x9000, Key: 2, Len: 0})
	list.Set(2, srp.DirectDesc{VA: 0x2000, Key: 3, Len: 300})
	list.Set(3, srp.DirectDesc{VA: 0x3000, Key: 4, Len: 50})
	s := descSet{list: list}
	if s.length() != 450 || s.count() != 4 {
		t.Fatalf("length %d count %d", s.length(), s.count())
	}
	got := s.segments(nil, 450)
	want := []frpool.RemoteSeg{{Addr: 0x1000, RKey: 1, Len: 100}, {Addr: 0x2000, RKey: 3, Len: 300}, {Addr: 0x3000, RKey: 4, Len: 50}}
	if len(got) != len(want) {
		t.Fatalf("%+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("seg %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	got = s.segments(got[:0], 150) // trimmed to the transfer
	if len(got) != 2 || got[1] != (frpool.RemoteSeg{Addr: 0x2000, RKey: 3, Len: 50}) {
		t.Fatalf("trimmed: %+v", got)
	}
	if got = s.segments(got[:0], 0); len(got) != 0 {
		t.Fatalf("zero: %+v", got)
	}
	d := descSet{isDirect: true, direct: srp.DirectDesc{VA: 7, Key: 8, Len: 9}}
	if got = d.segments(nil, 9); len(got) != 1 || got[0] != (frpool.RemoteSeg{Addr: 7, RKey: 8, Len: 9}) || d.length() != 9 {
		t.Fatalf("direct: %+v", got)
	}
}

// TestCredits walks the credit rules and checks the invariant
// reqLim + outstanding + pending == depth at every step.
func TestCreditAccounting(t *testing.T) {
	c := newCredits(4)
	out := 0
	check := func(step string) {
		t.Helper()
		if int(c.reqLim)+out+int(c.pending) != int(c.depth) {
			t.Fatalf("%s: reqLim %d + outstanding %d + pending %d != %d", step, c.reqLim, out, c.pending, c.depth)
		}
	}
	for i := 0; i < 4; i++ {
		if !c.consume() {
			t.Fatalf("request %d refused", i)
		}
		out++
		check("consume")
	}
	if c.consume() {
		t.Fatal("overrun accepted")
	}
	out++
	check("overrun")
	// respond answers a request, dropped ends one without a response (an aborted command).
	respond := func(step string, want int32) {
		t.Helper()
		if d := c.respond(); d != want {
			t.Fatalf("%s: delta %d, want %d", step, d, want)
		}
		out--
		check(step)
	}
	dropped := func() {
		t.Helper()
		c.dropped()
		out--
		check("dropped")
	}
	respond("overrun answered", 1)
	dropped()
	dropped()
	respond("respond (1 + 2 owed)", 3)
	dropped()
	if d := c.credReq(); d != 1 {
		t.Fatalf("cred req delta %d", d)
	}
	check("cred req")
	if d := c.credReq(); d != 0 {
		t.Fatalf("second cred req delta %d", d)
	}
	if c.reqLim != 4 || out != 0 || c.overruns != 1 || c.returned != 5 {
		t.Fatalf("end: %+v out %d", c, out)
	}
}

// TestDispatchRule checks the lunQueue's choice of the next command against the ordering
// rules: HEAD OF QUEUE always, SIMPLE unless an earlier ORDERED is undispatched, ORDERED only
// when everything before it is dispatched.
func TestDispatchRule(t *testing.T) {
	type cmd struct {
		attr  scsi.TaskAttr
		ready bool
	}
	const S, O, H = scsi.TaskSimple, scsi.TaskOrdered, scsi.TaskHeadOfQueue
	cases := []struct {
		name string
		q    []cmd
		want int // index dispatched, -1 none
	}{
		{"empty", nil, -1},
		{"simple ready", []cmd{{S, true}}, 0},
		{"simple behind unready simple", []cmd{{S, false}, {S, true}}, 1},
		{"simple behind unready ordered", []cmd{{O, false}, {S, true}}, -1},
		{"hoq behind unready ordered", []cmd{{O, false}, {S, true}, {H, true}}, 2},
		{"ordered behind unready simple", []cmd{{S, false}, {O, true}}, -1},
		{"ordered first", []cmd{{O, true}, {S, true}}, 0},
		{"ordered behind ready simple", []cmd{{S, true}, {O, true}}, 0},
		{"aca fails at once", []cmd{{O, false}, {scsi.TaskACA, true}}, 1},
		{"nothing ready", []cmd{{S, false}, {O, false}, {H, false}}, -1},
	}
	for _, tc := range cases {
		q := &lunQueue{}
		cs := make([]*ioCtx, len(tc.q))
		for i, x := range tc.q {
			c := &ioCtx{idx: i}
			c.cmd.Attr = x.attr
			c.qstate = qUnready
			if x.ready {
				c.qstate = qReady
			}
			cs[i] = c
			q.pending.push(c, qLink)
		}
		got := q.nextLocked()
		switch {
		case tc.want < 0 && got != nil:
			t.Errorf("%s: dispatched %d", tc.name, got.idx)
		case tc.want >= 0 && got != cs[tc.want]:
			t.Errorf("%s: dispatched %v, want %d", tc.name, got, tc.want)
		case got != nil && (got.qstate != qDispatched || got.qLink != (qlink{})):
			t.Errorf("%s: dispatched command not taken out", tc.name)
		}
	}
	// Draining a queue in dispatch order respects the rule step by step.
	q := &lunQueue{}
	attrs := []scsi.TaskAttr{S, S, O, S, H, O, S}
	for i, a := range attrs {
		c := &ioCtx{idx: i}
		c.cmd.Attr = a
		c.qstate = qReady
		q.pending.push(c, qLink)
	}
	var order []int
	for c := q.nextLocked(); c != nil; c = q.nextLocked() {
		order = append(order, c.idx)
	}
	want := []int{0, 1, 2, 3, 4, 5, 6}
	if len(order) != len(want) {
		t.Fatalf("order %v", order)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("order %v, want %v", order, want)
		}
	}
}

func TestCmdCtx(t *testing.T) {
	var c cmdCtx
	if c.Err() != nil {
		t.Fatal("fresh context cancelled")
	}
	d := c.Done()
	select {
	case <-d:
		t.Fatal("done before cancel")
	default:
	}
	c.cancel()
	<-d
	if c.Err() == nil {
		t.Fatal("no error after cancel")
	}
	c.reset()
	c.cancel() // cancel before anyone asked for Done
	<-c.Done()
	c.reset()
	if c.Err() != nil {
		t.Fatal("reset did not clear")
	}
}

// TestInvalidateKey: a response may invalidate the initiator's registration only when the
// command's data went through exactly one direct descriptor of non-zero length.
func TestInvalidateKey(t *testing.T) {
	direct := func(key, n uint32) descSet {
		return descSet{isDirect: true, direct: srp.DirectDesc{VA: 0x1000, Key: key, Len: n}}
	}
	list := make(srp.DescList, 2*srp.DirectDescLen)
	list.Set(0, srp.DirectDesc{VA: 0x1000, Key: 7, Len: 4096})
	list.Set(1, srp.DirectDesc{VA: 0x9000, Key: 8, Len: 4096})
	for _, tc := range []struct {
		name    string
		in, out descSet
		key     uint32
		ok      bool
	}{
		{"no data", descSet{}, descSet{}, 0, false},
		{"data-in direct", direct(0x1234, 4096), descSet{}, 0x1234, true},
		{"data-out direct", descSet{}, direct(0x5678, 512), 0x5678, true},
		{"zero-length direct", direct(0x1234, 0), descSet{}, 0, false},
		{"bidirectional", direct(1, 512), direct(2, 512), 0, false},
		{"indirect list of two", descSet{list: list}, descSet{}, 0, false},
		{"indirect list of one", descSet{list: list[:srp.DirectDescLen]}, descSet{}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &ioCtx{in: tc.in, out: tc.out}
			key, ok := c.invalidateKey()
			if key != tc.key || ok != tc.ok {
				t.Fatalf("invalidateKey = %#x, %v; want %#x, %v", key, ok, tc.key, tc.ok)
			}
		})
	}
}
