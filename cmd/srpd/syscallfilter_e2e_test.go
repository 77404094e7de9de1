package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
)

const unitFile = "../../systemd/srpd.service"

// TestSyscallFilter runs srpd and srpctl as srpd.service does (static CGO_ENABLED=0 binaries,
// no race detector: what make release builds) under strace through the daemon's life: start
// with a target of a RAM and a file LUN and the control socket given its group, a second srpd
// logging in to it over softroce on UDP and exporting the file LUN over NBD, a LUN added with
// --persist (the configuration file rewritten), a session killed and re-established,
// verified NBD I/O with FLUSH, TRIM and WRITE_ZEROES, stats, a metrics scrape, reloads
// (ExecReload's srpctl reload --force with a change, an invalid file refused with its error,
// SIGHUP) and SIGTERM. Every system call either daemon made, and srpctl made for the reload,
// must be allowed by the unit's SystemCallFilter= lines, read from systemd/srpd.service and
// expanded by systemd-analyze syscall-filter at test time. srpctl counts for the reload
// only: ExecReload runs it under the unit's filter, an operator's srpctl runs outside it.
// systemd is not PID 1 on the test machines, so the filter itself cannot be applied: this
// compares what was used with what it allows.
func TestSyscallFilter(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds srpd twice and runs it under strace")
	}
	straceBin := needTool(t, "strace", "strace")
	analyze := needTool(t, "systemd-analyze", "systemd")
	filter, allowed := unitFilter(t, analyze)
	for _, must := range []string{"read", "epoll_pwait", "recvmmsg", "sendmmsg", "futex"} {
		if !allowed[must] {
			t.Fatalf("the unit's filter as systemd-analyze expands it lacks %s: the expansion is wrong", must)
		}
	}
	for _, never := range []string{"setuid", "mount", "setrlimit", "sched_setaffinity", "ptrace", "fchownat"} {
		if allowed[never] {
			t.Fatalf("the unit's filter as systemd-analyze expands it allows %s: the expansion is wrong", never)
		}
	}
	if !loopbackAddr(t, "127.0.0.2") {
		t.Skip("SKIPPED: 127.0.0.2 is not usable on this host (the initiator daemon binds it)")
	}
	srpdBin, srpctlBin := releaseBinaries(t)

	dirT := testutil.ShortTempDir(t, "srpd-t-")
	dirI := testutil.ShortTempDir(t, "srpd-i-")
	udp := testutil.FreeUDPPort(t)
	metrics := testutil.FreeTCPPort(t)
	nbdSock := filepath.Join(dirI, "c1.nbd")
	cfgT, cfgI := filepath.Join(dirT, "srpd.yaml"), filepath.Join(dirI, "srpd.yaml")
	sockT, sockI := filepath.Join(dirT, "ctl.sock"), filepath.Join(dirI, "ctl.sock")
	img := filepath.Join(dirT, "lun1.img")
	// control.group is the daemon's own group, as in the packaged configuration (group srpd,
	// User=srpd): no chown (@chown is in @privileged).
	gr, err := user.LookupGroupId(strconv.Itoa(os.Getegid()))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, cfgT, t1TargetConfig(udp,
		fmt.Sprintf("      - {id: 1, backend: file, path: %s, create: true, size: 16MiB}\n", img),
		fmt.Sprintf("control: {socket: %s, group: %s}\nmetrics: {listen: \"127.0.0.1:%d\"}\n", sockT, gr.Name, metrics)))
	writeFile(t, cfgI, c1InitiatorConfig(udp, 1, nbdSock, fmt.Sprintf("control: {socket: %s, group: %s}\n", sockI, gr.Name)))

	ctl := func(sock string, args ...string) (int, string, string) {
		t.Helper()
		return runTool(t, nil, srpctlBin, append([]string{"--socket", sock, "--timeout", "60s"}, args...)...)
	}
	mustCtl := func(sock string, args ...string) string {
		t.Helper()
		code, stdout, stderr := ctl(sock, args...)
		if code != 0 {
			t.Fatalf("srpctl %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout, stderr)
		}
		return stdout
	}
	traceT, traceI := filepath.Join(dirT, "strace.srpd"), filepath.Join(dirI, "strace.srpd")
	nT := newNotifySocket(t, dirT)
	dT := startTraced(t, straceBin, traceT, nT, srpdBin, "-c", cfgT, "--log-format", "json")
	nT.wait(t, "READY=1", 120*time.Second)
	nI := newNotifySocket(t, dirI)
	dI := startTraced(t, straceBin, traceI, nI, srpdBin, "-c", cfgI, "--log-format", "json")
	nI.wait(t, "READY=1", 120*time.Second)

	// A LUN added at run time and persisted (the configuration file rewritten).
	mustCtl(sockT, "lun", "add", "t1", "2", "--backend", "ram", "--size", "4MiB", "--persist")
	waitFor(t, 60*time.Second, "c1 logged in", func() bool {
		var c ctlapi.ConnectionInfo
		code, stdout, _ := ctl(sockI, "-o", "json", "connections", "c1")
		return code == 0 && jsonInto(stdout, &c) && c.State == ctlapi.StateRunning
	})
	// A session killed on the target: the initiator logs in again.
	var sessions ctlapi.SessionList
	if !jsonInto(mustCtl(sockT, "-o", "json", "session", "list", "--target", "t1"), &sessions) || len(sessions.Sessions) != 1 {
		t.Fatalf("t1's sessions: %+v", sessions)
	}
	mustCtl(sockT, "session", "kill", sessions.Sessions[0].ID)
	waitFor(t, 60*time.Second, "c1 to log in again after the kill", func() bool {
		var l ctlapi.SessionList
		return jsonInto(mustCtl(sockT, "-o", "json", "session", "list", "--target", "t1"), &l) &&
			len(l.Sessions) == 1 && l.Sessions[0].ID != sessions.Sessions[0].ID
	})

	const size = 16 << 20
	model := make([]byte, size)
	nc, err := dialNBD(nbdSock, "")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if nc.Size != size {
		t.Fatalf("NBD export size %d, want %d", nc.Size, size)
	}
	rng := rand.New(rand.NewPCG(3, 3))
	randomWrites(t, nc, model, rng, 24)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// TRIM of the first MiB (punched in the file), which then reads as zeroes from the model's
	// point of view only after WRITE_ZEROES; TRIM's contents are unspecified, so zero it too.
	const nbdCmdTrim, nbdCmdWriteZeroes = 4, 6
	for _, cmd := range []uint16{nbdCmdTrim, nbdCmdWriteZeroes} {
		if err := nc.Send(cmd, 0, 1<<20, nil); err != nil {
			t.Fatal(err)
		}
		if err := nc.Reply(nil); err != nil {
			t.Fatalf("NBD command %d: %v", cmd, err)
		}
	}
	clear(model[:1<<20])
	verifyAll(t, nc, model)

	// A run-time resize, saved to the file with config save (a rename; the file's owner kept);
	// discover (a probe login to the target and out again).
	mustCtl(sockT, "lun", "resize", "t1", "2", "--size", "8MiB")
	mustCtl(sockT, "config", "save")
	if out := mustCtl(sockI, "discover", "127.0.0.1:5555"); !strings.Contains(out, t1PortID) && !strings.Contains(out, strings.TrimPrefix(t1PortID, "0x")) {
		t.Errorf("srpctl discover does not name t1's port ID %s:\n%s", t1PortID, out)
	}

	// Stats on both sides and a metrics scrape (the process collector reads /proc).
	mustCtl(sockT, "lun", "stats", "t1", "1", "-o", "json", "--interval", "200ms")
	mustCtl(sockT, "session", "stats", "-o", "json", "--interval", "200ms")
	mustCtl(sockI, "connections", "c1")
	mustCtl(sockT, "status")
	if body := httpGet(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics)); !strings.Contains(body, "process_open_fds") {
		t.Fatal("the metrics lack process_open_fds")
	}

	// ExecReload= (the unit's command line, on this daemon's socket), traced: it runs under
	// the unit's filter. A change to the file; then an invalid file, refused with its error;
	// then SIGHUP on the initiator.
	trace := filepath.Join(dirT, "strace.srpctl")
	orig, err := os.ReadFile(cfgT)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, cfgT, strings.Replace(string(orig), "    luns:\n", "    luns:\n      - {id: 3, backend: ram, size: 4MiB}\n", 1))
	reload := append([]string{"--socket", sockT}, unitExecReload(t)...)
	if code, stdout, stderr := runTool(t, []string{straceBin, "-f", "-qq", "-c", "-U", "name,calls", "-o", trace, "--"}, srpctlBin, reload...); code != 0 {
		t.Fatalf("ExecReload= (srpctl %s): exit %d\n%s%s", strings.Join(reload, " "), code, stdout, stderr)
	}
	var luns ctlapi.LUNList
	if !jsonInto(mustCtl(sockT, "-o", "json", "lun", "list", "t1"), &luns) || len(luns.LUNs) != 4 {
		t.Fatalf("t1's LUNs after the reload: %+v", luns)
	}
	writeFile(t, cfgT, string(orig)+"colour: blue\n")
	if code, stdout, stderr := runTool(t, nil, srpctlBin, reload...); code == 0 || !strings.Contains(stderr, cfgT+":") {
		t.Fatalf("reload of an invalid file: exit %d, want non-zero and the file's error\n%s%s", code, stdout, stderr)
	}
	writeFile(t, cfgT, string(orig))
	if err := dI.srpd.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	nI.wait(t, "RELOADING=1", 60*time.Second)
	nI.wait(t, "READY=1", 60*time.Second)
	verifyAll(t, nc, model)
	nc.Close()

	// SIGTERM to both daemons (strace forwards nothing: srpd gets it by its own PID).
	for _, d := range []*tracedProc{dI, dT} {
		if err := d.srpd.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-d.Done:
		case <-time.After(120 * time.Second):
			t.Fatal("srpd did not exit within 2 minutes of SIGTERM")
		}
		if code := exitCode(d.Err); code != 0 {
			t.Fatalf("srpd exited %d after SIGTERM (strace passes srpd's status on)\n%s", code, d.out.String())
		}
	}

	used := map[string]map[string]bool{}
	for who, file := range map[string]string{"srpd (target)": traceT, "srpd (initiator)": traceI, "srpctl reload": trace} {
		names := straceNames(t, file)
		// strace worked: these happen in every run of each.
		for _, must := range []string{"execve", "futex", "write"} {
			if !names[must] {
				t.Fatalf("%s's strace summary lacks %s: %v", who, must, names)
			}
		}
		used[who] = names
	}
	// The scenario ran as meant: the initiator and the target talk over UDP (not softroce's
	// in-process loopback), accept control and NBD connections, and the target's file was
	// rewritten (--persist, config save: temporary file and rename).
	for _, who := range []string{"srpd (target)", "srpd (initiator)"} {
		for _, must := range []string{"sendmmsg", "recvmmsg", "accept4"} {
			if !used[who][must] {
				t.Errorf("%s did not call %s: the scenario did not run as meant", who, must)
			}
		}
	}
	if !used["srpd (target)"]["renameat"] {
		t.Error("srpd (target) did not call renameat: --persist and config save did not rewrite the file?")
	}
	for who, names := range used {
		var outside []string
		for n := range names {
			if !allowed[n] {
				outside = append(outside, n)
			}
		}
		slices.Sort(outside)
		if len(outside) > 0 {
			t.Errorf("%s made system calls outside srpd.service's SystemCallFilter= (%s): %s; "+
				"systemd would fail them with EPERM (SystemCallErrorNumber=). Allow them in the unit with a reason, or stop making them",
				who, filter, strings.Join(outside, " "))
		}
		all := slices.Sorted(func(yield func(string) bool) {
			for n := range names {
				if !yield(n) {
					return
				}
			}
		})
		t.Logf("%s: %d system calls: %s", who, len(all), strings.Join(all, " "))
	}
}

