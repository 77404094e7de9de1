package nbd

import (
	"context"
	"encoding/binary"
	"sync/atomic"
	"testing"
)

// metaData builds NBD_OPT_LIST/SET_META_CONTEXT data: export name, then the queries.
func metaData(export string, queries ...string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(export)))
	b = append(b, export...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(queries)))
	for _, q := range queries {
		b = binary.BigEndian.AppendUint32(b, uint32(len(q)))
		b = append(b, q...)
	}
	return b
}

// metaReplies sends a meta context option and returns the contexts replied (ID and name)
// and the final reply type.
func (c *client) metaReplies(opt uint32, data []byte) (ctxs map[string]uint32, final uint32) {
	c.t.Helper()
	c.sendOpt(opt, data)
	ctxs = map[string]uint32{}
	for {
		r := c.readOptReply()
		if r.opt != opt {
			c.t.Fatalf("reply to option %d, want %d", r.opt, opt)
		}
		if r.typ != repMetaContext {
			return ctxs, r.typ
		}
		if len(r.data) < 4 {
			c.t.Fatalf("NBD_REP_META_CONTEXT of %d bytes", len(r.data))
		}
		ctxs[string(r.data[4:])] = binary.BigEndian.Uint32(r.data)
	}
}

func TestMetaContextNegotiation(t *testing.T) {
	ts := startServer(t, Config{}, handshakeExports())
	alloc := map[string]uint32{metaBaseAllocation: 0}
	selected := map[string]uint32{metaBaseAllocation: metaAllocationID}
	none := map[string]uint32{}
	tests := []struct {
		name       string
		structured bool
		opt        uint32
		data       []byte
		want       map[string]uint32
		final      uint32
	}{
		{"list all", false, optListMetaContext, metaData("disk"), alloc, repAck},
		{"list the base namespace", true, optListMetaContext, metaData("disk", "base:"), alloc, repAck},
		{"list base:allocation", true, optListMetaContext, metaData("disk", metaBaseAllocation), alloc, repAck},
		{"list an unknown context", true, optListMetaContext, metaData("disk", "qemu:dirty-bitmap:x", "base:nope"), none, repAck},
		{"list for an unknown export", true, optListMetaContext, metaData("nope"), none, repErrUnknown},
		{"list with a short query", true, optListMetaContext, metaData("disk", "base:")[:18], none, repErrInvalid},
		{"list with too many queries", true, optListMetaContext, []byte{0, 0, 0, 0, 0, 0, 0, 9}, none, repErrInvalid},
		{"list with trailing bytes", true, optListMetaContext, append(metaData("disk", "base:"), 'x'), none, repErrInvalid},
		{"list with a name past the data", true, optListMetaContext, []byte{0, 0, 0, 9, 'a'}, none, repErrInvalid},
		{"set base:allocation", true, optSetMetaContext, metaData("disk", metaBaseAllocation), selected, repAck},
		{"set on the default export", true, optSetMetaContext, metaData("", "x-foo:bar", metaBaseAllocation), selected, repAck},
		{"set by namespace selects nothing", true, optSetMetaContext, metaData("disk", "base:"), none, repAck},
		{"set nothing", true, optSetMetaContext, metaData("disk"), none, repAck},
		{"set without structured replies", false, optSetMetaContext, metaData("disk", metaBaseAllocation), none, repErrInvalid},
		{"set for an unknown export", true, optSetMetaContext, metaData("nope", metaBaseAllocation), none, repErrUnknown},
		{"set with bad data", true, optSetMetaContext, []byte{0, 0}, none, repErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := dialUnix(t, ts.sock)
			c.hello(clientFlagFixedNewstyle)
			if tc.structured {
				c.sendOpt(optStructuredReply, nil)
				if r := c.readOptReply(); r.typ != repAck {
					t.Fatalf("structured replies: %+v", r)
				}
			}
			got, final := c.metaReplies(tc.opt, tc.data)
			if final != tc.final {
				t.Fatalf("final reply %#x, want %#x", final, tc.final)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("contexts %v, want %v", got, tc.want)
			}
			for name, id := range tc.want {
				if gid, ok := got[name]; !ok || gid != id {
					t.Fatalf("contexts %v, want %v", got, tc.want)
				}
			}
			// The handshake goes on.
			if res := c.info(optInfo, "disk"); res.final.typ != repAck {
				t.Fatalf("NBD_OPT_INFO afterwards: %+v", res.final)
			}
		})
	}
}

