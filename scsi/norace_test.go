//go:build !race

package scsi

const raceEnabled = false
