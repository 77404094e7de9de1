//go:build race

package mpath_test

const raceEnabled = true
