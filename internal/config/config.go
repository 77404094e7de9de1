package config

import "time"

// Defaults applied by SetDefaults. Zero (or omitted) fields select them.
const (
	DefaultVersion = 1

	DefaultDriver       = DriverSoftRoCE
	DefaultUDPPort      = 4791 // IANA RoCEv2
	DefaultSocketBuffer = Size(4 << 20)
	// MaxQueues is the most receive queues a softroce transport may have (link.MaxQueues).
	MaxQueues          = 64
	DefaultSoftRoCEMTU = 4096
	// DefaultBusyPoll is a target-only softroce transport's receive busy poll (Transport.BusyPoll).
	DefaultBusyPoll = 50 * time.Microsecond
	// MaxBusyPoll bounds Transport.BusyPoll.
	MaxBusyPoll      = time.Millisecond
	DefaultVerbsPort = 1

	DefaultCMPort = 5555 // the RDMA CM port ib_srpt users configure (blktests, docs)

	DefaultBlockSize = 512

	DefaultMaxChannels = 8
	// DefaultTargetQueueDepth is the per-channel request limit (credits) granted at login,
	// ib_srpt's min(128, max_qp_wr).
	DefaultTargetQueueDepth = 128
	// DefaultMaxITIULen is ib_srpt's srp_max_req_size default: max(48+16+20+128×16, 80+4+8192).
	DefaultMaxITIULen = 8276
	// DefaultMaxTIIULen bounds the IUs the target sends (SRP_RSP with sense data, CRED_REQ,
	// AER_REQ), ib_srpt's srp_max_rsp_size default.
	DefaultMaxTIIULen = 256

	DefaultSessionPort       = DefaultCMPort
	DefaultChCount           = 1
	DefaultSessionQueueDepth = 64 // ib_srp queue_size default
	DefaultConnectTimeout    = Duration(10 * time.Second)
	// ib_srp module parameter defaults.
	DefaultReconnectDelay = 10 * time.Second
	DefaultFastIOFailTmo  = 15 * time.Second
	DefaultDevLossTmo     = 600 * time.Second
	// NBD export limits: initiator/nbd's DefaultMaxConnections and DefaultWriteTimeout.
	DefaultNBDMaxConnections = 64
	DefaultNBDWriteTimeout   = 30 * time.Second
	// MaxNBDConnections bounds max_connections: beyond it the reserve of the export's buffer
	// budget kept for light connections (256 MiB / 4 / max_connections) gets too small to help.
	MaxNBDConnections = 4096

	DefaultControlSocket = "/run/srpd/srpd.sock"
	DefaultControlMode   = FileMode(0o660)
	DefaultNBDSocketMode = FileMode(0o660)

	DefaultLogLevel  = "info"
	DefaultLogFormat = "auto"
)

// Transport drivers.
const (
	// DriverSoftRoCE is the embedded pure-Go RoCEv2 engine over UDP.
	DriverSoftRoCE = "softroce"
	// DriverVerbs is libibverbs/librdmacm (hardware RNICs, kernel rxe), build tag "verbs".
	DriverVerbs = "verbs"
)

// Backends of a LUN.
const (
	BackendRAM      = "ram"
	BackendFile     = "file"
	BackendBlockDev = "blockdev"
	// BackendRBD is a Ceph RBD image through librbd (build tag "rbd").
	BackendRBD = "rbd"
)

// Defaults of an rbd LUN's RBD settings.
const (
	DefaultRBDClusterConfig = "/etc/ceph/ceph.conf"
	DefaultRBDClient        = "client.admin"
)

