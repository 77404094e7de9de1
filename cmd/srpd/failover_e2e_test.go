package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
)

const failoverNAA = "0x6001405a1b2c3d4e5f60718293a4b5c6"

// gatewayConfig is gateway i (0 or 1) of a pair exporting file as one logical unit: its own
// address 127.0.0.(2+i), target port group i+1 (gw1 active/optimized, gw2
// active/non-optimized), a shared file LUN with one NAA.
func gatewayConfig(dir string, i, udp int, lun string) string {
	states := []string{"active/optimized", "active/non-optimized"}
	return fmt.Sprintf(`version: 1
transports:
  - name: lo
    address: 127.0.0.%d
    udp_port: %d
targets:
  - name: gw%d
    port_id: 0x000000000000000%d0000000000000077
    alua:
      group: %d
      relative_port: %d
      state: %s
      peers:
        - {group: %d, relative_ports: [%d], state: %s}
    luns:
      - %s
    acls:
      - initiator: "*"
control:
  socket: %s
`, 2+i, udp, i+1, i+1, i+1, i+1, states[i], 2-i, 2-i, states[1-i], lun, filepath.Join(dir, fmt.Sprintf("gw%d.sock", i+1)))
}

// initiatorConfig: sessions to both gateways grouped as multipath "vol", LUN 0 exported over
// NBD; a short packet life time and fast_io_fail_tmo, as multipath set-ups want (a dead
// gateway's channel fails after about 2 s instead of 17).
func initiatorConfig(dir string, udp int) string {
	sess := ""
	for i := range 2 {
		sess += fmt.Sprintf(`  - name: gw%d
    address: 127.0.0.%d
    port: 5555
    target_port_id: 0x000000000000000%d0000000000000077
    reconnect_delay: 1s
    fast_io_fail_tmo: 2s
    dev_loss_tmo: 60s
`, i+1, 2+i, i+1)
	}
	return fmt.Sprintf(`version: 1
transports:
  - name: lo
    address: 127.0.0.1
    udp_port: %d
    packet_life_time: 100ms
sessions:
%smultipath:
  - name: vol
    sessions: [gw1, gw2]
    no_path_timeout: 30s
    nbd:
      - {lun: 0, socket: %s}
control:
  socket: %s
`, udp, sess, filepath.Join(dir, "vol.nbd"), filepath.Join(dir, "ini.sock"))
}

