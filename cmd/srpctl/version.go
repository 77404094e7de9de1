package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/srpd/srpd/internal/ctlapi"
)

// version is set at build time (make release: -ldflags "-X main.version=$(git describe --always
// --dirty)"); empty: the module version of the build info ("(devel)" in a source tree).
var version string

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.Main.Version
	}
	return "unknown"
}

// versionInfo is `srpctl version -o json`: the client's build and, when the daemon answers,
// the daemon's.
type versionInfo struct {
	Client clientVersion  `json:"client"`
	Daemon *daemonVersion `json:"daemon,omitempty"`
	// DaemonError says why the daemon's version is missing (not running, no access, ...).
	DaemonError string `json:"daemon_error,omitempty"`
}

type clientVersion struct {
	Version   string `json:"version"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
}

type daemonVersion struct {
	Version    string `json:"version"`
	APIVersion int    `json:"api_version"`
	PID        int    `json:"pid"`
	Socket     string `json:"socket"`
}

// newVersionCmd is `srpctl version`: both sides' versions, as kubectl version does. A daemon
// that does not answer is reported, not an error: the client's version is still useful then.
func newVersionCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Show srpctl's version and the running srpd's",
		Args:  args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := versionInfo{Client: clientVersion{Version: versionString(), GoVersion: runtime.Version(),
				Platform: runtime.GOOS + "/" + runtime.GOARCH}}
			err := a.call(cmd, func(ctx context.Context, c *ctlapi.Client) error {
				st, err := c.Status(ctx)
				if err == nil {
					v.Daemon = &daemonVersion{Version: st.Version, APIVersion: st.APIVersion, PID: st.PID, Socket: a.socket}
				}
				return err
			})
			if err != nil {
				v.DaemonError = err.Error()
			}
			if a.structured() {
				return a.printData(v)
			}
			fmt.Fprintf(a.stdout, "Client: srpctl %s (%s, %s)\n", v.Client.Version, v.Client.GoVersion, v.Client.Platform)
			if v.Daemon != nil {
				fmt.Fprintf(a.stdout, "Daemon: srpd %s (pid %d, API v%d, %s)\n", v.Daemon.Version, v.Daemon.PID, v.Daemon.APIVersion, a.socket)
			} else {
				fmt.Fprintf(a.stdout, "Daemon: not reachable: %s\n", v.DaemonError)
			}
			return nil
		},
	}
}
