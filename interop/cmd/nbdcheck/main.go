// Command nbdcheck is the harness' NBD client (interop/srp-verbs): it connects to an NBD
// server on a unix socket (srpd's export of a remote LUN), negotiates the default export with
// NBD_OPT_GO (fixed newstyle), and either
//
//   - writes random data to five regions (4 KiB at 0, 64 KiB at 8 KiB, 64 KiB at 1 MiB + 4 KiB,
//     1 MiB at 4 MiB + 12 KiB, the last 4 KiB; with -unaligned also 512 bytes at 2 MiB + 512,
//     which is not 4 KiB aligned), flushes, reads back and compares, -passes times, printing
//     "CHECK <sha256> <offset> <length>" for the last pass on stdout; or
//   - with -verify FILE (- for stdin), reads the regions CHECK lines name and compares their
//     SHA-256 (the data another initiator wrote, read through this one).
//
// With -size it first checks the export's size. It prints "nbdcheck: OK ..." on stderr and
// exits 0, or exits 1 with the reason. Every network operation is bounded by -timeout.
//
// scripts/interop-srpd.sh runs it against srpd's NBD export of the kernel target's LUN (make
// interop), interop/srp-verbs inside its guests and on the host.
package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

const (
	nbdMagic        = 0x4e42444d41474943 // "NBDMAGIC"
	optMagic        = 0x49484156454f5054 // "IHAVEOPT"
	repMagic        = 0x0003e889045565a9
	reqMagic        = 0x25609513
	simpleReplyMagc = 0x67446698

	flagFixedNewstyle = 1 << 0
	flagNoZeroes      = 1 << 1

	optGo      = 7
	repAck     = 1
	repInfo    = 3
	infoExp    = 0
	cmdRead    = 0
	cmdWrite   = 1
	cmdDisc    = 2
	cmdFlush   = 3
	tflagFlush = 1 << 2
)

type client struct {
	c       net.Conn
	r       *bufio.Reader
	size    uint64
	tflags  uint16
	handle  uint64
	timeout time.Duration
}

func (cl *client) deadline() { _ = cl.c.SetDeadline(time.Now().Add(cl.timeout)) }

func dial(socket string, wait, timeout time.Duration) (*client, error) {
	end := time.Now().Add(wait)
	var c net.Conn
	var err error
	for {
		c, err = net.DialTimeout("unix", socket, timeout)
		if err == nil || time.Now().After(end) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return nil, err
	}
	cl := &client{c: c, r: bufio.NewReader(c), timeout: timeout}
	if err := cl.handshake(); err != nil {
		c.Close()
		return nil, fmt.Errorf("handshake: %w", err)
	}
	return cl, nil
}

func (cl *client) handshake() error {
	cl.deadline()
	var hdr struct {
		Magic, Opt uint64
		Flags      uint16
	}
	if err := binary.Read(cl.r, binary.BigEndian, &hdr); err != nil {
		return err
	}
	if hdr.Magic != nbdMagic || hdr.Opt != optMagic {
		return fmt.Errorf("not a newstyle NBD server (magic %#x %#x)", hdr.Magic, hdr.Opt)
	}
	if hdr.Flags&flagFixedNewstyle == 0 {
		return errors.New("server is not fixed newstyle")
	}
	cf := uint32(flagFixedNewstyle)
	if hdr.Flags&flagNoZeroes != 0 {
		cf |= flagNoZeroes
	}
	var b bytes.Buffer
	_ = binary.Write(&b, binary.BigEndian, cf)
	// NBD_OPT_GO for the default export ("") with no information requests.
	_ = binary.Write(&b, binary.BigEndian, uint64(optMagic))
	_ = binary.Write(&b, binary.BigEndian, uint32(optGo))
	_ = binary.Write(&b, binary.BigEndian, uint32(4+2))
	_ = binary.Write(&b, binary.BigEndian, uint32(0))
	_ = binary.Write(&b, binary.BigEndian, uint16(0))
	if _, err := cl.c.Write(b.Bytes()); err != nil {
		return err
	}
	for {
		var rep struct {
			Magic     uint64
			Opt, Type uint32
			Len       uint32
		}
		if err := binary.Read(cl.r, binary.BigEndian, &rep); err != nil {
			return err
		}
		if rep.Magic != repMagic || rep.Opt != optGo {
			return fmt.Errorf("bad option reply (magic %#x, option %d)", rep.Magic, rep.Opt)
		}
		if rep.Len > 1<<20 {
			return fmt.Errorf("option reply of %d bytes", rep.Len)
		}
		data := make([]byte, rep.Len)
		if _, err := io.ReadFull(cl.r, data); err != nil {
			return err
		}
		switch {
		case rep.Type == repAck:
			if cl.size == 0 {
				return errors.New("NBD_REP_ACK without NBD_INFO_EXPORT")
			}
			return nil
		case rep.Type == repInfo:
			if len(data) >= 12 && binary.BigEndian.Uint16(data) == infoExp {
				cl.size = binary.BigEndian.Uint64(data[2:])
				cl.tflags = binary.BigEndian.Uint16(data[10:])
			}
		case rep.Type&(1<<31) != 0:
			return fmt.Errorf("NBD_OPT_GO refused: error reply %#x: %s", rep.Type, data)
		}
	}
}

