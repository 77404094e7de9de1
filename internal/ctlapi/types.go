package ctlapi

import (
	"context"
	"time"

	"github.com/srpd/srpd/internal/config"
)

// APIVersion is the version of this API; routes live under /v1/.
const APIVersion = 1

// VersionHeader carries APIVersion on every response.
const VersionHeader = "Srpd-Api-Version"

// Service is what the daemon implements for Handler: one method per route. Bodies arrive
// decoded, defaulted (SetDefaults) and validated on their own; the Service checks them against
// the running configuration (transport references, uniqueness), applies them, and persists the
// configuration when asked. Errors should wrap this package's sentinels (ErrNotFound,
// ErrAlreadyExists, ErrConflict, ErrInvalidArgument, ErrUnsupported, ErrUnavailable) or the config
// package's (config.ErrNotFound, config.ErrExists, config.ErrInUse, a config.ErrorList), which
// Handler maps to codes; anything else is an internal error.
type Service interface {
	Status(ctx context.Context) (*Status, error)

	ListTargets(ctx context.Context) ([]TargetInfo, error)
	GetTarget(ctx context.Context, name string) (*TargetInfo, error)
	CreateTarget(ctx context.Context, t config.Target, opts MutateOptions) (*TargetInfo, error)
	DeleteTarget(ctx context.Context, name string, opts DeleteOptions) error

	ListLUNs(ctx context.Context, target string) ([]LUNInfo, error)
	AddLUN(ctx context.Context, target string, l config.LUN, opts MutateOptions) (*LUNInfo, error)
	RemoveLUN(ctx context.Context, target string, id int, opts MutateOptions) error

	ListACLs(ctx context.Context, target string) ([]ACLInfo, error)
	AddACL(ctx context.Context, target string, a config.ACL, opts MutateOptions) (*ACLInfo, error)
	RemoveACL(ctx context.Context, target string, initiator config.InitiatorID, opts MutateOptions) error

	ListSessions(ctx context.Context, filter SessionFilter) ([]SessionInfo, error)
	GetSession(ctx context.Context, id string) (*SessionInfo, error)
	KillSession(ctx context.Context, id string) error

	ListConnections(ctx context.Context) ([]ConnectionInfo, error)
	GetConnection(ctx context.Context, name string) (*ConnectionInfo, error)
	Connect(ctx context.Context, s config.Session, opts MutateOptions) (*ConnectionInfo, error)
	Disconnect(ctx context.Context, name string, opts MutateOptions) error

	Reload(ctx context.Context) (*ReloadResult, error)
}

// MutateOptions apply to every call that changes the configuration.
type MutateOptions struct {
	// Persist also writes the new configuration to the daemon's config file (?persist=1).
	Persist bool
}

// DeleteOptions apply to target deletion.
type DeleteOptions struct {
	Persist bool
	// Force deletes the target even while initiators are logged in (they are logged out);
	// without it that is ErrConflict.
	Force bool
}

// SessionFilter narrows ListSessions.
type SessionFilter struct {
	// Target: only sessions of this target ("" = all).
	Target string
}

// Status describes the daemon.
type Status struct {
	// Version is the daemon's build version.
	Version    string    `json:"version"`
	APIVersion int       `json:"api_version"`
	PID        int       `json:"pid"`
	StartedAt  time.Time `json:"started_at"`
	// ConfigPath is the file the daemon was started with (-c), reloads from and persists to.
	ConfigPath string          `json:"config_path"`
	Transports []TransportInfo `json:"transports"`
	// Counts of targets, target-side sessions and initiator connections.
	Targets     int `json:"targets"`
	Sessions    int `json:"sessions"`
	Connections int `json:"connections"`
	// Health sums up what does not run as configured; nil from a daemon that does not tell.
	Health *Health `json:"health,omitempty"`
}

// Health states.
const (
	HealthOK       = "ok"
	HealthDegraded = "degraded"
)

// Health is what does not run as configured.
type Health struct {
	// State is HealthOK when every configured object runs, else HealthDegraded.
	State string `json:"state"`
	// Failed are the configured objects that do not run: transports, targets, the metrics
	// listener, and our initiator sessions (connections) failing to log in.
	Failed []FailedObject `json:"failed"`
	// FailingLogins counts the connections among Failed: retrying their login.
	FailingLogins int `json:"failing_logins"`
}