// Config is the whole srpd configuration (srpd -c /etc/srpd/srpd.yaml). Parse and Load return
// it with defaults applied and validated; a Config built in code should go through SetDefaults
// and Validate before use. The same types are the bodies of the control API, so YAML and JSON
// use the same field names.
type Config struct {
	// Version of the schema; 1 (the default) is the only one.
	Version    int         `yaml:"version" json:"version"`
	Transports []Transport `yaml:"transports,omitempty" json:"transports,omitempty"`
	Targets    []Target    `yaml:"targets,omitempty" json:"targets,omitempty"`
	Sessions   []Session   `yaml:"sessions,omitempty" json:"sessions,omitempty"`
	// Multipath groups sessions to several target ports of one logical unit (gateways).
	Multipath []Multipath `yaml:"multipath,omitempty" json:"multipath,omitempty"`
	Control   Control     `yaml:"control" json:"control"`
	Logging   Logging     `yaml:"logging" json:"logging"`
	Metrics   Metrics     `yaml:"metrics,omitempty" json:"metrics,omitempty"`
	// Limits are the daemon-wide resource bounds (admission control).
	Limits GlobalLimits `yaml:"limits,omitempty" json:"limits,omitempty"`

	// AllowedPaths, when not empty, are the only directories (absolute) whose files and
	// device nodes may be LUNs: a file or blockdev LUN path must lie beneath one of them, by
	// name and, once opened, by real path. Empty: any path srpd can open (but never srpd's own
	// files: its configuration, control socket, NBD sockets and run directory).
	AllowedPaths []string `yaml:"allowed_paths,omitempty" json:"allowed_paths,omitempty"`

	src *source // where the config was parsed from (positions for Validate); nil if built in code
}

// Transport is an RDMA device srpd runs targets and sessions on.
type Transport struct {
	// Name is how targets and sessions refer to the transport.
	Name string `yaml:"name" json:"name"`
	// Driver is "softroce" (default) or "verbs". "verbs:<ibdev>" is shorthand for driver verbs
	// with that device.
	Driver string `yaml:"driver" json:"driver"`
	// Address (softroce) is the local IP address the engine binds UDP on; 0.0.0.0 or :: binds
	// every address. Exactly one of Address and Interface.
	Address string `yaml:"address,omitempty" json:"address,omitempty"`
	// Interface (softroce) binds the engine to a network interface's addresses instead.
	Interface string `yaml:"interface,omitempty" json:"interface,omitempty"`
	// UDPPort (softroce) is the RoCEv2 UDP port, 4791 by default. Linux rxe peers only speak
	// 4791; other values are for running several daemons on one host in tests.
	UDPPort int `yaml:"udp_port,omitempty" json:"udp_port,omitempty"`
	// SocketBuffer (softroce) is the UDP socket's SO_RCVBUF/SO_SNDBUF (default 4MiB).
	SocketBuffer Size `yaml:"socket_buffer,omitempty" json:"socket_buffer,omitempty"`
	// MTU is the largest RoCE path MTU to use: 256, 512, 1024, 2048 or 4096. softroce: default
	// 4096; a connection it dials offers at most what the local interface's MTU allows, as the
	// kernel computes it for rxe (1024 on a 1500-byte Ethernet link, 4096 on loopback).
	// verbs: default 0, the port's active MTU.
	MTU int `yaml:"mtu,omitempty" json:"mtu,omitempty"`
	// BusyPoll (softroce) is how long the engine's receive loop keeps polling its UDP socket
	// after finding it empty before it sleeps (link.UDPOptions.BusyPoll): "off", or a duration
	// up to 1ms. Omitted: DefaultBusyPoll on a transport that only serves targets (a storage
	// host, where the poll saves the wake-up on every command's critical path), off on one
	// that initiator sessions use (a compute host, whose CPU belongs to the applications).
	// The poll follows only a short run of packets (a lone command or its ACK), not a
	// pipelining peer's batch.
	BusyPoll *Timeout `yaml:"busy_poll,omitempty" json:"busy_poll,omitempty"`
	// KeepICRC (softroce) computes and checks the ICRC of every packet. Without it, the
	// connections between two srpd daemons leave it out in both directions (negotiated at
	// connection time; kernel peers never see the offer): their UDP checksum covers the same
	// bytes, and the CRC-32 of every byte was about a tenth of both ends' CPU time at 128 KiB.
	// Set it to read srpd-to-srpd traffic with a decoder that checks ICRCs (tshark).
	KeepICRC bool `yaml:"keep_icrc,omitempty" json:"keep_icrc,omitempty"`
	// Queues (softroce) is the number of receive queues, as a NIC has: UDP sockets on the one
	// port, the kernel steering each packet to the queue of its QP, each queue processing its
	// QPs on a goroutine of its own with a lock of its own, so that channels use several
	// CPUs. Channels are spread over the queues round robin; kernel peers see no difference.
	// 1..64; default 1.
	Queues int `yaml:"queues,omitempty" json:"queues,omitempty"`
	// PacketLifeTime (softroce) is the path packet life time the connections we dial offer
	// (REQ), which sets our QPs' local ACK timeout (about twice it): a peer that stops
	// answering is declared dead after 8 timeouts, failing the channel. Default: the kernel's
	// for RoCE (CMA_IBOE_PACKET_LIFETIME 18, about 1 s: channels fail after ~17 s). Multipath
	// initiators want it short (e.g. 100ms: ~2 s), so that I/O moves to another path soon.
	// Rounded up to 4.096 µs × 2^n; 1ms..4s.
	PacketLifeTime Duration `yaml:"packet_life_time,omitempty" json:"packet_life_time,omitempty"`
	// Device (verbs) is the RDMA device name (ibv_devices, `rdma link`), e.g. mlx5_0 or rxe0.
	Device string `yaml:"device,omitempty" json:"device,omitempty"`
	// Port (verbs) is the device port number, 1 by default.
	Port int `yaml:"port,omitempty" json:"port,omitempty"`
}

