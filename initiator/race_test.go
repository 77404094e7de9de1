//go:build race

package initiator

const raceEnabled = true