// FailedObject is a configured object that does not run.
type FailedObject struct {
	// Kind is transport, target, session (a connection) or metrics.
	Kind  string `json:"kind"`
	Name  string `json:"name,omitempty"`
	Error string `json:"error"`
	// NextRetryAt is when a connection tries to log in again.
	NextRetryAt time.Time `json:"next_retry_at,omitzero"`
}

// TransportInfo is one transport's state.
type TransportInfo struct {
	Name   string `json:"name"`
	Driver string `json:"driver"`
	// Device is the RDMA device (verbs) or the softroce device's name.
	Device string `json:"device,omitempty"`
	// Addresses the transport is bound to.
	Addresses []string `json:"addresses,omitempty"`
	State     string   `json:"state"` // up, down, error
	Error     string   `json:"error,omitempty"`
}

// Object states reported by the daemon.
const (
	StateUp           = "up"
	StateDown         = "down"
	StateError        = "error"
	StateListening    = "listening"
	StateLoggedIn     = "logged-in"
	StateConnecting   = "connecting"
	StateRunning      = "running"   // scsi_transport_srp rport states, for connections
	StateBlocked      = "blocked"   // link lost, I/O queued, reconnecting
	StateFailFast     = "fail-fast" // fast_io_fail_tmo expired: I/O fails, still reconnecting
	StateLost         = "lost"      // dev_loss_tmo expired
	StateDisconnected = "disconnected"
)

// TargetInfo is a target, its configuration and its state.
type TargetInfo struct {
	Name      string        `json:"name"`
	Transport string        `json:"transport"`
	PortID    config.PortID `json:"port_id"`
	// Listen are the addresses (ip:port) the target accepts connections on.
	Listen []string      `json:"listen"`
	State  string        `json:"state"`
	Error  string        `json:"error,omitempty"`
	LUNs   []LUNInfo     `json:"luns"`
	ACLs   []ACLInfo     `json:"acls"`
	Limits config.Limits `json:"limits"`
	// Sessions is the number of initiators logged in.
	Sessions int `json:"sessions"`
	// Spec is the target's configuration as srpd runs it (run-time changes included): the
	// object `srpctl target create -f` and POST /v1/targets take; the fields above are its
	// status.
	Spec *config.Target `json:"spec,omitempty"`
}

// LUNInfo is a LUN's configuration and state.
type LUNInfo struct {
	config.LUN
	// Capacity is the backend's size in bytes (for a file without size, its size).
	Capacity int64  `json:"capacity"`
	State    string `json:"state"`
	Error    string `json:"error,omitempty"`
}

// ACLInfo is an ACL and how many sessions use it.
type ACLInfo struct {
	config.ACL
	Sessions int `json:"sessions"`
}

// IOStats counts a session's or connection's commands.
type IOStats struct {
	Commands     uint64 `json:"commands"`
	ReadBytes    uint64 `json:"read_bytes"`
	WriteBytes   uint64 `json:"write_bytes"`
	Errors       uint64 `json:"errors"`
	TaskMgmt     uint64 `json:"task_mgmt"`
	CreditStalls uint64 `json:"credit_stalls"`
}

// SessionInfo is an initiator logged in to one of our targets (an I_T nexus with its channels).
type SessionInfo struct {
	// ID identifies the session in /v1/sessions/{id}; URL-safe. srpd writes TARGET.N, N
	// unique for the daemon's lifetime (a session after a target restart gets a new N).
	ID        string        `json:"id"`
	Target    string        `json:"target"`
	Initiator config.PortID `json:"initiator"`
	// Remote is the initiator's address.
	Remote   string `json:"remote"`
	Channels int    `json:"channels"`
	// QueueDepth is the credits granted per channel.
	QueueDepth    int       `json:"queue_depth"`
	MaxITIULen    int       `json:"max_it_iu_len"`
	MaxTIIULen    int       `json:"max_ti_iu_len"`
	ImmediateData bool      `json:"immediate_data"`
	ReadOnly      bool      `json:"read_only"`
	LUNs          []int     `json:"luns"` // visible through the ACL
	State         string    `json:"state"`
	LoginAt       time.Time `json:"login_at"`
	Stats         IOStats   `json:"stats"`
}

// RemoteLUN is a LUN seen through an initiator connection.
type RemoteLUN struct {
	LUN       int    `json:"lun"`
	Capacity  int64  `json:"capacity"`
	BlockSize int    `json:"block_size"`
	ReadOnly  bool   `json:"read_only"`
	Vendor    string `json:"vendor,omitempty"`
	Product   string `json:"product,omitempty"`
	NBDSocket string `json:"nbd_socket,omitempty"`
}

