// Package target is the SRP target: listeners, login and ACLs, channels, credits, command
// dispatch to scsi LUNs and task management. It is the only place where SRP meets SCSI.
package target
