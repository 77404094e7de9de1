package daemon

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/transport/softroce"
)

// Fast recovery after a crash. A killed srpd sends no DREQ, so its peers learn that their
// connections are gone only through their own timeouts: the kernel's ib_srp after SCSI command
// timeouts, aborts and resets (about 110 s measured under fio). srpd therefore keeps the CM
// identity of every established softroce connection (softroce.ConnIdentity) in a small state
// file, rewritten atomically whenever the set changes, and the next instance sends a DREQ for
// each one it finds there (softroce.Device.SendStaleDREQ): the peer's CM disconnects at once
// (cm.c cm_dreq_handler; ib_srp then reconnects after its reconnect_delay). The kernel verbs
// engine owns its CM state in the kernel, which disconnects when the process dies; it is not
// recorded.

// connStateInterval is how often the recorder compares the connections with the file.
const connStateInterval = 200 * time.Millisecond

// staleDREQDelays are when the DREQs for the previous instance's connections go out, counted
// from start-up: several, since a DREQ is one unacknowledged datagram here (cm.c retransmits
// its own; a duplicate is answered with a DREP and changes nothing).
var staleDREQDelays = [...]time.Duration{0, 200 * time.Millisecond, time.Second}

// connStateFile is the state file's content.
type connStateFile struct {
	Version int          `json:"version"`
	PID     int          `json:"pid"`
	Conns   []connRecord `json:"connections"`
}

// connRecord is one connection and the transport it was on.
type connRecord struct {
	Transport string `json:"transport"`
	softroce.ConnIdentity
}

// connStatePath is where the state file lives: the first run directory (systemd's
// RuntimeDirectory, /run/srpd), else beside the control socket; "" when there is neither.
func (d *Daemon) connStatePath(controlSocket string) string {
	if len(d.opts.RunDirs) > 0 && d.opts.RunDirs[0] != "" {
		return filepath.Join(d.opts.RunDirs[0], "connections.json")
	}
	if controlSocket == "" {
		return ""
	}
	return strings.TrimSuffix(controlSocket, filepath.Ext(controlSocket)) + ".connections.json"
}

// readConnState reads the state file; a missing file is no connections.
func readConnState(path string) ([]connRecord, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f connStateFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if f.Version != 1 {
		return nil, fmt.Errorf("%s: version %d, want 1", path, f.Version)
	}
	return f.Conns, nil
}

// writeFileAtomic replaces path with data: a temporary file in the same directory, synced,
// then renamed over it, so a crash leaves the old file or the new one, never a torn one.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	if werr == nil {
		werr = tmp.Chmod(mode)
	}
	if werr == nil {
		werr = tmp.Sync()
	}
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), path)
	}
	if werr != nil {
		_ = os.Remove(tmp.Name())
	}
	return werr
}

// connRecorder keeps the state file in step with the daemon's connections.
type connRecorder struct {
	d    *Daemon
	path string
	log  *zap.Logger
	last []byte // what the file holds
	stop chan struct{}
	wg   sync.WaitGroup
}

// snapshot collects the established connections of every softroce transport, sorted.
func (r *connRecorder) snapshot() []connRecord {
	r.d.mu.RLock()
	defer r.d.mu.RUnlock()
	var recs []connRecord
	for name, t := range r.d.transports {
		dev := t.SoftRoCE()
		if dev == nil {
			continue
		}
		for _, id := range dev.EstablishedConns() {
			recs = append(recs, connRecord{Transport: name, ConnIdentity: id})
		}
	}
	slices.SortFunc(recs, func(a, b connRecord) int {
		return cmp.Or(strings.Compare(a.Transport, b.Transport), cmp.Compare(a.LocalCommID, b.LocalCommID))
	})
	return recs
}

// sync writes the file if the connections changed since the last write.
func (r *connRecorder) sync() {
	recs := r.snapshot()
	b, err := json.MarshalIndent(connStateFile{Version: 1, PID: os.Getpid(), Conns: recs}, "", "  ")
	if err != nil {
		r.log.Warn("connection state", zap.Error(err))
		return
	}
	if bytes.Equal(b, r.last) {
		return
	}
	if err := writeFileAtomic(r.path, append(b, '\n'), 0o600); err != nil {
		r.log.Warn("connection state: write", zap.String("path", r.path), zap.Error(err))
		return
	}
	r.last = b
}

func (r *connRecorder) run() {
	defer r.wg.Done()
	tick := time.NewTicker(connStateInterval)
	defer tick.Stop()
	for {
		r.sync()
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
	}
}

// close stops recording and removes the file: after a clean shutdown the peers were sent
// DREQs by the connections themselves.
func (r *connRecorder) close() {
	close(r.stop)
	r.wg.Wait()
	if err := os.Remove(r.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		r.log.Warn("connection state: remove", zap.String("path", r.path), zap.Error(err))
	}
}

// startConnRecovery disconnects the connections the previous instance left in the state file
// (on the transports that are up now, from an address they still have) and starts recording
// this instance's. It returns nil when there is no place for the file.
func (d *Daemon) startConnRecovery(controlSocket string) *connRecorder {
	path := d.connStatePath(controlSocket)
	if path == "" {
		return nil
	}
	log := d.log.With(zap.String("state_file", path))
	stale, err := readConnState(path)
	if err != nil {
		log.Warn("connections of the previous instance not disconnected: unreadable state file", zap.Error(err))
	}
	type target struct {
		dev *softroce.Device
		id  softroce.ConnIdentity
	}
	var send []target
	d.mu.RLock()
	for _, rec := range stale {
		t := d.transports[rec.Transport]
		if t == nil || t.SoftRoCE() == nil || !slices.Contains(t.Addrs(), rec.Local) {
			continue
		}
		send = append(send, target{t.SoftRoCE(), rec.ConnIdentity})
	}
	d.mu.RUnlock()
	r := &connRecorder{d: d, path: path, log: log, stop: make(chan struct{})}
	if len(stale) > 0 {
		log.Info("disconnecting the connections of the previous instance (it did not shut down cleanly)",
			zap.Int("recorded", len(stale)), zap.Int("sent", len(send)))
	}
	if len(send) > 0 {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			start := time.Now()
			for _, at := range staleDREQDelays {
				select {
				case <-r.stop:
					return
				case <-time.After(time.Until(start.Add(at))):
				}
				for _, s := range send {
					s.dev.SendStaleDREQ(s.id)
				}
			}
		}()
	}
	r.wg.Add(1)
	go r.run()
	return r
}
