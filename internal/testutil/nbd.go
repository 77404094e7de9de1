package testutil

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// NBD newstyle constants (NetworkBlockDevice/nbd:doc/proto.md).
const (
	NBDOptMagic     = 0x49484156454F5054 // "IHAVEOPT"
	nbdOptExport    = 1                  // NBD_OPT_EXPORT_NAME
	NBDFlagFixed    = 1                  // NBD_FLAG_C_FIXED_NEWSTYLE
	nbdFlagNoZeroes = 2                  // NBD_FLAG_NO_ZEROES (server and client flag)
)

// DialNBD connects to the NBD server on the unix socket, negotiates export with
// NBD_OPT_EXPORT_NAME (fixed newstyle, no zeroes when offered) and returns the connection in
// transmission phase and the export's size. timeout bounds the handshake; the connection has
// no deadline afterwards.
func DialNBD(socket, export string, timeout time.Duration) (net.Conn, int64, error) {
	c, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		return nil, 0, err
	}
	size, err := nbdExportName(c, export, timeout)
	if err != nil {
		c.Close()
		return nil, 0, err
	}
	return c, size, nil
}

func nbdExportName(c net.Conn, export string, timeout time.Duration) (int64, error) {
	_ = c.SetDeadline(time.Now().Add(timeout))
	var hello [18]byte
	if _, err := io.ReadFull(c, hello[:]); err != nil {
		return 0, fmt.Errorf("nbd hello: %w", err)
	}
	if string(hello[:8]) != "NBDMAGIC" || binary.BigEndian.Uint64(hello[8:16]) != NBDOptMagic {
		return 0, fmt.Errorf("nbd hello: not a newstyle server: %x", hello)
	}
	cflags := uint32(NBDFlagFixed)
	if binary.BigEndian.Uint16(hello[16:])&nbdFlagNoZeroes != 0 {
		cflags |= nbdFlagNoZeroes
	}
	opt := binary.BigEndian.AppendUint32(nil, cflags)
	opt = binary.BigEndian.AppendUint64(opt, NBDOptMagic)
	opt = binary.BigEndian.AppendUint32(opt, nbdOptExport)
	opt = binary.BigEndian.AppendUint32(opt, uint32(len(export)))
	opt = append(opt, export...)
	if _, err := c.Write(opt); err != nil {
		return 0, err
	}
	n := 10 // size, transmission flags
	if cflags&nbdFlagNoZeroes == 0 {
		n += 124
	}
	rep := make([]byte, n)
	if _, err := io.ReadFull(c, rep); err != nil {
		return 0, fmt.Errorf("nbd export %q: %w", export, err)
	}
	_ = c.SetDeadline(time.Time{})
	return int64(binary.BigEndian.Uint64(rep)), nil
}

// NBD transmission constants (NetworkBlockDevice/nbd:doc/proto.md).
const (
	NBDRequestMagic = 0x25609513
	NBDReplyMagic   = 0x67446698 // simple reply
	NBDCmdRead      = 0
	NBDCmdWrite     = 1
	NBDCmdDisc      = 2
	NBDCmdFlush     = 3
)

// ErrNBDReplyMagic: a reply does not start with the simple reply's magic.
var ErrNBDReplyMagic = errors.New("nbd: bad reply magic")

// NBDError is an error reply: a simple reply with a non-zero error (an errno value).
type NBDError struct{ Code uint32 }

func (e *NBDError) Error() string { return fmt.Sprintf("nbd: error reply %d", e.Code) }

// NBDClient is a minimal NBD client in transmission phase: one request at a time, simple
// replies. Conn is there for tests that write raw bytes.
type NBDClient struct {
	Conn net.Conn
	Size int64 // the export's
	// OpTimeout, when not zero, bounds each request and its reply (a deadline set by Send).
	OpTimeout time.Duration
	handle    uint64
}

// DialNBDClient is DialNBD returning a client; timeout bounds the handshake.
func DialNBDClient(socket, export string, timeout time.Duration) (*NBDClient, error) {
	c, size, err := DialNBD(socket, export, timeout)
	if err != nil {
		return nil, err
	}
	return &NBDClient{Conn: c, Size: size}, nil
}

// NBDRequest is the 28-byte header of a request.
func NBDRequest(typ uint16, handle, off uint64, length uint32) []byte {
	req := binary.BigEndian.AppendUint32(make([]byte, 0, 28), NBDRequestMagic)
	req = binary.BigEndian.AppendUint16(req, 0)
	req = binary.BigEndian.AppendUint16(req, typ)
	req = binary.BigEndian.AppendUint64(req, handle)
	req = binary.BigEndian.AppendUint64(req, off)
	return binary.BigEndian.AppendUint32(req, length)
}

// Send sends a request with the next handle, followed by data (a write's payload).
func (n *NBDClient) Send(typ uint16, off uint64, length uint32, data []byte) error {
	n.handle++
	if n.OpTimeout > 0 {
		_ = n.Conn.SetDeadline(time.Now().Add(n.OpTimeout))
	}
	_, err := n.Conn.Write(append(NBDRequest(typ, n.handle, off, length), data...))
	return err
}

// Reply reads the simple reply to the last request, and its data into data on success. An
// error reply is an *NBDError.
func (n *NBDClient) Reply(data []byte) error {
	var r [16]byte
	if _, err := io.ReadFull(n.Conn, r[:]); err != nil {
		return err
	}
	if binary.BigEndian.Uint32(r[:]) != NBDReplyMagic {
		return fmt.Errorf("%w: %x", ErrNBDReplyMagic, r[:4])
	}
	if h := binary.BigEndian.Uint64(r[8:]); h != n.handle {
		return fmt.Errorf("nbd: reply for handle %d, want %d", h, n.handle)
	}
	if e := binary.BigEndian.Uint32(r[4:]); e != 0 {
		return &NBDError{e}
	}
	if data != nil {
		_, err := io.ReadFull(n.Conn, data)
		return err
	}
	return nil
}

// WriteAt writes p at off and waits for the reply.
func (n *NBDClient) WriteAt(p []byte, off int64) error {
	if err := n.Send(NBDCmdWrite, uint64(off), uint32(len(p)), p); err != nil {
		return err
	}
	return n.Reply(nil)
}

// ReadAt reads len(p) bytes at off into p.
func (n *NBDClient) ReadAt(p []byte, off int64) error {
	if err := n.Send(NBDCmdRead, uint64(off), uint32(len(p)), nil); err != nil {
		return err
	}
	return n.Reply(p)
}

// Flush sends NBD_CMD_FLUSH and waits for the reply.
func (n *NBDClient) Flush() error {
	if err := n.Send(NBDCmdFlush, 0, 0, nil); err != nil {
		return err
	}
	return n.Reply(nil)
}

// Close sends NBD_CMD_DISC (no reply) and closes the connection.
func (n *NBDClient) Close() error {
	_ = n.Send(NBDCmdDisc, 0, 0, nil)
	return n.Conn.Close()
}
