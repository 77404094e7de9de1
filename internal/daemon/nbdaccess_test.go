package daemon

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/srpd/srpd/internal/config"
	"github.com/srpd/srpd/internal/ctlapi"
)

// TestNBDSocketAccess: an NBD export's socket gets the configured group and the default mode
// 0660, so a user in that group who is not root (a hypervisor's user, say) connects with a real
// NBD client (nbdinfo), and a user outside it cannot. The test creates the group and both users
// and removes them.
func TestNBDSocketAccess(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: needs root (creates a group and two users)")
	}
	for _, tool := range []string{"groupadd", "useradd", "userdel", "groupdel", "nbdinfo"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("SKIPPED: %s not found (nbdinfo: Debian's libnbd-bin; the others: passwd)", tool)
		}
	}
	suffix := strconv.Itoa(os.Getpid() % 100000)
	group, in, out := "srpdtg"+suffix, "srpdti"+suffix, "srpdto"+suffix
	run := func(args ...string) {
		t.Helper()
		if b, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, b)
		}
	}
	run("groupadd", group)
	t.Cleanup(func() { _ = exec.Command("groupdel", group).Run() })
	run("useradd", "-M", "-N", "-s", "/usr/sbin/nologin", "-G", group, in)
	t.Cleanup(func() { _ = exec.Command("userdel", in).Run() })
	run("useradd", "-M", "-N", "-s", "/usr/sbin/nologin", out)
	t.Cleanup(func() { _ = exec.Command("userdel", out).Run() })
	grp, err := user.LookupGroup(group)
	if err != nil {
		t.Fatal(err)
	}
	gid, _ := strconv.Atoi(grp.Gid)

	h := startHarness(t)
	// The test's directory must be traversable by the users (srpd's /run/srpd is, by its
	// tmpfiles entry); the socket's own mode and group are what is tested.
	if err := os.Chmod(h.dir, 0o711); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(h.dir, "g.nbd")
	pa, _ := config.ParsePortID(portA)
	s := config.Session{Name: "g", Address: "127.0.0.1", TargetPortID: pa, InitiatorExt: 9,
		NBD: []config.NBDExport{{LUN: 0, Socket: sock, Group: group}}}
	s.SetDefaults()
	if _, err := h.c.Connect(h.ctx(), s, ctlapi.MutateOptions{}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o660 || int(st.Gid) != gid {
		t.Fatalf("socket %s: mode %v group %d, want 0660 and %s (%d)", sock, fi.Mode().Perm(), st.Gid, group, gid)
	}
	nbdinfo := func(name string, groups []uint32) (string, error) {
		u, err := user.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		pgid, _ := strconv.Atoi(u.Gid)
		cmd := exec.Command("nbdinfo", "--size", "nbd+unix:///?socket="+sock)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(pgid), Groups: groups}}
		b, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(b)), err
	}
	size, err := nbdinfo(in, []uint32{uint32(gid)})
	if err != nil || size != fmt.Sprint(4<<20) {
		t.Fatalf("nbdinfo as %s (in group %s): %q, %v; want the LUN's size %d", in, group, size, err, 4<<20)
	}
	if msg, err := nbdinfo(out, nil); err == nil || !strings.Contains(strings.ToLower(msg), "permission denied") {
		t.Fatalf("nbdinfo as %s (not in group %s): %q, %v; want permission denied", out, group, msg, err)
	}
}
