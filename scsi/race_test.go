//go:build race

package scsi

const raceEnabled = true
