package nbd

import (
	"sort"
	"sync/atomic"
	"time"
)

// Counters count the requests of a connection or an export. Requests counts every request
// answered (DISC has no reply and is not counted); the per-command counts include failed
// requests; Errors counts replies with a non-zero error.
type Counters struct {
	Requests     uint64
	Reads        uint64
	Writes       uint64
	Flushes      uint64
	Trims        uint64
	WriteZeroes  uint64
	Caches       uint64
	BlockStatus  uint64 // NBD_CMD_BLOCK_STATUS
	Invalid      uint64 // unknown commands (answered EINVAL)
	BytesRead    uint64 // payload bytes sent in successful READ replies
	BytesWritten uint64 // payload bytes of successful WRITEs
	Errors       uint64
	// ReplyWrites counts the batches of replies written: a batch is every reply queued when
	// its write starts, sent with one writev unless the socket takes it only in parts.
	// Requests / ReplyWrites is the replies per batch.
	ReplyWrites uint64
	// SpinReads counts the reads that found their data while spinning (Config.ReadSpin):
	// requests that arrived without a wait in the runtime's netpoller.
	SpinReads uint64
	// ReadWaits counts the reads that found no data (after the spin, if any) and waited for
	// the socket in the netpoller: each a wake-up of the reader when the request arrives.
	ReadWaits uint64
	// StalledClosed counts the connections closed because their client did not read the
	// replies within Config.WriteTimeout (0 or 1 for a connection).
	StalledClosed uint64
}

func (c *Counters) add(o Counters) {
	c.Requests += o.Requests
	c.Reads += o.Reads
	c.Writes += o.Writes
	c.Flushes += o.Flushes
	c.Trims += o.Trims
	c.WriteZeroes += o.WriteZeroes
	c.Caches += o.Caches
	c.BlockStatus += o.BlockStatus
	c.Invalid += o.Invalid
	c.BytesRead += o.BytesRead
	c.BytesWritten += o.BytesWritten
	c.Errors += o.Errors
	c.ReplyWrites += o.ReplyWrites
	c.SpinReads += o.SpinReads
	c.ReadWaits += o.ReadWaits
	c.StalledClosed += o.StalledClosed
}

// counters is the live, atomically updated form of Counters.
type counters struct {
	requests, reads, writes, flushes, trims, zeroes, caches, invalid   atomic.Uint64
	bytesRead, bytesWritten, errors, replyWrites, spinReads, readWaits atomic.Uint64
	stalledClosed, blockStatus                                         atomic.Uint64
}

func (c *counters) snapshot() Counters {
	return Counters{
		Requests:     c.requests.Load(),
		Reads:        c.reads.Load(),
		Writes:       c.writes.Load(),
		Flushes:      c.flushes.Load(),
		Trims:        c.trims.Load(),
		WriteZeroes:  c.zeroes.Load(),
		Caches:       c.caches.Load(),
		BlockStatus:  c.blockStatus.Load(),
		Invalid:      c.invalid.Load(),
		BytesRead:    c.bytesRead.Load(),
		BytesWritten: c.bytesWritten.Load(),
		Errors:       c.errors.Load(),
		ReplyWrites:  c.replyWrites.Load(),
		SpinReads:    c.spinReads.Load(),
		ReadWaits:    c.readWaits.Load(),

		StalledClosed: c.stalledClosed.Load(),
	}
}

// count records one answered request of type typ with error code e and n payload bytes.
func (c *counters) count(typ uint16, e Errno, n int) {
	c.requests.Add(1)
	switch typ {
	case cmdRead:
		c.reads.Add(1)
		if e == 0 {
			c.bytesRead.Add(uint64(n))
		}
	case cmdWrite:
		c.writes.Add(1)
		if e == 0 {
			c.bytesWritten.Add(uint64(n))
		}
	case cmdFlush:
		c.flushes.Add(1)
	case cmdTrim:
		c.trims.Add(1)
	case cmdWriteZeroes:
		c.zeroes.Add(1)
	case cmdCache:
		c.caches.Add(1)
	case cmdBlockStatus:
		c.blockStatus.Add(1)
	default:
		c.invalid.Add(1)
	}
	if e != 0 {
		c.errors.Add(1)
	}
}

// ConnStats describes one connection in transmission phase.
type ConnStats struct {
	ID         uint64
	Remote     string // the peer address ("@" or empty for unnamed unix sockets)
	Export     string
	Since      time.Time // when transmission started
	Structured bool      // structured replies negotiated
	InFlight   int       // requests read and not yet answered
	Counters
}

// ExportStats describes one export: Counters sum every connection it ever had.
type ExportStats struct {
	Name      string
	Size      int64
	BlockSize int
	ReadOnly  bool
	Conns     int // connections in transmission phase now
	Counters
}

// Stats is a snapshot of the server's counters.
type Stats struct {
	Accepted          uint64 // connections accepted (or passed to ServeConn)
	HandshakeFailures uint64 // connections that ended before transmission (incl. NBD_OPT_ABORT)
	Active            int    // connections open now, in handshake or transmission
	// Refused counts the connections refused for Config.MaxConnections: NBD_OPT_GO or
	// NBD_OPT_EXPORT_NAME with every transmission slot taken, and connections closed at once
	// because as many were in their handshake.
	Refused      uint64
	BufferBytes  int64 // bytes held in request buffers, in use or free
	BufferInUse  int64 // bytes of the request buffers in use (held by requests)
	BufferBudget int64 // Config.MaxInFlightBytes
	Exports      []ExportStats
	Conns        []ConnStats
}

// Stats returns a snapshot of the server's counters. Exports and Conns are sorted by name and
// ID.
func (s *Server) Stats() Stats {
	var st Stats
	st.Accepted = s.accepted.Load()
	st.HandshakeFailures = s.handshakeFailures.Load()
	st.Refused = s.refused.Load()
	st.BufferBytes, st.BufferInUse, st.BufferBudget = s.pool.stats()

	s.mu.Lock()
	st.Active = len(s.conns)
	exps := make([]*export, 0, len(s.exports))
	for _, e := range s.exports {
		exps = append(exps, e)
	}
	s.mu.Unlock()

	for _, e := range exps {
		e.mu.Lock()
		es := ExportStats{
			Name:      e.name,
			Size:      e.dev.Size(),
			BlockSize: e.dev.BlockSize(),
			ReadOnly:  e.dev.ReadOnly(),
			Conns:     len(e.conns),
			Counters:  e.retired,
		}
		for c := range e.conns {
			cs := c.stats()
			es.Counters.add(cs.Counters)
			st.Conns = append(st.Conns, cs)
		}
		e.mu.Unlock()
		st.Exports = append(st.Exports, es)
	}
	sort.Slice(st.Exports, func(i, j int) bool { return st.Exports[i].Name < st.Exports[j].Name })
	sort.Slice(st.Conns, func(i, j int) bool { return st.Conns[i].ID < st.Conns[j].ID })
	return st
}
