package scsi

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/srpd/srpd/scsi/backend"
)

// Defaults for the zero values of LUNConfig.
const (
	DefaultVendor   = "SRPD"
	DefaultProduct  = "SRPD LUN"
	DefaultRevision = "0001"
	// DefaultCompanyID is the IEEE company ID placed in the NAA 6 identifier when
	// LUNConfig.CompanyID is zero: 00-14-05, the OUI that Linux's in-kernel SCSI target (LIO)
	// uses for the same purpose. srpd has no OUI of its own; a site that has one sets it.
	DefaultCompanyID = 0x001405
	// DefaultMaxTransferBytes bounds one READ or WRITE when MaxTransferLength is zero.
	DefaultMaxTransferBytes = 1 << 20
	// DefaultMaxUnmapLBACount, DefaultMaxUnmapDescriptors, DefaultMaxWriteSameLength and
	// DefaultMaxCompareAndWrite are the Block Limits (VPD 0xB0) used for zero config values.
	DefaultMaxUnmapLBACount    = 1 << 22
	DefaultMaxUnmapDescriptors = 256
	DefaultMaxWriteSameLength  = 1 << 22
	DefaultMaxCompareAndWrite  = 16
	// maxTransferBytesLimit caps MaxTransferLength * BlockSize so that byte counts fit 32 bits.
	maxTransferBytesLimit = 1 << 30
)

// LUNConfig configures a logical unit. The zero value of each field selects its default.
type LUNConfig struct {
	// BlockSize is the logical block size: 512 (default) or 4096. The backend size must be a
	// multiple of it.
	BlockSize int
	// ReadOnly makes every medium write fail with DATA PROTECT, WRITE PROTECTED. A backend that
	// reports Info().ReadOnly makes the LUN read-only whatever this says.
	ReadOnly bool
	// Vendor (at most 8), Product (16) and Revision (4) are the INQUIRY identification strings:
	// printable ASCII, space padded.
	Vendor, Product, Revision string
	// Serial is the unit serial number of VPD page 0x80 (printable ASCII, at most 64 bytes).
	// Empty: the hexadecimal DeviceID.
	Serial string
	// DeviceID is the LUN's stable identity, e.g. a UUID or a 64-bit ID in its last 8 bytes.
	// The NAA identifier of VPD page 0x83 is derived from it (see NAA), so it must not change
	// across restarts. Zero: derived from Serial instead. One of them must be set.
	DeviceID [16]byte
	// CompanyID is the 24-bit IEEE company ID of the NAA 6 identifier (DefaultCompanyID if 0).
	CompanyID uint32
	// NAA, when not zero, is the logical unit's NAA designator in VPD page 0x83 as is: a
	// 16-byte NAA IEEE Registered Extended identifier (its first nibble must be 6). Gateways
	// that export one logical unit (a shared image) through their own target ports set the
	// same NAA on each, so that initiators see one logical unit with several paths. Zero: it
	// is derived from DeviceID or Serial (see LUN.NAA).
	NAA [16]byte
	// ALUA, if set, gives the LUN target port groups and asymmetric access states.
	ALUA *ALUAConfig
	// Allocation, if set, tells which blocks are mapped (GET LBA STATUS, the logical block
	// provisioning log page) when the backend does not itself implement
	// backend.Allocation — e.g. because it is wrapped. Nil: the backend's, if it has it;
	// otherwise every block reports mapped.
	Allocation backend.Allocation
	// Fence, if set, is the backend as a backend.Fenceable when it is one but wrapped (nil: the
	// backend's own, if it is one): the LUN keeps the promise Fenceable asks for (fence.go).
	Fence backend.Fenceable
	// DisableWriteCache starts the LUN with WCE=0 (every write flushed before status). The
	// initiator may change WCE with MODE SELECT either way.
	DisableWriteCache bool
	// MaxTransferLength is the largest READ/WRITE in logical blocks (VPD 0xB0); 0 selects
	// DefaultMaxTransferBytes / BlockSize.
	MaxTransferLength uint32
	// MaxUnmapLBACount and MaxUnmapDescriptors bound one UNMAP; MaxWriteSameLength one WRITE
	// SAME; MaxCompareAndWrite (1..255 blocks) one COMPARE AND WRITE.
	MaxUnmapLBACount    uint32
	MaxUnmapDescriptors uint32
	MaxWriteSameLength  uint64
	MaxCompareAndWrite  uint8
	// PRStore keeps the persistent reservation state where every gateway exporting the unit
	// reads and writes it (scsi/prstore.go); nil: in memory, this LUN's own.
	PRStore PRStore
}