// Target is an SRP target port: a listener, its LUNs and who may log in.
type Target struct {
	Name string `yaml:"name" json:"name"`
	// Transport names the transport to listen on; may be omitted when exactly one is defined.
	Transport string `yaml:"transport,omitempty" json:"transport,omitempty"`
	// PortID is the target port identifier (id_ext then ioc_guid) initiators log in to.
	PortID PortID `yaml:"port_id" json:"port_id"`
	// Listen are the local IP addresses to accept RDMA CM connections on; empty: every address
	// of the transport.
	Listen []string `yaml:"listen,omitempty" json:"listen,omitempty"`
	// CMPort is the RDMA CM port (service ID in the TCP port space), 5555 by default.
	CMPort int `yaml:"cm_port" json:"cm_port"`
	// LUNs exported by this target.
	LUNs []LUN `yaml:"luns,omitempty" json:"luns,omitempty"`
	// ACLs name the initiators allowed to log in. Without any ACL no initiator may log in; an
	// ACL with initiator "*" admits every initiator no other ACL names.
	ACLs   []ACL  `yaml:"acls,omitempty" json:"acls,omitempty"`
	Limits Limits `yaml:"limits" json:"limits"`
	// ALUA, if set, puts the target's port in a target port group (see ALUA).
	ALUA *ALUA `yaml:"alua,omitempty" json:"alua,omitempty"`
}

