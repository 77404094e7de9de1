package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"go.uber.org/zap"
)

// Limits on option data (the handshake is bounded by Config.HandshakeTimeout as well).
const (
	// maxOptionLen is the largest option payload parsed; NBD_OPT_INFO/GO carry at most a 4096
	// byte name and a list of 16-bit info requests.
	maxOptionLen = 64 << 10
	// maxOptionSkip is the largest option payload skipped (and answered NBD_REP_ERR_TOO_BIG);
	// beyond it the connection is dropped as a denial of service (proto.md "Termination of the
	// session during option haggling").
	maxOptionSkip = 1 << 20
)

// errAbort ends the handshake after NBD_OPT_ABORT: a soft disconnect by the client.
var errAbort = errors.New("nbd: client aborted the handshake")

// handshake runs the fixed newstyle negotiation (proto.md "Fixed newstyle negotiation") and
// returns the export the client chose with NBD_OPT_GO or NBD_OPT_EXPORT_NAME, with c attached
// to it and its transmission parameters set.
func (c *conn) handshake() (*export, error) {
	c.setReadDeadline(time.Now().Add(c.srv.cfg.HandshakeTimeout))
	c.nc.SetWriteDeadline(time.Now().Add(c.srv.cfg.HandshakeTimeout))
	defer c.nc.SetWriteDeadline(time.Time{})

	var hello [18]byte
	binary.BigEndian.PutUint64(hello[0:], nbdMagic)
	binary.BigEndian.PutUint64(hello[8:], optMagic)
	binary.BigEndian.PutUint16(hello[16:], flagFixedNewstyle|flagNoZeroes)
	if _, err := c.nc.Write(hello[:]); err != nil {
		return nil, err
	}
	var cf [4]byte
	if _, err := io.ReadFull(c.br, cf[:]); err != nil {
		return nil, err
	}
	flags := binary.BigEndian.Uint32(cf[:])
	if flags&^clientFlagsKnown != 0 {
		// proto.md "Client flags": the server MUST drop the connection on an unknown flag.
		return nil, protoErr("unknown client flags %#x", flags)
	}
	c.noZeroes = flags&clientFlagNoZeroes != 0
	// A client without NBD_FLAG_C_FIXED_NEWSTYLE gets fixed newstyle anyway (proto.md: servers
	// MAY honour it); such a client only ever sends NBD_OPT_EXPORT_NAME.

	var hdr [optHeaderLen]byte
	for {
		if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
			return nil, err
		}
		if binary.BigEndian.Uint64(hdr[0:]) != optMagic {
			return nil, protoErr("bad option magic %#x", binary.BigEndian.Uint64(hdr[0:]))
		}
		opt := binary.BigEndian.Uint32(hdr[8:])
		n := binary.BigEndian.Uint32(hdr[12:])
		if n > maxOptionLen {
			if opt == optExportName || n > maxOptionSkip {
				return nil, protoErr("option %d with %d bytes of data", opt, n)
			}
			if _, err := c.br.Discard(int(n)); err != nil {
				return nil, err
			}
			if err := c.optReply(opt, repErrTooBig, []byte("option data too large")); err != nil {
				return nil, err
			}
			continue
		}
		if cap(c.optBuf) < int(n) {
			c.optBuf = make([]byte, n)
		}
		data := c.optBuf[:n]
		if _, err := io.ReadFull(c.br, data); err != nil {
			return nil, err
		}
		e, err := c.option(opt, data)
		if e != nil || err != nil {
			return e, err
		}
	}
}