// extentDevice is a RAM device with an allocation map: extents from offset 0 on.
type extentDevice struct {
	*ramDevice
	extents []Extent
	asked   atomic.Pointer[[2]int64] // the last range asked for
}

func (d *extentDevice) BlockStatus(ctx context.Context, off, length int64) ([]Extent, error) {
	d.asked.Store(&[2]int64{off, length})
	var out []Extent
	pos := int64(0)
	for _, x := range d.extents {
		if end := pos + x.Length; end > off {
			if pos < off {
				x.Length = end - off
			}
			out = append(out, x)
		}
		pos += x.Length
	}
	return out, nil
}

// blockStatusClient connects to export with base:allocation selected (or not).
func blockStatusClient(t *testing.T, ts *testServer, export string, set bool) *client {
	c := dialUnix(t, ts.sock)
	c.hello(clientFlagFixedNewstyle | clientFlagNoZeroes)
	c.sendOpt(optStructuredReply, nil)
	if r := c.readOptReply(); r.typ != repAck {
		t.Fatalf("structured replies: %+v", r)
	}
	c.structured = true
	if set {
		if got, final := c.metaReplies(optSetMetaContext, metaData(export, metaBaseAllocation)); final != repAck || got[metaBaseAllocation] != metaAllocationID {
			t.Fatalf("SET_META_CONTEXT: %v %#x", got, final)
		}
	}
	res := c.info(optGo, export, infoBlockSize)
	if res.final.typ != repAck {
		t.Fatalf("NBD_OPT_GO: %+v", res.final)
	}
	c.size = res.size
	return c
}

func TestBlockStatus(t *testing.T) {
	const size = 1 << 20
	mapped := &extentDevice{ramDevice: newRAM(size, 512), extents: []Extent{
		{Length: 4096},
		{Length: 8192, Hole: true, Zero: true},
		{Length: 512, Zero: true},
		{Length: size - 4096 - 8192 - 512, Hole: true},
	}}
	ts := startServer(t, Config{}, map[string]Device{"plain": newRAM(size, 512), "mapped": mapped, "other": newRAM(size, 4096)})
	type ext = [2]uint32
	tests := []struct {
		name   string
		export string
		flags  uint16
		off    uint64
		length uint32
		errno  Errno
		want   []ext
	}{
		{"all data", "plain", 0, 0, size, 0, []ext{{size, 0}}},
		{"all data, part", "plain", 0, 4096, 512, 0, []ext{{512, 0}}},
		{"unaligned range", "plain", 0, 100, 1000, 0, []ext{{1000, 0}}},
		{"REQ_ONE", "plain", cmdFlagReqOne, 0, size, 0, []ext{{size, 0}}},
		{"FUA is accepted", "plain", cmdFlagFUA, 0, 512, 0, []ext{{512, 0}}},
		{"zero length", "plain", 0, 0, 0, EINVAL, nil},
		{"beyond the end", "plain", 0, size - 512, 1024, EINVAL, nil},
		{"bad flag", "plain", cmdFlagDF, 0, 512, EINVAL, nil},
		{"device map", "mapped", 0, 0, size, 0, []ext{{4096, 0}, {8192, stateHole | stateZero}, {512, stateZero}, {size - 4096 - 8192 - 512, stateHole}}},
		{"device map cut to the request", "mapped", 0, 2048, 4096, 0, []ext{{2048, 0}, {2048, stateHole | stateZero}}},
		{"device map from an unaligned offset", "mapped", 0, 4196, 100, 0, []ext{{100, stateHole | stateZero}}},
		{"device map REQ_ONE", "mapped", cmdFlagReqOne, 0, size, 0, []ext{{4096, 0}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := blockStatusClient(t, ts, tc.export, true)
			r := c.do(cmdBlockStatus, tc.flags, tc.off, tc.length, nil)
			if r.errno != tc.errno {
				t.Fatalf("errno %d (%q), want %d", r.errno, r.message, tc.errno)
			}
			if tc.errno != 0 {
				return
			}
			if len(r.chunks) != 1 || r.chunks[0] != replyTypeBlockStatus || r.metaID != metaAllocationID {
				t.Fatalf("chunks %v context %d", r.chunks, r.metaID)
			}
			if len(r.extents) != len(tc.want) {
				t.Fatalf("extents %v, want %v", r.extents, tc.want)
			}
			for i := range tc.want {
				if r.extents[i] != tc.want[i] {
					t.Fatalf("extents %v, want %v", r.extents, tc.want)
				}
			}
		})
	}
	t.Run("device asked for whole blocks", func(t *testing.T) {
		c := blockStatusClient(t, ts, "mapped", true)
		c.do(cmdBlockStatus, 0, 4196, 100, nil)
		if a := mapped.asked.Load(); a == nil || *a != [2]int64{4096, 512} {
			t.Fatalf("device asked for %v", a)
		}
	})
	t.Run("no context selected", func(t *testing.T) {
		c := blockStatusClient(t, ts, "plain", false)
		if r := c.do(cmdBlockStatus, 0, 0, 512, nil); r.errno != EINVAL {
			t.Fatalf("errno %d", r.errno)
		}
	})
	t.Run("context set for another export", func(t *testing.T) {
		c := dialUnix(t, ts.sock)
		c.hello(clientFlagFixedNewstyle | clientFlagNoZeroes)
		c.sendOpt(optStructuredReply, nil)
		c.readOptReply()
		c.structured = true
		if _, final := c.metaReplies(optSetMetaContext, metaData("other", metaBaseAllocation)); final != repAck {
			t.Fatalf("SET: %#x", final)
		}
		if res := c.info(optGo, "plain"); res.final.typ != repAck {
			t.Fatalf("GO: %+v", res.final)
		}
		if r := c.do(cmdBlockStatus, 0, 0, 512, nil); r.errno != EINVAL {
			t.Fatalf("errno %d", r.errno)
		}
	})
	t.Run("a later empty SET clears the selection", func(t *testing.T) {
		c := dialUnix(t, ts.sock)
		c.hello(clientFlagFixedNewstyle | clientFlagNoZeroes)
		c.sendOpt(optStructuredReply, nil)
		c.readOptReply()
		c.structured = true
		c.metaReplies(optSetMetaContext, metaData("plain", metaBaseAllocation))
		if got, final := c.metaReplies(optSetMetaContext, metaData("plain")); final != repAck || len(got) != 0 {
			t.Fatalf("SET: %v %#x", got, final)
		}
		if res := c.info(optGo, "plain"); res.final.typ != repAck {
			t.Fatalf("GO: %+v", res.final)
		}
		if r := c.do(cmdBlockStatus, 0, 0, 512, nil); r.errno != EINVAL {
			t.Fatalf("errno %d", r.errno)
		}
	})
	st := ts.Stats()
	var n uint64
	for _, e := range st.Exports {
		n += e.BlockStatus
	}
	if n == 0 {
		t.Fatal("no BLOCK_STATUS counted")
	}
}

