package cqpoll

import (
	"errors"
	"testing"

	"github.com/srpd/srpd/transport"
)

const testTag = uint64(1) << 63 // frpool.WRIDTag's bit

func TestWRID(t *testing.T) {
	for _, tc := range []struct {
		k Kind
		i uint32
	}{{0, 0}, {0, 7}, {1, 0}, {3, 0xffff}, {MaxKinds - 1, 0xffffffff}} {
		id := WRID(tc.k, tc.i)
		if KindOf(id) != tc.k || IndexOf(id) != tc.i {
			t.Errorf("WRID(%d, %d) = %#x: kind %d, index %d", tc.k, tc.i, id, KindOf(id), IndexOf(id))
		}
		if id&testTag != 0 {
			t.Errorf("WRID(%d, %d) = %#x uses the tag bit", tc.k, tc.i, id)
		}
	}
	if WRID(0, 5) != 5 {
		t.Error("kind 0 is not the bare index")
	}
}

// TestRouterDispatch: each completion goes to the Done of its kind with its index; the tagged
// ones go to the layer below first and are dispatched by the ID it puts back only when it
// delivers them.
func TestRouterDispatch(t *testing.T) {
	const (
		kRecv Kind = iota
		kSend
		kCtl
		kNone // no route
	)
	errTagged := errors.New("tagged refused")
	errCtl := errors.New("ctl refused")
	type call struct {
		route string
		index uint32
	}
	for _, tc := range []struct {
		name    string
		id      uint64
		deliver uint64 // the ID the tagged handler puts back (0: does not deliver)
		tagErr  bool
		unknown bool // an Unknown route is set
		want    []call
		err     error
	}{
		{name: "receive", id: WRID(kRecv, 9), want: []call{{"recv", 9}}},
		{name: "kind with index", id: WRID(kCtl, 3), want: []call{{"ctl", 3}}, err: errCtl},
		{name: "tagged, delivered", id: testTag | 77, deliver: WRID(kSend, 4),
			want: []call{{"tagged", 0}, {"send", 4}}},
		{name: "tagged, not delivered", id: testTag | 78, want: []call{{"tagged", 0}}},
		{name: "tagged, error", id: testTag | 79, tagErr: true, want: []call{{"tagged", 0}}, err: errTagged},
		{name: "no route, ignored", id: WRID(kNone, 1)},
		{name: "no route, unknown", id: WRID(kNone, 1), unknown: true, want: []call{{"unknown", 1}}},
		{name: "reserved bits set", id: WRID(kRecv, 1) | 1<<40, unknown: true, want: []call{{"unknown", 1}}},
		{name: "delivered under an ID with no route", id: testTag | 80, deliver: WRID(kNone, 2), unknown: true,
			want: []call{{"tagged", 0}, {"unknown", 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []call
			rec := func(name string, err error) Done {
				return func(_ *transport.WC, i uint32) error {
					got = append(got, call{name, i})
					return err
				}
			}
			var r Router
			r.Route(kRecv, rec("recv", nil))
			r.Route(kSend, rec("send", nil))
			r.Route(kCtl, rec("ctl", errCtl))
			r.Tagged(testTag, func(wc *transport.WC) (bool, error) {
				got = append(got, call{"tagged", 0})
				if tc.tagErr {
					return false, errTagged
				}
				if tc.deliver != 0 {
					wc.ID = tc.deliver
					return true, nil
				}
				return false, nil
			})
			if tc.unknown {
				r.Unknown(rec("unknown", nil))
			}
			wc := transport.WC{ID: tc.id}
			err := r.Dispatch(&wc)
			if err != tc.err {
				t.Errorf("error %v, want %v", err, tc.err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("calls %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("calls %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestRouterSetupChecks(t *testing.T) {
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", name)
			}
		}()
		f()
	}
	var r Router
	mustPanic("kind too large", func() { r.Route(MaxKinds, nil) })
	mustPanic("tag in the kind", func() { r.Tagged(1<<60, nil) })
	mustPanic("tag in the index", func() { r.Tagged(1, nil) })
	mustPanic("two bits", func() { r.Tagged(3<<62, nil) })
	mustPanic("no bit", func() { r.Tagged(0, nil) })
	r.Tagged(testTag, nil) // fine
}

func TestRouterDispatchAllocs(t *testing.T) {
	var r Router
	n := 0
	r.Route(1, func(*transport.WC, uint32) error { n++; return nil })
	r.Tagged(testTag, func(wc *transport.WC) (bool, error) { wc.ID = WRID(1, 2); return true, nil })
	wc := transport.WC{}
	allocs := testing.AllocsPerRun(100, func() {
		wc.ID = testTag | 5
		_ = r.Dispatch(&wc)
	})
	if allocs != 0 || n == 0 {
		t.Fatalf("%v allocations per dispatch (%d dispatched)", allocs, n)
	}
}