// needTool returns the path of name, or skips the test loudly (CI installs the Debian package
// pkg: .ci/run).
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		msg := fmt.Sprintf("SKIPPING %s: %s not found; install the Debian package %s (CI does)", t.Name(), name, pkg)
		fmt.Fprintln(os.Stderr, "!!! "+msg)
		t.Skip(msg)
	}
	return p
}

// unitFilter returns the SystemCallFilter= lines of systemd/srpd.service (joined, for
// messages) and the system calls they allow, as systemd builds the set: the first line
// without ~ makes an allow list (with @default, which systemd adds to every allow list),
// later lines add their system calls or, with ~, take them away; groups are expanded, nested
// ones too, by systemd-analyze syscall-filter.
func unitFilter(t *testing.T, analyze string) (string, map[string]bool) {
	t.Helper()
	unit, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	memo := map[string]map[string]bool{}
	var expand func(name string) map[string]bool
	expand = func(name string) map[string]bool {
		if !strings.HasPrefix(name, "@") {
			return map[string]bool{name: true}
		}
		if s, ok := memo[name]; ok {
			return s
		}
		_, out, stderr := runTool(t, nil, analyze, "syscall-filter", "--no-pager", name)
		s := map[string]bool{}
		lines := strings.Split(out, "\n")
		if len(lines) < 2 || strings.TrimSpace(lines[0]) != name {
			t.Fatalf("systemd-analyze syscall-filter %s: unexpected output\n%s%s", name, out, stderr)
		}
		for _, l := range lines[1:] {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				maps.Copy(s, expand(l))
			}
		}
		if len(s) == 0 {
			t.Fatalf("systemd-analyze syscall-filter %s lists no system call", name)
		}
		memo[name] = s
		return s
	}
	var lines []string
	var allowed map[string]bool
	for _, l := range strings.Split(string(unit), "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(l), "SystemCallFilter=")
		if !ok {
			continue
		}
		lines = append(lines, v)
		v, deny := strings.CutPrefix(v, "~")
		if allowed == nil {
			if deny {
				t.Fatalf("%s: the first SystemCallFilter= is a deny list; this test expects an allow list", unitFile)
			}
			allowed = maps.Clone(expand("@default"))
		}
		for _, name := range strings.Fields(v) {
			for n := range expand(name) {
				if deny {
					delete(allowed, n)
				} else {
					allowed[n] = true
				}
			}
		}
	}
	if allowed == nil {
		t.Fatalf("%s has no SystemCallFilter=", unitFile)
	}
	return strings.Join(lines, "; "), allowed
}

