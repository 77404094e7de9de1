package nbd

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestObserve: ExportOptions.Observe hears every READ, WRITE and FLUSH of the export, with
// whether it failed, for a plain and an asynchronous device, and nothing else.
func TestObserve(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(map[bool]string{false: "sync", true: "async"}[async], func(t *testing.T) {
			disk := newRAM(1<<20, 4096)
			var dev Device = disk
			if async {
				dev = newAsyncRAM(t, disk)
			}
			type seen struct {
				op     Op
				failed bool
			}
			var mu sync.Mutex
			var got []seen
			s, err := NewServer(Config{})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.AddExport("disk", dev, ExportOptions{Observe: func(op Op, d time.Duration, failed bool) {
				if d <= 0 {
					t.Errorf("op %d took %v", op, d)
				}
				mu.Lock()
				got = append(got, seen{op, failed})
				mu.Unlock()
			}}); err != nil {
				t.Fatal(err)
			}
			sock := filepath.Join(t.TempDir(), "nbd.sock")
			if _, err := s.ListenUnix(sock); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Serve(ctx) }()
			defer func() { cancel(); <-done }()
			c := dialUnix(t, sock)
			c.connect("disk", false)
			c.do(cmdWrite, 0, 0, 4096, make([]byte, 4096))
			c.do(cmdRead, 0, 0, 4096, nil)
			c.do(cmdFlush, 0, 0, 0, nil)
			c.do(cmdTrim, 0, 0, 4096, nil)                             // not observed
			if r := c.do(cmdRead, 0, 2<<20, 4096, nil); r.errno == 0 { // past the end: refused
				t.Fatal("a READ past the end succeeded")
			}
			mu.Lock()
			defer mu.Unlock()
			want := []seen{{OpWrite, false}, {OpRead, false}, {OpFlush, false}, {OpRead, true}}
			if len(got) != len(want) {
				t.Fatalf("observed %+v, want %+v", got, want)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("observed %+v, want %+v", got, want)
				}
			}
		})
	}
}
