package scsi

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/srpd/srpd/scsi/backend"
)

// memBackend is a test-only in-memory Backend with fault injection and a model of durability:
// data is what reads return, durable is what a crash would leave (the data as of the last
// Flush). It never allocates on ReadAt/WriteAt.
type memBackend struct {
	mu      sync.RWMutex
	data    []byte
	durable []byte
	info    backend.Info
	closed  atomic.Bool

	flushes  atomic.Int64 // Flush calls
	writes   atomic.Int64 // WriteAt calls
	discards atomic.Int64 // Discard calls
	zeroes   atomic.Int64 // WriteZeroes calls

	// Fault injection: a ReadAt/WriteAt whose range covers byte readErrAt/writeErrAt transfers
	// the bytes before it and fails (-1: never). flushErr makes Flush fail.
	readErrAt  atomic.Int64
	writeErrAt atomic.Int64
	flushErr   atomic.Bool
	// tear makes WriteAt copy 512 bytes at a time, dropping the lock and yielding in between,
	// so that unsynchronized overlapping writes interleave visibly.
	tear bool
	// hook, if set (before use), runs at the start of every ReadAt and WriteAt.
	hook func(op byte, off int64, n int)
}

var errInjected = fmt.Errorf("memBackend: injected I/O error")

func newMemBackend(size int64) *memBackend {
	m := &memBackend{
		data:    make([]byte, size),
		durable: make([]byte, size),
		info:    backend.Info{Kind: "ram", CanDiscard: true, DiscardZeroes: true},
	}
	m.readErrAt.Store(-1)
	m.writeErrAt.Store(-1)
	return m
}

func (m *memBackend) Size() int64        { return int64(len(m.data)) }
func (m *memBackend) Info() backend.Info { return m.info }

func (m *memBackend) check(off, n int64, write bool) error {
	if m.closed.Load() {
		return backend.ErrClosed
	}
	if write && m.info.ReadOnly {
		return backend.ErrReadOnly
	}
	if off < 0 || n < 0 || off+n > int64(len(m.data)) {
		return backend.ErrOutOfRange
	}
	return nil
}

func (m *memBackend) ReadAt(p []byte, off int64) (int, error) {
	if m.hook != nil {
		m.hook('r', off, len(p))
	}
	if err := m.check(off, int64(len(p)), false); err != nil {
		return 0, err
	}
	n := len(p)
	var err error
	if e := m.readErrAt.Load(); e >= off && e < off+int64(n) {
		n, err = int(e-off), errInjected
	}
	m.mu.RLock()
	copy(p[:n], m.data[off:])
	m.mu.RUnlock()
	return n, err
}

func (m *memBackend) WriteAt(p []byte, off int64) (int, error) {
	if m.hook != nil {
		m.hook('w', off, len(p))
	}
	if err := m.check(off, int64(len(p)), true); err != nil {
		return 0, err
	}
	m.writes.Add(1)
	n := len(p)
	var err error
	if e := m.writeErrAt.Load(); e >= off && e < off+int64(n) {
		n, err = int(e-off), errInjected
	}
	if !m.tear {
		m.mu.Lock()
		copy(m.data[off:], p[:n])
		m.mu.Unlock()
		return n, err
	}
	for k := 0; k < n; k += 512 {
		m.mu.Lock()
		copy(m.data[off+int64(k):], p[k:min(k+512, n)])
		m.mu.Unlock()
		runtime.Gosched()
	}
	return n, err
}

func (m *memBackend) Flush() error {
	if m.closed.Load() {
		return backend.ErrClosed
	}
	m.flushes.Add(1)
	if m.flushErr.Load() {
		return errInjected
	}
	m.mu.Lock()
	copy(m.durable, m.data)
	m.mu.Unlock()
	return nil
}

func (m *memBackend) Discard(off, n int64) error {
	if err := m.check(off, n, true); err != nil {
		return err
	}
	if !m.info.CanDiscard {
		return backend.ErrNotSupported
	}
	m.discards.Add(1)
	m.zero(off, n)
	return nil
}

func (m *memBackend) WriteZeroes(off, n int64) error {
	if err := m.check(off, n, true); err != nil {
		return err
	}
	m.zeroes.Add(1)
	m.zero(off, n)
	return nil
}

func (m *memBackend) zero(off, n int64) {
	m.mu.Lock()
	clear(m.data[off : off+n])
	m.mu.Unlock()
}

func (m *memBackend) Close() error {
	if !m.closed.CompareAndSwap(false, true) {
		return backend.ErrClosed
	}
	return nil
}

// snapshot copies [off, off+n) of the data (durable: of the durable image).
func (m *memBackend) snapshot(off, n int64, durable bool) []byte {
	m.mu.RLock()
	defer m.mu.RUnlock()
	src := m.data
	if durable {
		src = m.durable
	}
	return append([]byte(nil), src[off:off+n]...)
}

var _ backend.Backend = (*memBackend)(nil)
