// Package config is srpd's configuration schema: the YAML file of `srpd -c /etc/srpd/srpd.yaml`
// and the bodies of the control API, which use the same types and field names.
//
// Decoding is strict: unknown fields, duplicate keys and values of the wrong kind are errors,
// and every problem in a file is reported at once as an ErrorList whose entries name the file,
// the line and the field path:
//
//	srpd.yaml:14: targets[0].luns[1].size: 65000 must be a multiple of the block size (4096)
//
// Sizes take units (64MiB, 1GiB), durations Go syntax (10s, 1m30s), initiator timeouts also
// "off". Parse and Load apply the defaults explicitly (SetDefaults) and validate; Marshal writes
// a configuration back with every default spelled out, and AtomicWrite/Save persist it safely.
// Diff compares two configurations for a reload that applies only what changed.
//
// See configs/srpd.reference.yaml for every option, documented.
package config
