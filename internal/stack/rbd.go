package stack

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/scsi/backend"
)

// openRBD opens the Ceph RBD image of an rbd LUN. In a build without the rbd backend (no
// -tags rbd, or no cgo) it fails with backend.ErrRBDUnavailable and ctlapi.ErrUnsupported;
// config validation refuses such a LUN before it gets here (config.RBDSupported).
func openRBD(l config.LUN, onResize func(int64), log *zap.Logger) (backend.Backend, error) {
	if l.RBD == nil {
		return nil, fmt.Errorf("backend rbd: no rbd settings (pool, image): %w", ctlapi.ErrInvalidArgument)
	}
	be, err := backend.OpenRBD(backend.RBDOptions{
		ConfigFile: l.RBD.ClusterConfig,
		Client:     l.RBD.Client,
		Keyring:    l.RBD.Keyring,
		Pool:       l.RBD.Pool,
		Namespace:  l.RBD.Namespace,
		Image:      l.RBD.Image,
		ReadOnly:   l.ReadOnly,
		OnResize:   onResize,
		// The unit's persistent reservations live beside the image, for every gateway
		// (scsi/prstore.go): PR through one gateway holds through the others.
		SharedState: true,
		ManagedLock: l.RBD.ExclusiveLock != config.RBDLockAuto,
		OnLock:      lockLogger(log.With(zap.String("image", l.RBD.Spec()), zap.Int("lun", l.ID))),
	})
	if errors.Is(err, backend.ErrRBDUnavailable) {
		return nil, fmt.Errorf("%w (%w)", err, ctlapi.ErrUnsupported)
	}
	return be, err
}

// lockLogger logs the events of an image's managed exclusive lock: operators want to see a
// takeover (which blocklists the other gateway) and a fence.
func lockLogger(log *zap.Logger) func(backend.LockEvent) {
	return func(ev backend.LockEvent) {
		switch ev.Kind {
		case backend.LockAcquired:
			if ev.Broken > 0 {
				log.Warn("took the image's exclusive lock over: the previous owner was blocklisted",
					zap.Int("owners_broken", ev.Broken), zap.Uint64("fence_epoch", ev.Epoch))
			} else {
				log.Info("took the image's exclusive lock", zap.Uint64("fence_epoch", ev.Epoch))
			}
		case backend.LockFenced:
			log.Warn("another gateway took the image's exclusive lock: fenced; I/O here fails with "+
				"ASYMMETRIC ACCESS STATE TRANSITION until the commands from before the takeover are done",
				zap.Uint64("fence_epoch", ev.Epoch))
		case backend.LockResumed:
			if ev.Err != nil {
				log.Warn("reconnecting to the cluster after the fence failed; retrying", zap.Error(ev.Err))
			} else {
				log.Info("reconnected to the cluster after the fence", zap.Uint64("fence_epoch", ev.Epoch))
			}
		}
	}
}

// prStore is a backend's SharedState as the scsi LUN's PRStore.
type prStore struct{ s backend.SharedState }

func (p prStore) Load(context.Context) ([]byte, uint64, error) { return p.s.Load() }

func (p prStore) CompareAndSwap(_ context.Context, ver uint64, data []byte) error {
	err := p.s.CompareAndSwap(ver, data)
	if errors.Is(err, backend.ErrStateChanged) {
		return fmt.Errorf("%w: %w", scsi.ErrPRStoreConflict, err)
	}
	return err
}

func (p prStore) Watch(f func()) { p.s.Watch(f) }

// sharedPRStore is the PRStore of a backend that keeps a shared state (an RBD image), or nil.
func sharedPRStore(be backend.Backend) scsi.PRStore {
	if ss, ok := be.(interface{ SharedState() backend.SharedState }); ok {
		if s := ss.SharedState(); s != nil {
			return prStore{s}
		}
	}
	return nil
}
