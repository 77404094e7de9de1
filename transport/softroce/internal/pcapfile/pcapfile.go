// Package pcapfile reads and writes classic libpcap files (not pcapng): the global header
// (magic 0xa1b2c3d4 microseconds or 0xa1b23c4d nanoseconds, either byte order) and per-record
// headers. It is enough for the softroce tests and the link pcap tap; no external dependency.
package pcapfile

import (
	"encoding/binary"
	"errors"
	"io"
	"time"
)

// Link types (https://www.tcpdump.org/linktypes.html).
const (
	LinkTypeEthernet = 1
	LinkTypeRaw      = 101 // raw IPv4/IPv6, no link header
	LinkTypeLinuxSLL = 113
)

const (
	magicMicro = 0xa1b2c3d4
	magicNano  = 0xa1b23c4d
)

// ErrFormat is returned for a file that is not a classic pcap file or is corrupt.
var ErrFormat = errors.New("pcapfile: bad format")

// Reader reads records from a classic pcap stream.
type Reader struct {
	r        io.Reader
	order    binary.ByteOrder
	nano     bool
	LinkType uint32
	SnapLen  uint32
	hdr      [16]byte
}

// NewReader reads the global header.
func NewReader(r io.Reader) (*Reader, error) {
	var h [24]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, ErrFormat
	}
	rd := &Reader{r: r}
	switch {
	case binary.LittleEndian.Uint32(h[:]) == magicMicro:
		rd.order = binary.LittleEndian
	case binary.LittleEndian.Uint32(h[:]) == magicNano:
		rd.order, rd.nano = binary.LittleEndian, true
	case binary.BigEndian.Uint32(h[:]) == magicMicro:
		rd.order = binary.BigEndian
	case binary.BigEndian.Uint32(h[:]) == magicNano:
		rd.order, rd.nano = binary.BigEndian, true
	default:
		return nil, ErrFormat
	}
	rd.SnapLen = rd.order.Uint32(h[16:])
	rd.LinkType = rd.order.Uint32(h[20:]) & 0x0FFFFFFF
	return rd, nil
}

// Next reads the next record into buf (grown if needed) and returns its captured bytes, its
// original length and timestamp. It returns io.EOF at the end of the stream.
func (r *Reader) Next(buf []byte) (data []byte, origLen int, ts time.Time, err error) {
	if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		if err == io.EOF {
			return nil, 0, time.Time{}, io.EOF
		}
		return nil, 0, time.Time{}, ErrFormat
	}
	sec, frac := r.order.Uint32(r.hdr[0:]), r.order.Uint32(r.hdr[4:])
	capLen, orig := r.order.Uint32(r.hdr[8:]), r.order.Uint32(r.hdr[12:])
	if capLen > 1<<24 {
		return nil, 0, time.Time{}, ErrFormat
	}
	if cap(buf) < int(capLen) {
		buf = make([]byte, capLen)
	}
	buf = buf[:capLen]
	if _, err := io.ReadFull(r.r, buf); err != nil {
		return nil, 0, time.Time{}, ErrFormat
	}
	ns := int64(frac) * 1000
	if r.nano {
		ns = int64(frac)
	}
	return buf, int(orig), time.Unix(int64(sec), ns), nil
}

// Writer writes a classic little-endian, microsecond pcap stream.
type Writer struct {
	w   io.Writer
	hdr [16]byte
}

// NewWriter writes the global header for linkType with the given snap length (0 means 262144).
func NewWriter(w io.Writer, linkType uint32, snapLen uint32) (*Writer, error) {
	if snapLen == 0 {
		snapLen = 262144
	}
	var h [24]byte
	binary.LittleEndian.PutUint32(h[0:], magicMicro)
	binary.LittleEndian.PutUint16(h[4:], 2)
	binary.LittleEndian.PutUint16(h[6:], 4)
	binary.LittleEndian.PutUint32(h[16:], snapLen)
	binary.LittleEndian.PutUint32(h[20:], linkType)
	if _, err := w.Write(h[:]); err != nil {
		return nil, err
	}
	return &Writer{w: w}, nil
}

// WriteRecord writes one record made of the concatenation of parts (so that headers and payload
// need not be copied together). It does not allocate.
func (w *Writer) WriteRecord(ts time.Time, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	binary.LittleEndian.PutUint32(w.hdr[0:], uint32(ts.Unix()))
	binary.LittleEndian.PutUint32(w.hdr[4:], uint32(ts.Nanosecond()/1000))
	binary.LittleEndian.PutUint32(w.hdr[8:], uint32(n))
	binary.LittleEndian.PutUint32(w.hdr[12:], uint32(n))
	if _, err := w.w.Write(w.hdr[:]); err != nil {
		return err
	}
	for _, p := range parts {
		if _, err := w.w.Write(p); err != nil {
			return err
		}
	}
	return nil
}
