//go:build rbd && cgo

package backend

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/ceph/go-ceph/rados"
)

// rbdState is the SharedState of an RBD image: the RADOS object rbd_srpd_pr.<image> in the
// image's pool and namespace, written whole with an assert on its version
// (rados_write_op_assert_version: the write fails with ERANGE or EOVERFLOW once another
// writer moved the version), watched (rados_watch2) so that each exporter hears of the
// others' writes; a writer notifies (rados_notify2) and waits for the watchers' acks, bounded
// by stateNotifyTimeout.
type rbdState struct {
	ioctx *rados.IOContext // its own: GetLastVersion reads this context's last operation
	oid   string
	// life is held shared while ioctx is used, exclusively to replace it (rebind, close).
	life sync.RWMutex
	mu   sync.Mutex // serializes operations on ioctx
	w    *rados.Watcher

	wmu      sync.Mutex
	watchers []func()
	done     chan struct{} // closed when listen has returned
	quit     chan struct{} // closed to make listen return
}

const (
	stateNotifyTimeout = 5 * time.Second
	stateMaxSize       = 256 << 10
)

var _ SharedState = (*rbdState)(nil)

// openState opens (creating it if need be) the image's state object and watches it.
func openState(conn *rados.Conn, pool, ns, image string) (*rbdState, error) {
	ioctx, err := conn.OpenIOContext(pool)
	if err != nil {
		return nil, fmt.Errorf("shared state: pool %s: %w", pool, cephErrno(err))
	}
	ioctx.SetNamespace(ns)
	s := &rbdState{ioctx: ioctx, oid: "rbd_srpd_pr." + image}
	op := rados.CreateWriteOp()
	op.Create(rados.CreateIdempotent)
	err = op.Operate(ioctx, s.oid, rados.OperationNoFlag)
	op.Release()
	if err != nil {
		ioctx.Destroy()
		return nil, fmt.Errorf("shared state: create %s: %w", s.oid, cephErrno(err))
	}
	w, err := ioctx.Watch(s.oid)
	if err != nil {
		ioctx.Destroy()
		return nil, fmt.Errorf("shared state: watch %s: %w", s.oid, cephErrno(err))
	}
	s.watch(w)
	return s, nil
}

// watch starts listening to w (life held exclusively, or before s is shared).
func (s *rbdState) watch(w *rados.Watcher) {
	s.w, s.done, s.quit = w, make(chan struct{}), make(chan struct{})
	go s.listen(w, s.done, s.quit)
}

// unwatch stops the watch and its listener (life held exclusively). The unwatch may fail on a
// blocklisted connection; the listener is told to stop anyway.
func (s *rbdState) unwatch() {
	if s.w == nil {
		return
	}
	close(s.quit)
	_ = s.w.Delete()
	<-s.done
	s.w = nil
}

func (s *rbdState) listen(w *rados.Watcher, done, quit chan struct{}) {
	defer close(done)
	events, errs := w.Events(), w.Errors()
	for {
		select {
		case <-quit:
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			s.changed()
			_ = ev.Ack(nil)
		case _, ok := <-errs:
			if !ok {
				return
			}
			// The watch broke (a disconnect): what was missed is read again on the next check.
			s.changed()
		}
	}
}

func (s *rbdState) changed() {
	s.wmu.Lock()
	ws := append([]func(){}, s.watchers...)
	s.wmu.Unlock()
	for _, f := range ws {
		f()
	}
}

// Watch implements SharedState.
func (s *rbdState) Watch(f func()) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.watchers = append(s.watchers, f)
}

// Load implements SharedState.
func (s *rbdState) Load() ([]byte, uint64, error) {
	s.life.RLock()
	defer s.life.RUnlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	// Larger than any state (scsi's PR state is at most ~172 KB), so one read takes it whole
	// with the version it has.
	buf := make([]byte, stateMaxSize)
	if s.ioctx == nil {
		return nil, 0, fmt.Errorf("shared state: %s: %w", s.oid, ErrFenced)
	}
	op := rados.CreateReadOp()
	defer op.Release()
	op.AssertExists()
	step := op.Read(0, buf)
	if err := op.Operate(s.ioctx, s.oid, rados.OperationNoFlag); err != nil {
		return nil, 0, fmt.Errorf("shared state: read %s: %w", s.oid, cephErrno(err))
	}
	ver, err := s.ioctx.GetLastVersion()
	if err != nil {
		return nil, 0, fmt.Errorf("shared state: version of %s: %w", s.oid, cephErrno(err))
	}
	n := int(step.BytesRead)
	if n == 0 {
		return nil, ver, nil
	}
	return buf[:n], ver, nil
}

// CompareAndSwap implements SharedState.
func (s *rbdState) CompareAndSwap(ver uint64, data []byte) error {
	if len(data) > stateMaxSize {
		return fmt.Errorf("shared state: %d bytes: more than %d", len(data), stateMaxSize)
	}
	s.life.RLock()
	defer s.life.RUnlock()
	s.mu.Lock()
	if s.ioctx == nil {
		s.mu.Unlock()
		return fmt.Errorf("shared state: %s: %w", s.oid, ErrFenced)
	}
	op := rados.CreateWriteOp()
	op.AssertVersion(ver)
	op.WriteFull(data)
	err := op.Operate(s.ioctx, s.oid, rados.OperationNoFlag)
	op.Release()
	s.mu.Unlock()
	if err != nil {
		if e := cephErrno(err); errors.Is(e, syscall.ERANGE) || errors.Is(e, syscall.EOVERFLOW) {
			return ErrStateChanged
		}
		return fmt.Errorf("shared state: write %s: %w", s.oid, cephErrno(err))
	}
	// Tell the other exporters before the caller answers its initiator; one that does not
	// acknowledge in time reads the state again when its watch reports the error.
	if _, _, err := s.ioctx.NotifyWithTimeout(s.oid, nil, stateNotifyTimeout); err != nil {
		return fmt.Errorf("shared state: notify %s: %w", s.oid, cephErrno(err))
	}
	return nil
}

// detach lets go of the state's cluster connection (a fence blocklisted it), before that
// connection is shut down; Load and CompareAndSwap fail until attach.
func (s *rbdState) detach() {
	s.life.Lock()
	defer s.life.Unlock()
	s.unwatch() // the unwatch may fail on the blocklisted connection; the context goes anyway
	if s.ioctx != nil {
		s.ioctx.Destroy()
		s.ioctx = nil
	}
}

// attach moves the state to a new cluster connection (after detach): the object is watched
// again through it, and the watchers hear of a change, since writes may have been missed.
func (s *rbdState) attach(conn *rados.Conn, pool, ns string) error {
	s.life.Lock()
	ioctx, err := conn.OpenIOContext(pool)
	if err != nil {
		s.life.Unlock()
		return fmt.Errorf("shared state: pool %s: %w", pool, cephErrno(err))
	}
	ioctx.SetNamespace(ns)
	w, err := ioctx.Watch(s.oid)
	if err != nil {
		ioctx.Destroy()
		s.life.Unlock()
		return fmt.Errorf("shared state: watch %s: %w", s.oid, cephErrno(err))
	}
	s.ioctx = ioctx
	s.watch(w)
	s.life.Unlock()
	s.changed()
	return nil
}

func (s *rbdState) close() {
	s.life.Lock()
	defer s.life.Unlock()
	s.unwatch()
	if s.ioctx != nil {
		s.ioctx.Destroy()
	}
}