// LUN is one logical unit of a target and its backend.
type LUN struct {
	// ID is the logical unit number, 0..16383.
	ID int `yaml:"id" json:"id"`
	// Backend is "ram", "file", "blockdev" or "rbd".
	Backend string `yaml:"backend" json:"backend"`
	// Path of the file (file) or block device node (blockdev); absolute.
	Path string `yaml:"path,omitempty" json:"path,omitempty"`
	// Size is the capacity: required for ram; for file the size the file must have (created
	// or extended sparsely, never shrunk), or omitted to export the file at its size; not
	// allowed for blockdev (the device's size). A multiple of BlockSize.
	Size Size `yaml:"size,omitempty" json:"size,omitempty"`
	// Create (file) creates the file when it does not exist; needs Size.
	Create bool `yaml:"create,omitempty" json:"create,omitempty"`
	// Direct (file, blockdev) adds O_DIRECT I/O for aligned requests.
	Direct bool `yaml:"direct,omitempty" json:"direct,omitempty"`
	// Shared (file) exports a file that other srpd gateways export too, as one logical unit
	// through several target ports (ALUA multipath: give them the same naa): the file is
	// locked shared instead of exclusive, so such exports coexist but no single-owner export
	// opens it. On one host the page cache keeps the gateways coherent; across hosts use a
	// cluster file system and direct.
	Shared bool `yaml:"shared,omitempty" json:"shared,omitempty"`
	// FollowSymlinks (file, blockdev) lets Path be or go through a symbolic link (such as
	// /dev/disk/by-id/...). Without it a path with a symlink in any component is refused,
	// so that whoever can write a directory on the way cannot redirect the LUN.
	FollowSymlinks bool `yaml:"follow_symlinks,omitempty" json:"follow_symlinks,omitempty"`
	// BlockSize is the logical block size: 512 (default) or 4096.
	BlockSize int `yaml:"block_size" json:"block_size"`
	// ReadOnly makes the LUN write-protected for every initiator.
	ReadOnly bool `yaml:"read_only,omitempty" json:"read_only,omitempty"`
	// Serial is the unit serial number (VPD page 0x80): printable ASCII, at most 64 bytes. It
	// also seeds the LUN's NAA identifier, so keep it stable. Empty: the daemon derives one
	// from the target's port ID and the LUN ID.
	Serial string `yaml:"serial,omitempty" json:"serial,omitempty"`
	// NAA is the logical unit's NAA designator in VPD page 0x83 (32 hex digits starting with
	// 6), which multipath initiators match paths by: gateways exporting one image give it the
	// same value. Omitted: derived from the serial, or for rbd from the image's
	// pool/namespace/image, which every gateway of one cluster derives alike.
	NAA string `yaml:"naa,omitempty" json:"naa,omitempty"`
	// ALUAStates override, for this LUN, the states of the target's ALUA groups (alua).
	ALUAStates []ALUAGroupState `yaml:"alua_states,omitempty" json:"alua_states,omitempty"`
	// RBD (rbd, required there) names the Ceph RBD image and how to reach its cluster. The
	// image must exist; its size is the LUN's capacity.
	RBD *RBD `yaml:"rbd,omitempty" json:"rbd,omitempty"`
}

// RBD is the Ceph RBD image of an rbd LUN.
type RBD struct {
	// ClusterConfig is the cluster's configuration file (monitor addresses, auth settings),
	// absolute; default /etc/ceph/ceph.conf.
	ClusterConfig string `yaml:"cluster_config" json:"cluster_config"`
	// Client is the cephx user srpd connects as, client.<id>; default client.admin.
	Client string `yaml:"client" json:"client"`
	// Keyring is the keyring file holding Client's key, absolute. Omitted: the cluster
	// configuration's keyring setting (by default /etc/ceph/ceph.<client>.keyring and others).
	Keyring string `yaml:"keyring,omitempty" json:"keyring,omitempty"`
	// Pool (required), Namespace (optional) and Image (required) name the image, as
	// pool[/namespace]/image does for the rbd tool.
	Pool      string `yaml:"pool" json:"pool"`
	Namespace string `yaml:"namespace,omitempty" json:"namespace,omitempty"`
	Image     string `yaml:"image" json:"image"`
	// ExclusiveLock is how srpd holds the image's exclusive lock: "managed" (default) takes it
	// on the first read or write, breaking (and so blocklisting) the current owner, and never
	// hands it over, so that when several gateways export the image a gateway that was taken
	// over is fenced and no write of it lands afterwards; "auto" leaves it to librbd, which
	// hands it over cooperatively to whichever client writes (no fencing of a live gateway).
	ExclusiveLock string `yaml:"exclusive_lock,omitempty" json:"exclusive_lock,omitempty"`
}

