//go:build verbs

package config

// VerbsSupported reports whether this build has the verbs transport (build tag "verbs").
const VerbsSupported = true