// option handles one option; it returns the export when transmission starts.
func (c *conn) option(opt uint32, data []byte) (*export, error) {
	switch opt {
	case optExportName:
		e := c.srv.lookup(string(data))
		if e == nil {
			// proto.md "NBD_OPT_EXPORT_NAME": the server MUST terminate the session.
			return nil, protoErr("NBD_OPT_EXPORT_NAME for unknown export %q", data)
		}
		if err := c.start(e); err != nil {
			// No error reply exists for NBD_OPT_EXPORT_NAME: closing is all there is.
			if errors.Is(err, ErrTooManyConnections) {
				c.srv.logRefusal("NBD_OPT_EXPORT_NAME", c.nc.RemoteAddr())
				return nil, err
			}
			return nil, protoErr("NBD_OPT_EXPORT_NAME for unknown export %q", data)
		}
		var b [10 + zeroPadLen]byte
		binary.BigEndian.PutUint64(b[0:], uint64(c.size))
		binary.BigEndian.PutUint16(b[8:], c.tflags)
		reply := b[:]
		if c.noZeroes {
			reply = b[:10]
		}
		if _, err := c.nc.Write(reply); err != nil {
			return nil, err
		}
		return e, nil

	case optAbort:
		// proto.md "NBD_OPT_ABORT": reply NBD_REP_ACK (data, if any, is ignored); the client
		// then closes, possibly without reading the reply.
		c.optReply(opt, repAck, nil)
		return nil, errAbort

	case optList:
		if len(data) != 0 {
			return nil, c.optReply(opt, repErrInvalid, []byte("NBD_OPT_LIST takes no data"))
		}
		for _, e := range c.srv.exportList() {
			b := make([]byte, 4, 4+len(e.name)+len(e.desc))
			binary.BigEndian.PutUint32(b, uint32(len(e.name)))
			b = append(b, e.name...)
			b = append(b, e.desc...)
			if err := c.optReply(opt, repServer, b); err != nil {
				return nil, err
			}
		}
		return nil, c.optReply(opt, repAck, nil)

	case optStartTLS:
		// NOTLS mode (proto.md "NOTLS mode"): policy forbids TLS.
		return nil, c.optReply(opt, repErrPolicy, []byte("TLS is not supported by this server"))

	case optInfo, optGo:
		return c.infoGo(opt, data)

	case optStructuredReply:
		switch {
		case len(data) != 0:
			return nil, c.optReply(opt, repErrInvalid, []byte("NBD_OPT_STRUCTURED_REPLY takes no data"))
		case c.structured:
			return nil, c.optReply(opt, repErrInvalid, []byte("structured replies already negotiated"))
		}
		c.structured = true
		return nil, c.optReply(opt, repAck, nil)

	case optListMetaContext, optSetMetaContext:
		return nil, c.metaContext(opt, data)
	}
	return nil, c.optReply(opt, repErrUnsup, []byte("option not supported"))
}

// metaContext handles NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT (proto.md
// "NBD_OPT_LIST_META_CONTEXT (9)", "NBD_OPT_SET_META_CONTEXT (10)"). The only context is
// base:allocation. LIST matches it with no query, "base:" or its name; SET selects it only by
// its name, for the export named, and replaces whatever an earlier SET selected.
func (c *conn) metaContext(opt uint32, data []byte) error {
	set := opt == optSetMetaContext
	if set {
		// Even a SET that fails replaces the selection (the client cannot rely on the old one).
		c.metaExp = nil
		if !c.structured {
			return c.optReply(opt, repErrInvalid, []byte("NBD_OPT_SET_META_CONTEXT needs structured replies first"))
		}
	}
	name, queries, msg := parseMetaQueries(data)
	if msg != "" {
		return c.optReply(opt, repErrInvalid, []byte(msg))
	}
	e := c.srv.lookup(string(name))
	if e == nil {
		return c.optReply(opt, repErrUnknown, []byte("no such export"))
	}
	match := false
	if !set && len(queries) == 0 {
		match = true // an empty LIST asks for every context
	}
	for _, q := range queries {
		switch string(q) {
		case metaBaseAllocation:
			match = true
		case metaBaseNamespace:
			match = match || !set
		}
	}
	if match {
		id := uint32(0) // reserved in LIST replies
		if set {
			id = metaAllocationID
			c.metaExp = e
		}
		b := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(metaBaseAllocation)), id)
		if err := c.optReply(opt, repMetaContext, append(b, metaBaseAllocation...)); err != nil {
			return err
		}
	}
	return c.optReply(opt, repAck, nil)
}

