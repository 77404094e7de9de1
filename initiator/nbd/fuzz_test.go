package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/fuzzbound"
)

// socketPair returns two connected unix stream sockets (the server's and the client's).
func socketPair(t testing.TB) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	a, b, err := socketPairErr()
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

func socketPairErr() (*net.UnixConn, *net.UnixConn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	conns := make([]*net.UnixConn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			if i == 1 {
				conns[0].Close()
			} else {
				syscall.Close(fds[1])
			}
			return nil, nil, err
		}
		conns[i] = c.(*net.UnixConn)
	}
	return conns[0], conns[1], nil
}

var (
	fuzzOnce   sync.Once
	fuzzServer *Server
)

// sharedFuzzServer is one server for every fuzz iteration (its exports never change).
func sharedFuzzServer(t testing.TB) *Server {
	fuzzOnce.Do(func() {
		s, err := NewServer(Config{MaxRequestSize: 64 << 10, MaxInFlight: 8, Workers: 2,
			HandshakeTimeout: 2 * time.Second, ShutdownTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ro := newRAM(1<<20, 4096)
		ro.ro = true
		for name, dev := range map[string]Device{"a": newRAM(1<<20, 512), "ro": ro} {
			if err := s.AddExport(name, dev, ExportOptions{Description: "fuzz"}); err != nil {
				t.Fatal(err)
			}
		}
		fuzzServer = s
	})
	return fuzzServer
}

// feed plays input as the client on a fresh connection and returns everything the server
// sent. It fails (t.Error, false) if the server does not finish soon after the end of the
// input. It runs inside fuzzbound.Run, so it never calls t.FailNow.
func feed(t *testing.T, input []byte) ([]byte, bool) {
	s := sharedFuzzServer(t)
	sc, cc, err := socketPairErr()
	if err != nil {
		t.Error(err)
		return nil, false
	}
	defer cc.Close()
	// Each wait below gets a share of the per-input bound, so that these report first.
	wait := fuzzbound.Bound() * 2 / 5
	done := make(chan error, 1)
	go func() { done <- s.ServeConn(context.Background(), sc) }()
	var out bytes.Buffer
	readDone := make(chan struct{})
	go func() {
		io.Copy(&out, cc)
		close(readDone)
	}()
	cc.Write(input) // the server may close early; that is fine
	cc.CloseWrite()
	select {
	case <-done:
	case <-time.After(wait):
		t.Errorf("server still serving %v after the input ended (%d bytes)", wait, len(input))
		sc.Close()
		<-done
		return nil, false
	}
	select {
	case <-readDone:
	case <-time.After(wait):
		t.Error("server did not close the connection")
		cc.Close()
		<-readDone
		return nil, false
	}
	return out.Bytes(), true
}

func opt(o uint32, data []byte) []byte {
	b := binary.BigEndian.AppendUint64(nil, optMagic)
	b = binary.BigEndian.AppendUint32(b, o)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

func clientFlags(f uint32) []byte { return binary.BigEndian.AppendUint32(nil, f) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// FuzzHandshake feeds arbitrary option haggling to the server.
func FuzzHandshake(f *testing.F) {
	fl := clientFlags(clientFlagFixedNewstyle | clientFlagNoZeroes)
	f.Add(cat(fl, opt(optGo, infoData("a", infoBlockSize)), encodeRequest(cmdRead, 0, 1, 0, 512, nil)))
	f.Add(cat(fl, opt(optList, nil), opt(optInfo, infoData("ro", infoName, infoDescription)), opt(optAbort, nil)))
	f.Add(cat(fl, opt(optStructuredReply, nil), opt(optInfo, infoData("nope")), opt(optExportName, []byte("a"))))
	f.Add(cat(clientFlags(0), opt(optExportName, []byte("a"))))
	f.Add(cat(fl, opt(optStartTLS, nil), opt(99, []byte("xyz")), opt(optSetMetaContext, []byte{0, 0, 0, 1, 'a', 0, 0, 0, 0})))
	f.Add(cat(fl, opt(optInfo, []byte{0, 0, 0, 200, 'a'})))
	f.Add(cat(fl, opt(optListMetaContext, metaData("a")), opt(optStructuredReply, nil), opt(optListMetaContext, metaData("ro", "base:", "x:y")),
		opt(optSetMetaContext, metaData("a", metaBaseAllocation)), opt(optGo, infoData("a")), encodeRequest(cmdBlockStatus, cmdFlagReqOne, 1, 0, 4096, nil)))
	f.Add(cat(fl, opt(optStructuredReply, nil), opt(optSetMetaContext, []byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}), opt(optSetMetaContext, metaData("nope", "base:"))))
	f.Add(cat(fl, opt(optList, []byte{1}), opt(optStructuredReply, []byte{1})))
	f.Add(cat(clientFlags(0xffffffff)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, input []byte) {
		sharedFuzzServer(t)
		fuzzbound.Run(t, func() {
			out, ok := feed(t, input)
			if ok && (len(out) < 18 || binary.BigEndian.Uint64(out) != nbdMagic) {
				t.Errorf("no greeting: % x", out[:min(len(out), 18)])
			}
		})
	})
}

// FuzzRequests negotiates an export (simple or structured replies, picked by the first byte)
// and feeds arbitrary bytes as the request stream. With structured replies the reply stream
// can be parsed without context; it is checked to consist of well-formed replies.
func FuzzRequests(f *testing.F) {
	for _, sel := range []byte{0, 1, 2} {
		f.Add(cat([]byte{sel}, encodeRequest(cmdRead, 0, 1, 0, 4096, nil), encodeRequest(cmdFlush, 0, 2, 0, 0, nil)))
		f.Add(cat([]byte{sel}, encodeRequest(cmdWrite, cmdFlagFUA, 3, 512, 1024, make([]byte, 1024)), encodeRequest(cmdRead, cmdFlagDF, 4, 512, 1024, nil)))
		f.Add(cat([]byte{sel}, encodeRequest(cmdTrim, 0, 5, 100, 5000, nil), encodeRequest(cmdWriteZeroes, cmdFlagNoHole, 6, 0, 1<<20, nil)))
		f.Add(cat([]byte{sel}, encodeRequest(cmdWrite, 0, 7, 1<<20, 512, make([]byte, 512)), encodeRequest(cmdCache, 0, 8, 0, 512, nil)))
		f.Add(cat([]byte{sel}, encodeRequest(cmdRead, 0, 9, 0, 128<<10, nil), encodeRequest(99, 0xffff, 10, ^uint64(0), ^uint32(0), nil)))
		f.Add(cat([]byte{sel}, encodeRequest(cmdWrite, 0, 11, 0, 100<<10, make([]byte, 100<<10)), encodeRequest(cmdDisc, 0, 12, 0, 0, nil)))
		f.Add(cat([]byte{sel}, encodeRequest(cmdWrite, 0, 13, 0, 8192, make([]byte, 100))))
		f.Add(cat([]byte{sel}, []byte{0x25, 0x60, 0x95, 0x14, 0, 0}))
		f.Add(cat([]byte{sel}, encodeRequest(cmdBlockStatus, 0, 14, 100, 1000, nil), encodeRequest(cmdBlockStatus, cmdFlagReqOne, 15, 0, 0, nil)))
	}
	f.Fuzz(func(t *testing.T, input []byte) {
		if len(input) == 0 {
			return
		}
		sel, stream := input[0]%3, input[1:]
		export := "a"
		if sel == 2 {
			export = "ro"
		}
		hs := clientFlags(clientFlagFixedNewstyle | clientFlagNoZeroes)
		structured := sel != 0
		if structured {
			// base:allocation too, so that NBD_CMD_BLOCK_STATUS is served.
			hs = cat(hs, opt(optStructuredReply, nil), opt(optSetMetaContext, metaData(export, metaBaseAllocation)))
		}
		hs = cat(hs, opt(optGo, infoData(export, infoBlockSize)))
		sharedFuzzServer(t)
		fuzzbound.Run(t, func() {
			out, ok := feed(t, cat(hs, stream))
			if !ok || !structured {
				return
			}
			out, err := skipHandshake(out)
			if err == nil {
				err = checkReplyStream(out)
			}
			if err != nil {
				t.Error(err)
			}
		})
	})
}

// skipHandshake removes the greeting and the option replies up to the NBD_REP_ACK of GO.
func skipHandshake(out []byte) ([]byte, error) {
	if len(out) < 18 {
		return nil, fmt.Errorf("short greeting")
	}
	out = out[18:]
	for {
		if len(out) < optReplyHdrLen || binary.BigEndian.Uint64(out) != optReplyMagic {
			return nil, fmt.Errorf("bad option reply % x", out[:min(len(out), 20)])
		}
		o, typ := binary.BigEndian.Uint32(out[8:]), binary.BigEndian.Uint32(out[12:])
		n := int(binary.BigEndian.Uint32(out[16:]))
		if len(out) < optReplyHdrLen+n {
			return nil, errors.New("truncated option reply")
		}
		out = out[optReplyHdrLen+n:]
		if o == optGo && typ == repAck {
			return out, nil
		}
		if typ&repErrBit != 0 {
			return nil, fmt.Errorf("option %d failed: %#x", o, typ)
		}
	}
}

// checkReplyStream parses a structured-reply transmission stream: simple replies without
// payload and structured chunks with consistent lengths.
func checkReplyStream(out []byte) error {
	for len(out) > 0 {
		if len(out) < 4 {
			return fmt.Errorf("trailing bytes % x", out)
		}
		switch binary.BigEndian.Uint32(out) {
		case simpleReplyMagic:
			if len(out) < simpleReplyLen {
				return errors.New("truncated simple reply")
			}
			if e := Errno(binary.BigEndian.Uint32(out[4:])); e != 0 && !e.known() {
				return fmt.Errorf("error %d is not an NBD error", e)
			}
			out = out[simpleReplyLen:]
		case structuredReplyMagic:
			if len(out) < structuredHdrLen {
				return errors.New("truncated chunk header")
			}
			flags, typ := binary.BigEndian.Uint16(out[4:]), binary.BigEndian.Uint16(out[6:])
			n := int(binary.BigEndian.Uint32(out[16:]))
			if len(out) < structuredHdrLen+n {
				return errors.New("truncated chunk")
			}
			p := out[structuredHdrLen : structuredHdrLen+n]
			if flags != replyFlagDone {
				return fmt.Errorf("chunk flags %#x", flags)
			}
			switch typ {
			case replyTypeNone:
				if n != 0 {
					return errors.New("NONE chunk with payload")
				}
			case replyTypeOffsetData:
				if n < 9 {
					return fmt.Errorf("OFFSET_DATA of length %d", n)
				}
			case replyTypeError:
				if n < 6 || int(binary.BigEndian.Uint16(p[4:])) != n-6 || !Errno(binary.BigEndian.Uint32(p)).known() {
					return fmt.Errorf("bad error chunk % x", p)
				}
			case replyTypeBlockStatus:
				if n < 12 || (n-4)%8 != 0 || binary.BigEndian.Uint32(p) != metaAllocationID {
					return fmt.Errorf("bad block status chunk % x", p)
				}
				for d := p[4:]; len(d) > 0; d = d[8:] {
					if binary.BigEndian.Uint32(d) == 0 || binary.BigEndian.Uint32(d[4:])&^(stateHole|stateZero) != 0 {
						return fmt.Errorf("bad block descriptor % x", d[:8])
					}
				}
			default:
				return fmt.Errorf("chunk type %d", typ)
			}
			out = out[structuredHdrLen+n:]
		default:
			return fmt.Errorf("reply magic %#x", binary.BigEndian.Uint32(out))
		}
	}
	return nil
}
