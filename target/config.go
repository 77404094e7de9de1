package target

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/srpd/srpd/scsi"
	"github.com/srpd/srpd/srp"
)

// Defaults for the zero values of Limits.
const (
	// DefaultQueueDepth is the credits (receive IUs) per channel. ib_srpt uses
	// min(128, max_qp_wr); 64 is ib_srp's default queue_size.
	DefaultQueueDepth = 64
	// DefaultMaxITIULen is the largest initiator-to-target IU accepted: ib_srpt's default
	// srp_max_req_size (max(48+16+20+128×16, 80+4+8192) = 8276), which holds ib_srp's default
	// login (8260 = 68 + 8192 bytes of immediate data).
	DefaultMaxITIULen = 8276
	// DefaultMaxTIIULen is the largest target-to-initiator IU sent: an SRP_RSP with 4 bytes of
	// response data and the largest SPC sense data (36 + 4 + 252).
	DefaultMaxTIIULen = srp.RspHdrLen + 4 + scsi.MaxSenseLen
	// DefaultMaxChannels is the channels per I_T nexus.
	DefaultMaxChannels = 16
	// DefaultMaxTransfer is the data buffer of one command (the LUNs' default MAXIMUM TRANSFER
	// LENGTH in bytes).
	DefaultMaxTransfer = scsi.DefaultMaxTransferBytes
	// DefaultMaxDescriptors bounds the direct descriptors of one command (inline or in an
	// external indirect table).
	DefaultMaxDescriptors = 256
	// DefaultLUNWorkers is the concurrency of command execution per logical unit.
	DefaultLUNWorkers = 8
	// DefaultTeardownTimeout bounds the drain of a channel.
	DefaultTeardownTimeout = 5 * time.Second
	// DefaultMaxSessions is the sessions (I_T nexuses) one target accepts.
	DefaultMaxSessions = 1024
	// DefaultKeepAliveInterval bounds how long a peer gone without a DREQ keeps its channel:
	// it is found within this interval of its last sign of life (see Limits.KeepAliveInterval).
	DefaultKeepAliveInterval = 30 * time.Second
	// DefaultStallTimeout is how long a command may wait on the transport (RDMA transfers, the
	// response send, send-queue room) before the channel counts as stalled.
	DefaultStallTimeout = 60 * time.Second
	// DefaultLogoutTimeout bounds the wait for an SRP_T_LOGOUT's completion before the
	// disconnect.
	DefaultLogoutTimeout = 500 * time.Millisecond

	// minITIULen is the smallest REQUESTED MAX IT IU LEN accepted (ib_srpt: 64).
	minITIULen = 64
	// minTIIULen is the smallest MAX TI IU LEN we announce: an SRP_RSP with a task management
	// response must fit.
	minTIIULen = 64
	// maxMaxDescriptors bounds Limits.MaxDescriptors (ib_srp's indirect_sg_entries maximum).
	maxMaxDescriptors = 2048
)

// SupportedBufFormats are the data buffer descriptor formats the target implements.
const SupportedBufFormats = srp.BufFormatDirect | srp.BufFormatIndirect