// releaseBinaries builds srpd and srpctl as make release does (CGO_ENABLED=0, no -race): the
// system calls of a cgo or race build differ from the packaged binaries'.
func releaseBinaries(t *testing.T) (srpd, srpctl string) {
	t.Helper()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testutil.GoTool(), "build", "-trimpath", "-o", dir+"/",
		"github.com/srpd/srpd/cmd/srpd", "github.com/srpd/srpd/cmd/srpctl")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build (CGO_ENABLED=0): %v\n%s", err, out)
	}
	return filepath.Join(dir, "srpd"), filepath.Join(dir, "srpctl")
}

// tracedProc is srpd under strace: Proc is strace's process (its exit status is srpd's);
// srpd, strace's child, is the one the test signals.
type tracedProc struct {
	*testutil.Proc
	srpd *os.Process
	out  *testutil.SyncBuffer
}

// startTraced starts `strace -f -qq -c -o summary -- bin args...` with NOTIFY_SOCKET and
// waits until strace's child runs bin.
func startTraced(t *testing.T, straceBin, summary string, n *notifySocket, bin string, args ...string) *tracedProc {
	t.Helper()
	p := &tracedProc{out: &testutil.SyncBuffer{}}
	cmd := exec.Command(straceBin, append([]string{"-f", "-qq", "-c", "-U", "name,calls", "-o", summary, "--", bin}, args...)...)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+n.path)
	cmd.Stdout, cmd.Stderr = p.out, p.out
	p.Proc = testutil.StartProc(t, cmd, func() string { return tail(p.out.String(), 100) })
	straceProc := cmd.Process
	var child int
	waitFor(t, 30*time.Second, "strace to start srpd", func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", straceProc.Pid, straceProc.Pid))
		if err != nil {
			return false
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return false
		}
		child, _ = strconv.Atoi(f[0])
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", child))
		return err == nil && exe == bin
	})
	proc, err := os.FindProcess(child)
	if err != nil {
		t.Fatal(err)
	}
	// The cleanup of StartProc kills strace; srpd, its child, is killed here first (by PID).
	t.Cleanup(func() {
		select {
		case <-p.Done:
		default:
			_ = proc.Kill()
		}
	})
	p.srpd = proc
	return p
}

