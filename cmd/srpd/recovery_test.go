package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
)

// TestRestartDisconnectsPeers: a target daemon that is SIGKILLed leaves its connections in its
// state file; restarted, it sends a DREQ for each, so an initiator daemon (ours, on another
// address) sees the disconnect at once and logs in again after its reconnect_delay — without
// I/O it would otherwise never notice. The NBD export works again afterwards.
func TestRestartDisconnectsPeers(t *testing.T) {
	if !loopbackAddr(t, "127.0.0.2") {
		t.Skip("SKIPPED: 127.0.0.2 is not usable on this host")
	}
	dirT := testutil.ShortTempDir(t, "srpd-t-")
	dirI := testutil.ShortTempDir(t, "srpd-i-")
	udp := testutil.FreeUDPPort(t)
	nbdSock := filepath.Join(dirI, "c1.nbd")
	cfgT := filepath.Join(dirT, "srpd.yaml")
	cfgI := filepath.Join(dirI, "srpd.yaml")
	writeFile(t, cfgT, t1TargetConfig(udp, "", fmt.Sprintf("control: {socket: %s/ctl.sock}\n", dirT)))
	writeFile(t, cfgI, c1InitiatorConfig(udp, 0, nbdSock, fmt.Sprintf("control: {socket: %s/ctl.sock}\n", dirI)))
	sockT, sockI := filepath.Join(dirT, "ctl.sock"), filepath.Join(dirI, "ctl.sock")
	state := filepath.Join(dirT, "ctl.connections.json")

	nT := newNotifySocket(t, dirT)
	dT := startDaemon(t, cfgT, nT)
	nT.wait(t, "READY=1", 60*time.Second)
	nI := newNotifySocket(t, dirI)
	startDaemon(t, cfgI, nI)
	nI.wait(t, "READY=1", 60*time.Second)
	var before ctlapi.ConnectionInfo
	waitFor(t, 30*time.Second, "c1 logged in", func() bool {
		mustSrpctl(t, sockI, &before, "-o", "json", "connections", "c1")
		return before.State == ctlapi.StateRunning
	})
	// The target records the channels' connections (the initiator's on 127.0.0.2).
	waitFor(t, 10*time.Second, "the state file to list the channels", func() bool {
		b, err := os.ReadFile(state)
		if err != nil {
			return false
		}
		var f struct {
			Conns []struct {
				Remote    string `json:"remote"`
				RemoteQPN uint32 `json:"remote_qpn"`
			} `json:"connections"`
		}
		if json.Unmarshal(b, &f) != nil || len(f.Conns) != before.Channels {
			return false
		}
		for _, c := range f.Conns {
			if c.Remote != fmt.Sprintf("127.0.0.2:%d", udp) || c.RemoteQPN == 0 {
				t.Fatalf("state file records %+v", f.Conns)
			}
		}
		return true
	})

	if err := dT.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-dT.Done
	killed := time.Now()
	again := filepath.Join(dirT, "again")
	if err := os.Mkdir(again, 0o755); err != nil {
		t.Fatal(err)
	}
	nT2 := newNotifySocket(t, again)
	dT2 := startDaemon(t, cfgT, nT2)
	nT2.wait(t, "READY=1", 60*time.Second)
	waitFor(t, 15*time.Second, "c1 to log in to the restarted target (after its DREQs)", func() bool {
		var l ctlapi.SessionList
		mustSrpctl(t, sockT, &l, "-o", "json", "session", "list")
		var c ctlapi.ConnectionInfo
		mustSrpctl(t, sockI, &c, "-o", "json", "connections", "c1")
		return len(l.Sessions) == 1 && l.Sessions[0].Channels == before.Channels && c.State == ctlapi.StateRunning
	})
	t.Logf("logged in again %v after the SIGKILL (reconnect_delay 1s)", time.Since(killed).Round(10*time.Millisecond))
	if !strings.Contains(dT2.stderr.String(), "disconnecting the connections of the previous instance") {
		t.Fatal("the restarted target did not report the DREQs it sent")
	}
	nc, err := dialNBD(nbdSock, "")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	buf := make([]byte, 4096)
	if err := nc.ReadAt(buf, 0); err != nil {
		t.Fatalf("NBD read after the reconnect: %v", err)
	}
}

// loopbackAddr reports whether a UDP socket can bind addr (127.0.0.0/8 is all loopback on
// Linux, but a container may differ).
func loopbackAddr(t *testing.T, addr string) bool {
	t.Helper()
	c, err := net.ListenPacket("udp4", addr+":0")
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}
