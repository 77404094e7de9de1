// Package cbatch lets whoever delivers asynchronous completions tell their consumer where a
// batch of them begins and ends, through the context the requests were submitted with: the
// consumer (an NBD connection) attaches itself with With; the producer (the initiator's
// completion handling) looks it up with From for each request it answers and brackets the
// answers of one batch with BeginCompletions and EndCompletions, once per distinct consumer.
// The consumer may then hold what the answers produce (NBD replies) and write it once at the
// end, as Linux's block layer flushes a plug: one system call and one wake-up of the client
// per batch instead of one per request.
package cbatch

import "context"

// Batcher is the consumer's side. Calls nest and may come from several goroutines at once (the
// batches of different channels); a consumer holds while any batch is open and flushes when
// the last one ends. Answers delivered outside any batch (error handling, retries) must be
// handled as before: at once, or by the end of a batch still open.
type Batcher interface {
	BeginCompletions()
	EndCompletions()
}

type key struct{}

// With returns ctx carrying b.
func With(ctx context.Context, b Batcher) context.Context { return context.WithValue(ctx, key{}, b) }

// From returns the Batcher ctx carries, or nil.
func From(ctx context.Context) Batcher {
	if ctx == nil {
		return nil
	}
	b, _ := ctx.Value(key{}).(Batcher)
	return b
}
