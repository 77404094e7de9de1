package initiator

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/srp"
	"github.com/srpd/srpd/transport"
)

// Off disables one of the transport timers (reconnect_delay, fast_io_fail_tmo, dev_loss_tmo),
// the way scsi_transport_srp takes a negative value ("off").
const Off time.Duration = -1

// Defaults (the zero value of each Config field selects its default).
const (
	DefaultPort             = 5555 // RDMA CM port of ib_srpt's rdma_cm_port in blktests
	DefaultChCount          = 1
	DefaultQueueDepth       = 64 // ib_srp queue_size
	DefaultMaxIOSize        = 512 << 10
	DefaultMaxPagesPerMR    = 256
	DefaultCmdSGEntries     = 12   // ib_srp cmd_sg_entries
	DefaultMaxImmediateData = 8192 // ib_srp max_imm_data
	DefaultCommandTimeout   = 30 * time.Second
	DefaultTaskMgmtTimeout  = 5 * time.Second // ib_srp SRP_ABORT_TIMEOUT_MS
	DefaultConnectTimeout   = 10 * time.Second
	DefaultReconnectDelay   = 10 * time.Second  // scsi_transport_srp
	DefaultFastIOFailTmo    = 15 * time.Second  // scsi_transport_srp
	DefaultDevLossTmo       = 600 * time.Second // scsi_transport_srp
	DefaultMaxRetries       = 5                 // SCSI midlayer retries of DID_RESET
	DefaultTeardownTimeout  = 2 * time.Second

	// maxBlockTimeout is SCSI_DEVICE_BLOCK_MAX_TIMEOUT (srp_tmo_valid).
	maxBlockTimeout = 600 * time.Second
	// minITIULen is the smallest IU length a login asks for (ib_srpt refuses less than 64).
	minITIULen = 64
	// maxTIIULen bounds the receive buffers (a target announcing more gets this much).
	maxTIIULen = 64 << 10
)

// LoginForm selects the wire form of SRP_LOGIN_REQ.
type LoginForm uint8

const (
	// LoginRDMACM is Linux's 56-byte struct srp_login_req_rdma, which fits the private data of an
	// RDMA CM connection request (the default).
	LoginRDMACM LoginForm = iota
	// LoginIBCM is the 64-byte SRP_LOGIN_REQ of the SRP specification (IB CM).
	LoginIBCM
)

func (f LoginForm) String() string {
	if f == LoginIBCM {
		return "ib_cm"
	}
	return "rdma_cm"
}