func writeConfig(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// paths returns the multipath LUN 0 paths of group vol by session.
func mpPaths(t *testing.T, sock string) map[string]ctlapi.MultipathPath {
	t.Helper()
	var l ctlapi.MultipathList
	mustSrpctl(t, sock, &l, "-o", "json", "multipath")
	out := map[string]ctlapi.MultipathPath{}
	for _, m := range l.Multipath {
		for _, lun := range m.LUNs {
			for _, p := range lun.Paths {
				out[p.Session] = p
			}
		}
	}
	return out
}

// TestMultipathFailover: two srpd gateways export one file as one logical unit (ALUA: gw1
// active/optimized, gw2 active/non-optimized); an srpd initiator has a path to each, grouped
// as multipath, and an NBD export of the unit. fio writes through the export with verification
// data (rate-limited, so the run lasts); gw1 is killed with SIGKILL in the middle: the I/O
// moves to gw2 and the longest completion (the stall) stays under 10 s; fio's verify pass
// reads every block back (no acknowledged write lost). gw1 starts again: the initiator fails
// back to it and new I/O goes through it.
func TestMultipathFailover(t *testing.T) {
	dir := testutil.ShortTempDir(t, "srpd-mp-")
	lun := fmt.Sprintf("{id: 0, backend: file, path: %s, size: 64MiB, create: true, shared: true, naa: %s}",
		filepath.Join(dir, "lu.img"), failoverNAA)
	multipathFailover(t, dir, lun)
}

// multipathFailover is TestMultipathFailover with gateways exporting lun (a luns: entry of one
// line) from dir. It returns the gateways as they are at the end (gw1 restarted).
func multipathFailover(t *testing.T, dir, lun string) [2]*daemonProc {
	fio, err := exec.LookPath("fio")
	if err != nil {
		t.Skip("SKIP: fio is not installed (CI installs it: .ci/run)")
	}
	binaries(t)
	udp := testutil.FreeUDPPort(t)
	var gwCfg [2]string
	starts := 0
	start := func(i int) *daemonProc {
		starts++
		nd := filepath.Join(dir, fmt.Sprintf("n%d", starts))
		if err := os.MkdirAll(nd, 0o700); err != nil {
			t.Fatal(err)
		}
		n := newNotifySocket(t, nd)
		d := startDaemon(t, gwCfg[i], n)
		n.wait(t, "READY=1", 60*time.Second)
		return d
	}
	var gws [2]*daemonProc
	for i := range 2 {
		gwCfg[i] = writeConfig(t, dir, fmt.Sprintf("gw%d.yaml", i+1), gatewayConfig(dir, i, udp, lun))
		gws[i] = start(i)
	}
	iniSock := filepath.Join(dir, "ini.sock")
	n := newNotifySocket(t, dir)
	startDaemon(t, writeConfig(t, dir, "ini.yaml", initiatorConfig(dir, udp)), n)
	n.wait(t, "READY=1", 60*time.Second)
	waitFor(t, 20*time.Second, "gw1 active", func() bool { return mpPaths(t, iniSock)["gw1"].Active })
	if p := mpPaths(t, iniSock); p["gw1"].ALUAState != "active/optimized" || p["gw1"].Group != 1 ||
		p["gw2"].ALUAState != "active/non-optimized" || p["gw2"].Group != 2 || !p["gw2"].Up {
		t.Fatalf("paths before the failover: %+v", p)
	}
	out := mustSrpctl(t, iniSock, nil, "connections")
	t.Logf("srpctl connections:\n%s", out)

	uri := "nbd+unix:///?socket=" + filepath.Join(dir, "vol.nbd")
	fioRun := func(args ...string) (map[string]any, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, fio, append([]string{"--name=mp", "--ioengine=nbd", "--uri=" + uri, "--bs=4k",
			"--verify=crc32c", "--verify_fatal=1", "--do_verify=1", "--output-format=json"}, args...)...)
		cmd.Dir = dir
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var res map[string]any
		js := o.Bytes()
		if i := bytes.IndexByte(js, '{'); i > 0 {
			js = js[i:] // fio may print a notice first
		}
		if jerr := json.Unmarshal(js, &res); jerr != nil && err == nil {
			err = fmt.Errorf("fio output is not JSON: %v\n%s", jerr, o.String())
		}
		if err != nil {
			err = fmt.Errorf("%w\n%s%s", err, o.String(), e.String())
		}
		return res, err
	}
	type result struct {
		res map[string]any
		err error
	}
	done := make(chan result, 1)
	began := time.Now()
	go func() {
		// 32 MiB in 4 KiB writes at 2500 IOPS: about 3.3 s of writes, then the verify pass.
		r, err := fioRun("--rw=randwrite", "--size=32m", "--iodepth=8", "--rate_iops=2500")
		done <- result{r, err}
	}()
	time.Sleep(1200 * time.Millisecond)
	if err := gws[0].Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	t.Logf("gw1 (pid %d) killed %v after fio started", gws[0].Cmd.Process.Pid, killed.Sub(began).Round(time.Millisecond))
	var r result
	select {
	case r = <-done:
	case <-time.After(4 * time.Minute):
		t.Fatal("fio did not finish")
	}
	if r.err != nil {
		t.Fatalf("fio through the failover: %v", r.err)
	}
	job := r.res["jobs"].([]any)[0].(map[string]any)
	if e := job["error"].(float64); e != 0 {
		t.Fatalf("fio job error %v", e)
	}
	w := job["write"].(map[string]any)
	stall := time.Duration(w["clat_ns"].(map[string]any)["max"].(float64))
	t.Logf("failover: longest write completion (the stall) %v; %v writes, verify pass read %v bytes", stall.Round(time.Millisecond),
		w["total_ios"], job["read"].(map[string]any)["io_bytes"])
	if stall >= 10*time.Second {
		t.Fatalf("I/O stalled %v across the failover (want < 10 s)", stall)
	}
	if w["total_ios"].(float64) < 8192 || job["read"].(map[string]any)["io_bytes"].(float64) < 32<<20 {
		t.Fatalf("fio did not write and verify 32 MiB: %+v", job)
	}
	p := mpPaths(t, iniSock)
	if !p["gw2"].Active || p["gw1"].Up || p["gw2"].IOs == 0 {
		t.Fatalf("paths after the failover: %+v", p)
	}

	// gw1 comes back (its config says active/optimized): failback.
	gws[0] = start(0)
	waitFor(t, 30*time.Second, "failback to gw1", func() bool { return mpPaths(t, iniSock)["gw1"].Active })
	back := time.Now()
	before := mpPaths(t, iniSock)
	if _, err := fioRun("--rw=randwrite", "--size=4m", "--iodepth=4", "--offset=32m"); err != nil {
		t.Fatalf("fio after the failback: %v", err)
	}
	after := mpPaths(t, iniSock)
	if after["gw1"].IOs-before["gw1"].IOs < 2048 || after["gw2"].IOs != before["gw2"].IOs {
		t.Fatalf("after the failback the I/O does not go through gw1: before %+v, after %+v", before, after)
	}
	t.Logf("failback to gw1 %v after the kill", back.Sub(killed).Round(time.Millisecond))
	return gws
}
