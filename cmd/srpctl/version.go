package main

import "runtime/debug"

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