// Limits are the per-channel resources and protocol limits of a target. The zero value of each
// field selects its default.
type Limits struct {
	// MaxChannels is the number of channels one I_T nexus may have (DefaultMaxChannels). With 1,
	// a MULTI login to a nexus that has a channel is rejected with "multiple channels
	// unsupported" (0x00010005).
	MaxChannels int
	// QueueDepth is the initial credit (REQUEST LIMIT DELTA of the login response) and the
	// number of commands a channel has in flight (DefaultQueueDepth).
	QueueDepth int
	// MaxITIULen is the largest IU the initiator may send (DefaultMaxITIULen). A login asking
	// for more is rejected with 0x00010002; a smaller request is granted as asked and the
	// channel's receive buffers are sized to it.
	MaxITIULen uint32
	// MaxTIIULen is the largest IU the target sends (DefaultMaxTIIULen); sense data is truncated
	// to fit. At least 64.
	MaxTIIULen uint32
	// DisableImmediateData refuses SRP-2 immediate data (IMMED_SUPP is never granted).
	DisableImmediateData bool
	// DisableRemoteInvalidate never grants srpd's remote-invalidation extension
	// (srp.ExtRemoteInvalidate): responses are plain SENDs even to srpd initiators that offer to
	// take SEND_WITH_INV. Other initiators never offer it.
	DisableRemoteInvalidate bool
	// MaxImmediateData is the most immediate data one command may carry; 0 means whatever fits
	// in an IU. Immediate data is granted only when the login's IU length minus its
	// immediate-data offset does not exceed it, because Linux sizes its immediate data from its
	// own IU length and ignores a smaller MAX IT IU LEN in the response.
	MaxImmediateData int
	// BufFormats are the descriptor formats offered (SupportedBufFormats, the default). A login
	// requiring another format is rejected with 0x00010004.
	BufFormats srp.BufFormats
	// MaxTransfer is the data buffer of one command in bytes (DefaultMaxTransfer). Data
	// buffers are registered once per channel: QueueDepth+1 of them.
	MaxTransfer int
	// MaxDescriptors bounds the direct descriptors of one data buffer, inline or in an external
	// indirect table (DefaultMaxDescriptors, at most 2048).
	MaxDescriptors int
	// LUNWorkers is the number of commands executing at once on one logical unit
	// (DefaultLUNWorkers).
	LUNWorkers int
	// NoInline turns inline execution off: every command goes through the LUN workers, also
	// on fast LUNs (RAM), whose commands otherwise execute on the channel's goroutine when
	// the task attributes allow (see lunQueue). For comparison and tests.
	NoInline bool
	// NoCompletionHandler keeps completions on the channel's goroutine even when the
	// transport could run them on its own receive goroutine (transport.CompletionHandler,
	// which saves a goroutine wake-up per request at low queue depth). For comparison.
	NoCompletionHandler bool
	// TeardownTimeout bounds the drain of a channel (DefaultTeardownTimeout). Past it the
	// channel's transport resources are destroyed anyway; memory still used by a command
	// executing on a backend is released when that command returns.
	TeardownTimeout time.Duration
	// LogoutTimeout bounds the wait for an SRP_T_LOGOUT's send completion before the
	// disconnect (DefaultLogoutTimeout).
	LogoutTimeout time.Duration
	// MaxSessions bounds the sessions of the target (DefaultMaxSessions; negative: none). A
	// login that would open one more is rejected with "insufficient resources"
	// (CauseSessionLimit); a SINGLE login replacing its initiator's session is not counted
	// twice.
	MaxSessions int
	// MaxMemory bounds the registered memory of the target's channels in bytes (0: no bound of
	// the target's own; Config.Budget may bound all targets together). A login whose channel
	// would not fit is rejected with "insufficient resources" (CauseMemoryBudget) before
	// anything is allocated.
	MaxMemory int64
	// KeepAliveInterval is the liveness check of idle channels (DefaultKeepAliveInterval;
	// negative: off). A channel with no completion for a quarter of it gets a zero-length RDMA
	// WRITE, which the peer's RC transport acknowledges without its ULP (IBA C9-88: no rkey
	// is checked); a probe not completed within another quarter means the peer is gone, and
	// the channel is torn down and its memory released: within one interval of the peer's
	// last sign of life.
	KeepAliveInterval time.Duration
	// StallTimeout is how long a command may wait on the transport — an RDMA READ or WRITE,
	// its response SEND, room in the send queue — before the channel is reported stalled
	// (DefaultStallTimeout; negative: off). Time spent executing on the backend does not
	// count. What happens then is StallAction.
	StallTimeout time.Duration
	// StallAction is what a stall does: StallClose (the default) tears the channel down, so a
	// hostile or broken initiator only hurts its own session; StallLog only reports it.
	StallAction StallAction
	// MaxInitiatorDepth caps the RDMA READs the target keeps outstanding towards an initiator
	// (the CM initiator depth; ≤ what the peer offers as responder resources). Default 4, as
	// ib_srpt.
	MaxInitiatorDepth uint8
}