// Config describes a session: how to reach the target, what to negotiate, how many resources to
// use and how to behave when the transport fails.
type Config struct {
	// Name identifies the session in logs.
	Name string
	// Device is the local RDMA device; Dialer connects its QPs to the target (a CMDialer over
	// the device's transport.ConnManager, or any other Dialer).
	Device transport.Device
	Dialer Dialer
	// LoginForm is the SRP_LOGIN_REQ wire form (LoginRDMACM: 56 bytes, for RDMA CM).
	LoginForm LoginForm

	// TargetPortID is the SRP target port to log in to (id_ext then ioc_guid).
	TargetPortID srp.PortID
	// InitiatorPortID is our SRP initiator port identifier. Zero: InitiatorExt in bytes 0-7 and
	// the low 64 bits of the device's GID 0 in bytes 8-15, as ib_srp builds it.
	InitiatorPortID srp.PortID
	InitiatorExt    uint64

	// ChCount is the number of RDMA channels (SRP multichannel), each one RC QP with its own
	// credits, request table and MR pool. Channel 0 logs in with MULTI-CHANNEL ACTION SINGLE,
	// the others with MULTI.
	ChCount int
	// QueueDepth is the number of requests a channel has in flight (ib_srp's queue_size); the
	// target's credits may allow fewer.
	QueueDepth int
	// MaxIOSize is the largest data transfer of one SCSI command, a multiple of 4096; larger
	// block requests are split. It is also the size of each request's registered data buffer.
	MaxIOSize int
	// MaxPagesPerMR is the page-list length of each fast-registration MR (at most the device's).
	// A command whose buffer needs more pages uses several MRs and an indirect descriptor.
	MaxPagesPerMR int
	// CmdSGEntries is the most direct descriptors one SRP_CMD carries in its indirect
	// descriptor (ib_srp's cmd_sg_entries); all of them travel in the IU.
	CmdSGEntries int
	// MaxITIULen caps the REQUESTED MAX IT IU LEN of the login (ib_srp's max_it_iu_size); 0: no
	// cap. A target that rejects the length is asked again with a smaller one anyway.
	MaxITIULen uint32
	// DisableImmediateData does not request SRP-2 immediate data (it is requested by default
	// and used for writes of at most MaxImmediateData bytes when the target grants it).
	DisableImmediateData bool
	// MaxImmediateData is the largest write sent as immediate data (ib_srp's max_imm_data).
	MaxImmediateData int
	// DisableRemoteInvalidate does not offer srpd's remote-invalidation extension at login
	// (srp.ExtRemoteInvalidate, offered by default): an srpd target that grants it answers a
	// command with one registration by SEND_WITH_INV of its key, which saves the LOCAL_INV
	// before the buffer is reused. Kernel targets never grant it; the offer sits in a byte
	// they ignore.
	DisableRemoteInvalidate bool
	// DisableIndirect does not offer indirect descriptors (REQUIRED BUFFER FORMATS direct only);
	// commands then use one MR each. A target that rejects the format choice is asked again
	// with direct descriptors only in any case.
	DisableIndirect bool

	// CommandTimeout bounds each SCSI command (besides the caller's context): when it expires
	// the command is aborted (ABORT TASK, then LOGICAL UNIT RESET, then a channel reset). Off: no
	// bound but the context's. A per-session watchdog checks the deadlines every
	// CommandTimeout/16 (1 ms..250 ms), so a command times out up to that much late.
	CommandTimeout time.Duration
	// TaskMgmtTimeout bounds the wait for a task management response.
	TaskMgmtTimeout time.Duration
	// ConnectTimeout bounds one channel connection and login attempt.
	ConnectTimeout time.Duration
	// ReconnectDelay, FastIOFailTmo and DevLossTmo are scsi_transport_srp's timers, with its
	// defaults (10 s, 15 s, 600 s) and validity rules (srp_tmo_valid); Off disables one.
	// ReconnectDelay is the first delay before a failed channel is reconnected; later attempts
	// back off exponentially (with jitter) up to MaxReconnectDelay. FastIOFailTmo after the last
	// channel went down, held I/O fails with ErrFastFail; DevLossTmo after it, the session is
	// torn down (ErrSessionLost).
	ReconnectDelay time.Duration
	FastIOFailTmo  time.Duration
	DevLossTmo     time.Duration
	// MaxReconnectDelay caps the reconnect back-off (default 16 × ReconnectDelay).
	MaxReconnectDelay time.Duration
	// MaxRetries is how many times a command is re-issued after the channel it was on failed
	// before it is failed with ErrTransport.
	MaxRetries int
	// TeardownTimeout bounds the drain of a failed channel's work requests.
	TeardownTimeout time.Duration
	// NoCompletionHandler keeps completions on the channel goroutine even when the transport
	// could run them on its own receive goroutine (transport.CompletionHandler, which saves
	// a goroutine wake-up per response at low queue depth). For comparison.
	NoCompletionHandler bool

	// ConnParam are the connection parameters of every channel (defaults as ib_srp: responder
	// resources 4, RNR retry 7, flow control; retry count 6, since 7 means "retry forever" to rxe
	// and softroce).
	ConnParam transport.ConnParam

	// Logger receives the session's events (nil: none). Errors returned to callers are not
	// logged.
	Logger *zap.Logger
}