// ConnectionInfo is one of our initiator sessions to a remote target.
type ConnectionInfo struct {
	Name            string        `json:"name"`
	Address         string        `json:"address"` // host:port
	TargetPortID    config.PortID `json:"target_port_id"`
	InitiatorPortID config.PortID `json:"initiator_port_id"`
	State           string        `json:"state"`
	Error           string        `json:"error,omitempty"`
	Channels        int           `json:"channels"`
	QueueDepth      int           `json:"queue_depth"`
	// FailedReconnects counts reconnect attempts since the link was lost.
	FailedReconnects int `json:"failed_reconnects"`
	// NextRetryAt is when the daemon logs in again after a failed login (zero while logged
	// in or trying).
	NextRetryAt time.Time   `json:"next_retry_at,omitzero"`
	ConnectedAt time.Time   `json:"connected_at,omitzero"`
	LUNs        []RemoteLUN `json:"luns"`
	Stats       IOStats     `json:"stats"`
	// Config is the session's configuration (timeouts and all).
	Config config.Session `json:"config"`
	// Paths: the connection is a path of these multipath LUNs (multipath:), with its state
	// there; empty for a connection in no multipath group.
	Paths []ConnectionPath `json:"paths,omitempty"`
}

// ReloadResult tells what a reload changed (or, with DryRun, would change).
type ReloadResult struct {
	// Changes has one line per change ("target demo: LUN 1 added"); empty: nothing changed.
	Changes []string          `json:"changes"`
	Diff    *config.Changeset `json:"diff,omitempty"`
	// DryRun: nothing was applied (ReloadOptions.DryRun).
	DryRun bool `json:"dry_run,omitempty"`
	// Discarded has one line per run-time change (made without --persist) that the reload
	// undoes, or would undo; set by daemons that implement ConfigService.
	Discarded []string `json:"discarded,omitempty"`
	// Plans say, for each changed target, whether it was restarted (and why) or changed live
	// (config.PlanTargets).
	Plans []config.TargetPlan `json:"plans,omitempty"`
	// Failed has one line per object of the new configuration that did not start (it runs
	// the new configuration otherwise, and srpctl status shows the failures): srpctl reload
	// then exits 1, so that systemctl reload reports it.
	Failed []string `json:"failed,omitempty"`
}

// List bodies: lists are wrapped in an object so that fields can be added later.
type (
	TargetList struct {
		Targets []TargetInfo `json:"targets"`
	}
	LUNList struct {
		LUNs []LUNInfo `json:"luns"`
	}
	ACLList struct {
		ACLs []ACLInfo `json:"acls"`
	}
	SessionList struct {
		Sessions []SessionInfo `json:"sessions"`
	}
	ConnectionList struct {
		Connections []ConnectionInfo `json:"connections"`
	}
)

// MultipathInfo is a multipath group of our initiator (GET /v1/multipath): its LUNs and, for
// each, its paths.
type MultipathInfo struct {
	Name     string         `json:"name"`
	Sessions []string       `json:"sessions"`
	LUNs     []MultipathLUN `json:"luns"`
}

// MultipathLUN is one LUN of a multipath group.
type MultipathLUN struct {
	LUN       int             `json:"lun"`
	Capacity  int64           `json:"capacity"`
	BlockSize int             `json:"block_size"`
	NBDSocket string          `json:"nbd_socket,omitempty"`
	Paths     []MultipathPath `json:"paths"`
}

// MultipathPath is one path of a multipath LUN: its session, whether it is usable and the
// one I/O goes to, its target port group's asymmetric access state, and its I/O counts.
type MultipathPath struct {
	Session   string `json:"session"`
	Up        bool   `json:"up"`
	Active    bool   `json:"active"`
	Group     int    `json:"group"` // target port group; -1: unknown (no ALUA)
	ALUAState string `json:"alua_state"`
	Why       string `json:"why,omitempty"` // why it is not up
	IOs       uint64 `json:"ios"`
	Failures  uint64 `json:"failures"` // I/Os that failed on it and went to another path
}

// MultipathList is the body of GET /v1/multipath.
type MultipathList struct {
	Multipath []MultipathInfo `json:"multipath"`
}

// ConnectionPath is a connection's role in one multipath LUN.
type ConnectionPath struct {
	Multipath string `json:"multipath"`
	LUN       int    `json:"lun"`
	MultipathPath
}