// LUN is an emulated SBC direct-access block device over a Backend. All methods are safe for
// concurrent use; commands execute concurrently, subject to their task attributes.
type LUN struct {
	be           backend.Backend
	viewer       backend.Viewer // be, if it lends its memory (READ with Command.DataInViews)
	blockSize    int
	blockShift   uint
	blocks       atomic.Uint64 // capacity in logical blocks (Resize changes it)
	readOnly     atomic.Bool   // SetReadOnly changes it
	canUnmap     bool          // backend discards: thin provisioning, UNMAP, LBPME
	lbprz        bool          // discarded blocks read as zeroes
	rotational   bool
	physExp      uint8 // logical blocks per physical block exponent
	maxXfer      uint32
	maxWriteSame uint64
	maxCAW       uint8
	maxUnmapLBAs uint32
	maxUnmapDesc uint32
	vendor       [8]byte
	product      [16]byte
	revision     [4]byte
	serial       string
	naa          [16]byte
	alua         *alua              // nil: no ALUA
	alloc        backend.Allocation // nil: everything is mapped

	defaultWCE bool
	wce        atomic.Bool // caching page WCE
	dsense     atomic.Bool // control page D_SENSE
	stopped    atomic.Bool // START STOP UNIT with START=0
	closed     atomic.Bool
	// aborters are the transport's task aborters (SetTaskAborter), by owner.
	abortMu  sync.Mutex
	aborters map[any]TaskAborter

	tasks   taskSet
	locks   rangeLock
	flusher flusher
	ua      uaTable
	pr      prState
	prStore PRStore    // nil: PR state in memory only
	modeMu  sync.Mutex // serializes MODE SELECT
	// set is the last LUNSet the LUN was added to, for REPORT LUNS sent to LUN.Execute.
	set atomic.Pointer[LUNSet]
}