// withDefaults returns a copy of c with the defaults filled in, or an error for an invalid
// configuration.
func (c Config) withDefaults() (Config, error) {
	if c.Device == nil {
		return c, errors.New("initiator: Config.Device is required")
	}
	if c.Dialer == nil {
		return c, errors.New("initiator: Config.Dialer is required")
	}
	if c.LoginForm > LoginIBCM {
		return c, fmt.Errorf("initiator: unknown login form %d", c.LoginForm)
	}
	c.ChCount = cmp.Or(c.ChCount, DefaultChCount)
	c.QueueDepth = cmp.Or(c.QueueDepth, DefaultQueueDepth)
	c.MaxIOSize = cmp.Or(c.MaxIOSize, DefaultMaxIOSize)
	c.CmdSGEntries = cmp.Or(c.CmdSGEntries, DefaultCmdSGEntries)
	c.MaxImmediateData = cmp.Or(c.MaxImmediateData, DefaultMaxImmediateData)
	c.MaxRetries = cmp.Or(c.MaxRetries, DefaultMaxRetries)
	attr := c.Device.Attr()
	if c.MaxPagesPerMR == 0 {
		c.MaxPagesPerMR = DefaultMaxPagesPerMR
		if attr.MaxMRPages > 0 && c.MaxPagesPerMR > attr.MaxMRPages {
			c.MaxPagesPerMR = attr.MaxMRPages
		}
	}
	c.CommandTimeout = cmp.Or(c.CommandTimeout, DefaultCommandTimeout)
	c.TaskMgmtTimeout = cmp.Or(c.TaskMgmtTimeout, DefaultTaskMgmtTimeout)
	c.ConnectTimeout = cmp.Or(c.ConnectTimeout, DefaultConnectTimeout)
	c.ReconnectDelay = cmp.Or(c.ReconnectDelay, DefaultReconnectDelay)
	c.FastIOFailTmo = cmp.Or(c.FastIOFailTmo, DefaultFastIOFailTmo)
	c.DevLossTmo = cmp.Or(c.DevLossTmo, DefaultDevLossTmo)
	c.TeardownTimeout = cmp.Or(c.TeardownTimeout, DefaultTeardownTimeout)
	if c.MaxReconnectDelay == 0 && c.ReconnectDelay > 0 {
		c.MaxReconnectDelay = 16 * c.ReconnectDelay
	}
	if c.MaxReconnectDelay < c.ReconnectDelay {
		c.MaxReconnectDelay = c.ReconnectDelay
	}
	p := &c.ConnParam
	p.ResponderResources = cmp.Or(p.ResponderResources, 4)
	p.RetryCount = cmp.Or(p.RetryCount, 6)
	p.RNRRetryCount = cmp.Or(p.RNRRetryCount, 7)
	p.FlowControl = true
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}

	switch {
	case c.ChCount < 1 || c.ChCount > 256:
		return c, fmt.Errorf("initiator: ChCount %d: want 1..256", c.ChCount)
	case c.QueueDepth < 1 || c.QueueDepth > 4096:
		return c, fmt.Errorf("initiator: QueueDepth %d: want 1..4096", c.QueueDepth)
	case c.MaxIOSize < 4096 || c.MaxIOSize%4096 != 0 || c.MaxIOSize > 1<<30:
		return c, fmt.Errorf("initiator: MaxIOSize %d: want a multiple of 4096 up to 1 GiB", c.MaxIOSize)
	case c.MaxPagesPerMR < 1 || (attr.MaxMRPages > 0 && c.MaxPagesPerMR > attr.MaxMRPages):
		return c, fmt.Errorf("initiator: MaxPagesPerMR %d: want 1..%d", c.MaxPagesPerMR, attr.MaxMRPages)
	case c.CmdSGEntries < 1 || c.CmdSGEntries > 255:
		return c, fmt.Errorf("initiator: CmdSGEntries %d: want 1..255", c.CmdSGEntries)
	case c.MaxImmediateData < 0:
		return c, fmt.Errorf("initiator: MaxImmediateData %d: negative", c.MaxImmediateData)
	case c.MaxITIULen != 0 && c.MaxITIULen < minITIULen:
		return c, fmt.Errorf("initiator: MaxITIULen %d: want 0 or at least %d", c.MaxITIULen, minITIULen)
	case c.MaxRetries < 0:
		return c, fmt.Errorf("initiator: MaxRetries %d: negative", c.MaxRetries)
	case c.TaskMgmtTimeout < 0 || c.ConnectTimeout < 0 || c.TeardownTimeout < 0:
		return c, errors.New("initiator: TaskMgmtTimeout, ConnectTimeout and TeardownTimeout must be positive")
	case c.CommandTimeout < 0 && c.CommandTimeout != Off:
		return c, errors.New("initiator: CommandTimeout must be positive or Off")
	}
	if err := validTimers(c.ReconnectDelay, c.FastIOFailTmo, c.DevLossTmo); err != nil {
		return c, err
	}
	return c, nil
}

// validTimers applies srp_tmo_valid() of torvalds/linux:drivers/scsi/scsi_transport_srp.c,
// Off standing for the kernel's negative values (sub-second values are allowed here).
func validTimers(rd, ff, dl time.Duration) error {
	for _, d := range []time.Duration{rd, ff, dl} {
		if d < 0 && d != Off {
			return errors.New("initiator: reconnect_delay, fast_io_fail_tmo and dev_loss_tmo must be positive or Off")
		}
	}
	switch {
	case rd == Off && ff == Off && dl == Off:
		return errors.New("initiator: reconnect_delay, fast_io_fail_tmo and dev_loss_tmo must not all be off")
	case ff != Off && ff > maxBlockTimeout:
		return fmt.Errorf("initiator: fast_io_fail_tmo %v exceeds %v", ff, maxBlockTimeout)
	case ff == Off && dl != Off && dl > maxBlockTimeout:
		return fmt.Errorf("initiator: dev_loss_tmo %v exceeds %v while fast_io_fail_tmo is off", dl, maxBlockTimeout)
	case ff != Off && dl != Off && ff >= dl:
		return fmt.Errorf("initiator: fast_io_fail_tmo %v must be less than dev_loss_tmo %v", ff, dl)
	}
	return nil
}
