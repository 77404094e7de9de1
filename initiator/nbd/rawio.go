package nbd

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// rawStream reads and writes a socket through its syscall.RawConn with raw (non-scheduling)
// system calls: the socket is non-blocking, so a read or write never blocks in the kernel and
// the runtime's bookkeeping for a syscall that might (entersyscall) is not needed. That
// bookkeeping wakes the runtime's sysmon thread whenever it sleeps, which is at every request
// at queue depth 1: measured with perf, the wake-ups and sysmon's polling that followed took a
// sixth of the server's CPU time. Waiting (EAGAIN) still goes through the netpoller, with the
// connection's deadlines.
type rawStream struct {
	nc net.Conn // for errors
	rc syscall.RawConn
	// Read side (one reader at a time) and write side (one writer at a time) are apart.
	p       []byte // the caller's buffer
	n       int
	rdErr   error
	iov     []syscall.Iovec // what is left of the batch
	wrErr   error
	rdFn    func(fd uintptr) bool
	wrFn    func(fd uintptr) bool
	wrNowFn func(fd uintptr) bool
	iovAll  []syscall.Iovec // the whole batch, cleared once written
	// wrTimeout bounds a batch's wait for the socket without progress (Config.WriteTimeout;
	// 0: none). The deadline is armed only once a batch finds the socket full, so a write
	// that needs no wait costs no timer, and pushed out whenever the client takes some bytes.
	wrTimeout time.Duration
	wrote     bool // writev wrote something since writevSome last cleared it
	// spin: how long a read that finds no data retries before it waits in the netpoller,
	// while spinOK says so (see Config.ReadSpin); spinEnd is the current spin's end.
	spin    time.Duration
	spinOK  func() bool
	spinEnd time.Time
	spinHit *atomic.Uint64 // counts reads that found data while spinning
	waits   *atomic.Uint64 // counts reads that wait in the netpoller
}

// newRawStream returns a rawStream for nc, or nil when nc does not expose a RawConn (a pipe in
// tests): the connection then uses nc itself.
func newRawStream(nc net.Conn) *rawStream {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	s := &rawStream{nc: nc, rc: rc}
	s.rdFn = s.read
	s.wrFn = s.writevSome
	s.wrNowFn = s.writevNow
	return s
}

// Read implements io.Reader (for the connection's bufio.Reader).
func (s *rawStream) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.p, s.n, s.rdErr = p, 0, nil
	err := s.rc.Read(s.rdFn)
	s.p = nil
	if err == nil {
		err = s.rdErr
	}
	if err != nil {
		return 0, s.opError("read", err)
	}
	if s.n == 0 {
		return 0, io.EOF
	}
	return s.n, nil
}

func (s *rawStream) read(fd uintptr) bool {
	for {
		r, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&s.p[0])), uintptr(len(s.p)))
		switch e {
		case 0:
			s.n = int(r)
			if !s.spinEnd.IsZero() {
				s.spinEnd = time.Time{}
				if s.spinHit != nil {
					s.spinHit.Add(1)
				}
			}
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			if s.spin > 0 && s.spinOK != nil && s.spinOK() {
				now := time.Now()
				if s.spinEnd.IsZero() {
					s.spinEnd = now.Add(s.spin)
				}
				if now.Before(s.spinEnd) {
					continue
				}
			}
			s.spinEnd = time.Time{}
			if s.waits != nil {
				s.waits.Add(1)
			}
			return false
		default:
			s.spinEnd = time.Time{}
			s.rdErr = os.NewSyscallError("read", e)
			return true
		}
	}
}

// writeBuffers writes bufs with writev. With block it returns once every byte is written;
// without, it stops when the socket is full and reports more: finishWrite then writes the rest
// (blocking), before the next writeBuffers.
func (s *rawStream) writeBuffers(bufs [][]byte, iov []syscall.Iovec, block bool) ([]syscall.Iovec, bool, error) {
	iov = iov[:0]
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		v := syscall.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		iov = append(iov, v)
	}
	s.iov, s.iovAll, s.wrErr = iov, iov, nil
	if !block {
		// One pass without waiting: Write's fn gets true back from writevNow even on EAGAIN.
		if err := s.rc.Write(s.wrNowFn); err != nil {
			s.wrErr = err
		}
		if s.wrErr == nil && len(s.iov) > 0 {
			return iov, true, nil
		}
	}
	return iov, false, s.finishWrite()
}