// cmd sends one request and waits for its simple reply (read data into rd).
func (cl *client) cmd(typ uint16, off uint64, wr, rd []byte, n uint32) error {
	cl.deadline()
	cl.handle++
	var b bytes.Buffer
	_ = binary.Write(&b, binary.BigEndian, uint32(reqMagic))
	_ = binary.Write(&b, binary.BigEndian, uint16(0))
	_ = binary.Write(&b, binary.BigEndian, typ)
	_ = binary.Write(&b, binary.BigEndian, cl.handle)
	_ = binary.Write(&b, binary.BigEndian, off)
	_ = binary.Write(&b, binary.BigEndian, n)
	b.Write(wr)
	if _, err := cl.c.Write(b.Bytes()); err != nil {
		return err
	}
	if typ == cmdDisc {
		return nil
	}
	var rep struct {
		Magic, Err uint32
		Handle     uint64
	}
	if err := binary.Read(cl.r, binary.BigEndian, &rep); err != nil {
		return err
	}
	if rep.Magic != simpleReplyMagc || rep.Handle != cl.handle {
		return fmt.Errorf("bad reply (magic %#x, handle %d want %d)", rep.Magic, rep.Handle, cl.handle)
	}
	if rep.Err != 0 {
		return fmt.Errorf("NBD error %d", rep.Err)
	}
	if rd != nil {
		if _, err := io.ReadFull(cl.r, rd); err != nil {
			return err
		}
	}
	return nil
}

func (cl *client) read(off uint64, n int) ([]byte, error) {
	buf := make([]byte, n)
	return buf, cl.cmd(cmdRead, off, nil, buf, uint32(n))
}

type region struct{ off, len uint64 }

// regions are the ranges written and checked on an export of size bytes; unaligned adds one
// 512-byte range that is not 4 KiB aligned (a LUN of 512-byte blocks).
func regions(size uint64, unaligned bool) []region {
	rs := []region{{0, 4096}, {8192, 65536}, {1052672, 65536}, {4206592, 1 << 20}, {size - 4096, 4096}}
	if unaligned {
		rs = append(rs, region{2<<20 + 512, 512})
	}
	return rs
}

