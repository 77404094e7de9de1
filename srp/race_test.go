//go:build race

package srp

const raceEnabled = true