// NewLUN creates a logical unit over be, which it owns from then on (Close closes it). Every
// I_T nexus sees POWER ON, RESET, OR BUS DEVICE RESET OCCURRED on its first command.
func NewLUN(cfg LUNConfig, be backend.Backend) (*LUN, error) {
	if be == nil {
		return nil, errors.New("scsi: NewLUN: nil backend")
	}
	l := &LUN{be: be}
	l.viewer, _ = be.(backend.Viewer)
	switch cfg.BlockSize {
	case 0, 512:
		l.blockSize, l.blockShift = 512, 9
	case 4096:
		l.blockSize, l.blockShift = 4096, 12
	default:
		return nil, fmt.Errorf("scsi: block size %d: must be 512 or 4096", cfg.BlockSize)
	}
	size := be.Size()
	if size <= 0 || size%int64(l.blockSize) != 0 {
		return nil, fmt.Errorf("scsi: backend size %d is not a positive multiple of the block size %d",
			size, l.blockSize)
	}
	l.blocks.Store(uint64(size) >> l.blockShift)
	info := be.Info()
	l.readOnly.Store(cfg.ReadOnly || info.ReadOnly)
	l.canUnmap = info.CanDiscard && !l.readOnly.Load()
	l.lbprz = info.CanDiscard && info.DiscardZeroes
	l.rotational = info.Rotational
	if p := info.PhysicalBlockSize; p > l.blockSize && p%l.blockSize == 0 {
		for r := p / l.blockSize; r > 1 && r&1 == 0; r >>= 1 {
			l.physExp++
		}
	}

	if err := asciiField(l.vendor[:], "vendor", cfg.Vendor, DefaultVendor); err != nil {
		return nil, err
	}
	if err := asciiField(l.product[:], "product", cfg.Product, DefaultProduct); err != nil {
		return nil, err
	}
	if err := asciiField(l.revision[:], "revision", cfg.Revision, DefaultRevision); err != nil {
		return nil, err
	}
	if cfg.DeviceID == ([16]byte{}) && cfg.Serial == "" {
		return nil, errors.New("scsi: a LUN needs a DeviceID or a Serial for its stable identifier")
	}
	l.serial = cfg.Serial
	if l.serial == "" {
		l.serial = fmt.Sprintf("%x", cfg.DeviceID[:])
	}
	if len(l.serial) > 64 || !printable(l.serial) {
		return nil, fmt.Errorf("scsi: serial %q: at most 64 printable ASCII characters", l.serial)
	}
	cid := cfg.CompanyID
	if cid == 0 {
		cid = DefaultCompanyID
	}
	if cid > 0xFFFFFF {
		return nil, fmt.Errorf("scsi: company ID 0x%x is wider than 24 bits", cid)
	}
	l.naa = deriveNAA(cid, cfg.DeviceID, cfg.Serial)
	if cfg.NAA != ([16]byte{}) {
		if cfg.NAA[0]>>4 != 6 {
			return nil, fmt.Errorf("scsi: NAA designator %x: must be NAA 6 (IEEE Registered Extended, first hex digit 6)", cfg.NAA[:])
		}
		l.naa = cfg.NAA
	}
	if cfg.ALUA != nil {
		a, err := newALUA(cfg.ALUA)
		if err != nil {
			return nil, err
		}
		l.alua = a
	}
	l.alloc = cfg.Allocation
	if l.alloc == nil {
		l.alloc, _ = be.(backend.Allocation)
	}

	l.maxXfer = cfg.MaxTransferLength
	if l.maxXfer == 0 {
		l.maxXfer = uint32(DefaultMaxTransferBytes >> l.blockShift)
	}
	if uint64(l.maxXfer)<<l.blockShift > maxTransferBytesLimit {
		return nil, fmt.Errorf("scsi: max transfer length %d blocks exceeds %d bytes",
			l.maxXfer, maxTransferBytesLimit)
	}
	l.maxWriteSame = orDefault(cfg.MaxWriteSameLength, DefaultMaxWriteSameLength)
	l.maxUnmapLBAs = orDefault(cfg.MaxUnmapLBACount, DefaultMaxUnmapLBACount)
	l.maxUnmapDesc = orDefault(cfg.MaxUnmapDescriptors, DefaultMaxUnmapDescriptors)
	l.maxCAW = orDefault(cfg.MaxCompareAndWrite, DefaultMaxCompareAndWrite)
	if !l.canUnmap {
		l.maxUnmapLBAs, l.maxUnmapDesc = 0, 0
	}

	l.defaultWCE = !cfg.DisableWriteCache
	l.wce.Store(l.defaultWCE)
	l.tasks.init()
	fb := cfg.Fence
	if fb == nil {
		fb, _ = be.(backend.Fenceable)
	}
	if fb != nil {
		l.tasks.fence = &fenceGate{be: fb}
	}
	l.locks.init()
	l.flusher.init(be)
	l.ua.init()
	if cfg.PRStore != nil {
		l.prStore = cfg.PRStore
		// Read the stored state on the first command that a reservation could refuse.
		l.pr.stale.Store(true)
		l.pr.active.Store(true)
		cfg.PRStore.Watch(func() {
			l.pr.stale.Store(true)
			l.pr.active.Store(true)
		})
	}
	return l, nil
}

func orDefault[T uint8 | uint32 | uint64](v, d T) T {
	if v == 0 {
		return d
	}
	return v
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7E {
			return false
		}
	}
	return true
}

// asciiField fills dst with v (or def when v is empty), space padded.
func asciiField(dst []byte, name, v, def string) error {
	if v == "" {
		v = def
	}
	if len(v) > len(dst) || !printable(v) {
		return fmt.Errorf("scsi: %s %q: at most %d printable ASCII characters", name, v, len(dst))
	}
	for i := range dst {
		dst[i] = ' '
	}
	copy(dst, v)
	return nil
}