func sum(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

func writePasses(cl *client, passes int, unaligned bool) ([]string, error) {
	var checks []string
	for p := 1; p <= passes; p++ {
		var want []string
		for _, r := range regions(cl.size, unaligned) {
			buf := make([]byte, r.len)
			_, _ = rand.Read(buf)
			if err := cl.cmd(cmdWrite, r.off, buf, nil, uint32(r.len)); err != nil {
				return nil, fmt.Errorf("pass %d: write %d bytes at %d: %w", p, r.len, r.off, err)
			}
			want = append(want, sum(buf))
		}
		if cl.tflags&tflagFlush != 0 {
			if err := cl.cmd(cmdFlush, 0, nil, nil, 0); err != nil {
				return nil, fmt.Errorf("pass %d: flush: %w", p, err)
			}
		}
		checks = checks[:0]
		for i, r := range regions(cl.size, unaligned) {
			got, err := cl.read(r.off, int(r.len))
			if err != nil {
				return nil, fmt.Errorf("pass %d: read %d bytes at %d: %w", p, r.len, r.off, err)
			}
			if g := sum(got); g != want[i] {
				return nil, fmt.Errorf("pass %d: %d bytes at %d: MISMATCH want %s got %s", p, r.len, r.off, want[i], g)
			}
			fmt.Fprintf(os.Stderr, "nbdcheck: pass %d: %d bytes at %d: match (%s)\n", p, r.len, r.off, want[i])
			checks = append(checks, fmt.Sprintf("CHECK %s %d %d", want[i], r.off, r.len))
		}
	}
	return checks, nil
}

func verify(cl *client, in io.Reader) (int, error) {
	sc := bufio.NewScanner(in)
	n := 0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		i := 0
		for i < len(f) && f[i] != "CHECK" { // lines may carry a console prefix
			i++
		}
		if len(f)-i != 4 {
			continue
		}
		off, err1 := strconv.ParseUint(f[i+2], 10, 64)
		ln, err2 := strconv.ParseUint(f[i+3], 10, 64)
		if err1 != nil || err2 != nil || ln == 0 || ln > 64<<20 {
			return n, fmt.Errorf("bad CHECK line %q", sc.Text())
		}
		got, err := cl.read(off, int(ln))
		if err != nil {
			return n, fmt.Errorf("read %d bytes at %d: %w", ln, off, err)
		}
		if g := sum(got); g != f[i+1] {
			return n, fmt.Errorf("%d bytes at %d: MISMATCH want %s got %s", ln, off, f[i+1], g)
		}
		fmt.Fprintf(os.Stderr, "nbdcheck: verify: %d bytes at %d: match (%s)\n", ln, off, f[i+1])
		n++
	}
	if err := sc.Err(); err != nil {
		return n, err
	}
	if n == 0 {
		return 0, errors.New("no CHECK lines to verify")
	}
	return n, nil
}

func main() {
	socket := flag.String("socket", "", "NBD server's unix socket")
	passes := flag.Int("passes", 2, "write/flush/read-back passes")
	verifyFrom := flag.String("verify", "", "verify the CHECK lines of this file (- for stdin) instead of writing")
	wait := flag.Duration("wait", 60*time.Second, "how long to wait for the socket")
	timeout := flag.Duration("timeout", 60*time.Second, "bound on each NBD operation")
	wantSize := flag.Uint64("size", 0, "expected export size in bytes (0: any of at least 8 MiB)")
	unaligned := flag.Bool("unaligned", false, "also write and check 512 bytes at 2 MiB + 512 (not 4 KiB aligned)")
	flag.Parse()
	if *socket == "" {
		fmt.Fprintln(os.Stderr, "nbdcheck: -socket is required")
		os.Exit(2)
	}
	t0 := time.Now()
	cl, err := dial(*socket, *wait, *timeout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nbdcheck: FAIL: %s: %v\n", *socket, err)
		os.Exit(1)
	}
	defer cl.c.Close()
	if cl.size < 8<<20 {
		fmt.Fprintf(os.Stderr, "nbdcheck: FAIL: export of %d bytes (need >= 8 MiB)\n", cl.size)
		os.Exit(1)
	}
	if *wantSize != 0 && cl.size != *wantSize {
		fmt.Fprintf(os.Stderr, "nbdcheck: FAIL: export of %d bytes, want %d\n", cl.size, *wantSize)
		os.Exit(1)
	}
	if *verifyFrom != "" {
		in := io.Reader(os.Stdin)
		if *verifyFrom != "-" {
			f, err := os.Open(*verifyFrom)
			if err != nil {
				fmt.Fprintf(os.Stderr, "nbdcheck: FAIL: %v\n", err)
				os.Exit(1)
			}
			defer f.Close()
			in = f
		}
		n, err := verify(cl, in)
		_ = cl.cmd(cmdDisc, 0, nil, nil, 0)
		if err != nil {
			fmt.Fprintf(os.Stderr, "nbdcheck: FAIL: verify: %v\n", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "nbdcheck: OK: %d region(s) verified on a %d-byte export in %.2fs\n", n, cl.size, time.Since(t0).Seconds())
		return
	}
	checks, err := writePasses(cl, *passes, *unaligned)
	_ = cl.cmd(cmdDisc, 0, nil, nil, 0)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nbdcheck: FAIL: %v\n", err)
		os.Exit(1)
	}
	for _, c := range checks {
		fmt.Println(c)
	}
	fmt.Fprintf(os.Stderr, "nbdcheck: OK: %d pass(es) x %d regions on a %d-byte export in %.2fs\n", *passes, len(checks), cl.size, time.Since(t0).Seconds())
}