// RBD exclusive lock modes (RBD.ExclusiveLock).
const (
	RBDLockManaged = "managed"
	RBDLockAuto    = "auto"
)

// Spec is the image spec pool[/namespace]/image.
func (r *RBD) Spec() string {
	if r.Namespace != "" {
		return r.Pool + "/" + r.Namespace + "/" + r.Image
	}
	return r.Pool + "/" + r.Image
}

// ACL admits one initiator (or any, "*") to a target, optionally to some LUNs only.
type ACL struct {
	// Initiator is the initiator port ID (initiator_ext then port GUID), or "*".
	Initiator InitiatorID `yaml:"initiator" json:"initiator"`
	// LUNs masks the target's LUNs to those listed; empty: every LUN.
	LUNs []int `yaml:"luns,omitempty" json:"luns,omitempty"`
	// ReadOnly makes every LUN write-protected for this initiator.
	ReadOnly bool `yaml:"read_only,omitempty" json:"read_only,omitempty"`
}

// Limits bound what initiators may negotiate with a target.
type Limits struct {
	// MaxChannels is the most RDMA channels one I_T nexus may open (multichannel), 1..256.
	MaxChannels int `yaml:"max_channels" json:"max_channels"`
	// QueueDepth is the request limit granted per channel (SRP credits), 2..4096.
	QueueDepth int `yaml:"queue_depth" json:"queue_depth"`
	// MaxITIULen is the largest initiator-to-target IU accepted (MAX IT IU LEN), 996..1MiB.
	MaxITIULen Size `yaml:"max_it_iu_len" json:"max_it_iu_len"`
	// MaxTIIULen is the largest target-to-initiator IU sent (MAX TI IU LEN), 64..64KiB.
	MaxTIIULen Size `yaml:"max_ti_iu_len" json:"max_ti_iu_len"`
	// ImmediateData offers SRP-2 immediate data for writes (default true).
	ImmediateData *bool `yaml:"immediate_data" json:"immediate_data"`
	// RemoteInvalidate grants srpd initiators that offer it the remote-invalidation extension
	// (responses as SEND_WITH_INV, saving the initiator a LOCAL_INV per command; omitted: true).
	// Kernel initiators never offer it.
	RemoteInvalidate *bool `yaml:"remote_invalidate,omitempty" json:"remote_invalidate,omitempty"`
	// MaxSessions bounds the target's sessions (I_T nexuses); omitted: 1024. A login over it
	// gets SRP_LOGIN_REJ "insufficient resources".
	MaxSessions int `yaml:"max_sessions,omitempty" json:"max_sessions,omitempty"`
	// MaxRegisteredMemory bounds the memory the target's channels register (each channel:
	// (queue_depth + 1) × (max transfer + IU sizes)); omitted: only the daemon-wide bound.
	MaxRegisteredMemory Size `yaml:"max_registered_memory,omitempty" json:"max_registered_memory,omitempty"`
	// KeepaliveInterval is the liveness check of idle channels (a zero-length RDMA WRITE the
	// peer's RC transport must acknowledge): a peer gone without a DREQ is reaped about this
	// long after its last sign of life. Omitted: 30s; "off" disables it.
	KeepaliveInterval *Timeout `yaml:"keepalive_interval,omitempty" json:"keepalive_interval,omitempty"`
	// StallTimeout is how long a command may wait on the transport (RDMA transfers, the
	// response send) before its channel counts as stalled; backend time does not count.
	// Omitted: 60s; "off" disables it.
	StallTimeout *Timeout `yaml:"stall_timeout,omitempty" json:"stall_timeout,omitempty"`
	// StallAction is what a stalled channel does: "close" (default: torn down, so a broken
	// initiator hurts only its own session) or "log".
	StallAction string `yaml:"stall_action,omitempty" json:"stall_action,omitempty"`
}