// BlockSize is the logical block size in bytes.
func (l *LUN) BlockSize() int { return l.blockSize }

// Blocks is the capacity in logical blocks.
func (l *LUN) Blocks() uint64 { return l.blocks.Load() }

// ReadOnly reports whether the LUN rejects medium writes.
func (l *LUN) ReadOnly() bool { return l.readOnly.Load() }

// MaxTransferBytes is the largest data transfer of one READ or WRITE (the Block Limits
// MAXIMUM TRANSFER LENGTH in bytes); a target sizes its buffers with it.
func (l *LUN) MaxTransferBytes() int { return int(l.maxXfer) << l.blockShift }

// MaxDataOutBytes bounds the data-out Length that ParseCDB accepts for any command: the
// largest WRITE or VERIFY, a COMPARE AND WRITE (twice MaxCompareAndWrite blocks), or a 64 KiB
// parameter list (MODE SELECT(10), UNMAP). Data-in is bounded by the caller's DataIn buffer.
func (l *LUN) MaxDataOutBytes() int {
	return max(l.MaxTransferBytes(), 2*int(l.maxCAW)<<l.blockShift, 0xFFFF)
}

// WriteCacheEnabled reports the current WCE bit of the caching mode page.
func (l *LUN) WriteCacheEnabled() bool { return l.wce.Load() }

// Serial is the unit serial number (VPD page 0x80).
func (l *LUN) Serial() string { return l.serial }

// Backend is the storage under the LUN.
func (l *LUN) Backend() backend.Backend { return l.be }

// Command is one SCSI command on its way through a LUN. A target may keep one per request
// slot and reuse it; Execute does not retain it after returning.
type Command struct {
	// CDB is the command descriptor block (6 to 16 bytes; trailing bytes beyond the opcode's
	// CDB length are ignored, so SRP's fixed 16-byte CDB field can be passed as is).
	CDB []byte
	// LUN is the 8-byte SAM LUN the command was addressed to; only LUNSet looks at it.
	LUN LUNAddress
	// Nexus identifies the I_T nexus, for unit attentions and persistent reservations.
	Nexus Nexus
	// Attr is the task attribute.
	Attr TaskAttr
	// DataOut holds the data-out buffer (write data, parameter lists): at least the Length
	// that ParseCDB reports for a DirOut command; extra bytes are ignored. A parameter list
	// shorter than the CDB says is treated as truncated (PARAMETER LIST LENGTH ERROR where it
	// matters); a short WRITE payload fails with INVALID FIELD IN CDB.
	DataOut []byte
	// DataIn receives data-in (READ data goes straight from the backend into it). Execute
	// writes at most min(len(DataIn), CDB transfer or allocation length) bytes.
	DataIn []byte
	// DataInViews, when its capacity is not zero, lets a READ from a backend that lends its
	// memory (backend.Viewer: RAM) answer with views of it instead of copying into DataIn:
	// Execute then fills DataInViews[:k] and returns them in Result.DataInViews (DataIn still
	// bounds the length). A transport offers it when it can send process memory as it lies
	// (transport.SGE.Host) and sends it before it reports the command done; it must not write
	// into the views.
	DataInViews [][]byte
	// Sense receives sense data on CHECK CONDITION (fixed format, or descriptor format when
	// the control mode page's D_SENSE is set). MaxSenseLen bytes always suffice; a shorter
	// buffer gets truncated sense data. Nil discards it (Result.Sense still has it).
	Sense []byte
	// WriteProtected makes the LUN read-only for this command's I_T nexus, as an ACL that maps
	// it read-only does (LIO's lun_access_ro): a medium write fails with DATA PROTECT, WRITE
	// PROTECTED before anything else is checked, unit attention included (LIO refuses it in
	// transport_lookup_cmd_lun, before the CDB reaches the device server), and MODE SENSE
	// reports WP (LIO: spc_modesense, target_lun_is_rdonly). A LUN that is read-only itself
	// (LUNConfig.ReadOnly) refuses writes in SPC order instead, after unit attention.
	WriteProtected bool

	ts taskState
	pc parsedCDB // LUNSet.Parse's result, for Execute
}