// finishWrite writes what is left of the batch, waiting for the socket as needed, for at most
// wrTimeout without progress (then the error is os.ErrDeadlineExceeded).
func (s *rawStream) finishWrite() error {
	if len(s.iov) > 0 && s.wrErr == nil {
		// Without waiting first: most batches go out whole and need no deadline.
		if err := s.rc.Write(s.wrNowFn); err != nil {
			s.wrErr = err
		}
	}
	armed := false
	queued := -1
	for len(s.iov) > 0 && s.wrErr == nil {
		// The deadline bounds a wait in which the client takes nothing: one that reads a
		// large reply slowly but steadily is not stalled. writevSome returns after any
		// progress of ours, and at the deadline the socket's queue tells whether the
		// client took bytes meanwhile (the kernel reports the socket writable only once
		// most of its buffer has drained, which a slow reader may take longer than that).
		if s.wrTimeout > 0 {
			if !armed {
				queued = s.queued()
			}
			s.nc.SetWriteDeadline(time.Now().Add(s.wrTimeout))
			armed = true
		}
		if err := s.rc.Write(s.wrFn); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if q := s.queued(); q >= 0 && q < queued {
					queued = q
					continue // the client is reading
				}
			}
			s.wrErr = err
		}
	}
	if armed && s.wrErr == nil {
		// A deadline left behind would fail the next write at once, even one that need not
		// wait (the poller checks it first).
		s.nc.SetWriteDeadline(time.Time{})
	}
	clear(s.iovAll) // no references to the replies' buffers stay behind
	s.iov, s.iovAll = nil, nil
	if s.wrErr != nil {
		return s.opError("write", s.wrErr)
	}
	return nil
}

// opError wraps err as the net package does for its own reads and writes.
func (s *rawStream) opError(op string, err error) error {
	la := s.nc.LocalAddr()
	nw := ""
	if la != nil {
		nw = la.Network()
	}
	return &net.OpError{Op: op, Net: nw, Source: la, Addr: s.nc.RemoteAddr(), Err: err}
}

// writevNow is writev that never waits: on EAGAIN it leaves the rest in s.iov.
func (s *rawStream) writevNow(fd uintptr) bool {
	s.writev(fd)
	return true
}

// queued returns what the socket holds that the client has not taken yet, or -1.
func (s *rawStream) queued() int {
	n := -1
	_ = s.rc.Control(func(fd uintptr) { n = outq(fd) })
	return n
}

// writevSome is writev for a wait: it ends the wait (returns true) once it has written
// something, so that finishWrite can push the deadline out, or when the batch is done.
func (s *rawStream) writevSome(fd uintptr) bool {
	s.wrote = false
	done := s.writev(fd)
	return done || s.wrote
}

// maxIOV bounds one writev (the kernel's UIO_MAXIOV is 1024).
const maxIOV = 1024

func (s *rawStream) writev(fd uintptr) bool {
	for len(s.iov) > 0 {
		k := min(len(s.iov), maxIOV)
		r, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&s.iov[0])), uintptr(k))
		switch e {
		case 0:
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			s.wrErr = os.NewSyscallError("writev", e)
			return true
		}
		n := int(r)
		if n == 0 {
			s.wrErr = io.ErrShortWrite
			return true
		}
		s.wrote = true
		for n > 0 && len(s.iov) > 0 {
			l := int(s.iov[0].Len)
			if n < l {
				s.iov[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(s.iov[0].Base), n))
				s.iov[0].SetLen(l - n)
				break
			}
			n -= l
			s.iov = s.iov[1:]
		}
	}
	return true
}