// straceNames reads the system call names of a strace -c -U name,calls summary.
func straceNames(t *testing.T, file string) map[string]bool {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatalf("strace summary: %v", err)
	}
	defer f.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 || fields[0] == "syscall" || fields[0] == "total" || strings.HasPrefix(fields[0], "-") {
			continue
		}
		if _, err := strconv.Atoi(fields[1]); err != nil {
			t.Fatalf("%s: unexpected line %q", file, sc.Text())
		}
		names[fields[0]] = true
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// runTool runs prefix... bin args... (bounded) and returns its exit code and output.
func runTool(t *testing.T, prefix []string, bin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runCommand(t, 3*time.Minute, append(append(slices.Clone(prefix), bin), args...))
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// jsonInto decodes s into out and reports whether it could.
func jsonInto(s string, out any) bool { return json.Unmarshal([]byte(s), out) == nil }

// unitExecReload returns the arguments of srpd.service's ExecReload= after the srpctl binary.
func unitExecReload(t *testing.T) []string {
	t.Helper()
	unit, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(l, "ExecReload="); ok {
			f := strings.Fields(v)
			if len(f) < 2 || filepath.Base(f[0]) != "srpctl" {
				t.Fatalf("%s: ExecReload=%s does not run srpctl", unitFile, v)
			}
			return f[1:]
		}
	}
	t.Fatalf("%s has no ExecReload=", unitFile)
	return nil
}

