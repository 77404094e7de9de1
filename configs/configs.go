// Package configs holds srpd's example configurations, embedded so that the daemon (srpd demo)
// and tests can use them without knowing where the source tree is.
package configs

import "embed"

// files are the *.yaml files of this directory.
//
//go:embed *.yaml
var files embed.FS

// FS returns the example configurations (read-only).
func FS() embed.FS { return files }

// Demo returns the loopback demo configuration (demo-loopback.yaml): softroce on 127.0.0.1, one
// RAM-backed LUN, and an initiator session to it with an NBD export.
func Demo() []byte {
	b, err := files.ReadFile(DemoFile)
	if err != nil {
		panic("configs: " + err.Error()) // embedded at build time; cannot be missing
	}
	return b
}

// DemoFile is the name of the loopback demo configuration.
const DemoFile = "demo-loopback.yaml"