// Result is the outcome of a command.
type Result struct {
	Status Status
	// DataInLen is the number of bytes placed in Command.DataIn. The transport computes the
	// residual from it and the expected transfer length.
	DataInLen int
	// DataInViews, when not nil, holds the data-in instead of Command.DataIn: DataInLen bytes
	// in views of the backend's memory (Command.DataInViews).
	DataInViews [][]byte
	// SenseLen is the number of sense bytes written to Command.Sense (CHECK CONDITION only).
	SenseLen int
	// Sense is the sense data in decoded form (CHECK CONDITION only), e.g. for logging.
	Sense Sense
}

// Admit enters cmd into the LUN's task set, which is what orders it against other commands
// according to cmd.Attr. A transport that wants SAM ordering calls Admit in the order commands
// arrive (it never blocks), may then fetch data-out, and calls Execute — possibly from another
// goroutine — or Withdraw if it abandons the command. Execute admits a command that was not.
func (l *LUN) Admit(cmd *Command) {
	if cmd.ts.admitted {
		if cmd.ts.lun == l {
			return
		}
		cmd.ts.lun.Withdraw(cmd)
	}
	cmd.ts.lun = l
	l.tasks.admit(&cmd.ts, cmd.Attr)
}

// Withdraw removes an admitted command that will not be executed from the task set.
func (l *LUN) Withdraw(cmd *Command) {
	if cmd.ts.admitted && cmd.ts.lun == l {
		l.tasks.done(&cmd.ts)
	}
}

// Execute runs cmd and returns its status. It waits first for the command's turn in the task
// set: if ctx ends meanwhile (the task was aborted), the command does not run and the status
// is TASK ABORTED. Once running, a command completes regardless of ctx. Execute does not
// allocate for READ and WRITE.
func (l *LUN) Execute(ctx context.Context, cmd *Command) Result {
	l.Admit(cmd)
	if cmd.ts.badAttr {
		l.tasks.done(&cmd.ts)
		x := exec{l: l, cmd: cmd}
		return x.result(x.check(senseInvalidMessage))
	}
	if !l.tasks.wait(ctx, &cmd.ts, cmd.Attr) {
		l.tasks.done(&cmd.ts)
		return Result{Status: StatusTaskAborted}
	}
	x := exec{l: l, cmd: cmd, cdb: cmd.CDB}
	res := x.result(x.run())
	l.tasks.done(&cmd.ts)
	return res
}

// Reset is a LOGICAL UNIT RESET (the target's task management calls it after aborting the
// LUN's tasks): it restores the mode parameters to their defaults, starts the unit and
// establishes BUS DEVICE RESET FUNCTION OCCURRED (29/03) for every I_T nexus. Persistent
// reservations survive it, as SPC requires. If the reset turns the write cache off, the cache
// is flushed; the error, if any, is that flush's.
func (l *LUN) Reset() error {
	wasOn := l.wce.Swap(l.defaultWCE)
	l.dsense.Store(false)
	l.stopped.Store(false)
	l.ua.establishAll(uaLUNReset, nil)
	if wasOn && !l.defaultWCE {
		return l.flusher.flush()
	}
	return nil
}

// NexusLost tells the LUN that an I_T nexus went away (logout, connection loss): the next
// command from it sees I_T NEXUS LOSS OCCURRED (29/07). Registrations are kept.
func (l *LUN) NexusLost(n Nexus) {
	l.ua.establish(&n, uaNexusLoss)
}

// Close flushes and closes the backend. Commands after Close fail with NOT READY.
func (l *LUN) Close() error {
	if !l.closed.CompareAndSwap(false, true) {
		return nil
	}
	ferr := l.flusher.flush()
	cerr := l.be.Close()
	return errors.Join(ferr, cerr)
}

