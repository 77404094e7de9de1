package backend

import (
	"errors"
	"time"
)

// ErrRBDUnavailable: OpenRBD in a build without the rbd backend (built without -tags rbd, or
// without cgo). The default build is pure Go and does not link librbd.
var ErrRBDUnavailable = errors.New("backend: rbd support not built in (build tag rbd, cgo, librbd-dev)")

// Defaults of RBDOptions.
const (
	// DefaultRBDClient is the cephx entity srpd connects as when RBDOptions.Client is empty.
	DefaultRBDClient = "client.admin"
	// DefaultRBDConnectTimeout bounds reaching the monitors (librados' client_mount_timeout,
	// 300 s by default, is too long for a daemon starting its LUNs).
	DefaultRBDConnectTimeout = 30 * time.Second
	// DefaultRBDQueueDepth bounds the requests one image has in flight in librbd. The target
	// runs at most Limits.LUNWorkers commands of a LUN at once anyway; this bounds callers that
	// are not the target.
	DefaultRBDQueueDepth = 128
)

// RBDOptions configure OpenRBD: which Ceph cluster, as whom, and which image.
type RBDOptions struct {
	// ConfigFile is the cluster's configuration (monitor addresses, auth settings). Empty:
	// librados' default search ($CEPH_CONF, /etc/ceph/ceph.conf, ~/.ceph/config, ./ceph.conf).
	ConfigFile string
	// Client is the cephx entity, "client.<id>" (an "<id>" alone is taken as client.<id>).
	// Empty: DefaultRBDClient.
	Client string
	// Keyring is the keyring file holding Client's key. Empty: the configuration's keyring
	// setting (by default /etc/ceph/$cluster.$name.keyring and others).
	Keyring string
	// Pool, Namespace (optional) and Image name the RBD image. The image must exist; its size
	// is the LUN's capacity.
	Pool, Namespace, Image string
	// SharedState opens the image's shared state object (SharedState; the persistent
	// reservations of the unit, for every gateway that exports the image): RBD.SharedState.
	SharedState bool
	// ReadOnly opens the image read-only: every mutating call fails with ErrReadOnly.
	ReadOnly bool
	// ConnectTimeout bounds reaching the monitors; zero: DefaultRBDConnectTimeout.
	ConnectTimeout time.Duration
	// QueueDepth bounds the requests in flight in librbd (further callers wait for a slot);
	// zero: DefaultRBDQueueDepth.
	QueueDepth int
	// OnResize, when not nil, is called (from a goroutine of the backend, never concurrently
	// with itself) with the new size after the image was resized while open. Size reports the
	// new size from then on; the SCSI layer does not announce it to initiators yet (no
	// CAPACITY DATA HAS CHANGED unit attention), so they see it on their next READ CAPACITY
	// only if the LUN is re-created.
	OnResize func(size int64)
	// ManagedLock takes the image's exclusive lock in managed mode, for gateways that export
	// one image together (one logical unit through several target ports): the first call that
	// reads or writes the image takes the lock, breaking the current owner's, which makes the
	// cluster blocklist that owner (librbd's rbd_blocklist_on_break_lock, on by default) so
	// that no write of it lands afterwards; the lock is never handed over cooperatively. A
	// gateway whose lock was broken is fenced: its calls fail with ErrFenced until its user
	// calls Resume (see Fenceable), which opens the image again through a new connection.
	// Without it librbd's automatic lock applies: the lock moves to whichever client writes,
	// handed over cooperatively, and a live gateway that hands it over is not blocklisted.
	ManagedLock bool
	// OnLock, when not nil, is told of the managed lock's events (from the goroutine of the
	// call or reconnect that caused them), e.g. for logging.
	OnLock func(LockEvent)
}

// LockEvent is an event of an RBD image's managed exclusive lock (RBDOptions.OnLock).
type LockEvent struct {
	Kind LockEventKind
	// Broken is the number of other owners whose lock was broken (and who were blocklisted)
	// to take it (LockAcquired).
	Broken int
	// Epoch is the fence epoch (Fenceable.FenceEpoch) the event belongs to.
	Epoch uint64
	// Err is the reconnect's failure (LockResumed; it is retried every second).
	Err error
}

// LockEventKind says what happened to the managed lock.
type LockEventKind uint8

const (
	// LockAcquired: this client took the lock.
	LockAcquired LockEventKind = iota + 1
	// LockFenced: another client broke this one's lock; calls fail with ErrFenced.
	LockFenced
	// LockResumed: the reconnect after a fence finished (Err nil) or failed.
	LockResumed
)

// Name is the image spec pool[/namespace]/image, as the rbd tool writes it.
func (o RBDOptions) Name() string {
	if o.Namespace != "" {
		return o.Pool + "/" + o.Namespace + "/" + o.Image
	}
	return o.Pool + "/" + o.Image
}

// SharedState is a small object that every exporter (gateway) of one RBD image reads and
// writes: the persistent reservation state of the unit the image is (scsi.PRStore is built on
// it). Writes are compare-and-swap on the object's version; Watch tells of others' writes.
type SharedState interface {
	// Load returns the state (nil when none was written yet) and its version.
	Load() ([]byte, uint64, error)
	// CompareAndSwap writes data if the object's version is still version, then tells the
	// other exporters and waits (bounded) for them to acknowledge; ErrStateChanged if another
	// exporter wrote meanwhile.
	CompareAndSwap(version uint64, data []byte) error
	// Watch calls changed whenever the object is written.
	Watch(changed func())
}

// ErrStateChanged: the shared state was written by another exporter since it was read.
var ErrStateChanged = errors.New("backend: shared state changed meanwhile")
