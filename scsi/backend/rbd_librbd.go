//go:build rbd && cgo

package backend

/*
#cgo LDFLAGS: -lrbd -lrados
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include <rbd/librbd.h>
#include <rbd/features.h>

// What a completion (or the image's update watch) tells the Go side: one record per event,
// written into a pipe by librbd's callback threads and read by RBD.poll. 16 bytes, less than
// PIPE_BUF, so that each write is atomic and records from concurrent callbacks never interleave.
struct srpd_rbd_rec {
	uint32_t slot; // the request slot that completed, or one of the SRPD_RBD_* below
	uint32_t pad;
	int64_t ret;   // rbd_aio_get_return_value: bytes, 0, or a negative errno
};

#define SRPD_RBD_RESIZED 0xffffffffu // slot: the image header changed (rbd_update_watch)
#define SRPD_RBD_STOP 0xfffffffeu    // slot: written by Close, the poller exits

enum { SRPD_RBD_READ, SRPD_RBD_WRITE, SRPD_RBD_ZERO, SRPD_RBD_FLUSH };

struct srpd_rbd_ctx;

// A request slot: the callback argument of the requests submitted through it, in C memory.
struct srpd_rbd_slot {
	struct srpd_rbd_ctx *ctx;
	uint32_t id;
};

struct srpd_rbd_ctx {
	int wfd;            // the pipe's write end (blocking)
	int resize_pending; // a SRPD_RBD_RESIZED record is in the pipe, not yet handled
	struct srpd_rbd_slot slots[];
};

static struct srpd_rbd_ctx *srpd_rbd_ctx_new(int wfd, uint32_t n) {
	struct srpd_rbd_ctx *x = calloc(1, sizeof *x + n * sizeof x->slots[0]);
	if (x == NULL)
		return NULL;
	x->wfd = wfd;
	for (uint32_t i = 0; i < n; i++) {
		x->slots[i].ctx = x;
		x->slots[i].id = i;
	}
	return x;
}

static struct srpd_rbd_slot *srpd_rbd_slot_at(struct srpd_rbd_ctx *x, uint32_t i) {
	return &x->slots[i];
}

// srpd_rbd_put writes one record. The pipe holds far more records than can be outstanding (one
// per slot and one resize), so the write does not block for long; a write error other than
// EINTR cannot happen while the read end is open, which Close guarantees until librbd is done.
static void srpd_rbd_put(int fd, const struct srpd_rbd_rec *r) {
	for (;;) {
		ssize_t n = write(fd, r, sizeof *r);
		if (n >= 0 || errno != EINTR)
			return;
	}
}

// srpd_rbd_complete is every request's completion callback, on a librbd thread: it hands the
// result to the Go side and releases the completion (as QEMU's block/rbd.c does in its own).
static void srpd_rbd_complete(rbd_completion_t c, void *arg) {
	struct srpd_rbd_slot *s = arg;
	struct srpd_rbd_rec rec = { .slot = s->id, .ret = rbd_aio_get_return_value(c) };
	rbd_aio_release(c);
	srpd_rbd_put(s->ctx->wfd, &rec);
}

// srpd_rbd_updated is the image's update-watch callback. One pending record is enough: the
// Go side reads the size after clearing the flag, so a later change sends another.
static void srpd_rbd_updated(void *arg) {
	struct srpd_rbd_ctx *x = arg;
	if (__atomic_exchange_n(&x->resize_pending, 1, __ATOMIC_ACQ_REL) == 0) {
		struct srpd_rbd_rec rec = { .slot = SRPD_RBD_RESIZED };
		srpd_rbd_put(x->wfd, &rec);
	}
}

static void srpd_rbd_rearm(struct srpd_rbd_ctx *x) {
	__atomic_store_n(&x->resize_pending, 0, __ATOMIC_RELEASE);
}

static int srpd_rbd_watch(rbd_image_t img, struct srpd_rbd_ctx *x, uint64_t *handle) {
	return rbd_update_watch(img, handle, srpd_rbd_updated, x);
}

// srpd_rbd_take_lock makes this client the owner of the image's exclusive lock in managed
// mode, as tcmu-runner's rbd handler does (tcmu_rbd_lock, tcmu_rbd_lock_break): when another
// client owns it, its lock is broken first, which makes librbd blocklist that client
// (rbd_blocklist_on_break_lock, on by default) so that none of its writes can land afterwards;
// then rbd_lock_acquire, which also turns off librbd's cooperative hand-over for this image
// (the lock is no longer released when another client asks for it). *broke counts the owners
// broken. 0, or a negative errno.
static int srpd_rbd_take_lock(rbd_image_t img, int *broke) {
	int owner = 0;
	int r = rbd_is_exclusive_lock_owner(img, &owner);
	if (r < 0)
		return r;
	if (owner)
		return 0;
	rbd_lock_mode_t mode;
	char *owners[8];
	size_t n = 8;
	r = rbd_lock_get_owners(img, &mode, owners, &n);
	if (r == -ENOENT)
		n = 0; // nobody owns it
	else if (r < 0)
		return r;
	int err = 0;
	for (size_t i = 0; i < n; i++) {
		int b = rbd_lock_break(img, RBD_LOCK_MODE_EXCLUSIVE, owners[i]);
		if (b == 0)
			(*broke)++;
		else if (b != -ENOENT && err == 0)
			err = b;
	}
	if (n > 0)
		rbd_lock_get_owners_cleanup(owners, n);
	if (err < 0)
		return err;
	return rbd_lock_acquire(img, RBD_LOCK_MODE_EXCLUSIVE);
}

// srpd_rbd_submit starts one request on slot s: 0 when submitted (srpd_rbd_complete then
// runs exactly once), or a negative errno (nothing was started).
static int srpd_rbd_submit(rbd_image_t img, struct srpd_rbd_slot *s, int op, uint64_t off,
		size_t len, char *buf) {
	rbd_completion_t c;
	int r = rbd_aio_create_completion(s, srpd_rbd_complete, &c);
	if (r < 0)
		return r;
	switch (op) {
	case SRPD_RBD_READ:
		r = rbd_aio_read2(img, off, len, buf, c, 0);
		break;
	case SRPD_RBD_WRITE:
		r = rbd_aio_write2(img, off, len, buf, c, 0);
		break;
	case SRPD_RBD_ZERO:
		r = rbd_aio_write_zeroes(img, off, len, c, 0, 0);
		break;
	case SRPD_RBD_FLUSH:
		r = rbd_aio_flush(img, c);
		break;
	default:
		r = -EINVAL;
	}
	if (r < 0)
		rbd_aio_release(c);
	return r;
}
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/ceph/go-ceph/rados"
	"golang.org/x/sys/unix"
)

// RBDBuilt reports whether this build has the rbd backend (build tag rbd, with cgo).
const RBDBuilt = true

// rbdZeroChunk bounds one write-zeroes request: librbd returns the byte count of a request as
// an int in places, and one huge request would hold its slot for long.
const rbdZeroChunk = 1 << 30

// rbdRecSize is the size of struct srpd_rbd_rec.
const rbdRecSize = 16

// The pipe's record layout must be what the C side writes.
var _ [rbdRecSize - unsafe.Sizeof(C.struct_srpd_rbd_rec{})]struct{}
var _ [unsafe.Sizeof(C.struct_srpd_rbd_rec{}) - rbdRecSize]struct{}

// RBD is a Backend on a Ceph RBD image, through librbd's asynchronous API.
//
// The rados connection and pool context come from go-ceph (github.com/ceph/go-ceph/rados);
// go-ceph v0.30.0 has no asynchronous RBD calls, so the image is opened and driven here with
// librbd's C API directly on go-ceph's rados_ioctx_t. Each call takes one of QueueDepth request
// slots, submits an rbd_aio_* request with the caller's buffer pinned (runtime.Pinner), and
// waits on its slot's channel. librbd's callback (C, on a librbd thread) writes the result into
// a pipe; one goroutine per image reads the pipe through the Go netpoller and wakes the waiting
// caller. So a request in flight holds a parked goroutine (the target's LUN worker) but no OS
// thread, no goroutine is started per request, and nothing is allocated on the Go heap per
// request.
//
// Discard and WriteZeroes are both rbd_aio_write_zeroes: librbd turns it into a discard with a
// zero granularity, which deallocates whole objects and zeroes (truncates or punches) partial
// ones, so the range reads as zeroes (DiscardZeroes). A plain rbd_aio_discard would skip the
// parts of the range smaller than rbd_discard_granularity_bytes and leave their data.
//
// The size is read at open and again whenever librbd reports an update of the image header
// (rbd_update_watch): a resize by `rbd resize` elsewhere shows in Size and RBDOptions.OnResize.
type RBD struct {
	name     string
	opts     RBDOptions // what a reconnect after a fence opens again
	info     Info
	size     atomic.Int64
	closed   atomic.Bool
	onResize func(int64)
	// inflight is held shared by every call while it uses the image, exclusively by Close and
	// by a reconnect after a fence.
	inflight sync.RWMutex

	// The managed exclusive lock (RBDOptions.ManagedLock); see RBD.
	managed bool
	lockMu  sync.Mutex  // serializes taking the lock
	owner   atomic.Bool // this client owns the lock (as last seen)
	fenced  atomic.Bool // a call learnt that another client broke the lock; until reconnected
	epoch   atomic.Uint64
	fmu     sync.Mutex    // guards the fields below
	asked   uint64        // the newest epoch Resume was called for
	back    chan struct{} // closed when the reconnect after the current fence is done
	stop    chan struct{} // closed by Close: a reconnect loop gives up
	rwg     sync.WaitGroup

	conn     *rados.Conn
	ioctx    *rados.IOContext
	img      C.rbd_image_t
	cx       *C.struct_srpd_rbd_ctx // C memory: the pipe's write end and the slots
	watch    C.uint64_t
	watching bool
	state    *rbdState // RBDOptions.SharedState

	slots   []rbdSlot
	free    chan *rbdSlot // the slots not in use: a caller waits here when all are
	rd      *os.File      // the pipe's read end (non-blocking: the netpoller waits)
	wfd     int
	resized chan struct{}
	wg      sync.WaitGroup // poll and watchSize
}

// rbdSlot is one request in flight.
type rbdSlot struct {
	c    *C.struct_srpd_rbd_slot
	done chan int64 // the request's result, from poll
	pin  runtime.Pinner
}

var _ Backend = (*RBD)(nil)

// OpenRBD connects to the cluster and opens the image opts names. It fails with an error
// wrapping the errno librados or librbd returned (ENOENT for a missing pool or image, so
// errors.Is(err, fs.ErrNotExist); ETIMEDOUT when the monitors cannot be reached in
// ConnectTimeout; EACCES/EPERM for a key without the caps), or ErrInvalidSize for an image of
// size 0.
func OpenRBD(opts RBDOptions) (Backend, error) {
	r, err := openRBD(opts)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func openRBD(opts RBDOptions) (_ *RBD, err error) {
	name := opts.Name()
	fail := func(what string, err error) (*RBD, error) {
		return nil, fmt.Errorf("backend rbd %s: %s: %w", name, what, err)
	}
	if opts.Pool == "" || opts.Image == "" {
		return fail("open", errors.New("a pool and an image name are required"))
	}
	depth := opts.QueueDepth
	if depth <= 0 {
		depth = DefaultRBDQueueDepth
	}

	r := &RBD{name: name, opts: opts, onResize: opts.OnResize, wfd: -1,
		managed: opts.ManagedLock && !opts.ReadOnly, stop: make(chan struct{})}
	defer func() {
		if err != nil {
			r.release()
		}
	}()
	var p [2]int
	if err = unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return fail("pipe2", err)
	}
	r.wfd = p[1]
	if err = unix.SetNonblock(p[0], true); err != nil {
		unix.Close(p[0])
		return fail("pipe2", err)
	}
	r.rd = os.NewFile(uintptr(p[0]), "rbd-completions")
	if r.cx = C.srpd_rbd_ctx_new(C.int(r.wfd), C.uint32_t(depth)); r.cx == nil {
		return fail("open", syscall.ENOMEM)
	}
	if err = r.connect(); err != nil {
		return nil, err
	}
	size, err := r.readSize()
	if err != nil {
		return fail("rbd_get_size", err)
	}
	if size <= 0 {
		return fail("open", fmt.Errorf("image size %d: %w", size, ErrInvalidSize))
	}
	r.size.Store(size)
	r.info = Info{Kind: "rbd", Path: name, ReadOnly: opts.ReadOnly, CanDiscard: true, DiscardZeroes: true}
	if r.managed {
		var features C.uint64_t
		if ret := C.rbd_get_features(r.img, &features); ret < 0 {
			return fail("rbd_get_features", syscall.Errno(-ret))
		}
		if features&C.RBD_FEATURE_EXCLUSIVE_LOCK == 0 {
			return fail("managed exclusive lock", fmt.Errorf("%w: enable it (rbd feature enable %s exclusive-lock) "+
				"or export the image with exclusive_lock: auto, which does not fence", ErrNoExclusiveLock, name))
		}
	}

	r.slots = make([]rbdSlot, depth)
	r.free = make(chan *rbdSlot, depth)
	for i := range r.slots {
		s := &r.slots[i]
		s.c = C.srpd_rbd_slot_at(r.cx, C.uint32_t(i))
		s.done = make(chan int64, 1)
		r.free <- s
	}
	if ret := C.srpd_rbd_watch(r.img, r.cx, &r.watch); ret < 0 {
		return fail("rbd_update_watch", syscall.Errno(-ret))
	}
	r.watching = true
	r.resized = make(chan struct{}, 1)
	r.wg.Add(2)
	go r.poll()
	go r.watchSize()
	return r, nil
}

// connect opens the cluster connection, the pool, the shared state (which, after a fence,
// moves to the new connection) and the image.
func (r *RBD) connect() (err error) {
	opts := r.opts
	fail := func(what string, err error) error {
		return fmt.Errorf("backend rbd %s: %s: %w", r.name, what, err)
	}
	client := opts.Client
	switch {
	case client == "":
		client = DefaultRBDClient
	case !strings.Contains(client, "."):
		client = "client." + client
	}
	timeout := opts.ConnectTimeout
	if timeout <= 0 {
		timeout = DefaultRBDConnectTimeout
	}
	if r.conn, err = rados.NewConnWithClusterAndUser("ceph", client); err != nil {
		return fail("rados_create2 "+client, cephErrno(err))
	}
	if opts.ConfigFile != "" {
		err = r.conn.ReadConfigFile(opts.ConfigFile)
	} else {
		err = r.conn.ReadDefaultConfigFile()
	}
	if err != nil {
		return fail("reading the cluster configuration "+opts.ConfigFile, cephErrno(err))
	}
	if opts.Keyring != "" {
		if err = r.conn.SetConfigOption("keyring", opts.Keyring); err != nil {
			return fail("keyring "+opts.Keyring, cephErrno(err))
		}
	}
	secs := strconv.FormatInt(int64((timeout+999_999_999)/1_000_000_000), 10)
	if err = r.conn.SetConfigOption("client_mount_timeout", secs); err != nil {
		return fail("client_mount_timeout", cephErrno(err))
	}
	if err = r.conn.Connect(); err != nil {
		return fail("connecting as "+client, cephErrno(err))
	}
	if r.ioctx, err = r.conn.OpenIOContext(opts.Pool); err != nil {
		return fail("pool "+opts.Pool, cephErrno(err))
	}
	r.ioctx.SetNamespace(opts.Namespace)
	if opts.SharedState && !opts.ReadOnly {
		if r.state == nil {
			r.state, err = openState(r.conn, opts.Pool, opts.Namespace, opts.Image)
		} else {
			err = r.state.attach(r.conn, opts.Pool, opts.Namespace)
		}
		if err != nil {
			return fail("shared state", err)
		}
	}
	cname := C.CString(opts.Image)
	defer C.free(unsafe.Pointer(cname))
	ioctx := C.rados_ioctx_t(r.ioctx.Pointer())
	var img C.rbd_image_t
	var ret C.int
	if opts.ReadOnly {
		ret = C.rbd_open_read_only(ioctx, cname, &img, nil)
	} else {
		ret = C.rbd_open(ioctx, cname, &img, nil)
	}
	if ret < 0 {
		return fail("rbd_open", syscall.Errno(-ret))
	}
	r.img = img
	return nil
}

// disconnect closes what connect opened but the shared state (release closes it).
func (r *RBD) disconnect() {
	if r.watching {
		C.rbd_update_unwatch(r.img, r.watch)
		r.watching = false
	}
	if r.img != nil {
		C.rbd_close(r.img) // waits for librbd's own outstanding work; no callback comes after it
		r.img = nil
	}
	if r.ioctx != nil {
		r.ioctx.Destroy()
		r.ioctx = nil
	}
	if r.conn != nil {
		r.conn.Shutdown()
		r.conn = nil
	}
}

// release frees what openRBD got so far (on its failure, and at the end of Close); the
// goroutines, if started, have exited.
func (r *RBD) release() {
	if r.state != nil {
		r.state.close()
		r.state = nil
	}
	r.disconnect()
	if r.rd != nil {
		r.rd.Close()
	}
	if r.wfd >= 0 {
		unix.Close(r.wfd)
	}
	if r.cx != nil {
		C.free(unsafe.Pointer(r.cx))
		r.cx = nil
	}
}

// cephErrno turns go-ceph's error (a negative errno inside) into the syscall.Errno, so that
// callers can test it with errors.Is (fs.ErrNotExist, syscall.ETIMEDOUT...).
func cephErrno(err error) error {
	var ce interface{ ErrorCode() int }
	if errors.As(err, &ce) && ce.ErrorCode() < 0 {
		return syscall.Errno(-ce.ErrorCode())
	}
	return err
}

func (r *RBD) readSize() (int64, error) {
	var size C.uint64_t
	if ret := C.rbd_get_size(r.img, &size); ret < 0 {
		return 0, syscall.Errno(-ret)
	}
	return int64(size), nil
}

// poll hands the completions librbd's callbacks write into the pipe to the waiting callers.
func (r *RBD) poll() {
	defer r.wg.Done()
	defer close(r.resized)
	const recSize = rbdRecSize
	var buf [256 * recSize]byte
	have := 0
	for {
		n, err := r.rd.Read(buf[have:])
		if err != nil {
			return // only Close makes reading fail, after the stop record
		}
		have += n
		recs := have / recSize
		for i := range recs {
			rec := buf[i*recSize:]
			slot := binary.NativeEndian.Uint32(rec)
			ret := int64(binary.NativeEndian.Uint64(rec[8:]))
			switch slot {
			case C.SRPD_RBD_STOP:
				return
			case C.SRPD_RBD_RESIZED:
				C.srpd_rbd_rearm(r.cx)
				select {
				case r.resized <- struct{}{}:
				default:
				}
			default:
				r.slots[slot].done <- ret
			}
		}
		have = copy(buf[:], buf[recs*recSize:have])
	}
}

// watchSize reads the image's size again after each header update poll reports (not in poll:
// rbd_get_size may have to refresh the header from the cluster, and completions must not wait
// for that).
func (r *RBD) watchSize() {
	defer r.wg.Done()
	for range r.resized {
		size, err := r.readSize()
		if err != nil || size == r.size.Load() {
			continue
		}
		r.size.Store(size)
		if r.onResize != nil {
			r.onResize(size)
		}
	}
}

// do runs one request and waits for its completion: its return value, or a negative errno.
func (r *RBD) do(op C.int, p []byte, off, n int64) int64 {
	s := <-r.free
	var buf *C.char
	if len(p) > 0 {
		s.pin.Pin(&p[0]) // librbd reads or fills p after srpd_rbd_submit returns
		buf = (*C.char)(unsafe.Pointer(&p[0]))
	}
	ret := int64(C.srpd_rbd_submit(r.img, s.c, op, C.uint64_t(off), C.size_t(n), buf))
	if ret == 0 {
		ret = <-s.done
	}
	s.pin.Unpin()
	r.free <- s
	return ret
}

// begin checks a call in the order closed, fenced (managed lock), read-only (write), range,
// and on success holds inflight shared: the caller must call r.inflight.RUnlock when done with
// the image. With the managed lock it takes the lock first if this client does not own it.
func (r *RBD) begin(op string, off, n int64, write bool) error {
	return r.beginAccess(op, off, n, write, true)
}

// beginAccess is begin; lock false leaves the managed lock alone, for the calls that only
// read the image's metadata (allocation, usage): a standby gateway's monitoring must not take
// the unit over.
func (r *RBD) beginAccess(op string, off, n int64, write, lock bool) error {
	if r.closed.Load() {
		return fmt.Errorf("backend rbd %s: %s: %w", r.name, op, ErrClosed)
	}
	if r.managed && r.fenced.Load() {
		if err := r.waitBack(op); err != nil {
			return err
		}
	}
	r.inflight.RLock()
	var err error
	switch {
	case r.closed.Load():
		err = fmt.Errorf("backend rbd %s: %s: %w", r.name, op, ErrClosed)
	case r.managed && r.fenced.Load():
		err = fmt.Errorf("backend rbd %s: %s: %w", r.name, op, ErrFenced)
	case write && r.info.ReadOnly:
		err = fmt.Errorf("backend rbd %s: %s: %w", r.name, op, ErrReadOnly)
	case !inRange(off, n, r.size.Load()):
		err = fmt.Errorf("backend rbd %s: %s [%d, +%d) of %d bytes: %w", r.name, op, off, n, r.size.Load(), ErrOutOfRange)
	case lock && r.managed && !r.owner.Load():
		err = r.takeLock(op)
	}
	if err != nil {
		r.inflight.RUnlock()
	}
	return err
}

// takeLock makes this client the owner of the managed lock (inflight held shared).
func (r *RBD) takeLock(op string) error {
	r.lockMu.Lock()
	defer r.lockMu.Unlock()
	if r.owner.Load() {
		return nil
	}
	var broke C.int
	ret := C.srpd_rbd_take_lock(r.img, &broke)
	if ret < 0 {
		if fencedErrno(int64(ret)) {
			r.fence()
		}
		// Another client holds the lock and it could not be taken (it raced us to it): the
		// command fails as a transition and the initiator retries.
		return fmt.Errorf("backend rbd %s: %s: taking the exclusive lock: %w (%w)", r.name, op, ErrFenced, syscall.Errno(-ret))
	}
	r.owner.Store(true)
	if r.opts.OnLock != nil {
		r.opts.OnLock(LockEvent{Kind: LockAcquired, Broken: int(broke), Epoch: r.epoch.Load()})
	}
	return nil
}

// fencedErrno reports whether a librbd result says that this client lost the managed lock:
// EBLOCKLISTED (ESHUTDOWN: the cluster refuses a client whose lock another one broke), or
// EROFS (the lock is gone and librbd may not ask for it back in managed mode).
func fencedErrno(ret int64) bool {
	return ret == -int64(syscall.ESHUTDOWN) || ret == -int64(syscall.EROFS)
}

// fence records that another client took the lock over. Calls fail with ErrFenced from now
// on until Resume and the reconnect after it.
func (r *RBD) fence() {
	r.fmu.Lock()
	defer r.fmu.Unlock()
	if r.fenced.Load() {
		return
	}
	r.owner.Store(false)
	r.back = make(chan struct{})
	e := r.epoch.Add(1)
	r.fenced.Store(true)
	if r.opts.OnLock != nil {
		r.opts.OnLock(LockEvent{Kind: LockFenced, Epoch: e})
	}
}

// resumeWait bounds how long a call waits for the reconnect that Resume started.
const resumeWait = 10 * time.Second

// waitBack is a call's wait while fenced: ErrFenced unless Resume was called for the current
// epoch (then every caller is one admitted after the fence), in which case it waits for the
// reconnect, bounded by resumeWait.
func (r *RBD) waitBack(op string) error {
	r.fmu.Lock()
	asked, back := r.asked == r.epoch.Load(), r.back
	r.fmu.Unlock()
	if asked && back != nil {
		t := time.NewTimer(resumeWait)
		defer t.Stop()
		select {
		case <-back:
			return nil
		case <-t.C:
		case <-r.stop:
		}
	}
	return fmt.Errorf("backend rbd %s: %s: %w", r.name, op, ErrFenced)
}

// LockOwned reports whether this client owns the managed exclusive lock, as last seen (false
// without the managed lock).
func (r *RBD) LockOwned() bool { return r.owner.Load() }

// FenceEpoch implements Fenceable: the number of fences learnt of so far.
func (r *RBD) FenceEpoch() uint64 { return r.epoch.Load() }

// Resume implements Fenceable: nothing admitted before fence epoch e is left, so the image
// may be opened again through a new cluster connection (the old one is blocklisted). It runs
// in the background, retrying every second until it succeeds or the backend is closed.
func (r *RBD) Resume(e uint64) {
	r.fmu.Lock()
	defer r.fmu.Unlock()
	if !r.fenced.Load() || e != r.epoch.Load() || r.asked >= e {
		return
	}
	r.asked = e
	r.rwg.Add(1)
	go r.reconnect(e, r.back)
}

func (r *RBD) reconnect(e uint64, back chan struct{}) {
	defer r.rwg.Done()
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-retry.C:
		}
		err := r.reopen()
		if errors.Is(err, ErrClosed) {
			return
		}
		if r.opts.OnLock != nil {
			r.opts.OnLock(LockEvent{Kind: LockResumed, Epoch: e, Err: err})
		}
		if err == nil {
			r.fmu.Lock()
			r.fenced.Store(false)
			close(back)
			r.fmu.Unlock()
			return
		}
		retry.Reset(time.Second)
	}
}

// reopen replaces the blocklisted cluster connection and image with new ones (no call is in
// progress: inflight held exclusively). The lock is taken again by the next call.
func (r *RBD) reopen() error {
	r.inflight.Lock()
	defer r.inflight.Unlock()
	if r.closed.Load() {
		return ErrClosed
	}
	if r.state != nil {
		r.state.detach() // before its connection goes
	}
	r.disconnect()
	undo := func(err error) error {
		if r.state != nil {
			r.state.detach()
		}
		r.disconnect()
		return err
	}
	if err := r.connect(); err != nil {
		return undo(err)
	}
	if ret := C.srpd_rbd_watch(r.img, r.cx, &r.watch); ret < 0 {
		return undo(fmt.Errorf("backend rbd %s: rbd_update_watch: %w", r.name, syscall.Errno(-ret)))
	}
	r.watching = true
	if size, err := r.readSize(); err == nil && size != r.size.Load() {
		r.size.Store(size)
		if r.onResize != nil {
			r.onResize(size)
		}
	}
	return nil
}

// fail is the error of a request librbd failed with ret (a negative errno); with the managed
// lock, a result that says the lock was lost fences the backend and wraps ErrFenced.
func (r *RBD) fail(op string, off, n int64, ret int64) error {
	if r.managed && fencedErrno(ret) {
		r.fence()
		return fmt.Errorf("backend rbd %s: %s %d bytes at %d: %w (%w)", r.name, op, n, off, ErrFenced, syscall.Errno(-ret))
	}
	return fmt.Errorf("backend rbd %s: %s %d bytes at %d: %w", r.name, op, n, off, syscall.Errno(-ret))
}

// ReadAt reads len(p) bytes at off (rbd_aio_read2).
func (r *RBD) ReadAt(p []byte, off int64) (int, error) {
	n := int64(len(p))
	if err := r.begin("read", off, n, false); err != nil {
		return 0, err
	}
	defer r.inflight.RUnlock()
	if n == 0 {
		return 0, nil
	}
	ret := r.do(C.SRPD_RBD_READ, p, off, n)
	switch {
	case ret < 0:
		return 0, r.fail("read", off, n, ret)
	case ret < n: // the image shrank under the read
		return int(ret), fmt.Errorf("backend rbd %s: read %d bytes at %d: got %d: %w", r.name, n, off, ret, io.ErrUnexpectedEOF)
	}
	return len(p), nil
}

// WriteAt writes len(p) bytes at off (rbd_aio_write2). librbd writes all or fails.
func (r *RBD) WriteAt(p []byte, off int64) (int, error) {
	n := int64(len(p))
	if err := r.begin("write", off, n, true); err != nil {
		return 0, err
	}
	defer r.inflight.RUnlock()
	if n == 0 {
		return 0, nil
	}
	if ret := r.do(C.SRPD_RBD_WRITE, p, off, n); ret < 0 {
		return 0, r.fail("write", off, n, ret)
	}
	return len(p), nil
}

// Flush waits until every completed write is durable in the cluster (rbd_aio_flush: with
// librbd's cache on, it writes the cache back). Nothing to do when read-only.
func (r *RBD) Flush() error {
	if err := r.begin("flush", 0, 0, false); err != nil {
		return err
	}
	defer r.inflight.RUnlock()
	if r.info.ReadOnly {
		return nil
	}
	if ret := r.do(C.SRPD_RBD_FLUSH, nil, 0, 0); ret < 0 {
		return r.fail("flush", 0, 0, ret)
	}
	return nil
}

// Discard deallocates [off, off+n), which reads as zeroes afterwards: see RBD.
func (r *RBD) Discard(off, n int64) error { return r.zero("discard", off, n) }

// WriteZeroes makes [off, off+n) read as zeroes, deallocating what it can: see RBD.
func (r *RBD) WriteZeroes(off, n int64) error { return r.zero("write zeroes", off, n) }

func (r *RBD) zero(op string, off, n int64) error {
	if err := r.begin(op, off, n, true); err != nil {
		return err
	}
	defer r.inflight.RUnlock()
	for n > 0 {
		m := min(n, rbdZeroChunk)
		if ret := r.do(C.SRPD_RBD_ZERO, nil, off, m); ret < 0 {
			return r.fail(op, off, m, ret)
		}
		off, n = off+m, n-m
	}
	return nil
}

// Size is the image's size in bytes, as last seen (see RBD).
func (r *RBD) Size() int64 { return r.size.Load() }

// Info: Kind "rbd", Path pool[/namespace]/image, CanDiscard and DiscardZeroes (see RBD),
// non-rotating, PhysicalBlockSize 0 (the 4 MiB object is no block a host should align to).
func (r *RBD) Info() Info { return r.info }

// Close waits for the calls in progress, then closes the image and the cluster connection.
func (r *RBD) Close() error {
	if !r.closed.CompareAndSwap(false, true) {
		return fmt.Errorf("backend rbd %s: close: %w", r.name, ErrClosed)
	}
	close(r.stop) // a reconnect after a fence gives up
	r.rwg.Wait()
	r.inflight.Lock() // every call in progress has returned; later ones see closed
	defer r.inflight.Unlock()
	// No completion is outstanding now; stop the update watch, then the poller (which may be
	// handing a resize to watchSize), and only then close the image under them.
	if r.watching {
		C.rbd_update_unwatch(r.img, r.watch)
		r.watching = false
	}
	var stop [rbdRecSize]byte
	binary.NativeEndian.PutUint32(stop[:], C.SRPD_RBD_STOP)
	if _, err := unix.Write(r.wfd, stop[:]); err != nil {
		r.rd.Close() // the poller's Read fails instead
	}
	r.wg.Wait()
	r.release()
	return nil
}

// SharedState returns the image's shared state (RBDOptions.SharedState), or nil.
func (r *RBD) SharedState() SharedState {
	if r.state == nil {
		return nil
	}
	return r.state
}
