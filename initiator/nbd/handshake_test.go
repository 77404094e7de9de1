package nbd

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func handshakeExports() map[string]Device {
	ro := newRAM(1<<20, 4096)
	ro.ro = true
	nodisc := newRAM(1<<20, 512)
	nodisc.discard = false
	return map[string]Device{
		"disk": newRAM(8<<20, 512),
		"ro":   ro,
		"nd":   nodisc,
		"":     newRAM(1<<20, 4096),
	}
}

func TestHandshake(t *testing.T) {
	ts := startServer(t, Config{}, handshakeExports())
	const all = tflagHasFlags | tflagSendFlush | tflagSendFUA | tflagCanMultiConn | tflagSendCache

	tests := []struct {
		name string
		run  func(t *testing.T, c *client)
	}{
		{"greeting", func(t *testing.T, c *client) {
			if f := c.hello(clientFlagFixedNewstyle); f != flagFixedNewstyle|flagNoZeroes {
				t.Fatalf("handshake flags %#x", f)
			}
		}},
		{"unknown client flag drops the connection", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle | 1<<5)
			c.expectClosed()
		}},
		{"bad option magic drops the connection", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			c.write(make([]byte, 16))
			c.expectClosed()
		}},
		{"list", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			c.sendOpt(optList, nil)
			var names []string
			for {
				r := c.readOptReply()
				if r.opt != optList {
					t.Fatalf("reply to option %d", r.opt)
				}
				if r.typ == repAck {
					break
				}
				if r.typ != repServer {
					t.Fatalf("reply type %#x", r.typ)
				}
				n := binary.BigEndian.Uint32(r.data)
				name := string(r.data[4 : 4+n])
				if desc := string(r.data[4+n:]); desc != "test export "+name {
					t.Errorf("export %q described as %q", name, desc)
				}
				names = append(names, name)
			}
			if got := strings.Join(names, ","); got != ",disk,nd,ro" {
				t.Fatalf("exports %q", got)
			}
		}},
		{"list with data is invalid", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			c.sendOpt(optList, []byte{1})
			if r := c.readOptReply(); r.typ != repErrInvalid {
				t.Fatalf("reply %#x", r.typ)
			}
		}},
		{"info then go", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			res := c.info(optInfo, "disk", infoName, infoDescription, infoBlockSize, 77)
			if res.final.typ != repAck || !res.gotExport || !res.gotBS {
				t.Fatalf("NBD_OPT_INFO: %+v", res)
			}
			want := all | tflagSendWriteZeroes | tflagSendTrim
			if res.size != 8<<20 || res.tflags != want {
				t.Errorf("size %d flags %#x, want %d %#x", res.size, res.tflags, 8<<20, want)
			}
			if res.name != "disk" || res.desc != "test export disk" {
				t.Errorf("name %q desc %q", res.name, res.desc)
			}
			if res.minBS != 512 || res.prefBS != 512 || res.maxBS != DefaultMaxRequestSize {
				t.Errorf("block sizes %d %d %d", res.minBS, res.prefBS, res.maxBS)
			}
			// Still haggling: GO with the same parameters gives the same answer.
			res2 := c.info(optGo, "disk", infoName, infoDescription, infoBlockSize, 77)
			if res2.final.typ != repAck || res2.size != res.size || res2.tflags != res.tflags {
				t.Fatalf("NBD_OPT_GO: %+v", res2)
			}
			c.size = res2.size
			if r := c.do(cmdRead, 0, 0, 512, nil); r.errno != 0 || len(r.data) != 512 {
				t.Fatalf("read after GO: %+v", r)
			}
		}},
		{"info without requests still sends export and block size", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			res := c.info(optInfo, "ro")
			if res.final.typ != repAck || !res.gotExport || !res.gotBS || res.name != "" {
				t.Fatalf("%+v", res)
			}
			if want := all | tflagReadOnly; res.tflags != want {
				t.Errorf("read-only flags %#x, want %#x", res.tflags, want)
			}
			if res.minBS != 4096 {
				t.Errorf("minimum block size %d", res.minBS)
			}
		}},
		{"flags without discard", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			res := c.info(optInfo, "nd")
			if want := all | tflagSendWriteZeroes; res.tflags != want {
				t.Errorf("flags %#x, want %#x", res.tflags, want)
			}
		}},
		{"default export", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			if res := c.info(optInfo, ""); res.final.typ != repAck || res.size != 1<<20 {
				t.Fatalf("%+v", res)
			}
		}},
		{"info unknown export", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			if res := c.info(optInfo, "nope"); res.final.typ != repErrUnknown || res.gotExport {
				t.Fatalf("%+v", res)
			}
			if res := c.info(optGo, "nope"); res.final.typ != repErrUnknown {
				t.Fatalf("%+v", res)
			}
			// The connection is still haggling.
			if res := c.info(optInfo, "disk"); res.final.typ != repAck {
				t.Fatalf("%+v", res)
			}
		}},
		{"malformed info", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			for _, data := range [][]byte{
				{},
				{0, 0, 0, 0, 0},
				{0, 0, 0, 9, 'd', 'i', 's', 'k', 0, 0}, // name length beyond the data
				append(infoData("disk", infoName), 0),  // trailing byte
				{0, 0, 0, 4, 'd', 'i', 's', 'k', 0, 2, 0, 1}, // two requests announced, one sent
				append(infoData("disk"), []byte{0, 0, 0}...), // requests without a count
			} {
				c.sendOpt(optInfo, data)
				if r := c.readOptReply(); r.typ != repErrInvalid {
					t.Fatalf("NBD_OPT_INFO % x: reply %#x", data, r.typ)
				}
			}
		}},
		{"go with structured replies sets DF", func(t *testing.T, c *client) {
			c.connect("disk", true)
			if c.tflags&tflagSendDF == 0 {
				t.Fatalf("flags %#x without NBD_FLAG_SEND_DF", c.tflags)
			}
		}},
		{"structured reply twice or with data", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			c.sendOpt(optStructuredReply, []byte{1})
			if r := c.readOptReply(); r.typ != repErrInvalid {
				t.Fatalf("with data: %#x", r.typ)
			}
			c.sendOpt(optStructuredReply, nil)
			if r := c.readOptReply(); r.typ != repAck {
				t.Fatalf("first: %#x", r.typ)
			}
			c.sendOpt(optStructuredReply, nil)
			if r := c.readOptReply(); r.typ != repErrInvalid {
				t.Fatalf("second: %#x", r.typ)
			}
		}},
		{"export name with zero padding", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			c.sendOpt(optExportName, []byte("disk"))
			b := make([]byte, 10+zeroPadLen)
			c.read(b)
			if binary.BigEndian.Uint64(b) != 8<<20 {
				t.Fatalf("size %d", binary.BigEndian.Uint64(b))
			}
			if f := binary.BigEndian.Uint16(b[8:]); f&tflagSendDF != 0 || f&tflagHasFlags == 0 {
				t.Fatalf("flags %#x", f)
			}
			if !bytes.Equal(b[10:], make([]byte, zeroPadLen)) {
				t.Fatal("padding is not zero")
			}
			c.size = 8 << 20
			if r := c.do(cmdRead, 0, 512, 512, nil); r.errno != 0 {
				t.Fatalf("read: %+v", r)
			}
		}},
		{"export name without zero padding", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle | clientFlagNoZeroes)
			c.sendOpt(optExportName, []byte("ro"))
			b := make([]byte, 10)
			c.read(b)
			if f := binary.BigEndian.Uint16(b[8:]); f&tflagReadOnly == 0 {
				t.Fatalf("flags %#x", f)
			}
			// The next bytes are a reply to our request, not padding.
			if r := c.do(cmdFlush, 0, 0, 0, nil); r.errno != 0 {
				t.Fatalf("flush: %+v", r)
			}
		}},
		{"non-fixed newstyle client", func(t *testing.T, c *client) {
			c.hello(0)
			c.sendOpt(optExportName, []byte("disk"))
			b := make([]byte, 10+zeroPadLen)
			c.read(b)
		}},
		{"export name for an unknown export drops the connection", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			c.sendOpt(optExportName, []byte("nope"))
			c.expectClosed()
		}},
		{"abort", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			c.sendOpt(optAbort, []byte("ignored"))
			if r := c.readOptReply(); r.opt != optAbort || r.typ != repAck {
				t.Fatalf("%+v", r)
			}
			c.expectClosed()
		}},
		{"unknown and unsupported options", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			for _, opt := range []uint32{4, 11, 99, 1 << 31} {
				c.sendOpt(opt, []byte("some data"))
				r := c.readOptReply()
				if r.opt != opt || r.typ != repErrUnsup {
					t.Fatalf("option %d: %+v", opt, r)
				}
			}
		}},
		{"starttls is refused by policy", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			c.sendOpt(optStartTLS, nil)
			if r := c.readOptReply(); r.typ != repErrPolicy {
				t.Fatalf("%+v", r)
			}
		}},
		{"oversized option is skipped", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			c.sendOpt(99, make([]byte, maxOptionLen+1))
			if r := c.readOptReply(); r.typ != repErrTooBig {
				t.Fatalf("%+v", r)
			}
			if res := c.info(optInfo, "disk"); res.final.typ != repAck {
				t.Fatalf("%+v", res)
			}
		}},
		{"huge option drops the connection", func(t *testing.T, c *client) {
			c.hello(clientFlagFixedNewstyle)
			var h [optHeaderLen]byte
			binary.BigEndian.PutUint64(h[0:], optMagic)
			binary.BigEndian.PutUint32(h[8:], 99)
			binary.BigEndian.PutUint32(h[12:], maxOptionSkip+1)
			c.write(h[:])
			c.expectClosed()
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := dialUnix(t, ts.sock)
			tc.run(t, c)
		})
	}
}

func TestHandshakeTimeout(t *testing.T) {
	ts := startServer(t, Config{HandshakeTimeout: 200 * time.Millisecond}, handshakeExports())
	c := dialUnix(t, ts.sock)
	c.hello(clientFlagFixedNewstyle)
	start := time.Now()
	c.expectClosed()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("closed after %v", d)
	}
	waitFor(t, "handshake failure counted", func() bool { return ts.Stats().HandshakeFailures == 1 })
}

func TestHandshakeOverTCP(t *testing.T) {
	ts := startServer(t, Config{}, handshakeExports())
	nc, err := net.Dial("tcp", ts.tcp)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, nc)
	c.connect("disk", false)
	if r := c.do(cmdRead, 0, 0, 4096, nil); r.errno != 0 {
		t.Fatalf("%+v", r)
	}
	c.send(cmdDisc, 0, 1, 0, 0, nil)
	if _, err := io.Copy(io.Discard, c.br); err != nil {
		t.Fatal(err)
	}
}