// parseMetaQueries splits the data of a meta context option: export name length(4), name,
// number of queries(4), then each query's length(4) and string. msg says what is wrong.
func parseMetaQueries(data []byte) (name []byte, queries [][]byte, msg string) {
	str := func() ([]byte, bool) {
		if len(data) < 4 {
			return nil, false
		}
		n := binary.BigEndian.Uint32(data)
		if n > maxStringLen || uint64(n) > uint64(len(data)-4) {
			return nil, false
		}
		s := data[4 : 4+n]
		data = data[4+n:]
		return s, true
	}
	name, ok := str()
	if !ok {
		return nil, nil, "bad export name"
	}
	if len(data) < 4 {
		return nil, nil, "option data too short"
	}
	nq := binary.BigEndian.Uint32(data)
	data = data[4:]
	// Each query takes at least 4 bytes: a count beyond that is a lie (and no allocation).
	if uint64(nq) > uint64(len(data)/4) {
		return nil, nil, "number of queries exceeds the option data"
	}
	queries = make([][]byte, 0, nq)
	for i := uint32(0); i < nq; i++ {
		q, ok := str()
		if !ok {
			return nil, nil, "bad query string"
		}
		queries = append(queries, q)
	}
	if len(data) != 0 {
		return nil, nil, "trailing bytes after the queries"
	}
	return name, queries, ""
}

// infoGo handles NBD_OPT_INFO and NBD_OPT_GO (proto.md "NBD_OPT_INFO (6) and NBD_OPT_GO (7)").
func (c *conn) infoGo(opt uint32, data []byte) (*export, error) {
	// Data: name length (4), name, number of info requests (2), info requests (2 each).
	if len(data) < 6 {
		return nil, c.optReply(opt, repErrInvalid, []byte("option data too short"))
	}
	nameLen := binary.BigEndian.Uint32(data)
	if uint64(nameLen) > uint64(len(data)-6) {
		return nil, c.optReply(opt, repErrInvalid, []byte("name length exceeds the option data"))
	}
	name := data[4 : 4+nameLen]
	rest := data[4+nameLen:]
	nreq := int(binary.BigEndian.Uint16(rest))
	if len(rest) != 2+2*nreq {
		return nil, c.optReply(opt, repErrInvalid, []byte("information request list does not match the option length"))
	}
	var wantName, wantDesc bool
	for i := 0; i < nreq; i++ {
		switch binary.BigEndian.Uint16(rest[2+2*i:]) {
		case infoName:
			wantName = true
		case infoDescription:
			wantDesc = true
		}
	}
	e := c.srv.lookup(string(name))
	if e == nil {
		return nil, c.optReply(opt, repErrUnknown, []byte("no such export"))
	}
	size, tflags := c.exportParams(e)
	if opt == optGo {
		if err := c.start(e); err != nil {
			if errors.Is(err, ErrTooManyConnections) {
				// NBD_REP_ERR_POLICY: "server-side policy forbids the server to allow the
				// option" (proto.md "Option reply types"); clients show the message (qemu:
				// "Denied by server for option 7 (go)" and "server reported: ...").
				c.srv.logRefusal("NBD_OPT_GO", c.nc.RemoteAddr())
				msg := fmt.Sprintf("too many connections: this server allows %d (max_connections); try again later", c.srv.cfg.MaxConnections)
				return nil, c.optReply(opt, repErrPolicy, []byte(msg))
			}
			return nil, c.optReply(opt, repErrUnknown, []byte("export was removed"))
		}
		size, tflags = c.size, c.tflags
	}

	var info [14]byte
	binary.BigEndian.PutUint16(info[0:], infoExport)
	binary.BigEndian.PutUint64(info[2:], uint64(size))
	binary.BigEndian.PutUint16(info[10:], tflags)
	if err := c.optReply(opt, repInfo, info[:12]); err != nil {
		return nil, err
	}
	// The block size constraints are sent whether asked for or not (proto.md allows unrequested
	// information): the server enforces the device's block size, which is not the default.
	bs := uint32(e.dev.BlockSize())
	binary.BigEndian.PutUint16(info[0:], infoBlockSize)
	binary.BigEndian.PutUint32(info[2:], bs)                                // minimum
	binary.BigEndian.PutUint32(info[6:], bs)                                // preferred
	binary.BigEndian.PutUint32(info[10:], uint32(c.srv.cfg.MaxRequestSize)) // maximum
	if err := c.optReply(opt, repInfo, info[:14]); err != nil {
		return nil, err
	}
	if wantName {
		if err := c.optReply(opt, repInfo, append([]byte{0, byte(infoName)}, e.name...)); err != nil {
			return nil, err
		}
	}
	if wantDesc && e.desc != "" {
		if err := c.optReply(opt, repInfo, append([]byte{0, byte(infoDescription)}, e.desc...)); err != nil {
			return nil, err
		}
	}
	if err := c.optReply(opt, repAck, nil); err != nil {
		return nil, err
	}
	if opt == optGo {
		return e, nil
	}
	return nil, nil
}