// Stall actions.
const (
	StallClose = "close"
	StallLog   = "log"
)

// GlobalLimits bound what all targets of the daemon hold together, and the connection
// requests each source address may send. Omitted fields take the defaults named on each.
type GlobalLimits struct {
	// MaxSessions bounds the sessions of all targets; omitted: no bound beyond each target's.
	MaxSessions int `yaml:"max_sessions,omitempty" json:"max_sessions,omitempty"`
	// MaxSessionsPerInitiator bounds the sessions one initiator port ID has over all targets;
	// omitted: no bound.
	MaxSessionsPerInitiator int `yaml:"max_sessions_per_initiator,omitempty" json:"max_sessions_per_initiator,omitempty"`
	// MaxRegisteredMemory bounds the memory all channels register; omitted: half of the
	// machine's memory (MemTotal / 2).
	MaxRegisteredMemory Size `yaml:"max_registered_memory,omitempty" json:"max_registered_memory,omitempty"`
	// MaxPendingLogins bounds the logins waiting for their RTU (half-open), in total; omitted:
	// 256. At the bound, a new request evicts the oldest pending login of the busiest source.
	MaxPendingLogins int `yaml:"max_pending_logins,omitempty" json:"max_pending_logins,omitempty"`
	// MaxPendingLoginsPerSource bounds one source address's half-open logins; omitted: 32.
	MaxPendingLoginsPerSource int `yaml:"max_pending_logins_per_source,omitempty" json:"max_pending_logins_per_source,omitempty"`
	// LoginRatePerSource is the connection requests per second one source address may send
	// (bursts of 6× that); omitted: 50.
	LoginRatePerSource int `yaml:"login_rate_per_source,omitempty" json:"login_rate_per_source,omitempty"`
	// LoginTimeout bounds the wait for the RTU after our REP; it shrinks to 1s while more than
	// half of max_pending_logins are taken. Omitted: 10s.
	LoginTimeout Duration `yaml:"login_timeout,omitempty" json:"login_timeout,omitempty"`
}

// Session is an initiator connection to a remote SRP target, kept up by the daemon.
type Session struct {
	// Name identifies the connection (srpctl connect/disconnect).
	Name string `yaml:"name" json:"name"`
	// Transport names the local transport; may be omitted when exactly one is defined.
	Transport string `yaml:"transport,omitempty" json:"transport,omitempty"`
	// Address is the target's IP address or host name, Port its RDMA CM port (default 5555).
	Address string `yaml:"address" json:"address"`
	Port    int    `yaml:"port" json:"port"`
	// Source is the local IP address to connect from (ib_srp's src=); empty: routing decides.
	Source string `yaml:"source,omitempty" json:"source,omitempty"`
	// TargetPortID is the target port to log in to (id_ext then ioc_guid).
	TargetPortID PortID `yaml:"target_port_id" json:"target_port_id"`
	// InitiatorExt is bytes 0-7 of our initiator port ID (ib_srp's initiator_ext), hex.
	InitiatorExt ID64 `yaml:"initiator_ext" json:"initiator_ext"`
	// ChCount is the number of RDMA channels, 1..256 (default 1).
	ChCount int `yaml:"ch_count" json:"ch_count"`
	// QueueDepth is the requests in flight per channel (ib_srp's queue_size), 2..4096.
	QueueDepth int `yaml:"queue_depth" json:"queue_depth"`
	// MaxITIULen caps the IU length requested at login (ib_srp's max_it_iu_size); 0: no cap.
	MaxITIULen Size `yaml:"max_it_iu_len,omitempty" json:"max_it_iu_len,omitempty"`
	// ImmediateData asks for SRP-2 immediate data (default true).
	ImmediateData *bool `yaml:"immediate_data" json:"immediate_data"`
	// RemoteInvalidate offers srpd targets the remote-invalidation extension at login (omitted:
	// true); kernel targets ignore the offer.
	RemoteInvalidate *bool `yaml:"remote_invalidate,omitempty" json:"remote_invalidate,omitempty"`
	// ConnectTimeout bounds one connection attempt (address resolution, CM and login).
	ConnectTimeout Duration `yaml:"connect_timeout" json:"connect_timeout"`
	// ReconnectDelay, FastIOFailTmo and DevLossTmo are the scsi_transport_srp timers, "off" or
	// a whole number of seconds, with the kernel's rules (srp_tmo_valid): defaults 10s, 15s,
	// 600s.
	ReconnectDelay *Timeout `yaml:"reconnect_delay" json:"reconnect_delay"`
	FastIOFailTmo  *Timeout `yaml:"fast_io_fail_tmo" json:"fast_io_fail_tmo"`
	DevLossTmo     *Timeout `yaml:"dev_loss_tmo" json:"dev_loss_tmo"`
	// NBD exports remote LUNs as NBD servers on unix sockets (nbd-client -unix, qemu, nbdkit).
	NBD []NBDExport `yaml:"nbd,omitempty" json:"nbd,omitempty"`
}