func (l Limits) withDefaults() Limits {
	positiveOr(&l.MaxChannels, DefaultMaxChannels)
	positiveOr(&l.QueueDepth, DefaultQueueDepth)
	positiveOr(&l.MaxTransfer, DefaultMaxTransfer)
	positiveOr(&l.MaxDescriptors, DefaultMaxDescriptors)
	positiveOr(&l.LUNWorkers, DefaultLUNWorkers)
	l.MaxITIULen = cmp.Or(l.MaxITIULen, DefaultMaxITIULen)
	l.MaxTIIULen = cmp.Or(l.MaxTIIULen, DefaultMaxTIIULen)
	l.BufFormats = cmp.Or(l.BufFormats, SupportedBufFormats)
	positiveOr(&l.TeardownTimeout, DefaultTeardownTimeout)
	positiveOr(&l.LogoutTimeout, DefaultLogoutTimeout)
	l.MaxSessions = cmp.Or(l.MaxSessions, DefaultMaxSessions)
	l.KeepAliveInterval = cmp.Or(l.KeepAliveInterval, DefaultKeepAliveInterval)
	l.StallTimeout = cmp.Or(l.StallTimeout, DefaultStallTimeout)
	l.MaxInitiatorDepth = cmp.Or(l.MaxInitiatorDepth, 4)
	return l
}