// TestBlockStatusManyExtents: a map with more extents than one reply holds is cut short.
func TestBlockStatusManyExtents(t *testing.T) {
	d := &extentDevice{ramDevice: newRAM(1<<20, 512)}
	for i := 0; i < 100; i++ {
		d.extents = append(d.extents, Extent{Length: 512, Hole: i%2 == 1})
	}
	d.extents = append(d.extents, Extent{Length: 1<<20 - 100*512})
	ts := startServer(t, Config{}, map[string]Device{"d": d})
	c := blockStatusClient(t, ts, "d", true)
	r := c.do(cmdBlockStatus, 0, 0, 1<<20, nil)
	if r.errno != 0 || len(r.extents) != maxExtents {
		t.Fatalf("errno %d, %d extents, want %d", r.errno, len(r.extents), maxExtents)
	}
	for i, x := range r.extents {
		if x[0] != 512 || (x[1] == stateHole) != (i%2 == 1) {
			t.Fatalf("extent %d: %v", i, x)
		}
	}
}

// TestBlockStatusZeroAllocs: answering BLOCK_STATUS for a Device without an allocation map
// allocates nothing (the reply is encoded into the request's scratch buffer).
func TestBlockStatusZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	c := &conn{bs: 512, size: 1 << 20, blockStatus: true, structured: true}
	r := &request{typ: cmdBlockStatus, handle: 7, off: 0, length: 1 << 20}
	n := testing.AllocsPerRun(100, func() {
		if err := c.blockStatusReply(r); err != nil {
			t.Fatal(err)
		}
		c.replyMsg(r, 0, nil)
	})
	if n != 0 {
		t.Fatalf("%v allocations per BLOCK_STATUS reply", n)
	}
	if len(r.out) != blockStatusHdrLen+extentDescLen {
		t.Fatalf("reply of %d bytes", len(r.out))
	}
}