// Multipath is one logical unit (each LUN number of it) reached through several sessions, one
// per target port (initiator/mpath): I/O goes to the path whose target port group is
// active/optimized, else active/non-optimized, and moves to another when its path fails.
type Multipath struct {
	Name string `yaml:"name" json:"name"`
	// Sessions names the sessions (entries of sessions:) that are its paths, two or more;
	// among paths of the same ALUA state the first listed is used. A path's session keeps its
	// own reconnect_delay, fast_io_fail_tmo (keep it short: I/O held on a failed path moves on
	// when it expires) and dev_loss_tmo.
	Sessions []string `yaml:"sessions" json:"sessions"`
	// NoPathTimeout bounds how long I/O waits for a usable path (1s..1h, default 30s), as
	// dm-multipath's queue_if_no_path with no_path_retry.
	NoPathTimeout *Timeout `yaml:"no_path_timeout,omitempty" json:"no_path_timeout,omitempty"`
	// NBD exports LUNs of the unit (numbers as the paths' sessions see them).
	NBD []NBDExport `yaml:"nbd,omitempty" json:"nbd,omitempty"`
}

// MultipathGroup returns the multipath group named name, or nil.
func (c *Config) MultipathGroup(name string) *Multipath {
	for i := range c.Multipath {
		if c.Multipath[i].Name == name {
			return &c.Multipath[i]
		}
	}
	return nil
}

// NBDExport serves one remote LUN of a session over NBD.
type NBDExport struct {
	LUN    int    `yaml:"lun" json:"lun"`
	Socket string `yaml:"socket" json:"socket"`
	// MaxConnections bounds the NBD clients of the socket at once (1..4096, default 64): one
	// more is refused at NBD_OPT_GO with NBD_REP_ERR_POLICY ("too many connections"), and
	// clients that connect but never finish the handshake are bounded by as many again.
	// Established clients are never affected.
	MaxConnections int `yaml:"max_connections,omitempty" json:"max_connections,omitempty"`
	// WriteTimeout closes a client that does not read its replies: when a batch of replies
	// waits for the socket and the client takes nothing from it for this long (1s..1h,
	// default 30s; off: never), the connection ends and its buffers go back to the export. A
	// client that reads slowly but steadily is not cut off.
	WriteTimeout *Timeout `yaml:"write_timeout,omitempty" json:"write_timeout,omitempty"`
	// Mode is the socket's permission bits (default 0660), and Group the group that owns it
	// (name or numeric id; default: the control socket's group, else the daemon's), so that
	// a hypervisor's user in that group can connect without running as root.
	Mode  FileMode `yaml:"mode,omitempty" json:"mode,omitempty"`
	Group string   `yaml:"group,omitempty" json:"group,omitempty"`
}

