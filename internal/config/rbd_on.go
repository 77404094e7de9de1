//go:build rbd && cgo

package config

// RBDSupported reports whether this build has the rbd LUN backend (build tag "rbd", with cgo).
const RBDSupported = true