// exec is the state of one executing command. It lives on Execute's stack: the command path
// calls its methods directly (never through function values) so that it does not escape.
type exec struct {
	l      *LUN
	cmd    *Command
	cdb    []byte
	info   CDBInfo
	sense  Sense
	dataIn int
	views  [][]byte // the data-in as the backend's views (read)
}

func (x *exec) check(s Sense) Status {
	x.sense = s
	return StatusCheckCondition
}

func (x *exec) good() Status { return StatusGood }

// din is the data-in window: Command.DataIn limited to the CDB's transfer/allocation length.
func (x *exec) din() []byte {
	b := x.cmd.DataIn
	if uint64(len(b)) > uint64(x.info.Length) {
		b = b[:x.info.Length]
	}
	return b
}

// reply returns b as data-in, truncated to the allocation length and the buffer.
func (x *exec) reply(b []byte) Status {
	x.dataIn = copy(x.din(), b)
	return StatusGood
}

// dinWriter writes data-in parameter data of any length into the window, counting the full
// length so that headers can say how much there would have been.
type dinWriter struct {
	dst []byte
	n   int
}

func (w *dinWriter) write(b []byte) {
	if w.n < len(w.dst) {
		copy(w.dst[w.n:], b)
	}
	w.n += len(b)
}

func (w *dinWriter) patch(off int, b []byte) {
	if off < len(w.dst) {
		copy(w.dst[off:], b)
	}
}

func (x *exec) dataInWriter() dinWriter { return dinWriter{dst: x.din()} }

func (x *exec) written(w *dinWriter) Status {
	x.dataIn = min(w.n, len(w.dst))
	return StatusGood
}

func (x *exec) result(st Status) Result {
	r := Result{Status: st, DataInLen: x.dataIn}
	if st == StatusGood {
		r.DataInViews = x.views
	}
	if st == StatusCheckCondition {
		r.Sense = x.sense
		r.SenseLen = x.sense.Encode(x.cmd.Sense, x.l != nil && x.l.dsense.Load())
	}
	return r
}

// run performs the checks every command goes through, in this order: write protection of the
// nexus (Command.WriteProtected), unit attention, the ALUA state of the nexus's target port
// (before the CDB is judged, as LIO's target_alua_state_check), CDB validity, NOT READY, reservation
// conflict, write protection of the LUN, data-out length; then the command itself. The CDB is
// parsed only if LUNSet.Parse did not parse it already (parsing has no side effects, so doing
// it before the unit attention check changes no outcome).
func (x *exec) run() Status {
	l, cmd := x.l, x.cmd
	if len(x.cdb) == 0 {
		return x.check(senseInvalidOpcode)
	}
	if l.closed.Load() {
		return x.check(senseNotReady)
	}
	var s Sense
	if cmd.pc.matches(l, cmd) {
		x.info, s = cmd.pc.info, cmd.pc.sense
	} else {
		s = l.parseFor(cmd, &x.info)
	}
	if s == senseWriteProtected { // only the nexus's write protection makes parseFor say this
		return x.check(s)
	}
	op := x.cdb[0]
	if l.prStore != nil && l.pr.stale.Load() {
		l.prRefresh(cmd) // another gateway's PR change may owe this nexus a unit attention
	}
	if k := opIndex[op]; k == 0 || commands[k-1].flags&cmdNoUA == 0 {
		if c, ok := l.ua.take(&cmd.Nexus); ok {
			return x.check(c.sense())
		}
	}
	if as, refused := l.aluaRefusal(&cmd.Nexus, x.cdb); refused {
		return x.check(as)
	}
	if s.Key != NoSense {
		return x.check(s)
	}
	x.cdb = x.cdb[:len(x.info.cmd.usage)]
	c := x.info.cmd
	if c.flags&cmdMedia != 0 && l.stopped.Load() {
		return x.check(senseNotReadyStopped)
	}
	if l.pr.active.Load() && !l.prAllows(cmd, c, x.cdb) {
		return StatusReservationConflict
	}
	if c.flags&cmdWrite != 0 && l.readOnly.Load() {
		return x.check(senseWriteProtected)
	}
	if x.info.Dir == DirOut && uint64(len(cmd.DataOut)) < uint64(x.info.Length) {
		switch op {
		case OpModeSelect6, OpModeSelect10, OpUnmap, OpPersistentResvOut:
			// a truncated parameter list: the command judges what it got
		default:
			return x.check(dataOutShort(op))
		}
	}

	switch op {
	case OpTestUnitReady:
		return x.good()
	case OpRequestSense:
		return x.requestSense()
	case OpInquiry:
		return x.inquiry()
	case OpModeSelect6, OpModeSelect10:
		return x.modeSelect()
	case OpModeSense6, OpModeSense10:
		return x.modeSense()
	case OpStartStopUnit:
		return x.startStopUnit()
	case OpReadCapacity10:
		return x.readCapacity10()
	case OpServiceActionIn16:
		if x.info.ServiceAction == SAGetLBAStatus {
			return x.getLBAStatus()
		}
		return x.readCapacity16()
	case OpLogSense:
		return x.logSense()
	case OpRead6, OpRead10, OpRead12, OpRead16:
		return x.read()
	case OpWrite6, OpWrite10, OpWrite12, OpWrite16:
		return x.write()
	case OpVerify10, OpVerify16:
		return x.verify()
	case OpSynchronizeCache10, OpSynchronizeCache16:
		return x.synchronizeCache()
	case OpWriteSame10, OpWriteSame16:
		return x.writeSame()
	case OpUnmap:
		return x.unmap()
	case OpCompareAndWrite:
		return x.compareAndWrite()
	case OpPersistentResvIn:
		return x.persistentReserveIn()
	case OpPersistentResvOut:
		return x.persistentReserveOut()
	case OpReportLUNs:
		l.ua.remove(&cmd.Nexus, uaReportedLUNsChange)
		return x.reportLUNs(nil)
	case OpMaintenanceIn:
		switch x.info.ServiceAction {
		case SAReportTargetPortGrps:
			return x.reportTargetPortGroups()
		case SAReportSupportedTMFs:
			return x.reportSupportedTMFs()
		}
		return x.reportSupportedOpcodes()
	}
	return x.check(senseInvalidOpcode)
}