// Control is the control API's unix socket (srpctl).
type Control struct {
	// Socket is the path, /run/srpd/srpd.sock by default.
	Socket string `yaml:"socket" json:"socket"`
	// Mode is the socket's permission bits, 0660 by default.
	Mode FileMode `yaml:"mode" json:"mode"`
	// Group owns the socket (name or numeric id); empty: the daemon's group. Members may use
	// srpctl without root.
	Group string `yaml:"group,omitempty" json:"group,omitempty"`
}

// Logging configures the daemon's logs.
type Logging struct {
	// Level is debug, info (default), warn or error. srpd --log-level overrides it.
	Level string `yaml:"level" json:"level"`
	// Format is auto (default: console when srpd's standard error is a terminal, json
	// otherwise, e.g. under systemd), json or console. srpd --log-format overrides it.
	Format string `yaml:"format" json:"format"`
}

// Metrics configures the Prometheus endpoint.
type Metrics struct {
	// Listen is host:port for GET /metrics; empty: no metrics endpoint.
	Listen string `yaml:"listen,omitempty" json:"listen,omitempty"`
}

// Bool returns a pointer to b (for the *bool fields).
func Bool(b bool) *bool { return &b }

// Target returns the target named name, or nil.
func (c *Config) Target(name string) *Target {
	for i := range c.Targets {
		if c.Targets[i].Name == name {
			return &c.Targets[i]
		}
	}
	return nil
}

// Session returns the session named name, or nil.
func (c *Config) Session(name string) *Session {
	for i := range c.Sessions {
		if c.Sessions[i].Name == name {
			return &c.Sessions[i]
		}
	}
	return nil
}

// Transport returns the transport named name, or nil.
func (c *Config) Transport(name string) *Transport {
	for i := range c.Transports {
		if c.Transports[i].Name == name {
			return &c.Transports[i]
		}
	}
	return nil
}

// BusyPoll is the receive busy poll of transport t (Transport.BusyPoll): its setting, or the
// default for its role in c — DefaultBusyPoll when no session of c uses it, else 0. Defaults
// must have been applied (sessions name their transport).
func (c *Config) BusyPoll(t *Transport) time.Duration {
	if t.Driver != DriverSoftRoCE {
		return 0
	}
	if t.BusyPoll != nil {
		return t.BusyPoll.Duration()
	}
	for i := range c.Sessions {
		if c.Sessions[i].Transport == t.Name {
			return 0
		}
	}
	return DefaultBusyPoll
}

// LUN returns the LUN with that id, or nil.
func (t *Target) LUN(id int) *LUN {
	for i := range t.LUNs {
		if t.LUNs[i].ID == id {
			return &t.LUNs[i]
		}
	}
	return nil
}

// ACL returns the ACL entry naming ini exactly (or the "*" entry for AnyInitiator), or nil.
func (t *Target) ACL(ini InitiatorID) *ACL {
	for i := range t.ACLs {
		if t.ACLs[i].Initiator == ini {
			return &t.ACLs[i]
		}
	}
	return nil
}

// Admit decides a login: the ACL that applies to initiator port p (its own entry, else "*"),
// or nil when p may not log in.
func (t *Target) Admit(p PortID) *ACL {
	var any *ACL
	for i := range t.ACLs {
		a := &t.ACLs[i]
		if a.Initiator.Matches(p) {
			return a
		}
		if a.Initiator.Any {
			any = a
		}
	}
	return any
}

// Visible reports whether the ACL lets its initiator see LUN id (LUN masking).
func (a *ACL) Visible(id int) bool {
	if len(a.LUNs) == 0 {
		return true
	}
	for _, l := range a.LUNs {
		if l == id {
			return true
		}
	}
	return false
}
