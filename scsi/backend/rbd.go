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
}

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
