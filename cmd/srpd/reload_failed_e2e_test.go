package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/srpd/srpd/internal/ctlapi"
	"github.com/srpd/srpd/internal/testutil"
)

// TestReloadWithFailuresExitsNonZero: a reload whose new configuration is valid but whose new
// target cannot start (its file LUN does not exist and is not to be created) runs what it can,
// and `srpctl reload` (the unit's ExecReload=) exits 1 naming the failure, so that systemctl
// reload does not report success; the daemon keeps running and status shows the failure.
func TestReloadWithFailuresExitsNonZero(t *testing.T) {
	dir := testutil.ShortTempDir(t, "srpd-")
	sock := filepath.Join(dir, "ctl.sock")
	cfgPath := filepath.Join(dir, "srpd.yaml")
	base := minimalConfig(dir, testutil.FreeUDPPort(t), sock)
	if err := os.WriteFile(cfgPath, []byte(base), 0o600); err != nil {
		t.Fatal(err)
	}
	n := newNotifySocket(t, dir)
	startDaemon(t, cfgPath, n)
	n.wait(t, "READY=1", 60*time.Second)

	broken := strings.Replace(base, "control:\n", `  - name: missing
    port_id: 0x00000000000000050000000000000005
    cm_port: 5599
    luns:
      - {id: 0, backend: file, path: `+filepath.Join(dir, "no", "such.img")+`}
control:
`, 1)
	if broken == base {
		t.Fatal("could not add a target to the configuration")
	}
	if err := os.WriteFile(cfgPath, []byte(broken), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := srpctl(t, sock, "reload")
	if code != 1 || !strings.Contains(stdout, "target missing added") || !strings.Contains(stderr, "did not start") ||
		!strings.Contains(stderr, "missing") {
		t.Fatalf("srpctl reload with a target that cannot start: exit %d\n%s%s", code, stdout, stderr)
	}
	var st ctlapi.Status
	mustSrpctl(t, sock, &st, "-o", "json", "status")
	if st.Targets != 2 || st.Health == nil || st.Health.State != ctlapi.HealthDegraded {
		t.Fatalf("status after the partial reload: %+v", st)
	}
}
