// Package nbd is an NBD server: it exposes block devices — the initiator's remote LUNs — as
// named NBD exports, so that qemu, nbd-client (/dev/nbdX), nbdcopy, nbdinfo and fio's nbd
// engine can use them. The protocol is NetworkBlockDevice/nbd:doc/proto.md; constants in
// proto.go name the section each value comes from.
//
// # Use
//
//	srv, err := nbd.NewServer(nbd.Config{Logger: log})
//	err = srv.AddExport("lun0", dev, nbd.ExportOptions{Description: "target X LUN 0"})
//	_, err = srv.ListenUnix("/run/srpd/nbd.sock") // and/or srv.ListenTCP("127.0.0.1:10809")
//	err = srv.Serve(ctx) // until ctx is done, then a graceful shutdown
//
// Clients connect with URIs such as nbd+unix:///lun0?socket=/run/srpd/nbd.sock or
// nbd://127.0.0.1:10809/lun0. Exports can be added and removed while serving; RemoveExport
// closes the export's connections after answering what they have in flight. Stats returns
// per-connection and per-export counters.
//
// # Protocol coverage
//
// Handshake: fixed newstyle only, with NBD_FLAG_FIXED_NEWSTYLE and NBD_FLAG_NO_ZEROES.
// Options: NBD_OPT_GO and NBD_OPT_INFO (replying NBD_INFO_EXPORT and NBD_INFO_BLOCK_SIZE
// always, NBD_INFO_NAME and NBD_INFO_DESCRIPTION when asked), NBD_OPT_EXPORT_NAME, NBD_OPT_LIST,
// NBD_OPT_ABORT, NBD_OPT_STRUCTURED_REPLY and NBD_OPT_LIST_META_CONTEXT/SET_META_CONTEXT (the
// base:allocation context, for a Device that is a BlockStatuser). NBD_OPT_STARTTLS gets
// NBD_REP_ERR_POLICY (NOTLS mode); every other option gets NBD_REP_ERR_UNSUP. The whole handshake is bounded by Config.HandshakeTimeout.
//
// Transmission: NBD_CMD_READ, WRITE, DISC, FLUSH, TRIM (when the Device can discard),
// WRITE_ZEROES (with NBD_CMD_FLAG_NO_HOLE) and CACHE (a no-op), NBD_CMD_FLAG_FUA on every
// command, NBD_CMD_FLAG_DF on reads once structured replies are on. Transmission flags:
// HAS_FLAGS, READ_ONLY, SEND_FLUSH, SEND_FUA, SEND_TRIM, SEND_WRITE_ZEROES, SEND_DF,
// SEND_CACHE and CAN_MULTI_CONN, which the Device contract (see Device) makes valid. With
// structured replies a read is answered with one NBD_REPLY_TYPE_OFFSET_DATA chunk (or
// NBD_REPLY_TYPE_NONE for a zero-length read) and any failure with an NBD_REPLY_TYPE_ERROR
// chunk carrying a message; other successes use simple replies.
//
// NBD_CMD_BLOCK_STATUS is answered from the Device's allocation (BlockStatuser) once
// base:allocation was selected. Requests are checked before the Device sees them, in this
// order: unknown command, or NBD_CMD_BLOCK_STATUS without the context → EINVAL; a command flag not valid for the command → EINVAL; a write,
// trim or zeroing on a read-only export → EPERM; TRIM when not advertised → EINVAL; a READ or
// WRITE longer than Config.MaxRequestSize → EINVAL (a WRITE payload of at most four times that
// is read and discarded; a larger one ends the connection); a range past the end → ENOSPC for
// WRITE and WRITE_ZEROES, EINVAL otherwise; offset or length not a multiple of the Device's
// block size → EINVAL (TRIM, a hint, is rounded inwards instead). A bad request magic, bad
// client flags or an unknown export in NBD_OPT_EXPORT_NAME end the connection (the protocol's
// hard disconnect); nothing a client sends makes the server panic.
//
// Not implemented: TLS, oldstyle negotiation, meta contexts other than base:allocation,
// extended headers, NBD_CMD_FLAG_FAST_ZERO, NBD_CMD_RESIZE.
//
// # Inside a connection
//
// Config.Workers goroutines take turns reading requests (through a 64 KiB buffered reader):
// the one whose turn it is reads a request, passes the turn on and calls the Device itself, so
// that no request is handed from one goroutine to another on its way in. Requests are
// pipelined up to Config.Workers (at most Config.MaxInFlight) per connection and answered out
// of order. Replies are written by
// whichever worker finds no write in progress: it sends every reply queued meanwhile with one
// writev, so the other workers never wait for the socket. Request structures are allocated per
// connection and data buffers come from a server-wide pool of power-of-two size classes that
// never holds more than Config.MaxInFlightBytes (a connection holds at most
// Config.ConnMaxInFlightBytes), so the steady state allocates nothing. Read replies are built in
// place, with the reply header in headroom before the data.
//
// # Clients that misbehave
//
// A client can only stall itself. A connection holds at most its fair share of the buffer
// budget (the unreserved three quarters divided among the connections holding buffers), and a
// quarter is kept for connections holding little (up to reserve/MaxConnections, 1 MiB at the
// defaults): however much clients that stop reading replies hold, a new or lightly loaded
// client gets its buffers at once. Such a client is closed when a batch of its replies has
// waited Config.WriteTimeout for the socket, and its buffers return to the pool
// (Counters.StalledClosed). Config.MaxConnections bounds the connections in transmission (one
// more is refused at NBD_OPT_GO with NBD_REP_ERR_POLICY) and, separately, those still in their
// handshake (one more is closed when accepted); both count in Stats.Refused.
package nbd
