package cbatch

import (
	"context"
	"testing"
)

type nop struct{ n int }

func (b *nop) BeginCompletions() { b.n++ }
func (b *nop) EndCompletions()   { b.n-- }

// TestFrom: a context carries the Batcher With put in it, through derived contexts; one
// without gives nil, as does a nil context.
func TestFrom(t *testing.T) {
	b := &nop{}
	ctx, cancel := context.WithCancel(With(context.Background(), b))
	defer cancel()
	if got := From(ctx); got != Batcher(b) {
		t.Fatalf("From = %v, want the Batcher put in", got)
	}
	if got := From(context.Background()); got != nil {
		t.Fatalf("From(Background) = %v, want nil", got)
	}
	if got := From(nil); got != nil { //nolint:staticcheck // a nil context must not panic
		t.Fatalf("From(nil) = %v, want nil", got)
	}
}