// positiveOr sets *v to d unless it is positive.
func positiveOr[T int | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// maintenancePeriod is the channels' maintenance tick: a quarter of the keep-alive interval or
// of the stall timeout, whichever is shorter; 0 when both are off. With the keep-alive: the
// first tick after the peer's last completion sees it, the next (at most half an interval
// later) finds the channel idle and probes, and the tick after that ends the channel if the
// probe is unanswered: within three quarters of an interval of the last sign of life, plus
// the drain.
func (l *Limits) maintenancePeriod() time.Duration {
	var p time.Duration
	if l.KeepAliveInterval > 0 {
		p = l.KeepAliveInterval / 4
	}
	if l.StallTimeout > 0 && (p == 0 || l.StallTimeout/4 < p) {
		p = l.StallTimeout / 4
	}
	return p
}

func (l Limits) validate() error {
	switch {
	case l.QueueDepth > 4096:
		return fmt.Errorf("target: queue depth %d: at most 4096", l.QueueDepth)
	case l.MaxITIULen < minITIULen:
		return fmt.Errorf("target: max IT IU length %d: at least %d", l.MaxITIULen, minITIULen)
	case l.MaxITIULen > 1<<20:
		return fmt.Errorf("target: max IT IU length %d: at most 1 MiB", l.MaxITIULen)
	case l.MaxTIIULen < minTIIULen:
		return fmt.Errorf("target: max TI IU length %d: at least %d", l.MaxTIIULen, minTIIULen)
	case l.MaxTIIULen > 1<<16:
		return fmt.Errorf("target: max TI IU length %d: at most 64 KiB", l.MaxTIIULen)
	case l.BufFormats&^SupportedBufFormats != 0:
		return fmt.Errorf("target: buffer formats %#x: only direct (0x2) and indirect (0x4) exist", uint16(l.BufFormats))
	case l.MaxTransfer > 1<<30:
		return fmt.Errorf("target: max transfer %d: at most 1 GiB", l.MaxTransfer)
	case l.MaxDescriptors > maxMaxDescriptors:
		return fmt.Errorf("target: max descriptors %d: at most %d", l.MaxDescriptors, maxMaxDescriptors)
	case l.MaxChannels > 1024:
		return fmt.Errorf("target: max channels %d: at most 1024", l.MaxChannels)
	case l.MaxMemory < 0:
		return fmt.Errorf("target: max memory %d: negative", l.MaxMemory)
	case l.KeepAliveInterval > 0 && l.KeepAliveInterval < 100*time.Millisecond:
		return fmt.Errorf("target: keep-alive interval %v: at least 100ms", l.KeepAliveInterval)
	case l.StallTimeout > 0 && l.StallTimeout < 100*time.Millisecond:
		return fmt.Errorf("target: stall timeout %v: at least 100ms", l.StallTimeout)
	case l.StallAction > StallLog:
		return fmt.Errorf("target: stall action %d: unknown", l.StallAction)
	}
	return nil
}

// StallAction is what a stalled channel does (Limits.StallAction). Its String
// (stallaction_string.go) is each constant's line comment.
type StallAction uint8

//go:generate go tool stringer -type=StallAction -linecomment -output=stallaction_string.go

const (
	// StallClose tears the stalled channel down (without SRP_T_LOGOUT: the peer is not
	// taking what we send).
	StallClose StallAction = iota // close
	// StallLog only reports the stall (log and counter).
	StallLog // log
)

// LUNMapping presents a logical unit to an ACL under a LUN number.
type LUNMapping struct {
	// Number is the LUN number the initiator sees (0..scsi.MaxLUN).
	Number uint16
	// LUN is the logical unit. One LUN may appear in several ACLs (under the same or different
	// numbers); its task set, reservations and unit attentions are shared.
	LUN *scsi.LUN
	// ReadOnly write-protects the LUN for this ACL only: medium writes (WRITE, WRITE SAME,
	// UNMAP, COMPARE AND WRITE) fail with DATA PROTECT, WRITE PROTECTED (7/27/00) and MODE SENSE
	// reports WP. A LUN that is read-only itself is read-only for everyone.
	ReadOnly bool
}

// ACL admits one initiator port and gives it its view of the target: the LUNs it may see
// (LUN masking: REPORT LUNS lists only these, any other LUN number answers LOGICAL UNIT NOT
// SUPPORTED, 25/00).
type ACL struct {
	// Name identifies the ACL in logs and statistics (default: the initiator port ID).
	Name string
	// Initiator is the SRP initiator port identifier (id_ext / initiator_ext, then GUID).
	Initiator srp.PortID
	// LUNs are the logical units this initiator sees.
	LUNs []LUNMapping
	// MaxChannels overrides Limits.MaxChannels for this initiator when > 0.
	MaxChannels int
}

// Config configures a Target.
type Config struct {
	// Name is the target's name in logs and statistics.
	Name string
	// PortID is the SRP target port identifier: id_ext (bytes 0-7) and ioc_guid (8-15). Logins
	// naming another identifier are rejected with 0x00010003.
	PortID srp.PortID
	// ACLs admit initiators; at most one per initiator port identifier.
	ACLs []ACL
	// DefaultACL, if set, admits any initiator without an ACL of its own (its Initiator field
	// is ignored): LIO's "demo mode". Nil: such logins are rejected with 0x00010006.
	DefaultACL *ACL
	// Limits are the protocol and resource limits.
	Limits Limits
	// Logger receives the target's logs; nil means none.
	Logger *zap.Logger
	// Budget, if set, is shared with other targets (a daemon's): sessions, registered memory
	// and pending logins over all of them. Nil: the target has a budget of its own with only
	// the login controls' defaults.
	Budget *Budget
	// OnChannel, if set, is called by Serve for each channel it establishes (the daemon keeps
	// a handle on every channel: session kill, remote address and login time).
	OnChannel func(ch *Channel, initiator srp.PortID, remote netip.AddrPort)
}

// view is an ACL compiled into a LUNSet. Reconfigure changes a view in place: its set has its
// own lock, readOnly is replaced whole, maxChannels changes under Target.mu.
type view struct {
	name        string
	set         *scsi.LUNSet
	readOnly    atomic.Pointer[map[*scsi.LUN]bool] // LUNs write-protected for this view
	maxChannels int
}

func (v *view) readOnlyMap() map[*scsi.LUN]bool {
	if m := v.readOnly.Load(); m != nil {
		return *m
	}
	return nil
}

func (v *view) isReadOnly(l *scsi.LUN) bool {
	return l != nil && v.readOnlyMap()[l]
}

func compileACL(a *ACL, def bool) (*view, error) {
	v := &view{name: a.Name, set: scsi.NewLUNSet(), maxChannels: a.MaxChannels}
	if v.name == "" {
		if def {
			v.name = "default"
		} else {
			v.name = a.Initiator.String()
		}
	}
	ro := make(map[*scsi.LUN]bool)
	for _, m := range a.LUNs {
		if m.LUN == nil {
			return nil, fmt.Errorf("target: ACL %s: LUN %d is nil", v.name, m.Number)
		}
		if err := v.set.Add(m.Number, m.LUN); err != nil {
			return nil, fmt.Errorf("target: ACL %s: %w", v.name, err)
		}
		// Kept also when the LUN is read-only itself: the LUN's own protection may be lifted
		// while the ACL's stays (scsi.LUN.SetReadOnly).
		if m.ReadOnly {
			ro[m.LUN] = true
		}
	}
	v.readOnly.Store(&ro)
	return v, nil
}

var errNoPortID = errors.New("target: the target port identifier must be set")
