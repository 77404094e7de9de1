// Package stack builds srpd's running objects from configuration values (package
// internal/config): an RDMA device for a config.Transport (the embedded softroce engine on a UDP
// socket, or a kernel verbs device), the logical units of a config.LUN, an SRP target port
// listening on a transport for a config.Target, an initiator session for a config.Session and
// the NBD exports of its config.NBDExport entries.
//
// It is the one place that knows how configuration becomes a running stack. The daemon
// (internal/daemon) adds the life cycle around it: diffs and reloads, the control API, metrics,
// reconnecting sessions. `srpd demo` and bench/cmd/srpbench build the same objects the same way
// with a configuration made in code. Nothing here applies configuration defaults or validates:
// callers pass values that went through config.SetDefaults and Validate, or that they built on
// purpose (a zero softroce udp_port binds an ephemeral port, for the demo and benchmarks).
//
// The pieces are independent: OpenTransport, OpenLUN, StartTarget, Dial and ServeNBD. Each
// returns an object with a bounded Close or Stop; none starts a goroutine that outlives it.
package stack
