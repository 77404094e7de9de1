// Package ctlapi is srpd's control API: versioned JSON over HTTP on the daemon's unix socket
// (/run/srpd/srpd.sock by default), spoken by srpctl.
//
// Routes (all under /v1/; mutating calls take ?persist=1 to also rewrite the config file):
//
//	GET    /v1/status                              Status
//	GET    /v1/targets                             TargetList
//	POST   /v1/targets                 config.Target → 201 TargetInfo
//	GET    /v1/targets/{target}                    TargetInfo
//	DELETE /v1/targets/{target}[?force=1]          204 (force: also when sessions are logged in)
//	GET    /v1/targets/{target}/luns               LUNList
//	POST   /v1/targets/{target}/luns   config.LUN → 201 LUNInfo
//	DELETE /v1/targets/{target}/luns/{lun}         204
//	GET    /v1/targets/{target}/acls               ACLList
//	POST   /v1/targets/{target}/acls   config.ACL → 201 ACLInfo
//	DELETE /v1/targets/{target}/acls/{initiator}   204 ({initiator}: port ID or *)
//	GET    /v1/sessions[?target=name]              SessionList (initiators logged in to our targets)
//	GET    /v1/sessions/{id}                       SessionInfo
//	DELETE /v1/sessions/{id}                       204 (kill: log the initiator out)
//	GET    /v1/stats[?target=name]                 Stats (I/O counters of LUNs and sessions)
//	GET    /v1/connections                         ConnectionList (our initiator sessions)
//	POST   /v1/connections             config.Session → 201 ConnectionInfo (connect)
//	GET    /v1/connections/{name}                  ConnectionInfo
//	DELETE /v1/connections/{name}                  204 (disconnect)
//	POST   /v1/reload                              ReloadResult (re-read the config file)
//
// Request bodies are the config package's types in JSON, decoded strictly (unknown fields are
// errors) and validated before the Service sees them. Every error is the body
//
//	{"error": {"code": "not_found", "message": "target \"x\": not found", "details": [...]}}
//
// with the HTTP status of its code (see Code). Handler serves the routes over a Service, which
// the daemon implements; Client calls them and returns typed errors: ErrDaemonNotRunning,
// ErrPermission, and *APIError (errors.Is(err, ErrNotFound) and friends work on it).
package ctlapi
