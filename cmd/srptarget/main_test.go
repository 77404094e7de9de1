package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
	"github.com/srpd/srpd/transport/softroce"
	"github.com/srpd/srpd/transport/softroce/link"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestParseArgsDefaults(t *testing.T) {
	o, err := parseArgs(nil, envOf(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := options{
		addr: netip.IPv4Unspecified(), port: 5555, rocePort: 4791,
		portID: srp.MakePortID(0x5352500000000003, 0x5352500000000003), lunMiB: 64, blockSize: 512,
	}
	if o != want {
		t.Fatalf("defaults %+v, want %+v", o, want)
	}
}

func TestParseArgsEnv(t *testing.T) {
	// What srp-interop kernel-initiator sets.
	env := map[string]string{
		"SRP_INTEROP_ROLE":           "target",
		"SRP_INTEROP_ADDR":           "10.77.0.3",
		"SRP_INTEROP_PORT":           "5556",
		"SRP_INTEROP_ID_EXT":         "1111111111111111",
		"SRP_INTEROP_IOC_GUID":       "2222222222222222",
		"SRP_INTEROP_TARGET_PORT_ID": "53525000000000035352500000000004",
		"SRP_INTEROP_ROCE_PORT":      "4792",
	}
	o, err := parseArgs(nil, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.addr != netip.MustParseAddr("10.77.0.3") || o.port != 5556 || o.rocePort != 4792 ||
		o.portID != srp.MakePortID(0x5352500000000003, 0x5352500000000004) {
		t.Fatalf("from the environment: %+v", o)
	}
	// Without the target port ID: id_ext ‖ ioc_guid.
	delete(env, "SRP_INTEROP_TARGET_PORT_ID")
	if o, err = parseArgs(nil, envOf(env), io.Discard); err != nil {
		t.Fatal(err)
	}
	if o.portID != srp.MakePortID(0x1111111111111111, 0x2222222222222222) {
		t.Fatalf("port ID from id_ext/ioc_guid: %v", o.portID)
	}
	// Flags win over the environment.
	o, err = parseArgs([]string{"-addr", "127.0.0.1", "-port", "7000", "-roce-port", "0",
		"-port-id", "0x000102030405060708090a0b0c0d0e0f", "-lun-mib", "8", "-block-size", "4096", "-v"}, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := options{addr: netip.MustParseAddr("127.0.0.1"), port: 7000, rocePort: 0,
		portID: srp.MakePortID(0x0001020304050607, 0x08090a0b0c0d0e0f), lunMiB: 8, blockSize: 4096, verbose: true}
	if o != want {
		t.Fatalf("flags %+v, want %+v", o, want)
	}
}

func TestParseArgsErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-addr", "nowhere"}, nil, "-addr"},
		{[]string{"-port", "0"}, nil, "-port"},
		{[]string{"-port", "70000"}, nil, "-port"},
		{nil, map[string]string{"SRP_INTEROP_PORT": "x"}, "-port"},
		{[]string{"-roce-port", "-1"}, nil, "-roce-port"},
		{[]string{"-port-id", "1234"}, nil, "-port-id"},
		{nil, map[string]string{"SRP_INTEROP_ID_EXT": "zz"}, "-port-id"},
		{[]string{"-port-id", strings.Repeat("0", 32)}, nil, "zero"},
		{[]string{"-lun-mib", "0"}, nil, "-lun-mib"},
		{[]string{"-block-size", "1024"}, nil, "-block-size"},
		{[]string{"extra"}, nil, "unexpected"},
		{[]string{"-nope"}, nil, "not defined"},
	} {
		_, err := parseArgs(tc.args, envOf(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q %v: error %v, want one mentioning %q", tc.args, tc.env, err, tc.want)
		}
	}
	if _, err := parseArgs([]string{"-h"}, envOf(nil), io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

// TestRunLoginSmoke starts the target on 127.0.0.1 with an ephemeral RoCE port, logs in over
// RDMA CM from a second soft-RoCE device, and stops the target: the channel gets its T_LOGOUT
// and DREQ, and run returns nil.
func TestRunLoginSmoke(t *testing.T) {
	const cmPort = 5555
	lo := netip.MustParseAddr("127.0.0.1")
	o := options{addr: lo, port: cmPort, rocePort: 0,
		portID: srp.MakePortID(0x5352500000000003, 0x5352500000000003), lunMiB: 8, blockSize: 512}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	readyCh := make(chan listening, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, zaptest.NewLogger(t), func(l listening) { readyCh <- l }) }()
	var tl listening
	select {
	case tl = <-readyCh:
	case err := <-done:
		t.Skipf("no UDP on %v: %v", lo, err)
	case <-time.After(10 * time.Second):
		t.Fatal("target not listening")
	}

	lctx, lcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer lcancel()
	lnk, err := link.ListenUDP(lctx, netip.AddrPortFrom(lo, 0), link.UDPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	idev, err := softroce.Open(softroce.Config{Name: "ini0", Link: lnk})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer ccancel()
		_ = idev.Close(cctx)
	}()
	idev.SetPeerUDPPort(lo, tl.udp.Port())
	pd, err := idev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	scq, err := idev.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	rcq, err := idev.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(transport.QPInitAttr{SendCQ: scq, RecvCQ: rcq,
		Cap: transport.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := idev.AllocMemory(8 * 4096)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegMR(mem.Addr(), uint64(mem.Len()), transport.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}

	lr := srp.LoginReq{ReqITIULen: 4096, BufFmt: srp.BufFormatDirect | srp.BufFormatIndirect, Flags: srp.MultiChanSingle,
		InitiatorPortID: srp.MakePortID(0, 0x5054_00ff_fe77_0002), TargetPortID: o.portID}
	copy(lr.Tag[:], "smoke")
	pdata := make([]byte, srp.LoginReqRDMALen)
	if _, err := lr.EncodeRDMA(pdata); err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	conn, err := idev.Dial(dctx, netip.AddrPortFrom(lo, cmPort), qp, pdata,
		transport.ConnParam{ResponderResources: 4, RetryCount: 7, RNRRetryCount: 7, FlowControl: true})
	if err != nil {
		t.Fatalf("login: %v", err)
	}
	for i := 0; i < 8; i++ {
		sge := transport.SGE{Addr: mem.Addr() + uint64(i)*4096, Length: 4096, LKey: mr.LKey()}
		if err := qp.PostRecv([]transport.RecvWR{{ID: uint64(i), SGL: []transport.SGE{sge}}}); err != nil {
			t.Fatal(err)
		}
	}
	rsp, err := srp.ParseLoginRsp(conn.PrivateData())
	if err != nil {
		t.Fatalf("REP private data: %v", err)
	}
	if f := rsp.Fields(); f.Tag != lr.Tag || f.ReqLimDelta == 0 || f.MaxITIULen != 4096 {
		t.Fatalf("SRP_LOGIN_RSP %+v", f)
	}

	// The target's channel starts once the RTU arrived.
	for i := 0; tl.tgt.Stats().Channels != 1; i++ {
		if i == 1000 {
			t.Fatal("the channel did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// SIGTERM: T_LOGOUT, then the target's DREQ, then run returns nil.
	cancel()
	wcs := make([]transport.WC, 8)
	gotLogout := false
	deadline := time.After(10 * time.Second)
	for !gotLogout {
		if n := rcq.Poll(wcs); n > 0 {
			for _, wc := range wcs[:n] {
				if wc.Status == transport.WCSuccess && wc.ByteLen > 0 &&
					srp.Opcode(mem.Bytes()[int(wc.ID)*4096]) == srp.OpTLogout {
					gotLogout = true
				}
			}
			continue
		}
		select {
		case <-rcq.Notify():
		case <-deadline:
			t.Fatal("no SRP_T_LOGOUT")
		}
	}
	select {
	case ev := <-conn.Events():
		if ev.Type != transport.CMEventDisconnected {
			t.Fatalf("CM event %v, want a disconnect", ev.Type)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no DREQ from the target")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return")
	}
}