// exportParams returns the size and transmission flags this connection would get for e.
func (c *conn) exportParams(e *export) (int64, uint16) {
	f := tflagHasFlags | tflagSendFlush | tflagSendFUA | tflagCanMultiConn | tflagSendCache
	if e.dev.ReadOnly() {
		f |= tflagReadOnly
	} else {
		f |= tflagSendWriteZeroes
		if e.dev.CanDiscard() {
			f |= tflagSendTrim
		}
	}
	if c.structured {
		// Every read is answered with a single data chunk, so NBD_CMD_FLAG_DF is free.
		f |= tflagSendDF
	}
	return e.dev.Size(), f
}

// errRemoved: the export was removed while the handshake chose it.
var errRemoved = errors.New("nbd: export was removed")

// start takes a transmission slot (ErrTooManyConnections when there is none), attaches c to e
// (errRemoved when e is gone) and fixes the transmission parameters.
func (c *conn) start(e *export) error {
	if !c.srv.admit() {
		return fmt.Errorf("%w: %d in transmission (max_connections)", ErrTooManyConnections, c.srv.cfg.MaxConnections)
	}
	// Set before attach: Stats reads them once c is in e.conns.
	c.exp = e
	c.dev = e.dev
	c.size, c.tflags = c.exportParams(e)
	c.bs = int64(e.dev.BlockSize())
	c.readOnly = c.tflags&tflagReadOnly != 0
	c.canTrim = c.tflags&tflagSendTrim != 0
	// base:allocation counts only for the export it was set for (proto.md: contexts are
	// per export; a GO to another export leaves none selected).
	c.blockStatus = c.metaExp == e
	c.bsDev, _ = e.dev.(BlockStatuser)
	c.since = time.Now()
	if !e.attach(c) {
		c.exp, c.dev = nil, nil
		c.srv.leave()
		return errRemoved
	}
	c.log = c.log.With(zap.String("export", e.name))
	return nil
}

// optReply sends one option reply (proto.md "Fixed newstyle negotiation").
func (c *conn) optReply(opt, typ uint32, data []byte) error {
	var hdr [optReplyHdrLen]byte
	binary.BigEndian.PutUint64(hdr[0:], optReplyMagic)
	binary.BigEndian.PutUint32(hdr[8:], opt)
	binary.BigEndian.PutUint32(hdr[12:], typ)
	binary.BigEndian.PutUint32(hdr[16:], uint32(len(data)))
	msg := append(hdr[:], data...)
	_, err := c.nc.Write(msg)
	return err
}
