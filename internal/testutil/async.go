package testutil

import (
	"context"
	"sync"
)

// BracketedReader is a block device that reads asynchronously and brackets posts
// (initiator.LUN, mpath.Device).
type BracketedReader interface {
	ReadAtAsync(ctx context.Context, p []byte, off int64, done func(error))
	BeginPosts()
	EndPosts()
}

// ReadBracketed reads buf from offset 0 in blocks of bs bytes, one ReadAtAsync each, all
// posted inside one BeginPosts/EndPosts bracket and then waited for; it returns the first
// error.
func ReadBracketed(ctx context.Context, d BracketedReader, buf []byte, bs int) error {
	n := len(buf) / bs
	var wg sync.WaitGroup
	errs := make(chan error, n)
	d.BeginPosts()
	for i := 0; i < n; i++ {
		wg.Add(1)
		d.ReadAtAsync(ctx, buf[i*bs:(i+1)*bs], int64(i*bs), func(err error) { errs <- err; wg.Done() })
	}
	d.EndPosts()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
