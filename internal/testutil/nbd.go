package testutil

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// NBD newstyle constants (NetworkBlockDevice/nbd:doc/proto.md).
const (
	nbdOptMagic     = 0x49484156454F5054 // "IHAVEOPT"
	nbdOptExport    = 1                  // NBD_OPT_EXPORT_NAME
	nbdFlagFixed    = 1                  // NBD_FLAG_C_FIXED_NEWSTYLE
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
	if string(hello[:8]) != "NBDMAGIC" || binary.BigEndian.Uint64(hello[8:16]) != nbdOptMagic {
		return 0, fmt.Errorf("nbd hello: not a newstyle server: %x", hello)
	}
	cflags := uint32(nbdFlagFixed)
	if binary.BigEndian.Uint16(hello[16:])&nbdFlagNoZeroes != 0 {
		cflags |= nbdFlagNoZeroes
	}
	opt := binary.BigEndian.AppendUint32(nil, cflags)
	opt = binary.BigEndian.AppendUint64(opt, nbdOptMagic)
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