// TestSyscallFilterGoRuntime: every system call Go's runtime has (the SYS_ numbers of
// runtime/sys_linux_GOARCH.s), including those a run of TestSyscallFilter may not reach (thread
// exit, profiling timers, ...), is allowed by srpd.service's SystemCallFilter=, but mincore:
// os_linux.go sysauxv uses it only when the kernel gave no auxiliary vector and
// /proc/self/auxv cannot be read (Android), never for a program the kernel started.
func TestSyscallFilterGoRuntime(t *testing.T) {
	analyze := needTool(t, "systemd-analyze", "systemd")
	filter, allowed := unitFilter(t, analyze)
	goroot := filepath.Dir(filepath.Dir(testutil.GoTool()))
	src := filepath.Join(goroot, "src", "runtime", "sys_linux_"+runtime.GOARCH+".s")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Skipf("SKIPPED: the runtime's source is not here: %v", err)
	}
	names := regexp.MustCompile(`(?m)^#define SYS_(\w+)\s`).FindAllStringSubmatch(string(b), -1)
	if len(names) < 20 {
		t.Fatalf("%s: %d SYS_ defines; the pattern is out of date", src, len(names))
	}
	var outside []string
	for _, m := range names {
		// go:src/runtime/sys_linux_amd64.s spells setitimer (38) SYS_setittimer.
		n := strings.Replace(m[1], "setittimer", "setitimer", 1)
		if n != "mincore" && !allowed[n] {
			outside = append(outside, n)
		}
	}
	if len(outside) > 0 {
		t.Errorf("Go's runtime (%s) has system calls outside srpd.service's SystemCallFilter= (%s): %s", src, filter, strings.Join(outside, " "))
	}
}