// dataOutShort is the error for a medium-write command whose data-out buffer is shorter than
// its CDB asks for: INVALID FIELD IN CDB at the field that sets the length.
func dataOutShort(op uint8) Sense {
	switch op {
	case OpWrite6:
		return invalidCDB(4, 7)
	case OpWrite10, OpVerify10:
		return invalidCDB(7, 7)
	case OpWrite12:
		return invalidCDB(6, 7)
	case OpWrite16, OpVerify16:
		return invalidCDB(10, 7)
	case OpCompareAndWrite:
		return invalidCDB(13, 7)
	}
	return Sense{Key: IllegalRequest, ASC: 0x24}
}

// startStopUnit is START STOP UNIT (SBC-3 5.25). Stopping flushes unless NO_FLUSH is set;
// power conditions are accepted and have no effect.
func (x *exec) startStopUnit() Status {
	b4 := x.cdb[4]
	if b4>>4 != 0 {
		return x.good()
	}
	if b4&0x01 != 0 {
		x.l.stopped.Store(false)
		return x.good()
	}
	if b4&0x04 == 0 {
		if err := x.l.flusher.flush(); err != nil {
			return x.check(flushSense(err))
		}
	}
	x.l.stopped.Store(true)
	return x.good()
}

// requestSense is REQUEST SENSE (SPC-4 6.29): a pending unit attention (which it clears), NOT
// READY while the nexus's target port is standby, unavailable or transitioning (the sense the
// other commands get) or while stopped, or NO SENSE.
func (x *exec) requestSense() Status {
	var s Sense
	if c, ok := x.l.ua.take(&x.cmd.Nexus); ok {
		s = c.sense()
	} else if as, ok := x.l.aluaNotReady(&x.cmd.Nexus); ok {
		s = as
	} else if x.l.stopped.Load() {
		s = senseNotReadyStopped
	}
	var b [maxDescSenseLen]byte
	n := s.Encode(b[:], x.info.flag)
	return x.reply(b[:n])
}
